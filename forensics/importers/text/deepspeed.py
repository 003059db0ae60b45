"""DeepSpeed text logs: fp16 loss-scale events, the engine's step/timer lines, DeepSpeed-Chat.

Loss-scale lines, in the spellings DeepSpeed versions print::

    Grad overflow on iteration 145                                   (fused/unfused optimizer)
    Reducing dynamic loss scale from 128.0 to 64.0
    [Rank 0] Overflow detected. Skipping step. Attempted loss scale: 128.0, reducing to 64.0
    [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768
    [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, but hysteresis
        is 2. ...
    [deepspeed] fp16 dynamic loss scale overflow! Rank 0 Skipping step. Attempted loss scale:
        4294967296, reducing to 2147483648

Each event becomes a ``loss_scale_reduced_to`` row (the new scale) and an ``overflow`` row
(1.0 per skipped step). A line naming its iteration gives the step; a line that does not
takes the iteration of the overflow line just above it, else the next step the log prints
(the step line is written after the step that overflowed), else its order in the file.
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
    num,
    to_unix,
    wide_to_rows,
)

NAME = "deepspeed"
SNIFF = re.compile(
    r"Grad overflow on iteration|OVERFLOW!|Overflow detected|dynamic loss scale from|"
    r"\[Rank \d+\] step=\d+, skipped=\d+|epoch: \d+\|step: \d+\|"
)
OVERFLOW_TAG = "overflow"
SCALE_TAG = "loss_scale_reduced_to"
# "No Grad overflow for N iterations. Increasing dynamic loss scale from X to Y"
SCALE_UP_TAG = "loss_scale_increased_to"
EVENT_TAGS = (OVERFLOW_TAG, SCALE_TAG, SCALE_UP_TAG)
_DATE = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)?)\]"
_FILTER = (
    r"(?i:verflow)|dynamic loss scale from|step=\d+, skipped=|global_step=\d+|\|step: \d+\||"
    r"average reward score|higher is better"
)


# A literal every alternative of SNIFF holds: the pattern runs only when one is there.
_SNIFF_LITERALS = (
    "Grad overflow on iteration",
    "OVERFLOW!",
    "Overflow detected",
    "dynamic loss scale from",
    "[Rank ",
    "epoch: ",
)


def sniff(sample: str) -> bool:
    return any(x in sample for x in _SNIFF_LITERALS) and bool(SNIFF.search(sample))


def applies(ctx: Ctx) -> bool:
    """Overflow lines can sit anywhere in a long log: test the whole text (a byte scan),
    unless a family already looked at every line."""
    if ctx.overflow_hint is not None:
        return ctx.overflow_hint
    return b"verflow" in ctx.raw or b"OVERFLOW" in ctx.raw


def parse(ctx: Ctx) -> pl.DataFrame:
    lines = ctx.lines.filter(pl.col("line").str.contains(_FILTER))
    if lines.is_empty():
        return empty_rows()
    line = pl.col("line")
    lines = lines.with_columns(to_unix(line.str.extract(_DATE, 1)).alias("wall_time"))
    events = _events(lines)
    metrics = _metrics(lines)
    return pl.concat([events, metrics], how="diagonal")


def _events(lines: pl.DataFrame) -> pl.DataFrame:
    line = pl.col("line")
    ev = lines.select(
        "ln",
        "wall_time",
        line.str.extract(r"Grad overflow on iteration\s+(\d+)", 1)
        .cast(pl.Int64, strict=False)
        .alias("it"),
        num(
            line.str.extract(
                r"(?:reducing to|Reducing dynamic loss scale from\s+"
                + NUM
                + r"\s+to)\s+("
                + NUM
                + ")",
                1,
            )
        ).alias("scale"),
        num(
            line.str.extract(
                r"Increasing dynamic loss scale from\s+" + NUM + r"\s+to\s+(" + NUM + ")", 1
            )
        ).alias("up"),
        line.str.contains(
            r"(?i)overflow!|overflow detected|grad overflow on iteration|skipping step"
        ).alias("skip"),
    ).filter(
        pl.col("it").is_not_null()
        | pl.col("scale").is_not_null()
        | pl.col("up").is_not_null()
        | pl.col("skip")
    )
    if ev.is_empty():
        return empty_rows()
    # Anchor lines: "Grad overflow on iteration N" (gives its step to the lines right after
    # it) and the engine's step lines (which end an overflow event).
    anchors = pl.concat(
        [
            ev.filter(pl.col("it").is_not_null()).select("ln", pl.col("it").alias("anchor")),
            lines.filter(
                line.str.contains(r"step=\d+, skipped=|global_step=\d+|\|step: \d+\|")
            ).select("ln", pl.lit(None, dtype=pl.Int64).alias("anchor")),
        ]
    ).sort("ln")
    ev = ev.sort("ln").join_asof(anchors, on="ln", strategy="backward")
    ev = ev.with_columns(pl.coalesce("it", "anchor").alias("step"))
    overflow = ev.filter(pl.col("skip")).select(
        "ln", "step", "wall_time", pl.lit(OVERFLOW_TAG).alias("tag"), pl.lit(1.0).alias("value")
    )
    scale = ev.filter(pl.col("scale").is_not_null()).select(
        "ln", "step", "wall_time", pl.lit(SCALE_TAG).alias("tag"), pl.col("scale").alias("value")
    )
    up = ev.filter(pl.col("up").is_not_null()).select(
        "ln", "step", "wall_time", pl.lit(SCALE_UP_TAG).alias("tag"), pl.col("up").alias("value")
    )
    rows = conform_rows(pl.concat([overflow, scale, up])).with_columns(pl.lit("next").alias("fill"))
    return rows.sort("ln")


def dedupe_events(rows: pl.DataFrame) -> pl.DataFrame:
    """Once steps are known: one overflow row per step, one scale row per (step, new scale)."""
    ev = rows.filter(pl.col("tag").is_in(EVENT_TAGS))
    if ev.is_empty():
        return rows
    ev = ev.sort("ln").unique(subset=["tag", "step", "value"], keep="first", maintain_order=True)
    return pl.concat([rows.filter(~pl.col("tag").is_in(EVENT_TAGS)), ev])


def _skipped_in_interval() -> pl.Expr:
    """The steps skipped since the engine's previous step line, from its running count
    (``skipped=N`` counts every step skipped since the start, a checkpoint's count carried
    over on resume), as Megatron's per-interval "number of skipped iterations". Null where
    the interval is unknown: a first line with steps already skipped (a resumed job's count
    covers steps before the log), or a count that went down (a job restarted without its
    state); a step printed again (another rank, or a resume) counts nothing twice."""
    skipped, step = pl.col("skipped"), pl.col("step")
    prev = skipped.shift(1)
    first = prev.is_null()
    return (
        pl.when(first & (skipped == 0))
        .then(0.0)
        .when(first | (skipped < prev) | (step <= step.shift(1)))
        .then(None)
        .otherwise(skipped - prev)
        .alias("skipped_iters")
    )


def _metrics(lines: pl.DataFrame) -> pl.DataFrame:
    line = pl.col("line")
    parts = []
    # Engine: "[Rank 0] step=10, skipped=10, lr=[5e-05, 5e-05], mom=[...]"
    st = lines.filter(line.str.contains(r"step=\d+, skipped=\d+")).with_columns(
        line.str.extract(r"step=(\d+), skipped=", 1).cast(pl.Int64, strict=False).alias("step"),
        num(line.str.extract(r"skipped=(\d+)", 1)).alias("skipped"),
        num(line.str.extract(r"lr=\[?\s*(" + NUM + ")", 1)).alias("lr"),
    )
    st = st.with_columns(_skipped_in_interval())
    tags = {"skipped": "skipped_steps", "skipped_iters": "skipped_iters", "lr": "lr"}
    parts.append(wide_to_rows(st, tags))
    # Timer: "epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=...,
    # CurrSamplesPerSec=..., MemAllocated=4.34GB, MaxMemAllocated=12.81GB"
    tm = lines.filter(line.str.contains(r"global_step=\d+,")).with_columns(
        line.str.extract(r"global_step=(\d+)", 1).cast(pl.Int64, strict=False).alias("step")
    )
    parts.append(
        kv_rows(
            tm,
            "line",
            r"(?P<key>RunningAvgSamplesPerSec|CurrSamplesPerSec|MemAllocated|MaxMemAllocated)=(?P<val>"
            + NUM
            + ")",
        )
    )
    # DeepSpeed-Chat RLHF:
    # "epoch: 0|step: 12|ppo_ep: 1|act_loss: 0.20|cri_loss: 0.12|unsuper_loss: 0.0"
    chat = lines.filter(line.str.contains(r"\|step: \d+\|")).with_columns(
        line.str.extract(r"\|step: (\d+)\|", 1).cast(pl.Int64, strict=False).alias("step")
    )
    rows = kv_rows(chat, "line", r"(?P<key>[A-Za-z_][\w ]*?):\s*(?P<val>" + NUM + r")\s*(?:\||$)")
    parts.append(rows.filter(~pl.col("tag").is_in(["step", "epoch", "ppo_ep"])))
    # DeepSpeed-Chat: "average reward score: -0.67" after each step; reward-model evaluations.
    rew = lines.filter(line.str.contains("average reward score", literal=True)).with_columns(
        num(line.str.extract(r"average reward score:\s*(" + NUM + ")", 1)).alias("reward")
    )
    parts.append(wide_to_rows(rew, {"reward": "reward"}, fill="prev"))
    ev = lines.filter(line.str.contains("higher is better", literal=True))
    parts.append(
        kv_rows(
            ev,
            "line",
            r"(?P<key>[A-Za-z_]\w*) \(higher is better\)\s*:\s*(?P<val>" + NUM + ")",
            fill="prev0",
            prefix="eval/",
        )
    )
    return pl.concat([conform_rows(p) for p in parts])
