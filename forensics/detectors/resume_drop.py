"""resume_drop and resume_setback: after a resume, the loss runs below (drop) or above
(setback) the earlier job's on the steps both logged.

A job resumed from its checkpoint at step C starts from the weights the earlier job had at C.
When the earlier job ran on past C before it stopped (the usual crash or kill between
checkpoints), both logged steps C+1 onwards, from the same weights: with the same data and the
same LR they log about the same loss there, batch noise apart. A resumed job whose loss runs
clearly lower on those steps was most likely fed data it had already trained on (a data loader
that started over from its first batch rather than its saved position, so it re-reads what the
checkpoint has seen): its lower loss is memorization, not progress, and it trains on those
batches twice. An easier data mix would do the same; the log cannot tell them apart, so the
finding names them as hypotheses.

Judged per resume that logged steps again (a ``restart`` whose ``points_repeated`` > 0): the
per-step differences (resumed - earlier) of the loss on the steps both jobs logged; a
finding when their median is at least ``drop_min_pct`` (2%) of the earlier job's level below
zero, beyond ``noise_k`` standard errors, in each half of those steps (a data replay lowers
the loss throughout; an earlier attempt that went wrong rises away late, and the resumed job
is lower than it as a good resume should be). Where the two jobs ran another LR on those steps
the difference has that explanation: a note, no finding.

The same comparison the other way is a ``resume_setback``: a resumed job whose loss runs
clearly higher on those steps (or steps up at its seam and stays up) did not go on from the
state the earlier job had there. An older checkpoint than its step count says, or a resume that
restored the weights but not the optimizer's moments or the loss scaler, sets the training
back; the log cannot tell which, so the finding names them as hypotheses.

The measures of its finding kind are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import polars as pl

from forensics.evidence import Evidence
from forensics.evidence.trend_utils import num, robust_sigma, steps_within, theil_sen
from forensics.findings import Finding, FindingKind, Severity
from forensics.params import ResumeRegressionParams
from forensics.run import Run
from forensics.schema import LOSS, LR

CHECK = "resume_drop"


def resume_drops(ev: Evidence, p: ResumeRegressionParams) -> list[Finding]:
    """One ``resume_drop`` or ``resume_setback`` finding per resume whose replayed steps (or
    seam) show the loss lower or higher than the earlier job's."""
    out: list[Finding] = []
    run = ev.run
    tag = run.metrics().get(LOSS)
    if tag is None:
        return out
    at_seam: dict[int, str | None] = {}  # seam -> the new log file that shows it (or None)
    rows_of = _TagRows(run.frame)
    for r in run.import_findings:
        if r.kind is not FindingKind.RESTART:
            continue
        m = r.measures  # (integers, as the importer's restart finding writes them)
        seg = cast(int, m["segment"])
        first, last = cast(int, m["resumed_from_step"]), cast(int, m["last_step_before"])
        old, new = (None, None)
        if m.get("points_repeated"):
            old, new = _both(rows_of(tag), seg, first, last)
        if old is not None and new is not None and _common(old, new) >= p.drop_min_points:
            f = _judge(ev, p, r.start_step, seg, old, new, rows_of)
            if f is not None:
                out.append(f)
        else:  # nothing (or too little) logged twice: the seam itself
            at_seam[r.start_step] = None
    for step, name in _file_seams(run, tag):
        at_seam.setdefault(step, name)
    seams = sorted(at_seam)
    for i, seam in enumerate(seams):
        nxt = seams[i + 1] if i + 1 < len(seams) else None
        f = _judge_seam(ev, p, seam, nxt, at_seam[seam])
        if f is not None:
            out.append(f)
    return out


def _common(old: pl.DataFrame, new: pl.DataFrame) -> int:
    return old.join(new, on="step", how="semi").height


def _file_seams(run: Run, tag: str) -> list[tuple[int, str]]:
    """(first step, file name) of each log file of ``tag`` that begins after the one before
    it ends: a new job that went on where an earlier one stopped (a TensorBoard writer per
    job), which the steps alone do not show."""
    if "file_idx" not in run.frame.columns:
        return []
    per = (
        run.frame.filter(pl.col("tag") == tag)
        .group_by("file_idx")
        .agg(
            pl.col("step").min().alias("first"),
            pl.col("step").max().alias("last"),
            pl.col("file").first().cast(pl.Utf8).alias("name"),
        )
        .drop_nulls(["first", "last"])
        .sort("first")
    )
    out: list[tuple[int, str]] = []
    rows = per.to_dicts()
    for prev, cur in zip(rows, rows[1:], strict=False):
        if int(cur["first"]) > int(prev["last"]):
            out.append((int(cur["first"]), Path(str(cur["name"])).name))
    return out


class _TagRows:
    """One tag's rows with a step (step, value, segment), sorted by step with each step's rows
    in record order, read from the frame once per tag: each resume reads its steps' slice (a
    filter of the whole frame at each resume took 6 s for 999 resumes over 1M steps)."""

    def __init__(self, frame: pl.DataFrame) -> None:
        self.frame = frame
        self.read: dict[str, tuple[pl.DataFrame, np.ndarray]] = {}

    def __call__(self, tag: str) -> tuple[pl.DataFrame, np.ndarray]:
        if tag not in self.read:
            rows = (
                self.frame.filter((pl.col("tag") == tag) & pl.col("step").is_not_null())
                .select("step", "value", "segment")
                .sort("step", maintain_order=True)
            )
            self.read[tag] = (rows, rows.get_column("step").to_numpy())
        return self.read[tag]


def _both(
    tag_rows: tuple[pl.DataFrame, np.ndarray], seg: int, first: int, last: int
) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
    """The earlier jobs' and the resumed job's (step, value) of a tag (its :class:`_TagRows`)
    on ``first..last``, one value a step (an earlier segment's latest; a re-logged step's last
    row)."""
    frame, steps = tag_rows
    at = steps_within(steps, first, last)
    rows = frame.slice(at.start, at.stop - at.start).filter(pl.col("segment") <= seg)
    if rows.is_empty():
        return None, None

    def one(part: pl.DataFrame) -> pl.DataFrame | None:
        part = part.group_by("step", maintain_order=True).last().sort("step")
        part = part.filter(pl.col("value").is_finite())
        return part.select("step", "value") if part.height else None

    # (by segment, each segment's rows in record order within a step: a step's last row is
    # the latest segment's last)
    old = rows.filter(pl.col("segment") < seg).sort("segment", maintain_order=True)
    new = rows.filter(pl.col("segment") == seg)
    return one(old), one(new)


def _judge(
    ev: Evidence,
    p: ResumeRegressionParams,
    seam: int,
    seg: int,
    old: pl.DataFrame,
    new: pl.DataFrame,
    rows_of: _TagRows,
) -> Finding | None:
    both = old.join(new, on="step", how="inner", suffix="_new").sort("step")
    n = both.height
    if n < p.drop_min_points:
        return None
    x = both.get_column("step").to_numpy()
    a = both.get_column("value").to_numpy().astype(float)
    b = both.get_column("value_new").to_numpy().astype(float)
    level = float(np.median(a))
    if not level > 0:
        return None
    d = b - a
    half = n // 2

    def rise(part: np.ndarray) -> tuple[float, float]:
        """(median rise in % of the level, its standard error in %)."""
        se = 1.2533 * robust_sigma(part) / np.sqrt(len(part))
        return 100.0 * float(np.median(part)) / level, 100.0 * se / level

    whole, se = rise(d)
    halves = [rise(d[:half]), rise(d[half:])]
    up = _beyond([h for h, _ in halves], [s for _, s in halves], whole, p)
    if up is None:
        return None
    lr_old, lr_new, lr_apart = _lrs(ev, seg, int(x[0]), int(x[-1]), rows_of)
    steps = f"{int(x[0]):,}-{int(x[-1]):,}"
    way = "above" if up else "below"
    if lr_old is not None and lr_new is not None and not np.isclose(lr_old, lr_new, rtol=0.01):
        ev.run.note(
            f"{CHECK}: the loss ran {abs(whole):.1f}% {way} the earlier job's on the {n:,} steps "
            f"both logged after the resume at step {seam:,} ({steps}), but the resumed job ran "
            f"another LR there ({num(lr_new)} against {num(lr_old)}): that explains it"
        )
        return None
    if lr_apart is not None:
        # The medians agree, but not step by step: a warm-up run again after the resume
        # reaches the old LR within the steps both logged (1.5e-06 to 0.0003 over 200 of 500
        # steps, both medians 0.0003). The jobs did not run the same LR: no comparison.
        k, m, new_lrs, old_lrs = lr_apart
        ev.run.note(
            f"{CHECK}: the loss ran {abs(whole):.1f}% {way} the earlier job's on the {n:,} steps "
            f"both logged after the resume at step {seam:,} ({steps}), but the resumed job ran "
            f"another LR on {k:,} of the {m:,} steps both logged the LR ({_span(new_lrs)} "
            f"there, the earlier job {_span(old_lrs)}): the loss cannot be compared"
        )
        return None
    lr_text = (
        f" and ran the same LR ({num(lr_new)})"
        if lr_new is not None and lr_old is not None
        else " (no LR is logged to compare)"
    )
    mid_old, mid_new = level, float(np.median(b))
    h1, h2 = abs(halves[0][0]), abs(halves[1][0])
    said = (
        f"After the resume at step {seam:,} the loss ran {abs(whole):.1f}% {way} the earlier "
        f"job's on the {n:,} steps both logged ({steps}): median {num(mid_new)} against "
        f"{num(mid_old)}, {h1:.1f}% and {h2:.1f}% {'higher' if up else 'lower'} in each half of "
        f"them, though both jobs started from the same checkpoint{lr_text}. Jobs that start "
        "from the same weights log about the same loss on the same steps; "
        + (
            "this much higher, the resumed job did not go on from the state the earlier one "
            "had there: a checkpoint older than its step says, or the optimizer's moments, the "
            "loss scaler or part of the weights not restored: a hypothesis the log cannot "
            "confirm. The training it lost has to be done again."
            if up
            else "this much lower, the resumed job was most likely fed data it had already "
            "trained on (a data loader that started over from its first batch instead of its "
            "saved position), or an easier data mix: a hypothesis the log cannot confirm. Its "
            "lower loss there is not progress."
        )
    )
    return _finding(
        up,
        seam,
        int(x[0]),
        int(x[-1]),
        {
            "mode": "overlap",
            "seam_step": seam,
            "new_file": None,
            "points": n,
            "loss_earlier": mid_old,
            "loss_resumed": mid_new,
        },
        (whole, halves[0][0], halves[1][0], se),
        (lr_old, lr_new),
        {"drop_min_pct": p.drop_min_pct, "noise_k": p.noise_k, "min_points": p.drop_min_points},
        said,
    )


def _beyond(
    halves: list[float], errors: list[float], whole: float, p: ResumeRegressionParams
) -> bool | None:
    """True when the resumed job's loss ran higher by at least ``drop_min_pct`` in each half
    (and overall), beyond ``noise_k`` standard errors; False when lower so; None else."""
    for sign in (1.0, -1.0):
        if sign * whole >= p.drop_min_pct and all(
            sign * h >= p.drop_min_pct and sign * h > p.noise_k * e
            for h, e in zip(halves, errors, strict=True)
        ):
            return sign > 0
    return None


def _finding(
    up: bool,
    seam: int,
    start: int,
    end: int,
    measures: dict,
    rises: tuple[float, float, float, float],
    lrs: tuple[float | None, float | None],
    judged: dict,
    said: str,
) -> Finding:
    """A ``resume_setback`` (the resumed job's loss higher) or ``resume_drop`` (lower), its
    measures in its own sign, its sentence ``said``."""
    whole, first, second, se = rises
    sign, name = (1.0, "rise") if up else (-1.0, "drop")
    return Finding(
        kind=FindingKind.RESUME_SETBACK if up else FindingKind.RESUME_DROP,
        severity=Severity.WARNING,
        metric=LOSS,
        start_step=start,
        end_step=end,
        measures={
            **measures,
            f"{name}_pct": sign * whole,
            f"{name}_first_half_pct": sign * first,
            f"{name}_second_half_pct": sign * second,
            "noise_pct": se,
            "lr_earlier": lrs[0],
            "lr_resumed": lrs[1],
        },
        judged_against=judged,
        summary=said,
    )


_LR_APART_SHARE = 0.05  # steps with another LR (beyond 1%) from which two jobs' LRs differ


def _span(v: np.ndarray) -> str:
    """``0.0003`` or ``1.5e-06 to 0.0003``: the range of some LRs."""
    lo, hi = float(v.min()), float(v.max())
    return num(lo) if num(lo) == num(hi) else f"{num(lo)} to {num(hi)}"


def _lrs(
    ev: Evidence, seg: int, first: int, last: int, rows_of: _TagRows
) -> tuple[float | None, float | None, tuple[int, int, np.ndarray, np.ndarray] | None]:
    """The median LR of the earlier jobs and of the resumed job on ``first..last``, and where
    the two differ step by step on the steps both logged it, beyond 1%, on more than
    :data:`_LR_APART_SHARE` of them: (those steps, the steps compared, the resumed job's and
    the earlier jobs' LRs there); else None."""
    tag = ev.run.metrics().get(LR)
    if tag is None:
        return None, None, None
    old, new = _both(rows_of(tag), seg, first, last)
    if old is None or new is None:
        return None, None, None
    both = old.join(new, on="step", how="inner", suffix="_new")
    a = both.get_column("value").to_numpy().astype(float)
    b = both.get_column("value_new").to_numpy().astype(float)
    apart = ~np.isclose(b, a, rtol=0.01)
    k = int(apart.sum())
    differ = None
    if len(a) and k > _LR_APART_SHARE * len(a):
        differ = (k, len(a), b[apart], a[apart])
    return (
        float(np.median(old.get_column("value").to_numpy())),
        float(np.median(new.get_column("value").to_numpy())),
        differ,
    )


def _judge_seam(
    ev: Evidence, p: ResumeRegressionParams, seam: int, nxt: int | None, new_file: str | None
) -> Finding | None:
    """The seam of a resume that logged no step twice: the loss over the first ``w`` points
    after it and the next ``w``, against the Theil-Sen trend of the ``w`` points before it
    carried on (``w``: ``drop_seam_points``)."""
    w = p.drop_seam_points
    s = ev.series(LOSS)  # (finite values, sorted by step)
    x, y = s.steps, s.values
    i = int(np.searchsorted(x, seam, side="left"))
    j = int(np.searchsorted(x, nxt, side="left")) if nxt is not None else len(x)
    if i < w or j - i < 2 * w:
        return None
    xb, yb = x[i - w : i], y[i - w : i]
    trend = theil_sen(xb, yb, max_points=None)
    level = float(np.median(yb))
    if trend is None or not level > 0:
        return None
    sigma = robust_sigma(yb - (trend.intercept + trend.slope * xb))
    se = 100.0 * 1.2533 * sigma / np.sqrt(w) / level

    def rise(lo: int, hi: int) -> float:
        xa, ya = x[lo:hi], y[lo:hi]
        return 100.0 * float(np.median(ya - (trend.intercept + trend.slope * xa))) / level

    halves = [rise(i, i + w), rise(i + w, i + 2 * w)]
    whole = rise(i, i + 2 * w)
    up = _beyond(halves, [se, se], whole, p)
    if up is None:
        return None
    lr = ev.series(LR)
    lr_old = _median_in(lr.steps, lr.values, int(xb[0]), seam - 1)
    lr_new = _median_in(lr.steps, lr.values, seam, int(x[i + 2 * w - 1]))
    end = int(x[i + 2 * w - 1])
    way = "up" if up else "down"
    if lr_old is not None and lr_new is not None and not np.isclose(lr_old, lr_new, rtol=0.01):
        ev.run.note(
            f"{CHECK}: the loss stepped {way} {abs(whole):.1f}% when the job resumed at step "
            f"{seam:,}, but the resumed job ran another LR ({num(lr_new)} against "
            f"{num(lr_old)} before): that explains it"
        )
        return None
    pred = float(np.median(trend.intercept + trend.slope * x[i : i + w]))
    now = float(np.median(y[i : i + w]))
    lr_text = f", at the same LR ({num(lr_new)})" if lr_new is not None else ""
    shown = f" (a new log file, {new_file}, begins there)" if new_file else ""
    said = (
        f"When the job resumed at step {seam:,}{shown} the loss stepped {way} "
        f"{abs(whole):.1f}% at once and stayed {way}: median {num(now)} over the {w:,} points "
        f"after it against {num(pred)} predicted by the trend of the {w:,} points before "
        f"it ({abs(halves[0]):.1f}% and {abs(halves[1]):.1f}% {'higher' if up else 'lower'} over "
        f"the first {w:,} points and the next {w:,}){lr_text}. A resumed job goes on from the "
        "weights its checkpoint saved; "
        + (
            "this much higher at once, it did not go on from the state the earlier job had "
            "saved: a checkpoint older than its step says, or the optimizer's moments, the loss "
            "scaler or part of the weights not restored: a hypothesis the log cannot confirm. "
            "The training it lost has to be done again."
            if up
            else "this much lower at once, it was most likely fed data it had already trained "
            "on (a data loader that started over from its first batch instead of its saved "
            "position), or an easier data mix: a hypothesis the log cannot confirm. Its lower "
            "loss there is not progress."
        )
    )
    return _finding(
        up,
        seam,
        seam,
        end,
        {
            "mode": "seam",
            "seam_step": seam,
            "new_file": new_file,
            "points": w,
            "loss_earlier": pred,
            "loss_resumed": now,
        },
        (whole, halves[0], halves[1], se),
        (lr_old, lr_new),
        {"drop_min_pct": p.drop_min_pct, "noise_k": p.noise_k, "seam_points": w},
        said,
    )


def _median_in(steps: np.ndarray, values: np.ndarray, lo: int, hi: int) -> float | None:
    """The median of the finite values at steps ``lo..hi`` (``steps`` sorted)."""
    part = values[steps_within(steps, lo, hi)]
    part = part[np.isfinite(part)]
    return float(np.median(part)) if len(part) else None
