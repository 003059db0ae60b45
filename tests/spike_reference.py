"""The spike shapes' straightforward computation, kept as the reference of the fast path.

A copy of forensics.evidence.robust.theil_sen and forensics.evidence.spike_shape.fit_trend /
measure as they were before the fast path (commit ec0b382): every pairwise slope gathered by
index and partitioned, np.median for every median, every stretch transformed on its own.
tests/test_spike_fast_path.py checks that the fast path gives the same numbers, bit for bit.
Not to be edited to follow the fast path: it is the definition it must match.
(One change of definition since: a recovery's first point must itself be back in the band,
besides its window's median; made here and in the fast path alike.)
"""
# ruff: noqa
# mypy: ignore-errors

from __future__ import annotations

from typing import Any

import numpy as np

from forensics.evidence import robust
from forensics.evidence.robust import MAD_TO_SIGMA, inverse
from forensics.evidence.spike_shape import ShapeParams, SpikeClass, Trend, log_steps
from forensics.evidence.spikes import Spike, SpikeSearch, start_zone


def theil_sen(x: np.ndarray, y: np.ndarray, z: float = 1.96) -> tuple[float, float, float, float]:
    """Theil-Sen line ``(slope, intercept, slope_low, slope_high)``, 95% interval by default.

    The median of pairwise slopes (Sen 1968), intercept median(y - slope x) as scipy's
    ``theilslopes``; the interval from the normal approximation of Kendall's S without tie
    corrections. Written with numpy so that spike detection does not pay for importing
    scipy.stats (over a second) on every run.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    i, j = _pairs(len(x))
    dx = x[j] - x[i]
    ok = dx != 0
    slopes = (y[j] - y[i])[ok] / dx[ok]
    if len(slopes) == 0:
        return 0.0, float(np.median(y)), 0.0, 0.0
    n, nt = len(x), len(slopes)
    sigma = np.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    hi = min(int(round((nt + z * sigma) / 2.0)), nt - 1)
    lo = max(int(round((nt - z * sigma) / 2.0)) - 1, 0)
    # The median and the interval are order statistics: one partition, not a sort (the same
    # values, in linear time). The median as np.median forms it: the middle value, or the
    # mean of the two middle values; NaN slopes go through np.median itself.
    mid = nt // 2
    if np.isnan(slopes).any():
        slope = float(np.median(slopes))
        part = np.partition(slopes, [lo, hi])
    else:
        part = np.partition(slopes, sorted({lo, max(mid - 1, 0), mid, hi}))
        slope = float(part[mid] if nt % 2 else np.mean(part[mid - 1 : mid + 1]))
    intercept = float(np.median(y) - slope * np.median(x))
    return slope, intercept, float(part[lo]), float(part[hi])


def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs i < j of n points (Theil-Sen is fitted on windows of the same length)."""
    i, j = np.triu_indices(n, k=1)
    i.flags.writeable = j.flags.writeable = False
    return i, j


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
            slope, intercept, low, high = theil_sen(xs, ys)
            resid = ys - (intercept + slope * xs)
            sigma = MAD_TO_SIGMA * float(np.median(np.abs(resid - np.median(resid))))
            err, h = _backtest(xs, ys)
            return Trend(
                float(intercept),
                float(slope),
                float(high - low) / 2.0,
                float(np.median(xs)),
                max(sigma, fallback_sigma),
                "trend",
                err,
                h,
            )
    level = float(np.median(y[sel])) if len(sel) else fallback_level
    return Trend(level, 0.0, 0.0, 0.0, fallback_sigma, "level")


def _backtest(xs: np.ndarray, ys: np.ndarray) -> tuple[float, float]:
    """Fit the first half, predict the second: the miss (median residual) and the distance.

    At the fast-falling start of training a line fitted to a few hundred steps does not
    extrapolate: this measures by how much, from the data itself.
    """
    half = len(xs) // 2
    if half < 3 or np.ptp(xs[:half]) <= 0:
        return 0.0, 1.0
    slope, intercept, _, _ = theil_sen(xs[:half], ys[:half])
    miss = float(abs(np.median(ys[half:] - (intercept + slope * xs[half:]))))
    h = float(np.median(xs[half:]) - np.median(xs[:half]))
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
) -> dict[str, float | int | str | bool | None]:
    """Shape measures of one spike. ``steps``/``values`` are the finite points of the series,
    sorted by step.

    ``alarm`` is the detection threshold above the trend, in transformed units (log units for
    positive series): the width counts the steps spent above it. ``interval`` is the median
    step difference of ``steps`` (computed when not given; callers measuring many spikes of one
    series pass it once).

    The cost grows with the spike's own extent (trend window, width, recovery, plateau), not
    with the series' length: every array below is computed on the stretch it needs, growing
    in doubling chunks where the end is not known in advance. The numbers are those of the
    whole-series computation (the same element-wise operations on fewer elements).
    """
    n = len(values)
    # The trend needs at most trend_max_points (or min_trend_points) points before the onset.
    lo0 = max(0, onset - max(p.trend_max_points, p.min_trend_points))
    base_y = np.log(baseline_at_peak) if log_scale else baseline_at_peak
    # Through the watcher's memo when one is active (forensics.evidence.reuse): same inputs,
    # same fit.
    trend = fit_trend(
        steps[lo0 : onset + 1], _transform(values[lo0 : onset + 1], log_scale), onset - lo0,
        base_y, sigma, p,
    )  # fmt: skip
    if interval is None:
        interval = float(np.median(np.diff(steps))) if n > 1 else 1.0

    def resid(a: int, b: int) -> np.ndarray:
        return _transform(values[a:b], log_scale) - trend.at(steps[a:b])

    def upper(a: int, b: int) -> np.ndarray:
        return trend.upper(steps[a:b], p.band_k) - trend.at(steps[a:b])

    # Recovery: the first point after the peak that is back inside the band itself and where
    # the median of it and the next few points is too (one lucky low point does not make a
    # recovery, and the step named as the recovery is one a reader finds back on the chart).
    rec_idx: int | None = None
    m = max(1, p.smooth_points)
    a, size = peak + 1, _CHUNK
    while a < n and rec_idx is None:
        b = min(n, a + size)
        hi = min(n, b + m - 1)
        win = np.lib.stride_tricks.sliding_window_view(
            np.concatenate([resid(a, hi), np.full(b + m - 1 - hi, np.nan)]), m
        )
        up = upper(a, b)
        inside = np.flatnonzero((_window_median(win) <= up) & (win[:, 0] <= up))
        if len(inside):
            rec_idx = a + int(inside[0])
        a, size = b, size * 2
    recovered = rec_idx is not None
    recovery_steps = int(steps[rec_idx] - steps[peak]) if recovered else None

    # Width: the contiguous run of points above the alarm line that holds the peak.
    line = max(alarm, 0.0)
    left = np.flatnonzero(~(resid(onset, peak) > line))
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

    end = rec_idx if recovered else n
    seg_steps = steps[onset:end]
    trend_v = inverse(trend.at(seg_steps), log_scale)
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
            r = resid(w0, w1)
            shift_y = float(np.median(r))
            tv = inverse(trend.at(steps[w0:w1]), log_scale)
            plateau_shift = float(np.median(values[w0:w1] - tv))
            plateau_rel = (
                float(np.expm1(shift_y))
                if log_scale
                else plateau_shift / max(float(np.median(np.abs(tv))), 1e-12)
            )
            # "Clearly" shifted: beyond the tolerance plus what the slope's uncertainty allows
            # at that distance from the fit.
            unc = float(trend.uncertainty(np.array([np.median(steps[w0:w1])]))[0])
            unc_rel = (
                float(np.expm1(unc))
                if log_scale
                else unc / max(float(np.median(np.abs(tv))), 1e-12)
            )
            if plateau_rel > p.plateau_tol + unc_rel:
                clearly = 1
            elif plateau_rel < -(p.plateau_tol + unc_rel):
                clearly = -1

    log_left = int(steps[-1] - steps[peak])
    if not recovered:
        cls = SpikeClass.PATHOLOGICAL if log_left >= p.recover_steps else SpikeClass.UNRESOLVED
    elif (
        # too slow where a logged point still raised lies recover_steps or more past the peak
        rec_idx is not None and steps[rec_idx - 1] - steps[peak] >= p.recover_steps
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
        "last_raised_step": int(steps[rec_idx - 1]) if rec_idx is not None else None,
        "plateau_shift": plateau_shift,
        "plateau_shift_rel": plateau_rel,
        "settled": None
        if plateau_rel is None
        else {1: "higher", -1: "lower", 0: "within"}[clearly],
        "excess_area": excess_area,
        "excess_area_rel": excess_area_rel,
        "trend": trend.kind,
        "steps_logged_after_peak": log_left,
        "classification": cls,
    }


_CHUNK = 64  # first chunk of a forward search (recovery, width); doubled each time


def _transform(values: np.ndarray, log_scale: bool) -> np.ndarray:
    return np.log(values) if log_scale else values.astype(float)


def _window_median(win: np.ndarray) -> np.ndarray:
    """Row medians of the recovery windows, NaN padding ignored (as ``np.nanmedian``); rows
    without NaN take the fast path (``np.nanmedian`` on small rows goes through masked
    arrays, about 30x slower)."""
    bad = np.isnan(win).any(axis=1)
    if not bad.any():
        return np.median(win, axis=1)
    out = np.empty(len(win))
    out[~bad] = np.median(win[~bad], axis=1)
    out[bad] = np.nanmedian(win[bad], axis=1)
    return out


def find_spikes(ev, metric: str) -> list[Spike]:
    """Detect the spikes of one series and measure their shape, with the configured spike
    parameters (no co-occurrence, no severity: that is the spike detector's).

    Call it through :meth:`Evidence.spikes`, which computes each metric's spikes once.
    """
    p = SpikeSearch.of(ev.params.spikes, metric)
    series = ev.series(metric)
    sc = robust.score(
        series.steps,
        series.values,
        window=p.window,
        min_side=p.min_side,
        sigma_floor=p.sigma_floor,
        confirm_until=start_zone(series.steps, ev.warmup_end, p.window),
    )
    if sc.height < 3:
        return []
    steps = sc.get_column("step").to_numpy()
    values = sc.get_column("value").to_numpy()
    log_scale = robust.use_log(values)
    events = robust.find_events(
        sc,
        z_min=p.z_threshold,
        min_ratio=p.min_ratio,
        log_scale=log_scale,
        gross_ratio=p.gross_ratio,
        z_gross=p.z_gross,
    )
    interval = robust.median_interval(steps)
    # The shape's own interval (np.median of the raw differences), once for all the events.
    shape_interval = float(np.median(np.diff(steps))) if len(steps) > 1 else 1.0
    barriers = ev.level_barriers
    out = []
    for e in events:
        row = sc.row(e.peak, named=True)
        # The alarm line above the local baseline, in the score's units (log units for
        # positive series): the z threshold's noise band, at least the height ratio.
        alarm = max(float(np.log(p.min_ratio)) if log_scale else 0.0, p.z_threshold * row["sigma"])
        if log_scale and p.gross_ratio is not None:  # or the gross rule's line, if lower
            alarm = min(alarm, max(float(np.log(p.gross_ratio)), p.z_gross * row["sigma"]))
        m = measure(
            steps,
            values,
            onset=e.onset,
            peak=e.peak,
            log_scale=log_scale,
            sigma=row["sigma"],
            baseline_at_peak=row["baseline"],
            alarm=alarm,
            p=p.shape,
            barriers=barriers,
            interval=shape_interval,
        )
        rec = m["recovered_step"]
        end_step = int(rec) if isinstance(rec, (int, float)) else int(steps[-1])
        measures: dict[str, Any] = {
            "peak_value": row["value"],
            "baseline": row["baseline"],
            "height": row["value"] - row["baseline"],
            "height_ratio": row["value"] / row["baseline"] if log_scale else None,
            "z": row["z"],
            "two_sided": row["two_sided"],
            "points": e.n_flagged,
            "log_interval": interval,
            **m,
        }
        alarm_at = row["baseline"] * float(np.exp(alarm)) if log_scale else row["baseline"] + alarm
        out.append(
            Spike(
                metric,
                int(steps[e.onset]),
                int(steps[e.peak]),
                end_step,
                measures,
                float(alarm_at),
            )
        )
    return out
