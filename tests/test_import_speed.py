"""Shortcuts of the import path (issue 17): each gives what the plain computation gives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
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


def _bench_lines(n: int) -> bytes:
    objs = []
    for s in range(n):
        o: dict[str, object] = {"step": s, "_timestamp": 1.7e9 + s, "train/loss": 1.0 / (s + 1)}
        if s % 50 == 0:
            o.update({f"grad_norm/layers.{i}": 0.1 * i for i in range(12)})
        if s == 333:
            o["note"] = "a string: this line goes to the per-line reader"
        objs.append(o)
    return "".join(json.dumps(o) + "\n" for o in objs).encode()


@pytest.mark.parametrize("block", [512, 4096, 1 << 20])
def test_file_blocks_equal_the_whole_text(tmp_path: Path, block: int) -> None:
    """read_lines (the file in blocks of whole lines, each chunk let go before its block is
    read) gives the rows of the per-line reader on the whole text."""
    from forensics.importers import jsonl_blocks

    raw = _bench_lines(1500)
    path = tmp_path / "m.jsonl"
    path.write_bytes(raw)
    old = jsonl_blocks.BLOCK
    jsonl_blocks.BLOCK = block
    try:
        got = jsonl.read_lines(path, "m.jsonl")
        with path.open("rb") as fh:
            assert b"".join(jsonl._file_blocks(fh, block)) == raw
    finally:
        jsonl_blocks.BLOCK = old
    slow = jsonl.parse_lines(raw, "m.jsonl", fast=False)
    assert got.frame.equals(slow.frame)
    assert (got.bad, got.cut) == (slow.bad, slow.cut)


def test_megatron_pieces_drop_rank_copies_across_their_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Megatron log read in pieces: a rank's copy of the last line of the piece before is
    dropped as in the whole read."""
    from forensics.importers.text import IMPORTER, megatron
    from tests.test_import_text_layout import _log, _source

    one = [line for line in _log(1500, seed=3, noise=True).split(b"\n") if line]
    lines = [x for line in one for x in (line, line)]  # every line printed by two ranks
    raw = b"".join(line + b"\n" for line in lines)
    whole = IMPORTER.read_raw(_source(tmp_path), raw)
    ends = np.cumsum([len(line) + 1 for line in lines])
    for every in (301, 451, 777):  # an odd number of lines: each bound splits a pair
        bounds = [0, *(int(ends[i - 1]) for i in range(every, len(lines) - 500, every))]
        spans = list(zip(bounds, [*bounds[1:], len(raw)], strict=True))
        assert len(spans) > 2
        monkeypatch.setattr(megatron, "_spans", lambda raw, size, spans=spans: spans)
        pieces = IMPORTER.read_raw(_source(tmp_path), raw)
        assert pieces.frame.equals(whole.frame)
        assert pieces.notes == whole.notes
        assert [f.to_dict() for f in pieces.findings] == [f.to_dict() for f in whole.findings]


def _text_samples() -> list[str]:
    from tests.conftest import ROOT

    out = []
    for p in sorted((ROOT / "sample_runs").rglob("*")):
        if p.is_file() and p.suffix in (".log", ".txt", ".out", ".err") and p.stat().st_size < 2e6:
            out.append(p.read_bytes().decode("utf-8", "replace"))
    lines = [
        "s:10 trl:2.5 lr:0.1",
        "step    10/100 | loss 2.5 | norm 1.0 |",
        "step 10/100: train loss 2.5",
        "iter 10: loss 2.5, time 10ms",
        "step 10: train loss 2.5, val loss 2.6",
        "step:10/100 train_loss:2.5",
        "[metric][batch=10]: loss/train: 2.5",
        "[step=10/100]",
        "Grad overflow on iteration 10",
        "[Rank 0] step=10, skipped=1, lr=[0.1]",
        "epoch: 1|step: 10|loss: 2.5|",
        "OVERFLOW! Rank 0 Skipping step.",
        "dynamic loss scale from 65536 to 32768",
    ]
    for line in lines:  # at a line's start, the text's start, mid-line, after a lone CR
        out += [line, "x\n" + line, "x " + line, "x\r" + line, "x\r\n" + line + "\n"]
    return out


@pytest.mark.parametrize("family", ["llmc", "nanogpt", "composer", "olmo", "deepspeed"])
def test_sniff_shortcut_equals_the_pattern(family: str) -> None:
    """A family's sniff looks for the literal its pattern needs before running the pattern:
    the same answer as the pattern alone."""
    import importlib

    mod = importlib.import_module(f"forensics.importers.text.{family}")
    samples = _text_samples()
    assert any(bool(mod.SNIFF.search(s)) for s in samples)
    for s in samples:
        assert mod.sniff(s) == bool(mod.SNIFF.search(s)), (family, s[:80])
