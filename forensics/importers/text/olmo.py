"""OLMo console metrics (``olmo/train.py::log_metrics_to_console``): a header line per step,
then one indented ``name=value`` line per metric (values above 1000 printed with ``,``)::

    [step=10/739328]                       (newer: [step=10/739328,eta=1d2h])
        train/CrossEntropyLoss=2.345
        optim/total_grad_norm=0.4567
        throughput/device/tokens_per_second=9,876
"""

from __future__ import annotations

import re

import polars as pl

from forensics.importers.text.engine import (
    NUM,
    Ctx,
    conform_rows,
    empty_rows,
    kv_rows,
    starts_a_line,
)

NAME = "olmo"
SNIFF = re.compile(r"(?m)^\[step=\d+/\d+")
_PAIR = r"^\s+(?P<key>[A-Za-z_][\w/().\- ]*?)=(?P<val>" + NUM + r")\s*$"


def sniff(sample: str) -> bool:
    return starts_a_line(sample, "[step=") and bool(SNIFF.search(sample))


def parse(ctx: Ctx) -> pl.DataFrame:
    line = pl.col("line")
    lines = ctx.lines
    heads = lines.filter(line.str.contains(r"^\[step=\d+/")).select(
        "ln", line.str.extract(r"^\[step=(\d+)/", 1).cast(pl.Int64, strict=False).alias("step")
    )
    if heads.is_empty():
        return empty_rows()
    body = lines.filter(line.str.contains(r"^\s+[A-Za-z_][\w/().\- ]*?=" + NUM + r"\s*$"))
    # Each metric line belongs to the step header above it.
    body = (
        body.sort("ln")
        .join_asof(heads.sort("ln"), on="ln", strategy="backward")
        .filter(pl.col("step").is_not_null())
    )
    return conform_rows(kv_rows(body, "line", _PAIR))
