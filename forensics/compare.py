"""`forensics compare`: runs side by side (verdicts, vital signs, where the losses part ways).

Each run is analysed as ``forensics analyze`` would (one :class:`~forensics.evidence.Evidence`
per run, with the configured parameters); the cross-run measures read those evidences' series.
The HTML page is rendered by :mod:`forensics.report.compare_page`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from forensics.evidence import Evidence
from forensics.findings import Severity, step_range
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
    from forensics.run import Run

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
                {"label": lab, **d.to_document()}
                for lab, d in zip(self.labels, self.diagnoses, strict=True)
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


def _evidence(run: Run | Evidence) -> Evidence:
    return run if isinstance(run, Evidence) else Evidence(run)


def _vital(ev: Evidence, metric: str) -> dict[str, float | int | None] | None:
    logged = ev.logged(metric)
    if len(logged) == 0:
        return None
    fin = ev.series(metric).values
    last_step = int(logged.steps[-1])
    if len(fin) == 0:
        return {"final": None, "best": None, "points": len(logged), "last_step": last_step}
    tail = fin[-max(1, len(fin) // 20) :]  # the last 5% of points: the level the run ended at
    best = float(fin.max()) if metric in (THROUGHPUT,) else float(fin.min())
    return {
        "final": float(np.median(tail)),
        "best": best,
        "points": len(logged),
        "last_step": last_step,
    }


def loss_parts_ways(ref: Run | Evidence, other: Run | Evidence) -> dict[str, Any] | None:
    """The first step where ``other``'s smoothed loss stays more than 5% away from ``ref``'s."""
    a, b = _evidence(ref).series(LOSS), _evidence(other).series(LOSS)
    if len(a) < PART_WAYS_POINTS or len(b) < 2:
        return None
    xa, ya = a.steps, _smooth(a.values)
    xb, yb = b.steps, _smooth(b.values)
    lo, hi = max(xa[0], xb[0]), min(xa[-1], xb[-1])
    sel = (xa >= lo) & (xa <= hi)
    if sel.sum() < PART_WAYS_POINTS:
        return {"step": None, "common_steps": [int(lo), int(hi)], "note": "too few common steps"}
    x, y_ref = xa[sel], ya[sel]
    y_oth = np.interp(x, xb, yb)
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
    vitals = {m: [_vital(d.ev, m) for d in diags] for m in VITALS}
    vitals = {m: v for m, v in vitals.items() if any(x is not None for x in v)}
    part = [None] + [loss_parts_ways(diags[0].ev, d.ev) for d in diags[1:]]
    return Comparison(diags, labels, vitals, part)


def print_comparison(cmp: Comparison, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    from forensics.report.render import _num, severity_counts
    from forensics.terminal import escape

    console = console or Console()
    t = Table(title="forensics compare", show_lines=False)
    t.add_column("")
    for lab in cmp.labels:
        t.add_column(escape(lab), overflow="fold")  # run names come from folder names
    t.add_row("verdict", *[d.verdict.upper() for d in cmp.diagnoses])
    t.add_row("format", *[d.run.format for d in cmp.diagnoses])
    t.add_row("steps", *[step_range(d.run.first_step, d.run.last_step) for d in cmp.diagnoses])
    t.add_row(
        "findings",
        *[
            ", ".join(f"{n} {k}" for k, n in severity_counts(d.findings).items() if n) or "none"
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
