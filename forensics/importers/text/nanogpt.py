"""nanoGPT and modded-nanogpt stdout.

nanoGPT (``train.py``)::        iter 100: loss 4.2345, time 123.45ms, mfu 35.12%
                                step 250: train loss 3.9876, val loss 4.0123
modded-nanogpt records::        step:1/6200 train_loss:10.9184 train_time:74701ms step_avg:nanms
                                step:0/6200 val_loss:10.9264 train_time:285ms step_avg:nanms

modded-nanogpt logs start with the training script's source; its ``print(f"step:{step}...")``
lines never match because the step there is not a number.
"""

from __future__ import annotations

import re

import polars as pl

from forensics.importers.text.engine import (
    NUM,
    Ctx,
    conform_rows,
    kv_rows,
    matches,
    num,
    starts_a_line,
    wide_to_rows,
)

NAME = "nanogpt"
SNIFF = re.compile(
    r"(?m)^iter \d+: loss |^step \d+: train loss |^step:\d+/\d+ (?:train_loss|val_loss):"
)
_ITER = (
    r"^iter (?P<step>\d+): loss (?P<loss>"
    + NUM
    + r")(?:, time (?P<ms>"
    + NUM
    + r")ms)?(?:, mfu (?P<mfu>"
    + NUM
    + r")%)?"
)
_EVAL = r"^step (?P<step>\d+): train loss (?P<tl>" + NUM + r"), val loss (?P<vl>" + NUM + ")"


def sniff(sample: str) -> bool:
    return starts_a_line(sample, "iter ", "step") and bool(SNIFF.search(sample))


def parse(ctx: Ctx) -> pl.DataFrame:
    line = pl.col("line")
    lines = ctx.lines
    parts = []
    it = matches(lines, line.str.contains(r"^iter \d+: loss "), _ITER)
    if not it.is_empty():
        it = it.with_columns(
            pl.col("step").cast(pl.Int64, strict=False),
            num(pl.col("loss")),
            num(pl.col("ms")),
            num(pl.col("mfu")),
        )
        parts.append(wide_to_rows(it, {"loss": "loss", "ms": "step_time (ms)", "mfu": "mfu (%)"}))
    ev = matches(lines, line.str.contains(r"^step \d+: train loss "), _EVAL)
    if not ev.is_empty():
        ev = ev.with_columns(
            pl.col("step").cast(pl.Int64, strict=False), num(pl.col("tl")), num(pl.col("vl"))
        )
        # The train loss printed at evaluation is an estimate over eval batches: kept apart.
        parts.append(wide_to_rows(ev, {"tl": "eval_train_loss", "vl": "val loss"}))
    md = lines.filter(line.str.contains(r"^step:\d+/\d+ ")).with_columns(
        line.str.extract(r"^step:(\d+)/", 1).cast(pl.Int64, strict=False).alias("step")
    )
    if not md.is_empty():
        parts.append(
            kv_rows(
                md, "line", r"(?P<key>[A-Za-z_]\w*):(?P<val>" + NUM + r")(?:ms)?(?:\s|$)"
            ).filter(pl.col("tag") != "step")
        )
        parts.append(_step_times(md))
    if not parts:
        return conform_rows(pl.DataFrame())
    return pl.concat([conform_rows(p) for p in parts])


def _step_times(md: pl.DataFrame) -> pl.DataFrame:
    """modded-nanogpt's ``train_time`` is a training clock (validation excluded) summed over
    the run: the time of a step is its increase since the training line before, over the
    steps between them (``step_time (ms)``). The clock starts over once (at step 10, after
    the warm-up steps it leaves out): a value below the one before is the time since that
    restart. The first training line has no line before it to measure from; ``step_avg``, a
    running mean of the clock, stays a raw series."""
    train = md.filter(pl.col("line").str.contains(r" train_loss:")).select(
        "ln",
        "step",
        num(pl.col("line").str.extract(r" train_time:(" + NUM + r")ms", 1)).alias("t"),
    )
    ds = pl.col("step").diff()
    dt = pl.col("t").diff()
    ms = pl.when(ds > 0).then(pl.when(dt >= 0).then(dt).otherwise(pl.col("t")) / ds)
    return wide_to_rows(train.with_columns(ms.alias("ms")), {"ms": "step_time (ms)"})
