"""llm.c: ``main.log`` (``llmc/logger.h``) and the stdout of ``train_gpt2cu``.

main.log::   s:10 trl:7.1235 lr:0.000060 norm:1.23      s:250 tel:6.9876      s:250 eval:0.2950
stdout::     step   10/74000 | loss 7.123456 (+0.12z)| norm 1.2345 (+0.10z)| lr 6.00e-05 |
                 123.45 ms | 45.6% bf16 MFU | 456789 tok/s
             val loss 6.202221                HellaSwag: 2493/10042 = 0.248257
older stdout: step 10/74000: train loss 7.123456 norm 1.2345 lr 6.00e-05 (123.45 ms, 45678 tok/s)

main.log's ``eval`` is HellaSwag accuracy; its tag is written as ``hellaswag``. On stdout the
validation and HellaSwag lines carry no step: they belong to the step printed just above
(main.log writes them at that same step number), or to step 0 before training starts.
"""

from __future__ import annotations

import re

import polars as pl

from forensics.importers.text.engine import (
    NUM,
    Ctx,
    conform_rows,
    matches,
    num,
    starts_a_line,
    wide_to_rows,
)

NAME = "llmc"
SNIFF = re.compile(
    r"(?m)^s:\d+ (?:trl|tel|eval):|^step\s+\d+/\d+ \| loss |^step\s+\d+/\d+: train loss "
)
_MAIN = (
    r"^s:(?P<step>\d+) (?P<kind>trl|tel|eval):(?P<v>\S+)(?: lr:(?P<lr>\S+))?"
    r"(?: norm:(?P<norm>\S+))?"
)
_NEW = (
    r"step\s+(?P<step>\d+)/\d+ \| loss\s+(?P<loss>\S+)\s*(?:\([^)]*\))?\s*\|"
    r"(?:\s*norm\s+(?P<norm>\S+)\s*(?:\([^)]*\))?\s*\|)?"
    r"(?:\s*lr\s+(?P<lr>\S+)\s*\|)?"
    r"(?:\s*(?P<ms>"
    + NUM
    + r")\s*ms)?(?:\s*\|\s*(?P<mfu>"
    + NUM
    + r")%\s*bf16 MFU)?(?:\s*\|\s*(?P<toks>"
    + NUM
    + r")\s*tok/s)?"
)
_OLD = (
    r"step\s+(?P<step>\d+)/\d+: train loss (?P<loss>\S+)(?: norm (?P<norm>\S+))?"
    r"(?: lr (?P<lr>\S+))?"
    r"(?: \((?P<ms>" + NUM + r") ms(?:, (?P<toks>" + NUM + r") tok/s)?\))?"
)
_STDOUT_TAGS = {
    "loss": "loss",
    "norm": "norm",
    "lr": "lr",
    "ms": "step_time (ms)",
    "mfu": "mfu (%)",
    "toks": "tok/s",
}


def sniff(sample: str) -> bool:
    return starts_a_line(sample, "s:", "step") and bool(SNIFF.search(sample))


def parse(ctx: Ctx) -> pl.DataFrame:
    line = pl.col("line")
    lines = ctx.lines
    parts = []
    main = matches(lines, line.str.contains(r"^s:\d+ "), _MAIN)
    if not main.is_empty():
        main = main.with_columns(
            pl.col("step").cast(pl.Int64, strict=False), num(pl.col("v")).alias("v")
        )
        for kind, tag in (("trl", "trl"), ("tel", "tel"), ("eval", "hellaswag")):
            grp = main.filter(pl.col("kind") == kind)
            cols = {"v": tag} if kind != "trl" else {"v": "trl", "lr": "lr", "norm": "norm"}
            grp = grp.with_columns(num(pl.col("lr")).alias("lr"), num(pl.col("norm")).alias("norm"))
            parts.append(wide_to_rows(grp, cols))
    for pattern in (_NEW, _OLD):
        st = matches(lines, line.str.contains(pattern), pattern)
        if st.is_empty():
            continue
        st = st.with_columns(
            pl.col("step").cast(pl.Int64, strict=False),
            *[num(pl.col(c)).alias(c) for c in _STDOUT_TAGS if c in st.columns],
        )
        parts.append(wide_to_rows(st, {c: t for c, t in _STDOUT_TAGS.items() if c in st.columns}))
    val = lines.filter(line.str.contains(r"^val loss ")).with_columns(
        num(line.str.extract(r"^val loss\s+(\S+)", 1)).alias("v")
    )
    parts.append(wide_to_rows(val, {"v": "val_loss"}, fill="prev0"))
    hs = lines.filter(line.str.contains(r"HellaSwag: \d+/\d+ = ")).with_columns(
        num(line.str.extract(r"HellaSwag: \d+/\d+ = (" + NUM + ")", 1)).alias("v")
    )
    parts.append(wide_to_rows(hs, {"v": "hellaswag"}, fill="prev0"))
    return pl.concat([conform_rows(p) for p in parts])
