"""The JSONL reader's engine: lines in blocks, each line read by polars' JSON reader when
it is plain, by the per-line reader (:func:`forensics.importers.jsonl.line_rows`) otherwise,
with the same rows either way.

Polars is given a schema (the keys seen so far; a sample of the first lines starts it), so
it ignores keys it does not know; what it read must therefore be checked against the text.
The check counts strings: every key is a string, so a line's double quotes are at least
twice the values polars read from it, and exactly twice only when every string in the line
is a key whose value polars read (an escaped quote only adds quotes). A key polars did not
know, a string value, a nested object or a duplicate key leaves a string over. A null is
replaced by a stand-in number before the read (and made null again after), so that its key
counts too, from the first block whose count a null broke on; a block where a value equals
the stand-in goes the slow way.

* A block whose every line is blank or a flat object of numbers (a metrics log's lines; a
  metric may be NaN or +-Infinity, as Python's json module writes a diverged loss, and any
  value null, as pandas writes a sparse history: no row) is read by the compiled kernel
  where it is built (``_jsonl.c``, :meth:`Parser._flat`): each key's rows as the line is
  read, the numbers bit for bit those polars and the per-line reader give. The kernel
  leaves any other block whole to the paths below.
* A block is first tried whole (:meth:`Parser._plain`): one polars read and a few
  byte counts. Lines with strings over teach the schema their plain keys and the block is
  read again.
* A block whose lines differ in shape (a metrics log adds its per-layer norms every 50
  lines) is read in groups (:meth:`BlockReader._read_split`): lines with the same number of
  double quotes, each group with only the keys its first line shows, since polars' cost
  grows with the schema's width; the count is checked group by group, and a group it fails
  is read again with the whole schema (else the block is read whole).
* Otherwise line by line where needed (:meth:`Parser.parse`): lines that are not
  ``{...}`` or hold a backslash, ``NaN``, ``Infinity`` or ``null`` go to the per-line
  reader; polars reads the others, a piece it refuses is halved until the refused lines are
  found, and lines with strings over go to the per-line reader too.
* Lines whose step no trainer logs (beyond 2**62) go to the per-line reader, which reports
  them.

Rows come out line by line; within a line, keys in the order the file first showed them (the
first line holding a value for the key, then its place in that line). Both readers follow
that order, so a file gives the same rows whichever reader took each line. Asked for
(``by_series``: the importer's read for analysis), the rows come series after series
instead, keys in that same order, each key's rows in line order: the analysis view's layout,
so that building the view moves no row. A column polars read is one key's rows already, so
the block's rows are laid out so as they are made (no extra pass), and the blocks are joined
key by key when the importer makes the frame one chunk a column (a copy made either way). It
is done only while the lines show no restart (:class:`_Calm`); a file with one keeps line
order, as the segmentation reads it.

A file's blocks go through three threads (:meth:`BlockReader.feed_all`): one reads a block
and finds its lines (:func:`prepare`), one parses the block before it (:class:`Parser`:
polars' reads and the schema they teach), and the caller's makes the rows of the block before
that. Polars, numpy and the kernel let go of the GIL while they work, so on two cores the reads
overlap the Python work on the rows (when the threads came, before the kernel, an export of a
1M-step log took 3.6-3.9 s instead of 4.4-4.8).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import polars as pl

from forensics.allocator import trim

try:  # the compiled reading of plain blocks (optional: polars reads them without it)
    from forensics.importers import _jsonl
except ImportError:  # pragma: no cover - built wherever a C compiler is
    _jsonl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from forensics.importers.jsonl import Lines

_ROWS = {
    "step": pl.Int64,
    "tag": pl.Categorical,
    "value": pl.Float64,
    "wall_time": pl.Float64,
    "record_idx": pl.Int64,
}
BLOCK = 8 << 20  # bytes of lines per polars read: bounds the wide frames held at once (three
# blocks are in flight in BlockReader.feed_all; 8 MiB costs 4% more CPU than 16 MiB, 4 MiB 20%)
_MIN_SPLIT = 64  # a refused piece of at most this many lines goes to the per-line reader
_SAMPLE = 200  # lines parsed in Python to start the schema
_LEARN = 50  # unaccounted lines looked at per pass to learn new keys
_PASSES = 64  # learning passes per file (each adds a key at least)
_MAX_GROUPS = 16  # line shapes (quotes a line) a block is split into at most
_MAX_SHAPES = 256  # line shapes a file may show before blocks are no longer split
# Tokens that send a line to the per-line reader wherever they appear.
_SLOW_TOKENS = (b"\\", b"NaN", b"Infinity", b"null")
_NULL = -5e-324  # stands in for null in a plain block (checked never to be a value there)
_NULL_TOKEN = b"-5e-324"
_STEP_LIMIT = 2.0**62
_SURROGATE = re.compile("[\ud800-\udfff]")  # a lone surrogate: no key polars can hold
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def blocks(data: bytes | memoryview, size: int | None = None) -> Iterator[memoryview]:
    """``data`` in pieces of whole lines of about ``size`` bytes (the last may be partial)."""
    size = size or BLOCK
    view = memoryview(data)
    n, i = len(view), 0
    while i < n:
        j = min(i + size, n)
        if j < n:
            k = bytes(view[j - 1 : min(j + (1 << 20), n)]).find(b"\n")
            while k < 0 and j < n:  # a line longer than the block: take it whole
                j = min(j + (1 << 20), n)
                k = bytes(view[j - 1 : min(j + (1 << 20), n)]).find(b"\n")
            j = n if k < 0 else j + k
        yield view[i:j]
        i = j


class Block:
    """A block of whole lines with what is known of it before any parsing (by
    :func:`prepare`): where each line starts and ends, and its number of double quotes
    (counted when first asked for: a block the compiled kernel reads never needs them)."""

    __slots__ = ("data", "starts", "ends", "_quotes")

    def __init__(self, data: bytes, starts: np.ndarray, ends: np.ndarray) -> None:
        self.data, self.starts, self.ends = data, starts, ends
        self._quotes: np.ndarray | None = None

    @property
    def quotes(self) -> np.ndarray:
        if self._quotes is None:
            quote_at = np.flatnonzero(np.frombuffer(self.data, dtype=np.uint8) == 34)
            self._quotes = np.diff(np.searchsorted(quote_at, self.ends), prepend=0)
        return self._quotes


def prepare(block: bytes | memoryview) -> Block:
    """A block's line bounds (and, without the compiled kernel, its quotes a line): numpy's
    work, which needs no reader state."""
    data = bytes(block)
    out = Block(data, *_line_bounds(data))
    if _jsonl is None:
        out.quotes  # noqa: B018 - counted here, in the thread that prepares blocks
    return out


class Flat(NamedTuple):
    """A block whose every line is blank or a flat object of numbers, as the compiled kernel
    (``_jsonl.c``) read it: each metric key's rows (keys in the order the block first shows
    them, each key's rows in line order), and each line's step and time as the other paths
    take them (NaN: none)."""

    objects: int  # lines that are not blank
    keys: list[str]  # metric keys (not SKIP_KEYS)
    counts: np.ndarray  # rows a key
    lines: np.ndarray  # the block line of each row (int64), key after key
    values: np.ndarray  # float64, key after key
    step: np.ndarray  # per line
    clock: np.ndarray  # per line


class Parsed(NamedTuple):
    """A block as the parser left it: its lines' bounds, polars' pieces (line indices,
    frame) and the lines left to the per-line reader; or the kernel's reading of it."""

    data: bytes
    starts: np.ndarray
    ends: np.ndarray
    got: list[tuple[np.ndarray, pl.DataFrame]]
    slow: np.ndarray
    flat: Flat | None = None


class Parser:
    """The parsing half of the reader: which lines polars reads, with which keys. Its state
    (the schema, line shapes, nulls, learning passes) depends on the blocks parsed before,
    never on the rows made of them, so the next block can be parsed while the rows of this
    one are made (:meth:`BlockReader.feed_all`)."""

    def __init__(self, fast: bool = True) -> None:
        self.fast = fast
        self.schema: dict[str, pl.DataType] = {}
        self._passes = 0
        self._nulls = False  # a block held "null": look for it in every block from then on
        self._shapes: dict[int, list[str] | None] = {}  # quotes a line -> its keys (None: all)
        self._split_failures = 0

    def copy(self) -> Parser:
        other = copy.copy(self)
        other.schema = dict(self.schema)
        other._shapes = dict(self._shapes)  # (a shape's list is replaced, never changed)
        return other

    def parse(self, block: bytes | memoryview | Block) -> Parsed | None:
        """A block's lines split between polars and the per-line reader (None: no bytes)."""
        if not isinstance(block, Block):
            block = prepare(block)
        if not block.data:
            return None
        if self.fast and _jsonl is not None and (flat := self._flat(block)) is not None:
            return Parsed(block.data, block.starts, block.ends, [], _NO_ROWS, flat)
        if self.fast and (whole := self._plain(block)) is not None:
            return whole
        data, starts, ends = block.data, block.starts, block.ends
        arr = np.frombuffer(data, dtype=np.uint8)
        nonempty = ends > starts
        plain = np.zeros(len(ends), dtype=bool)
        ne = np.flatnonzero(nonempty)
        plain[ne] = (arr[starts[ne]] == 123) & (arr[ends[ne] - 1] == 125)  # { ... }
        for tok in _SLOW_TOKENS:
            at = data.find(tok)
            if at < 0:
                continue
            hits = []
            while at >= 0:
                hits.append(at)
                at = data.find(tok, at + len(tok))
            plain[np.searchsorted(ends, np.asarray(hits), side="left")] = False
        if not self.fast:
            plain[:] = False
        fast = np.flatnonzero(plain)
        slow = np.flatnonzero(nonempty & ~plain)
        got, refused = self._read_fast(data, starts, ends, fast)
        slow_idx = np.union1d(slow, refused) if len(refused) else slow
        return Parsed(data, starts, ends, got, slow_idx)

    def _flat(self, block: Block) -> Flat | None:
        """The block read by the compiled kernel when every line is blank or a flat object of
        numbers (see ``_jsonl.c``): the values those are read as by polars and by the
        per-line reader alike. None for any other block (and for steps no trainer logs, which
        the per-line reader reports)."""
        from forensics.importers.jsonl import SKIP_KEYS, STEP_KEYS, TIME_KEYS

        assert _jsonl is not None
        got = _jsonl.scan(block.data)
        if got is None or got[0] != len(block.ends):
            return None
        _, objects, keys, counts_b, lines_b, values_b = got
        counts = np.frombuffer(counts_b, dtype=np.int64)
        lines = np.frombuffer(lines_b, dtype=np.int32)
        values = np.frombuffer(values_b, dtype=np.float64)
        at = np.cumsum(counts) - counts
        where = {k: (int(a), int(a + c)) for k, a, c in zip(keys, at, counts, strict=True)}
        n = len(block.ends)
        # The step and time of each line by the polars path's own expressions, on the columns
        # of its step and time keys (NaN: none). One that is NaN or infinite (which the
        # per-line reader skips, or keeps as a NaN time) leaves the block to that reader; a
        # metric's NaN or infinity is a row, as there.
        kept: dict[str, pl.Series] = {}
        for k in (*STEP_KEYS, *TIME_KEYS, "_runtime"):
            if k not in where:
                continue
            a, b = where[k]
            if not np.isfinite(values[a:b]).all():
                return None
            col = np.full(n, np.nan)
            col[lines[a:b]] = values[a:b]
            kept[k] = pl.Series(k, col, nan_to_null=True)
        if kept:
            step, clock = _step_and_clock(pl.DataFrame(kept))
        else:
            step, clock = np.full(n, np.nan), np.full(n, np.nan)
        logged = step[~np.isnan(step)]
        if ((logged <= -_STEP_LIMIT) | (logged >= _STEP_LIMIT)).any():
            return None
        for k in keys:  # (known to polars too, should a later block need it)
            self.schema.setdefault(k, pl.Float64())
        metric = [k for k in keys if k not in SKIP_KEYS]
        if len(metric) == len(keys):
            kept_lines, kept_values, kept_counts = lines, values, counts
        else:
            spans = [where[k] for k in metric]
            kept_counts = np.asarray([b - a for a, b in spans], dtype=np.int64)
            kept_lines = np.concatenate([lines[a:b] for a, b in spans] or [lines[:0]])
            kept_values = np.concatenate([values[a:b] for a, b in spans] or [values[:0]])
        return Flat(
            objects,
            metric,
            kept_counts,
            kept_lines.astype(np.int64),
            kept_values,
            step,
            clock,
        )

    def _plain(self, block: Block) -> Parsed | None:
        """The common block, at the cost of one polars read and a few byte counts: every
        line one object polars reads whole with the schema known so far. None for anything
        else, which :meth:`parse` then takes line by line."""
        data = block.data
        if not self.schema:
            head = data.split(b"\n", _SAMPLE)[:_SAMPLE]
            self._learn([ln for ln in head if ln.strip()])
        # (a backslash first: one byte is found by memchr, two bytes cost a slower search)
        if not self.schema or (b"\\" in data and _ESCAPED_SURROGATE.search(data)):
            return None  # polars decodes a lone surrogate its own way (as NUL)
        # A null becomes a number polars reads (then null again), so that its key counts
        # among the values read: a duplicate key beside it then leaves a string over. The
        # text is searched for nulls only once a block needed it (a null's key is a string
        # over, so a block whose count holds has none).
        nulls = data.count(b"null") if self._nulls else 0
        src = data.replace(b"null", _NULL_TOKEN) if nulls else data
        starts, ends = block.starts, block.ends
        n = len(ends)
        # (the stand-in for null adds no quote and no line: each line's count holds for src)
        bounds = (starts, ends) if src is data else _line_bounds(src)
        pieces = self._read_split(src, *bounds, block.quotes)
        if pieces is None:
            quotes = int(block.quotes.sum())
            while True:
                df = self._polars(src, n)
                if df is None:
                    return None
                if quotes == 2 * _values(df):
                    break
                if not self._nulls and b"null" in data:  # read again with the stand-in
                    self._nulls = True
                    nulls = data.count(b"null")
                    src = data.replace(b"null", _NULL_TOKEN)
                    continue
                if not self._learn_unaccounted(data, df):  # new keys: read again, else give up
                    return None
            pieces = [(np.arange(n, dtype=np.int64), df)]
        if nulls:
            hits = 0
            for i, (part, df) in enumerate(pieces):
                floats = [c for c in df.columns if self.schema[c] == pl.Float64]
                hits += df.select(
                    pl.sum_horizontal((pl.col(c) == _NULL).sum() for c in floats)
                ).item()
                df = df.with_columns(
                    pl.when(pl.col(c) != _NULL).then(pl.col(c)).alias(c) for c in floats
                )
                pieces[i] = (part, df)
            if hits != nulls:  # a "null" inside a string, or a value equal to the stand-in
                return None
        if not all(self._steps_fit(df).all() for _, df in pieces):
            return None
        return Parsed(data, starts, ends, pieces, np.empty(0, dtype=np.int64))

    def _read_split(
        self, src: bytes, starts: np.ndarray, ends: np.ndarray, per_line: np.ndarray
    ) -> list[tuple[np.ndarray, pl.DataFrame]] | None:
        """A block's lines grouped by their number of double quotes, each group read by
        polars with only the keys its first line shows (polars' cost grows with the columns
        it is given: a 6-key line read with a 73-key schema costs 2.5 times as much), each
        group's count checked as the whole block's is. None (nothing learned but shapes) when
        a group's count fails, or when the groups would not save a third of the reading."""
        if self._split_failures > 2 or len(self._shapes) > _MAX_SHAPES:
            return None
        kinds, first, which, sizes = np.unique(
            per_line, return_index=True, return_inverse=True, return_counts=True
        )
        if len(kinds) < 2 or len(kinds) > _MAX_GROUPS or kinds[0] == 0:
            return None
        keys: list[list[str] | None] = []
        for k, i in zip(kinds.tolist(), first.tolist(), strict=True):
            if k not in self._shapes:
                self._shapes[k] = self._shape(src[starts[i] : ends[i]])
            keys.append(self._shapes[k])
        width = len(self.schema)
        cost = sum(
            int(m) * (width if g is None else len(g)) for m, g in zip(sizes, keys, strict=True)
        )
        if cost > 0.67 * len(ends) * width:
            return None
        out: list[tuple[np.ndarray, pl.DataFrame]] = []
        for j, (k, g) in enumerate(zip(kinds.tolist(), keys, strict=True)):
            idx = np.flatnonzero(which == j)
            piece = _gather(src, starts, ends, idx)
            for schema in ([{c: self.schema[c] for c in g}] if g is not None else []) + [None]:
                df = self._polars(piece, len(idx), schema)
                if df is not None and k * len(idx) == 2 * _values(df):
                    break
                df = None
            if df is None:
                self._split_failures += 1
                return None
            if schema is None:  # the first line's keys were not all: the whole schema
                self._shapes[k] = None
            out.append((idx, df))
        return out

    def _shape(self, line: bytes) -> list[str] | None:
        """The schema's keys in a line, in the schema's order (its new plain keys learned
        first); None when the line is no JSON object."""
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict):
            return None
        self._learn([line])
        return [k for k in self.schema if k in obj]

    def _learn_unaccounted(self, data: bytes, df: pl.DataFrame) -> bool:
        """Learn the keys of some lines of ``data`` (row i of ``df`` is line i) that hold
        more strings than values read; True if the schema grew."""
        arr = np.frombuffer(data, dtype=np.uint8)
        nl = np.flatnonzero(arr == 10)
        ends = nl if data.endswith(b"\n") else np.append(nl, len(data))
        starts = np.concatenate(([0], nl[: len(ends) - 1] + 1))
        quotes = np.bincount(np.searchsorted(nl, np.flatnonzero(arr == 34)), minlength=len(ends))
        values = df.select(pl.sum_horizontal(pl.all().is_not_null())).to_series().to_numpy()
        bad = np.flatnonzero(quotes[: len(ends)] != 2 * values)
        look = np.union1d(bad[: _LEARN // 2], bad[:: max(1, len(bad) // (_LEARN // 2))])
        return self._learn([data[starts[i] : ends[i]] for i in look], passes=True)

    def _steps_fit(self, df: pl.DataFrame) -> np.ndarray:
        """Per row: no step, or one a trainer logs (the per-line reader reports the others)."""
        step = _step_expr(dict(df.schema))
        if step is None:
            return np.ones(df.height, dtype=bool)
        s = df.select(step).to_series().to_numpy()
        with np.errstate(invalid="ignore"):
            return np.isnan(s) | ((-_STEP_LIMIT < s) & (s < _STEP_LIMIT))

    # -- polars ---------------------------------------------------------------------------
    def _read_fast(
        self, data: bytes, starts: np.ndarray, ends: np.ndarray, idx: np.ndarray
    ) -> tuple[list[tuple[np.ndarray, pl.DataFrame]], np.ndarray]:
        """(line indices, frame) pieces read by polars, and the indices it could not take."""
        if not len(idx):
            return [], idx
        if not self.schema:
            return [], idx
        got: list[tuple[np.ndarray, pl.DataFrame]] = []
        refused: list[np.ndarray] = []
        todo = [idx]
        while todo:
            part = todo.pop()
            piece = _gather(data, starts, ends, part)
            df = self._polars(piece, len(part))
            if df is None:
                if len(part) <= _MIN_SPLIT:
                    refused.append(part)
                else:
                    half = len(part) // 2
                    todo += [part[half:], part[:half]]
                continue
            ok, df, learned = self._accounted(piece, part, df, data, starts, ends)
            if learned:  # new keys: the same lines again with the larger schema
                todo.append(part)
                continue
            if not ok.all():
                refused.append(part[~ok])
                df = df.filter(pl.Series(ok))
                part = part[ok]
            if len(part):
                got.append((part, df))
        got.sort(key=lambda g: int(g[0][0]))
        return got, (np.concatenate(refused) if refused else np.empty(0, dtype=np.int64))

    def _polars(
        self, piece: bytes, n: int, schema: dict[str, pl.DataType] | None = None
    ) -> pl.DataFrame | None:
        try:
            df = pl.read_ndjson(piece, schema=schema or self.schema)
        except Exception:  # noqa: BLE001 - polars refuses what the per-line reader handles
            return None
        return df if df.height == n else None

    def _accounted(
        self,
        piece: bytes,
        part: np.ndarray,
        df: pl.DataFrame,
        data: bytes,
        starts: np.ndarray,
        ends: np.ndarray,
    ) -> tuple[np.ndarray, pl.DataFrame, bool]:
        """Which lines polars read whole (every string a key it read a value for); whether
        unaccounted lines taught the schema new keys (then nothing else is decided)."""
        ok = np.ones(len(part), dtype=bool)
        if piece.count(b'"') != 2 * sum(df.height - c.null_count() for c in df.get_columns()):
            values = df.select(pl.sum_horizontal(pl.all().is_not_null())).to_series()
            arr = np.frombuffer(piece, dtype=np.uint8)
            line_ends = np.flatnonzero(arr == 10)
            quotes = np.bincount(
                np.searchsorted(line_ends, np.flatnonzero(arr == 34)), minlength=len(part) + 1
            )[: len(part)]
            ok = quotes == 2 * values.to_numpy()
            if not ok.all():
                bad = part[~ok]
                look = np.union1d(bad[: _LEARN // 2], bad[:: max(1, len(bad) // (_LEARN // 2))])
                if self._learn([data[starts[i] : ends[i]] for i in look], passes=True):
                    return ok, df, True
        ok &= self._steps_fit(df)
        return ok, df, False

    def _learn(self, lines: list[bytes], passes: bool = False) -> bool:
        """Add the plain numeric keys of these lines to the schema; True if any was new."""
        if passes:
            self._passes += 1
            if self._passes > _PASSES:
                return False
        new = False
        for line in lines:
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if not isinstance(obj, dict):
                continue
            for k, v in obj.items():
                if k in self.schema or _SURROGATE.search(k):
                    continue
                if isinstance(v, bool):
                    self.schema[k] = pl.Boolean()
                elif v is None or isinstance(v, (int, float)):
                    self.schema[k] = pl.Float64()
                else:
                    continue
                new = True
        return new


class BlockReader:
    """Reads a file's lines block by block (:meth:`feed`, :meth:`feed_all`) into
    :class:`Lines` (:meth:`lines`).

    ``name`` labels the rows; lines are numbered from ``first_line``. ``fast=False`` sends
    every line to the per-line reader (the reference the tests hold polars' rows to).
    ``by_series``: the rows series after series when the lines show no restart
    (:attr:`Lines.by_series`): each block is laid out series after series until a step goes
    back; the blocks after that are read in line order, the ones before put back in it."""

    def __init__(
        self, name: str, first_line: int = 1, *, fast: bool = True, by_series: bool = False
    ) -> None:
        self.name = name
        self.by_series = by_series
        self.parser = Parser(fast)
        self.next_line = first_line
        self.tags: list[str] = []  # metric keys in row order
        self.rank: dict[str, int] = {}
        # Each block's rows: in line order (None), or series after series (tags in rank order,
        # each tag's rows in line order) with the rows of each tag rank.
        self.parts: list[tuple[pl.DataFrame, np.ndarray | None]] = []
        self.bad: list[int] = []
        self.unread: dict[str, list[int]] = {}  # key -> lines whose value was no number
        self.config: dict[str, Any] = {}
        self.relative_time = False
        self.cut = False
        self.fractional = 0  # lines whose step is not a whole number (read as the one below)
        self.fast_lines = 0
        self.slow_lines = 0
        self.calm = _Calm()

    # (the parser's state, as the tests look at it)
    schema = property(lambda self: self.parser.schema)
    _nulls = property(lambda self: self.parser._nulls)
    _shapes = property(lambda self: self.parser._shapes)
    _split_failures = property(lambda self: self.parser._split_failures)

    # -- blocks ---------------------------------------------------------------------------
    def feed(self, block: bytes | memoryview) -> None:
        self._commit(self.parser.parse(block))

    def feed_all(self, blocks: Iterable[bytes | memoryview]) -> None:
        """:meth:`feed` each block, in order, as a pipeline of three threads (polars and
        numpy let go of the GIL while they work): one takes block N+2 and finds its lines
        (:func:`prepare`), one parses block N+1, and this one makes block N's rows. Parsing
        N+1 needs the parser's state after N: the worker parses a copy of it, adopted here
        when the parse is done, so the state still changes block by block in the file's
        order, and the rows are those of feeding one block at a time."""
        source = iter(blocks)
        ahead = list(itertools.islice(source, 2))
        if len(ahead) < 2:  # one block (a tail's new lines): no threads
            for block in ahead:
                self.feed(block)
            return
        source = itertools.chain(ahead, source)
        del ahead

        def take() -> Block | None:
            block = next(source, None)
            return None if block is None else prepare(block)

        def parse(
            parser: Parser, taken: Future[Block | None]
        ) -> tuple[Parser, Parsed | None] | None:
            block = taken.result()
            if block is None:
                return None
            return parser, parser.parse(block)

        with (
            ThreadPoolExecutor(1, thread_name_prefix="jsonl-take") as takes,
            ThreadPoolExecutor(1, thread_name_prefix="jsonl-parse") as parses,
        ):
            job = parses.submit(parse, self.parser.copy(), takes.submit(take))
            taken = takes.submit(take)
            while (done := job.result()) is not None:
                self.parser, parsed = done
                job = parses.submit(parse, self.parser.copy(), taken)
                taken = takes.submit(take)
                self._commit(parsed)
                del done, parsed  # (not held while the next block is waited for)

    def _commit(self, parsed: Parsed | None) -> None:
        """A parsed block's rows; its lines numbered on from the previous block's."""
        if parsed is None:
            return
        data, starts, ends, got, slow, flat = parsed
        first = self.next_line
        self.next_line += len(ends)
        if flat is not None:
            self._emit_flat(flat, first)
        else:
            self._emit(data, starts, ends, first, got, slow)
        if not data.endswith(b"\n") and self.bad and self.bad[-1] == first + len(ends) - 1:
            self.cut = True

    # -- rows -----------------------------------------------------------------------------
    def _emit(
        self,
        data: bytes,
        starts: np.ndarray,
        ends: np.ndarray,
        first: int,
        got: list[tuple[np.ndarray, pl.DataFrame]],
        slow: np.ndarray,
    ) -> None:
        from forensics.importers.jsonl import SKIP_KEYS, line_rows

        # The per-line reader's rows for the lines polars did not take.
        srows: dict[str, list[Any]] = {"step": [], "tag": [], "value": [], "wall_time": []}
        srec: list[int] = []
        fractional: list[float] = []
        for i in slow:
            line = data[starts[i] : ends[i]].decode("utf-8", errors="replace")
            if line.endswith("\r"):
                line = line[:-1]
            if not line.strip():
                continue
            unread: list[str] = []
            got_line = line_rows(line, self.config, unread, fractional)
            if got_line is None:
                self.bad.append(first + int(i))
                continue
            for k in unread:
                self.unread.setdefault(k, []).append(first + int(i))
            step, wt, rows, relative = got_line
            self.relative_time = self.relative_time or relative
            for tag, value in rows:
                srows["step"].append(step)
                srows["tag"].append(tag)
                srows["value"].append(value)
                srows["wall_time"].append(wt)
                srec.append(first + int(i))
        self.slow_lines += len(slow)
        self.fractional += len(fractional)
        # New keys, in the order the lines show them: (first line, place in it).
        firsts: dict[str, tuple[int, int]] = {}
        for k, rec in zip(srows["tag"], srec, strict=True):
            if k not in self.rank and k not in firsts:
                firsts[k] = (rec, len(firsts))
        # (the place of a slow key: its row order within the line, which is the line's order)
        for part, df in got:
            self.fast_lines += len(part)
            cols = [c for c in df.columns if c not in SKIP_KEYS and c not in self.rank]
            if not cols:
                continue
            has = df.select(pl.col(c).is_not_null().any() for c in cols).row(0)
            cols = [c for c, h in zip(cols, has, strict=True) if h]
            if not cols:
                continue
            at = df.select(pl.col(c).is_not_null().arg_max() for c in cols).row(0)
            places: dict[int, dict[str, int]] = {}
            for c, r in zip(cols, at, strict=True):
                li = int(part[r])
                if li not in places:
                    obj = json.loads(data[starts[li] : ends[li]])
                    places[li] = {k: j for j, k in enumerate(obj)}
                rec = first + li
                old = firsts.get(c)
                key = (rec, places[li].get(c, 0))
                if old is None or key < old:
                    firsts[c] = key
        for k in sorted(firsts, key=firsts.__getitem__):
            self.rank[k] = len(self.tags)
            self.tags.append(k)
        tag_names = pl.Series("tag", self.tags, dtype=pl.Categorical)
        if self.by_series and not self.calm.steps_back:
            self._series_part(got, first, len(ends), tag_names, srows, srec)
            return
        frames = [self._fast_rows(got, first, tag_names)] if got else []
        if srec:
            sf = self._slow_frame(srows, srec)
            # within a line, keys in the file's order (a line may list them otherwise)
            sf = sf.sort("record_idx", "_rank", maintain_order=True).drop("_rank")
            frames.append(sf.with_columns(pl.col("tag").cast(pl.Categorical)))
        if not frames:
            return
        out = pl.concat(frames) if len(frames) > 1 else frames[0]
        if len(frames) > 1:
            out = out.sort("record_idx", maintain_order=True)
        self.parts.append((out, None))

    def _emit_flat(self, flat: Flat, first: int) -> None:
        """A block the kernel read: its rows as :meth:`_emit` makes them of the same lines
        (new keys ranked in the order the block first shows them, which is the order of
        their first line and their place in it)."""
        self.fast_lines += flat.objects
        for k in flat.keys:
            if k not in self.rank:
                self.rank[k] = len(self.tags)
                self.tags.append(k)
        n_lines = len(flat.step)
        step_s = self._whole(flat.step)
        per_line = (
            _no_lines(n_lines)
            if not flat.keys
            else (
                np.zeros(n_lines, dtype=bool),
                # (as step_s.fill_null(0): a step is a float within 2**62, cast by truncation)
                np.where(np.isnan(flat.step), 0.0, flat.step).astype(np.int64),
                np.isnan(flat.step),
                flat.clock,
            )
        )
        if flat.keys:
            ids = np.asarray([self.rank[k] for k in flat.keys], dtype=np.uint32)
            lines, values, counts = flat.lines, flat.values, flat.counts
            if (np.diff(ids.astype(np.int64)) < 0).any():  # keys in rank order (series order)
                order = np.argsort(ids, kind="stable")
                at = np.cumsum(flat.counts) - flat.counts
                spans = [(int(at[j]), int(at[j] + flat.counts[j])) for j in order]
                lines = np.concatenate([lines[a:b] for a, b in spans])
                values = np.concatenate([values[a:b] for a, b in spans])
                ids, counts = ids[order], counts[order]
            tag_ids = np.repeat(ids, counts)
            per_line[0][lines] = True
            tag_names = pl.Series("tag", self.tags, dtype=pl.Categorical)
            series = self.by_series and not self.calm.steps_back
            if not series:  # line by line, keys in rank order within a line (a stable sort;
                # numpy's, so that the rows stay in memory glibc gives back, as polars' do)
                order = np.argsort(lines, kind="stable")
                lines, values, tag_ids = lines[order], values[order], tag_ids[order]
            frame = _rows_frame(step_s, flat.clock, lines, tag_ids, values, first, tag_names)
            counts_by_tag = np.bincount(tag_ids, minlength=len(self.tags)) if series else None
            self.parts.append((frame, counts_by_tag))
        if self.by_series and not self.calm.steps_back:
            self.calm.follow(*per_line)

    def _slow_frame(self, srows: dict[str, list[Any]], srec: list[int]) -> pl.DataFrame:
        """The rows of the lines the slow reader parsed, with each tag's rank in the file's
        key order (``_rank``); tags as strings."""
        return pl.DataFrame(
            {**srows, "record_idx": srec},
            schema={
                "step": pl.Int64,
                "tag": pl.String,
                "value": pl.Float64,
                "wall_time": pl.Float64,
                "record_idx": pl.Int64,
            },
        ).with_columns(
            pl.col("tag").replace_strict(self.rank, return_dtype=pl.Int64).alias("_rank")
        )

    def _series_part(
        self,
        got: list[tuple[np.ndarray, pl.DataFrame]],
        first: int,
        n_lines: int,
        tag_names: pl.Series,
        srows: dict[str, list[Any]],
        srec: list[int],
    ) -> None:
        """A block's rows series after series (tags in key order, each tag's rows in line
        order), with the rows of each tag; its lines followed by :attr:`calm`."""
        fast = self._series_rows(got, first, tag_names, n_lines) if got else None
        per_line = fast[2:] if fast is not None else _no_lines(n_lines)
        if srec:
            sf = self._slow_frame(srows, srec).with_columns(pl.col("tag").cast(pl.Categorical))
            _add_slow_lines(per_line, sf, first)
            frames = [sf]
            if fast is not None:
                frames.insert(0, fast[0].with_columns(pl.Series("_rank", fast[1], pl.Int64)))
            # series after series (the file's key order), each in line order (a fast and a
            # slow line never share a line number)
            out = pl.concat(frames).sort("_rank", "record_idx")
            ranks = out.get_column("_rank").to_numpy()
            self.parts.append((out.drop("_rank"), np.bincount(ranks, minlength=len(self.tags))))
        elif fast is not None:
            frame, ids = fast[:2]
            self.parts.append((frame, np.bincount(ids, minlength=len(self.tags))))
        self.calm.follow(*per_line)

    def _whole(self, step: np.ndarray) -> pl.Series:
        """A block's steps as integers (null for none), its fractional ones counted."""
        self.fractional += _fractional(step)
        return pl.Series(step, nan_to_null=True).cast(pl.Int64)

    def _fast_rows(
        self, got: list[tuple[np.ndarray, pl.DataFrame]], first: int, tag_names: pl.Series
    ) -> pl.DataFrame:
        """The rows of polars' pieces (line indices, frame), line by line and within a line
        the columns in key order, as one frame.

        The columns of a piece with a value on every line (most of them, in a metrics log)
        are laid out as a regular matrix; only the lines holding a value of another column go
        through a NaN matrix (nulls come out as NaN, and no value polars reads is NaN). Each
        line's values go to the place its line has among all pieces' lines."""
        from forensics.importers.jsonl import SKIP_KEYS

        lines = max((int(part[-1]) + 1 for part, _ in got if len(part)), default=0)
        count = np.zeros(lines, dtype=np.int64)  # values per line
        step = np.full(lines, np.nan)  # per line; NaN for null (a step or time is never NaN)
        clock = np.full(lines, np.nan)
        # (lines, their values, their tag ids): one block for the lines whose values are
        # all in every-line columns (a matrix, a row a line), one for the others (a value
        # each, in line order)
        regular: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        ragged: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for part, df in got:
            schema = dict(df.schema)
            step[part], clock[part] = _step_and_clock(df)
            cols = sorted(
                (c for c in df.columns if c not in SKIP_KEYS and c in self.rank),
                key=self.rank.__getitem__,
            )
            if not cols:
                continue
            n = df.height
            # (columns picked by name, df[names]: no expression to build for each column)
            if any(isinstance(schema[c], pl.Boolean) for c in cols):
                wide = df.select(
                    pl.col(c).cast(pl.Float64) if isinstance(schema[c], pl.Boolean) else c
                    for c in cols
                )
            else:
                wide = df[cols]
            nulls = [x.null_count() for x in wide.get_columns()]
            ids = np.asarray([self.rank[c] for c in cols], dtype=np.uint32)
            full = [j for j, k in enumerate(nulls) if k == 0]
            some = [cols[j] for j, k in enumerate(nulls) if 0 < k < n]
            plain = np.arange(n)
            if some:
                at = np.flatnonzero(
                    wide.select(pl.any_horizontal(pl.col(some).is_not_null()))
                    .to_series()
                    .to_numpy()
                )
                keep = [j for j, k in enumerate(nulls) if k < n]
                sub = wide[[cols[j] for j in keep]][at].to_numpy()
                r, c = np.nonzero(~np.isnan(sub))
                count[part[at]] += np.bincount(r, minlength=len(at))
                ragged.append((part[at][r], sub[r, c], ids[keep][c]))
                plain = np.delete(plain, at)
            if full and len(plain):
                count[part[plain]] += len(full)
                m = (wide if len(full) == len(cols) else wide[[cols[j] for j in full]]).to_numpy()
                regular.append((part[plain], m[plain] if some else m, ids[full]))
        at_line = np.cumsum(count) - count  # where each line's values start
        total = int(count.sum())
        values = np.empty(total, dtype=np.float64)
        tag_ids = np.empty(total, dtype=np.uint32)
        line_of = np.empty(total, dtype=np.int64)
        for rows, mat, ids in regular:
            pos = (at_line[rows][:, None] + np.arange(len(ids))).ravel()
            values[pos] = mat.ravel()
            tag_ids[pos] = np.tile(ids, len(rows))
            line_of[pos] = np.repeat(rows, len(ids))
        for rows, vals, ids in ragged:  # rows: a line index per value, ascending
            start = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
            nth = np.arange(len(rows)) - np.repeat(start, np.diff(np.r_[start, len(rows)]))
            pos = at_line[rows] + nth
            values[pos] = vals
            tag_ids[pos] = ids
            line_of[pos] = rows
        return pl.DataFrame(
            {
                "step": _per_row(self._whole(step), line_of),
                "tag": tag_names.gather(pl.Series(tag_ids)),
                "value": values,
                "wall_time": _per_row(pl.Series(clock, nan_to_null=True), line_of),
                "record_idx": line_of + first,
            },
            schema=_ROWS,
        )

    def _series_rows(
        self,
        got: list[tuple[np.ndarray, pl.DataFrame]],
        first: int,
        tag_names: pl.Series,
        n_lines: int,
    ) -> tuple[pl.DataFrame, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """The rows of polars' pieces (line indices, frame) as one frame, series after
        series: tags in key order, each tag's rows in line order (a column of a piece is a
        run of one tag already: its values are taken as they are, no row is moved but where
        a tag's lines are spread over several pieces). Also each row's tag id and, per line
        of the block, whether it holds rows, its step and time (:class:`_Calm`). None when
        the pieces hold no value (nulls come out as NaN, and no value polars reads is NaN)."""
        from forensics.importers.jsonl import SKIP_KEYS

        step = np.full(n_lines, np.nan)  # per line; NaN for null (a step or time is never NaN)
        clock = np.full(n_lines, np.nan)
        has = np.zeros(n_lines, dtype=bool)  # lines with a row
        runs: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}  # tag id -> (lines, values)
        for part, df in got:
            step[part], clock[part] = _step_and_clock(df)
            cols = [c for c in df.columns if c not in SKIP_KEYS and c in self.rank]
            n = df.height
            full = False
            for c in cols:
                col = df.get_column(c)
                nulls = col.null_count()
                if nulls == n:
                    continue
                if isinstance(col.dtype, pl.Boolean):
                    col = col.cast(pl.Float64)
                vals = col.to_numpy()  # (no copy for a float column without nulls)
                lines = part
                if nulls:
                    at = np.flatnonzero(~np.isnan(vals))
                    vals, lines = vals[at], part[at]
                    has[lines] = True
                else:
                    full = True
                runs.setdefault(self.rank[c], []).append((lines, vals))
            if full:
                has[part] = True
        if not runs:
            return None
        ids = np.asarray(sorted(runs), dtype=np.uint32)
        line_parts: list[np.ndarray] = []
        value_parts: list[np.ndarray] = []
        counts = np.empty(len(ids), dtype=np.int64)
        for j, t in enumerate(ids.tolist()):
            got_t = runs[t]
            if len(got_t) == 1:
                lines, vals = got_t[0]
            else:  # a tag in several pieces: its lines merged (each piece's are ascending)
                lines = np.concatenate([g[0] for g in got_t])
                vals = np.concatenate([g[1] for g in got_t])
                order = np.argsort(lines, kind="stable")
                lines, vals = lines[order], vals[order]
            line_parts.append(lines)
            value_parts.append(vals)
            counts[j] = len(lines)
        line_of = np.concatenate(line_parts)
        tag_ids = np.repeat(ids, counts)
        step_s = self._whole(step)
        values = np.concatenate(value_parts)
        frame = _rows_frame(step_s, clock, line_of, tag_ids, values, first, tag_names)
        step_int = step_s.fill_null(0).to_numpy().copy()  # (a slow line may be added to it)
        return frame, tag_ids, has, step_int, np.isnan(step), clock

    def lines(self) -> Lines:
        """The rows read (series after series when :attr:`by_series` and no line shows a
        restart, else in line order) and what else the lines held."""
        from forensics.importers.jsonl import NAME, Lines
        from forensics.schema import SCHEMA, conform

        parts, self.parts = self.parts, []
        series = (
            self.by_series
            and self.calm.holds
            and bool(parts)
            and all(c is not None for _, c in parts)
        )
        if series:
            frame = _series_after_series(parts, len(self.tags))  # type: ignore[arg-type]
        else:
            frames = [
                f if c is None or np.count_nonzero(c) < 2 else _line_order(f) for f, c in parts
            ]
            frame = (
                pl.concat(frames, rechunk=False)
                if len(frames) > 1
                else (frames[0] if frames else pl.DataFrame(schema=_ROWS))
            )
        del parts
        frame = frame.with_columns(
            pl.lit(NAME, dtype=SCHEMA["source"]).alias("source"),
            pl.lit(self.name, dtype=SCHEMA["file"]).alias("file"),
            pl.lit(0, dtype=pl.Int32).alias("file_idx"),
            pl.lit("step", dtype=SCHEMA["x_kind"]).alias("x_kind"),
        )
        # (self.tags: every tag with a row, as _emit adds a tag with its first row)
        return Lines(
            conform(frame),
            self.bad,
            self.unread,
            self.config,
            self.relative_time,
            self.cut,
            list(self.tags),
            by_series=series,
            fractional=self.fractional,
        )


def _fractional(step: Any) -> int:
    """How many of ``step`` (floats, NaN for none) are not whole numbers."""
    a = np.asarray(step, dtype=np.float64)
    return int(np.count_nonzero(np.isfinite(a) & (a != np.floor(a))))


_MAX_PIECES = 1 << 14  # (tag, block) slices joined series after series at most


def _series_after_series(parts: list[tuple[pl.DataFrame, np.ndarray]], n_tags: int) -> pl.DataFrame:
    """The blocks' rows (each block series after series, with its rows per tag) as one frame
    series after series, each column one chunk: a column at a time, each block's copy of it
    freed once joined (``parts`` is emptied), so the rows are never held twice. The copy
    is the one the importer would make anyway (a frame of many blocks is made one chunk a
    column for the steps after, :func:`forensics.importers._one_chunk`). Too many pieces
    (a file of thousands of tags): the blocks one after another, each tag's rows still in
    line order."""
    if sum(int(np.count_nonzero(c)) for _, c in parts) > _MAX_PIECES:
        frame = pl.concat([f for f, _ in parts], rechunk=False)
        parts.clear()
        return frame
    starts = [np.cumsum(c) - c for _, c in parts]
    spans = [
        (k, int(a[t]), int(c[t]))
        for t in range(n_tags)
        for k, ((_, c), a) in enumerate(zip(parts, starts, strict=True))
        if t < len(c) and c[t]
    ]
    columns: list[pl.Series] = []
    for name in parts[0][0].columns:
        cols = [f.get_column(name) for f, _ in parts]
        columns.append(pl.concat([cols[k].slice(a, n) for k, a, n in spans], rechunk=True))
        del cols
        for k, (f, c) in enumerate(parts):
            parts[k] = (f.drop(name), c)  # the block's column freed
        trim()  # (numpy's blocks live in glibc's heap: given back before the next column)
    parts.clear()
    return pl.DataFrame(columns)


def _line_order(block: pl.DataFrame) -> pl.DataFrame:
    """A block's rows (series after series, tags in key order) in line order: within a line,
    keys in the file's order (a stable sort by line)."""
    return block.sort("record_idx", maintain_order=True)


def _no_lines(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per line of a block (:meth:`_Calm.follow`): none holds a row."""
    return (
        np.zeros(n, dtype=bool),
        np.zeros(n, dtype=np.int64),
        np.ones(n, dtype=bool),
        np.full(n, np.nan),
    )


def _add_slow_lines(
    per_line: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], rows: pl.DataFrame, first: int
) -> None:
    """The per-line reader's lines (``rows``: their rows) added to a block's per-line
    arrays (:meth:`_Calm.follow`)."""
    has, step, step_null, clock = per_line
    at = rows.get_column("record_idx").to_numpy() - first
    s = rows.get_column("step")
    has[at] = True
    step[at] = s.fill_null(0).to_numpy()
    step_null[at] = s.is_null().to_numpy()
    clock[at] = rows.get_column("wall_time").fill_null(np.nan).to_numpy()


class _Calm:
    """Do the file's lines, taken in order, show no restart of the kinds
    :func:`forensics.importers.jsonl._no_restart` looks for in line order: no step going
    back, no relative clock starting again (with its thresholds)? Followed block by block,
    a line with rows at a time (the rows of a line share its step and time)."""

    def __init__(self) -> None:
        self.steps_back = False
        self.last_step: int | None = None
        self.clocks = 0  # usable times seen (finite, not negative)
        self.clock_max = -np.inf
        self.clock_prev: float | None = None
        self.clock_drop = False  # a time under half the one before, that one a minute or more

    def follow(
        self, has: np.ndarray, step: np.ndarray, step_null: np.ndarray, clock: np.ndarray
    ) -> None:
        """A block's lines: which hold rows, their steps (``step_null``: none) and times."""
        from forensics.importers.restarts import _MIN_CLOCK_S

        s = step[has & ~step_null]
        if len(s):
            back = self.last_step is not None and int(s[0]) < self.last_step
            if back or bool((s[1:] < s[:-1]).any()):
                self.steps_back = True
            self.last_step = int(s[-1])
        w = clock[has]
        w = w[np.isfinite(w) & (w >= 0)]
        if not len(w):
            return
        self.clocks += len(w)
        self.clock_max = max(self.clock_max, float(w.max()))
        prev = w[:-1] if self.clock_prev is None else np.r_[self.clock_prev, w[:-1]]
        cur = w[1:] if self.clock_prev is None else w
        if bool(((prev >= _MIN_CLOCK_S) & (cur < 0.5 * prev)).any()):
            self.clock_drop = True
        self.clock_prev = float(w[-1])

    @property
    def holds(self) -> bool:
        from forensics.importers.restarts import _RELATIVE_CLOCK

        relative_restart = self.clocks > 1 and self.clock_max < _RELATIVE_CLOCK and self.clock_drop
        return not (self.steps_back or relative_restart)


def _rows_frame(
    step: pl.Series,
    clock: np.ndarray,
    line_of: np.ndarray,
    tag_ids: np.ndarray,
    values: np.ndarray,
    first: int,
    tag_names: pl.Series,
) -> pl.DataFrame:
    """A block's rows from each row's line (``line_of``, int64), tag id and value, with the
    step (Int64, null: none) and time (NaN: none) of each line of the block."""
    return pl.DataFrame(
        {
            "step": _per_row(step, line_of),
            "tag": tag_names.gather(pl.Series(tag_ids)),
            "value": values,
            "wall_time": _per_row(pl.Series(clock, nan_to_null=True), line_of),
            "record_idx": line_of + first,
        },
        schema=_ROWS,
    )


def _per_row(per_line: pl.Series, line_of: np.ndarray) -> pl.Series:
    """Each row's value of its line: by numpy when there is no null (faster than polars'
    gather)."""
    if per_line.null_count():
        return per_line.gather(pl.Series(line_of))
    return pl.Series(per_line.name, per_line.to_numpy()[line_of])


_NO_ROWS = np.empty(0, dtype=np.int64)


def _line_bounds(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Where each line of ``data`` starts and ends (the last may lack its newline)."""
    nl = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    ends = nl if data.endswith(b"\n") else np.append(nl, len(data))
    return np.concatenate(([0], nl[: len(ends) - 1] + 1)), ends


def _values(df: pl.DataFrame) -> int:
    """The values polars read (nulls are not)."""
    return sum(df.height - c.null_count() for c in df.get_columns())


def _gather(data: bytes, starts: np.ndarray, ends: np.ndarray, idx: np.ndarray) -> bytes:
    """The lines ``idx`` (sorted) of ``data`` as one piece, newline-terminated."""
    if len(idx) == len(starts) and data.endswith(b"\n"):
        return data
    if not len(idx):
        return b""
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    lo = starts[idx[np.r_[0, breaks]]].tolist()
    hi = ends[idx[np.r_[breaks - 1, len(idx) - 1]]].tolist()
    view = memoryview(data)  # slices of a view: the lines are copied once, by the join
    return b"\n".join([*(view[a:b] for a, b in zip(lo, hi, strict=True)), b""])


def _step_and_clock(df: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each line's step and wall time as floats (NaN where null) from a piece's columns."""
    s_expr = _step_expr(dict(df.schema))
    base = df.with_columns(  # with_columns: a literal fills the frame's height
        (s_expr if s_expr is not None else pl.lit(None, pl.Float64)).alias("_step"),
        _time_expr(dict(df.schema)).alias("_wall_time"),
    )
    return base.get_column("_step").to_numpy(), base.get_column("_wall_time").to_numpy()


def _step_expr(schema: dict[str, pl.DataType]) -> pl.Expr | None:
    from forensics.importers.jsonl import STEP_KEYS

    keys = [k for k in STEP_KEYS if k in schema]
    if not keys:
        return None
    num = [pl.col(k).cast(pl.Float64) for k in keys]
    return pl.coalesce([pl.when(x.is_finite()).then(x) for x in num] + [pl.lit(None, pl.Float64)])


def _time_expr(schema: dict[str, pl.DataType]) -> pl.Expr:
    """As the per-line reader: the first time key (milliseconds made seconds), else W&B's
    ``_runtime`` (seconds since the run started, taken as it is)."""
    from forensics.importers.jsonl import TIME_KEYS

    parts: list[pl.Expr] = []
    for k in TIME_KEYS:
        if k in schema:
            x = pl.col(k).cast(pl.Float64)
            # (times 0.001 as the per-line reader: polars divides a column by a constant as a
            # product with its reciprocal, or exactly when one row is folded as a constant)
            parts.append(pl.when(x > 1e11).then(x * 0.001).otherwise(x))
    if "_runtime" in schema:
        parts.append(pl.col("_runtime").cast(pl.Float64))
    return pl.coalesce([*parts, pl.lit(None, pl.Float64)])
