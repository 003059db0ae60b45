"""Shared machinery for text-log families: the line table, number parsing, row frames.

Every family works on whole columns (polars string expressions over the file's lines, or
one regex over the text), never a Python loop per field. A family returns *rows*: a frame
with :data:`ROWS` columns, where ``ln`` is the 0-based line number, ``step`` may be null
(resolved later from neighbouring lines, see ``fill``) and ``tag`` is the raw metric name.
"""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

import polars as pl

from forensics.importers.base import utf16_kind
from forensics.importers.text import search

# A number as trainers print it: 1,234.5  1.2E+01  .5  nan  inf  -Infinity
NUM = (
    r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
    r"|[nN][aA][nN]|[iI]nf(?:inity)?|INF)"
)

# fill: how a row without a step gets one. "prev": the step of the closest metric line
# above; "next": the closest below (an event printed before the step line that reports
# it); "prev0": like prev, but 0 before the first step (an evaluation before training).
ROWS: dict[str, pl.DataType] = {
    "ln": pl.Int64(),
    "step": pl.Int64(),
    "tag": pl.Utf8(),
    "value": pl.Float64(),
    "wall_time": pl.Float64(),
    "fill": pl.Utf8(),
}

_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


class MappedText:
    """A big plain log mapped read-only, with the part of the bytes API the text importer
    uses (``len``, slices, ``find``, ``in``, ``count``, ``endswith``): the file is never read
    into memory as a whole. Reading a 360 MB log costs 0.2 s of CPU (a fresh buffer's page
    faults and the copy); the map shares the page cache, and the Megatron reader copies out
    one piece of whole lines at a time. Only a log the importer would take as it is (no
    UTF-16, BOM, NUL, ANSI code or carriage return: see :func:`map_text`) is mapped.

    The map holds the size the file had when it was opened: lines appended later are not
    read, as with a plain read. (A file cut shorter while it is read is the one case a map
    fails on: reading past the new end is a bus error.)"""

    BLOCK = 1 << 24  # bytes copied out at a time to count a byte

    def __init__(self, mm: mmap.mmap) -> None:
        self._mm = mm

    def __len__(self) -> int:
        return len(self._mm)

    @overload
    def __getitem__(self, key: int) -> int: ...

    @overload
    def __getitem__(self, key: slice) -> bytes: ...

    def __getitem__(self, key: int | slice) -> int | bytes:
        return self._mm[key]

    def __bytes__(self) -> bytes:
        return self._mm[:]

    def view(self, start: int, end: int) -> memoryview:
        """Bytes ``start:end`` without a copy (release the view before the map closes)."""
        return memoryview(self._mm)[start:end]

    def __contains__(self, sub: bytes) -> bool:
        # mmap's own ``in`` tests for one byte value, not a substring.
        return self.find(sub) >= 0

    def find(self, sub: bytes, start: int = 0, end: int | None = None) -> int:
        stop = len(self._mm) if end is None else end
        if (
            len(sub) > 1
            and 0 <= start <= stop <= len(self._mm)
            and stop - start >= _LIBC_FROM
            and search.available()
        ):
            # (the C library's memmem: the same first occurrence, 4x faster on a log's
            # phrases; see forensics.importers.text.search)
            return search.find(self._mm, sub, start, stop)
        return self._mm.find(sub, start, stop)

    def endswith(self, suffix: bytes) -> bool:
        return len(suffix) <= len(self._mm) and self._mm[len(self._mm) - len(suffix) :] == suffix

    def count(self, sub: bytes, start: int = 0, end: int | None = None) -> int:
        end = len(self._mm) if end is None else end
        if len(sub) != 1:
            return self._mm[start:end].count(sub)
        # One byte is never split between two blocks: counted a block at a time.
        step = self.BLOCK
        return sum(
            self._mm[a : min(a + step, end)].count(sub) for a in range(start, max(end, start), step)
        )

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self._mm[:].decode(encoding, errors)


Text = bytes | MappedText


def view(raw: Text, start: int, end: int) -> memoryview:
    """Bytes ``start:end`` of ``raw`` without a copy."""
    return raw.view(start, end) if isinstance(raw, MappedText) else memoryview(raw)[start:end]


# Logs at least this big are mapped rather than read (below, a read costs little).
MAP_BYTES = 16 << 20
_LIBC_FROM = 1 << 20  # bytes searched from which the C library's memmem is used


def map_text(path: Path) -> MappedText | None:
    """``path`` mapped read-only when it is a plain log (not compressed) of at least
    :data:`MAP_BYTES` that reading would leave as it is: UTF-8 without BOM, no NUL, no ANSI
    code, no carriage return (:func:`forensics.importers.base.text_bytes` and :func:`clean`
    change nothing). None otherwise: the caller reads the file."""
    if os.name != "posix" or path.name.endswith((".gz", ".zst")):
        return None
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < MAP_BYTES:
            return None
        # Pages mapped up front (one call rather than a fault per few pages).
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
        try:
            mm = mmap.mmap(fh.fileno(), 0, flags=flags, prot=mmap.PROT_READ)
        except (ValueError, OSError):  # a file system without mmap, a file emptied meanwhile
            return None
    head = mm[:4096]
    if utf16_kind(head) is not None or head.startswith(b"\xef\xbb\xbf"):
        mm.close()
        return None
    if search.has_any_byte(mm, b"\x00\x1b\r"):
        mm.close()
        return None
    return MappedText(mm)


@dataclass
class Ctx:
    """One text file being parsed."""

    raw: Text  # cleaned text (ANSI codes stripped, CR turned into line breaks)
    sample: str  # head and tail of the file, for sniffing
    name: str
    notes: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    x_kind: str = "step"
    bad_lines: int = 0
    n_lines: int | None = None  # known once a family has read the whole file as a table
    # (ln, step) of each metric line of a family that reads millions of lines, so the
    # orchestrator never has to regroup its rows to find line steps.
    line_steps: pl.DataFrame | None = None
    overflow_hint: bool | None = None  # a family saw (or ruled out) DeepSpeed overflow lines
    # Rows a family kept as value columns (one per tag) rather than as long rows; see WideRows.
    wide: WideRows | None = None
    _lines: pl.DataFrame | None = None

    @property
    def lines(self) -> pl.DataFrame:
        """The file as a table: ``ln`` (0-based line number) and ``line``."""
        if self._lines is None:
            self._lines = read_lines(self.raw[:])  # a mapped log read whole (bytes: no copy)
            self.n_lines = self._lines.height
        return self._lines


@dataclass
class WideRows:
    """Rows kept wide: one line per row of ``frame`` (``ln``, ``step``, ``wall_time``, all
    with a step) and one Float64 column per tag (null: the line has no such row).

    Millions of rows are cheaper built once, straight in the order the importer needs: tag
    after tag (:meth:`blocks`, the order of a family's long rows) or line after line.
    """

    frame: pl.DataFrame
    tags: list[str]  # tag of each value column, in column order

    @property
    def columns(self) -> list[str]:
        return self.frame.columns[3:]

    def blocks(self) -> pl.DataFrame:
        """The rows as long ROWS, tag after tag, each tag in line order."""
        parts = [
            self.frame.select(
                "ln",
                "step",
                pl.lit(tag).alias("tag"),
                pl.col(col).alias("value"),
                "wall_time",
                pl.lit(None, dtype=pl.Utf8).alias("fill"),
            ).filter(pl.col("value").is_not_null())
            for col, tag in zip(self.columns, self.tags, strict=True)
        ]
        return pl.concat(parts) if parts else empty_rows()

    def has_rows(self) -> pl.Expr:
        """Per line: does it hold any row?"""
        if not self.columns:
            return pl.lit(False)
        return pl.any_horizontal([pl.col(c).is_not_null() for c in self.columns])

    def present(self) -> list[int]:
        """Indexes of the value columns holding at least one row."""
        nulls = self.frame.select(pl.col(self.columns).null_count()).row(0) if self.columns else ()
        return [j for j, n in enumerate(nulls) if n < self.frame.height]


def starts_a_line(sample: str, *prefixes: str) -> bool:
    """Does a line of ``sample`` start with one of ``prefixes``? What a ``(?m)^prefix...``
    pattern needs to match, found by plain substring searches: a family's sniff runs its
    pattern only then (the pattern alone tries every position of the 512 KB sample)."""
    return sample.startswith(prefixes) or any("\n" + p in sample for p in prefixes)


@overload
def clean(raw: bytes) -> bytes: ...


@overload
def clean(raw: Text) -> Text: ...


def clean(raw: Text) -> Text:
    """Strip ANSI colour codes and turn carriage returns (progress bars) into line breaks."""
    if isinstance(raw, MappedText):
        return raw  # mapped only when there is nothing to clean (map_text)
    if b"\x1b" in raw:  # one-byte search: much faster than the two-byte one on big logs
        raw = _ANSI.sub(b"", raw)
    if b"\r" in raw:
        raw = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return raw


def sample_text(raw: Text, n: int = 262144) -> str:
    """Head and tail of a file (the metric lines may start after a long preamble)."""
    if len(raw) <= 2 * n:
        return raw.decode("utf-8", "replace")
    return raw[:n].decode("utf-8", "replace") + "\n" + raw[-n:].decode("utf-8", "replace")


def read_lines(raw: bytes) -> pl.DataFrame:
    """All lines of the text as a polars frame, read by polars' CSV reader with a separator
    that never occurs (multi-threaded and far faster than splitting in Python)."""
    if not raw:
        return pl.DataFrame(schema={"ln": pl.Int64, "line": pl.Utf8})
    df = _read_text_csv(raw, separator="\x1f", schema={"line": pl.Utf8})
    return (
        df.with_columns(pl.col("line").fill_null(""))
        .with_row_index("ln")
        .with_columns(pl.col("ln").cast(pl.Int64, strict=False))
    )


def _read_text_csv(raw: bytes, separator: str, schema: dict[str, Any]) -> pl.DataFrame:
    """``raw`` split into the string columns of ``schema`` (no quoting, ragged lines padded
    or cut). Read as strict UTF-8 first (a quarter cheaper than the lossy reading, which
    converts the whole buffer); a log with invalid bytes is read again, lossily."""

    def read(encoding: Literal["utf8", "utf8-lossy"]) -> pl.DataFrame:
        return pl.read_csv(
            raw,
            has_header=False,
            separator=separator,
            quote_char=None,
            schema=schema,
            truncate_ragged_lines=True,
            extra_columns="ignore",
            missing_columns="insert",
            encoding=encoding,
        )

    try:
        return read("utf8")
    except pl.exceptions.ComputeError:  # invalid UTF-8 somewhere in the text
        return read("utf8-lossy")


def read_pipes(raw: bytes, n_cols: int) -> pl.DataFrame:
    """The text split on ``|`` into ``c0..c{n-1}`` string columns, one row per line."""
    schema = {f"c{i}": pl.Utf8 for i in range(n_cols)}
    df = _read_text_csv(raw, separator="|", schema=schema)
    return df.with_row_index("ln").with_columns(pl.col("ln").cast(pl.Int64, strict=False))


def num(expr: pl.Expr, commas: bool = True) -> pl.Expr:
    """A printed number -> Float64 (null when it is not one). Accepts 1,234 and nan/inf."""
    expr = expr.str.strip_chars()
    if commas:
        expr = expr.str.replace_all(",", "", literal=True)
    return expr.cast(pl.Float64, strict=False)


def matches(lines: pl.DataFrame, keep: pl.Expr, pattern: str) -> pl.DataFrame:
    """The lines ``keep`` selects, with a column per named group of ``pattern``."""
    groups = pl.col("line").str.extract_groups(pattern).alias("g")
    return lines.filter(keep).with_columns(groups).unnest("g")


def empty_rows() -> pl.DataFrame:
    return pl.DataFrame(schema=ROWS)


def conform_rows(df: pl.DataFrame) -> pl.DataFrame:
    if list(df.schema.items()) == list(ROWS.items()):
        return df  # already in shape: skip a pass over (possibly millions of) rows
    for name, dtype in ROWS.items():
        if name not in df.columns:
            df = df.with_columns(pl.lit(None, dtype=dtype).alias(name))
    return df.select([pl.col(n).cast(t) for n, t in ROWS.items()])


def wide_to_rows(df: pl.DataFrame, tags: dict[str, str], fill: str | None = None) -> pl.DataFrame:
    """Columns of numbers (already Float64) -> long rows. ``tags`` maps column -> raw tag.
    ``df`` must hold ``ln`` and may hold ``step`` and ``wall_time``."""
    parts = []
    keep = [c for c in ("ln", "step", "wall_time") if c in df.columns]
    for col, tag in tags.items():
        if col not in df.columns:
            continue
        parts.append(
            df.select(*keep, pl.col(col).cast(pl.Float64).alias("value"))
            .filter(pl.col("value").is_not_null())
            .with_columns(pl.lit(tag).alias("tag"))
        )
    if not parts:
        return empty_rows()
    out = conform_rows(pl.concat(parts, how="diagonal"))
    return out.with_columns(pl.lit(fill, dtype=pl.Utf8).alias("fill")) if fill else out


def kv_rows(
    df: pl.DataFrame, col: str, pair: str, fill: str | None = None, prefix: str = ""
) -> pl.DataFrame:
    """Every ``key sep value`` pair in ``df[col]`` (regex ``pair`` with groups ``key`` and
    ``val``) -> long rows carrying the frame's ``ln``/``step``/``wall_time``."""
    keep = [c for c in ("ln", "step", "wall_time") if c in df.columns]
    if df.is_empty():
        return empty_rows()
    long = (
        df.select(*keep, pl.col(col).str.extract_all(pair).alias("_kv"))
        .explode("_kv")
        .filter(pl.col("_kv").is_not_null())
        .with_columns(pl.col("_kv").str.extract_groups(pair).alias("_g"))
        .unnest("_g")
        .with_columns(
            (pl.lit(prefix) + pl.col("key").str.strip_chars()).alias("tag"),
            num(pl.col("val")).alias("value"),
        )
        .filter(pl.col("value").is_not_null() & (pl.col("tag") != prefix))
    )
    out = conform_rows(long)
    return out.with_columns(pl.lit(fill, dtype=pl.Utf8).alias("fill")) if fill else out


def to_unix(expr: pl.Expr, fmt: str = "%Y-%m-%d %H:%M:%S%.f") -> pl.Expr:
    """A printed date (``2024-05-01 12:00:00[,.]123``) -> unix seconds (naive = UTC)."""
    return (
        expr.str.replace(",", ".", literal=True)
        .str.to_datetime(fmt, strict=False, time_unit="us")
        .dt.epoch("us")
        .cast(pl.Float64)
        / 1e6
    )


def drop_rank_repeats(rows: pl.DataFrame) -> pl.DataFrame:
    """The same step printed by several ranks is one row: within a tag, in line order,
    a row repeating the previous row's step is dropped (a replay after a restart goes
    back to an earlier step, so it is kept)."""
    if rows.is_empty():
        return rows
    return rows.sort("ln", maintain_order=True).filter(
        pl.col("step").is_null()
        | (pl.col("step") != pl.col("step").shift(1).over("tag")).fill_null(True)
    )
