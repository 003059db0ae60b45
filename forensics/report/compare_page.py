"""The `forensics compare` page: verdicts side by side and one overlaid chart per vital sign.

The series drawn are each run's evidence (:meth:`forensics.evidence.Evidence.logged`: every
logged point, so a NaN stays a gap), as on the single-run report; the page reuses its
templates, escaping and plotly.js embedding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from forensics.report.charts import _nums, _power_of_two_ticks, esc, figure_json
from forensics.report.downsample import downsample
from forensics.report.render import (
    MAX_ROWS,
    _env,
    _plotly_cdn,
    _plotly_inline,
    _version,
    severity_counts,
)
from forensics.schema import LOSS_SCALE, LR

if TYPE_CHECKING:
    from forensics.compare import Comparison

# One colour per run (the first is the reference).
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")
LOG_AXIS = (LOSS_SCALE, LR)
AXIS_TITLE = {"step": "step", "tokens": "tokens", "samples": "samples", "time": "seconds"}
WEBGL_POINTS = 2000  # traces longer than this are drawn with WebGL


def axis_title(cmp: Comparison) -> str:
    """What the x axis counts: the alignment's unit; aligned by step, what the logs count
    (``epoch`` where every run is indexed by epoch, ``point`` where none prints a step, and
    ``step / epoch`` for a mix, since the runs' x values then mean different things)."""
    if cmp.align != "step":
        return AXIS_TITLE[cmp.align]
    units = list(dict.fromkeys(d.run.x_unit for d in cmp.diagnoses))
    return " / ".join(units) if units else "step"


def compare_figure(cmp: Comparison, metric: str) -> dict[str, Any]:
    """One vital sign of every run, overlaid."""
    traces, drawn = [], []
    for i, (lab, d) in enumerate(zip(cmp.labels, cmp.diagnoses, strict=True)):
        s = d.ev.logged(metric)
        if len(s) == 0:
            continue
        if cmp.align == "step":
            x, y = downsample(s.steps, s.values)
        else:
            from forensics.compare import aligned

            xa, ya, _ = aligned(d.ev, metric, cmp.align)
            x, y = downsample(xa, ya)
        drawn.append(y)
        traces.append(
            {
                "type": "scattergl" if len(x) > WEBGL_POINTS else "scatter",
                "mode": "lines",
                "name": esc(lab),
                "x": [int(v) for v in x] if cmp.align == "step" else _nums(x),
                "y": _nums(y),
                "line": {"width": 1.2, "color": PALETTE[i % len(PALETTE)]},
            }
        )
    shapes, notes = [], []
    for i, part in enumerate(cmp.partings.get(metric, [])):
        if not part or part.get("step") is None:
            continue
        x = part["x"] if cmp.align != "step" else part["step"]
        color = PALETTE[i % len(PALETTE)]
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": x,
                "x1": x,
                "y0": 0,
                "y1": 1,
                "line": {"color": color, "dash": "dot", "width": 1.5},
            }
        )
        notes.append(
            {
                "x": x,
                "y": 1,
                "xref": "x",
                "yref": "paper",
                "text": esc(f"{cmp.labels[i]} parts at step {part['step']:,}"),
                "showarrow": False,
                "font": {"size": 10, "color": color},
                "yanchor": "bottom",
            }
        )
    fig = {
        "data": traces,
        "layout": {
            "shapes": shapes,
            "annotations": notes,
            "title": {"text": esc(metric)},
            "height": 300,
            "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
            "xaxis": {"title": {"text": axis_title(cmp)}},
            "legend": {"orientation": "h"},
            "yaxis": {"type": "log" if metric in LOG_AXIS else "linear"},
        },
    }
    if metric == LOSS_SCALE and drawn:
        # Ticks at powers of two, as on the single-run report: plotly's log axis labelled
        # 200k, 300k ... "2", "3" beside "100k".
        import numpy as np

        _power_of_two_ticks(fig, np.concatenate(drawn))
    return fig


def render_compare_html(cmp: Comparison, *, plotlyjs: str = "inline") -> str:
    """One page: verdicts side by side and one overlaid chart per vital sign."""
    from markupsafe import Markup

    from forensics.compare import by_how_much

    if plotlyjs not in ("inline", "cdn"):
        raise ValueError(f"plotlyjs must be 'inline' or 'cdn', not {plotlyjs!r}")
    panels = [
        {
            "key": metric.replace("/", "_"),
            "title": metric,
            "json": Markup(figure_json(compare_figure(cmp, metric))),
        }
        for metric in cmp.vitals
    ]
    counts = [severity_counts(d.findings) for d in cmp.diagnoses]
    ctx = {
        "cmp": cmp,
        "runs": list(zip(cmp.labels, cmp.diagnoses, counts, cmp.part_ways, strict=True)),
        "panels": panels,
        "plotlyjs": plotlyjs,
        "plotly_inline": Markup(_plotly_inline()) if plotlyjs == "inline" else "",
        "cdn_url": _plotly_cdn()[0] if plotlyjs == "cdn" else "",
        "cdn_sri": _plotly_cdn()[1] if plotlyjs == "cdn" else "",
        "version": _version(),
        "max_rows": MAX_ROWS,
        "by_how_much": by_how_much,
    }
    return _env().get_template("compare.html").render(**ctx)


__all__ = ["compare_figure", "render_compare_html"]
