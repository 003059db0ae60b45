"""One value per line: ``STEP NAME VALUE``.

Karpathy's build-nanogpt (``train_gpt2.py``) writes ``log/log.txt`` this way::

    0 val 10.9503
    0 hella 0.2505
    0 train 10.955029
    1 train 10.193463

``train`` is the train loss, ``val`` the validation loss, ``hella`` the HellaSwag accuracy
(source aliases in :mod:`forensics.schema`). Any other name is kept as written, so the same
reader takes the generic family of ``STEP NAME VALUE`` lines (``120 loss 2.31``).
"""

from __future__ import annotations

import re

import polars as pl

from forensics.importers.text.engine import NUM, Ctx, conform_rows, matches, num

NAME = "step_name_value"
_LINE = r"^\s*(?P<step>\d+)\s+(?P<tag>[A-Za-z_][\w./\-]*)\s+(?P<val>" + NUM + r")\s*$"
_LINE_RE = re.compile(_LINE)
BUILD_NANOGPT = {"train", "val", "hella"}
_MIN_LINES = 3
_MIN_SHARE = 0.8  # of the non-empty lines of the sample: a log of nothing but such lines


def sniff(sample: str) -> bool:
    lines = [ln for ln in sample.splitlines() if ln.strip()]
    hits = sum(1 for ln in lines if _LINE_RE.match(ln))
    return hits >= _MIN_LINES and hits >= _MIN_SHARE * len(lines)


def parse(ctx: Ctx) -> pl.DataFrame:
    rows = matches(ctx.lines, pl.col("line").str.contains(_LINE), _LINE)
    if rows.is_empty():
        return conform_rows(pl.DataFrame())
    rows = rows.with_columns(
        pl.col("step").cast(pl.Int64, strict=False), num(pl.col("val")).alias("value")
    ).filter(pl.col("value").is_not_null())
    tags = set(rows.get_column("tag").unique().to_list())
    if tags <= BUILD_NANOGPT:
        ctx.notes.append(
            f"{ctx.name}: build-nanogpt log.txt (train = train loss, val = validation loss, "
            "hella = HellaSwag accuracy)"
        )
    return conform_rows(rows.select("ln", "step", "tag", "value"))
