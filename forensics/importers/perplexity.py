"""A loss from a perplexity, for logs that write only the perplexity.

Perplexity is exp(loss) (the article, 2.1): a log whose training (or validation) series is a
perplexity and that has no loss of its own gets the loss as the natural log of it, under the
tag ``ln(<tag>)``, and a note says so. A base-2 perplexity (fairseq's 2^loss) gives the
loss in nats: the same curve scaled, which every detector's ratios and relative changes read
alike. Where the log has a loss (the val loss too: their units could differ), or several
perplexity series of one kind, nothing is derived.
"""

from __future__ import annotations

import re

import polars as pl

from forensics.schema import LOSS, SCHEMA, VAL_LOSS, held_out_set, normalize_tag

_PPL = re.compile(r"(?:^|[/_.\s])(?:ppl|perplexity)$", re.I)
_HELD_OUT = re.compile(r"(?:^|[/_.\s])(?:val|valid|validation|eval|test|dev)(?:[/_.\s]|$)", re.I)


def derive_losses(frame: pl.DataFrame, notes: list[str]) -> pl.DataFrame:
    """``frame`` (canonical columns) with a loss and a val loss derived from perplexities where
    it has none (see the module docstring); a note per derived series."""
    if frame.height == 0:
        return frame
    metrics = set(frame.get_column("metric").drop_nulls().unique().to_list())
    if LOSS in metrics:
        # (a val loss from a perplexity beside a logged loss could mix units: fairseq's loss
        # is in bits, its perplexity 2^loss)
        return frame
    tags = [t for t in frame.get_column("tag").drop_nulls().unique().to_list() if _PPL.search(t)]
    if not tags:
        return frame
    added = []
    for canon, held_out in ((LOSS, False), (VAL_LOSS, True)):
        if canon in metrics or (held_out and any(held_out_set(m) for m in metrics)):
            continue  # (a held-out loss of any eval set: the val loss is there)
        mine = [t for t in tags if bool(_HELD_OUT.search(normalize_tag(t))) is held_out]
        if len(mine) != 1:
            continue
        (tag,) = mine
        rows = frame.filter((pl.col("tag") == tag) & (pl.col("value") > 0)).with_columns(
            pl.col("value").log(),
            pl.lit(f"ln({tag})").cast(SCHEMA["tag"]).alias("tag"),
            pl.lit(canon).cast(SCHEMA["metric"]).alias("metric"),
        )
        if rows.height:
            added.append(rows)
            what = "val loss" if held_out else "loss"
            notes.append(
                f"{what}: the log has none; read as ln({tag}), the natural log of its "
                "perplexity (exp(loss))"
            )
    return pl.concat([frame, *added], how="vertical") if added else frame
