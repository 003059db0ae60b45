"""Compact, exact encodings for the run cache's large entries (see :mod:`forensics.cache`).

A run whose plain arrays would crowd the cache (a 10M-step run: 2.3 GB of them) used to be
kept as one lz4 Parquet file, and reading it back meant decoding every column into new
memory (3.3 s against 0.6 s for mapped arrays). Most of those bytes say little: the steps of
a series climb by a fixed stride, a record index by one or a few, values that a writer
stored as 32-bit floats (TensorBoard's scalars) sit in 64-bit columns, and the tag, metric
and layer columns name one tag between them. These encodings keep such columns in a
fraction of the bytes and rebuild them in one or two passes over memory, far cheaper than a
decompression:

- ``ramps``: a column made of arithmetic runs (a series' steps) as its runs' start rows,
  first values and strides; rebuilt by filling each run.
- ``deltas``: an integer column whose neighbours differ by little (a record index) as
  one- or two-byte differences, the few larger jumps kept aside; rebuilt by a running sum.
- ``float32``: a float64 column every value of which is a float32, bit for bit (NaN
  payloads and -0.0 included), kept as float32; rebuilt by one widening cast.
- joint codes: several columns of few values (tag, metric, layer) coded together, one code
  a row for all of them (:func:`joint_codes`).

Every encoder returns None when it cannot give the column back exactly; the cache then keeps
the column as it is. The encoders walk long columns in blocks, so no whole-length temporary
is made beside the frame.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import polars as pl

_BLOCK = 1 << 20  # rows an encoder reads at a time


def _blocks(n: int) -> range:
    return range(0, n, _BLOCK)


# -- float32 ------------------------------------------------------------------------------------
def as_float32(a: np.ndarray) -> np.ndarray | None:
    """``a`` (float64) as float32 when widening gives back every bit, else None."""
    if a.dtype != np.float64:
        return None
    out = np.empty(len(a), dtype=np.float32)
    for i in _blocks(len(a)):
        blk = a[i : i + _BLOCK]
        narrow = blk.astype(np.float32)
        if not np.array_equal(narrow.astype(np.float64).view(np.int64), blk.view(np.int64)):
            return None
        out[i : i + _BLOCK] = narrow
    return out


def from_float32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64)


# -- ramps --------------------------------------------------------------------------------------
def ramps(a: np.ndarray, limit: int) -> np.ndarray | None:
    """The arithmetic runs of an integer column as rows ``(start_row, first_value, stride)``
    (int64), at most ``limit`` of them, else None. A run starts at row 0 and wherever the
    difference to the next row changes; its stride is that difference (0 for a last row)."""
    n = len(a)
    if n == 0 or a.dtype.kind not in "iu" or not _fits_int64_differences(a):
        return None
    starts: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
    count = 1
    prev: int | None = None  # the last difference of the previous block
    for i in _blocks(n - 1):
        d = np.diff(a[i : i + _BLOCK + 1].astype(np.int64))
        change = np.flatnonzero(d[1:] != d[:-1]) + 1
        if prev is not None and len(d) and d[0] != prev:
            change = np.concatenate(([0], change))
        count += len(change)
        if count > limit:
            return None
        starts.append(change.astype(np.int64) + i)
        prev = int(d[-1]) if len(d) else prev
    first = np.concatenate(starts)
    values = a[first].astype(np.int64)
    nxt = np.minimum(first + 1, n - 1)
    strides = np.where(first + 1 < n, a[nxt].astype(np.int64) - values, 0)
    return np.stack([first, values, strides], axis=1)


def from_ramps(pieces: np.ndarray, n: int, dtype: np.dtype) -> np.ndarray:
    out = np.empty(n, dtype=dtype)
    ends = list(pieces[1:, 0]) + [n]
    for (start, value, stride), end in zip(pieces.tolist(), ends, strict=True):
        if stride == 0:
            out[start:end] = value
        else:
            out[start:end] = np.arange(value, value + stride * (end - start), stride)
    return out


# -- deltas -------------------------------------------------------------------------------------
def deltas(
    a: np.ndarray, limit: int, width: type[np.signedinteger] = np.int8
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """An integer column as differences to the row before, of type ``width`` (int8 or
    int16), and the rows where the difference does not fit it with their values: the column
    in stretches, each starting at such a row (or row 0) and holding 0 there; at most
    ``limit`` stretch starts past row 0, else None. The rebuild sums each stretch from its
    first value in the column's own type, so any two values' difference must fit that type
    (a record index of a 10M-step run: 73M apart at most, where one running sum over all
    stretches would have passed int32)."""
    n = len(a)
    if n == 0 or a.dtype.kind not in "iu" or np.dtype(width).itemsize >= a.dtype.itemsize:
        return None  # (not integers, or no smaller than the column itself)
    info, lim = np.iinfo(a.dtype), np.iinfo(width)
    lo, hi = int(a.min()), int(a.max())
    if lo < -(1 << 62) or hi >= 1 << 62 or hi - lo > info.max:
        return None
    small = np.empty(n, dtype=width)
    small[0] = 0
    rows: list[np.ndarray] = []
    count = 0
    for i in _blocks(n - 1):
        d = np.diff(a[i : i + _BLOCK + 1].astype(np.int64))
        at = np.flatnonzero((d < lim.min) | (d > lim.max))
        count += len(at)
        if count > limit:
            return None
        rows.append(at.astype(np.int64) + i + 1)
        d[at] = 0
        small[i + 1 : i + 1 + len(d)] = d
    starts = np.concatenate(rows)
    return small, starts, a[starts].astype(np.int64)


def from_deltas(
    small: np.ndarray, rows: np.ndarray, firsts: np.ndarray, first: int, dtype: np.dtype
) -> np.ndarray:
    """The column :func:`deltas` encoded: each stretch's running sum from its first value
    (``first`` for the one at row 0, ``firsts`` for those at ``rows``)."""
    out = np.empty(len(small), dtype=dtype)
    bounds = [0, *rows.tolist(), len(small)]
    starts = [first, *firsts.tolist()]
    for k in range(len(bounds) - 1):
        seg = out[bounds[k] : bounds[k + 1]]
        np.cumsum(small[bounds[k] : bounds[k + 1]], dtype=dtype, out=seg)
        if starts[k]:
            seg += starts[k]
    return out


def _fits_int64_differences(a: np.ndarray) -> bool:
    lo, hi = int(a.min()), int(a.max())
    return -(1 << 62) <= lo and hi < (1 << 62)


# -- joint codes --------------------------------------------------------------------------------
def joint_codes(
    coded: dict[str, tuple[pl.Series, np.ndarray]], max_codes: int
) -> tuple[np.ndarray, dict[str, pl.Series]] | None:
    """Columns each given as its distinct values and a code a row (``forensics.cache``'s
    ``_coded``), coded together: one code a row (uint8 or uint16) and each column's value for
    every joint code, so that ``values[name].gather(codes)`` is the column again. None when
    the columns take more than ``max_codes`` combinations (or too many to count by table)."""
    import polars as pl

    names = list(coded)
    sizes = [len(coded[c][0]) for c in names]
    space = int(np.prod(sizes, dtype=np.int64)) if sizes else 0
    n = len(coded[names[0]][1]) if names else 0
    if not names or space > (1 << 22):
        return None
    # A row's key is its codes read as digits of mixed radix; a table from key to joint code.
    table = np.full(space, -1, dtype=np.int64)
    seen: list[np.ndarray] = []
    total = 0
    out = np.empty(n, dtype=np.uint16)
    for i in _blocks(n):
        key = np.zeros(min(_BLOCK, n - i), dtype=np.int64)
        for c, size in zip(names, sizes, strict=True):
            key *= size
            key += coded[c][1][i : i + _BLOCK]
        new = np.unique(key[table[key] < 0])  # (sorted; first seen order is not needed)
        if len(new):
            table[new] = np.arange(total, total + len(new))
            total += len(new)
            seen.append(new)
            if total > max_codes:
                return None
        out[i : i + len(key)] = table[key]
    keys = np.concatenate(seen) if seen else np.zeros(0, dtype=np.int64)
    values: dict[str, pl.Series] = {}
    for c, size in reversed(list(zip(names, sizes, strict=True))):
        own = keys % size
        keys = keys // size
        values[c] = coded[c][0].gather(pl.Series(own))
    codes = out.astype(np.uint8) if total <= 256 else out
    return codes, {c: values[c] for c in names}
