"""fairseq / metaseq ``--log-format json`` progress lines (values are strings)::

    2021-03-01 12:00:00 | INFO | train_inner | {"epoch": 1, "update": 0.021, "loss": "9.876", ..., "num_updates": "100", ...}
    2021-03-01 12:30:00 | INFO | valid | {"epoch": 1, "valid_loss": "9.1", ..., "valid_num_updates": "1000"}

The x axis is ``num_updates`` (``update`` is a fractional epoch). The end-of-epoch ``train``
line repeats the epoch averages with ``train_`` keys.
"""

from __future__ import annotations

import io
import re

import polars as pl

from forensics.importers.text.engine import Ctx, conform_rows, empty_rows, num, to_unix

NAME = "fairseq"
SNIFF = re.compile(r"\| (?:train_inner|train|valid\w*) \| \{")
_LINE = r"\| (?P<logger>train_inner|train|valid\w*) \| (?P<json>\{.*\})\s*$"
_SKIP = {
    "update",
    "num_updates",
    "train_num_updates",
    "valid_num_updates",
    "epoch",
    "train_epoch",
    "valid_epoch",
}


def sniff(sample: str) -> bool:
    return bool(SNIFF.search(sample))


def parse(ctx: Ctx) -> pl.DataFrame:
    line = pl.col("line")
    lines = (
        ctx.lines.filter(line.str.contains(r"\| (?:train_inner|train|valid\w*) \| \{"))
        .with_columns(
            line.str.extract_groups(_LINE).alias("g"),
            to_unix(line.str.extract(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", 1)).alias("wall_time"),
        )
        .unnest("g")
    )
    if lines.is_empty():
        return empty_rows()
    # All objects at once through polars' NDJSON reader (keys differ between loggers: the
    # union of columns, nulls elsewhere); a line whose object does not parse is skipped.
    ok = lines.filter(pl.col("json").str.json_path_match("$").is_not_null())
    ctx.bad_lines += lines.height - ok.height
    if ok.is_empty():
        return empty_rows()
    body = "\n".join(ok.get_column("json").to_list()).encode()
    objs = pl.read_ndjson(io.BytesIO(body), infer_schema_length=None)
    objs = objs.select([c for c in objs.columns if c not in ("ln", "wall_time", "logger")])
    long = pl.concat([ok.select("ln", "wall_time", "logger"), objs], how="horizontal")
    keys = list(objs.columns)
    steps = pl.coalesce(
        [
            num(pl.col(k).cast(pl.Utf8))
            for k in ("num_updates", "train_num_updates", "valid_num_updates")
            if k in keys
        ]
    )
    long = long.with_columns(
        steps.cast(pl.Int64, strict=False).alias("step")
        if keys
        else pl.lit(None, dtype=pl.Int64).alias("step")
    )
    parts = []
    for k in keys:
        if k in _SKIP:
            continue
        col = long.get_column(k)
        if not (col.dtype == pl.Utf8 or col.dtype.is_numeric()):
            continue
        val = num(pl.col(k).cast(pl.Utf8))
        parts.append(
            long.select(
                "ln", "step", "wall_time", val.alias("value"), pl.lit(k).alias("tag")
            ).filter(pl.col("value").is_not_null())
        )
    return conform_rows(pl.concat(parts)) if parts else empty_rows()
