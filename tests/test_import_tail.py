"""The shared tail of every import (issue 17): ``add_canonical`` finds the tags a frame holds
from their physical codes (not a hash of every row) and must give, bit for bit, the frame a
lookup per row gives, on frames shaped like a real import: several sources, per-layer tags,
user aliases, rows without a tag, columns in many chunks, tag codes with gaps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from forensics.importers import ReadOptions, Source, finish_source
from forensics.importers.base import ImportResult
from forensics.schema import (
    COLUMNS,
    SCHEMA,
    _present_tags,
    _unique_tags,
    add_canonical,
    canonicalize,
    conform,
)

_TAGS = [
    "train/loss",
    "train/lr",
    "train/grad_norm",
    "train/loss_scale",
    "eval/wiki_loss",
    "val/loss",
    "tokens_per_sec",
    "my_custom_thing",
    "not/a/vital",
    *[f"grad_norm/layers.{i}" for i in range(12)],
    *[f"param_norm/model.layers.{i}.mlp" for i in range(0, 12, 3)],
    *[f"act_absmax/layers.{i}" for i in (1, 7)],
]
_ALIASES = {"my_custom_thing": "throughput", "not/a/vital": "eval/custom"}


def _plain(frame: pl.DataFrame, source: str | None, aliases: dict[str, str]) -> pl.DataFrame:
    """Metric and layer by a lookup per row: the plain computation."""
    extra = tuple(sorted(aliases.items()))
    tags = frame.get_column("tag").cast(pl.Utf8).to_list()
    pairs = [canonicalize(t, source, extra) if t is not None else (None, None) for t in tags]
    return (
        conform(frame)
        .with_columns(
            pl.Series("metric", [m for m, _ in pairs], dtype=SCHEMA["metric"]),
            pl.Series("layer", [n for _, n in pairs], dtype=SCHEMA["layer"]),
        )
        .select(COLUMNS)
    )


def _source_frame(source: str, tags: list[str | None], steps: int, blocks: int) -> pl.DataFrame:
    """A reader's frame: every tag logged at every step, appended in ``blocks`` chunks."""
    rng = np.random.default_rng(steps + len(tags))
    parts = []
    per = -(-steps // blocks)
    for b in range(blocks):
        s = np.arange(b * per, min(steps, (b + 1) * per), dtype=np.int64)
        n = len(s) * len(tags)
        parts.append(
            pl.DataFrame(
                {
                    "source": [source] * n,
                    "file": [f"{source}/part{b % 2}"] * n,
                    "file_idx": np.full(n, b % 2, dtype=np.int64),
                    "record_idx": np.repeat(s, len(tags)),
                    "step": np.repeat(s, len(tags)),
                    "x_kind": ["step"] * n,
                    "tag": pl.Series(tags * len(s), dtype=pl.Utf8),
                    "value": rng.standard_normal(n),
                    "wall_time": 1.7e9 + np.repeat(s, len(tags)).astype(np.float64),
                    "segment": np.zeros(n, dtype=np.int64),
                }
            )
        )
    frame = conform(pl.concat(parts, how="vertical", rechunk=False))
    assert blocks == 1 or frame.get_column("tag").n_chunks() > 1
    return frame


@pytest.mark.parametrize("blocks", [1, 5])
@pytest.mark.parametrize("with_null", [False, True])
def test_add_canonical_is_the_lookup_per_row(blocks: int, with_null: bool) -> None:
    # Other strings categorised first and in between: the frame's tag codes have gaps.
    pl.Series([f"unrelated/{i}" for i in range(50)], dtype=SCHEMA["tag"])
    tags: list[str | None] = [*_TAGS, None] if with_null else list(_TAGS)
    frames, wants = [], []
    for source, order in (("jsonl", tags), ("tfevents", tags[::-1][:20])):
        frame = _source_frame(source, list(order), steps=400, blocks=blocks)
        pl.Series([f"between/{source}/{i}" for i in range(30)], dtype=SCHEMA["tag"])
        got = add_canonical(frame, source, _ALIASES)
        want = _plain(frame, source, _ALIASES)
        assert got.schema == want.schema == pl.Schema(SCHEMA)
        assert got.equals(want)
        assert got.get_column("layer").drop_nulls().n_unique() > 1
        frames.append(got)
        wants.append(want)
    # Several sources merged as merge_job does: still the per-row mapping of each source.
    merged = pl.concat(frames, how="vertical")
    assert merged.equals(pl.concat(wants, how="vertical"))
    assert merged.filter(pl.col("metric") == "grad_norm_layer").height == 2 * 400 * 12


def test_present_tags_are_the_unique_tags() -> None:
    pl.Series(["gap/a", "gap/b"], dtype=SCHEMA["tag"])
    col = _source_frame("jsonl", [*_TAGS, None], steps=50, blocks=3).get_column("tag")
    codes, names = _present_tags(col)
    unique = col.unique().drop_nulls()
    assert sorted(names) == sorted(unique.cast(pl.Utf8).to_list())
    assert codes.tolist() == sorted(unique.to_physical().to_list())
    assert pl.Series(names, dtype=SCHEMA["tag"]).to_physical().to_list() == codes.tolist()
    # The fallback for a polars without dtype.categories: the same pairs in another order.
    by_hash = _unique_tags(col)
    pairs = sorted(zip(by_hash[0].tolist(), by_hash[1], strict=True))
    assert pairs == list(zip(codes.tolist(), names, strict=True))
    empty = pl.Series("tag", [None, None], dtype=SCHEMA["tag"])
    assert _present_tags(empty)[1] == [] and _present_tags(empty.head(0))[1] == []


def test_finish_source_of_a_chunked_result_is_the_plain_frame(tmp_path: Path) -> None:
    frame = _source_frame("jsonl", list(_TAGS), steps=300, blocks=6)
    res = ImportResult(frame=frame)
    src = Source("jsonl", [tmp_path / "m.jsonl"], ".", tmp_path)
    out, notes = finish_source(src, res, ReadOptions(aliases=_ALIASES))
    assert notes == []
    assert out.frame.equals(_plain(frame, "jsonl", _ALIASES))
    assert all(out.frame.select(c).n_chunks() == 1 for c in out.frame.columns)
