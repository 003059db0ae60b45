"""Megatron-LM and Megatron-DeepSpeed stdout (``training_log`` / ``evaluate_and_print_results``).

Iteration line (old forks lack the date, throughput and grad norm)::

     [2024-05-01 12:00:00] iteration      100/  500000 | consumed samples: 51200 | ...
     | lm loss: 7.123456E+00 | loss scale: 1.0 | grad norm: 1.234 |
     | number of skipped iterations: 0 |

Validation line::

     validation loss at iteration 1000 | lm loss value: 2.3E+00 | lm loss PPL: 10.4 |

Speed matters here (1M-line logs): the file is read in pieces; the most common key layout
is read from the last iteration lines, and the lines that fit it exactly are read by a
compiled kernel (``_megatron.c``: one pass over the bytes). Any other line (or every line,
without a C compiler) is split on ``|`` by polars' CSV reader and read column by column with
plain slicing, and only the few cells with another layout go through the slower key/value
split. Both ways give the same rows.
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.cores import cores
from forensics.importers.text.engine import (
    Ctx,
    Text,
    WideRows,
    conform_rows,
    empty_rows,
    num,
    read_pipes,
    to_unix,
    view,
)

try:  # the compiled reading of iteration lines (setup.py); polars reads every piece without it
    from forensics.importers.text import _megatron
except ImportError:  # pragma: no cover - built wherever a C compiler is
    _megatron = None  # type: ignore[assignment]

NAME = "megatron"
DEDUPED = True  # rank copies are dropped here, on the line table (cheaper than on rows)
SNIFF = re.compile(r"iteration\s+\d+\s*/\s*\d+\s*\|")
_VAL = re.compile(r"validation loss at")
_DATE = r"\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)\]"


def sniff(sample: str) -> bool:
    return bool(SNIFF.search(sample))


def _n_cols(sample: str) -> int:
    counts = [ln.count("|") for ln in sample.splitlines() if SNIFF.search(ln) or _VAL.search(ln)]
    return min(max(counts, default=8) + 2, 96)


# The log is read in pieces of about this many bytes (whole lines): the table of one piece's
# cells is held at a time, not the whole file's (a few times the size of the text). At 16 MB
# rather than 30 the peak of a 1M-step export fell by about 45 MiB (fewer fresh pages too);
# smaller pieces cost more in calls per piece than they save.
CHUNK_BYTES = 16 << 20
_SAMPLE_ROWS = 200  # the last iteration lines, whose keys set each column's layout


def parse(ctx: Ctx) -> pl.DataFrame:
    n = _n_cols(ctx.sample)
    cols = [f"c{i}" for i in range(1, n)]
    spans = _spans(ctx.raw, CHUNK_BYTES)
    last = _Piece(read_pipes(ctx.raw[spans[-1][0] : spans[-1][1]], n), ctx.sample, None)
    if len(spans) > 1 and last.it.height <= _SAMPLE_ROWS:
        # Too few iteration lines at the end to read the layout from: one piece.
        spans = [(0, len(ctx.raw))]
        last = _Piece(read_pipes(ctx.raw[:], n), ctx.sample, None)  # bytes: no copy
    commas = _commas(ctx.sample)
    # The layout comes from the last iteration lines: the rank copies dropped in the last
    # piece alone are the file's, but for its first line (not among the last ones).
    layout = _Layout.of(last.it, cols, commas) if last.it.height else None
    pieces: list[_Values] = []
    vals: list[pl.DataFrame] = []
    line_steps: list[pl.DataFrame] = []
    offset, carry, hint = 0, None, False
    dated = bool(re.search(_DATE + r"\s*iteration", ctx.sample))
    kernel_reads = _kernel_reads(ctx.raw, spans[:-1], layout, dated)
    for i in range(len(spans)):
        # Each span in parts: what the kernel read, and the lines it left to polars.
        parts: Sequence[_Piece | _Part] = [last] if i == len(spans) - 1 else next(kernel_reads)
        for part in parts:
            if isinstance(part, _Piece):
                piece = part
                if len(spans) > 1:  # the last piece was first read without its predecessor
                    piece.drop_copies(carry)
            elif isinstance(part, _KernelRead):
                piece = _kernel_piece(part, n, carry)
            else:
                piece = _Piece(read_pipes(ctx.raw[part[0] : part[1]], n), ctx.sample, carry)
            carry = piece.carry
            hint = hint or piece.hint
            shift = pl.col("ln") + offset
            offset += piece.n_lines
            vals.append(piece.val.with_columns(shift))
            it = piece.it.with_columns(shift)
            line_steps.append(it.select("ln", "step"))
            if layout is not None:
                pieces.append(piece.values(layout, it))
            del piece, it
    kernel_reads.close()  # (its worker threads end)
    ctx.n_lines = offset
    ctx.line_steps = pl.concat(line_steps)
    # DeepSpeed overflow lines have no "|": they sit whole in c0, so the pieces ruled them
    # in or out on the way.
    ctx.overflow_hint = hint
    rows = [layout.rows(pieces, ctx) if layout is not None else empty_rows()]
    val = pl.concat(vals)
    if not val.is_empty():
        rows.append(_validation_rows(val, cols))
    return pl.concat(rows)


def _commas(sample: str) -> bool:
    r"""Does an iteration line print numbers with thousands separators (1,234)? The answer
    of ``re.search(r"iteration[^\n]*\d,\d{3}\b", sample)`` without its backtracking over
    every iteration line: each (rare) 1,234 looks back for "iteration" on its own line."""
    for m in _COMMA_NUM.finditer(sample):
        start = sample.rfind("\n", 0, m.start()) + 1
        if sample.find("iteration", start, m.start()) >= 0:
            return True
    return False


_COMMA_NUM = re.compile(r"\d,\d{3}\b")


def _spans(raw: Text, size: int) -> list[tuple[int, int]]:
    """(start, end) byte ranges of whole lines, each about ``size`` bytes."""
    out = []
    a = 0
    while len(raw) - a > size:
        b = raw.find(b"\n", a + size) + 1
        if b <= 0:
            break
        out.append((a, b))
        a = b
    out.append((a, len(raw)))
    return out


class _Piece:
    """The iteration and validation lines of a piece of the log (``ln`` within the piece)."""

    def __init__(self, cells: pl.DataFrame, sample: str, carry: int | None) -> None:
        self.n_lines = cells.height
        c0 = pl.col("c0")
        # One pass of a literal alternation (the regex engine's multi-literal search).
        self.hint = bool(
            cells.select(c0.str.contains("verflow|OVERFLOW|dynamic loss scale").any()).item()
        )
        is_val = c0.str.contains("validation loss at", literal=True)
        is_it = c0.str.contains(r"iteration\s+\d+")  # (implies the literal "iteration")
        masks = cells.select(is_val.alias("val"), (is_it & ~is_val).alias("it"))
        val, keep = masks.get_column("val"), masks.get_column("it")
        self.val = cells.filter(val) if val.any() else cells.clear()
        # Most pieces hold iteration lines only: no filter, which would copy every column.
        it = cells if keep.all() else cells.filter(keep)
        del (
            cells,
            masks,
        )  # the cell table is the biggest thing held here; only its iteration lines go on
        start = c0.str.find("iteration", literal=True) + 9
        it = it.with_columns(
            c0.str.slice(start, c0.str.find("/", literal=True) - start)
            .str.strip_chars()
            .cast(pl.Int64, strict=False)
            .alias("step")
        )
        if it.get_column("step").null_count():
            # Lines without "/" (some forks print "iteration 100 |"): fall back to a regex.
            it = it.with_columns(
                pl.coalesce(
                    "step", c0.str.extract(r"iteration\s+(\d+)", 1).cast(pl.Int64, strict=False)
                ).alias("step")
            )
        if it.get_column("step").null_count():
            it = it.filter(pl.col("step").is_not_null())
        self.carry = it.get_column("step").item(-1) if it.height else carry
        self.it = it.with_columns(_wall_time(it, sample).alias("wall_time"))
        self.drop_copies(carry)

    def values(self, layout: _Layout, it: pl.DataFrame) -> _Values:
        """The piece's iteration lines ``it`` (line numbers within the file) read with the
        layout."""
        return layout.values(it)

    def drop_copies(self, carry: int | None) -> None:
        """Several ranks printing the same iteration: keep the first copy (``carry``: the
        step of the previous piece's last iteration line). Filtering copies every column,
        so look first."""
        step = pl.col("step")
        repeat = (step == step.shift(1, fill_value=carry)).fill_null(False)
        if self.it.select(repeat.any()).item():
            self.it = self.it.filter(~repeat)


class _KernelPiece(_Piece):
    """A piece read by the compiled kernel: its iteration lines already hold their values
    (``_v{j}``, as :meth:`_Layout.values` names them), and no cell is odd."""

    def __init__(
        self,
        n_lines: int,
        hint: bool,
        it: pl.DataFrame,
        val: pl.DataFrame,
        carry: int | None,
        const: tuple[bool, ...],
    ) -> None:
        self.n_lines, self.hint, self.it, self.val = n_lines, hint, it, val
        self.carry, self.const = carry, const

    def values(self, layout: _Layout, it: pl.DataFrame) -> _Values:
        rest = it.select("ln", "step", "wall_time").clear()
        return _Values(it, (False,) * len(layout.cols), self.const, rest)


@dataclass
class _KernelRead:
    """Lines the compiled kernel read (the arrays cut to its iteration lines)."""

    n_lines: int
    hint: bool
    const: tuple[bool, ...]
    ln: np.ndarray  # row of each iteration line within these lines
    step: np.ndarray
    wall: np.ndarray | None  # None: the log prints no dates
    values: dict[str, np.ndarray]  # _v{j} -> the column's numbers, NaN where no cell
    val_ln: list[int]  # the validation lines: their rows, and their text
    val_text: bytes


# A span's lines in order: what the kernel read, or a byte range (start, end) polars reads.
_Part = _KernelRead | tuple[int, int]
_MAX_HANDOVER = 1 << 14  # lines polars reads at a time where the kernel keeps declining
_MAX_RESCANS = 16  # lines with a byte outside printable ASCII a span takes one at a time


def _kernel_read(raw: Text, a: int, b: int, layout: _Layout, dated: bool) -> list[_Part]:
    """Bytes ``a:b`` of the log (whole lines) as parts: the lines the compiled kernel read,
    and between them the lines it declined (a line the layout does not fit exactly, a number
    or date it does not read as polars would: see ``_megatron.c``), which polars reads. Where
    the kernel declines line after line, polars takes twice as many lines each time (up to
    ``_MAX_HANDOVER``) before the kernel tries again. A line with a byte outside printable
    ASCII goes to polars too (the kernel reads ASCII only); past ``_MAX_RESCANS`` of them,
    each a new scan of the rest of the span, polars reads the rest. Runs in a worker thread
    (the kernel releases the interpreter lock)."""
    assert _megatron is not None
    parts: list[_Part] = []
    with view(raw, a, b) as text:  # the kernel reads the map: no copy
        size = len(text)

        def ascii_until(start: int, bad: int | None = None) -> int:
            """Where the lines from ``start`` stop being plain ASCII: the start of the line
            of the first other byte (``bad``: its offset from ``start``, when known)."""
            if bad is None:
                with text[start:] as rest:
                    bad = _megatron.lines(rest)[1]
            if bad < 0:
                return size
            k = start + bad
            while k > start and text[k - 1] != 0x0A:  # (back to the start of its line)
                k -= 1
            return k

        breaks, bad = _megatron.lines(text)
        end = ascii_until(0, bad)
        cap = breaks + 1
        keyed = [j for j, pre in enumerate(layout.prefixes) if pre is not None]
        ln, step, wall = (np.empty(cap, t) for t in (np.int64, np.int64, np.float64))
        values = np.empty((len(keyed), cap), np.float64)
        val = np.empty(3 * cap, np.int64)
        at, row, n_val, grow, rescans = 0, 0, 0, 1, 0
        while at < size:
            if end < at:  # that byte's line went to polars: where is the next such byte?
                end, rescans = ascii_until(at), rescans + 1
            if at < end:
                with text[at:end] as lines:
                    n_lines, m, hint, const, nv, stop = _megatron.read(
                        lines, layout.keys, layout.consts, layout.commas, dated, ln, step,
                        wall, values, val, row, n_val,
                    )  # fmt: skip
                    spans = val[3 * n_val : 3 * (n_val + nv)].reshape(-1, 3).tolist()
                    val_text = b"\n".join(bytes(lines[s:e]) for _, s, e in spans)
                if stop:
                    parts.append(
                        _KernelRead(
                            n_lines,
                            hint,
                            const,
                            ln[row : row + m],
                            step[row : row + m],
                            wall[row : row + m] if dated else None,
                            {f"_v{j}": values[k, row : row + m] for k, j in enumerate(keyed)},
                            [r[0] for r in spans],
                            val_text,
                        )
                    )
                    row, n_val, grow = row + m, n_val + nv, 1
                at += stop
                if at >= size:
                    break
            if at < end:  # a line the kernel declined: polars reads it and maybe a few more
                lines_over, grow = grow, min(2 * grow, _MAX_HANDOVER)
            else:  # the line of a byte outside printable ASCII: polars reads that line
                lines_over = 1 if rescans < _MAX_RESCANS else -1  # (-1: the rest)
            handover = at
            for _ in range(lines_over) if lines_over > 0 else ():
                nl = raw.find(b"\n", a + handover, a + size)
                handover = size if nl < 0 else nl + 1 - a
                if handover >= size:
                    break
            if lines_over < 0:
                handover = size
            parts.append((a + at, a + handover))
            at = handover
    return parts


def _kernel_reads(
    raw: Text, spans: list[tuple[int, int]], layout: _Layout | None, dated: bool
) -> Generator[list[_Part], None, None]:
    """Each span as parts (:func:`_kernel_read`), in order, two spans read side by side and
    ahead of the caller. Without the kernel or a layout: each span whole, for polars."""
    if _megatron is None or layout is None or not spans:
        for span in spans:
            whole: list[_Part] = [span]
            yield whole
        return
    from concurrent.futures import Future, ThreadPoolExecutor

    workers = cores()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        todo = iter(spans)
        ahead: deque[Future[list[_Part]]] = deque(
            pool.submit(_kernel_read, raw, a, b, layout, dated)
            for a, b in itertools.islice(todo, workers)
        )
        while ahead:
            done = ahead.popleft().result()
            nxt = next(todo, None)
            if nxt is not None:
                ahead.append(pool.submit(_kernel_read, raw, *nxt, layout, dated))
            yield done


def _kernel_piece(read: _KernelRead, n: int, carry: int | None) -> _KernelPiece:
    """The kernel's read of a piece as the piece the polars path would have made."""
    m = len(read.ln)
    # NaN marks a missing cell (and a line without a date): the kernel stops at a line with
    # a number it would read as NaN, and a date it reads is never NaN.
    cols = [pl.Series("ln", read.ln), pl.Series("step", read.step)]
    if read.wall is not None:
        cols.append(pl.Series("wall_time", read.wall, nan_to_null=True))
    else:
        cols.append(pl.Series("wall_time", [None] * m, dtype=pl.Float64))
    cols += [pl.Series(name, v, nan_to_null=True) for name, v in read.values.items()]
    if read.val_ln:
        # The few validation lines go to the polars table, as the polars path has them.
        val = read_pipes(read.val_text, n)
        val = val.with_columns(pl.Series("ln", read.val_ln, dtype=pl.Int64))
    else:
        val = pl.DataFrame(schema={"ln": pl.Int64, **{f"c{i}": pl.Utf8 for i in range(n)}})
    last = int(read.step[-1]) if m else carry
    piece = _KernelPiece(read.n_lines, read.hint, pl.DataFrame(cols), val, last, read.const)
    piece.drop_copies(carry)
    return piece


def _prefix(cell: str | None) -> str | None:
    if cell is None or ":" not in cell:
        return None
    return cell[: cell.index(":") + 1]


class _Values:
    """One piece's iteration lines read with the layout."""

    def __init__(
        self, wide: pl.DataFrame, odd: tuple[bool, ...], const: tuple[bool, ...], rest: pl.DataFrame
    ) -> None:
        self.wide, self.odd, self.const, self.rest = wide, odd, const, rest


class _Layout:
    """Each column's most common key, read from the last iteration lines. Columns are read
    by slicing off that key; cells holding another key (lines printed before grad norm
    existed, other forks) go through the generic key/value split."""

    def __init__(self, cols: list[str], sample: list[tuple], commas: bool) -> None:
        self.cols, self.sample, self.commas = cols, sample, commas
        self.prefixes: list[str | None] = []
        for j in range(len(cols)):
            seen: dict[str, int] = {}
            for row in sample:
                pre = _prefix(row[j])
                if pre is not None:
                    seen[pre] = seen.get(pre, 0) + 1
            self.prefixes.append(max(seen, key=seen.get) if seen else None)  # type: ignore[arg-type]
        self.same = [len({row[j] for row in sample}) == 1 for j in range(len(cols))]
        # What the compiled kernel takes: each column's key, and the text a column printing
        # the same on every line repeats (as values() tests it).
        self.keys = tuple(None if p is None else p.encode() for p in self.prefixes)
        first = sample[0] if sample else (None,) * len(cols)
        self.consts = tuple(
            cell.encode() if self.same[j] and cell is not None and pre else None
            for j, (cell, pre) in enumerate(zip(first, self.prefixes, strict=True))
        )

    @classmethod
    def of(cls, it: pl.DataFrame, cols: list[str], commas: bool) -> _Layout:
        return cls(cols, it.tail(_SAMPLE_ROWS).select(cols).rows(), commas)

    def values(self, it: pl.DataFrame) -> _Values:
        cols, prefixes, sample = self.cols, self.prefixes, self.sample
        # Columns where some cell holds another key (or no dominant key exists): only those
        # go through the slow path, and only their odd cells.
        odd_exprs = [
            (~pl.col(c).str.starts_with(p).fill_null(True)).any().alias(f"_odd{j}")
            if p
            else pl.col(c).str.contains(":", literal=True).any().alias(f"_odd{j}")
            for j, (c, p) in enumerate(zip(cols, prefixes, strict=True))
        ]
        # Columns that print the same text on every line (batch size, skipped-iteration
        # counts, a bf16 loss scale of 1.0) are parsed once instead of a million times.
        const_exprs = [
            (pl.col(c) == sample[0][j]).all().alias(f"_const{j}")
            if self.same[j] and sample[0][j] is not None and prefixes[j]
            else pl.lit(False).alias(f"_const{j}")
            for j, c in enumerate(cols)
        ]
        flags = it.select(*odd_exprs, *const_exprs).row(0)  # one pass for both
        odd, const = flags[: len(cols)], flags[len(cols) :]
        values = []
        others = []
        for j, (col, pre) in enumerate(zip(cols, prefixes, strict=True)):
            if pre is None:
                if odd[j]:
                    others.append(pl.col(col))
                continue
            if const[j]:
                # The same text on every line of this piece: read once. (If the column is the
                # same over the whole file, rows() puts the file's constant in.)
                y = pl.select(self._read(pl.lit(sample[0][j]), pre)).item()
                values.append(
                    pl.when(pl.col(col).is_not_null())
                    .then(pl.lit(y, dtype=pl.Float64))
                    .alias(f"_v{j}")
                )
                continue
            # Without odd cells every cell starts with the key: no need to check it again.
            values.append(self._read(pl.col(col), pre, check=bool(odd[j])).alias(f"_v{j}"))
            if odd[j]:
                ok = pl.col(col).str.starts_with(pre)
                others.append(pl.when(~ok.fill_null(True)).then(pl.col(col)).alias(col))
        wide = it.select("ln", "step", "wall_time", *values)
        rest = it.select("ln", "step", "wall_time", *others)
        rest_cols = rest.columns[3:]
        if rest_cols:
            kv = pl.any_horizontal(
                [pl.col(c).str.contains(":", literal=True) for c in rest_cols]
            ).fill_null(False)
            rest = rest.filter(kv)
        else:
            rest = rest.clear()
        return _Values(wide, odd, const, rest)

    def _read(self, cell: pl.Expr, pre: str, check: bool = True) -> pl.Expr:
        """The number after ``pre`` in a cell that starts with it (else null). ``check``
        False: every cell is known to start with ``pre`` (or be null)."""
        # Padding is plain spaces, and stripping only spaces is much faster than all
        # whitespace.
        text = cell.str.slice(len(pre)).str.strip_chars(" ")
        if self.commas:
            text = text.str.replace_all(",", "", literal=True)
        value = text.cast(pl.Float64, strict=False)
        return pl.when(cell.str.starts_with(pre)).then(value) if check else value

    def rows(self, pieces: list[_Values], ctx: Ctx) -> pl.DataFrame:
        """The rows of every piece: the common layout kept wide (``ctx.wide``), the others
        returned as long rows."""
        cols, prefixes, sample = self.cols, self.prefixes, self.sample
        odd = [any(p.odd[j] for p in pieces) for j in range(len(cols))]
        const = [all(p.const[j] for p in pieces) for j in range(len(cols))]
        # Not rechunked: the layout reads the columns one by one (a copy of 100 MB saved).
        wide = pl.concat([p.wide for p in pieces], rechunk=False)
        fixed = []
        for j, pre in enumerate(prefixes):
            if pre is None:
                continue
            if const[j]:
                x = pl.select(num(pl.lit(sample[0][j][len(pre) :]), self.commas)).item()
                # Only on the lines that print the key (a key added mid-run, by a later
                # version of the trainer, has no row before it).
                v = f"_v{j}"
                fixed.append(pl.when(pl.col(v).is_not_null()).then(pl.lit(x, pl.Float64)).alias(v))
        if fixed:
            wide = wide.with_columns(fixed)
        rest_cols = [c for j, c in enumerate(cols) if odd[j] and not const[j]]
        rest = pl.concat(
            [
                p.rest.select("ln", "step", "wall_time", *[_col(p.rest, c) for c in rest_cols])
                for p in pieces
            ]
        )
        return _finish(wide, rest, rest_cols, prefixes, ctx)


def _col(frame: pl.DataFrame, c: str) -> pl.Expr:
    return pl.col(c) if c in frame.columns else pl.lit(None, dtype=pl.Utf8).alias(c)


def _finish(
    wide: pl.DataFrame,
    rest: pl.DataFrame,
    rest_cols: list[str],
    prefixes: list[str | None],
    ctx: Ctx,
) -> pl.DataFrame:
    """Rows of the common layout kept wide (``ctx.wide``; the loss scale's non-positive
    values dropped), the other cells (``rest``) split into long rows."""
    kept: list[str] = []
    tags: list[str] = []
    split = _split_rows(rest, rest_cols) if rest.height else empty_rows()
    placeholder_norm = _zero_grad_norms(wide, prefixes, split)
    for j, pre in enumerate(prefixes):
        if pre is None:
            continue
        tag = pre[:-1].strip()
        if tag == "grad norm" and placeholder_norm:
            wide = wide.with_columns(pl.lit(None, dtype=pl.Float64).alias(f"_v{j}"))
        if tag == "loss scale":
            v = pl.col(f"_v{j}")
            bad = wide.select(v.filter(v <= 0).first()).item()
            if bad is not None:
                _scale_note(bad, ctx)
                wide = wide.with_columns(pl.when(v > 0).then(v).alias(f"_v{j}"))
        kept.append(f"_v{j}")
        tags.append(tag)
    # A line that matched "iteration N/" but gave no value at all is a bad line.
    found = [pl.col(c).is_not_null() for c in kept]
    no_fast = wide.filter(pl.sum_horizontal(found) == 0) if found else wide
    if placeholder_norm:
        split = split.filter(pl.col("tag") != "grad norm")
        note = (
            f"{ctx.name}: 'grad norm' printed as 0 on every iteration (not computed: the "
            "optimizer step belongs to DeepSpeed); those values were not used"
        )
        if note not in ctx.notes:
            ctx.notes.append(note)
    ctx.bad_lines += no_fast.filter(~pl.col("ln").is_in(split.get_column("ln").implode())).height
    # The rows of the common layout stay wide (one column per tag): the importer lays them
    # out in the order it needs, once (see WideRows).
    ctx.wide = WideRows(wide.select("ln", "step", "wall_time", *kept), tags)
    if split.height:
        scale = _real_scales(split.filter(pl.col("tag") == "loss scale"), ctx)
        return conform_rows(pl.concat([split.filter(pl.col("tag") != "loss scale"), scale]))
    return empty_rows()


def _zero_grad_norms(wide: pl.DataFrame, prefixes: list[str | None], split: pl.DataFrame) -> bool:
    """Whether every printed 'grad norm' is 0: Megatron-DeepSpeed prints ``grad norm: 0.000``
    on each iteration when DeepSpeed runs the optimizer step (beside ``loss scale: -1.0``); no
    training model has a gradient of norm exactly 0 on every step."""
    values = [
        wide.get_column(f"_v{j}").drop_nulls()
        for j, pre in enumerate(prefixes)
        if pre is not None and pre[:-1].strip() == "grad norm"
    ]
    if split.height:
        values.append(split.filter(pl.col("tag") == "grad norm").get_column("value").drop_nulls())
    n = sum(len(v) for v in values)
    return n > 0 and all(bool((v == 0).all()) for v in values if len(v))


def _scale_note(bad: float | None, ctx: Ctx) -> None:
    note = (
        f"{ctx.name}: 'loss scale' printed as {bad:g} "
        "(the scaler belongs to DeepSpeed); those values were not used"
    )
    if note not in ctx.notes:
        ctx.notes.append(note)


def _real_scales(block: pl.DataFrame, ctx: Ctx) -> pl.DataFrame:
    """Megatron-DeepSpeed prints loss scale -1 when DeepSpeed owns the scaler: not a measurement."""
    bad = block.filter(pl.col("value") <= 0)
    if bad.is_empty():
        return block
    _scale_note(bad.get_column("value")[0], ctx)
    return block.filter(pl.col("value") > 0)


def _wall_time(it: pl.DataFrame, sample: str) -> pl.Series:
    """Unix seconds from the line's date (the date parser caches what it parsed: dates
    repeat a lot, and a distinct date is parsed once)."""
    if not re.search(_DATE + r"\s*iteration", sample):
        return pl.Series("wall_time", [None] * it.height, dtype=pl.Float64)
    c0 = pl.col("c0")
    # The date sits right after the first "[": slicing and one fixed format are far cheaper
    # than a regex per line (fractions of a second are dropped).
    at = c0.str.find("[", literal=True)
    lo, hi, missing = it.select(at.min().alias("lo"), at.max().alias("hi"), at.null_count()).row(0)
    # The same offset on every line (a fixed-width prefix): sliced at a constant.
    fixed = lo is not None and lo == hi and not missing
    date = c0.str.slice(lo + 1, 19) if fixed else c0.str.slice(at + 1, 19)
    seconds = it.select(_seconds(date).alias("wall_time")).to_series()
    if seconds.null_count():
        # Dates printed with a "T" (or none at all): the "T" made a space, on these pieces
        # only (a date that parsed holds no "T": this gives it the same value).
        seconds = seconds.fill_null(
            it.select(_seconds(date.str.replace("T", " ", literal=True))).to_series()
        )
    return seconds


def _seconds(date: pl.Expr) -> pl.Expr:
    """A sliced ``YYYY-MM-DD HH:MM:SS`` -> unix seconds. As :func:`to_unix` with that format,
    without its "," -> "." step: a comma can't make these 19 characters match the format."""
    fmt = "%Y-%m-%d %H:%M:%S"
    return (
        date.str.to_datetime(fmt, strict=False, time_unit="us").dt.epoch("us").cast(pl.Float64)
        / 1e6
    )


def _split_rows(df: pl.DataFrame, cols: list[str], prefix: str = "") -> pl.DataFrame:
    long = (
        df.select("ln", "step", "wall_time", *cols)
        .unpivot(index=["ln", "step", "wall_time"], on=cols, value_name="cell")
        .filter(pl.col("cell").str.contains(":", literal=True))
        .with_columns(pl.col("cell").str.split_exact(":", 1).alias("_kv"))
        .unnest("_kv")
        .with_columns(
            (pl.lit(prefix) + pl.col("field_0").str.strip_chars()).alias("tag"),
            num(pl.col("field_1")).alias("value"),
        )
        .filter(pl.col("value").is_not_null())
        .sort("tag", "ln")
    )
    return conform_rows(long)


def _validation_rows(val: pl.DataFrame, cols: list[str]) -> pl.DataFrame:
    c0 = pl.col("c0")
    val = val.with_columns(
        c0.str.extract(r"iteration\s+(\d+)", 1).cast(pl.Int64, strict=False).alias("step"),
        to_unix(c0.str.extract(_DATE, 1)).alias("wall_time"),
        c0.str.contains(r"test (?:data|set)").alias("_test"),
    )
    out = []
    for is_test, grp in val.group_by("_test"):
        rows = _split_rows(grp, cols, prefix="test/" if is_test[0] else "")
        out.append(
            rows.with_columns(pl.when(pl.col("step").is_null()).then(pl.lit("prev")).alias("fill"))
        )
    return pl.concat(out) if out else empty_rows()
