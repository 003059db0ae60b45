"""Adaptive baselines (article section 6.1): thresholds relative to the run's own early life.

The article records the grad norm's rolling level over the first 500 steps after start-up and
warns at 2x / 3x of it. We take the median (robust to the odd spike) over the first
``window`` steps after the LR warm-up; when the log starts mid-training, the first window of
the log; when the log is short, a window that shrinks with the number of logged points.

These are the only baselines: :class:`forensics.evidence.Evidence` builds its grad-norm and
param-norm bands from them with the configured windows, and the detectors and the charts read
those bands. :func:`warmup_end` is the only warm-up end (``Evidence.warmup_end``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from forensics.schema import GRAD_NORM, PARAM_NORM, PARAM_NORM_LAYER

if TYPE_CHECKING:
    from forensics.evidence import Evidence, Series


@dataclass(frozen=True)
class Baseline:
    value: float
    start_step: int
    end_step: int
    n_points: int
    how: str  # a few words for the report: "median of steps 120-620 after warm-up"


# The warm-up ends where the LR first reaches its early peak, up to the last digits a log
# prints (llm.c writes 6 decimals): at 98% of it, llm.c's warm-up to step 700 "ended" at step
# 685 (0.000588 of 0.0006), while the LR was still rising.
WARMUP_PEAK_SHARE = 0.999


def warmup_end(lr: Series) -> int | None:
    """The step where the LR warm-up ends: where the LR first reaches (about) its early peak,
    when the log has an LR series that rises first. Read it as ``Evidence.warmup_end`` (computed
    once per run; the LR schedule's warm-up segment ends there)."""
    if len(lr) < 3:
        return None
    v, s = lr.values, lr.steps
    finite = np.isfinite(v)
    if not finite.any():
        return None
    if not finite.all():  # (no copies of an all-finite series)
        v, s = v[finite], s[finite]
    del finite
    # A warm-up comes early: its peak is the highest LR of the first quarter of the log. An LR
    # raised later (a scheduler bug, a restart) is not part of it.
    early = s <= s[0] + 0.25 * (s[-1] - s[0])
    peak = float(np.max(v[early]))
    if peak <= 0:
        return None
    first_peak = int(np.argmax(v >= WARMUP_PEAK_SHARE * peak))
    if first_peak == 0 or v[0] >= 0.9 * peak:
        return None  # no warm-up visible
    # The LR must stop rising there: one that keeps climbing (a schedule peaking at the end of
    # the log, a warm-up longer than the log) has no warm-up end in it.
    reach = max(int(s[first_peak] - s[0]), int(0.05 * (s[-1] - s[0])))
    after = (s > s[first_peak]) & (s <= s[first_peak] + reach)
    if (v[after] > 1.02 * peak).any():
        return None
    return int(s[first_peak])


def series_baseline(
    steps: np.ndarray,
    values: np.ndarray,
    *,
    start: int | None = None,
    window: int = 500,
    min_points: int = 5,
) -> Baseline | None:
    """Median of ``values`` over ``window`` steps from ``start`` (default: the first step).

    The window is in steps; with sparse logging it holds fewer points, and when it would hold
    fewer than ``min_points`` it is widened to the first ``min_points`` points (or to a fifth of
    the log for short logs), so short excerpts still get a baseline.
    """
    ok = np.isfinite(values)
    if not ok.all():  # (no copies of an all-finite series)
        steps, values = steps[ok], values[ok]
    del ok
    if len(values) == 0:
        return None
    if start is None:
        start = int(steps[0])
    sel = (steps >= start) & (steps < start + window)
    if sel.sum() < min_points:
        after = np.flatnonzero(steps >= start)
        if len(after) == 0:
            after = np.arange(len(steps))
        k = max(min(min_points, len(after)), len(after) // 5)
        sel = np.zeros(len(steps), dtype=bool)
        sel[after[:k]] = True
    chosen_steps = steps[sel]
    return Baseline(
        value=float(np.median(values[sel])),
        start_step=int(chosen_steps[0]),
        end_step=int(chosen_steps[-1]),
        n_points=int(sel.sum()),
        how=(
            f"median of {int(sel.sum()):,} points, "
            f"steps {int(chosen_steps[0]):,}-{int(chosen_steps[-1]):,}"
        ),
    )


def grad_norm_baseline(ev: Evidence, *, window: int = 500) -> Baseline | None:
    """The grad-norm baseline: median over the first ``window`` steps after the LR warm-up
    (``ev.warmup_end``). Read it as ``Evidence.grad_norm_band``."""
    g = ev.logged(GRAD_NORM)  # every logged step: a log ending in NaN is that long
    if g.empty:
        return None
    start = ev.warmup_end
    steps = g.steps
    # Short logs: at most a fifth of the log, so a drift later on does not leak into its own
    # baseline (the drift detector and the report's 2x/3x bands both read this one value).
    window = min(window, max(10, int(steps[-1] - steps[0]) // 5))
    values = g.values
    how = ", after the LR warm-up"  # (the chart's caption puts it inside a parenthesis)
    if start is None and int(steps[0]) <= window:
        # No warm-up in the log (LR not logged, or constant) but the log starts with training:
        # the grad norm's start-up decay must not inflate the baseline, so it begins where the
        # series has settled.
        start = settle_step(steps, values)
        how = (
            f", after the start-up transient settled at step {start:,}" if start is not None else ""
        )
    b = series_baseline(steps, values, start=start, window=window)
    if b is not None and start is not None:
        b = Baseline(b.value, b.start_step, b.end_step, b.n_points, b.how + how)
    return b


def total_param_norm(ev: Evidence) -> tuple[Series, str]:
    """The param-norm series, or one rebuilt from per-layer norms (the root of their sum of
    squares, at the steps where every layer was logged), with its source metric. Read it as
    ``Evidence.param_norm_total``."""
    from forensics.evidence import Series

    s = ev.series(PARAM_NORM)
    if len(s):
        return s, PARAM_NORM
    layers = ev.run.layers(PARAM_NORM_LAYER)
    if not layers:
        return s, PARAM_NORM
    v = ev.run.metric_rows(PARAM_NORM_LAYER)
    same = _same_steps(v, len(layers))
    if same is not None:
        x, y = same
    else:
        tot = (
            v.group_by("step")
            .agg(
                (pl.col("value") ** 2).sum().sqrt().alias("v"),
                pl.col("layer").n_unique().alias("n"),
            )
            .filter(pl.col("n") == len(layers))
            .sort("step")
        )
        x = tot.get_column("step").to_numpy().astype(np.int64)
        y = tot.get_column("v").to_numpy().astype(float)
    ok = np.isfinite(y)
    return Series(x[ok], y[ok]), PARAM_NORM_LAYER


def _same_steps(v: pl.DataFrame, n_layers: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The total of :func:`total_param_norm` where every per-layer tag logged the same
    steps (the usual log): the view holds each tag's rows together, sorted by step, so the
    total is the root of a sum over the tags' rows, added one tag at a time, each read in
    place (no hash table of the steps, no copy of the columns: a group-by of a 1M-step
    run's 640,000 rows took 30 MiB above the frame). None for any other shape (the
    group-by then)."""
    n = v.height
    if n == 0 or v.get_column("value").null_count() or v.get_column("layer").null_count():
        return None
    runs = v.get_column("tag").rle()
    lens = runs.struct.field("len").to_numpy()
    m = int(lens[0])
    if not (lens == m).all() or runs.struct.field("value").n_unique() != len(lens):
        return None
    if v.get_column("layer").n_unique() != n_layers:
        return None
    first: np.ndarray | None = None
    total: np.ndarray | None = None
    for r in range(len(lens)):
        part = v.slice(r * m, m)  # (one tag's rows: one chunk of the view, read in place)
        steps = part.get_column("step").to_numpy()
        y = part.get_column("value").to_numpy().astype(float, copy=False)
        if first is None:
            if not (np.diff(steps) > 0).all():
                return None
            first, total = steps.astype(np.int64), y * y
        elif not np.array_equal(steps, first):
            return None
        else:
            assert total is not None
            total += y * y
    assert first is not None and total is not None
    return first, np.sqrt(total, out=total)


def param_norm_baseline(ev: Evidence, *, window: int = 500) -> Baseline | None:
    """The param-norm baseline: median over the first ``window`` steps after the LR warm-up
    (of the total param norm, logged or rebuilt); None without a positive one."""
    s, _ = ev.param_norm_total
    if s.empty:
        return None
    b = series_baseline(s.steps, s.values, start=ev.warmup_end, window=window)
    return b if b is not None and b.value > 0 else None


def settle_step(steps: np.ndarray, values: np.ndarray, *, tolerance: float = 1.25) -> int | None:
    """Where a start-up transient ends: the first point whose rolling median is within
    ``tolerance`` x the level of the 10%-30% stretch of the log. None when there is no transient."""
    ok = np.isfinite(values)
    if not ok.all():  # (no copies of an all-finite series)
        steps, values = steps[ok], values[ok]
    del ok
    n = len(values)
    if n < 20:
        return None
    span = float(steps[-1] - steps[0])
    ref = (steps >= steps[0] + 0.1 * span) & (steps <= steps[0] + 0.3 * span)
    if ref.sum() < 3:
        return None
    level = float(np.median(values[ref]))
    k = max(5, n // 50)
    from scipy.ndimage import median_filter

    rolling = median_filter(values, size=k, mode="nearest")
    inside = np.flatnonzero(rolling <= tolerance * level)
    if len(inside) == 0 or inside[0] == 0:
        return None
    return int(steps[inside[0]])
