"""The shape of one spike (article 4.3-4.4: "the shape matters more than the spike").

Everything is measured against the *pre-spike trend, extrapolated*: a robust (Theil-Sen) line
of the series (log of it for positive series) against log(step + 1), fitted to the points
before the onset. A power law is a line in those coordinates, so the extrapolation follows a
falling loss instead of a flat level: a spike on a falling curve is not called "beneficial"
just because the loss kept falling after it. The band around the trend widens with the
distance from the fit by the slope's 95% confidence half-width, so a long extrapolation is
trusted less.

When fewer than ``min_trend_points`` points precede the spike (a spike at the second line of
a log), the trend is the median level of what precedes, and the post-spike plateau is not
judged: a level cannot be extrapolated.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from forensics.evidence.order_stats import median, median_of_ints
from forensics.evidence.reuse import fit_trend_reusing
from forensics.evidence.robust import MAD_TO_SIGMA, inverse, theil_sen_line, theil_sen_with_half
from forensics.params import SpikesParams

SETTLED = {1: "higher", -1: "lower", 0: "within"}  # the plateau against the slope's uncertainty


class SpikeClass(StrEnum):
    """What a spike's shape says (article 4.3); the values are the findings' ``classification``."""

    PHYSIOLOGICAL = "physiological"  # back on its trend within the recovery limit
    PATHOLOGICAL = "pathological"  # back too late, settled higher, or never back
    BENEFICIAL = "beneficial"  # settled clearly below its earlier trend
    UNRESOLVED = "unresolved"  # still up when the log ends, before the recovery limit


@dataclass(frozen=True, kw_only=True)
class ShapeParams:
    """How a spike's shape is measured. The configurable numbers come from
    :class:`~forensics.params.SpikesParams` (:meth:`of`); the rest are fixed here."""

    trend_window: int  # steps before the onset used for the trend
    band_k: float  # recovery band half-width in robust sigmas
    recover_steps: int  # article 4.3: not back after ~500 steps = pathological
    plateau_window: int  # steps after recovery where the steady level is measured
    plateau_tol: float  # relative shift that counts as "settled clearly higher/lower"
    trend_max_points: int = 300  # cap on points (Theil-Sen is quadratic)
    min_trend_points: int = 5
    smooth_points: int = 3  # recovery needs this many points' median back in the band

    @classmethod
    def of(cls, p: SpikesParams) -> ShapeParams:
        return cls(
            trend_window=p.trend_window,
            band_k=p.band_k,
            recover_steps=p.recover_steps,
            plateau_window=p.plateau_window,
            plateau_tol=p.plateau_tol,
        )


@dataclass(frozen=True)
class Trend:
    intercept: float
    slope: float
    slope_halfwidth: float
    x_center: float
    sigma: float
    kind: str  # "trend" | "level"
    backtest_err: float = 0.0  # how far a fit on the first half missed the second half
    backtest_h: float = 1.0  # at that distance (x units)

    def at(self, steps: np.ndarray) -> np.ndarray:
        return self.intercept + self.slope * log_steps(steps)

    def uncertainty(self, steps: np.ndarray) -> np.ndarray:
        """How wrong the extrapolation may be at ``steps``, growing with the distance from the fit:
        the larger of the slope's 95% half-width and the backtest miss per unit of distance."""
        dx = np.abs(log_steps(steps) - self.x_center)
        return np.maximum(self.slope_halfwidth, self.backtest_err / self.backtest_h) * dx

    def upper(self, steps: np.ndarray, k: float) -> np.ndarray:
        return self.at(steps) + k * self.sigma + self.uncertainty(steps)


def log_steps(steps: np.ndarray | float) -> np.ndarray:
    """The trend's abscissa, log(step + 1): a power law in steps is a line against it."""
    if isinstance(steps, np.ndarray) and steps.ndim == 1:
        # The same two operations in one new array (a million-step series' abscissa is made
        # once per spike search: no two temporaries of its length).
        x = np.array(steps, dtype=float)
        np.maximum(x, 0.0, out=x)
        return np.log1p(x, out=x)
    return np.log1p(np.maximum(np.asarray(steps, dtype=float), 0.0))


def fit_trend(
    steps: np.ndarray,
    y: np.ndarray,
    onset: int,
    fallback_level: float,
    fallback_sigma: float,
    p: ShapeParams,
) -> Trend:
    """Robust pre-spike trend from the points before ``onset`` (indices into steps / y)."""
    lo = max(0, onset - p.trend_max_points)
    sel = np.arange(lo, onset)
    sel = sel[steps[sel] >= steps[onset] - p.trend_window] if len(sel) else sel
    if len(sel) < p.min_trend_points and onset >= p.min_trend_points:
        sel = np.arange(onset - p.min_trend_points, onset)  # sparse logs: widen to the minimum
    if len(sel) >= p.min_trend_points:
        xs, ys = log_steps(steps[sel]), y[sel]
        if np.ptp(xs) > 0:
            # The backtest's line shares the fit's slopes where it can (the same numbers).
            (slope, intercept, low, high), half_line = theil_sen_with_half(xs, ys)
            resid = ys - (intercept + slope * xs)
            sigma = MAD_TO_SIGMA * float(median(np.abs(resid - median(resid))))
            err, h = _backtest(xs, ys, half_line)
            return Trend(
                float(intercept),
                float(slope),
                float(high - low) / 2.0,
                float(median(xs)),
                max(sigma, fallback_sigma),
                "trend",
                err,
                h,
            )
    level = float(median(y[sel])) if len(sel) else fallback_level
    return Trend(level, 0.0, 0.0, 0.0, fallback_sigma, "level")


def _backtest(
    xs: np.ndarray, ys: np.ndarray, line: tuple[float, float] | None = None
) -> tuple[float, float]:
    """Fit the first half, predict the second: the miss (median residual) and the distance.
    ``line``: the first half's Theil-Sen line when already fitted.

    At the fast-falling start of training a line fitted to a few hundred steps does not
    extrapolate: this measures by how much, from the data itself.
    """
    half = len(xs) // 2
    if line is None:
        if half < 3 or np.ptp(xs[:half]) <= 0:
            return 0.0, 1.0
        line = theil_sen_line(xs[:half], ys[:half])
    slope, intercept = line
    miss = float(abs(median(ys[half:] - (intercept + slope * xs[half:]))))
    h = float(median(xs[half:]) - median(xs[:half]))
    return miss, max(h, 1e-9)


def measure(
    steps: np.ndarray,
    values: np.ndarray,
    *,
    onset: int,
    peak: int,
    log_scale: bool,
    sigma: float,
    baseline_at_peak: float,
    alarm: float,
    p: ShapeParams,
    barriers: list[int] | None = None,
    interval: float | None = None,
    xs: np.ndarray | None = None,
    ys: np.ndarray | None = None,
    trend: Trend | None = None,
) -> dict[str, float | int | str | bool | None]:
    """Shape measures of one spike. ``steps``/``values`` are the finite points of the series,
    sorted by step.

    ``alarm`` is the detection threshold above the trend, in transformed units (log units for
    positive series): the width counts the steps spent above it. ``interval`` is the median
    step difference of ``steps`` (computed when not given; callers measuring many spikes of one
    series pass it once). ``xs`` and ``ys``, when given, are :func:`log_steps` of ``steps`` and
    the transformed ``values`` of the whole series (callers measuring many spikes compute them
    once; element by element they are the numbers computed here on each stretch). ``trend``,
    when given, is the spike's pre-spike trend as fitted here (callers that fitted it already).

    The cost grows with the spike's own extent (trend window, width, recovery, plateau), not
    with the series' length: every array below is computed on the stretch it needs, growing
    in doubling chunks where the end is not known in advance. The numbers are those of the
    whole-series computation (the same element-wise operations on fewer elements).
    """
    n = len(values)

    def x_of(a: int, b: int) -> np.ndarray:
        return xs[a:b] if xs is not None else log_steps(steps[a:b])

    def y_of(a: int, b: int) -> np.ndarray:
        return ys[a:b] if ys is not None else _transform(values[a:b], log_scale)

    # The trend needs at most trend_max_points (or min_trend_points) points before the onset.
    lo0 = max(0, onset - max(p.trend_max_points, p.min_trend_points))
    base_y = np.log(baseline_at_peak) if log_scale else baseline_at_peak
    # Through the watcher's memo when one is active (forensics.evidence.reuse): same inputs,
    # same fit.
    if trend is None:
        trend = fit_trend_reusing(
            steps[lo0 : onset + 1], y_of(lo0, onset + 1), onset - lo0, base_y, sigma, p
        )
    if interval is None:
        interval = median_of_ints(np.diff(steps)) if n > 1 else 1.0
    # The band's parts as Trend.upper forms them, for (upper - at) in the same operations.
    band = p.band_k * trend.sigma
    widen = np.maximum(trend.slope_halfwidth, trend.backtest_err / trend.backtest_h)

    def at(a: int, b: int) -> np.ndarray:
        return trend.intercept + trend.slope * x_of(a, b)

    def resid(a: int, b: int) -> np.ndarray:
        return y_of(a, b) - at(a, b)

    def upper(a: int, b: int) -> np.ndarray:
        x = x_of(a, b)
        t = trend.intercept + trend.slope * x
        return t + band + widen * np.abs(x - trend.x_center) - t

    # Recovery: the first point after the peak that is back inside the band itself and where
    # the median of it and the next few points is too (one lucky low point does not make a
    # recovery, and the step named as the recovery is one a reader finds back on the chart).
    rec_idx: int | None = None
    m = max(1, p.smooth_points)
    a, size = peak + 1, _CHUNK
    while a < n and rec_idx is None:
        b = min(n, a + size)
        hi = min(n, b + m - 1)
        r = resid(a, hi)
        if hi < b + m - 1:
            r = np.concatenate([r, np.full(b + m - 1 - hi, np.nan)])
        win = np.lib.stride_tricks.sliding_window_view(r, m)
        up = upper(a, b)
        inside = np.flatnonzero((_window_median(win) <= up) & (win[:, 0] <= up))
        if len(inside):
            rec_idx = a + int(inside[0])
        a, size = b, size * 2
    recovered = rec_idx is not None
    recovery_steps = int(steps[rec_idx] - steps[peak]) if recovered else None
    last_raised = int(steps[rec_idx - 1]) if rec_idx is not None else None

    # Width: the contiguous run of points above the alarm line that holds the peak.
    line = max(alarm, 0.0)
    left = np.flatnonzero(~(resid(onset, peak) > line)) if peak > onset else np.empty(0, int)
    first = onset + int(left[-1]) + 1 if len(left) else onset
    last, a, size = peak, peak + 1, _CHUNK
    while a < n:
        b = min(n, a + size)
        below = np.flatnonzero(~(resid(a, b) > line))
        if len(below):
            last = a + int(below[0]) - 1
            break
        last, a, size = b - 1, b, size * 2
    width_steps = int(steps[last] - steps[first] + interval)

    end = rec_idx if rec_idx is not None else n
    seg_steps = steps[onset:end]
    trend_v = inverse(at(onset, end), log_scale)
    dt = np.diff(np.append(seg_steps, seg_steps[-1] + interval)) if len(seg_steps) else np.array([])
    excess = values[onset:end] - trend_v
    excess_area = float(np.sum(excess * dt)) if len(seg_steps) else 0.0
    excess_area_rel = float(np.sum(excess / np.abs(trend_v) * dt)) if len(seg_steps) else 0.0

    # Plateau: the steady level after recovery (or after the recovery limit) minus the trend.
    plateau_shift = plateau_rel = None
    clearly = 0
    if trend.kind == "trend":
        settle = steps[rec_idx] if recovered else steps[peak] + p.recover_steps
        stop = settle + p.plateau_window
        # An epoch start or an LR restart moves the level on its own: stop before it.
        later = [b for b in (barriers or []) if b > steps[peak]]
        if later:
            stop = min(stop, min(later) - 1)
        w0 = int(np.searchsorted(steps, settle, side="left"))
        w1 = int(np.searchsorted(steps, stop, side="right"))
        if w1 - w0 >= 3:
            t = at(w0, w1)
            shift_y = float(median(y_of(w0, w1) - t))
            tv = inverse(t, log_scale)
            plateau_shift = float(median(values[w0:w1] - tv))
            plateau_rel = (
                float(np.expm1(shift_y))
                if log_scale
                else plateau_shift / max(float(median(np.abs(tv))), 1e-12)
            )
            # "Clearly" shifted: beyond the tolerance plus what the slope's uncertainty allows
            # at that distance from the fit.
            unc = float(trend.uncertainty(np.array([np.median(steps[w0:w1])]))[0])
            unc_rel = (
                float(np.expm1(unc)) if log_scale else unc / max(float(median(np.abs(tv))), 1e-12)
            )
            if plateau_rel > p.plateau_tol + unc_rel:
                clearly = 1
            elif plateau_rel < -(p.plateau_tol + unc_rel):
                clearly = -1

    log_left = int(steps[-1] - steps[peak])
    if not recovered:
        cls = SpikeClass.PATHOLOGICAL if log_left >= p.recover_steps else SpikeClass.UNRESOLVED
    elif (
        last_raised is not None and too_slow(last_raised - int(steps[peak]), p.recover_steps)
    ) or clearly > 0:
        cls = SpikeClass.PATHOLOGICAL
    elif clearly < 0:
        cls = SpikeClass.BENEFICIAL
    else:
        cls = SpikeClass.PHYSIOLOGICAL

    return {
        "width_steps": width_steps,
        "recovered": recovered,
        "recovery_steps": recovery_steps,
        "recovered_step": int(steps[rec_idx]) if recovered else None,
        "last_raised_step": last_raised,
        "plateau_shift": plateau_shift,
        "plateau_shift_rel": plateau_rel,
        "settled": None if plateau_rel is None else SETTLED[clearly],
        "excess_area": excess_area,
        "excess_area_rel": excess_area_rel,
        "trend": trend.kind,
        "steps_logged_after_peak": log_left,
        "classification": cls,
    }


_CHUNK = 64  # first chunk of a forward search (recovery, width); doubled each time


def too_slow(raised_for: int, limit: int) -> bool:
    """Whether a spike's recovery was too slow (article 4.3: still raised ``limit`` steps
    after its peak), from the last logged point still raised, ``raised_for`` steps after the
    peak: a log written every 1,000 steps whose spike was gone at the next point shows no
    point raised after 500, so it cannot call the spike slow (it had read "back only after
    1,000 steps; pathological", critical, for a one-point blip)."""
    return raised_for >= limit


def _transform(values: np.ndarray, log_scale: bool) -> np.ndarray:
    return np.log(values) if log_scale else values.astype(float)


def _window_median(win: np.ndarray) -> np.ndarray:
    """Row medians of the recovery windows, NaN padding ignored (as ``np.nanmedian``); rows
    without NaN take the fast path (``np.nanmedian`` on small rows goes through masked
    arrays, about 30x slower). Rows of three without NaN: the middle value by min / max, plus
    0.0 as ``np.median`` adds it (its mean starts from 0.0), so a zero comes out as +0.0."""
    bad = np.isnan(win).any(axis=1)
    if not bad.any():
        if win.shape[1] == 3:
            a, b, c = win[:, 0], win[:, 1], win[:, 2]
            return 0.0 + np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))
        return np.median(win, axis=1)
    out = np.empty(len(win))
    out[~bad] = np.median(win[~bad], axis=1)
    out[bad] = np.nanmedian(win[bad], axis=1)
    return out
