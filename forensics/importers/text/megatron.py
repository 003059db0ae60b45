"""Megatron-LM and Megatron-DeepSpeed stdout (``training_log`` / ``evaluate_and_print_results``).

Iteration line (old forks lack the date, throughput and grad norm)::

     [2024-05-01 12:00:00] iteration      100/  500000 | consumed samples: 51200 | ...
     | lm loss: 7.123456E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations: 0 |

Validation line: `` validation loss at iteration 1000 | lm loss value: 2.3E+00 | lm loss PPL: 10.4 |``.

Speed matters here (1M-line logs): the file is split on ``|`` by polars' CSV reader, the
most common key layout is read column by column with plain slicing, and only the few lines
with another layout go through the slower key/value split.
"""

from __future__ import annotations

import re

import polars as pl

from forensics.importers.text.engine import Ctx, conform_rows, empty_rows, num, read_pipes, to_unix

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


def parse(ctx: Ctx) -> pl.DataFrame:
    n = _n_cols(ctx.sample)
    cells = read_pipes(ctx.raw, n)
    ctx.n_lines = cells.height
    cols = [f"c{i}" for i in range(1, n)]
    c0 = pl.col("c0")
    is_val = c0.str.contains("validation loss at", literal=True)
    val = cells.filter(is_val)
    it = cells.filter(c0.str.contains("iteration", literal=True) & c0.str.contains(r"iteration\s+\d+") & ~is_val)
    start = c0.str.find("iteration", literal=True) + 9
    it = it.with_columns(
        c0.str.slice(start, c0.str.find("/", literal=True) - start).str.strip_chars().cast(pl.Int64, strict=False).alias("step")
    )
    # Lines without "/" (some forks print "iteration 100 |"): fall back to a regex.
    it = it.with_columns(pl.coalesce("step", c0.str.extract(r"iteration\s+(\d+)", 1).cast(pl.Int64, strict=False)).alias("step"))
    has_date = bool(re.search(_DATE + r"\s*iteration", ctx.sample))
    it = it.with_columns(to_unix(c0.str.extract(_DATE, 1)).alias("wall_time") if has_date else pl.lit(None, dtype=pl.Float64).alias("wall_time"))
    # Several ranks printing the same iteration: keep the first copy.
    it = it.filter((pl.col("step") != pl.col("step").shift(1)).fill_null(True))
    ctx.line_steps = it.select("ln", "step")
    # DeepSpeed overflow lines have no "|": they sit whole in c0, so they are cheap to rule out here.
    ctx.overflow_hint = bool(cells.select(c0.str.contains(r"(?i)overflow|dynamic loss scale").any()).item())
    commas = bool(re.search(r"iteration[^\n]*\d,\d{3}\b", ctx.sample))
    rows = [_layout_rows(it, cols, commas)]
    if not val.is_empty():
        rows.append(_validation_rows(val, cols))
    out = pl.concat(rows) if rows else empty_rows()
    bad_scale = out.filter((pl.col("tag") == "loss scale") & (pl.col("value") <= 0))
    if bad_scale.height:
        # Megatron-DeepSpeed prints -1 when DeepSpeed owns the scaler: not a measurement.
        out = out.filter(~((pl.col("tag") == "loss scale") & (pl.col("value") <= 0)))
        ctx.notes.append(f"{ctx.name}: 'loss scale' printed as {bad_scale.get_column('value')[0]:g} "
                         "(the scaler belongs to DeepSpeed); those values were not used")
    return out


def _prefix(cell: str | None) -> str | None:
    if cell is None or ":" not in cell:
        return None
    return cell[: cell.index(":") + 1]


def _layout_rows(it: pl.DataFrame, cols: list[str], commas: bool = False) -> pl.DataFrame:
    """Read the dominant key layout column-wise; other lines go through the generic split."""
    if it.is_empty():
        return empty_rows()
    sample = it.tail(200).select(cols).rows()
    layouts: dict[tuple, int] = {}
    for row in sample:
        key = tuple(_prefix(c) for c in row)
        layouts[key] = layouts.get(key, 0) + 1
    layout = max(layouts, key=layouts.get)  # type: ignore[arg-type]
    match = pl.lit(True)
    for col, pre in zip(cols, layout):
        if pre is not None:
            match = match & pl.col(col).str.starts_with(pre).fill_null(False)
    it = it.with_columns(match.alias("_fast"))
    fast = it.filter(pl.col("_fast"))
    parts = []
    for col, pre in zip(cols, layout):
        if pre is None:
            continue
        tag = pre[:-1].strip()
        parts.append(
            fast.select("ln", "step", "wall_time", num(pl.col(col).str.slice(len(pre)), commas).alias("value"))
            .filter(pl.col("value").is_not_null())
            .with_columns(pl.lit(tag).alias("tag"))
        )
    slow = it.filter(~pl.col("_fast"))
    if not slow.is_empty():
        parts.append(_split_rows(slow, cols))
    # Each block holds one tag in line order (the restart check relies on it).
    return conform_rows(pl.concat(parts, how="diagonal")) if parts else empty_rows()


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
        c0.str.contains("test data", literal=True).alias("_test"),
    )
    out = []
    for is_test, grp in val.group_by("_test"):
        rows = _split_rows(grp, cols, prefix="test/" if is_test[0] else "")
        out.append(rows.with_columns(pl.when(pl.col("step").is_null()).then(pl.lit("prev")).alias("fill")))
    return pl.concat(out) if out else empty_rows()
