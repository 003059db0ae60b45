"""Shortcuts of the import path (issue 17): each gives what the plain computation gives."""

from __future__ import annotations

import json

import polars as pl
import pytest

from forensics.importers import jsonl
from tests.test_import_jsonl_blocks import _COUNTERS, CASES


@pytest.mark.parametrize("name", sorted(CASES) + sorted(_COUNTERS))
@pytest.mark.parametrize("fast", [True, False])
def test_the_readers_tags_are_the_frames_tags(name: str, fast: bool) -> None:
    """Lines.tags (what the block reader saw) is the set of tags of the frame's rows, so the
    restart shortcut may take it instead of a pass over every row."""
    raw = CASES.get(name) or _COUNTERS[name]
    lines = jsonl.parse_lines(raw, "m.jsonl", fast=fast)
    assert lines.tags is not None
    want = lines.frame.get_column("tag").unique().cast(pl.String).to_list()
    assert sorted(lines.tags) == sorted(want)
    assert len(set(lines.tags)) == len(lines.tags)
    if not lines.frame.is_empty():
        assert jsonl._no_restart(lines.frame, lines.tags) == jsonl._no_restart(lines.frame)


def test_benchmark_shaped_tags() -> None:
    """A metrics log with per-layer norms every 50 lines, read in several blocks."""
    from forensics.importers import jsonl_blocks

    objs = []
    for s in range(400):
        o = {"step": s, "_timestamp": 1.7e9 + s, "train/loss": 1.0 / (s + 1), "epoch": s / 100}
        if s % 50 == 0:
            o.update({f"grad_norm/layers.{i}": 0.1 * i for i in range(12)})
        objs.append(o)
    raw = "".join(json.dumps(o) + "\n" for o in objs).encode()
    old = jsonl_blocks.BLOCK
    jsonl_blocks.BLOCK = 4096
    try:
        lines = jsonl.parse_lines(raw, "m.jsonl")
    finally:
        jsonl_blocks.BLOCK = old
    want = lines.frame.get_column("tag").unique().cast(pl.String).to_list()
    assert lines.tags is not None and sorted(lines.tags) == sorted(want)
    got = jsonl.finish(lines, "m.jsonl")
    plain = jsonl.finish(
        jsonl.Lines(lines.frame, lines.bad, lines.config, lines.relative_time, lines.cut), "m.jsonl"
    )
    assert got.frame.equals(plain.frame)
