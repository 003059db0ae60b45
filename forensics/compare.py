"""`forensics compare`: several runs side by side (verdicts, vital signs, where the losses part ways)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from forensics.findings import Severity
from forensics.schema import (
    GRAD_NORM,
    LOSS,
    LOSS_SCALE,
    LR,
    MEMORY,
    PARAM_NORM,
    THROUGHPUT,
    VAL_LOSS,
)

if TYPE_CHECKING:
    from forensics.config import Config
    from forensics.diagnosis import Diagnosis

VITALS = (LOSS, VAL_LOSS, GRAD_NORM, PARAM_NORM, LR, LOSS_SCALE, THROUGHPUT, MEMORY)
PART_WAYS_REL = 0.05  # losses more than 5% apart ...
PART_WAYS_POINTS = 5  # ... for this many consecutive points of the reference run


@dataclass
class Comparison:
    """What `forensics compare` shows: one Diagnosis per run plus cross-run measures."""

    diagnoses: list[Diagnosis]
    labels: list[str]
    vitals: dict[
        str, list[dict[str, float | int | None] | None]
    ]  # metric -> per run: final, best, points
    part_ways: list[dict[str, Any] | None]  # per run (vs the first): where the loss curves separate

    def to_document(self) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "runs": [
                {"label": lab, **d.to_document()} for lab, d in zip(self.labels, self.diagnoses)
            ],
            "vitals": self.vitals,
            "loss_parts_ways": self.part_ways,
        }


def _labels(names: list[str]) -> list[str]:
    out: list[str] = []
    for i, n in enumerate(names):
        out.append(n if names.count(n) == 1 else f"{n} [{i + 1}]")
    return out


def _smooth(y: np.ndarray, k: int = 11) -> np.ndarray:
    if len(y) < k:
        return y
    from scipy.ndimage import median_filter

    return median_filter(y, size=k, mode="nearest")


def _vital(run: Any, metric: str) -> dict[str, float | int | None] | None:
    s = run.series(metric)
    if s.is_empty():
        return None
    y = s.get_column("value").to_numpy().astype(float)
    fin = y[np.isfinite(y)]
    if len(fin) == 0:
        return {
            "final": None,
            "best": None,
            "points": len(y),
            "last_step": int(s.get_column("step")[-1]),
        }
    tail = fin[-max(1, len(fin) // 20) :]  # the last 5% of points: the level the run ended at
    best = float(fin.max()) if metric in (THROUGHPUT,) else float(fin.min())
    return {
        "final": float(np.median(tail)),
        "best": best,
        "points": len(y),
        "last_step": int(s.get_column("step")[-1]),
    }


def loss_parts_ways(ref: Any, other: Any) -> dict[str, Any] | None:
    """The first step where ``other``'s smoothed loss stays more than 5% away from ``ref``'s."""
    a, b = ref.series(LOSS), other.series(LOSS)
    if a.height < PART_WAYS_POINTS or b.height < 2:
        return None
    xa, ya = (
        a.get_column("step").to_numpy(),
        _smooth(a.get_column("value").to_numpy().astype(float)),
    )
    xb, yb = (
        b.get_column("step").to_numpy(),
        _smooth(b.get_column("value").to_numpy().astype(float)),
    )
    ok = np.isfinite(yb)
    if ok.sum() < 2:
        return None
    lo, hi = max(xa[0], xb[ok][0]), min(xa[-1], xb[ok][-1])
    sel = (xa >= lo) & (xa <= hi) & np.isfinite(ya)
    if sel.sum() < PART_WAYS_POINTS:
        return {"step": None, "common_steps": [int(lo), int(hi)], "note": "too few common steps"}
    x, y_ref = xa[sel], ya[sel]
    y_oth = np.interp(x, xb[ok], yb[ok])
    rel = (y_oth - y_ref) / np.maximum(np.abs(y_ref), 1e-12)
    apart = np.abs(rel) > PART_WAYS_REL
    run_len = np.convolve(apart.astype(int), np.ones(PART_WAYS_POINTS, dtype=int), mode="valid")
    hits = np.flatnonzero(run_len == PART_WAYS_POINTS)
    final_rel = float(rel[-1])
    if len(hits) == 0:
        return {"step": None, "common_steps": [int(lo), int(hi)], "final_rel_diff": final_rel}
    i = int(hits[0])
    return {
        "step": int(x[i]),
        "rel_diff_at_step": float(rel[i]),
        "common_steps": [int(lo), int(hi)],
        "final_rel_diff": final_rel,
    }


def compare(paths: list[str | os.PathLike[str]], config: Config | None = None) -> Comparison:
    """Analyze each path and line the runs up (the first run is the reference)."""
    from forensics.errors import ForensicsError, MultipleJobsError
    from forensics.pipeline import analyze

    diags = []
    for p in paths:
        try:
            diags.append(analyze(Path(p), config))
        except MultipleJobsError as exc:
            from forensics.errors import summarize

            raise ForensicsError(
                f"{p} holds {len(exc.jobs)} separate jobs ({summarize(exc.jobs)}); "
                "compare takes one job per path"
            ) from None
    labels = _labels([d.run.name for d in diags])
    vitals = {m: [_vital(d.run, m) for d in diags] for m in VITALS}
    vitals = {m: v for m, v in vitals.items() if any(x is not None for x in v)}
    part = [None] + [loss_parts_ways(diags[0].run, d.run) for d in diags[1:]]
    return Comparison(diags, labels, vitals, part)


def _counts(d: Diagnosis) -> dict[str, int]:
    out = {s.value: 0 for s in Severity}
    for f in d.findings:
        out[f.severity.value] += 1
    return out


def print_comparison(cmp: Comparison, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    from forensics.report.render import _num
    from forensics.terminal import escape

    console = console or Console()
    t = Table(title="forensics compare", show_lines=False)
    t.add_column("")
    for lab in cmp.labels:
        t.add_column(escape(lab), overflow="fold")  # run names come from folder names
    t.add_row("verdict", *[d.verdict.upper() for d in cmp.diagnoses])
    t.add_row("format", *[d.run.format for d in cmp.diagnoses])
    t.add_row("steps", *[f"{d.run.first_step:,}-{d.run.last_step:,}" for d in cmp.diagnoses])
    t.add_row(
        "findings",
        *[
            ", ".join(f"{n} {k}" for k, n in _counts(d).items() if n) or "none"
            for d in cmp.diagnoses
        ],
    )
    for d_row in [
        (
            "first alarm",
            [
                next(
                    (
                        f"{f.kind.value} @ {f.start_step:,}"
                        for f in d.findings
                        if f.severity is not Severity.INFO
                    ),
                    "-",
                )
                for d in cmp.diagnoses
            ],
        ),
    ]:
        t.add_row(d_row[0], *d_row[1])
    for metric, per_run in cmp.vitals.items():
        t.add_row(f"{metric} (end)", *["-" if v is None else _num(v["final"]) for v in per_run])
    t.add_row(
        "loss parts ways",
        "reference",
        *[
            "-"
            if p is None
            else (
                f"step {p['step']:,} ({p['rel_diff_at_step']:+.0%})"
                if p.get("step") is not None
                else "never (within 5%)"
            )
            for p in cmp.part_ways[1:]
        ],
    )
    console.print(t)


def render_compare_html(cmp: Comparison, *, plotlyjs: str = "inline") -> str:
    """One page: verdicts side by side and one overlaid chart per vital sign."""
    from markupsafe import Markup

    from forensics.report.charts import _nums, esc, figure_json
    from forensics.report.downsample import downsample
    from forensics.report.render import LIGHTS, _env, _plotly_cdn, _plotly_inline, _version

    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
    panels = []
    for metric in cmp.vitals:
        traces = []
        for i, (lab, d) in enumerate(zip(cmp.labels, cmp.diagnoses)):
            s = d.run.series(metric)
            if s.is_empty():
                continue
            x, y = downsample(
                s.get_column("step").to_numpy(), s.get_column("value").to_numpy().astype(float)
            )
            traces.append(
                {
                    "type": "scattergl" if len(x) > 2000 else "scatter",
                    "mode": "lines",
                    "name": esc(lab),
                    "x": [int(v) for v in x],
                    "y": _nums(y),
                    "line": {"width": 1.2, "color": palette[i % len(palette)]},
                }
            )
        fig = {
            "data": traces,
            "layout": {
                "title": {"text": esc(metric)},
                "height": 300,
                "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
                "xaxis": {"title": {"text": "step"}},
                "legend": {"orientation": "h"},
                "yaxis": {"type": "log" if metric in (LOSS_SCALE, LR) else "linear"},
            },
        }
        panels.append(
            {"key": metric.replace("/", "_"), "title": metric, "json": Markup(figure_json(fig))}
        )
    ctx = {
        "cmp": cmp,
        "runs": list(
            zip(cmp.labels, cmp.diagnoses, [_counts(d) for d in cmp.diagnoses], cmp.part_ways)
        ),
        "panels": panels,
        "LIGHTS": LIGHTS,
        "plotlyjs": plotlyjs,
        "plotly_inline": Markup(_plotly_inline()) if plotlyjs == "inline" else "",
        "cdn_url": _plotly_cdn()[0] if plotlyjs == "cdn" else "",
        "cdn_sri": _plotly_cdn()[1] if plotlyjs == "cdn" else "",
        "version": _version(),
    }
    return _env().get_template("compare.html").render(**ctx)
