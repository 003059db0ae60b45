"""Order statistics with the exact values numpy gives, at a fraction of the cost.

Spike shapes need, per spike, two Theil-Sen fits (the median and the 95% interval of up to
44,850 pairwise slopes) and about a dozen medians of a few hundred points: at a million steps
that is thousands of spikes, and ``np.partition`` of every slope set plus ``np.median``'s
Python overhead held most of the spike detector's time.

* :func:`median` is ``np.median`` of a 1-D array without NaN: the same partition's middle
  order statistics and the same arithmetic (``np.mean`` of the one or two middle values is
  ``(0.0 + a [+ b]) / count``: numpy's sum starts from its identity, so the result never
  depends on the sign of a zero the partition happened to pick).
* :func:`pairwise_slopes` forms the n(n-1)/2 slopes ``(y[j] - y[i]) / (x[j] - x[i])`` with
  contiguous array operations instead of index gathers (each pair once, as ``i + d mod n``
  for offsets ``d``); a pair reached "backwards" computes ``(-dy) / (-dx)``, the same
  rounded value except that a zero ``dy`` gives -0.0 instead of +0.0 (rounding to nearest
  is symmetric under negation).
* :func:`select` returns the k-th smallest values of an array without NaN by bracketing:
  order statistics of a sample give two bounds, the values are binned (equal-width bins
  between the bounds, one bin below, one above) and the bins' counts say which bin holds
  each rank: only those bins are partitioned. The sample decides only the speed, never the
  values.

* :func:`slope_stats_rows` is what the thousands of spike trend windows take: each window's
  slopes and its first half's order statistics, one window after another while its slopes are
  in the processor's cache (forming and selecting eight windows' slopes at once went to main
  memory on every pass and was slower), picked from bins of the values between two bounds.
* :func:`bin_medians` (and :func:`median_value`, :func:`median` on a long array) is
  ``np.median`` of each bin of a long float64 array, by the compiled kernel's bracketed
  selection (one pass over the bin, no copy of it).
* :func:`median_rows` sorts rows rather than partitioning them (numpy's row sort is
  vectorized, several times faster).
* :func:`median_of_ints` is ``np.median`` of step differences through a sort (numpy's int64
  partition is slow on runs of equal values).

An order statistic is a value, so any correct selection returns the same one; the only
doubles that compare equal with different bits are +0.0 and -0.0 (NaN is excluded). Hence
:func:`plain_for_slopes`: the fast Theil-Sen path is taken only where no slope of the
straightforward computation can be -0.0 (see there), and the selected zeros are returned as
+0.0. ``tests/test_spike_fast_path.py`` compares all of it with the straightforward code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import lru_cache
from types import ModuleType

import numpy as np

from forensics.cores import cores

_slopes: ModuleType | None
try:  # the optional compiled kernel (setup.py builds it where a C compiler is found)
    from forensics.evidence import _slopes
except ImportError:  # pragma: no cover - a build without a compiler
    _slopes = None

_SAMPLE_EVERY = 101  # the bracket comes from one value in 101, at random positions (fixed per size)
_BRACKET_MIN = 2000  # below this many values one partition is as cheap as bracketing
_TINY = 2.0**-900  # nonzero |y| at least this: no difference of two y values is subnormal
_X_MAX = 2.0**60  # |x| below this: no slope underflows to zero (see plain_for_slopes)


def median(a: np.ndarray) -> np.float64:
    """``np.median(a)`` for a 1-D float64 array, bit for bit (NaN and empty arrays go
    through ``np.median`` itself)."""
    n = len(a)
    got = _kernel_median(a)
    if got is not None:
        return got
    if n == 0 or np.isnan(a).any():
        return np.float64(np.median(a))
    h = n // 2
    if n % 2:
        return np.float64(0.0) + np.partition(a, h)[h]
    part = np.partition(a, [h - 1, h])
    return (np.float64(0.0) + part[h - 1] + part[h]) / 2.0


_KERNEL_MEDIAN_MIN = 4096  # values from which median() selects with the compiled kernel


def median_value(a: np.ndarray) -> float:
    """``float(np.median(a))`` of any 1-D array, bit for bit: a long float64 array's from the
    compiled kernel (one pass and a small selection instead of a copy and a partition of
    every value), anything else from numpy."""
    got = _kernel_median(a)
    return float(got) if got is not None else float(np.median(a))


def _kernel_median(a: np.ndarray) -> np.float64 | None:
    """The compiled kernel's median of a long float64 array; None for a short one or one
    it does not take."""
    if len(a) < _KERNEL_MEDIAN_MIN:
        return None
    got = bin_medians(a, np.array([0, len(a)]))
    return got[0] if got is not None else None


def bin_medians(a: np.ndarray, edges: np.ndarray, split_from: int = 1 << 18) -> np.ndarray | None:
    """``np.median`` of each bin ``a[edges[b] : edges[b + 1]]`` of a 1-D float64 array (bins
    non-empty, ``edges`` increasing), bit for bit, from the compiled kernel: one pass over
    each bin gathers the values between two bounds from a sample, and only those are
    selected from (``np.median`` copies and partitions every bin). A bin holding a NaN gives
    NaN, as in numpy. The bins are split between the cores from ``split_from`` values on.
    None without the kernel, or for an array of another type or layout (the caller's own
    path then)."""
    if _slopes is None or a.ndim != 1 or a.dtype != np.float64 or not a.flags.c_contiguous:
        return None
    e = np.ascontiguousarray(edges, dtype=np.int64)
    nb = len(e) - 1
    out = np.empty(nb)
    if nb > 0:
        each = 1 if int(e[-1] - e[0]) >= split_from else nb
        in_parts(nb, each, lambda b0, b1: _slopes.medians(a, e, out, b0, b1))
    return out


def median_of_ints(a: np.ndarray) -> float:
    """``float(np.median(a))`` of a 1-D integer array (step differences), bit for bit, through
    a sort: numpy's partition of int64 can take 30 times longer than a sort on runs of equal
    values with a few others (a million steps logged one apart, a few two apart: 0.14 s).
    Other arrays go through ``np.median`` itself."""
    n = len(a)
    if n == 0 or a.dtype.kind not in "iu" or np.abs(a).max() >= 2**53:
        return float(np.median(a))
    s = np.sort(a)
    h = n // 2
    if n % 2:  # np.mean of one value: the value as a float
        return float(np.float64(s[h]))
    return float((np.float64(s[h - 1]) + np.float64(s[h])) / 2.0)


def median_of_counts(counts: np.ndarray, offset: int = 0) -> float | None:
    """The median of the integers ``offset + i``, each ``counts[i]`` times (None if none),
    as np.median of them forms it: the middle one, or the mean of the two middle ones."""
    n = int(counts.sum())
    if n == 0:
        return None
    cum = np.cumsum(counts)
    h = n // 2

    def at(rank: int) -> np.float64:
        return np.float64(offset + int(np.searchsorted(cum, rank, side="right")))

    if n % 2:
        return float(at(h))
    return float((at(h - 1) + at(h)) / 2.0)


def plain_for_slopes(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether no slope ``(y[j] - y[i]) / (x[j] - x[i])``, i < j, is NaN or -0.0 and every
    pair counts (``x`` strictly increasing): then the slopes' order statistics are unique
    values, whatever algorithm selects them.

    With x strictly increasing and finite (|x| < 2^60) every ``dx`` is positive and below
    2^61. A slope is -0.0 only if ``dy`` is -0.0 (y[j] = -0.0 and y[i] = +0.0: excluded, no y
    is -0.0) or underflows to zero: a nonzero ``dy`` is a multiple of 2^-952 when every
    nonzero |y| is at least 2^-900, and 2^-952 / 2^61 is still a normal double. Finite y gives
    no NaN (an infinite slope is a value like any other).
    """
    if len(x) < 2 or not (x[1:] > x[:-1]).all():  # NaN fails the comparison
        return False
    if not (abs(float(x[0])) < _X_MAX and abs(float(x[-1])) < _X_MAX):
        return False
    ay = np.abs(y)
    ok = (ay >= _TINY) & (ay < np.inf)
    if ok.all():
        return True
    rest = y[~ok]  # must be +0.0 (a NaN, an infinity, a tiny value or -0.0 is not)
    return bool(((rest == 0) & ~np.signbit(rest)).all())


def median_of_increasing(x: np.ndarray) -> np.float64:
    """``np.median(x)`` of a strictly increasing 1-D float array: its order statistics are its
    positions."""
    n = len(x)
    h = n // 2
    if n % 2:
        return np.float64(0.0) + x[h]
    return (np.float64(0.0) + x[h - 1] + x[h]) / 2.0


def pairwise_slopes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The n(n-1)/2 pairwise slopes of (x, y), in no particular order (see the module text:
    a zero slope may come out as -0.0). ``x`` and ``y`` are float64."""
    n = len(x)
    m = (n - 1) // 2
    out = np.empty(n * (n - 1) // 2)
    if m:
        # Row d-1 pairs point i with point (i + d) mod n, for d = 1..m: a view of [v, v].
        main = out[: m * n].reshape(m, n)
        np.subtract(_wrapped(y, m), y, out=main)
        np.divide(main, _wrapped(x, m) - x, out=main)
    if n % 2 == 0:  # offset n/2 reaches each pair from both ends: once, from the first half
        h = n // 2
        np.divide(y[h:] - y[:h], x[h:] - x[:h], out=out[m * n :])
    return out


@lru_cache(maxsize=8)
def first_half_pairs(n: int) -> np.ndarray:
    """Positions in :func:`pairwise_slopes` of n points of the pairs i < j < n // 2 (each
    formed there as ``(y[j] - y[i]) / (x[j] - x[i])``: offsets below n // 2 never wrap for
    them)."""
    h = n // 2
    pos = np.concatenate([(d - 1) * n + np.arange(h - d) for d in range(1, h)])
    pos.flags.writeable = False
    return pos


@lru_cache(maxsize=8)
def _first_half_mask(n: int) -> np.ndarray:
    """:func:`first_half_pairs` of n points as a mask over the n(n-1)/2 slopes."""
    mask = np.zeros(n * (n - 1) // 2, dtype=bool)
    mask[first_half_pairs(n)] = True
    mask.flags.writeable = False
    return mask


def _wrapped(v: np.ndarray, m: int) -> np.ndarray:
    """The (m, n) read-only view ``w[d - 1, i] = v[(i + d) % n]``."""
    n = len(v)
    v2 = np.concatenate([v, v])
    step = v2.itemsize
    w = np.ndarray((m, n), dtype=v2.dtype, buffer=v2, offset=step, strides=(step, step))
    w.flags.writeable = False
    return w


def select(a: np.ndarray, ks: list[int]) -> np.ndarray:
    """The values ``np.partition(a, ks)[ks]`` (``ks`` sorted, distinct; ``a`` without NaN).

    Two order statistics of a sample bracket the ranks wanted; the values are then binned by
    ``floor((a - low) * scale + 1)``, clipped to [0, nb + 1]: equal-width bins between the
    bounds, everything below in bin 0, everything above in the last. Each rounding is
    monotone, so a bin holds a run of the sorted values and the bins' counts say which bin
    holds each rank; only those bins are partitioned. The bounds decide only how small those
    bins are (a sample that misses makes a rank fall into an end bin: still exact, slower).
    """
    n = len(a)
    if n < _BRACKET_MIN:
        return np.partition(a, ks)[ks]
    sample = a[_sample_positions(n)]
    ms = len(sample)
    # Six binomial standard deviations of a sample rank near the median, each side (slopes
    # sharing a point are correlated: the sample's ranks spread more than binomially).
    margin = int(3.0 * np.sqrt(ms)) + 16
    ra = ks[0] * ms // n - margin
    rb = -(-ks[-1] * ms // n) + margin
    if ra < 0 or rb >= ms:  # the bracket would hold most of the values
        return np.partition(a, ks)[ks]
    sp = np.partition(sample, [ra, rb])
    low, high = sp[ra], sp[rb]
    nb = max(4, (rb - ra) * _SAMPLE_EVERY // _PER_BIN)
    with np.errstate(all="ignore"):
        scale = nb / (high - low)
    if not (np.isfinite(scale) and scale > 0):
        return np.partition(a, ks)[ks]
    with np.errstate(all="ignore"):  # far values overflow to +-inf: clipped like the rest
        t = a - low
        t *= scale
        t += 1.0
    np.clip(t, 0.0, nb + 1.0, out=t)
    idx = t.astype(np.intp)
    starts = np.concatenate([[0], np.cumsum(np.bincount(idx, minlength=nb + 2))])
    bins = np.searchsorted(starts, ks, side="right") - 1  # the bin holding each rank
    out = np.empty(len(ks))
    i = 0
    while i < len(ks):
        b = int(bins[i])
        j = i
        while j < len(ks) and bins[j] == b:
            j += 1
        local = [k - int(starts[b]) for k in ks[i:j]]
        out[i:j] = np.partition(a[idx == b], local)[local]
        i = j
    return out


_PER_BIN = 48  # values per bin between the bounds, about


@lru_cache(maxsize=16)
def _sample_positions(n: int) -> np.ndarray:
    """Where :func:`select` samples an array of n values: random positions, seeded by n (a
    strided sample aliases with the slopes' layout for some window lengths, and a biased
    sample only makes brackets miss)."""
    rng = np.random.default_rng(n)
    pos = np.sort(rng.choice(n, size=n // _SAMPLE_EVERY, replace=False))
    pos.flags.writeable = False
    return pos


# -- the same, row by row: many windows of one length at once (shape_batch) -----------------
def median_rows(a: np.ndarray) -> np.ndarray:
    """:func:`median` of each row of a 2-D float64 array without NaN (the caller checks), as
    float64: the same middle values and the same arithmetic, row by row. Rows of 8 values or
    more are sorted rather than partitioned: numpy's row sort is vectorized, 4 to 10 times
    faster than its row partition (the middle values are the same order statistics; only a
    zero's sign may differ, and ``0.0 + v`` makes it +0.0 either way)."""
    n = a.shape[1]
    h = n // 2
    if n >= _SORT_ROWS_MIN:
        part = np.sort(a, axis=1)
    else:
        part = np.partition(a, [h - 1, h] if n % 2 == 0 else h, axis=1)
    if n % 2:
        return np.float64(0.0) + part[:, h]
    return (np.float64(0.0) + part[:, h - 1] + part[:, h]) / 2.0


_SORT_ROWS_MIN = 8  # row length from which median_rows sorts (below it a partition is as fast)


def median_of_increasing_rows(x: np.ndarray) -> np.ndarray:
    """:func:`median_of_increasing` of each row of a 2-D array of strictly increasing rows."""
    n = x.shape[1]
    h = n // 2
    if n % 2:
        return np.float64(0.0) + x[:, h]
    return (np.float64(0.0) + x[:, h - 1] + x[:, h]) / 2.0


def plain_for_slopes_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """:func:`plain_for_slopes` of each row pair of two 2-D float64 arrays (boolean per row)."""
    if x.shape[1] < 2:
        return np.zeros(len(x), dtype=bool)
    ok = (x[:, 1:] > x[:, :-1]).all(axis=1)
    ok &= (np.abs(x[:, 0]) < _X_MAX) & (np.abs(x[:, -1]) < _X_MAX)
    ay = np.abs(y)
    good = (ay >= _TINY) & (ay < np.inf)
    good |= (y == 0) & ~np.signbit(y)  # +0.0 (NaN, infinities, tiny values, -0.0 are not)
    return ok & good.all(axis=1)


def _wrapped_rows(v: np.ndarray, m: int) -> np.ndarray:
    """The (k, m, n) read-only view ``w[r, d - 1, i] = v[r, (i + d) % n]``."""
    k, n = v.shape
    v2 = np.ascontiguousarray(np.concatenate([v, v], axis=1), dtype=float)
    step = v2.itemsize
    return np.lib.stride_tricks.as_strided(
        v2[:, 1:], shape=(k, m, n), strides=(v2.strides[0], step, step), writeable=False
    )


def slope_stats_rows(
    x: np.ndarray, y: np.ndarray, ks: list[int], ks_h: list[int], threads: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`slope_stats_rows_numpy`'s values, from the compiled kernel where it was built
    (``forensics/evidence/_slopes.c``: the same values, several times faster, its rows split
    between ``threads`` threads, default the machine's cores), else from numpy."""
    if _slopes is None or x.shape[1] < 2 or len(ks) > 8 or len(ks_h) > 8:
        return slope_stats_rows_numpy(x, y, ks, ks_h)
    return slope_stats_rows_compiled(x, y, ks, ks_h, threads)


def slope_stats_rows_compiled(
    x: np.ndarray, y: np.ndarray, ks: list[int], ks_h: list[int], threads: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`slope_stats_rows_numpy` by the compiled kernel (which must be built), its rows
    split between ``threads`` threads (default: the cores this process may use, at most 2;
    the kernel holds no lock while it works)."""
    assert _slopes is not None
    k, n = x.shape
    xc = np.ascontiguousarray(x, dtype=np.float64)
    yc = np.ascontiguousarray(y, dtype=np.float64)
    got, got_h = np.empty((k, len(ks))), np.empty((k, len(ks_h)))
    args = (xc, yc, k, n, tuple(ks), tuple(ks_h), got, got_h)
    in_parts(k, _ROWS_A_THREAD, lambda a, b: _slopes.stats_rows(*args, a, b), threads)
    return got, got_h


_ROWS_A_THREAD = 16  # fewer windows than this a thread: not worth a thread's start


def in_parts(
    total: int, each_min: int, work: Callable[[int, int], object], threads: int | None = None
) -> None:
    """``work(a, b)`` over consecutive parts ``[a, b)`` of ``range(total)``, one a thread (at
    most ``threads``, default :func:`cores`; no part under ``each_min`` items, so one part and
    no thread for a small job), the first in the caller's thread. For a compiled kernel that
    holds no lock while it works. An error in a part is raised once every part has ended."""
    parts = min(threads or cores(), max(1, total // each_min))
    cuts = [total * i // parts for i in range(parts + 1)]
    failed: list[BaseException] = []

    def part(a: int, b: int) -> None:
        try:
            work(a, b)
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            failed.append(e)

    workers = [threading.Thread(target=part, args=(cuts[i], cuts[i + 1])) for i in range(1, parts)]
    for w in workers:
        w.start()
    try:
        work(cuts[0], cuts[1])
    finally:
        for w in workers:
            w.join()
    if failed:
        raise failed[0]


def slope_stats_rows_numpy(
    x: np.ndarray, y: np.ndarray, ks: list[int], ks_h: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """For each row pair of two 2-D float64 arrays (rows of one length n): the values
    ``np.partition(s, ks)[ks]`` of its slopes ``s = pairwise_slopes(x[r], y[r])`` and
    ``np.partition(h, ks_h)[ks_h]`` of its first half's ``h = s[first_half_pairs(n)]``
    (``ks``, ``ks_h`` sorted, distinct; no slope NaN; a zero may come out as either sign, as
    for :func:`select`). Two (rows, len) arrays.

    One window at a time: its slopes (a few hundred kB) stay in the processor's cache while
    they are formed, gathered and counted; several windows at once (as an
    earlier version formed and selected them) made every pass over them a trip to main
    memory. The selection is :class:`_Bracket`'s; the first half's median comes from the
    whole's bounds where they bracket it too (most windows: the half's median lies near the
    whole's), else from its own."""
    k, n = x.shape
    m, h = (n - 1) // 2, n // 2
    nt, nth = n * (n - 1) // 2, h * (h - 1) // 2
    got, got_h = np.empty((k, len(ks))), np.empty((k, len(ks_h)))
    if k == 0 or nt == 0:
        return got, got_h
    whole, first = _Bracket(nt, ks), _Bracket(nth, ks_h)
    pairs_h, in_half = first_half_pairs(n), _first_half_mask(n)
    buf, dx, half = np.empty(nt), np.empty((m, n)), np.empty(nth)
    main = buf[: m * n].reshape(m, n)  # pairwise_slopes' layout: offsets 1..m, then n/2
    wy, wx = _wrapped_rows(y, m), _wrapped_rows(x, m)
    tails = (y[:, h:] - y[:, :h]) / (x[:, h:] - x[:, :h]) if n % 2 == 0 else None
    for r in range(k):
        # (a copy, then the subtraction in place: numpy's loop over the wrapped view with a
        # broadcast operand is slower than the two)
        np.copyto(main, wy[r])
        main -= y[r]
        np.copyto(dx, wx[r])
        dx -= x[r]
        main /= dx
        if tails is not None:
            buf[m * n :] = tails[r]
        got[r], part = whole.select_with_part(buf, in_half, first.ks)
        if part is None:  # the half's ranks lie outside the whole's bounds: its own
            np.take(buf, pairs_h, out=half, mode="wrap")  # (in range: "wrap" skips a check)
            part = first.select(half)
        got_h[r] = part
    return got, got_h


class _Bracket:
    """:func:`select` for many arrays of one length, each in the cache: a sample's order
    statistics give bounds ``low <= high``; one comparison with each counts the values below
    ``low`` and marks those between (values below ``low`` take the first ranks, so a rank r
    of the array is rank r - below among them). Those between are binned by value
    (:func:`_bins_of`) and only the bins holding a rank are partitioned. Where a rank falls
    outside the bounds the whole array is partitioned. The sample decides only the speed,
    never the values. (Partitions rather than sorts: on the AMD EPYC machines this runs on,
    numpy sorts a few thousand floats without SIMD, 5 times slower than it partitions them
    at four ranks; and binning the ~6,000 values between the bounds of a 300-point window
    and partitioning two or three bins of ~30 took 40 microseconds against 110 for one
    partition of them all.)"""

    def __init__(self, size: int, ks: list[int]) -> None:
        self.ks = np.asarray(ks, dtype=np.intp)
        self.k_first, self.k_last = (int(ks[0]), int(ks[-1])) if len(ks) else (0, 0)
        self.pos: np.ndarray | None = None
        self.ra = self.rb = 0
        if size >= _PICK_MIN and len(ks):
            pos = _pick_positions(size)
            ms = len(pos)
            margin = int(_PICK_MARGIN * np.sqrt(ms)) + 4
            ra = ks[0] * ms // size - margin
            rb = -(-ks[-1] * ms // size) + margin
            if ra >= 0 and rb < ms:
                self.pos, self.ra, self.rb = pos, ra, rb
        self.lt = np.empty(size, dtype=bool)
        self.le = np.empty(size, dtype=bool)

    def _all(self, a: np.ndarray) -> np.ndarray:
        return np.partition(a, self.ks)[self.ks]

    def _bounds(self, a: np.ndarray, pos: np.ndarray) -> tuple[np.float64, np.float64]:
        s = a.take(pos)
        s.partition([self.ra, self.rb])
        return s[self.ra], s[self.rb]

    def select(self, a: np.ndarray) -> np.ndarray:
        if self.pos is None:
            return self._all(a)
        low, high = self._bounds(a, self.pos)
        below = np.count_nonzero(np.less(a, low, out=self.lt))
        inside = np.count_nonzero(np.less_equal(a, high, out=self.le)) - below
        kl = self.ks - below
        if kl[0] < 0 or kl[-1] >= inside:  # (a NaN bound counts nothing: all of it then)
            return self._all(a)
        self.le ^= self.lt  # low <= v <= high
        vals = np.compress(self.le, a)
        return _binned(vals, low, high, kl, _bins_of(vals, low, high))

    def select_with_part(
        self, a: np.ndarray, part: np.ndarray, ks_part: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`select` of ``a``, and the ranks ``ks_part`` of its values where ``part``
        (a boolean mask) is set, when the same bounds bracket them too (else None): the
        values below ``low`` and between the bounds are counted and gathered once for both.
        (The trend fit's first half is a part of its whole window, and its median usually
        lies inside the whole's interval: this saves gathering and bracketing the half.)"""
        if self.pos is None or not len(ks_part):
            return self.select(a), None
        low, high = self._bounds(a, self.pos)
        lt, le = self.lt, self.le
        below = np.count_nonzero(np.less(a, low, out=lt))
        inside = np.count_nonzero(np.less_equal(a, high, out=le)) - below
        if self.k_first < below or self.k_last - below >= inside:  # (NaN bounds count 0)
            return self._all(a), None
        le ^= lt  # low <= v <= high
        where = le.nonzero()[0]  # (as fast as compress, and says which are the part's)
        vals = a.take(where)
        bins = _bins_of(vals, low, high)
        own = None
        below_part = np.count_nonzero(np.logical_and(lt, part, out=lt))
        if ks_part[0] >= below_part:
            mine = part.take(where)
            if ks_part[-1] - below_part < np.count_nonzero(mine):
                kp = ks_part - below_part
                own = _binned(vals[mine], low, high, kp, None if bins is None else bins[mine])
        return _binned(vals, low, high, self.ks - below, bins), own


def _bins_of(vals: np.ndarray, low: np.float64, high: np.float64) -> np.ndarray | None:
    """The bin of each of ``vals`` (all within ``[low, high]``): ``floor((v - low) * scale)``
    with about :data:`_PER_PICK_BIN` values a bin; None where the bounds give no finite
    positive scale (equal bounds, an infinite one). Each rounding is monotone, so a bin holds
    a run of the sorted values."""
    nb = max(4, len(vals) // _PER_PICK_BIN)
    with np.errstate(all="ignore"):
        scale = nb / (high - low)
    if not (np.isfinite(scale) and scale > 0):
        return None
    t = vals - low  # >= 0: v >= low, and a rounded difference keeps the sign
    t *= scale
    return t.astype(np.intp)


def _binned(
    vals: np.ndarray, low: np.float64, high: np.float64, ks: np.ndarray, bins: np.ndarray | None
) -> np.ndarray:
    """``np.partition(vals, ks)[ks]`` (``ks`` sorted) from :func:`_bins_of`'s bins: their
    counts say which bin holds each rank, and only those bins are partitioned (a partition of
    a few thousand values costs about three times the binning)."""
    if bins is None:
        return np.partition(vals, ks)[ks]
    counts = np.bincount(bins)
    ends = np.cumsum(counts)
    holding = np.searchsorted(ends, ks, side="right")  # the first bin ending after the rank
    out = np.empty(len(ks))
    i = 0
    while i < len(ks):
        b = int(holding[i])
        j = i + 1
        while j < len(ks) and holding[j] == b:
            j += 1
        local = ks[i:j] - (int(ends[b]) - int(counts[b]))
        out[i:j] = np.partition(vals[bins == b], local)[local]
        i = j
    return out


_PICK_MIN = 4096  # below this many values a partition of all is as cheap
_PICK_MARGIN = 1.3  # bounds' margin each side, in sqrt(sample size) (a miss costs one sort)
_PER_PICK_BIN = 32  # values a bin between the bounds, about (16-64 cost the same)


@lru_cache(maxsize=16)
def _pick_positions(size: int) -> np.ndarray:
    """Where :class:`_Bracket` samples arrays of ``size`` values: random positions, seeded by
    the size, one in 44 (about 1,000 of a 300-point window's 44,850 slopes), sorted."""
    rng = np.random.default_rng(size)
    pos = np.sort(rng.choice(size, size=max(256, size // 44), replace=False))
    pos.flags.writeable = False
    return pos


__all__ = [
    "first_half_pairs",
    "median",
    "median_of_increasing",
    "median_of_ints",
    "median_of_increasing_rows",
    "median_rows",
    "pairwise_slopes",
    "plain_for_slopes",
    "plain_for_slopes_rows",
    "select",
    "slope_stats_rows",
]
