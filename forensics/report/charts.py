"""One plotly figure per vital sign, as plain JSON-ready dicts, with the findings marked.

Figures are built as dicts (not plotly.graph_objects) so that size and escaping stay under
our control: every series is min/max-decimated (keeping each finding's peak), numbers are
written with 6 significant digits, and every string that came from a log is HTML-escaped
before it reaches plotly (whose labels accept a little HTML).

Charts draw, never derive. Every line that stands for a judgement (a baseline, an alarm line,
a limit, the warm-up end, the train/val gap) comes from the run's
:class:`~forensics.evidence.Evidence` or from a finding's ``judged_against``, so the number in
the chart is the number in the finding. Such a line carries ``meta = {"judged": <key>,
"value": <number>, "source": "evidence" | <finding kind>}`` (full precision) so tests and
tools can read what it draws. A finding's ``judged_against`` levels (see :func:`is_level_key`)
are drawn over the finding's span on its own series' panel.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forensics.evidence import Band, Evidence
from forensics.evidence.trend_utils import num, steps_within, unit_for
from forensics.findings import Finding, FindingKind, Severity, finding_steps
from forensics.report.downsample import DEFAULT_BUCKETS, bucket_mean, downsample
from forensics.schema import (
    ACT_ABSMAX,
    GRAD_NORM,
    GRAD_NORM_EMBED,
    GRAD_NORM_HEAD,
    GRAD_NORM_LAYER,
    LOSS,
    LOSS_SCALE,
    LR,
    MEMORY,
    PARAM_NORM,
    STEP_TIME,
    THROUGHPUT,
    VAL_LOSS,
    lower_is_better,
)

TB_SMOOTHING = 0.6  # TensorBoard's default smoothing weight
# Below this many points a series is drawn as logged: a moving average of weight 0.6 trails
# the values by about 1.5 points, which on a handful of points spaced far apart is a curve the
# run never had (a 6-point loss drawn at 0.19 where the log says 0.03).
MIN_SMOOTH_POINTS = 50
HEATMAP_COLUMNS = 300
MAX_EVAL_TRACES = 12
MAX_MARKS = 200  # findings marked per panel


@dataclass
class Panel:
    key: str
    title: str
    caption: str
    figure: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)

    def json(self) -> str:
        return figure_json(self.figure)


def figure_json(fig: dict[str, Any]) -> str:
    """JSON safe to put inside a <script> element: no "<", ">" or "&" survive literally."""
    text = json.dumps(fig, allow_nan=False, separators=(",", ":"))
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def esc(text: object) -> str:
    """Escape untrusted text for plotly labels (plotly turns the entities back into plain text)."""
    return html.escape(str(text), quote=True)


def _nums(a: np.ndarray) -> list[float | None]:
    return [
        float(f"{v:.6g}") if math.isfinite(v) else None for v in np.asarray(a, dtype=float).tolist()
    ]


def _ints(a: np.ndarray) -> list[int]:
    return [int(v) for v in np.asarray(a).tolist()]


def tb_smooth(y: np.ndarray, weight: float = TB_SMOOTHING) -> np.ndarray:
    """TensorBoard's debiased exponential moving average (non-finite points pass through)."""
    from scipy.signal import lfilter

    y = np.asarray(y, dtype=float)
    out = y.copy()
    ok = np.isfinite(y)
    v = y[ok]
    if len(v) == 0 or weight <= 0 or np.all(v == v[0]):
        return out
    last = lfilter([1.0 - weight], [1.0, -weight], v)
    debias = 1.0 - weight ** np.arange(1, len(v) + 1)
    out[ok] = last / debias
    return out


def smoothing_weight(n: int, buckets: int) -> float:
    """TensorBoard's 0.6, raised for long series so the smoothed line spans about a bucket."""
    per_bucket = n / max(1, buckets)
    if n <= 4 * buckets:  # not decimated: the curve TensorBoard users know
        return TB_SMOOTHING
    return float(min(0.999, max(TB_SMOOTHING, 1.0 - 1.0 / per_bucket)))


def _arrays(ev: Evidence, metric: str, layer: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every logged point of a series, NaN and Inf included (a gap in the line is evidence)."""
    s = ev.logged(metric, layer)
    return s.steps, s.values


def axis_title(ev: Evidence, metric: str, what: str) -> str:
    """A y-axis title with the unit the logged values are in (``throughput (tokens/s)``), or
    saying that the log names none: the chart plots the values as logged, unscaled."""
    unit = unit_for(ev.run, metric).source
    unit = unit.removesuffix("/step") if unit else unit  # "time per step (ms)"
    return f"{what} ({unit})" if unit else f"{what} (unit not in the log)"


def _layout(title: str, ytitle: str, **extra: Any) -> dict[str, Any]:
    lay: dict[str, Any] = {
        "title": {"text": esc(title), "x": 0.01, "font": {"size": 14}},
        "height": 320,
        "margin": {"l": 60, "r": 20, "t": 36, "b": 40},
        "xaxis": {"title": {"text": "step"}, "zeroline": False},
        "yaxis": {"title": {"text": esc(ytitle)}, "zeroline": False},
        "legend": {"orientation": "h", "y": -0.25},
        "hovermode": "closest",
        "plot_bgcolor": "#fff",
        "paper_bgcolor": "#fff",
        "shapes": [],
    }
    lay.update(extra)
    return lay


def _line(x: np.ndarray, y: np.ndarray, name: str, **kw: Any) -> dict[str, Any]:
    return {
        "type": "scatter",
        "mode": "lines",
        "x": _ints(x),
        "y": _nums(y),
        "name": esc(name),
        **kw,
    }


def _level(
    x0: float,
    x1: float,
    value: float,
    name: str,
    colour: str,
    judged: str,
    source: str,
    *,
    dash: str = "dash",
    showlegend: bool = True,
) -> dict[str, Any]:
    """A horizontal line at a judged level, drawn at full precision and labelled in ``meta``."""
    return {
        "type": "scatter",
        "mode": "lines",
        "x": [int(x0), int(x1)],
        "y": [float(value), float(value)],
        "name": esc(name),
        "line": {"color": colour, "width": 1, "dash": dash},
        "hoverinfo": "name+y",
        "showlegend": showlegend,
        "meta": {"judged": judged, "value": float(value), "source": source},
    }


def band_lines(fig: dict[str, Any], band: Band, x0: int, x1: int, *, critical_light: bool) -> None:
    """The evidence's baseline and its alarm lines, labelled with the configured ratios."""
    base = band.baseline.value
    fig["data"].append(_level(x0, x1, base, "baseline", "#666", "baseline", "evidence"))
    warn = Severity.WARNING
    label = f"{band.warn_ratio:g}x baseline" + (f" ({warn.light})" if critical_light else "")
    fig["data"].append(_level(x0, x1, band.warn_at, label, warn.colour, "warn_at", "evidence"))
    if band.critical_at is not None and band.critical_ratio is not None:
        crit = Severity.CRITICAL
        fig["data"].append(
            _level(
                x0,
                x1,
                band.critical_at,
                f"{band.critical_ratio:g}x baseline ({crit.light})",
                crit.colour,
                "critical_at",
                "evidence",
            )
        )
    # the stretch the baseline was measured over
    window_shade(fig, band.baseline.start_step, band.baseline.end_step, "baseline window")


def window_shade(fig: dict[str, Any], x0: Any, x1: Any, name: str) -> None:
    """A light grey span over the steps a baseline was measured on."""
    fig["layout"]["shapes"].append(
        {
            "type": "rect",
            "xref": "x",
            "yref": "paper",
            "x0": x0,
            "x1": x1,
            "y0": 0,
            "y1": 1,
            "fillcolor": "#999",
            "opacity": 0.08,
            "line": {"width": 0},
            "layer": "below",
            "name": name,
        }
    )


def warmup_line(fig: dict[str, Any], ev: Evidence) -> None:
    """A vertical line where the evidence says the LR warm-up ends."""
    wu = ev.warmup_end
    if wu is None:
        return
    fig["layout"]["shapes"].append(
        {
            "type": "line",
            "xref": "x",
            "yref": "paper",
            "x0": wu,
            "x1": wu,
            "y0": 0,
            "y1": 1,
            "line": {"color": "#7f7f7f", "width": 1, "dash": "dashdot"},
            "name": "warm-up end",
        }
    )
    fig["layout"].setdefault("annotations", []).append(
        {
            "x": wu,
            "xref": "x",
            "y": 1,
            "yref": "paper",
            "yanchor": "bottom",
            "showarrow": False,
            "font": {"size": 10, "color": "#7f7f7f"},
            "text": f"warm-up ends ({wu:,})",
        }
    )


# judged_against keys that are levels in the finding's own series' units, besides "*_at".
LEVEL_KEYS = frozenset({"baseline", "local_baseline", "drop_line"})


def most_severe(findings: list[Finding]) -> list[Finding]:
    """The findings a panel marks: all, or the :data:`MAX_MARKS` most severe (earliest first at
    equal severity)."""
    if len(findings) <= MAX_MARKS:
        return findings
    return sorted(findings, key=lambda f: (-f.severity.rank, f.start_step))[:MAX_MARKS]


def is_level_key(key: str) -> bool:
    """``judged_against`` keys that are levels in the finding's own series' units: names ending
    in ``_at`` (``warn_at``, ``alarm_at``) and :data:`LEVEL_KEYS`. Others (ratios, noise floors,
    a growth threshold such as ``accel_line``) are not drawn as lines."""
    return key in LEVEL_KEYS or key.endswith("_at")


def judged_levels(fig: dict[str, Any], findings: list[Finding], x_end: int) -> None:
    """The findings' judged levels, each drawn over its finding's span (to the series' end when
    the finding has no end), unless the panel already draws the same level from the evidence.

    One trace per (finding kind, key), its segments separated by gaps; ``meta["segments"]``
    lists ``[start, end, value]`` at full precision.
    """
    drawn = {
        (t["meta"]["judged"], t["meta"]["value"])
        for t in fig["data"]
        if isinstance(t.get("meta"), dict) and "value" in t["meta"]
    }
    groups: dict[tuple[str, str], list[tuple[int, int, float, Severity]]] = {}
    for f in most_severe(findings):
        end = f.end_step if f.end_step is not None and f.end_step > f.start_step else x_end
        for key, value in f.judged_against.items():
            if not is_level_key(key) or isinstance(value, bool):
                continue
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            if (key, value) in drawn:
                continue
            seg = (f.start_step, max(end, f.start_step), float(value), f.severity)
            groups.setdefault((f.kind.value, key), []).append(seg)
    for (kind, key), segs in groups.items():
        grey = "baseline" in key
        level_trace(fig, kind, key, f"{key.replace('_', ' ')} ({kind})", segs, grey, "dot")


_Segment = tuple[int, int, float, Severity]  # (start, end, level, the finding's severity)


def level_trace(
    fig: dict[str, Any], kind: str, key: str, name: str, segs: list[_Segment], grey: bool, dash: str
) -> None:
    """One trace of a judged level over its findings' spans, its segments separated by gaps:
    grey, or in the colour of the most severe finding; ``meta["segments"]`` lists ``[start,
    end, value]`` at full precision (what the chart tests read back)."""
    xs: list[int | None] = []
    ys: list[float | None] = []
    for x0, x1, v, _ in segs:
        xs += [x0, x1, None]
        ys += [v, v, None]
    worst = max((sev for *_, sev in segs), key=lambda sev: sev.rank)
    fig["data"].append(
        {
            "type": "scatter",
            "mode": "lines",
            "x": xs[:-1],
            "y": ys[:-1],
            "name": esc(name),
            "line": {"color": "#666" if grey else worst.colour, "width": 1, "dash": dash},
            "hoverinfo": "name+y",
            "connectgaps": False,
            "meta": {
                "judged": key,
                "source": kind,
                "segments": [[x0, x1, v] for x0, x1, v, _ in segs],
            },
        }
    )


def _keep_steps(findings: list[Finding]) -> np.ndarray:
    steps = [s for f in findings for s in (f.start_step, f.peak_step, f.end_step) if s is not None]
    return np.array(sorted(set(steps)), dtype=np.int64)


def _value_at(x: np.ndarray, y: np.ndarray, step: int) -> float | None:
    if len(x) == 0:
        return None
    i = int(np.clip(np.searchsorted(x, step), 0, len(x) - 1))
    if i > 0 and abs(x[i - 1] - step) < abs(x[i] - step):
        i -= 1
    v = float(y[i])
    return v if math.isfinite(v) else None


def mark_findings(
    fig: dict[str, Any],
    findings: list[Finding],
    x: np.ndarray | None = None,
    y: np.ndarray | None = None,
    name: str = "findings",
) -> None:
    """Shade each finding's span, and put a hoverable marker at its peak on the panel's series.

    At most :data:`MAX_MARKS` findings per panel, the most severe first, so that a run with
    thousands of small findings still gives a readable chart and a small file. A finding
    that stands for many events (``events_at``) is not shaded over its first to last step:
    each event gets a small marker (:func:`_mark_events`), its peak the finding's marker.
    """
    for f in findings:
        if f.events_at is not None and x is not None and y is not None:
            _mark_events(fig, f, x, y)
    if len(findings) > MAX_MARKS:
        findings = most_severe(findings)
        fig["layout"].setdefault("annotations", []).append(
            {
                "xref": "paper",
                "yref": "paper",
                "x": 1,
                "y": 1.08,
                "showarrow": False,
                "font": {"size": 11, "color": "#666"},
                "text": f"{MAX_MARKS} most severe findings marked",
            }
        )
    shapes = fig["layout"].setdefault("shapes", [])
    mx: list[int] = []
    my: list[float | None] = []
    texts: list[str] = []
    colours: list[str] = []
    for f in findings:
        colour = f.severity.colour
        end = f.end_step if f.end_step is not None else f.start_step
        if f.events_at is not None:
            pass  # (its events are marked one by one, not its span)
        elif end > f.start_step:
            shapes.append(
                {
                    "type": "rect",
                    "xref": "x",
                    "yref": "paper",
                    "x0": f.start_step,
                    "x1": end,
                    "y0": 0,
                    "y1": 1,
                    "fillcolor": colour,
                    "opacity": 0.15,
                    "line": {"width": 0},
                    "layer": "below",
                }
            )
        else:
            shapes.append(
                {
                    "type": "line",
                    "xref": "x",
                    "yref": "paper",
                    "x0": f.start_step,
                    "x1": f.start_step,
                    "y0": 0,
                    "y1": 1,
                    "line": {"color": colour, "width": 1.5, "dash": "dot"},
                }
            )
        at = f.peak_step if f.peak_step is not None else f.start_step
        val = _value_at(x, y, at) if x is not None and y is not None else None
        if val is None:
            continue
        mx.append(at)
        my.append(float(f"{val:.6g}"))
        texts.append(
            esc(f"{f.kind.value} ({f.severity.value}), step {finding_steps(f)}: {f.summary}")
        )
        colours.append(colour)
    if mx:
        fig["data"].append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": mx,
                "y": my,
                "name": name,
                "hovertext": texts,
                "hoverinfo": "text",
                "marker": {
                    "color": colours,
                    "size": 11,
                    "symbol": "diamond",
                    "line": {"color": "#000", "width": 1},
                },
            }
        )


MAX_EVENTS = 2_000  # events of one grouped finding marked on a panel (the highest)


def _mark_events(fig: dict[str, Any], f: Finding, x: np.ndarray, y: np.ndarray) -> None:
    """A small marker at each event of a grouped finding, on the panel's series: the
    :data:`MAX_EVENTS` highest where it has more (a 1M-step run has thousands)."""
    steps = np.asarray(f.events_at or (), dtype=np.int64)
    if not len(steps) or not len(x):
        return
    i = np.clip(np.searchsorted(x, steps), 0, len(x) - 1)
    ok = x[i] == steps
    steps, vals = steps[ok], y[i[ok]].astype(float)
    finite = np.isfinite(vals)
    steps, vals = steps[finite], vals[finite]
    note = ""
    if len(steps) > MAX_EVENTS:
        keep = np.sort(np.argsort(-vals, kind="stable")[:MAX_EVENTS])
        steps, vals = steps[keep], vals[keep]
        note = f" (the {MAX_EVENTS:,} highest of {len(f.events_at or ()):,})"
    fig["data"].append(
        {
            "type": "scatter",
            "mode": "markers",
            "x": [int(v) for v in steps],
            "y": [float(f"{v:.6g}") for v in vals],
            "name": esc(f"{f.kind.value.replace('_', ' ')}{note}"),
            "hovertemplate": "%{x:,}: %{y}<extra>absorbed outlier</extra>",
            "marker": {"color": f.severity.colour, "size": 5, "symbol": "circle-open"},
        }
    )


def _series_panel(
    ev: Evidence,
    metric: str,
    title: str,
    ytitle: str,
    fs: list[Finding],
    buckets: int,
    caption: str = "",
    log_y: bool = False,
    colour: str = "#1f77b4",
    band: Band | None = None,
) -> Panel | None:
    x, y = _arrays(ev, metric)
    if len(x) == 0:
        return None
    dx, dy = downsample(x, y, buckets, _keep_steps(fs))
    name = ev.run.metrics().get(metric, metric)
    fig: dict[str, Any] = {
        "data": [_line(dx, dy, name, line={"color": colour, "width": 1.2})],
        "layout": _layout(title, ytitle),
    }
    if log_y:
        fig["layout"]["yaxis"]["type"] = "log"
        _power_of_two_ticks(fig, y)
    if band is None and not fs:
        _flat_range(fig, y, log_y)
    if band is not None:
        band_lines(fig, band, int(x[0]), int(x[-1]), critical_light=False)
    judged_levels(fig, fs, int(x[-1]))
    mark_findings(fig, fs, x, y)
    return Panel(metric, title, caption, fig, fs)


def _power_of_two_ticks(fig: dict[str, Any], y: np.ndarray) -> None:
    """Ticks at powers of two on a loss-scale axis: a scaler halves and doubles, so its values
    are 2^k and the decade ticks plotly picks (10k, 1M, 100M) name none of them. At most
    :data:`_MAX_TICKS` ticks, every second or fourth power on a wide range, one of them at the
    median's power; the hover still shows each value in full."""
    v = y[np.isfinite(y) & (y > 0)]
    if len(v) == 0:
        return
    lo, hi = int(np.floor(np.log2(v.min()))), int(np.ceil(np.log2(v.max())))
    if lo == hi:  # a constant scale (its range is a decade each side: see _flat_range)
        lo, hi = lo - 3, hi + 3
    every = 1
    while (hi - lo) // every + 1 > _MAX_TICKS:
        every *= 2
    # Thinned around the typical value (the median's power), which is then labelled.
    mid = int(np.round(np.log2(np.median(v))))
    ks = [k for k in range(lo, hi + 1) if (k - mid) % every == 0]
    fig["layout"]["yaxis"].update(
        tickvals=[2.0**k for k in ks],
        ticktext=[f"2<sup>{k}</sup>" if k > 10 or k < 0 else f"{2**k:,}" for k in ks],
    )


_MAX_TICKS = 8


def _flat_range(fig: dict[str, Any], y: np.ndarray, log_y: bool) -> None:
    """A y range around a constant series: plotly spans a flat line by +-1 (a constant LR of
    1.5e-4 drawn at "0" on an axis from -1 to 1, a loss scale of 1 near the floor of a log
    axis from 1 to 10), which hides its value. Half the value each side (a decade on a log
    axis) puts it in the middle with readable ticks."""
    v = y[np.isfinite(y)]
    if len(v) == 0 or v.min() != v.max() or v[0] == 0 or (log_y and v[0] < 0):
        return
    c = float(v[0])
    if log_y:
        fig["layout"]["yaxis"]["range"] = [np.log10(c) - 1, np.log10(c) + 1]
    else:
        fig["layout"]["yaxis"]["range"] = sorted([c * 0.5, c * 1.5])


def loss_panel(ev: Evidence, fs: list[Finding], buckets: int) -> Panel | None:
    x, y = _arrays(ev, LOSS)
    if len(x) == 0:
        return None
    keep = _keep_steps(fs)
    rx, ry = downsample(x, y, buckets, keep)
    if len(x) < MIN_SMOOTH_POINTS:
        data = [_line(rx, ry, "loss", line={"color": "#08519c", "width": 1.8})]
        cap = (
            f"The values as logged: {len(x):,} point(s), too few for a moving average (one "
            "would trail them by a point or two)."
        )
    else:
        w = smoothing_weight(len(x), buckets)
        sx, sy = downsample(x, tb_smooth(y, w), buckets, keep)
        data = [
            _line(rx, ry, "raw", line={"color": "#9ecae1", "width": 1}),
            _line(sx, sy, "smoothed", line={"color": "#08519c", "width": 1.8}),
        ]
        cap = (
            "Raw values (light) and TensorBoard's debiased exponential moving average"
            f" with weight {w:.3g}"
        )
        cap += (
            " (TensorBoard's default)."
            if w == TB_SMOOTHING
            else f" (raised from TensorBoard's 0.6 because the run has {len(x):,} points)."
        )
    fig = {"data": data, "layout": _layout("Training loss", "loss")}
    judged_levels(fig, fs, int(x[-1]))
    restart_levels(fig, [f for f in fs if f.kind is FindingKind.LR_RESTART])
    mark_findings(fig, fs, x, y)
    return Panel(LOSS, "Training loss", cap, fig, fs)


# An LR restart's levels on the loss chart: (judged_against key, legend name, dash).
_RESTART_LEVELS = (
    ("loss_level_before", "loss level before the restart", "dot"),
    ("loss_rise_line", "rise line, {k:g}x the level's noise above it", "dash"),
)


def restart_levels(fig: dict[str, Any], restarts: list[Finding]) -> None:
    """What an LR restart did to the loss, on the loss chart: the level before it and the line
    a rise had to pass (``loss_*`` in its ``judged_against``; the finding's own series is the
    LR, whose chart does not draw them), over the finding's span (to the step the loss was
    back). One trace per key, its segments separated by gaps, as :func:`judged_levels`."""
    kind = FindingKind.LR_RESTART.value
    for key, label, dash in _RESTART_LEVELS:
        segs: list[_Segment] = []
        for f in most_severe(restarts):
            v = f.judged_against.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                end = f.end_step if f.end_step is not None else f.start_step
                segs.append((f.start_step, max(end, f.start_step), float(v), f.severity))
        if segs:
            k = restarts[0].judged_against.get("noise_k", 0.0)
            name = label.format(k=k) + f" ({kind})"
            level_trace(fig, kind, key, name, segs, key == "loss_level_before", dash)


def grad_norm_panel(
    ev: Evidence, fs: list[Finding], buckets: int, run_findings: list[Finding] | None = None
) -> Panel | None:
    """The grad norm with its band; ``fs``: its findings (marked), ``run_findings``: the
    run's (the caption reads the other vital signs' findings too; default ``fs``)."""
    x, y = _arrays(ev, GRAD_NORM)
    if len(x) == 0:
        return None
    dx, dy = downsample(x, y, buckets, _keep_steps(fs))
    fig = {
        "data": [_line(dx, dy, "grad norm", line={"color": "#2ca02c", "width": 1.2})],
        "layout": _layout("Gradient norm", "grad norm"),
    }
    cap = "No baseline: too few finite points."
    band = ev.grad_norm_band
    if band is not None and math.isfinite(band.baseline.value):
        band_lines(fig, band, int(x[0]), int(x[-1]), critical_light=True)
        crit = (
            f" and calls {band.critical_ratio:g}x critical"
            if band.critical_ratio is not None
            else ""
        )
        cap = (
            f"Baseline {num(band.baseline.value)} ({band.baseline.how}, shaded); warns at"
            f" {band.warn_ratio:g}x{crit} (the article: 2x and 3x)."
        )
        finding = next((f for f in fs if f.kind is FindingKind.GRAD_NORM_DRIFT), None)
        if finding is not None and finding.measures.get("baseline_kind") == "settled":
            m = finding.measures
            lines = f"{band.warn_ratio:g}x" + (
                f" / {band.critical_ratio:g}x" if band.critical_ratio is not None else ""
            )
            settled = m["baseline"]
            assert isinstance(settled, (int, float))
            cap += (
                " The grad norm went on falling after that window: the grad_norm_drift finding"
                f" was judged from where it settled, {num(settled)} (the median of steps"
                f" {m['baseline_start_step']:,}-{m['baseline_end_step']:,}, shaded too), with"
                f" its own {lines} lines dotted over the climb."
            )
            window_shade(
                fig,
                m["baseline_start_step"],
                m["baseline_end_step"],
                "settled window (grad_norm_drift)",
            )
        drift = _schedule_line(fig, ev, band, finding, dx)
        if drift is not None:
            cap += (
                " The grad_norm_drift finding was judged against the dash-dotted line instead:"
                " the level it was judged from times the rise the decaying learning rate"
                " explains (with a"
                f" margin; never under {band.warn_ratio:g}x), {num(drift)} at the end of the log."
            )
        cap += _unflagged_over(ev, band, fs if run_findings is None else run_findings, x, y)
    warmup_line(fig, ev)
    judged_levels(fig, fs, int(x[-1]))
    mark_findings(fig, fs, x, y)
    return Panel(GRAD_NORM, "Gradient norm", cap, fig, fs)


def _unflagged_over(
    ev: Evidence, band: Band, fs: list[Finding], x: np.ndarray, y: np.ndarray
) -> str:
    """A sentence for the points after the warm-up drawn above the critical line that no
    grad-norm finding and no spike covers, so that a reader who sees a point over the red
    line with no finding beside it is told why: inside the steps of another vital sign's
    finding (the climb into the nan sample's NaN), or a single point the spike search,
    which judges a point against its local baseline and noise, did not flag (the bad_batch
    sample's steps 59 and 201)."""
    from forensics.evidence.spikes import SpikeSearch

    crit = band.critical_at
    if crit is None or not math.isfinite(crit) or len(x) == 0:
        return ""
    start = ev.warmup_end if ev.warmup_end is not None else int(x[0]) - 1
    finite = np.isfinite(y)
    with np.errstate(invalid="ignore"):
        # (an Inf is no point above the line: the line breaks there, said apart below)
        over = finite & (y >= crit) & (x > start)
    gaps = ~finite
    if not over.any() and not gaps.any():
        return ""
    covered = [(s.start_step, s.end_step) for s in ev.spikes(GRAD_NORM)]
    # (a grouped finding's events are spikes, covered above; its first to last step is not)
    covered += [
        (f.start_step, _last_step(f)) for f in fs if f.metric == GRAD_NORM and f.events_at is None
    ]
    # (x is sorted: each span is a slice; a long run has thousands of spikes)
    for a, b in covered:
        part = steps_within(x, a, b)
        over[part] = False
        gaps[part] = False
    broken = ""
    if gaps.any():
        for f in fs:  # (a NaN the loss's finding reports, e.g., is no unexplained gap)
            if f.events_at is None:
                gaps[steps_within(x, f.start_step, _last_step(f))] = False
        noted = any(n.startswith("nan_inf: the grad norm") for n in ev.run.notes)
        broken = _unreported_gaps(x[gaps], noted)
    if not over.any():
        return broken
    # Inside a divergence (the loss and the grad norm climbing together, on the loss chart)
    # or the steps of another vital sign's finding (warning or worse): part of that event.
    spans = [(a, b, "divergence") for a, b in ev.diverged]
    spans += [
        (f.start_step, _last_step(f), f.kind.value)
        for f in fs
        if f.metric != GRAD_NORM and f.severity.rank >= Severity.WARNING.rank
    ]
    during = np.zeros(len(x), dtype=bool)
    kinds: list[str] = []
    for a, b, kind in spans:
        part = steps_within(x, a, b)
        if over[part].any():
            during[part] |= over[part]
            if kind not in kinds:
                kinds.append(kind)
    alone = x[over & ~during]
    inside = x[during]
    n = len(alone) + len(inside)
    head = (
        f" {n:,} point{'s' if n != 1 else ''} after the warm-up "
        f"{'stand' if n != 1 else 'stands'} above the {band.critical_ratio:g}x line with no "
        "grad-norm finding"
    )
    named = ", ".join(kinds[:3]) + (f" and {len(kinds) - 3} more" if len(kinds) > 3 else "")
    in_steps = f"in the steps that findings on other vital signs report ({named})"
    p = SpikeSearch.of(ev.params.spikes, GRAD_NORM)
    gross = f", or {p.gross_ratio:g}x and z >= {p.z_gross:g}" if p.gross_ratio else ""
    rule = (
        f"{p.min_ratio:g}x its local baseline and z >= {p.z_threshold:g}{gross}), and "
        f"{'these do' if len(alone) != 1 else 'it does'} not"
    )
    if not len(alone):
        return f"{head} ({_steps_of(inside)}), {in_steps}.{broken}"
    if not len(inside):
        return (
            f"{head} ({_steps_of(alone)}): a single point is a spike only where it stands out "
            f"of the grad norm's local noise ({rule}.{broken}"
        )
    return (
        f"{head}: {len(inside):,} ({_steps_of(inside)}) {in_steps}; {len(alone):,} "
        f"({_steps_of(alone)}) where a single point is a spike only if it stands out of the "
        f"grad norm's local noise ({rule}.{broken}"
    )


def _unreported_gaps(steps: np.ndarray, noted: bool) -> str:
    """A sentence for the grad norm's non-finite points no finding covers: the line breaks
    there, and a reader is told where the reason is when the NaN/Inf check noted one (the
    overflowing steps an fp16 scaler skipped, a missing tail)."""
    if not len(steps):
        return ""
    n = len(steps)
    why = ": the NaN/Inf check's note under Data quality says why" if noted else ""
    return (
        f" The line breaks at {n:,} non-finite point{'s' if n != 1 else ''}"
        f" ({_steps_of(steps)}) that no finding reports{why}."
    )


def _last_step(f: Finding) -> int:
    return f.end_step if f.end_step is not None else (f.peak_step or f.start_step)


def _steps_of(steps: np.ndarray) -> str:
    """``step 58``, ``steps 32, 59, 60, 201`` or, for more than six, ``steps 594 to 641``."""
    if len(steps) == 1:
        return f"step {int(steps[0]):,}"
    if len(steps) > 6:
        return f"steps {int(steps[0]):,} to {int(steps[-1]):,}"
    return "steps " + ", ".join(f"{int(s):,}" for s in steps)


def _schedule_line(
    fig: dict[str, Any], ev: Evidence, band: Band, drift: Finding | None, xs: np.ndarray
) -> float | None:
    """The moving warning line a ``grad_norm_drift`` finding was judged against when the LR
    is logged (:func:`forensics.detectors.drift.envelope`): a level over the plain 2x line
    can be a note when the schedule explains it, and the chart shows the line that said so.
    Returns the finding's ``warn_line_now`` (None: nothing drawn)."""
    from forensics.detectors.drift import envelope

    if drift is None or not drift.measures.get("lr_logged"):
        return None
    ja = drift.judged_against
    start, end, now, level = (
        ja.get(k) for k in ("baseline_start_step", "baseline_end_step", "warn_line_now", "baseline")
    )
    if start is None or end is None or not isinstance(now, (int, float)):
        return None
    if not isinstance(level, (int, float)):  # (the early or the settled baseline)
        return None
    at = xs[xs >= start].astype(float)
    env = envelope(ev, at, int(start), int(end))
    if not env.lr_logged or len(at) == 0:
        return None
    warn, _ = env.lines(env.rise, band)
    fig["data"].append(
        {
            "type": "scatter",
            "mode": "lines",
            "x": at.astype(int).tolist(),
            "y": (warn * float(level)).tolist(),
            "name": "warning line under the LR schedule (grad_norm_drift)",
            "line": {"color": Severity.WARNING.colour, "width": 1.2, "dash": "dashdot"},
            "hoverinfo": "name+y",
            "meta": {"judged": "warn_line", "source": "grad_norm_drift", "now": float(now)},
        }
    )
    return float(now)


def param_norm_panel(ev: Evidence, fs: list[Finding], buckets: int) -> Panel | None:
    band = ev.param_norm_band
    if band is not None and not math.isfinite(band.baseline.value):
        band = None
    cap = "Should grow slowly under AdamW; a jump means oversized updates."
    if band is not None:
        cap += (
            f" Baseline {num(band.baseline.value)} ({band.baseline.how}, shaded);"
            f" the line at {band.warn_ratio:g}x is the limit (the article: 1.5x)."
        )
    return _series_panel(
        ev,
        PARAM_NORM,
        "Parameter norm",
        "param norm",
        fs,
        buckets,
        cap,
        colour="#8c564b",
        band=band,
    )


def lr_panel(ev: Evidence, fs: list[Finding], buckets: int) -> Panel | None:
    p = _series_panel(ev, LR, "Learning rate", "lr", fs, buckets, colour="#7f7f7f")
    if p is not None:
        warmup_line(p.figure, ev)
        if ev.warmup_end is not None:
            p.caption = f"The warm-up ends at step {ev.warmup_end:,} (dash-dotted line)."
    return p


def train_val_panel(ev: Evidence, fs: list[Finding], buckets: int) -> Panel | None:
    vx, vy = _arrays(ev, VAL_LOSS)
    if len(vx) == 0:
        return None
    fig: dict[str, Any] = {
        "data": [],
        "layout": _layout(
            "Training vs validation loss",
            "loss",
            yaxis2={
                "title": {"text": "gap (val - train)"},
                "overlaying": "y",
                "side": "right",
                "showgrid": False,
                "zeroline": False,
            },
        ),
    }
    fig["layout"]["margin"]["r"] = 70
    tx, ty = _arrays(ev, LOSS)
    cap = "Validation loss only: the run has no training loss to compare with."
    if len(tx):
        smooth = len(tx) >= MIN_SMOOTH_POINTS
        ty = tb_smooth(ty, smoothing_weight(len(tx), buckets)) if smooth else ty
        sx, sy = downsample(tx, ty, buckets)
        name = "train (smoothed)" if smooth else "train"
        fig["data"].append(_line(sx, sy, name, line={"color": "#08519c", "width": 1.5}))
        cap = (
            "Validation loss against the smoothed training loss."
            if smooth
            else "Validation loss against the training loss as logged (too few points to smooth)."
        )
    gap = ev.gap
    if gap is not None and len(gap.steps):
        fig["data"].append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": _ints(gap.steps),
                "y": [float(v) for v in np.asarray(gap.gap, dtype=float)],
                "name": "gap",
                "yaxis": "y2",
                "line": {"color": "#9467bd", "dash": "dot"},
                "meta": {"judged": "gap", "source": "evidence"},
            }
        )
        cap += " The dotted line (right axis) is the train/val gap the detectors judged."
    dvx, dvy = downsample(vx, vy, buckets, _keep_steps(fs))
    fig["data"].append(
        {
            "type": "scatter",
            "mode": "lines+markers",
            "x": _ints(dvx),
            "y": _nums(dvy),
            "name": "validation",
            "line": {"color": "#d62728"},
            "marker": {"size": 5},
        }
    )
    judged_levels(fig, fs, int(vx[-1]))
    mark_findings(fig, fs, vx, vy)
    return Panel(VAL_LOSS, "Training vs validation loss", cap, fig, fs)


def eval_panel(ev: Evidence, fs: list[Finding], buckets: int) -> Panel | None:
    evals = sorted(m for m in ev.run.metrics() if m.startswith("eval/"))
    if not evals:
        return None
    fig: dict[str, Any] = {"data": [], "layout": _layout("Evaluation metrics", "score")}
    for m in evals[:MAX_EVAL_TRACES]:
        x, y = _arrays(ev, m)
        dx, dy = downsample(x, y, buckets, _keep_steps([f for f in fs if f.metric == m]))
        label = m[5:] + (" (lower is better)" if lower_is_better(m) else "")
        fig["data"].append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "x": _ints(dx),
                "y": _nums(dy),
                "name": esc(label),
                "marker": {"size": 4},
            }
        )
    fig["layout"]["showlegend"] = True
    for f in fs:
        if not f.metric:
            mark_findings(fig, [f])
            continue
        x, y = _arrays(ev, f.metric)
        if len(x):
            judged_levels(fig, [f], int(x[-1]))
        mark_findings(fig, [f], x, y)
    cap = f"{len(evals)} evaluation metric(s)" + (
        f"; the first {MAX_EVAL_TRACES} are drawn." if len(evals) > MAX_EVAL_TRACES else "."
    )
    return Panel("eval", "Evaluation metrics", cap, fig, fs)


def _layer_matrix(ev: Evidence, metric: str) -> tuple[np.ndarray, list[int], np.ndarray] | None:
    import polars as pl

    run = ev.run
    layers = run.layers(metric)
    if not layers:
        return None
    v = run.view().filter(pl.col("metric") == metric).select("step", "layer", "value")
    wide = (
        v.group_by("step", "layer")
        .agg(pl.col("value").last())
        .pivot(on="layer", index="step", values="value")
        .sort("step")
    )
    steps = wide.get_column("step").to_numpy().astype(np.int64)
    z = np.stack([wide.get_column(str(layer)).to_numpy().astype(float) for layer in layers])
    return steps, layers, z


def layer_share_panel(ev: Evidence, fs: list[Finding]) -> Panel | None:
    got = _layer_matrix(ev, GRAD_NORM_LAYER)
    if got is None:
        return None
    steps, layers, z = got
    sq = np.where(np.isfinite(z), z, np.nan) ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        share = sq / np.nansum(sq, axis=0, keepdims=True)
    xs, zs = bucket_mean(steps, share, HEATMAP_COLUMNS)
    fig: dict[str, Any] = {
        "data": [
            {
                "type": "heatmap",
                "x": _ints(xs),
                "y": [str(layer) for layer in layers],
                "z": [_nums(row * 100) for row in zs],
                "colorscale": "Viridis",
                "colorbar": {"title": {"text": "% of grad norm^2"}},
                "hovertemplate": "step %{x}<br>layer %{y}<br>%{z:.1f}%<extra></extra>",
            }
        ],
        "layout": _layout(
            "Per-layer share of the gradient", "layer", height=max(260, 60 + 14 * len(layers))
        ),
    }
    fig["layout"]["yaxis"]["type"] = "category"
    mark_findings(fig, fs)
    return Panel(
        GRAD_NORM_LAYER,
        "Per-layer share of the gradient",
        "Each layer's squared gradient norm as a share of the sum over layers"
        " (shares add up to 100% per step).",
        fig,
        fs,
    )


def module_share_panel(ev: Evidence) -> Panel | None:
    """The token embedding's and the output head's share of the squared grad norm, the
    numbers a grad-norm drift's ``embed_head`` cause compares (None when not logged)."""
    from forensics.evidence.module_share import NAMES, module_shares

    got = module_shares(ev)
    if got is None or len(got.steps) == 0:
        return None
    colours = {GRAD_NORM_EMBED: "#8c564b", GRAD_NORM_HEAD: "#17becf"}
    data = []
    for m, share in got.shares.items():
        dx, dy = downsample(got.steps, 100 * share, DEFAULT_BUCKETS)
        data.append(_line(dx, dy, NAMES[m], line={"color": colours[m], "width": 1.2}))
    if len(got.shares) == 2:
        dx, dy = downsample(got.steps, 100 * got.total, DEFAULT_BUCKETS)
        data.append(_line(dx, dy, "both", line={"color": "#7f7f7f", "width": 1, "dash": "dot"}))
    fig: dict[str, Any] = {
        "data": data,
        "layout": _layout("Embedding and output head: share of the gradient", "% of grad norm^2"),
    }
    return Panel(
        GRAD_NORM_EMBED,
        "Embedding and output head: share of the gradient",
        "Each module's squared grad norm as a share of the squared total grad norm. A grad-norm "
        "drift's cause embed_head compares this share before its onset with its last fifth.",
        fig,
        [],
    )


def activation_panel(ev: Evidence, fs: list[Finding]) -> Panel | None:
    got = _layer_matrix(ev, ACT_ABSMAX)
    if got is None:
        return _model_activation_panel(ev, fs)
    steps, layers, z = got
    with np.errstate(divide="ignore", invalid="ignore"):
        lz = np.log10(np.abs(z))
    lz[~np.isfinite(lz)] = np.nan
    xs, zs = bucket_mean(steps, lz, HEATMAP_COLUMNS)
    limit = ev.activation_limit
    log_limit = math.log10(limit) if limit > 0 else None
    colorbar: dict[str, Any] = {"title": {"text": "log10 |act| max"}}
    if log_limit is not None:
        # the limit as a labelled tick on the colour bar: cells past it are the suspects
        colorbar.update(
            tickmode="array",
            tickvals=[float(log_limit)],
            ticktext=[f"limit {_fmt(limit)}"],
            ticks="outside",
        )
    fig: dict[str, Any] = {
        "data": [
            {
                "type": "heatmap",
                "x": _ints(xs),
                "y": [str(layer) for layer in layers],
                "z": [_nums(row) for row in zs],
                "colorscale": "Magma",
                "colorbar": colorbar,
                "meta": {"judged": "absmax_limit", "value": float(limit), "source": "evidence"},
            }
        ],
        "layout": _layout(
            "Activation maxima per layer", "layer", height=max(260, 60 + 14 * len(layers))
        ),
    }
    fig["layout"]["yaxis"]["type"] = "category"
    mark_findings(fig, fs)
    where = f" ({log_limit:.3g} here)" if log_limit is not None else ""
    return Panel(
        ACT_ABSMAX,
        "Activation maxima per layer",
        f"log10 of each layer's largest absolute activation; values past {_fmt(limit)}{where}"
        " mark a problem layer (the article's limit is 1e4).",
        fig,
        fs,
    )


def _model_activation_panel(ev: Evidence, fs: list[Finding]) -> Panel | None:
    """The activation maximum logged without a layer index (the whole model's): its line on a
    log axis with the limit it is judged against (the check judges it when no layer is
    logged: forensics.detectors.activations)."""
    if ev.run.layers(ACT_ABSMAX) or not ev.run.has(ACT_ABSMAX):
        return None
    x, y = _arrays(ev, ACT_ABSMAX)
    if len(x) == 0:
        return None
    limit = ev.activation_limit
    title = "Activation maximum (model-wide)"
    dx, dy = downsample(x, y, DEFAULT_BUCKETS, _keep_steps(fs))
    name = ev.run.metrics().get(ACT_ABSMAX, ACT_ABSMAX)
    fig: dict[str, Any] = {
        "data": [
            _line(dx, dy, name, line={"color": "#9467bd", "width": 1.2}),
            _level(x[0], x[-1], limit, f"limit {_fmt(limit)}", "#d62728", "limit", "evidence"),
        ],
        "layout": _layout(title, "|act| max"),
    }
    fig["layout"]["yaxis"]["type"] = "log"
    judged_levels(fig, fs, int(x[-1]))  # (the limit is drawn already: not twice)
    mark_findings(fig, fs, x, y)
    caption = (
        "The whole model's largest absolute activation, logged without a layer index (which "
        f"layer is not known); values past {_fmt(limit)} are the problem sign (the article's "
        "limit is 1e4)."
    )
    return Panel(ACT_ABSMAX, title, caption, fig, fs)


def _fmt(v: float) -> str:
    return f"{v:,g}"


# Which findings a panel shows, by the metric they are about.
_PANEL_METRICS: dict[str, set[str | None]] = {
    LOSS: {LOSS, "nan_iters"},  # (iterations whose NaN loss the logged loss leaves out)
    GRAD_NORM: {GRAD_NORM, "grad_norm_clipped"},
    PARAM_NORM: {PARAM_NORM, "param_norm_layer"},
    LR: {LR},
    LOSS_SCALE: {LOSS_SCALE, "overflow"},
    VAL_LOSS: {VAL_LOSS},
    THROUGHPUT: {THROUGHPUT},
    STEP_TIME: {STEP_TIME},
    MEMORY: {MEMORY},
    GRAD_NORM_LAYER: {GRAD_NORM_LAYER},
    ACT_ABSMAX: {ACT_ABSMAX, "act_std", "act_mean"},
}


def build_panels(
    ev: Evidence, findings: list[Finding], *, buckets: int = DEFAULT_BUCKETS
) -> list[Panel]:
    """Every vital-sign panel the run has data for, each with its findings marked and the
    evidence's baselines, alarm lines and limits drawn."""

    def about(*metrics: str | None) -> list[Finding]:
        return [f for f in findings if f.metric in metrics]

    evals = [f for f in findings if f.metric and f.metric.startswith("eval/")]
    restarts = [f for f in findings if f.kind is FindingKind.LR_RESTART]
    builders = [
        # (an LR restart is marked on the loss too: its finding states what the loss did)
        lambda: loss_panel(ev, about(*_PANEL_METRICS[LOSS]) + restarts, buckets),
        lambda: grad_norm_panel(ev, about(*_PANEL_METRICS[GRAD_NORM]), buckets, findings),
        lambda: param_norm_panel(ev, about(*_PANEL_METRICS[PARAM_NORM]), buckets),
        lambda: lr_panel(ev, about(LR), buckets),
        lambda: _series_panel(
            ev,
            LOSS_SCALE,
            "Loss scale",
            "loss scale",
            about(*_PANEL_METRICS[LOSS_SCALE]),
            buckets,
            "Mixed-precision loss scale (log axis); a sharp drop marks overflowing gradients.",
            log_y=True,
            colour="#17becf",
        ),
        lambda: train_val_panel(ev, about(VAL_LOSS), buckets),
        lambda: eval_panel(ev, evals, buckets),
        lambda: _series_panel(
            ev,
            THROUGHPUT,
            "Throughput",
            axis_title(ev, THROUGHPUT, "throughput"),
            about(THROUGHPUT),
            buckets,
            colour="#bcbd22",
        ),
        lambda: _series_panel(
            ev,
            STEP_TIME,
            "Step time",
            axis_title(ev, STEP_TIME, "time per step"),
            about(STEP_TIME),
            buckets,
            colour="#bcbd22",
        ),
        lambda: _series_panel(
            ev,
            MEMORY,
            "Memory",
            axis_title(ev, MEMORY, "memory"),
            about(MEMORY),
            buckets,
            colour="#e377c2",
        ),
        lambda: layer_share_panel(ev, about(GRAD_NORM_LAYER)),
        lambda: module_share_panel(ev),
        lambda: activation_panel(ev, about(*_PANEL_METRICS[ACT_ABSMAX])),
    ]
    panels = [p for p in (b() for b in builders) if p is not None]
    # Findings with no panel of their own (run-level ones, unplotted metrics) go on the first panel.
    placed = {id(f) for p in panels for f in p.findings}
    replaced = [f for f in findings if f.kind is FindingKind.REPLACED_ATTEMPT]
    # Each replaced attempt marked on its own line (the first panel that draws one), else
    # with the run-level findings.
    drawn = [p for p in panels if p.key in _REPLAYED_PANELS] if replaced else []
    for i, p in enumerate(drawn):
        marked = _replaced_lines(ev, p, replaced, buckets, mark=i == 0)
        placed |= {id(f) for f in marked}
    drops = [
        f
        for f in findings
        if f.kind in (FindingKind.RESUME_DROP, FindingKind.RESUME_SETBACK)
        and f.measures.get("mode") == "overlap"
    ]
    for p in panels:
        if drops and p.key == LOSS:
            _earlier_job_lines(ev, p, drops, buckets)
    rest = [f for f in findings if id(f) not in placed]
    if rest and panels:
        first = panels[0]
        main = first.figure["data"][0]
        if main.get("type") != "heatmap":
            x = np.array(main["x"], dtype=np.int64)
            y = np.array([np.nan if v is None else v for v in main["y"]], dtype=float)
            mark_findings(first.figure, rest, x, y, name="run-level findings")
        else:
            mark_findings(first.figure, rest)
        first.findings = first.findings + rest
    unit = ev.run.x_unit  # (what the x axis counts: "epoch" or "point" where not steps)
    for p in panels:
        _span_the_run(p.figure, ev.run.first_step, ev.run.last_step)
        _clip_shading(p.figure, ev.run.last_step)
        axis = p.figure.get("layout", {}).get("xaxis", {}).get("title", {})
        if unit != "step" and axis.get("text") == "step":
            axis["text"] = unit
    return panels


# Panels of one logged series, where an attempt a resume replaced is drawn beside the view.
_REPLAYED_PANELS = frozenset(
    {LOSS, GRAD_NORM, PARAM_NORM, LR, LOSS_SCALE, THROUGHPUT, STEP_TIME, MEMORY}
)


def _replaced_lines(
    ev: Evidence, panel: Panel, replaced: list[Finding], buckets: int, *, mark: bool
) -> list[Finding]:
    """The values each replaced attempt logged from its resume step on (the view keeps the
    resumed job's there), as a dotted grey line: the steps a replaced_attempt finding names
    show what it says, not the resumed job's values. ``mark``: the findings' markers go on
    these lines (the first such panel)."""

    tag = ev.run.metrics().get(panel.key)
    marked: list[Finding] = []
    if tag is None:
        return marked
    drawn = []
    for f in replaced:
        k, resumed = f.measures.get("segment"), f.measures.get("resumed_from_step")
        if not (isinstance(k, int) and isinstance(resumed, int)):
            continue
        rows = _earlier_rows(ev, tag, k, resumed, None)
        if rows.is_empty():
            continue
        x = rows.get_column("step").to_numpy().astype(np.int64)
        y = rows.get_column("value").to_numpy().astype(float)
        dx, dy = downsample(x, y, buckets, _keep_steps([f]))
        panel.figure["data"].append(
            _line(
                dx,
                dy,
                f"replaced attempt (steps {int(x[0]):,}-{int(x[-1]):,})",
                line={"color": "#7f7f7f", "width": 1, "dash": "dot"},
            )
        )
        drawn.append(f"{int(x[0]):,}-{int(x[-1]):,}")
        if mark:
            mark_findings(panel.figure, [f], x, y, name="replaced-attempt findings")
            panel.findings = panel.findings + [f]
            marked.append(f)
    if drawn:
        panel.caption += (
            f" Dotted grey: what the attempt that a resume replaced logged at steps "
            f"{', '.join(drawn)}; the solid line there is the resumed job's."
        )
    return marked


def _earlier_rows(ev: Evidence, tag: str, segment: int, lo: int, hi: int | None) -> Any:
    """(step, value) of ``tag`` that the jobs before ``segment`` logged from step ``lo`` on
    (to ``hi``), one a step: the latest earlier job's."""
    import polars as pl

    cond = (
        (pl.col("tag") == tag)
        & (pl.col("segment") < segment)
        & (pl.col("step") >= lo)
        & pl.col("layer").is_null()
    )
    if hi is not None:
        cond &= pl.col("step") <= hi
    return (
        ev.run.frame.filter(cond)
        .select("step", "value", "segment")
        .sort("step", "segment", maintain_order=True)
        .unique("step", keep="last", maintain_order=True)  # a step of two earlier attempts
    )


def _earlier_job_lines(ev: Evidence, panel: Panel, drops: list[Finding], buckets: int) -> None:
    """The earlier job's loss on the steps a ``resume_drop`` or ``resume_setback`` compared
    (the view keeps the resumed job's there), dotted grey: the gap its sentence states, seen."""
    tag = ev.run.metrics().get(LOSS)
    if tag is None:
        return
    seg_of = {
        f.start_step: f.measures.get("segment")
        for f in ev.run.import_findings
        if f.kind is FindingKind.RESTART
    }
    drawn = []
    for f in drops:
        k = seg_of.get(f.start_step)
        if not isinstance(k, int) or f.end_step is None:
            continue
        rows = _earlier_rows(ev, tag, k, f.start_step, f.end_step)
        if rows.is_empty():
            continue
        x = rows.get_column("step").to_numpy().astype(np.int64)
        y = rows.get_column("value").to_numpy().astype(float)
        dx, dy = downsample(x, y, buckets, _keep_steps([f]))
        label = f"{int(x[0]):,}-{int(x[-1]):,}"
        panel.figure["data"].append(
            _line(
                dx,
                dy,
                f"earlier job (steps {label})",
                line={"color": "#7f7f7f", "width": 1, "dash": "dot"},
            )
        )
        drawn.append(label)
    if drawn:
        panel.caption += (
            f" Dotted grey: the earlier job's loss at steps {', '.join(drawn)}, which the "
            "resumed job logged again from the same checkpoint (resume_drop, resume_setback); "
            "the solid line there is the resumed job's."
        )


def _clip_shading(fig: dict[str, Any], last: int) -> None:
    """Shaded spans end where the chart's data does (or at the run's last step): a restart's
    span reaches the last step the earlier attempt logged, which a resumed job that has not
    got back there yet never drew, and shading it widened the x axis past the run's end."""
    past = [
        shape
        for shape in fig["layout"].get("shapes", [])
        if shape.get("type") == "rect"
        and shape.get("xref") == "x"
        and isinstance(shape.get("x1"), int)
        and shape["x1"] > last
    ]
    if not past or any(t.get("type") == "heatmap" for t in fig["data"]):
        return  # (most charts: no span reaches past the run's end, no pass over their data)
    drawn = [v for t in fig["data"] for v in t.get("x") or () if isinstance(v, (int, float))]
    end = max(last, max(drawn, default=last))
    for shape in past:
        if shape["x1"] > end and shape.get("x0", end) < end:
            shape["x1"] = end


def _span_the_run(fig: dict[str, Any], first: int, last: int) -> None:
    """A chart whose points all sit at one step (one evaluation at the end of the run) gets
    the run's steps as its x axis: plotly would centre it on a range of one step either side
    (3,099 to 3,101), which reads as a run one step long."""
    if last <= first or any(t.get("type") == "heatmap" for t in fig["data"]):
        return
    steps = {v for t in fig["data"] for v in t.get("x") or () if v is not None}
    if len(steps) == 1:
        pad = (last - first) * 0.02
        fig["layout"]["xaxis"]["range"] = [first - pad, last + pad]


SPIKE_KINDS = (FindingKind.LOSS_SPIKE, FindingKind.GRAD_NORM_SPIKE)
