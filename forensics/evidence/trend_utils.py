"""Shared helpers for the trend detectors: robust slopes, spike filtering, binning, onsets.

Everything works on plain numpy arrays of steps and values (the evidence layer hands them
out, see :meth:`forensics.evidence.Evidence.series`). Long series are reduced to per-bin
medians before a Theil-Sen fit: the estimator compares every pair of points, so twenty
thousand raw points would cost hundreds of millions of pairs, while a few hundred bin medians
keep the slope robust and the cost negligible.

:func:`theil_sen` is the project's one Theil-Sen estimator (the spike shapes use it too, with
their own confidence level); the MAD-to-sigma factor is
:data:`forensics.evidence.robust.MAD_TO_SIGMA`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, NamedTuple

import numpy as np
import polars as pl

from forensics.evidence.order_stats import bin_medians, in_parts, median_value
from forensics.evidence.reuse import _ACTIVE as _ACTIVE_MEMO
from forensics.evidence.reuse import local_reusing
from forensics.evidence.robust import MAD_TO_SIGMA
from forensics.evidence.rolling import (
    centered_median,
    centered_median_at,
    pieces,
    selectable,
    window_max,
)
from forensics.run import Run

MAD_SCALE = MAD_TO_SIGMA  # MAD -> standard deviation for normal noise (one constant)


@dataclass(frozen=True)
class Slope:
    """A Theil-Sen fit: slope per step, intercept, and the 90% confidence band of the slope."""

    slope: float
    intercept: float
    low: float
    high: float
    n: int

    @property
    def rising(self) -> bool:
        return self.low > 0

    @property
    def falling(self) -> bool:
        return self.high < 0

    def per_1k(self) -> float:
        return self.slope * 1000.0


@dataclass(frozen=True)
class LayerMatrix:
    """A per-layer series as a steps x layers matrix (NaN where a layer was not logged or
    is not finite at a step); see :meth:`forensics.evidence.Evidence.layer_matrix`."""

    steps: np.ndarray  # int64
    layers: list[int]
    values: np.ndarray  # float64, len(steps) x len(layers)

    def complete(self) -> LayerMatrix:
        """Only the steps where every layer has a finite value."""
        ok = np.isfinite(self.values).all(axis=1)
        return LayerMatrix(self.steps[ok], self.layers, self.values[ok])


def layer_matrix(run: Run, metric: str) -> LayerMatrix:
    """Steps x layers matrix of a per-layer series (the last value where a step repeats)."""
    layers = run.layers(metric)
    v = run.metric_rows(metric)
    if not layers or v.is_empty():
        return LayerMatrix(np.array([], dtype=np.int64), [], np.empty((0, 0)))
    step_col, layer_col = v.get_column("step"), v.get_column("layer")
    if step_col.null_count() or layer_col.null_count():
        return _pivoted(v, layers)
    # The pivot by hand: a row per logged step (in order), a column per layer, each cell the
    # last row's value for its (step, layer) in the view's order (nulls as NaN): the pivot's
    # table (_pivoted) without its hash grouping.
    steps = step_col.to_numpy().astype(np.int64, copy=False)
    col = _dense_index(layer_col.to_numpy().astype(np.int64), np.asarray(layers, dtype=np.int64))
    if col is None:  # a layer the list lacks: the pivot, whose columns are selected
        return _pivoted(v, layers)
    rows, row = _distinct_steps(steps)
    values = v.get_column("value").cast(pl.Float64).to_numpy()
    # Cells numbered layer by layer (the matrix transposed): the view holds each tag's rows
    # together in step order, so the counting and the writes below walk memory in order. Row
    # by row, every write jumped a matrix row ahead, and once the matrix outgrew the cache
    # (a 96-layer run at 100k steps, 7 MB) the pivot cost 15x for 10x the rows.
    cell = col * len(rows) + row
    mat = np.full(len(rows) * len(layers), np.nan)
    if len(cell) and np.bincount(cell).max() > 1:
        # A cell logged twice: its last row (the first in reverse order: np.unique's index).
        _, first_back = np.unique(cell[::-1], return_index=True)
        last = len(cell) - 1 - first_back
        cell, values = cell[last], values[last]
    mat[cell] = values  # (one value per cell)
    # (steps x layers, C-ordered as before: the detectors' row and column reductions read it)
    values_by_step = np.ascontiguousarray(mat.reshape(len(layers), len(rows)).T)
    return LayerMatrix(rows, layers, values_by_step)


def _dense_index(logged: np.ndarray, known: np.ndarray) -> np.ndarray | None:
    """Each logged layer's position in ``known`` (sorted distinct layers), None when one is
    not there."""
    if len(logged) == 0:
        return np.zeros(0, dtype=np.int64)
    # Looked up once per run of equal layers (a tag's rows are together in the view), then
    # repeated over the run: the same positions without a search per row.
    starts = np.flatnonzero(np.diff(logged)) + 1
    starts = np.concatenate(([0], starts))
    each = logged[starts]
    at = np.minimum(np.searchsorted(known, each), max(len(known) - 1, 0))
    if len(known) == 0 or not np.array_equal(known[at], each):
        return None
    return np.repeat(at, np.diff(np.append(starts, len(logged))))


def _distinct_steps(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct steps and each step's position among them. Over a span of steps not
    much longer than the series, a table of the span marks them (no sort)."""
    if len(steps) == 0:
        return steps.copy(), np.zeros(0, dtype=np.int64)
    first = int(steps.min())
    span = int(steps.max()) - first + 1
    if span > 2 * len(steps) + 1024:  # (the table's memory stays that of a few columns)
        rows = np.unique(steps)
        return rows, np.searchsorted(rows, steps)
    at = steps - first if first else steps  # (one offset array for the marks and the lookup)
    present = np.zeros(span, dtype=bool)
    present[at] = True
    # (positions as 32-bit where they fit: the lookup's table, read once per row, is half as
    # large; a 10M-step span's was 80 MB)
    position: np.ndarray = np.cumsum(present, dtype=np.int32 if span < 1 << 31 else np.int64)
    np.subtract(position, 1, out=position)
    return np.flatnonzero(present) + first, position[at]


def _pivoted(v: pl.DataFrame, layers: list[int]) -> LayerMatrix:
    """:func:`layer_matrix` by polars' pivot (the last value of each step and layer)."""
    wide = (
        v.select("step", "layer", "value")
        .pivot(on="layer", index="step", values="value", aggregate_function="last")
        .sort("step")
    )
    mat = wide.select([str(layer) for layer in layers]).to_numpy().astype(float)
    return LayerMatrix(wide.get_column("step").to_numpy().astype(np.int64), layers, mat)


def rolling_median(values: np.ndarray, window: int, *, center: bool = True) -> np.ndarray:
    """Rolling median that tolerates short series (the window shrinks at the edges)."""
    if len(values) == 0:
        return values.astype(float)
    window = max(1, min(int(window), len(values)))
    # A watcher's later poll computes only the tail (forensics.evidence.reuse): same numbers.
    return local_reusing(
        "rolling_median", (window, center), window, values, partial(_rolling_median, window, center)
    )


def _rolling_median(window: int, center: bool, values: np.ndarray) -> np.ndarray:
    if center:
        return _centered_median_pieces(values, window)  # polars' numbers, in O(n log window)
    out = pl.Series(values.astype(float)).rolling_median(window, min_samples=1, center=center)
    return out.to_numpy().astype(float)


def _centered_median_pieces(values: np.ndarray, window: int) -> np.ndarray:
    """``centered_median(values, window)`` of a long series a piece at a time: a point's
    median reads the points within ``window`` of it (windows cut only at the series' ends), so
    a piece extended by ``window`` each side gives its numbers; the rank filter's temporaries
    (several whole-length arrays) are then a piece's size."""
    n, p = len(values), _MEDIAN_PIECE
    # (pieces of at least p points, each far longer than its window, and values whose every
    # piece takes the rank filter as the whole does)
    if n < 2 * p or p < 8 * window or not selectable(np.asarray(values, dtype=float)):
        return centered_median(values, window)
    out = np.empty(n)
    edges = [i * p for i in range(n // p)] + [n]  # (the last piece takes the rest)
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        a, b = max(0, lo - window), min(n, hi + window)
        out[lo:hi] = centered_median(values[a:b], window)[lo - a : hi - a]
    return out


_MEDIAN_PIECE = 1 << 17


def robust_sigma(values: np.ndarray) -> float:
    """Noise level of a series around its local trend, from second differences.

    A second difference cancels a locally linear trend and has variance 6 sigma^2 for white
    noise, so its MAD gives sigma without being fooled by the trend itself.
    """
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) < 4:
        if len(v) >= 2:
            return float(np.std(v))
        return 0.0
    d2 = np.diff(v, 2)
    return float(MAD_SCALE * median_value(np.abs(d2 - median_value(d2))) / np.sqrt(6.0))


def despike(values: np.ndarray, *, window: int = 25, k: float = 5.0) -> np.ndarray:
    """Mask of points to keep: drops upward outliers above rolling median + k * rolling MAD.

    Spikes belong to the spike detectors; a trend fit must not be dragged by them.
    """
    return despike_mask(values, despike_band(values, window=window), k=k)


def despike_band(values: np.ndarray, *, window: int = 25) -> tuple[np.ndarray, np.ndarray] | None:
    """The rolling median and the MAD floor :func:`despike` compares against (None for fewer
    than 5 points); independent of ``k``, so one series' band serves every caller."""
    v = np.asarray(values, dtype=float)
    if len(v) < 5:
        return None
    med = rolling_median(v, window)
    dev = np.abs(v - med)
    mad = rolling_median(dev, window) * MAD_SCALE
    floor = 1e-3 * np.abs(med) + 1e-12  # constant stretches have zero MAD
    return med, np.maximum(mad, floor)


def despike_mask(
    values: np.ndarray, band: tuple[np.ndarray, np.ndarray] | None, *, k: float = 5.0
) -> np.ndarray:
    """:func:`despike`'s mask from its band (:func:`despike_band` of the same values)."""
    v = np.asarray(values, dtype=float)
    if band is None:
        return np.isfinite(v)
    med, spread = band
    return np.isfinite(v) & (v <= med + k * spread)


def despike_masks(values: np.ndarray, ks: list[float], *, window: int = 25) -> list[np.ndarray]:
    """``despike_mask(values, despike_band(values, window=window), k=k)`` for each k of
    ``ks`` (all positive), the rolling MAD selected only where it can decide.

    The spread is at least the floor, so a point at most ``min(ks)`` x the floor above the
    rolling median is kept whatever the MAD. On a smooth series (memory, a clean loss) that is
    nearly every point, and the MAD is selected at the few others
    (:func:`~forensics.evidence.rolling.centered_median_at`) instead of a second rank-filter
    pass over the series: the same comparisons on the same numbers."""
    v = np.asarray(values, dtype=float)
    n = len(v)
    w = max(1, min(int(window), n))  # as rolling_median shrinks it
    if n < 5 or not ks or min(ks) <= 0 or not selectable(v):
        band = despike_band(v, window=window)
        return [despike_mask(v, band, k=k) for k in ks]
    # (a watcher's memo reuses the whole-series median: the plain way then)
    if n > 2 * _DESPIKE_CHUNK and _ACTIVE_MEMO.get() is None:
        return _despike_masks_chunked(v, ks, w)
    med = rolling_median(v, window)
    floor = 1e-3 * np.abs(med) + 1e-12  # constant stretches have zero MAD
    cand = np.flatnonzero(~(v <= med + min(ks) * floor))
    dev = np.abs(v - med)
    spread = np.maximum(centered_median_at(dev, w, cand) * MAD_SCALE, floor[cand])
    out = []
    for k in ks:
        keep = np.ones(n, dtype=bool)  # (every value finite: selectable)
        keep[cand] = v[cand] <= med[cand] + k * spread
        out.append(keep)
    return out


# Points per piece of a long series' despike masks: a few MiB of temporaries per piece
# instead of several whole-length float arrays at once.
_DESPIKE_CHUNK = 1 << 18


def _despike_masks_chunked(v: np.ndarray, ks: list[float], w: int) -> list[np.ndarray]:
    """:func:`despike_masks` of a long series, one piece at a time.

    Every number is a window's order statistic over at most ``w`` neighbours, so a piece
    extended by ``w`` points each side (cut only at the series' own ends) gives its deviations
    exactly as the whole series does, and those extended by ``w`` more give its medians: the
    same comparisons on the same numbers, with temporaries the size of a piece."""
    n = len(v)
    outs = [np.ones(n, dtype=bool) for _ in ks]  # (every value finite: selectable)
    k_min = min(ks)
    for lo, hi, a, b in pieces(n, _DESPIKE_CHUNK, w, w):  # [a, b): the deviations needed
        ma, mb = max(0, a - w), min(n, b + w)  # where the medians are computed
        med = centered_median(v[ma:mb], w)[a - ma : b - ma]
        dev = np.abs(v[a:b] - med)
        vc, mc = v[lo:hi], med[lo - a : hi - a]
        floor = 1e-3 * np.abs(mc) + 1e-12
        cand = np.flatnonzero(~(vc <= mc + k_min * floor))
        if len(cand) == 0:
            continue
        spread = np.maximum(centered_median_at(dev, w, cand + (lo - a)) * MAD_SCALE, floor[cand])
        for keep, k in zip(outs, ks, strict=True):
            keep[lo + cand] = vc[cand] <= mc[cand] + k * spread
    return outs


def interp(xq: Any, xp: np.ndarray, fp: np.ndarray) -> Any:
    """``np.interp(xq, xp, fp)`` for steps ``xp`` in increasing order, without a float copy of
    the whole of ``xp`` and ``fp`` (np.interp converts them: 16 bytes a point for one lookup).

    A point is interpolated from the two logged points around it (the end value outside), so
    np.interp over those points alone gives its number: they are found by counting, a block of
    ``xp`` (as floats, as np.interp compares them) at a time, how many are at most it."""
    n = len(xp)
    if n <= _INTERP_BLOCK:
        return np.interp(xq, xp, fp)
    at = searchsorted_as_float(xp, np.asarray(xq, dtype=float), "right")  # how many are <= it
    near = np.unique(np.clip(np.concatenate([at.ravel() - 1, at.ravel()]), 0, n - 1))
    return np.interp(xq, xp[near].astype(float), np.asarray(fp[near], dtype=float))


_INTERP_BLOCK = 1 << 18


def searchsorted_as_float(a: np.ndarray, v: np.ndarray, side: Literal["left", "right"]) -> Any:
    """``np.searchsorted(a, v, side)`` for a sorted ``a`` searched with floats: numpy compares
    a whole integer ``a`` as a float copy (8 bytes a point); here a block at a time (the count
    of ``a`` before each value, summed over the blocks)."""
    if a.dtype.kind == "f" or len(a) <= _INTERP_BLOCK:
        return np.searchsorted(a, v, side=side)
    at = np.zeros(np.shape(v), dtype=np.intp)
    for lo in range(0, len(a), _INTERP_BLOCK):
        at += np.searchsorted(a[lo : lo + _INTERP_BLOCK].astype(float), v, side=side)
    return at


def window_max_pieces(
    values: np.ndarray,
    start: int,
    window: int,
    maximum: Callable[[np.ndarray, int, int], np.ndarray] = window_max,
    *,
    piece: int = 1 << 16,
) -> Iterator[tuple[int, int, np.ndarray]]:
    """``(lo, hi, window_max(values, start, window)[lo:hi])`` piece after piece: each point's
    window lies within ``[lo + start, hi + start + window)``, so the pieces of that stretch
    (cut to the series as the whole is) give the same maxima, with temporaries of a piece's
    size (the whole takes three whole-length floats). ``maximum``: :func:`window_max`."""
    n = len(values)
    for lo, hi, a, b in pieces(n, piece, -start, start + window):
        yield lo, hi, maximum(values[a:b], start, window)[lo - a : hi - a]


def bin_median(
    steps: np.ndarray, values: np.ndarray, *, max_bins: int = 200, as_float: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Per-bin median steps and values (equal numbers of points per bin); ``as_float``: the
    medians of ``steps.astype(float)`` and ``values.astype(float)`` (converted a block at a
    time, not copied whole)."""
    n = len(values)
    if n <= max_bins:
        return steps.astype(float), values.astype(float)
    edges = np.linspace(0, n, max_bins + 1).astype(int)
    # Steps in order (as every series' are): each bin's median step is its middle one or two.
    xs = _middle_of_bins(steps, edges) if _in_plain_order(steps) else None
    if xs is not None:
        # float64 values: each bin's median from the compiled kernel (the same numbers)
        fast = bin_medians(values, edges, _BIN_SPLIT_MIN)
        if fast is not None:
            return xs, fast
    ys = np.empty(max_bins)
    bin_xs = xs is None
    if xs is None:
        xs = np.empty(max_bins)
    # Bins hold one of two sizes: each size's bins as the rows of one matrix, np.median along
    # the rows (the same partition and midpoint as a median per bin), a few rows at a time
    # (each row's median is its own: a million points are not gathered at once).
    sizes = np.diff(edges)
    blocks: list[tuple[int, np.ndarray]] = []
    for size in np.unique(sizes):
        rows_of_size = np.flatnonzero(sizes == size)
        per = max(1, _BIN_BLOCK // int(size))
        blocks += [(int(size), rows_of_size[a : a + per]) for a in range(0, len(rows_of_size), per)]

    def medians(first: int, last: int) -> None:
        for size, rows in blocks[first:last]:
            if len(rows) == 1:
                # A block of one bin (over _BIN_BLOCK / 2 points: a long series' bins): its
                # slice, not a gather through an index matrix of its size (the same values in
                # the same order, so the same partition and median).
                lo = int(edges[rows[0]])
                sy = values[lo : lo + size]
                ys[rows] = np.median(sy.astype(float, copy=False) if as_float else sy)
                if bin_xs:
                    sx = steps[lo : lo + size]
                    xs[rows] = np.median(sx.astype(float, copy=False) if as_float else sx)
                continue
            idx = edges[rows][:, None] + np.arange(size)
            sy = values[idx]
            if as_float:
                sy = sy.astype(float, copy=False)
            ys[rows] = np.median(sy, axis=1)
            if bin_xs:
                sx = steps[idx]
                xs[rows] = np.median(sx.astype(float, copy=False) if as_float else sx, axis=1)

    # The blocks split between the cores (numpy's partition holds no lock; each block writes
    # its own bins): a long stretch's blocks only, a short one's are not worth a thread.
    in_parts(len(blocks), 1 if n >= _BIN_SPLIT_MIN else len(blocks) + 1, medians)
    return xs, ys


def _in_plain_order(steps: np.ndarray) -> bool:
    """Whether ``steps`` are non-decreasing integers, or floats without NaN or -0.0: then a
    sorted bin's middle elements are the values np.median's partition puts there."""
    if steps.dtype.kind not in "iuf":
        return False
    if len(steps) > 1 and not bool(np.all(steps[1:] >= steps[:-1])):  # (False at a NaN)
        return False
    if steps.dtype.kind == "f":
        zeros = steps == 0
        return not (zeros.any() and bool(np.signbit(steps[zeros]).any()))
    return True


def _middle_of_bins(steps: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """np.median of each bin ``steps[edges[k] : edges[k + 1]]`` of steps in order: the middle
    value as a float, or the mean of the two middle values as np.mean forms it (their float
    sum, halved)."""
    size = np.diff(edges)
    lo = steps[edges[:-1] + (size - 1) // 2].astype(float)
    hi = steps[edges[:-1] + size // 2].astype(float)
    with np.errstate(over="ignore", invalid="ignore"):  # (odd bins' sums are not kept)
        return np.where(size % 2 == 1, lo, (lo + hi) / 2.0)


_BIN_BLOCK = 1 << 16  # points of bin_median's bins gathered at a time
_BIN_SPLIT_MIN = 1 << 18  # points from which bin_median's blocks are split between threads


def bin_bounds(steps: np.ndarray, *, max_bins: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """First and last step of each bin, with the same bins as :func:`bin_median`."""
    n = len(steps)
    if n <= max_bins:
        return steps.copy(), steps.copy()
    edges = np.linspace(0, n, max_bins + 1).astype(int)
    return steps[edges[:-1]], steps[edges[1:] - 1]


def theil_sen(
    steps: np.ndarray,
    values: np.ndarray,
    *,
    max_points: int | None = 200,
    confidence: float = 0.90,
) -> Slope | None:
    """Robust slope with a ``confidence`` band (90% by default); None with fewer than three
    distinct steps.

    The median of the pairwise slopes (Sen 1968), intercept ``median(y) - slope median(x)``;
    the band from the normal approximation of Kendall's S with Sen's tie corrections (eq. 2.6),
    the same numbers as ``scipy.stats.theilslopes`` but in numpy, so callers do not pay for
    importing scipy.stats. Series longer than ``max_points`` are reduced to bin medians first
    (``None``: every point).
    """
    if max_points is not None and len(values) > max_points:
        # (the bins' medians of the float steps, converted a block at a time)
        x, y = bin_median(np.asarray(steps), np.asarray(values), max_bins=max_points, as_float=True)
    else:  # (at most max_points: bin_median would return the points themselves)
        x = np.asarray(steps, float)
        y = np.asarray(values, float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.ptp(x) == 0:
        return None
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    pair = dx != 0
    slopes = np.sort((y[j] - y[i])[pair] / dx[pair])
    slope = float(np.median(slopes))
    intercept = float(np.median(y) - slope * np.median(x))
    n, nt = len(y), len(slopes)
    sigsq = (n * (n - 1) * (2 * n + 5) - _tie_term(x) - _tie_term(y)) / 18.0
    z = _normal_quantile(0.5 + confidence / 2.0)
    if sigsq >= 0:
        sigma = float(np.sqrt(sigsq))
        hi = min(int(np.round((nt + z * sigma) / 2.0)), nt - 1)
        lo = max(int(np.round((nt - z * sigma) / 2.0)) - 1, 0)
        low, high = float(slopes[lo]), float(slopes[hi])
    else:  # cannot happen for real data; scipy returns NaN here too
        low = high = float("nan")
    return Slope(slope, intercept, low, high, len(x))


def _tie_term(v: np.ndarray) -> float:
    """Sen's correction for tied values: sum of k(k-1)(2k+5) over groups of k equal values."""
    _, counts = np.unique(v, return_counts=True)
    k = counts[counts > 1].astype(float)
    return float(np.sum(k * (k - 1) * (2 * k + 5)))


def _normal_quantile(p: float) -> float:
    """The standard normal quantile (exact to float precision, via the inverse error function)."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


class Hinge(NamedTuple):
    """A fitted bend: its step, the slopes either side, and the steps it may lie between."""

    onset: int
    before: float
    after: float
    lo: int
    hi: int
    sse: float = float("nan")  # the best fit's residual sum of squares
    dof: int = 1  # the points less the fit's parameters
    step: float = 0.0  # the level jump at the knot (0 unless fitted with ``jump``)

    @property
    def range(self) -> tuple[int, int]:
        return self.lo, self.hi


# Chi-square quantile (1 degree of freedom, 95%): knots whose fit is worse than the best by
# less than this many residual variances are not told apart from it.
_KNOT_CHI2 = 3.84
# A jump at the knot is kept when it cuts the residuals by this many residual variances (the
# chi-square quantile at 1e-6: a step, not noise).
_STEP_CHI2 = 23.9
# ... and when the jump is more than the climb after it makes over this many bins.
_STEP_BINS = 5


def hinge_onset(
    steps: np.ndarray, values: np.ndarray, *, min_side: int = 3, jump: bool = False
) -> Hinge | None:
    """Where a series bends upward: best continuous two-piece linear fit.

    Returns a :class:`Hinge` (``onset``, ``before``, ``after``: the step and the slopes; it
    indexes as ``(onset_step, slope_before, slope_after, ...)``). Least squares on bin
    medians, so a few residual outliers matter little. None when too short.

    ``lo``-``hi``: the candidate knots whose residual sum of squares is within
    :data:`_KNOT_CHI2` residual variances of the best (a 95% confidence set for the knot),
    widened to the candidates either side of the best (the grid's own resolution). A bend
    fitted on a sawtooth (memory freed every few hundred steps) can sit several bins from
    where the climb starts: the memory_growth sample's knot is at step 270 on points every
    10 steps, its leak starts after step 300, and the set runs to step 310.

    ``jump``: the two pieces may also differ in level at the knot (a step up, then a climb).
    A continuous fit spreads such a step over the bins before it and puts the bend hundreds of
    steps early, with a range that misses the step (memory flat at 42 GB to step 1,500, then
    67 GB and climbing, read as a bend at step 1,015, "anywhere in 880-1,150").
    """
    x = np.asarray(steps, float)
    y = np.asarray(values, float)
    n = len(x)
    if n < 2 * min_side + 1:
        return None
    ones = np.ones(n)
    cands = range(min_side, n - min_side)  # a few hundred candidates at most
    sses = np.empty(len(cands))
    fits: list[tuple[float, float, float]] = []
    for k, i in enumerate(cands):
        t = x[i]
        cols = [ones, x - t, np.maximum(0.0, x - t)]
        if jump:
            cols.append((x >= t).astype(float))
        a = np.column_stack(cols)
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        sses[k] = float(np.sum((a @ coef - y) ** 2))
        fits.append((float(coef[1]), float(coef[1] + coef[2]), float(coef[3]) if jump else 0.0))
    b = int(np.nanargmin(sses)) if np.isfinite(sses).any() else 0
    best = cands[b]
    before, after, step = fits[b]
    dof = max(n - (4 if jump else 3), 1)
    var = float(sses[b]) / dof
    near = np.flatnonzero(sses <= sses[b] + _KNOT_CHI2 * var)
    lo_i = min(cands[int(near[0])], best - 1) if len(near) else best - 1
    hi_i = max(cands[int(near[-1])], best + 1) if len(near) else best + 1
    return Hinge(
        int(round(x[best])),
        before,
        after,
        int(np.floor(x[max(lo_i, 0)])),
        int(np.ceil(x[min(hi_i, n - 1)])),
        float(sses[b]),
        dof,
        step,
    )


def stepped_hinge(steps: np.ndarray, values: np.ndarray) -> Hinge | None:
    """:func:`hinge_onset`, with a jump at the knot where one clearly fits better: a step up
    of more than :data:`_STEP_BINS` bins' worth of the climb after it, whose one extra
    parameter cuts the residuals by :data:`_STEP_CHI2` residual variances. (A ramp with a
    soft start, or a knot between two bins' steps on very quiet data, fits a little better
    with a small jump a few bins late; the plain bend is nearer where it starts.)"""
    plain = hinge_onset(steps, values)
    stepped = hinge_onset(steps, values, jump=True)
    if plain is None or stepped is None:
        return plain
    var = stepped.sse / stepped.dof
    spacing = float(np.median(np.diff(np.asarray(steps, float))))
    material = stepped.step > _STEP_BINS * max(stepped.after, 0.0) * spacing
    return stepped if material and plain.sse - stepped.sse > _STEP_CHI2 * var else plain


def centred_level(values: np.ndarray, w: int) -> np.ndarray:
    """A loss level at every point: the centred rolling median over ``2 * (w // 2) + 1``
    points (odd, so each level is one of the values), the nearest value repeated past the
    ends."""
    from scipy.ndimage import median_filter

    return median_filter(values, size=2 * (w // 2) + 1, mode="nearest")


def bend_range(xb: np.ndarray, onset: float) -> tuple[int, int]:
    """The steps a bend fitted at bin medians ``xb`` cannot be told from: the medians of the
    bins on either side of the one nearest ``onset`` (its own at either end of the series).
    A knot placed at one bin's step fits almost as well at a neighbour's, and the true bend
    lies anywhere between them."""
    i = int(np.argmin(np.abs(np.asarray(xb, float) - onset)))
    lo, hi = float(xb[max(i - 1, 0)]), float(xb[min(i + 1, len(xb) - 1)])
    return int(np.floor(lo)), int(np.ceil(hi))


def level(values: np.ndarray) -> float:
    v = values[np.isfinite(values)]
    return median_value(v) if len(v) else float("nan")


def window_median(steps: np.ndarray, values: np.ndarray, lo: float, hi: float) -> float:
    """Median of values with lo <= step <= hi (NaN when the window is empty)."""
    sel = (steps >= lo) & (steps <= hi)
    return level(values[sel]) if sel.any() else float("nan")


def align(
    train_steps: np.ndarray, train_values: np.ndarray, at: np.ndarray, half_width: float
) -> np.ndarray:
    """Median of the train series in [s - half_width, s + half_width] for each step s in ``at``.

    Used to put a smoothed train loss next to each validation point. Falls back to the
    nearest train point when the window is empty.
    """
    out = np.full(len(at), np.nan)
    if len(train_steps) == 0:
        return out
    lo = searchsorted_as_float(train_steps, at - half_width, "left")
    hi = searchsorted_as_float(train_steps, at + half_width, "right")
    size = hi - lo
    # Windows of one size as the rows of a matrix (thousands of val points on a long log), a
    # block of rows at a time so that the copies stay small (a single window when it is
    # long); np.median along rows is the per-window median.
    for k in np.unique(size[size > 0]):
        rows_of_size = np.flatnonzero(size == k)
        per = max(1, _BIN_BLOCK // int(k))
        for a in range(0, len(rows_of_size), per):
            rows = rows_of_size[a : a + per]
            out[rows] = np.median(train_values[lo[rows][:, None] + np.arange(int(k))], axis=1)
    for i in np.flatnonzero(size <= 0):  # an empty window: the nearest train point
        j = searchsorted_as_float(train_steps, at[i], "left")
        out[i] = train_values[int(np.clip(j, 0, len(train_steps) - 1))]
    return out


def fmt_layers(layers: list[int]) -> str:
    """Compact layer list: [0, 1, 2, 3, 7] -> "0-3,7"."""
    if not layers:
        return ""
    parts: list[str] = []
    start = prev = layers[0]
    for v in layers[1:] + [None]:  # type: ignore[list-item]
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
        if v is not None:
            start = prev = v
    return ",".join(parts)


def parse_layers(text: str) -> list[int]:
    """The inverse of :func:`fmt_layers`: "0-3,7" -> [0, 1, 2, 3, 7] ([] for anything else)."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return []
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def sig(x: float, digits: int = 3) -> str:
    """Short human number for summaries: ``digits`` significant digits below 1,000, whole
    and grouped from there up to 1e12 (an activation's typical 9,420 read "9.42e+03" beside
    a limit of 10,000), as :func:`num` writes them."""
    if x is None or not np.isfinite(x):
        return "n/a"
    return num(x, digits)


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th ... 11th, 12th, 13th ... 21st."""
    tail = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{tail}"


def num(x: float, digits: int = 4) -> str:
    """A value for text: ``digits`` significant digits, whole and grouped from 1,000 up (a
    diverged loss of 1,492, where ``.4g`` writes 1492 and 12,345 as 1.234e+04); "n/a" for
    NaN, "inf" for an infinity."""
    if x is None or np.isnan(x):
        return "n/a"
    if abs(x) >= _GROUPED_UP_TO:  # (a loss of 1e30 is not 31 digits with commas)
        return f"{x:.{digits}g}"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}g}"


_GROUPED_UP_TO = 1e12  # values from here on are written in scientific notation


def times(r: float) -> str:
    """A factor for text: whole and grouped from 100 up (1,634, where ``.3g`` writes
    1.63e+03), three significant digits below."""
    if r >= _GROUPED_UP_TO:
        return f"{r:.3g}"
    return f"{r:,.0f}" if r >= 100 else f"{r:.3g}"


@dataclass(frozen=True)
class Unit:
    """How to show a series' values: ``value * scale`` in ``label`` (``stated`` False when the
    metric name gives no unit and the label is the usual one assumed). ``seconds``: for a step
    time, seconds per logged unit (1e-3 for milliseconds)."""

    label: str
    scale: float = 1.0
    stated: bool = True
    raw: str | None = None  # the logged values' unit when they are scaled for display
    seconds: float = 1.0

    @property
    def source(self) -> str | None:
        """The logged values' own unit (None when the name states none)."""
        if not self.stated:
            return None
        return self.raw or self.label

    @property
    def assumed(self) -> str:
        """The words that say the label is assumed ("tokens/s assumed: the log states no
        unit"), empty when the name states the unit."""
        return "" if self.stated else f"{self.label} assumed: the log states no unit"

    def show(self, value: float | None, digits: int = 4) -> str:
        if value is None or not np.isfinite(value):
            return "n/a"
        v = value * self.scale
        num = f"{v:,.0f}" if abs(v) >= 10 ** (digits - 1) else f"{v:.{digits}g}"
        return f"{num} {self.label}".rstrip()


# How a unit the name states is shown: bytes in GB (MB below a gigabyte), the rest as stated.
_SHOWN = {
    "bytes": Unit("GB", 1e-9, raw="bytes"),
    "ms": Unit("ms/step", seconds=1e-3),
    "s": Unit("s/step"),
}

# The old guesses from the name, kept for names Run.unit finds no unit in (``iteration-time``
# is Megatron's seconds, ``memoryallocated`` W&B's system percentage, ``wps`` words/s).
_MEMORY_UNITS = (
    (("bytes", "_b)", "(b)"), _SHOWN["bytes"]),
    (("gib",), Unit("GiB")),
    (("gigabytes", "_gb", "(gb)", " gb"), Unit("GB")),
    (("mib",), Unit("MiB")),
    (("_mb", "(mb)", " mb", "megabytes"), Unit("MB")),
    (("memoryallocated", "percent", "%"), Unit("%")),
)
_TIME_UNITS = (
    (("(ms)", "_ms", " ms", "millis"), _SHOWN["ms"]),
    (("(s)", "_s)", "seconds", "in s", "_sec", "(sec)"), _SHOWN["s"]),
    # Megatron's golden values and MLPerf's NeMo logs keep these in seconds
    (("iteration-time", "train_step_timing"), _SHOWN["s"]),
)
_RATE_UNITS = (
    (("tok", "tps"), Unit("tokens/s")),
    (("wps", "word"), Unit("words/s")),
    (("sample",), Unit("samples/s")),
)


def unit_of(metric: str, tag: str | None) -> Unit:
    """The unit of a memory, step-time or throughput series guessed from its logged name
    (``memory/rss_mb``, ``mem-allocated-bytes``, ``step_time (ms)``, ``tok/s``...). Step times
    are shown per step, bytes in GB. A name without a unit gets the usual one, marked as assumed
    (``stated`` False): seconds per step for a step time, tokens/s for a throughput, none for
    memory. Detectors use :func:`unit_for`, which asks the run first."""
    from forensics.schema import MEMORY, STEP_TIME, THROUGHPUT

    name = (tag or metric).lower()
    table = {MEMORY: _MEMORY_UNITS, STEP_TIME: _TIME_UNITS, THROUGHPUT: _RATE_UNITS}.get(metric)
    for keys, unit in table or ():
        if any(k in name for k in keys):
            return unit
    if metric == STEP_TIME:
        return Unit("s/step", 1.0, stated=False)
    if metric == THROUGHPUT:
        return Unit("tokens/s", 1.0, stated=False)
    return Unit("", 1.0, stated=False)


# A memory level with no unit in its name at or above this is bytes: as kB it would be 10 TB
# (``torch.cuda.memory_allocated()`` logged as ``memory_allocated``: 4.2e10 is 42 GB).
_SURELY_BYTES = 1e10


def unit_for(run: Run, metric: str, level: float | None = None) -> Unit:
    """The unit findings show for ``metric``: the one the run read from its tag's name
    (:meth:`Run.unit`, ``run.metadata["units"]``), the old guess from the name only when that
    states none. ``level``: a typical value, so that bytes below a gigabyte are shown in MB and
    milliseconds from a second up in seconds ("850 ms/step", "1.2 s/step")."""
    from forensics.schema import STEP_TIME
    from forensics.schema import unit_of as stated_unit

    tag = run.metrics().get(metric)
    stated = run.unit(metric)
    if metric == STEP_TIME and stated == "s" and tag is not None and stated_unit(tag) is None:
        stated = None  # the importer's default for a step time, not a word of the name
    if stated is None:
        unit = unit_of(metric, tag)
    else:
        unit = _SHOWN.get(stated, Unit(stated))
    if level is None or not np.isfinite(level):
        return unit
    from forensics.schema import MEMORY

    if metric == MEMORY and not unit.stated and abs(level) >= _SURELY_BYTES:
        unit = Unit("GB", 1e-9, stated=False, raw="bytes")
    if unit.raw == "bytes" and abs(level) < 1e9:
        unit = Unit("MB", 1e-6, stated=unit.stated, raw="bytes")
    if unit.label == "ms/step" and unit.stated and abs(level) >= 1000:
        unit = Unit("s/step", 1e-3, raw="ms/step", seconds=1e-3)
    return unit


def first_at_least(values: np.ndarray, start: int, line: float) -> int:
    """The first index from ``start`` on where ``values`` is at least ``line``, else
    ``len(values)`` (see :func:`_first_where`)."""
    return _first_where(values, start, lambda block: block >= line)


def first_below(values: np.ndarray, start: int, line: float) -> int:
    """The first index from ``start`` on where ``values`` is below ``line``, else
    ``len(values)`` (see :func:`_first_where`)."""
    return _first_where(values, start, lambda block: block < line)


def _first_where(values: np.ndarray, start: int, test: Callable[[np.ndarray], np.ndarray]) -> int:
    """The first index from ``start`` on where ``test`` holds, else ``len(values)``. Searched
    in blocks that double from 256 points, so a loop over a series' episodes pays about the
    length of each, not the rest of the series at each one (a throughput dipping every 250
    steps over 1M took 3 s that way), and no index array of the whole series is made."""
    n, size = len(values), 256
    while start < n:
        end = min(n, start + size)
        hit = np.flatnonzero(test(values[start:end]))
        if len(hit):
            return start + int(hit[0])
        start, size = end, size * 2
    return n


def last_not_above(values: np.ndarray, end: int, line: float) -> int:
    """The last index before ``end`` where ``values`` is not above ``line`` (NaN counts),
    else -1: :func:`_first_where`'s blocks, walked backwards."""
    size = 256
    while end > 0:
        start = max(0, end - size)
        hit = np.flatnonzero(~(values[start:end] > line))
        if len(hit):
            return start + int(hit[-1])
        end, size = start, size * 2
    return -1


def steps_within(steps: np.ndarray, lo: float, hi: float) -> slice:
    """The positions of sorted ``steps`` with ``lo <= step <= hi``, as a slice (a view of a
    long series instead of a mask and copies)."""
    return slice(
        int(np.searchsorted(steps, lo, side="left")), int(np.searchsorted(steps, hi, side="right"))
    )


def step_before(steps: np.ndarray, step: int) -> int | None:
    """The last of the sorted ``steps`` before ``step`` (None when none is)."""
    i = int(np.searchsorted(steps, step, side="left"))
    return int(steps[i - 1]) if i > 0 else None


def grid_distance(step: float, period: float, origin: float) -> float:
    """Steps from ``step`` back to the last point of the grid ``origin + k * period`` (k >= 0;
    the distance to the origin before it)."""
    if not period > 0:
        return float("inf")
    if step < origin:
        return float(origin - step)
    return float((step - origin) % period)


def grid_distances(steps: np.ndarray, period: float, origin: float) -> np.ndarray:
    """:func:`grid_distance` of each of ``steps`` (floats, ``period`` > 0), in one pass."""
    return np.where(steps < origin, origin - steps, np.mod(steps - origin, period))


def housekeeping_at(ev_periods: dict, step: float, slack: float) -> str | None:
    """The housekeeping interval (``eval_interval``, ``checkpoint_interval``) whose grid point
    ``step`` follows within ``slack`` steps, else None. ``ev_periods``: the evidence's
    :attr:`~forensics.evidence.Evidence.revealed_periods`."""
    for name in ("eval_interval", "checkpoint_interval"):
        p = ev_periods.get(name)
        if p is None or p.steps <= slack:
            continue
        if grid_distance(step, p.steps, p.origin) <= slack:
            return name
    return None
