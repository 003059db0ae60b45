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

Inputs with NaN, Inf or a negative zero (whose sign a selection may or may not keep) and
short inputs take the library's own path, so the result is always the library's.

The rank filter is scipy.ndimage's 1-D one, ``ndimage.rank_filter`` of a 1-D float64 array
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
import os
import sys
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import polars as pl

# Below this many points the library's path is as fast: no need for the rank filter.
_MIN_FAST = 512
# Importing scipy.ndimage costs about 0.35 s of CPU once: worth it from series this long (a
# dozen rolling medians of 50k points cost that much more with polars), or when it is loaded
# (only where the extension cannot be loaded on its own: _rank_filter_1d).
_IMPORT_PAYS = 50_000
_NEAREST = 0  # scipy.ndimage's code of mode="nearest" (_ni_support._extend_mode_to_code)


def _fast(n: int, w: int) -> bool:
    """Whether the rank filter is worth it for ``n`` points at window ``w``."""
    if n < _MIN_FAST or w < 2 or n < 4 * w:
        return False
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


def _rank(v: np.ndarray, rank: int, size: int) -> np.ndarray:
    """The ``rank``-th smallest of window ``[i - size // 2, i - size // 2 + size)`` at each i
    (only interior positions are meaningful): ``ndimage.rank_filter(v, rank=rank, size=size,
    mode="nearest")`` of a contiguous float64 array, through the extension it calls for a 1-D
    array. Only where ndimage itself calls it: 0 < rank < size - 1 (ndimage takes the
    minimum and maximum filters for the ends) and at least ``size`` points (the extension
    reads out of bounds on a shorter array; ndimage's own limit is about half that)."""
    fn = _rank_filter_1d()
    fits = 0 < rank < size - 1 and len(v) >= size
    if fn is not None and fits and v.dtype == np.float64 and v.ndim == 1 and v.flags.c_contiguous:
        out = np.empty_like(v)
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


def _polars_centered(v: np.ndarray, window: int) -> np.ndarray:
    out = pl.Series(v).rolling_median(window, min_samples=1, center=True)
    return out.to_numpy().astype(float)


def full_window_medians(values: np.ndarray, window: int) -> np.ndarray | None:
    """polars' median of every full window of ``window`` points, stored at the window's
    centre: position i holds the median of ``[i - w // 2, i - w // 2 + w)`` (positions whose
    window is not full hold no meaning). None where :func:`centered_median` and
    :func:`polars_trailing_median` take the library's path (a short or unselectable series).

    Both functions read their full windows from this array, so one computation serves a
    centred and a trailing median of the same series and window (their ``full`` argument)."""
    v = np.ascontiguousarray(values, dtype=float)
    w = int(window)
    if not _fast(len(v), w) or not selectable(v):
        return None
    return _full(v, w)


def _full(v: np.ndarray, w: int) -> np.ndarray:
    """:func:`full_window_medians` of a series on the fast path (a new array)."""
    h = w // 2
    if w % 2:
        return _rank(v, h, w)
    lo, hi = _rank(v, h - 1, w), _rank(v, h, w)
    return _midpoint(lo, hi)


def centered_median(
    values: np.ndarray, window: int, *, full: np.ndarray | None = None
) -> np.ndarray:
    """polars' centred rolling median with ``min_samples=1`` (see the module text).
    ``full``: :func:`full_window_medians` of the same values and window, if already known
    (read, not written)."""
    v = np.ascontiguousarray(values, dtype=float)
    n = len(v)
    w = int(window)  # as given: a window longer than the series is polars' business
    if not _fast(n, w) or not selectable(v):
        return _polars_centered(v, w) if n else v.copy()
    h = w // 2
    out = _full(v, w) if full is None else full.copy()
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


def polars_trailing_median(
    values: np.ndarray, window: int, min_samples: int, *, full: np.ndarray | None = None
) -> np.ndarray:
    """``pl.Series(v).rolling_median(window, min_samples=min_samples)`` (window ``[i - w + 1,
    i]``) as floats, NaN where polars gives null. ``full``: :func:`full_window_medians` of the
    same values and window, if already known (read, not written)."""
    v = np.ascontiguousarray(values, dtype=float)
    n = len(v)
    w, m = int(window), int(min_samples)

    def lib(x: np.ndarray) -> np.ndarray:
        r = pl.Series(x).rolling_median(w, min_samples=m)
        return r.to_numpy().astype(float)

    if not _fast(n, w) or not 1 <= m <= w or not selectable(v):
        return lib(v) if n else v.copy()
    h = w // 2
    mid = _full(v, w) if full is None else full
    out = np.empty(n)
    # The full window ending at i starts at i - w + 1: the centred window at j = i - w + 1 + h.
    out[w - 1 :] = mid[h : n - w + 1 + h]
    out[: w - 1] = lib(v[: 2 * w])[: w - 1]  # the first windows are short
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
        lo, hi = _rank(v, h - 1, w), _rank(v, h, w)
        out[w + 1 :] = ((lo + hi) / 2)[w + 1 - shift : n - shift]
    return out


__all__ = [
    "centered_median",
    "full_window_medians",
    "polars_trailing_median",
    "trailing_median",
]
