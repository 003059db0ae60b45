"""MosaicML Composer ``FileLogger`` (``composer/loggers/file_logger.py``)::

    [metric][batch=12]: loss/train/total: 2.3456
    [hyperparameter]: lr: 0.0006

``batch`` counts optimizer steps. Hyper-parameters go to the run config.
"""

from __future__ import annotations

import re

import polars as pl

from forensics.importers.text.engine import NUM, Ctx, conform_rows, matches, num, starts_a_line

NAME = "composer"
SNIFF = re.compile(r"(?m)^\[metric\]\[batch=\d+\]:")
_METRIC = r"^\[metric\]\[batch=(?P<step>\d+)\]:\s*(?P<tag>.+?):\s*(?P<val>" + NUM + r")\s*$"
_HPARAM = r"^\[hyperparameter\]:\s*(?P<key>.+?):\s*(?P<val>.*?)\s*$"


def sniff(sample: str) -> bool:
    return starts_a_line(sample, "[metric][batch=") and bool(SNIFF.search(sample))


def parse(ctx: Ctx) -> pl.DataFrame:
    line = pl.col("line")
    m = matches(ctx.lines, line.str.starts_with("[metric][batch="), _METRIC)
    rows = m.select(
        "ln", pl.col("step").cast(pl.Int64, strict=False), "tag", num(pl.col("val")).alias("value")
    ).filter(pl.col("value").is_not_null() & pl.col("step").is_not_null())
    hp = matches(ctx.lines, line.str.starts_with("[hyperparameter]:"), _HPARAM)
    for key, val in hp.select("key", "val").iter_rows():  # a handful of lines
        if key:
            ctx.config[key] = _scalar(val)
    return conform_rows(rows)


def _scalar(text: str | None) -> object:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text
