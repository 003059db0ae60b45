"""The fallback for trainers not listed elsewhere: one step per line, then key-value pairs.

    step 120 | loss: 2.31 | lr 3e-4 | norm: 0.41 | tok/s 12,345
    Step 10 | loss:1.2345 lr:2e-05 tokens_per_second_per_gpu:1234.5       (torchtune DiskLogger)
    [it 300] loss=2.1, grad_norm=0.8, lr=1e-4
    | epoch 001:    100 / 1000 loss=9.876, nll_loss=9.8, num_updates=100  (fairseq simple)

A line counts when it names its step (``step``, ``iter``, ``iteration``, ``global_step``,
``num_updates``, ``it``, ``batch``) and holds at least two other numeric pairs. Keys may be
followed by ``:`` or ``=`` or only a space when the line separates its fields with ``|``.
"""

from __future__ import annotations

import re

import polars as pl

from forensics.importers.text.engine import NUM, Ctx, conform_rows, empty_rows, kv_rows, to_unix

NAME = "generic"
_STEP_KEYS = r"(?:global_step|num_updates|iteration|step|iter|it|batch)"
_STEP = r"(?i)(?:^|[\s\[|,(])" + _STEP_KEYS + r"\s*[:=#]?\s*(\d+)(?:\s*/\s*\d+)?(?:[\s\]|,):]|$)"
_PAIR_SIMPLE = r"(?P<key>[A-Za-z_][\w./\-()%]*)\s*[:=]\s*(?P<val>" + NUM + r")"
# One field of a "|"-separated line: the key may hold spaces and the ":" may be missing.
_SEGMENT = (
    r"^\s*(?P<key>[A-Za-z_][\w./\-()%]*(?: [A-Za-z_][\w./\-()%]*){0,3})\s*[:=]?\s*(?P<val>"
    + NUM
    + r")"
)
_DATE = r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)"
_MIN_PAIRS = 2


def sniff(sample: str) -> bool:
    """At least a few lines that look like per-step metric lines."""
    step = re.compile(_STEP.replace("(?i)", ""), re.I)
    pair = re.compile(_PAIR_SIMPLE)
    hits = 0
    for ln in sample.splitlines():
        if step.search(ln) and (len(pair.findall(ln)) >= _MIN_PAIRS or ln.count("|") >= 2):
            hits += 1
            if hits >= 3:
                return True
    return False


def parse(ctx: Ctx) -> pl.DataFrame:
    line = pl.col("line")
    cand = ctx.lines.filter(line.str.contains(_STEP)).with_columns(
        line.str.extract(_STEP, 1).cast(pl.Int64, strict=False).alias("step"),
        to_unix(line.str.extract(_DATE, 1)).alias("wall_time"),
        line.str.contains("|", literal=True).alias("_pipes"),
    )
    if cand.is_empty():
        return empty_rows()
    plain = kv_rows(cand.filter(~pl.col("_pipes")), "line", _PAIR_SIMPLE)
    segs = (
        cand.filter(pl.col("_pipes"))
        .with_columns(pl.col("line").str.split("|").alias("seg"))
        .explode("seg")
        .with_columns(pl.col("seg").str.count_matches(r"[:=]\s*" + NUM).alias("_n"))
    )
    multi = kv_rows(segs.filter(pl.col("_n") >= 2), "seg", _PAIR_SIMPLE)
    single = kv_rows(segs.filter(pl.col("_n") < 2), "seg", _SEGMENT)
    rows = pl.concat([conform_rows(plain), conform_rows(multi), conform_rows(single)]).sort(
        "ln", maintain_order=True
    )
    step_tag = r"(?i)^" + _STEP_KEYS + r"$"
    rows = rows.filter(
        ~pl.col("tag").str.contains(step_tag) & ~pl.col("tag").str.contains(r"(?i)^epoch(?: \d+)?$")
    )
    # Keep lines that hold enough pairs to be metric lines, not prose that mentions a step.
    good = rows.group_by("ln").len().filter(pl.col("len") >= _MIN_PAIRS).get_column("ln")
    return rows.filter(pl.col("ln").is_in(good.implode()))
