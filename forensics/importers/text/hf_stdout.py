"""HF Trainer's stdout: the log dicts it prints between its progress bars.

transformers 5 prints the values as strings, 4 as numbers::

    {'loss': '4.036', 'grad_norm': '0.5783', 'learning_rate': '0.0028', 'epoch': '0.07812'}
     8%|▊         | 5/60 [00:00<00:00, 140.58it/s]
    {'eval_loss': '4.037', 'eval_runtime': '0.0108', ..., 'epoch': '0.3125'}
    {'loss': 2.3456, 'grad_norm': 1.2345678, 'learning_rate': 4.9e-05, 'epoch': 0.01}

A dict names no step. The training progress bar that follows it does (``5/60``: the dict
was printed at step 5, before the bar was redrawn); the evaluation's own bars (``3/8``) are
told apart by their total. Without a progress bar (``disable_tqdm``) the dicts are numbered
in the order printed (x is then the log's points, not steps). The end-of-training summary
(``train_runtime``, ``train_loss``: the mean loss of the run) is no point of the curves and is
left out.
"""

from __future__ import annotations

import re

import polars as pl

from forensics.importers.text.engine import NUM, Ctx, conform_rows, empty_rows, kv_rows

NAME = "hf_stdout"
SNIFF = re.compile(r"(?m)^\{'(?:loss|eval_loss)': '?" + NUM)
_DICT = r"^\{'(?:loss|eval_\w+)': "
_PAIR = r"'(?P<key>[A-Za-z_][\w/.\-]*)': '?(?P<val>" + NUM + r")'?(?:,|\}|$)"
# A progress bar with no description (the Trainer's own; "Writing model shards: 100%|...| 1/1"
# is another): its count and total, " 8%|▊         | 5/60 [".
_OWN_STEP = r"'(?:global_)?step': '?(\d+)'?(?:,|\})"
_BAR = r"^\s*\d+%\|[^|]*\|\s*(\d+)/(\d+) \["


def sniff(sample: str) -> bool:
    return ("\n{'loss': " in sample or sample.startswith("{'loss': ")) and bool(
        SNIFF.search(sample)
    )


def parse(ctx: Ctx) -> pl.DataFrame:
    line = pl.col("line")
    lines = ctx.lines
    dicts = lines.filter(line.str.contains(_DICT) & ~line.str.contains("'train_runtime': "))
    if dicts.is_empty():
        return empty_rows()
    bars = lines.filter(line.str.contains(_BAR)).select(
        "ln",
        line.str.extract(_BAR, 1).cast(pl.Int64, strict=False).alias("count"),
        line.str.extract(_BAR, 2).cast(pl.Int64, strict=False).alias("total"),
    )
    first = dicts.filter(line.str.starts_with("{'loss': ")).get_column("ln").first()
    after = bars.filter(pl.col("ln") > (first if first is not None else -1))
    own = line.str.extract(_OWN_STEP, 1).cast(pl.Int64, strict=False)
    if dicts.select(own.is_not_null().all()).item():
        # Dicts that carry their own step (a script printing the same shape with a "step"
        # key): that step, not the bar's.
        steps = dicts.with_columns(own.alias("step"))
    elif after.is_empty():
        # No progress bar: the dicts in the order printed (evaluations take the training
        # point before them).
        ctx.x_kind = "points"
        train = line.str.starts_with("{'loss': ")
        steps = dicts.with_columns(
            pl.when(train).then(train.cast(pl.Int64).cum_sum()).alias("step")
        ).with_columns(pl.col("step").forward_fill().fill_null(0))
    else:
        # The training bar is the one drawn first after the first training dict; the dict's
        # step is the count that bar shows next.
        total = after.get_column("total").first()
        main = bars.filter(pl.col("total") == total).select("ln", pl.col("count").alias("step"))
        steps = dicts.sort("ln").join_asof(main.sort("ln"), on="ln", strategy="forward")
        late = steps.get_column("step").null_count()
        if late:
            # A job that ended as it logged: no bar after the dict says its step (the last
            # count shown is an earlier step's). Counted, not guessed.
            ctx.notes.append(
                f"{ctx.name}: {late} log line(s) printed after the last progress bar left out "
                "(no bar after them gives their step)"
            )
            steps = steps.filter(pl.col("step").is_not_null())
    if dicts.select(line.str.starts_with("{'loss': '").any()).item():
        # (transformers 5 prints each value to 4 significant digits, as strings)
        ctx.notes.append(
            f"{ctx.name}: HF Trainer's stdout gives its values to 4 significant digits "
            "(trainer_state.json in the output folder keeps them whole)"
        )
    rows = kv_rows(steps, "line", _PAIR).filter(~pl.col("tag").is_in(["step", "global_step"]))
    return conform_rows(rows) if not rows.is_empty() else empty_rows()
