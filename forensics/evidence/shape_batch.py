"""The shapes of many spikes of one series at once: :func:`~forensics.evidence.spike_shape.measure`
for every spike, in whole-array operations instead of a hundred small ones per spike.

A million-step grad norm holds thousands of single-step outliers; measured one by one, the
Python and numpy call overhead of each spike's recovery search, width, excess area and plateau
cost as much as its trend fit. Here each of those is one operation on a (spikes x points)
array: the same element-wise operations, in the same order, on the same elements, so every
number is the one :func:`measure` computes (medians through :mod:`order_stats`' row functions,
sums with numpy's own row reduction, which sums each row as it sums a 1-D array). The trend
fits' Theil-Sen slopes are formed and selected window after window by
:func:`~forensics.evidence.order_stats.slope_stats_rows`: each window's slopes and order
statistics are those of the one-window functions.

The batch covers the common case: a spike back in its band, and back under its alarm line,
within :data:`_AHEAD` points after the peak, away from the end of the log, with finite numbers
throughout. Any other spike is measured by :func:`measure` itself (with the trend already
fitted). ``tests/test_spike_fast_path.py`` compares both with the reference computation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from forensics.evidence import order_stats
from forensics.evidence.order_stats import median_of_increasing_rows, median_rows
from forensics.evidence.robust import _FAST_MIN_POINTS, MAD_TO_SIGMA, _interval_ranks
from forensics.evidence.spike_shape import (
    SETTLED,
    ShapeParams,
    SpikeClass,
    Trend,
    fit_trend,
    measure,
    too_slow,
)

_AHEAD = 16  # points after the peak searched for the recovery and the width's end at once


@dataclass(frozen=True)
class SpikeInput:
    """One spike's arguments to :func:`measure` (besides the series-wide ones)."""

    onset: int
    peak: int
    sigma: float
    baseline_at_peak: float
    alarm: float


def measure_many(
    steps: np.ndarray,
    values: np.ndarray,
    spikes: list[SpikeInput],
    *,
    log_scale: bool,
    p: ShapeParams,
    barriers: list[int] | None,
    interval: float,
    xs: np.ndarray,
    ys: np.ndarray,
) -> list[dict[str, Any]]:
    """``[measure(steps, values, onset=s.onset, ..., xs=xs, ys=ys) for s in spikes]``: the
    same results (see the module text). ``xs`` / ``ys``: :func:`log_steps` of ``steps`` and
    the transformed ``values`` of the whole series; ``interval`` as :func:`measure` takes it."""
    n = len(values)
    k = len(spikes)
    if k == 0:
        return []
    trends = _trends(steps, ys, spikes, log_scale, p)
    out: list[dict[str, Any] | None] = [None] * k
    onset = np.array([s.onset for s in spikes], dtype=np.intp)
    peak = np.array([s.peak for s in spikes], dtype=np.intp)
    icpt = np.array([t.intercept for t in trends], dtype=float)
    slope = np.array([t.slope for t in trends], dtype=float)
    xc = np.array([t.x_center for t in trends], dtype=float)
    half = np.array([t.slope_halfwidth for t in trends], dtype=float)
    err = np.array([t.backtest_err for t in trends], dtype=float)
    h = np.array([t.backtest_h for t in trends], dtype=float)
    band = p.band_k * np.array([t.sigma for t in trends], dtype=float)
    widen = np.maximum(half, err / h)
    line = np.maximum(np.array([s.alarm for s in spikes], dtype=float), 0.0)
    m = max(1, p.smooth_points)

    # The batch: the search window and its recovery windows inside the log, finite numbers.
    ok = (peak + 1 + _AHEAD + m - 1 <= n) & np.isfinite(icpt) & np.isfinite(slope)
    ok &= np.isfinite(band) & np.isfinite(widen) & np.isfinite(xc)
    ok &= np.array([s.alarm == s.alarm for s in spikes])  # no NaN alarm line
    j = (peak + 1)[:, None] + np.arange(_AHEAD + m - 1)[None, :]
    j = np.where(ok[:, None], j, 0)
    x = xs[j]
    at = icpt[:, None] + slope[:, None] * x
    r = ys[j] - at
    ok &= np.isfinite(r).all(axis=1)
    # Recovery: the first point in the band whose window of m residuals has its median there.
    a = r[:, :_AHEAD]
    xa, ta = x[:, :_AHEAD], at[:, :_AHEAD]
    upper = ta + band[:, None] + widen[:, None] * np.abs(xa - xc[:, None]) - ta
    if m == 3:
        b, c = r[:, 1 : _AHEAD + 1], r[:, 2 : _AHEAD + 2]
        med = 0.0 + np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))
    else:
        win = np.lib.stride_tricks.sliding_window_view(r, m, axis=1)[:, :_AHEAD]
        med = np.median(win, axis=2)
    inside = (med <= upper) & (a <= upper)  # the window's median and the point itself
    ok &= inside.any(axis=1)
    rec = np.where(ok, peak + 1 + np.argmax(inside, axis=1), 0)  # (an index, off the batch)
    # Width's end: the first point after the peak back under the alarm line.
    under = ~(a > line[:, None])
    ok &= under.any(axis=1)
    last = peak + np.argmax(under, axis=1)  # the point before it

    excess = _excess(steps, values, xs, onset, rec, icpt, slope, log_scale, interval, ok)
    plateau = _plateau(
        steps, values, xs, ys, peak, rec, trends, icpt, slope, log_scale, p, barriers, ok
    )

    for i in range(k):
        s, t = spikes[i], trends[i]
        if not ok[i]:
            out[i] = measure(
                steps,
                values,
                onset=s.onset,
                peak=s.peak,
                log_scale=log_scale,
                sigma=s.sigma,
                baseline_at_peak=s.baseline_at_peak,
                alarm=s.alarm,
                p=p,
                barriers=barriers,
                interval=interval,
                xs=xs,
                ys=ys,
                trend=t,
            )
            continue
        first = _width_start(xs, ys, s.onset, s.peak, t, float(line[i]))
        width_steps = int(steps[int(last[i])] - steps[first] + interval)
        ri = int(rec[i])
        recovery_steps = int(steps[ri] - steps[s.peak])
        shift, rel, clearly = plateau.get(i, (None, None, 0))
        log_left = int(steps[-1] - steps[s.peak])
        if too_slow(int(steps[ri - 1] - steps[s.peak]), p.recover_steps) or clearly > 0:
            cls = SpikeClass.PATHOLOGICAL
        elif clearly < 0:
            cls = SpikeClass.BENEFICIAL
        else:
            cls = SpikeClass.PHYSIOLOGICAL
        area, area_rel = excess[i]
        out[i] = {
            "width_steps": width_steps,
            "recovered": True,
            "recovery_steps": recovery_steps,
            "recovered_step": int(steps[ri]),
            "last_raised_step": int(steps[ri - 1]),
            "plateau_shift": shift,
            "plateau_shift_rel": rel,
            "settled": None if rel is None else SETTLED[clearly],
            "excess_area": area,
            "excess_area_rel": area_rel,
            "trend": t.kind,
            "steps_logged_after_peak": log_left,
            "classification": cls,
        }
    return [o for o in out if o is not None]


def _trend(
    steps: np.ndarray, ys: np.ndarray, s: SpikeInput, log_scale: bool, p: ShapeParams
) -> Trend:
    """The spike's trend as :func:`measure` fits it (on the stretch before its onset)."""
    lo0 = max(0, s.onset - max(p.trend_max_points, p.min_trend_points))
    base_y = np.log(s.baseline_at_peak) if log_scale else s.baseline_at_peak
    return fit_trend(
        steps[lo0 : s.onset + 1], ys[lo0 : s.onset + 1], s.onset - lo0, base_y, s.sigma, p
    )


def _trends(
    steps: np.ndarray, ys: np.ndarray, spikes: list[SpikeInput], log_scale: bool, p: ShapeParams
) -> list[Trend]:
    """Every spike's :func:`_trend`. Windows of one length that the fast Theil-Sen path takes
    whole and half (:func:`~forensics.evidence.robust.theil_sen_with_half`) are fitted
    together: the slopes and their order statistics row by row, everything else on the
    (spikes x points) arrays, as :func:`fit_trend` computes it."""
    out: list[Trend | None] = [None] * len(spikes)
    if len(steps) > 1 and bool((steps[1:] >= steps[:-1]).all()):
        # The window fit_trend takes: the points up to trend_max_points before the onset
        # within trend_window steps of it (a suffix of the sorted steps).
        onset = np.array([s.onset for s in spikes], dtype=np.intp)
        lo = np.maximum(onset - p.trend_max_points, 0)
        first = np.searchsorted(steps, steps[onset] - p.trend_window, side="left")
        start = np.maximum(lo, first)
        lengths = onset - start
        big = (lengths >= 2 * _FAST_MIN_POINTS) & (lengths >= p.min_trend_points)
        jobs = [
            (length, rows[c : c + _CHUNK_ROWS])
            for length, rows in _groups(lengths, big).items()
            for c in range(0, len(rows), _CHUNK_ROWS)
        ]
        # Several chunks: each thread fits its own, the slopes' kernel in the thread's core
        # alone (one chunk: the kernel splits its rows between the cores).
        threads = 1 if len(jobs) > 1 else None

        def fit(a: int, b: int) -> None:
            for length, chunk in jobs[a:b]:
                fits = _fit_rows(steps, ys, start[chunk], length, spikes, chunk, threads)
                for i, t in zip(chunk, fits, strict=True):
                    out[int(i)] = t

        order_stats.in_parts(len(jobs), 1, fit)
    return [
        t if t is not None else _trend(steps, ys, s, log_scale, p)
        for t, s in zip(out, spikes, strict=True)
    ]


def _fit_rows(
    steps: np.ndarray,
    ys: np.ndarray,
    start: np.ndarray,
    length: int,
    spikes: list[SpikeInput],
    rows: np.ndarray,
    threads: int | None = None,
) -> list[Trend | None]:
    """fit_trend's "trend" branch for windows ``[start, start + length)`` of ``length`` >= 80
    points; None for a row the fast path does not take (or with a non-finite number)."""
    j = start[:, None] + np.arange(length)[None, :]
    x = np.log1p(np.maximum(steps[j].astype(float), 0.0))  # log_steps, element by element
    y = ys[j]
    k = len(rows)
    fast = order_stats.plain_for_slopes_rows(x, y)
    h = length // 2
    nt, nth = length * (length - 1) // 2, h * (h - 1) // 2
    lo, mid, hi = _interval_ranks(length, nt, 1.96)
    ks = sorted({lo, max(mid - 1, 0), mid, hi})
    mid_h = nth // 2
    ks_h = sorted({max(mid_h - 1, 0), mid_h})
    got = np.zeros((k, len(ks)))
    got_h = np.zeros((k, len(ks_h)))
    fast_rows = np.flatnonzero(fast)
    got[fast_rows], got_h[fast_rows] = order_stats.slope_stats_rows(
        x[fast_rows], y[fast_rows], ks, ks_h, threads
    )
    col = {kk: i for i, kk in enumerate(ks)}
    col_h = {kk: i for i, kk in enumerate(ks_h)}
    zero = np.float64(0.0)
    slope = (
        got[:, col[mid]] + 0.0 if nt % 2 else (zero + got[:, col[mid - 1]] + got[:, col[mid]]) / 2.0
    )
    slope_h = (
        got_h[:, col_h[mid_h]] + 0.0
        if nth % 2
        else (zero + got_h[:, col_h[mid_h - 1]] + got_h[:, col_h[mid_h]]) / 2.0
    )
    low, high = got[:, col[lo]] + 0.0, got[:, col[hi]] + 0.0
    with np.errstate(all="ignore"):
        icpt = median_rows(y) - slope * median_of_increasing_rows(x)
        icpt_h = median_rows(y[:, :h]) - slope_h * median_of_increasing_rows(x[:, :h])
        resid = y - (icpt[:, None] + slope[:, None] * x)
        back = y[:, h:] - (icpt_h[:, None] + slope_h[:, None] * x[:, h:])
    fine = fast & np.isfinite(resid).all(axis=1) & np.isfinite(back).all(axis=1)
    resid[~fine] = 0.0
    back[~fine] = 0.0
    mr = median_rows(resid)
    sigma = MAD_TO_SIGMA * median_rows(np.abs(resid - mr[:, None]))
    miss = np.abs(median_rows(back))
    dist = median_of_increasing_rows(x[:, h:]) - median_of_increasing_rows(x[:, :h])
    dist = np.where(1e-9 > dist, 1e-9, dist)
    xc = median_of_increasing_rows(x)
    half = (high - low) / 2.0
    fb = np.array([spikes[int(i)].sigma for i in rows], dtype=float)
    sig = np.where(fb > sigma, fb, sigma)  # max(sigma, fallback) as Python's max picks it
    return [
        Trend(
            float(icpt[r]),
            float(slope[r]),
            float(half[r]),
            float(xc[r]),
            float(sig[r]),
            "trend",
            float(miss[r]),
            float(dist[r]),
        )
        if fine[r]
        else None
        for r in range(k)
    ]


_CHUNK_ROWS = 128  # windows fitted together (a few MB a thread, two threads at once)


def _width_start(
    xs: np.ndarray, ys: np.ndarray, onset: int, peak: int, t: Trend, line: float
) -> int:
    """The first point of the run above the alarm line that ends at the peak (as measure)."""
    if peak <= onset:
        return onset
    r = ys[onset:peak] - (t.intercept + t.slope * xs[onset:peak])
    left = np.flatnonzero(~(r > line))
    return onset + int(left[-1]) + 1 if len(left) else onset


def _excess(
    steps: np.ndarray,
    values: np.ndarray,
    xs: np.ndarray,
    onset: np.ndarray,
    rec: np.ndarray,
    icpt: np.ndarray,
    slope: np.ndarray,
    log_scale: bool,
    interval: float,
    ok: np.ndarray,
) -> dict[int, tuple[float, float]]:
    """Excess area (and relative) from the onset to the recovery, spikes grouped by length."""
    out: dict[int, tuple[float, float]] = {}
    for length, rows in _chunked(_groups(rec - onset, ok)):
        j = onset[rows][:, None] + np.arange(length)[None, :]
        at = icpt[rows][:, None] + slope[rows][:, None] * xs[j]
        tv = np.exp(at) if log_scale else at
        seg = steps[j].astype(float)  # as np.append(seg_steps, float) makes them
        ext = np.concatenate([seg, seg[:, -1:] + interval], axis=1)
        dt = np.diff(ext, axis=1)
        ex = values[j] - tv
        area = np.sum(ex * dt, axis=1)
        rel = np.sum(ex / np.abs(tv) * dt, axis=1)
        for q, i in enumerate(rows):
            out[int(i)] = (float(area[q]), float(rel[q]))
    return out


def _plateau(
    steps: np.ndarray,
    values: np.ndarray,
    xs: np.ndarray,
    ys: np.ndarray,
    peak: np.ndarray,
    rec: np.ndarray,
    trends: list[Trend],
    icpt: np.ndarray,
    slope: np.ndarray,
    log_scale: bool,
    p: ShapeParams,
    barriers: list[int] | None,
    ok: np.ndarray,
) -> dict[int, tuple[float | None, float | None, int]]:
    """Plateau shift, relative shift and "clearly" (1 above, -1 below, 0) of the recovered
    spikes with a fitted trend; a spike whose plateau holds a NaN leaves the batch (ok)."""
    out: dict[int, tuple[float | None, float | None, int]] = {}
    is_trend = np.array([t.kind == "trend" for t in trends])
    settle = steps[rec]
    stop = settle + p.plateau_window
    bs = np.array(sorted(int(b) for b in (barriers or [])), dtype=np.int64)
    if len(bs):
        nxt = np.searchsorted(bs, steps[peak], side="right")
        has = nxt < len(bs)
        cap = bs[np.minimum(nxt, len(bs) - 1)] - 1
        stop = np.where(has, np.minimum(stop, cap), stop)
    w0 = np.searchsorted(steps, settle, side="left")
    w1 = np.searchsorted(steps, stop, side="right")
    half = np.array([t.slope_halfwidth for t in trends], dtype=float)
    err = np.array([t.backtest_err for t in trends], dtype=float)
    hh = np.array([t.backtest_h for t in trends], dtype=float)
    xc = np.array([t.x_center for t in trends], dtype=float)
    lengths = np.where(is_trend & ok, w1 - w0, 0)
    chunks = list(_chunked(_groups(lengths, lengths >= 3)))

    def measure(first: int, last: int) -> None:
        for length, rows in chunks[first:last]:
            j = w0[rows][:, None] + np.arange(length)[None, :]
            t = icpt[rows][:, None] + slope[rows][:, None] * xs[j]
            dy = ys[j] - t
            tv = np.exp(t) if log_scale else t
            dv = values[j] - tv
            nan = np.isnan(dy).any(axis=1) | np.isnan(dv).any(axis=1)
            ok[rows[nan]] = False
            shift_y = median_rows(np.where(nan[:, None], 0.0, dy))
            shift = median_rows(np.where(nan[:, None], 0.0, dv))
            st = steps[j]
            mid = length // 2
            med_step = (
                st[:, mid].astype(float)
                if length % 2
                else (st[:, mid - 1].astype(float) + st[:, mid].astype(float)) / 2.0
            )
            dx = np.abs(np.log1p(np.maximum(med_step, 0.0)) - xc[rows])
            unc = np.maximum(half[rows], err[rows] / hh[rows]) * dx
            if log_scale:
                rel = np.expm1(shift_y)
                unc_rel = np.expm1(unc)
            else:
                scale = median_rows(np.where(nan[:, None], 0.0, np.abs(tv)))
                scale = np.where(1e-12 > scale, 1e-12, scale)
                rel = shift / scale
                unc_rel = unc / scale
            for q, i in enumerate(rows):
                if nan[q]:
                    continue
                lim = p.plateau_tol + float(unc_rel[q])
                r = float(rel[q])
                clearly = 1 if r > lim else (-1 if r < -lim else 0)
                out[int(i)] = (float(shift[q]), r, clearly)

    # (the chunks split between the cores: each writes its own rows of out and ok)
    order_stats.in_parts(len(chunks), 1, measure)
    return out


def _chunked(groups: dict[int, np.ndarray]) -> Iterator[tuple[int, np.ndarray]]:
    """The groups' rows, a few at a time: at most :data:`_CHUNK_CELLS` (spikes x points)
    values per array (a million-step log's plateaus held 200 MiB at once otherwise). Each
    row's numbers are computed on their own (element-wise, medians and sums row by row), so
    a chunk's are those of the whole group."""
    for length, rows in groups.items():
        step = max(1, _CHUNK_CELLS // max(length, 1))
        for c in range(0, len(rows), step):
            yield length, rows[c : c + step]


_CHUNK_CELLS = 1 << 16  # 512 KiB per float64 (spikes x points) array, two threads at once


def _groups(lengths: np.ndarray, keep: np.ndarray) -> dict[int, np.ndarray]:
    """Indices of the kept entries, grouped by length."""
    g: dict[int, list[int]] = defaultdict(list)
    for i in np.flatnonzero(keep):
        g[int(lengths[i])].append(int(i))
    return {length: np.array(rows, dtype=np.intp) for length, rows in g.items()}


__all__ = ["SpikeInput", "measure_many"]
