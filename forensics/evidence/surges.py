"""Grad-norm surges the spike search cannot see: stretches above the band's warning line.

The spike search (:mod:`forensics.evidence.spikes`) judges each point against a local baseline
of ``window`` points. A grad norm that ramps up over a few dozen steps carries that baseline
with it: a climb to 4x the run's baseline and back within 60 steps never stands out from its
neighbours, and is too short for ``grad_norm_drift``'s smoothed level. The article's lines
(6.1, 6.3: 2x a 500-step baseline a warning, 3x critical) judge the level itself, and a level
above them for more than ``transient_points`` logged points is more than one batch.

:func:`band_surges` finds those stretches: after the baseline window, the grad norm above the
warning line (the band's, moved with the LR schedule's expected rise as the drift detector
moves it) on at least two of every three consecutive points, with more than
``transient_points`` points above it. A stretch that overlaps a spike the search found, the
drift detector's climb or a divergence is theirs. Each other one is measured as a spike (the
same shape measures, :func:`~forensics.evidence.shape_batch.measure_many`) from where it
left the level before it (the median of the baseline window's length before it), and kept
when its height (its highest median of three consecutive points) stands at least
``grad_norm_min_ratio`` (2x) above that level: a grad norm that rose over thousands of
steps and crosses the line back and forth has no such level to surge from. The spike
detector judges it by the band, as any spike too wide to be one batch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from forensics.evidence import robust
from forensics.evidence.order_stats import median
from forensics.evidence.shape_batch import SpikeInput, measure_many
from forensics.evidence.spike_shape import log_steps
from forensics.evidence.spikes import Spike, SpikeSearch, step_intervals

if TYPE_CHECKING:
    from forensics.evidence import Evidence


def band_surges(ev: Evidence, metric: str, found: list[Spike]) -> list[Spike]:
    """The stretches of ``metric`` (the grad norm) above its band's warning line that no spike
    in ``found`` covers, each measured as a spike (see the module text)."""
    s = ev.series(metric)
    steps, values = s.steps, s.values
    runs = stretches(ev, metric)
    if not runs:
        return []
    covered = [(sp.start_step, sp.end_step) for sp in found]
    drift = ev.drift
    if drift is not None and drift.flagged:  # (a climb it judges: its stretch is its own)
        covered.append((drift.onset_step, drift.end_step))
    covered += ev.diverged  # (the divergence finding reports the grad norm over its rise)
    runs = [r for r in runs if not _overlaps(covered, int(steps[r[0]]), int(steps[r[1]]))]
    if not runs:
        return []
    return _measured(ev, metric, steps, values, runs)


def stretches(ev: Evidence, metric: str) -> list[tuple[int, int, float, int]]:
    """Every stretch of ``metric`` above the band's (moving) warning line with more than
    ``transient_points`` points above it, after the baseline window: its first and last
    index, the line at its peak and its points above the line (none without a band)."""
    band = ev.grad_norm_band
    if band is None or not band.baseline.value > 0:
        return []
    s = ev.series(metric)
    steps, values = s.steps, s.values
    after = int(np.searchsorted(steps, band.baseline.end_step, side="right"))
    longer_than = ev.params.spikes.transient_points
    # The points above the plain line (the lowest the moving line can be), in clusters at
    # most one point apart: a long run's thousands of one-point outliers are dropped here
    # by their count, and only the few long clusters are compared with the moving line.
    idx = after + np.flatnonzero(values[after:] > band.warn_at)
    if len(idx) <= longer_than:
        return []
    cuts = np.flatnonzero(np.diff(idx) > 2) + 1
    firsts, ends = np.concatenate(([0], cuts)), np.concatenate((cuts, [len(idx)]))
    big = ends - firsts > longer_than
    runs: list[tuple[int, int, float, int]] = []
    for a, b in zip(firsts[big].tolist(), ends[big].tolist(), strict=True):
        lo, hi = int(idx[a]), int(idx[b - 1])
        line = band.warn_at * _expected_rise(ev, band, steps[lo : hi + 1])
        above = values[lo : hi + 1] > line
        for r0, r1 in _runs(above, longer_than):
            peak = r0 + int(np.argmax(values[lo + r0 : lo + r1 + 1]))
            n_above = int(np.count_nonzero(above[r0 : r1 + 1]))
            runs.append((lo + r0, lo + r1, float(line[peak]), n_above))
    return runs


def heights(ev: Evidence, metric: str) -> list[float]:
    """Each stretch's peak over the level it left (NaN where no level precedes it), overlaps
    included: how close a run comes to a surge (``benchmarks/calibration.py``; a surge needs
    ``grad_norm_min_ratio``)."""
    lv = _Levels(ev, metric)
    out = []
    for first, last, _, _ in stretches(ev, metric):
        left = lv.left(first)
        out.append(_top(lv.values, first, last) / left[3] if left is not None else math.nan)
    return out


class _Levels:
    """What the levels a series' stretches left are read from: its values in the score's
    units (log for a positive series), and how far back a level is read (the baseline
    window's steps at its logging interval)."""

    def __init__(self, ev: Evidence, metric: str) -> None:
        self.p = p = SpikeSearch.of(ev.params.spikes, metric)
        series = ev.series(metric)
        self.values = series.values
        self.log_scale = robust.use_log(self.values)
        self.ys = robust.transform(self.values, self.log_scale)
        self.interval, self.shape_interval = step_intervals(series.steps)
        trend = ev.params.spikes.trend_window
        self.reach = max(p.window, int(trend / max(self.interval, 1e-12)))

    def left(self, first: int) -> tuple[int, float, float, float] | None:
        """For a stretch from index ``first``: its onset, the level it left and that level's
        noise in the score's units, and the level in the series' own (None at the start of
        the log, with no level before it)."""
        p = self.p
        onset, base, sigma = _left_level(self.ys, first, p.window, self.reach, p.sigma_floor)
        if onset is None:
            return None
        return onset, base, sigma, (float(np.exp(base)) if self.log_scale else base)


def _top(values: np.ndarray, first: int, last: int) -> float:
    """The level a stretch reached: the highest median of three consecutive points in it
    (one outlier among hundreds of points above the line is not the stretch's height)."""
    seg = values[max(0, first - 1) : last + 2]
    if len(seg) < 3:
        return float(seg.max())
    a, b, c = seg[:-2], seg[1:-1], seg[2:]
    return float(np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c)).max())


def _expected_rise(ev: Evidence, band: Any, at: np.ndarray) -> np.ndarray:
    """The warning line's factor at ``at`` (x the band's ratio): 1 where the LR did not decay,
    up to ``envelope_margin`` x the schedule's expected rise / the warning ratio where it did
    (``grad_norm_drift``'s moving line)."""
    from forensics.detectors.drift import envelope

    env = envelope(ev, at, band.baseline.start_step, band.baseline.end_step)
    warn, _ = env.lines(env.rise, band)
    return np.asarray(warn, dtype=float) / band.warn_ratio


def _runs(above: np.ndarray, longer_than: int) -> list[tuple[int, int]]:
    """First and last index of each stretch where at least two of three consecutive points
    are above (one point in between below does not split a stretch, one point alone does not
    make one) that holds more than ``longer_than`` points above."""
    a = np.pad(above.astype(np.int8), 1)  # (the points beyond either end: below)
    held = ((a[:-2] + a[1:-1] + a[2:]) >= 2).astype(np.int8)  # (the vote centred on each)
    edges = np.flatnonzero(np.diff(np.concatenate(([0], held, [0]))))
    out = []
    for lo, hi in zip(edges[::2].tolist(), (edges[1::2] - 1).tolist(), strict=True):
        while lo < hi and not above[lo]:  # (its ends: points above)
            lo += 1
        while hi > lo and not above[hi]:
            hi -= 1
        if int(np.count_nonzero(above[lo : hi + 1])) > longer_than:
            out.append((lo, hi))
    return out


def _overlaps(covered: list[tuple[int, int]], lo: int, hi: int) -> bool:
    return any(a <= hi and lo <= b for a, b in covered)


def _measured(
    ev: Evidence,
    metric: str,
    steps: np.ndarray,
    values: np.ndarray,
    runs: list[tuple[int, int, float, int]],
) -> list[Spike]:
    """Each stretch (first and last index, the line at its peak, its points above the line)
    measured as a spike."""
    lv = _Levels(ev, metric)
    p, log_scale, ys = lv.p, lv.log_scale, lv.ys
    inputs, rows = [], []
    for first, last, at_peak, n_above in runs:
        peak = first + int(np.argmax(values[first : last + 1]))
        left = lv.left(first)
        if left is None:
            continue  # (no level before it to measure from: the start of the log)
        onset, base, sigma, baseline = left
        if not _top(values, first, last) >= p.min_ratio * baseline:
            # Not a surge out of the level before it but that level itself high: a grad
            # norm that rose over hundreds of steps and crosses the line back and forth is
            # the drift detector's to judge, not a spike each crossing.
            continue
        alarm = float(np.log(at_peak)) - base if log_scale else at_peak - base
        inputs.append(SpikeInput(onset, peak, sigma, baseline, alarm))
        rows.append((onset, peak, n_above, baseline, base, sigma, at_peak))
    if not inputs:
        return []
    shapes = measure_many(
        steps,
        values,
        inputs,
        log_scale=log_scale,
        p=p.shape,
        barriers=ev.level_barriers,
        interval=lv.shape_interval,
        xs=log_steps(steps),
        ys=ys,
    )
    out = []
    for (onset, peak, n_above, baseline, base, sigma, at_peak), m in zip(rows, shapes, strict=True):
        rec = m["recovered_step"]
        end_step = int(rec) if isinstance(rec, (int, float)) else int(steps[-1])
        value = float(values[peak])
        z = (float(ys[peak]) - base) / sigma
        measures: dict[str, Any] = {
            "peak_value": value,
            "baseline": baseline,
            "height": value - baseline,
            "height_ratio": value / baseline if log_scale else None,
            "z": z,
            "two_sided": False,
            "points": n_above,
            "log_interval": lv.interval,
            **m,
        }
        start, top = int(steps[onset]), int(steps[peak])
        out.append(Spike(metric, start, top, end_step, measures, at_peak, found_by="band"))
    return out


def _left_level(
    ys: np.ndarray, first: int, window: int, reach: int, sigma_floor: float
) -> tuple[int | None, float, float]:
    """Where a surge left the level before it, that level and its noise (robust sigma, at
    least ``sigma_floor``), in the score's units: the median of the ``reach`` points before
    the first one above the line (the baseline window's length: a climb of a few dozen
    points does not move it, and a noisy grad norm's dip of a few dozen does not lower it),
    and the onset the point after the last of them within three sigma of it. None when fewer
    than ``window`` points precede the onset."""
    if first < window:
        return None, float("nan"), float("nan")
    lo = max(0, first - reach)
    base, sigma = _level(ys[lo:first], sigma_floor)
    within = np.flatnonzero(ys[lo:first] <= base + _K * sigma)
    onset = lo + int(within[-1]) + 1 if len(within) else lo
    if onset < window:
        return None, float("nan"), float("nan")
    return onset, base, sigma


_K = 3.0  # sigmas above the level before it where a surge's climb begins


def _level(pts: np.ndarray, sigma_floor: float) -> tuple[float, float]:
    """The median of some points and their robust sigma (at least ``sigma_floor``)."""
    mid = float(median(pts))
    return mid, max(sigma_floor, robust.MAD_TO_SIGMA * float(median(np.abs(pts - mid))))
