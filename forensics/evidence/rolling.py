"""Exact rolling medians in O(n log w): the same numbers as polars' and numpy's, faster.

polars' ``rolling_median`` sorts each window afresh (about 0.2 s per million points at a
window of 25), and a Python loop of ``np.median`` costs microseconds per point. SciPy's 1-D
rank filter selects the k-th value of every full window in one pass; a median is one or two
such selections. Only the arithmetic that turns two middle values into a median differs
between libraries, and each function here repeats the library's own:

* :func:`centered_median` equals ``pl.Series(v).rolling_median(w, min_samples=1,
  center=True)``: window ``[i - w // 2, i - w // 2 + w)``, shrunk at the ends; an even count
  gives ``lo + (hi - lo) * 0.5``. The ends (fewer than ``w`` points) are left to polars.
* :func:`polars_trailing_median` equals ``pl.Series(v).rolling_median(w, min_samples=m)``
  (window ``[i - w + 1, i]``; the first, short windows are polars' own, nulls as NaN).
* :func:`trailing_median` equals ``np.median(v[max(0, i - w) : i])`` for each ``i >= 1`` (0 at
  ``i = 0``); an even count gives ``(lo + hi) / 2``.

Where only some points' medians matter (a detector that needs the median only where a point
can be slow or below its baseline), :func:`centered_median_at` and
:func:`polars_trailing_median_at` select them one window at a time (a partition: the same
order statistics as the rank filter's), and :func:`window_max` (an upper bound of any median of
a window) finds those points in a few passes. Centred medians of 3 and 5 points are formed by
minima and maxima of shifted arrays (the values the rank filter would select).

Inputs with NaN, Inf or a negative zero (whose sign a selection may or may not keep) and
short inputs take the library's own path, so the result is always the library's.

The rank filter is compiled with forensics where a C compiler was found at install
(``forensics/evidence/_rolling.c``, windows up to 64 points): it keeps each window sorted,
gives both middle values of an even window in one pass, and holds no lock while it works, so
a long series is split between two threads. Otherwise, and for longer windows, it is
scipy.ndimage's 1-D one, ``ndimage.rank_filter`` of a 1-D float64 array
(``mode="nearest"``): its compiled ``_rank_filter_1d`` extension is loaded from scipy's
directory on its own (half a millisecond) and called with the arguments ``rank_filter``
passes it. Importing scipy.ndimage itself costs 0.35 s of CPU (it loads scipy.special):
more than the rolling medians of a million points. Where that extension cannot be loaded
(another scipy layout), ``ndimage.rank_filter`` itself is called, and then series under 50k
points take the library's path while scipy.ndimage is not loaded yet.
tests/test_rolling_exact.py checks bit-for-bit equality on random, heavy-tailed and tied data.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import mmap
import os
import sys
from collections.abc import Callable, Iterator
from functools import lru_cache
from types import ModuleType

import numpy as np
import polars as pl

from forensics.allocator import reusing
from forensics.evidence.order_stats import in_parts

_rolling: ModuleType | None
try:  # the compiled filter (forensics/evidence/_rolling.c), where it was built
    from forensics.evidence import _rolling
except ImportError:  # pragma: no cover - built with the package where a C compiler is found
    _rolling = None

# Below this many points the library's path is as fast: no need for the rank filter.
_MIN_FAST = 512
# Importing scipy.ndimage costs about 0.35 s of CPU once: worth it from series this long (a
# dozen rolling medians of 50k points cost that much more with polars), or when it is loaded
# (only where the extension cannot be loaded on its own: _rank_filter_1d).
_IMPORT_PAYS = 50_000
_NEAREST = 0  # scipy.ndimage's code of mode="nearest" (_ni_support._extend_mode_to_code)


def pieces(
    n: int, size: int, before: int = 0, after: int = 0
) -> Iterator[tuple[int, int, int, int]]:
    """``(lo, hi, a, b)`` for the pieces ``[lo, hi)`` of ``range(n)``, ``size`` at a time,
    each with the stretch ``[a, b)`` it reads: ``before`` points before it and ``after``
    after it, cut to ``[0, n)``. A window function of a long series computed piece by piece
    on those stretches gives the whole's numbers with temporaries of a piece's size."""
    for lo in range(0, n, size):
        hi = min(n, lo + size)
        yield lo, hi, max(0, lo - before), min(n, hi + after)


def _fast(n: int, w: int) -> bool:
    """Whether the rank filter is worth it for ``n`` points at window ``w``."""
    if n < _MIN_FAST or w < 2 or n < 4 * w:
        return False
    if _rolling is not None and w <= _COMPILED_MAX:
        return True  # (no scipy to import)
    return n >= _IMPORT_PAYS or "scipy.ndimage" in sys.modules or _rank_filter_1d() is not None


@lru_cache(maxsize=1)
def _rank_filter_1d() -> Callable[..., None] | None:
    """``scipy.ndimage._rank_filter_1d.rank_filter``, loaded without importing scipy.ndimage
    (None where scipy or that extension is not found, or does not load)."""
    try:
        spec = importlib.util.find_spec("scipy")  # finds scipy's directory, imports nothing
        if spec is None or not spec.submodule_search_locations:
            return None
        name = "scipy.ndimage._rank_filter_1d"
        for root in spec.submodule_search_locations:
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = os.path.join(root, "ndimage", "_rank_filter_1d" + suffix)
                if not os.path.isfile(path):
                    continue
                loader = importlib.machinery.ExtensionFileLoader(name, path)
                ext = importlib.util.spec_from_file_location(name, path, loader=loader)
                if ext is None:
                    continue
                module = importlib.util.module_from_spec(ext)
                loader.exec_module(module)
                fn = getattr(module, "rank_filter", None)
                return fn if callable(fn) and _answers_as_expected(fn) else None
    except Exception:  # noqa: BLE001 - any failure: ndimage.rank_filter itself
        return None
    return None


def _answers_as_expected(fn: Callable[..., None]) -> bool:
    """Whether the private extension still means what this module assumes: the ranks of a
    small array against the plain sort of each window (edges repeated, as mode="nearest").
    Another scipy could keep the name and change the arguments' meaning."""
    v = np.random.default_rng(0).standard_normal(40)
    for rank, size in ((1, 5), (2, 5), (3, 8)):
        out = np.empty_like(v)
        fn(v, rank, size, out, _NEAREST, np.float64(0.0), 0)
        left = size // 2
        padded = np.concatenate([np.full(left, v[0]), v, np.full(size - 1 - left, v[-1])])
        windows = np.lib.stride_tricks.sliding_window_view(padded, size)
        if not np.array_equal(out, np.sort(windows, axis=1)[:, rank]):
            return False
    return True


def selectable(v: np.ndarray) -> bool:
    """Finite values with no negative zero: any exact selection picks the same bits."""
    if not np.isfinite(v).all():
        return False
    zeros = v == 0.0
    return not (zeros.any() and np.signbit(v[zeros]).any())


def _fresh(n: int) -> np.ndarray:
    """An uninitialised float64 array of ``n`` values for a rolling median's result or work
    array; from :data:`_OWN_MAPPING_MIN` values on, in an anonymous mapping of its own, whose
    pages go back to the system as soon as the array is freed. (Once a large block has been
    freed, glibc serves arrays of a few MiB from its heap and keeps their pages resident after
    they are freed: see :mod:`forensics.allocator`.) Not while the analysis of a long run
    reuses freed pages (:func:`~forensics.allocator.reusing_freed_pages`): there a mapping of
    its own is what that avoids, every page of it zeroed by the kernel on its first touch (the
    spike search of the 10M-step event files: 590,000 page faults, 373,000 from the heap)."""
    if n < _OWN_MAPPING_MIN or _MAP_FLAGS is None or reusing():
        return np.empty(n)
    return np.frombuffer(mmap.mmap(-1, n * 8, flags=_MAP_FLAGS), dtype=np.float64)


_OWN_MAPPING_MIN = 1 << 17  # values (1 MiB): smaller arrays come from the heap as usual
_MAP_FLAGS = (
    mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    if hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS")
    else None
)


def _rank(v: np.ndarray, rank: int, size: int) -> np.ndarray:
    """The ``rank``-th smallest of window ``[i - size // 2, i - size // 2 + size)`` at each i
    (only interior positions are meaningful): ``ndimage.rank_filter(v, rank=rank, size=size,
    mode="nearest")`` of a contiguous float64 array."""
    return _ranks(v, (rank,), size)[0]


def _ranks(v: np.ndarray, ranks: tuple[int, ...], size: int) -> list[np.ndarray]:
    """:func:`_rank` of each of ``ranks`` (one or two), by the compiled filter where it was
    built (``forensics/evidence/_rolling.c``: both ranks in one pass, the series split between
    the machine's cores, no lock held), else by scipy's, one pass each."""
    if _rolling is not None and 1 <= size <= _COMPILED_MAX and 1 <= len(ranks) <= 2:
        got = _compiled_ranks(v, ranks, size)
        if got is not None:
            return got
    return [_scipy_rank(v, r, size) for r in ranks]


_COMPILED_MAX = 64  # the compiled filter's work grows with the window: scipy's above this
_SPLIT_MIN = 1 << 16  # points: a shorter series is not worth a second thread


def _compiled_ranks(v: np.ndarray, ranks: tuple[int, ...], size: int) -> list[np.ndarray] | None:
    """The compiled filter's :func:`_ranks` (None where it refuses the input: a NaN)."""
    assert _rolling is not None
    rank = _rolling.rank
    if not (v.dtype == np.float64 and v.ndim == 1 and v.flags.c_contiguous and len(v)):
        return None
    if not all(0 <= r < size for r in ranks):
        return None
    n = len(v)
    outs = [_fresh(n) for _ in ranks]
    try:
        in_parts(n, _SPLIT_MIN, lambda a, b: rank(v, int(size), ranks, outs, a, b))
    except ValueError:  # a NaN: scipy's filter takes it
        return None
    return outs


def _scipy_rank(v: np.ndarray, rank: int, size: int) -> np.ndarray:
    """:func:`_rank` by scipy.ndimage's filter, through the extension it calls for a 1-D
    array. Only where ndimage itself calls it: 0 < rank < size - 1 (ndimage takes the
    minimum and maximum filters for the ends) and at least ``size`` points (the extension
    reads out of bounds on a shorter array; ndimage's own limit is about half that)."""
    fn = _rank_filter_1d()
    fits = 0 < rank < size - 1 and len(v) >= size
    if fn is not None and fits and v.dtype == np.float64 and v.ndim == 1 and v.flags.c_contiguous:
        out = _fresh(len(v))
        try:
            fn(v, int(rank), int(size), out, _NEAREST, np.float64(0.0), 0)
        except (TypeError, ValueError, RuntimeError):  # another signature: ndimage's own call
            pass
        else:
            return out
    from scipy import ndimage

    return ndimage.rank_filter(v, rank=rank, size=size, mode="nearest")


def _midpoint(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """polars' median of two middle values, ``lo + (hi - lo) * 0.5``, in ``hi``'s memory: the
    same three roundings (an IEEE sum does not depend on the order of its terms), without two
    temporaries of the series' length."""
    np.subtract(hi, lo, out=hi)
    hi *= 0.5
    hi += lo
    return hi


def _median3(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """The middle one of three values, element by element (a new array)."""
    lo, hi = np.minimum(x, y), np.maximum(x, y)
    np.minimum(hi, z, out=hi)
    return np.maximum(lo, hi, out=lo)


def _small_median(v: np.ndarray, w: int) -> np.ndarray:
    """The median of each centred window of 3 or 5 points, at the interior positions (the
    first and last ``w // 2`` hold no meaning), by comparisons on whole arrays: a third of the
    rank filter's time. Each minimum and maximum is one of the values, so the median is the
    value the rank filter selects (no NaN and no -0.0 here: :func:`selectable`)."""
    n, h = len(v), w // 2
    out = _fresh(n)
    out[:h] = out[n - h :] = 0.0
    if w == 3:
        out[1:-1] = _median3(v[:-2], v[1:-1], v[2:])
        return out
    a, b, c, d, e = (v[k : n - 4 + k] for k in range(5))
    # Of a, b, c and d, the smallest (the lower of the pairs' minima) and the largest lie on
    # either side of the median of five: it is the median of the other two and e.
    mid_lo = np.maximum(np.minimum(a, b), np.minimum(c, d))
    mid_hi = np.minimum(np.maximum(a, b), np.maximum(c, d))
    out[h:-h] = _median3(mid_lo, mid_hi, e)
    return out


def _polars_centered(v: np.ndarray, window: int) -> np.ndarray:
    out = pl.Series(v).rolling_median(window, min_samples=1, center=True)
    return out.to_numpy().astype(float)


def centered_median(values: np.ndarray, window: int) -> np.ndarray:
    """polars' centred rolling median with ``min_samples=1`` (see the module text)."""
    v = np.ascontiguousarray(values, dtype=float)
    n = len(v)
    w = int(window)  # as given: a window longer than the series is polars' business
    if not _fast(n, w) or not selectable(v):
        return _polars_centered(v, w) if n else v.copy()
    h = w // 2
    if w in (3, 5):
        out = _small_median(v, w)
    elif w % 2:
        out = _rank(v, h, w)
    else:
        lo, hi = _ranks(v, (h - 1, h), w)
        out = _midpoint(lo, hi)
    # Full windows are i - h >= 0 and i - h + w <= n; the rest are shrunk: polars on the ends
    # (each end's windows reach at most 2w points in).
    first_full, last_full = h, n - w + h
    head = _polars_centered(v[: 2 * w], w)
    out[:first_full] = head[:first_full]
    tail = _polars_centered(v[n - 2 * w :], w)
    k = n - 1 - last_full  # shrunk positions at the end
    if k:
        out[n - k :] = tail[len(tail) - k :]
    return out


def polars_trailing_median(values: np.ndarray, window: int, min_samples: int) -> np.ndarray:
    """``pl.Series(v).rolling_median(window, min_samples=min_samples)`` (window ``[i - w + 1,
    i]``) as floats, NaN where polars gives null."""
    v = np.ascontiguousarray(values, dtype=float)
    n = len(v)
    w, m = int(window), int(min_samples)

    def lib(x: np.ndarray) -> np.ndarray:
        r = pl.Series(x).rolling_median(w, min_samples=m)
        return r.to_numpy().astype(float)

    if not _fast(n, w) or not 1 <= m <= w or not selectable(v):
        return lib(v) if n else v.copy()
    h = w // 2
    if w % 2:
        mid = _rank(v, h, w)
    else:
        lo, hi = _ranks(v, (h - 1, h), w)
        mid = _midpoint(lo, hi)
        del lo
    out = _fresh(n)
    # The full window ending at i starts at i - w + 1: the centred window at j = i - w + 1 + h.
    out[w - 1 :] = mid[h : n - w + 1 + h]
    out[: w - 1] = lib(v[: 2 * w])[: w - 1]  # the first windows are short
    return out


def window_max(values: np.ndarray, start: int, window: int) -> np.ndarray:
    """The largest of ``values[i + start : i + start + window]`` (cut to the series) at each
    i, -inf where that is empty: an upper bound of any median of the same window.

    By doubling, on the series padded with -inf: the maxima of spans of 2, 4, 8... points,
    then each window as two overlapping spans (log2(window) passes over the series, not a
    window's worth of comparisons per point). A maximum is one of the values: exact for any
    input without NaN."""
    v = np.asarray(values, dtype=float)
    n, w = len(v), int(window)
    if n == 0 or w < 1:
        return np.full(n, -np.inf)
    if not -w <= start <= 0:
        raise ValueError("the window must contain or border its point (-window <= start <= 0)")
    # Padded by w on each side: point i's window is padded[i + start + w :][:w].
    span = np.full(n + 2 * w, -np.inf)
    span[w : w + n] = v
    width = 1  # span[j] is the largest of padded[j : j + width]
    while 2 * width <= w:
        span = np.maximum(span[:-width], span[width:])
        width *= 2
    first = start + w
    last = first + w - width  # the window's last span, overlapping the first
    return np.maximum(span[first : first + n], span[last : last + n])


def centered_median_at(values: np.ndarray, window: int, idx: np.ndarray) -> np.ndarray:
    """``centered_median(values, window)[idx]``, computed at those points only: each full
    window's order statistics selected by a partition (the values the rank filter selects),
    the ends as :func:`centered_median` takes them. Worth it for a few points (the whole
    series is computed where they are many)."""
    v = np.ascontiguousarray(values, dtype=float)
    n, w = len(v), int(window)
    idx = np.asarray(idx, dtype=np.int64)
    if not _pick_points(n, w, len(idx)) or not selectable(v):
        return centered_median(v, w)[idx]
    h = w // 2
    out = np.empty(len(idx))
    full = (idx >= h) & (idx <= n - w + h)
    out[full] = _select_medians(v, idx[full] - h, w)
    head, tail = idx < h, idx > n - w + h
    if head.any():
        out[head] = _polars_centered(v[: 2 * w], w)[idx[head]]
    if tail.any():
        out[tail] = _polars_centered(v[n - 2 * w :], w)[idx[tail] - (n - 2 * w)]
    return out


def polars_trailing_median_at(
    values: np.ndarray, window: int, min_samples: int, idx: np.ndarray
) -> np.ndarray:
    """``polars_trailing_median(values, window, min_samples)[idx]``, computed at those points
    only (as :func:`centered_median_at`)."""
    v = np.ascontiguousarray(values, dtype=float)
    n, w, m = len(v), int(window), int(min_samples)
    idx = np.asarray(idx, dtype=np.int64)
    if not _pick_points(n, w, len(idx)) or not 1 <= m <= w or not selectable(v):
        return polars_trailing_median(v, w, m)[idx]
    out = np.empty(len(idx))
    full = idx >= w - 1
    out[full] = _select_medians(v, idx[full] - (w - 1), w)
    if not full.all():  # the first, short windows: polars' own (as polars_trailing_median)
        first = pl.Series(v[: 2 * w]).rolling_median(w, min_samples=m)
        out[~full] = first.to_numpy().astype(float)[idx[~full]]
    return out


def _pick_points(n: int, w: int, k: int) -> bool:
    """Whether ``k`` points of a series of ``n`` are worth selecting one by one (a partition of
    a window of w costs about what the rank filter's pass costs over w / 2 points) and the
    series is long enough for the ends' slices (otherwise the whole series is computed)."""
    return n >= 4 * w and w >= 2 and k * max(w, 10) <= 2 * n


_SELECT_BLOCK = 1 << 18  # window values gathered at a time by _select_medians


def _select_medians(v: np.ndarray, starts: np.ndarray, w: int) -> np.ndarray:
    """polars' median of each full window ``v[s : s + w]`` (as the rank filter's path forms
    it: the middle value, or ``lo + (hi - lo) * 0.5`` of the two middle values)."""
    h = w // 2
    out = np.empty(len(starts))
    rows_at_once = max(1, _SELECT_BLOCK // w)
    for a in range(0, len(starts), rows_at_once):
        rows = v[starts[a : a + rows_at_once, None] + np.arange(w)]
        if w % 2:
            out[a : a + len(rows)] = np.partition(rows, h, axis=1)[:, h]
        else:
            part = np.partition(rows, (h - 1, h), axis=1)
            out[a : a + len(rows)] = _midpoint(part[:, h - 1], part[:, h].copy())
    return out


def trailing_median(values: np.ndarray, window: int) -> np.ndarray:
    """``np.median`` of the ``window`` values before each index (0 where none precede)."""
    v = np.ascontiguousarray(values, dtype=float)
    n = len(v)
    w = int(window)
    out = np.zeros(n)
    fast = w >= 1 and _fast(n, max(w, 2)) and selectable(v)
    # Expanding windows at the start (and everything on the slow path): numpy's own median.
    for i in range(1, n if not fast else min(n, w + 1)):
        out[i] = float(np.median(v[max(0, i - w) : i]))
    if not fast:
        return out
    # Full windows v[i - w : i] for i > w: the centred window at j starts at j - w // 2.
    shift = w - w // 2
    h = w // 2
    if w % 2:
        mid = _rank(v, h, w)
        out[w + 1 :] = mid[w + 1 - shift : n - shift]
    else:
        lo, hi = _ranks(v, (h - 1, h), w)
        out[w + 1 :] = ((lo + hi) / 2)[w + 1 - shift : n - shift]
    return out


__all__ = [
    "centered_median",
    "centered_median_at",
    "polars_trailing_median",
    "polars_trailing_median_at",
    "trailing_median",
    "window_max",
]
