"""The canonical frame of a text log, with the rows a family kept wide laid out once.

A Megatron log of a million iteration lines holds ten million rows. Built tag after tag and
then sorted into line order (what restart numbering wants), they cost a sort of the whole
frame; laid out straight from the wide columns (line after line, or tag after tag), they
cost one gather. Either way the frame is the same, row for row, as the long-row path gives.

When no series can restart (no step going back, no counter falling to less than half, no
relative clock), restart numbering would give every row segment 0 and the interleaving
check would find nothing: :func:`lay_out` says so (``quiet``) from the wide columns, so
the importer skips both passes over the millions of rows.
"""

from __future__ import annotations

import bisect
import contextlib
import re
from collections.abc import Iterator

import numpy as np
import polars as pl

from forensics.importers.text.engine import WideRows
from forensics.schema import SCHEMA

_RELATIVE_CLOCK = 1e9  # as forensics.importers.restarts: wall times below are relative


def canonical(rows: pl.DataFrame, family: str, name: str, x_kind: str) -> pl.DataFrame:
    """Rows (``ln``, ``step``, ``tag``, ``value``, ``wall_time``) -> the canonical columns.
    Rows from :func:`lay_out` carry ``record_idx`` (``ln + 1``) already."""
    # In the canonical dtypes already: the importer's last ``conform`` is then skipped (a
    # cast of the 10M line numbers of a 1M-step log). Casts are strict, as conform's.
    record = pl.col("record_idx") if "record_idx" in rows.columns else pl.col("ln") + 1
    return rows.select(
        pl.lit(f"{family}_text", dtype=SCHEMA["source"]).alias("source"),
        pl.lit(name, dtype=SCHEMA["file"]).alias("file"),
        pl.lit(0, dtype=SCHEMA["file_idx"]).alias("file_idx"),
        record.cast(SCHEMA["record_idx"]).alias("record_idx"),
        pl.col("step").cast(SCHEMA["step"]),
        pl.lit(x_kind, dtype=SCHEMA["x_kind"]).alias("x_kind"),
        pl.col("tag").cast(SCHEMA["tag"]),
        pl.lit(None, dtype=SCHEMA["metric"]).alias("metric"),
        pl.lit(None, dtype=SCHEMA["layer"]).alias("layer"),
        pl.col("value").cast(SCHEMA["value"]),
        pl.col("wall_time").cast(SCHEMA["wall_time"]),
        pl.lit(0, dtype=SCHEMA["segment"]).alias("segment"),
    )


def fits(wide: WideRows, rest: pl.DataFrame, elapsed: re.Pattern[str]) -> bool:
    """Can the wide rows be laid out here? Not when a tag is an elapsed-time clock (its
    values become the wall times: the long-row path handles that)."""
    return not any(elapsed.match(t) for t in tags(wide, rest))


def tags(wide: WideRows, rest: pl.DataFrame) -> list[str]:
    """The tags holding rows, wide ones first."""
    seen = [wide.tags[j] for j in wide.present()]
    return list(dict.fromkeys([*seen, *rest.get_column("tag").unique().to_list()]))


def lay_out(
    wide: WideRows,
    rest: pl.DataFrame,
    by_line: bool,
    counters: list[str],
    series_order: bool = False,
) -> tuple[pl.DataFrame, bool]:
    """The wide rows and the other rows (``rest``) as one frame of ``record_idx`` (line
    number + 1), ``step``, ``tag`` (categorical), ``value`` and ``wall_time``: every row in
    line order, a line's wide rows first (``by_line``, when a series may restart: restart
    numbering reads line order), else the wide rows tag after tag then ``rest``'s tag after
    tag (each tag's rows in line order). Also says whether no series can restart
    (``quiet``). ``series_order`` (ReadOptions): a log that cannot restart is laid out tag
    after tag even where ``by_line`` asks for line order."""
    present = wide.present()
    rest = rest.select("ln", "step", pl.col("tag").cast(pl.Categorical), "value", "wall_time")
    if by_line and rest.height:
        rest = rest.sort("ln", maintain_order=True)
    quiet = _quiet(wide, present, rest, counters)
    if series_order and quiet:
        # With no restart to number, nothing reads the rows across tags in line order: they
        # are laid out tag after tag, the order the analysis view reads them in (each tag's
        # rows stay in line order), so the view takes slices instead of moving every row.
        by_line = False
        if rest.height:  # (validation lines: their tags interleave line by line)
            rest = rest.sort(pl.col("tag").to_physical(), maintain_order=True)
    with _small_pages():
        main = _wide_long(wide, present, by_line)
    record = (pl.col("ln") + 1).cast(main.schema["record_idx"])  # strict, as conform's cast
    rest = rest.select(record.alias("record_idx"), pl.exclude("ln"))
    if not rest.height:
        return main, quiet
    if not by_line:
        return pl.concat([main, rest]), quiet
    # Merge by line, the wide rows first on a tie: each rest row goes after the wide rows
    # of its line and the rest rows before it.
    lines_main = main.get_column("record_idx").to_numpy()
    lines_rest = rest.get_column("record_idx").to_numpy()
    at = np.searchsorted(lines_main, lines_rest, side="right") + np.arange(len(lines_rest))
    n = main.height + rest.height
    from_rest = np.zeros(n, dtype=bool)
    from_rest[at] = True
    order = np.empty(n, dtype=np.int64)
    order[~from_rest] = np.arange(main.height)
    order[from_rest] = main.height + np.arange(rest.height)
    both = pl.concat([main, rest])
    return both.select(pl.all().gather(order)), quiet


@contextlib.contextmanager
def _small_pages() -> Iterator[None]:
    """numpy's big arrays without its transparent-huge-page advice while the rows are laid
    out. numpy advises huge pages for every array of 4 MB or more; where the kernel then
    compacts memory on the fault to find one (THP ``defrag`` set to ``madvise``, the
    default, with the page cache full of logs), fresh arrays cost up to four times their
    plain page faults (and got small pages anyway: no huge page showed in /proc/meminfo): a
    1M-step Megatron export spent 0.3-0.5 s more CPU. The advice is put back afterwards."""
    multiarray = getattr(np, "_core", None) or getattr(np, "core", None)
    toggle = getattr(getattr(multiarray, "multiarray", None), "_set_madvise_hugepage", None)
    if toggle is None:
        yield
        return
    before = toggle(False)
    try:
        yield
    finally:
        toggle(before)


def _wide_long(wide: WideRows, present: list[int], by_line: bool) -> pl.DataFrame:
    """The wide rows as long rows (``record_idx`` = line number + 1), laid out with plain
    repeats: no sort, no index, and each output column written once."""
    f = wide.frame
    cols = [wide.columns[j] for j in present]
    n, k = f.height, len(cols)
    if not k:
        return pl.DataFrame(
            schema={
                "record_idx": SCHEMA["record_idx"],
                "step": pl.Int64,
                "tag": pl.Categorical,
                "value": pl.Float64,
                "wall_time": pl.Float64,
            }
        )
    # Every line holds every tag (the usual log): plain repeats, no mask.
    full = not any(f.get_column(c).null_count() for c in cols)  # null counts are cached
    # Filled in the order the rows take them (ravel below is then a view, not a copy).
    values = np.empty((n, k), dtype=np.float64, order="C" if by_line else "F")
    valid = np.ones((1, 1), dtype=bool) if full else np.empty((n, k), dtype=bool)
    if full and by_line:
        _fill_rows(values, [f.get_column(c) for c in cols])
    else:
        for i, c in enumerate(cols):
            s = f.get_column(c)
            if not full:
                valid[:, i] = s.is_not_null().to_numpy()
            _fill(values[:, i], s)  # nulls turn NaN here; ``valid`` leaves them out
    per_line = valid.sum(axis=1)

    def spread(a: np.ndarray) -> np.ndarray:
        """A per-line array -> one entry per row."""
        if by_line:
            return np.repeat(a, k) if full else np.repeat(a, per_line)
        return np.tile(a, k) if full else np.concatenate([a[valid[:, i]] for i in range(k)])

    def per_row(s: pl.Series) -> pl.Series:
        if s.null_count():  # nulls kept: through line indexes
            return s.gather(spread(np.arange(n, dtype=np.int64)))
        return pl.Series(s.name, spread(s.to_numpy()), dtype=s.dtype)

    # Line after line is the C order of the (line, tag) table; tag after tag its transpose.
    codes = np.arange(k, dtype=np.uint32)
    tag: np.ndarray | pl.Series
    if full:
        value = values.ravel() if by_line else values.ravel(order="F")
        # The row's tag index made by polars (no 40 MB index array of numpy's beside it).
        row = pl.int_range(0, n * k, dtype=pl.UInt32 if n * k < 2**32 else pl.Int64)
        tag = pl.select(row % k if by_line else row // n).to_series()
    else:
        grid = np.broadcast_to(codes, (n, k))
        value = values[valid] if by_line else values.T[valid.T]
        tag = grid[valid] if by_line else grid.T[valid.T]
    del values
    names = pl.Series("tag", [wide.tags[j] for j in present], dtype=pl.Categorical)
    return pl.DataFrame(
        [
            per_row(_line_numbers(f.get_column("ln"))),
            per_row(f.get_column("step")),
            names.gather(tag),
            pl.Series("value", value, dtype=pl.Float64),
            per_row(f.get_column("wall_time")),
        ]
    )


def _fill(out: np.ndarray, s: pl.Series) -> None:
    """``out[:] = s.to_numpy()`` a chunk at a time: the wide columns are left in a chunk per
    piece of the log, and each chunk is read in place (a whole-column array would be a copy:
    80 MB of fresh memory over the ten columns of a 1M-step log)."""
    at = 0
    for chunk in s.get_chunks():
        out[at : at + len(chunk)] = chunk.to_numpy()
        at += len(chunk)


# Rows of a line-after-line table written at a time by _fill_rows (a block stays in cache).
_ROW_BLOCK = 1 << 14


def _fill_rows(out: np.ndarray, cols: list[pl.Series]) -> None:
    """``out[:, i] = cols[i]`` for a C-order table and columns without nulls, a block of
    rows at a time: written column by column, each value lands on another cache line (one
    line in ten reused), and the table goes through the cache ten times. The chunks are
    read in place, as in :func:`_fill`."""
    views = []
    for s in cols:
        arrays = [chunk.to_numpy() for chunk in s.get_chunks()]
        views.append((np.cumsum([0] + [len(a) for a in arrays]).tolist(), arrays))
    n = out.shape[0]
    for a in range(0, n, _ROW_BLOCK):
        b = min(a + _ROW_BLOCK, n)
        for i, (starts, arrays) in enumerate(views):
            j = bisect.bisect_right(starts, a) - 1
            at = a
            while at < b:  # the chunks covering rows a..b of this column
                lo, hi = at - starts[j], min(b, starts[j + 1]) - starts[j]
                out[at : at + hi - lo, i] = arrays[j][lo:hi]
                at += hi - lo
                j += 1


def _line_numbers(ln: pl.Series) -> pl.Series:
    """``record_idx`` (``ln + 1``) in the canonical Int32 when every line number fits (else
    Int64, which the canonical frame's strict cast refuses, as conform would)."""
    top = ln.max()
    fits = top is None or int(top) < np.iinfo(np.int32).max  # type: ignore[arg-type]
    return (ln + 1).cast(SCHEMA["record_idx"] if fits else pl.Int64).alias("record_idx")


def _quiet(wide: WideRows, present: list[int], rest: pl.DataFrame, counters: list[str]) -> bool:
    """True when restart numbering (forensics.importers.restarts) would find no restart and
    the interleaving check no series going back: no series' step goes back, no counter
    falls to less than half of its previous value, and no relative clock. ``rest`` in the
    order of the frame."""
    f = wide.frame
    wide_tags = [wide.tags[j] for j in present]
    rest_tags = set(rest.get_column("tag").cast(pl.Utf8).unique().to_list())
    if len(set(wide_tags)) < len(wide_tags) or rest_tags & set(wide_tags):
        return False  # a tag's rows come from several places: the full check decides
    # Every wide row sits on a line of ``f``, so a series never goes back if the lines don't.
    if f.select((pl.col("step").diff() < 0).any()).item():
        return False
    known = rest.filter(pl.col("step").is_not_null())
    if known.height and known.select((pl.col("step").diff().over("tag") < 0).any()).item():
        return False
    for t in counters:
        if t in wide_tags:
            v = f.get_column(wide.columns[present[wide_tags.index(t)]]).drop_nulls()
        else:
            v = known.filter(pl.col("tag").cast(pl.Utf8) == t).get_column("value")
        x = v.to_numpy().astype(np.float64)
        if len(x) > 1 and bool(np.any((x[:-1] > 0) & (x[1:] < 0.5 * x[:-1]))):
            return False
    # A relative clock (seconds since the job started) may fall back: the full check decides.
    clock = pl.col("wall_time")
    usable = clock.is_finite() & (clock >= 0)
    top = max(
        (
            x
            for x in (
                f.select(clock.filter(usable & wide.has_rows()).max()).item(),
                rest.select(clock.filter(usable).max()).item(),
            )
            if x is not None
        ),
        default=None,
    )
    return top is None or top >= _RELATIVE_CLOCK
