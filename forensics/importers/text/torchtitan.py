"""torchtitan stdout (``torchtitan/components/metrics.py``), ANSI colours already stripped::

    [rank0]:[titan] 2025-01-01 12:00:00,000 - root - INFO - step: 10  loss:  8.1234
        grad_norm:  1.2345  memory: 30.12GiB(38.02%)  tps: 6,123  tflops: 311.20  mfu: 31.46%
    ... validate step: 100  loss: 7.9  ...   (validation, kept under ``validation/``)

Values may carry thousands separators and units (``GiB``, ``%``), which are dropped.
"""

from __future__ import annotations

import re

import polars as pl

from forensics.importers.text.engine import NUM, Ctx, conform_rows, kv_rows, to_unix

NAME = "torchtitan"
SNIFF = re.compile(r"\bstep:\s*\d+\s+loss:\s*" + NUM)
_PAIR = r"(?P<key>[A-Za-z_][\w()/%]*):\s*(?P<val>" + NUM + r")"
_DATE = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)?)"


def sniff(sample: str) -> bool:
    # The literal first: the regex alone walks every word boundary of the sample.
    return "step:" in sample and bool(SNIFF.search(sample))


def parse(ctx: Ctx) -> pl.DataFrame:
    line = pl.col("line")
    st = ctx.lines.filter(line.str.contains(r"\bstep:\s*\d+\s+loss:")).with_columns(
        line.str.extract(r"\bstep:\s*(\d+)", 1).cast(pl.Int64, strict=False).alias("step"),
        to_unix(line.str.extract(_DATE, 1)).alias("wall_time"),
        line.str.contains(r"(?i)validat").alias("_val"),
        # The metrics start at "step:"; the logging prefix before it holds no metric.
        line.str.slice(line.str.find(r"\bstep:\s*\d")).alias("_m"),
    )
    train = kv_rows(st.filter(~pl.col("_val")), "_m", _PAIR)
    val = kv_rows(st.filter(pl.col("_val")), "_m", _PAIR, prefix="validation/")
    return pl.concat([conform_rows(train), conform_rows(val)]).filter(
        ~pl.col("tag").is_in(["step", "validation/step"])
    )
