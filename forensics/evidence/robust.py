"""Robust per-step spike score: the *score* half of spike detection (the decision is separate).

``score(series)`` returns one row per logged point with the local baseline, the local noise
scale and a robust z-score, so the report can plot the score and the detectors only apply
thresholds to it (ruptures keeps costs apart from search methods in the same way).

Why a rolling median / MAD of log(series) and not an EMA z-score (ZClip-style)?
  * The tests (tests/test_spikes.py) show the EMA needs a warm-up of tens of points before its
    variance means anything, so it cannot judge an 8-line excerpt or a spike at the second
    logged point (the bigscience n16 log); the median needs three points.
  * An EMA mean lags a fast-falling loss and its variance is inflated by the fall itself; the
    median baseline sits *above* a falling curve, so the noisy start of training cannot look
    like a spike, and the noise scale comes from first differences, which the trend barely
    touches.
  * Logs of positive quantities (loss, grad norm) spike multiplicatively: in log space the
    noise is roughly constant over the run, so one threshold fits early and late training.

Baseline: the median of the previous ``window`` points (trailing, so a level shift is seen at
its onset). Where fewer than ``min_side`` points precede, the point must also stand above the
median of the following points (two-sided), which lets a spike at the second line of a log
be found without calling the first, falling points of training spikes. The first point of a
log is never scored: nothing says whether it is a spike or the start. The same two-sided rule
holds through the start of training (the LR warm-up, see ``evidence.spikes.start_zone``) when the
step numbers show the log begins there: a grad norm that climbs steeply while the LR warms up
is above its past but not above its future, and a climb is not a spike.

Subtracting the rolling median removes the trend for detection (within ``window`` points the
trend moves the level less than the noise, except at the very start where the median lags
*above* a falling loss). The shape measures (spike_shape) use an extrapolated trend instead.

Noise: ``MAD_TO_SIGMA`` (1.4826) x the rolling MAD of detrended first differences / sqrt(2),
floored by the printing resolution of the log (a value printed with two decimals cannot be
known better).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial
from typing import NamedTuple

import numpy as np
import polars as pl

from forensics.cores import cores
from forensics.evidence import order_stats, reuse
from forensics.evidence.reuse import distinct_reusing, local_reusing

MAD_TO_SIGMA = 1.4826  # MAD -> standard deviation for normal noise (the one copy of it)

SCORE_SCHEMA = {
    "step": pl.Int64,
    "value": pl.Float64,
    "baseline": pl.Float64,  # local baseline, in the series' units
    "sigma": pl.Float64,  # robust noise scale (log units when log_scale)
    "z": pl.Float64,  # robust z-score of the point against its baseline
    "ratio": pl.Float64,  # value / baseline (value - baseline for non-positive series)
    "two_sided": pl.Boolean,  # True where the baseline also used the following points
}


def empty_score() -> pl.DataFrame:
    return pl.DataFrame(schema=SCORE_SCHEMA)


def median_interval(steps: np.ndarray) -> float:
    """The typical logging interval in steps (1 for every-step logs): the median of the
    positive step differences. Sorted integer steps differ by small counts: the median is
    read from one count of each difference (bit for bit what np.median gives) instead of a
    float copy and a sort of a million differences."""
    if len(steps) < 2:
        return 1.0
    counts = counted_differences(steps)
    if counts is not None:
        m = order_stats.median_of_counts(counts[1:], offset=1)
        return 1.0 if m is None else m
    d = np.diff(np.asarray(steps, dtype=float))
    d = d[d > 0]
    return float(np.median(d)) if len(d) else 1.0


def counted_differences(steps: np.ndarray) -> np.ndarray | None:
    """``np.bincount(np.diff(steps))`` of integer steps, a block at a time (a long series'
    whole differences are 8 bytes a point of new pages), for
    :func:`order_stats.median_of_counts` instead of a sort; None when the differences cannot
    be counted: fewer than two steps, steps not integers, going back, beyond 2^53 (their float
    values differ by other amounts) or further apart than the count's length allows."""
    n = len(steps) - 1
    if n < 1 or steps.dtype.kind not in "iu":
        return None
    if not (abs(int(steps[0])) < 2**53 and abs(int(steps[-1])) < 2**53):
        return None
    limit = max(n, 1 << 16)
    counts = np.zeros(1, dtype=np.intp)
    for a in range(0, n, _DIFF_BLOCK):
        d = np.diff(steps[a : a + _DIFF_BLOCK + 1])
        if int(d.min()) < 0 or int(d.max()) > limit:
            return None
        got = np.bincount(d)
        if len(got) > len(counts):
            got[: len(counts)] += counts
            counts = got
        else:
            counts[: len(got)] += got
    return counts


_DIFF_BLOCK = 1 << 16  # step differences counted at a time


def resolution(values: np.ndarray) -> float:
    """Smallest step between distinct printed values: the log's resolution (0 if unknown)."""
    finite = values if bool(np.isfinite(values).all()) else values[np.isfinite(values)]
    if reuse._ACTIVE.get() is None:
        # The sorted values with their repeats: the positive differences of neighbours are
        # those of the distinct values (the same subtractions; a repeat, or 0.0 beside -0.0,
        # differs by 0). numpy's sort is vectorised, and np.unique would sort the same way
        # and then copy.
        d = positive_gaps(finite)
        if len(d) < 2:  # fewer than three distinct values
            return 0.0
        # A low percentile, not the minimum: one pair of values can be closer by accident of
        # float formatting; the resolution is what most neighbouring values are apart at least.
        return float(np.percentile(d, 5))
    # A watcher's later poll merges in the distinct values of the appended points only
    # (forensics.evidence.reuse); a zero's sign there cannot change a difference.
    u = distinct_reusing(finite)
    if len(u) < 3:
        return 0.0
    d = np.diff(u)
    d = d[d > 0]
    return float(np.percentile(d, 5)) if len(d) else 0.0


def positive_gaps(values: np.ndarray) -> np.ndarray:
    """The positive differences between neighbours of ``values`` sorted (no NaN)."""
    d = np.diff(sorted_values(values))  # (the sorted copy given back before the selection)
    return d[d > 0]


def sorted_values(values: np.ndarray) -> np.ndarray:
    """``np.sort(values)`` (no NaN; a zero's sign may come out in either order).

    A long series is split at its median (np.partition: every value of the lower half is at
    most every value of the upper half) and each half sorted in place in its own thread
    (numpy's sort holds no lock): the halves end to end are the whole sorted, with the
    temporaries of one sort. A million values: 54 ms sorted whole, about 37 ms so on two
    cores."""
    n = len(values)
    if n < _SPLIT_SORT_MIN or cores() < 2:
        return np.sort(values)
    h = n // 2
    v = np.partition(values, h)  # (a copy, as np.sort's)
    order_stats.in_parts(n, h, lambda a, b: v[a:b].sort(), threads=2)  # [0, h), [h, n)
    return v


_SPLIT_SORT_MIN = 1 << 17  # values: a shorter sort is not worth a thread's start


def use_log(values: np.ndarray) -> bool:
    """Are the finite values all positive (and one at least)? (No copy where all are finite.)"""
    ok = np.isfinite(values)
    if ok.all():
        return bool(len(values)) and bool((values > 0).all())
    v = values[ok]
    return bool(len(v)) and bool((v > 0).all())


def transform(values: np.ndarray, log_scale: bool) -> np.ndarray:
    return np.log(values) if log_scale else values.astype(float)


def inverse(y: np.ndarray | float, log_scale: bool) -> np.ndarray | float:
    return np.exp(y) if log_scale else y


def noise_scale(y: np.ndarray, window: int) -> np.ndarray:
    """Per-point robust noise of ``y`` from detrended first differences (NaN if < 3 points)."""
    n = len(y)
    if n < 3:
        return np.full(n, np.nan)
    w = _noise_window(window)
    # A watcher's later poll computes only the tail (forensics.evidence.reuse): same numbers.
    return local_reusing("noise_scale", (w,), _noise_reach(window), y, partial(_noise_scale, w))


def _noise_window(window: int) -> int:
    """The width of the noise scale's rolling medians for a score ``window``."""
    return max(2 * window + 1, 5)


def _noise_reach(window: int) -> int:
    """How far from a point its noise scale reads (a median of medians of differences: two
    of their windows and a point), beyond any reach of the trailing and leading medians."""
    return 2 * _noise_window(window) + 2


def _noise_scale(w: int, y: np.ndarray) -> np.ndarray:
    from forensics.evidence.rolling import centered_median

    d = np.diff(y)
    # polars' centred rolling medians (min_samples=1), computed exactly in O(n log w)
    trend = centered_median(d, w)
    np.subtract(d, trend, out=trend)
    dev = centered_median(np.abs(trend, out=trend), w)
    sig = np.multiply(dev, MAD_TO_SIGMA, out=dev)  # MAD_TO_SIGMA * dev / sqrt(2), in place
    sig /= np.sqrt(2.0)
    # Point i touches differences i-1 and i: take the larger, so a spike is judged against
    # the noisier of its two sides (the ends have one side: the larger of it and itself).
    out = np.empty(len(sig) + 1)
    np.maximum(sig[:-1], sig[1:], out=out[1:-1])
    out[0], out[-1] = sig[0], sig[-1]
    return out


class Scored(NamedTuple):
    """:func:`score`'s columns as numpy arrays, NaN where the frame has null (baseline, z,
    ratio): what the spike search reads, without the frame's two passes turning NaN into null
    and back (at 10M points a tenth of the search's time went to polars filling 80 MB
    columns, most of it the kernel zeroing their fresh pages)."""

    step: np.ndarray
    value: np.ndarray
    baseline: np.ndarray
    sigma: np.ndarray
    z: np.ndarray
    ratio: np.ndarray
    two_sided: np.ndarray

    def frame(self) -> pl.DataFrame:
        """As :data:`SCORE_SCHEMA` (NaN as null)."""
        return pl.DataFrame(
            {
                "step": self.step.astype(np.int64, copy=False),
                "value": self.value,
                "baseline": self.baseline,
                "sigma": self.sigma,
                "z": self.z,
                "ratio": self.ratio,
                "two_sided": self.two_sided,
            },
            schema=SCORE_SCHEMA,
        ).with_columns(pl.col("baseline", "z", "ratio").fill_nan(None))


def score(
    steps: np.ndarray,
    values: np.ndarray,
    *,
    window: int = 20,
    min_side: int = 3,
    sigma_floor: float = 0.005,
    confirm_until: float | None = None,
) -> pl.DataFrame:
    """Robust spike score of one series (steps in order) -> :data:`SCORE_SCHEMA`.

    Non-finite values are left out (the NaN detector reports them); the score has one row per
    finite point. ``sigma_floor`` is the smallest noise scale, relative (log units) for
    positive series and as a fraction of the median magnitude otherwise. Points at steps up to
    ``confirm_until`` must stand above the following points too (two-sided): at the start of
    training a grad norm may climb steeply for a while, and a climb is not a spike.
    """
    got = score_arrays(
        steps,
        values,
        window=window,
        min_side=min_side,
        sigma_floor=sigma_floor,
        confirm_until=confirm_until,
    )
    return empty_score() if got is None else got.frame()


def score_arrays(
    steps: np.ndarray,
    values: np.ndarray,
    *,
    window: int = 20,
    min_side: int = 3,
    sigma_floor: float = 0.005,
    confirm_until: float | None = None,
) -> Scored | None:
    """:func:`score` as arrays (None for no finite point)."""
    steps = np.asarray(steps)
    values = np.asarray(values, dtype=float)
    ok = np.isfinite(values)
    if not ok.all():  # (finite already, as the evidence's series are: no copies of them)
        steps, values = steps[ok], values[ok]
    n = len(values)
    if n == 0:
        return None
    log_scale = use_log(values)
    w = max(int(window), 1)
    q = resolution(values)
    if log_scale:
        floor_const = None
    else:  # (the transform of a series not taken in logs is its values as floats)
        floor_const = max(sigma_floor * float(np.median(np.abs(values))), q, 1e-12)
    own = reuse._ACTIVE.get() is None

    def judged(
        a: int, b: int, yb: np.ndarray, tb: np.ndarray, lb: np.ndarray, sb: np.ndarray
    ) -> None:
        """Points [a, b) judged from their trailing and leading medians and noise scale
        (``yb``, ``tb``, ``lb``, ``sb``: those of the same points), into the results."""
        vb = values[a:b]
        if floor_const is None:
            floor: np.ndarray | float = np.maximum(sigma_floor, q / np.maximum(vb, 1e-300))
        else:
            floor = floor_const
        sg = np.where(np.isfinite(sb), np.maximum(sb, floor), floor)
        out_sig[a:b] = sg
        if confirm_until is not None:
            confirm = steps[a:b] <= confirm_until
        else:
            confirm = np.zeros(b - a, dtype=bool)
        if min_side <= min(a, w) and not confirm.any():
            # Every point of the block is judged on its past alone (the selections below
            # would all pick the trailing side): the same numbers, fewer passes.
            two_sided[a:b] = False
            with np.errstate(invalid="ignore"):
                z[a:b] = (yb - tb) / sg
            bb = inverse(tb, log_scale)
            base[a:b] = bb
            with np.errstate(invalid="ignore", divide="ignore"):
                ratio[a:b] = vb / bb if log_scale else vb - bb
            return
        idx = np.arange(a, b)
        n_before, n_after = np.minimum(idx, w), np.minimum(n - 1 - idx, w)
        with np.errstate(invalid="ignore"):
            z_trail = (yb - tb) / sg
            z_lead = (yb - lb) / sg
        trailing_ok = (n_before >= min_side) & ~(confirm & (n_after >= 1))
        two = ~trailing_ok & (n_before >= 1) & (n_after >= 1)
        two_sided[a:b] = two
        z[a:b] = np.where(trailing_ok, z_trail, np.where(two, np.minimum(z_trail, z_lead), np.nan))
        base_y = np.where(trailing_ok, tb, np.where(two, np.maximum(tb, lb), np.nan))
        bb = inverse(base_y, log_scale)
        base[a:b] = bb
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio[a:b] = vb / bb if log_scale else vb - bb

    two_sided = np.empty(n, dtype=bool)
    if own and n >= 2 * _SCORE_PIECE:
        from forensics.evidence.rolling import selectable

        if selectable(values):  # (and so its logs: every piece takes the whole's path)
            out_sig, z, base, ratio = (np.empty(n) for _ in range(4))
            # A point's medians and noise scale read the points within the noise scale's
            # reach of it (windows cut short only at the series' ends): a piece extended by
            # that reach on each side gives its numbers. The work arrays are then a piece's
            # size, in the processor's cache, not a dozen of the series' length (at 10M
            # points, 80 MB each, every page of them first zeroed by the kernel).
            reach = _noise_reach(w)
            edges = [i * _SCORE_PIECE for i in range(n // _SCORE_PIECE)] + [n]
            for lo, hi in zip(edges[:-1], edges[1:], strict=True):
                a, b = max(0, lo - reach), min(n, hi + reach)
                yp = transform(values[a:b], log_scale)
                tp = _trail_median(w, yp)
                lp = _lead_from_trail(w, yp, tp)
                sp = _noise_scale(_noise_window(w), yp)
                for c in range(lo, hi, _SCORE_BLOCK):
                    d = min(hi, c + _SCORE_BLOCK)
                    judged(
                        c,
                        d,
                        yp[c - a : d - a],
                        tp[c - a : d - a],
                        lp[c - a : d - a],
                        sp[c - a : d - a],
                    )
            return Scored(steps, values, base, out_sig, z, ratio, two_sided)
    y = transform(values, log_scale)
    # Medians of the w points before / after each point (a watcher's later poll computes only
    # the tail: forensics.evidence.reuse).
    trail = local_reusing("trail_median", (w,), w + 1, y, partial(_trail_median, w))
    lead = _lead_from_trail(w, y, trail)
    sig = noise_scale(y, w)
    # Element by element, a block of points at a time (the temporaries stay a few MB at a
    # million points; the same operations on the same elements as on the whole arrays).
    # trail, lead and sig may be a watcher's memo (reuse): read, never written. Otherwise
    # they and y are this call's own arrays, and each block's results are written over the
    # block just read (see _reused): four arrays of the series' length fewer at once.
    out_sig = _reused(sig, own, n)
    z = _reused(y, own, n)
    base = _reused(trail, own, n)
    ratio = _reused(lead, own, n)
    for a in range(0, n, _SCORE_BLOCK):
        b = min(n, a + _SCORE_BLOCK)
        judged(a, b, y[a:b], trail[a:b], lead[a:b], sig[a:b])
    del y, trail, lead, sig  # (given back before the results are returned)
    return Scored(steps, values, base, out_sig, z, ratio, two_sided)


_SCORE_BLOCK = 1 << 16  # points per block of score's element-wise part
_SCORE_PIECE = 1 << 17  # points per piece of a long series' score (see score_arrays)


def _reused(a: np.ndarray, own: bool, n: int) -> np.ndarray:
    """``a`` itself to hold a result where it is this call's own writable float64 array of
    ``n`` values (each block of the result is written after that block of ``a`` was read),
    else a new array."""
    if own and a.dtype == np.float64 and a.shape == (n,) and a.flags.writeable:
        return a
    return np.empty(n)


def _trail_median(w: int, y: np.ndarray) -> np.ndarray:
    """The median of the ``w`` points before each point (NaN at the first):
    ``pl.Series(y).shift(1).rolling_median(w, min_samples=1)``, computed as polars' trailing
    median of ``y`` moved one place on (the shifted-in null only shortens the first window)."""
    from forensics.evidence.rolling import polars_trailing_median, selectable

    if not selectable(y):  # a NaN or a -0.0: polars' own path, whose zero signs we keep
        return pl.Series(y).shift(1).rolling_median(w, min_samples=1).to_numpy()
    out = np.empty(len(y))
    if len(y):
        out[0] = np.nan
        out[1:] = polars_trailing_median(y[:-1], w, 1)
    return out


def _lead_median(w: int, y: np.ndarray) -> np.ndarray:
    """The median of the ``w`` points after each point (NaN at the last)."""
    return _trail_median(w, np.ascontiguousarray(y[::-1]))[::-1]


def _lead_from_trail(w: int, y: np.ndarray, trail: np.ndarray) -> np.ndarray:
    """``_lead_median(w, y)`` from ``trail = _trail_median(w, y)``: the ``w`` points after
    point i are the ``w`` points before point ``i + w + 1``, so where that point exists the
    leading median is its trailing one; the last ``w + 1`` points are computed on their own
    (their windows end with the series). Without NaN or -0.0 (:func:`rolling.selectable`) a
    median depends only on the window's values, not on their order; otherwise (polars' own
    path keeps a zero's sign by position) the whole is computed backwards."""
    from forensics.evidence.rolling import selectable

    n = len(y)
    k = min(n, w + 1)
    if k == n or not selectable(y):
        return _lead_median(w, y)
    out = np.empty(n)
    out[: n - k] = trail[w + 1 :]
    out[n - k :] = _lead_median(w, y[n - k :])
    return out


def theil_sen(x: np.ndarray, y: np.ndarray, z: float = 1.96) -> tuple[float, float, float, float]:
    """Theil-Sen line ``(slope, intercept, slope_low, slope_high)``, 95% interval by default.

    The median of pairwise slopes (Sen 1968), intercept median(y - slope x) as scipy's
    ``theilslopes``; the interval from the normal approximation of Kendall's S without tie
    corrections. Written with numpy so that spike detection does not pay for importing
    scipy.stats (over a second) on every run.

    Where no slope can be NaN or -0.0 (:func:`~forensics.evidence.order_stats.plain_for_slopes`:
    every log's trend window), the order statistics come from
    :mod:`~forensics.evidence.order_stats` (the same values, about twice as fast at 300
    points); otherwise from :func:`_theil_sen_plain`, the straightforward computation.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    fast = _theil_sen_fast(x, y, z, interval=True)
    return fast if fast is not None else _theil_sen_plain(x, y, z)


def theil_sen_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """``theil_sen(x, y)[:2]``, the line alone: only the middle slopes are selected."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    fast = _theil_sen_fast(x, y, 1.96, interval=False)
    slope, intercept, _, _ = fast if fast is not None else _theil_sen_plain(x, y)
    return slope, intercept


def theil_sen_with_half(
    x: np.ndarray, y: np.ndarray
) -> tuple[tuple[float, float, float, float], tuple[float, float] | None]:
    """``theil_sen(x, y)`` and, where the fast path applies, ``theil_sen_line`` of the first
    half (``len(x) // 2`` points) with its slopes taken from the whole's: the pairs within the
    first half, each formed as the half's own computation forms it. None for the half where
    the fast path does not apply (the caller fits it, if at all, on its own)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(x)
    h = n // 2
    if h < _FAST_MIN_POINTS or not order_stats.plain_for_slopes(x, y):
        return theil_sen(x, y), None
    slopes = order_stats.pairwise_slopes(x, y)
    whole = _from_slopes(slopes, x, y, 1.96, interval=True)
    # x[:h] is strictly increasing too and y[:h] is part of y: the half needs no check.
    half = _from_slopes(slopes[order_stats.first_half_pairs(n)], x[:h], y[:h], 1.96, interval=False)
    return whole, half[:2]


def _theil_sen_fast(
    x: np.ndarray, y: np.ndarray, z: float, *, interval: bool
) -> tuple[float, float, float, float] | None:
    """:func:`theil_sen` through :mod:`~forensics.evidence.order_stats`, or None where that
    path does not apply (few points, or a slope could be NaN or -0.0). Without ``interval``
    its ends are NaN (not selected)."""
    if len(x) < _FAST_MIN_POINTS or not order_stats.plain_for_slopes(x, y):
        return None
    return _from_slopes(order_stats.pairwise_slopes(x, y), x, y, z, interval=interval)


def _from_slopes(
    slopes: np.ndarray, x: np.ndarray, y: np.ndarray, z: float, *, interval: bool
) -> tuple[float, float, float, float]:
    """The fast path's line from all n(n-1)/2 slopes of (x, y) (no NaN; no -0.0 in the
    straightforward computation, any zero formed here taken as +0.0)."""
    n = len(x)
    nt = n * (n - 1) // 2
    lo, mid, hi = _interval_ranks(n, nt, z)
    ks = sorted({lo, max(mid - 1, 0), mid, hi} if interval else {max(mid - 1, 0), mid})
    got = dict(zip(ks, order_stats.select(slopes, ks), strict=True))
    # A zero slope may have been formed as -0.0; the straightforward slopes have none (+0.0).
    if nt % 2:
        slope = float(got[mid] + 0.0)
    else:  # np.mean of the two middle values, as np.median forms it
        slope = float((np.float64(0.0) + got[mid - 1] + got[mid]) / 2.0)
    intercept = float(order_stats.median(y) - slope * order_stats.median_of_increasing(x))
    if not interval:
        return slope, intercept, float("nan"), float("nan")
    return slope, intercept, float(got[lo] + 0.0), float(got[hi] + 0.0)


_FAST_MIN_POINTS = 40  # below this the plain computation is as fast


def _interval_ranks(n: int, nt: int, z: float) -> tuple[int, int, int]:
    """Ranks of the interval's ends and of the (upper) median among ``nt`` slopes of n points."""
    sigma = np.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    hi = min(int(round((nt + z * sigma) / 2.0)), nt - 1)
    lo = max(int(round((nt - z * sigma) / 2.0)) - 1, 0)
    return lo, nt // 2, hi


def _theil_sen_plain(
    x: np.ndarray, y: np.ndarray, z: float = 1.96
) -> tuple[float, float, float, float]:
    """:func:`theil_sen` computed straightforwardly (every input, NaN and -0.0 included)."""
    i, j = _pairs(len(x))
    dx = x[j] - x[i]
    ok = dx != 0
    slopes = (y[j] - y[i])[ok] / dx[ok]
    if len(slopes) == 0:
        return 0.0, float(np.median(y)), 0.0, 0.0
    n, nt = len(x), len(slopes)
    lo, mid, hi = _interval_ranks(n, nt, z)
    # The median and the interval are order statistics: one partition, not a sort (the same
    # values, in linear time). The median as np.median forms it: the middle value, or the
    # mean of the two middle values; NaN slopes go through np.median itself.
    if np.isnan(slopes).any():
        slope = float(np.median(slopes))
        part = np.partition(slopes, [lo, hi])
    else:
        part = np.partition(slopes, sorted({lo, max(mid - 1, 0), mid, hi}))
        slope = float(part[mid] if nt % 2 else np.mean(part[mid - 1 : mid + 1]))
    intercept = float(np.median(y) - slope * np.median(x))
    return slope, intercept, float(part[lo]), float(part[hi])


@lru_cache(maxsize=8)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs i < j of n points (Theil-Sen is fitted on windows of the same length)."""
    i, j = np.triu_indices(n, k=1)
    i.flags.writeable = j.flags.writeable = False
    return i, j


@dataclass(frozen=True)
class Event:
    """One detected excursion, as indices into the score frame."""

    onset: int  # first point of the excursion (z above the onset level, contiguous to the peak)
    peak: int  # the flagged stretch's point furthest above its baseline (largest ratio)
    last: int  # last flagged point
    n_flagged: int


def find_events(
    sc: pl.DataFrame,
    *,
    z_min: float = 6.0,
    min_ratio: float = 1.15,
    z_onset: float = 2.0,
    merge_gap: int = 2,
    log_scale: bool = True,
    gross_ratio: float | None = None,
    z_gross: float = 3.0,
    onset_frac: float = 0.2,
) -> list[Event]:
    """The decision: points with ``z >= z_min`` and height ``>= min_ratio``, merged into events.

    A gross jump (height ``>= gross_ratio``) needs only ``z >= z_gross``: in a log of eight lines
    that also falls fast, the noise estimate is inflated by the fall, yet a loss that more than
    doubles from one line to the next is a spike (the bigscience n16 log, 12.5 -> 32.8).

    Flagged points closer than ``merge_gap`` unflagged points belong to one event. The onset
    walks back from the first flagged point while the score stays above ``z_onset`` (a spike
    that builds over a few logged points starts where it leaves the noise, not where it
    crosses the alarm line).
    """
    if sc.is_empty():
        return []
    return events_in(
        sc.get_column("z").fill_null(np.nan).to_numpy(),
        sc.get_column("ratio").fill_null(np.nan).to_numpy(),
        z_min=z_min,
        min_ratio=min_ratio,
        z_onset=z_onset,
        merge_gap=merge_gap,
        log_scale=log_scale,
        gross_ratio=gross_ratio,
        z_gross=z_gross,
        onset_frac=onset_frac,
    )


def events_in(
    z: np.ndarray,
    r: np.ndarray,
    *,
    z_min: float = 6.0,
    min_ratio: float = 1.15,
    z_onset: float = 2.0,
    merge_gap: int = 2,
    log_scale: bool = True,
    gross_ratio: float | None = None,
    z_gross: float = 3.0,
    onset_frac: float = 0.2,
) -> list[Event]:
    """:func:`find_events` on the score's z and ratio columns as arrays (NaN for null)."""
    if len(z) == 0:
        return []
    with np.errstate(invalid="ignore"):
        height_ok = r >= min_ratio if log_scale else r >= 0
        hit = (z >= z_min) & height_ok
        if gross_ratio is not None and log_scale:
            hit |= (z >= z_gross) & (r >= gross_ratio)
        flagged = np.flatnonzero(hit)
    if len(flagged) == 0:
        return []
    # Flagged points closer than merge_gap + 2 apart are one group: [first, last] and a count.
    cut = np.flatnonzero(np.diff(flagged) > merge_gap + 1) + 1
    first = flagged[np.concatenate([[0], cut])]
    last = flagged[np.concatenate([cut - 1, [len(flagged) - 1]])]
    count = np.diff(np.concatenate([[0], cut, [len(flagged)]]))
    # Excess over the baseline in the score's own units, to compare a point with the peak.
    with np.errstate(invalid="ignore", divide="ignore"):
        excess = np.log(np.where(r > 0, r, np.nan)) if log_scale else r
    # The peak of a one-point group is that point (finite or not, as the search below finds).
    peaks = first.copy()
    for q in np.flatnonzero(last > first):
        g0, g1 = int(first[q]), int(last[q])
        seg = r[g0 : g1 + 1]
        if np.isfinite(seg).any():  # np.nanargmax's answer (argmax where no NaN: the same)
            peaks[q] = g0 + int(np.nanargmax(seg) if np.isnan(seg).any() else seg.argmax())
    # Walk back over points that are both out of the noise and a real part of the rise (a
    # fifth of the peak's excess), so a noisy neighbour does not move the onset. The first
    # step is tested for every group at once (it stops most walks).
    prev = np.maximum(first - 1, 0)
    with np.errstate(invalid="ignore"):
        steps_back = (
            (first - 1 >= 0)
            & np.isfinite(z[prev])
            & (z[prev] >= z_onset)
            & (excess[prev] >= onset_frac * excess[peaks])
        )
    onsets = first.copy()
    for q in np.flatnonzero(steps_back):
        onset, peak = int(first[q]), int(peaks[q])
        while (
            onset - 1 >= 0
            and np.isfinite(z[onset - 1])
            and z[onset - 1] >= z_onset
            and excess[onset - 1] >= onset_frac * excess[peak]
        ):
            onset -= 1
        onsets[q] = onset
    return [
        Event(onset=o, peak=p, last=la, n_flagged=c)
        for o, p, la, c in zip(
            onsets.tolist(), peaks.tolist(), last.tolist(), count.tolist(), strict=True
        )
    ]
