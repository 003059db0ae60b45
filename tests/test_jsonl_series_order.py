"""A JSONL file read with no restart hands its rows over series after series (each tag's rows
in line order: :attr:`forensics.importers.jsonl.Lines.by_series`), so that the analysis view
takes each series as one slice instead of moving every row. The rows, the view and the
findings are those of the frame in line order; a file with a restart keeps line order."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import forensics.run as run_mod
from forensics.importers import jsonl, jsonl_blocks, read_run
from forensics.importers.base import Source
from forensics.pipeline import analyze_run
from tests.test_import_jsonl_blocks import _COUNTERS, CASES

# Every test twice: plain blocks read by the compiled kernel and by polars (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("jsonl_reader_path")


def _line_order(frame: pl.DataFrame) -> pl.DataFrame:
    """Rows series after series back in line order: a stable sort by line (within a line the
    rows then come in the file's key order, as the series do)."""
    return frame.with_row_index("_i").sort("file_idx", "record_idx", "_i").drop("_i")


def _real_shaped(n: int = 3000) -> bytes:
    """A metrics log as trainers write it: six train keys a line (one missing on some
    lines), per-layer norms every 50 lines, an eval line every 100, a re-logged step, lines
    with no step, a loss spike, and a few lines only the per-line reader takes (a string
    value, a bare NaN)."""
    rng = np.random.default_rng(17)
    out: list[str] = []
    for s in range(n):
        loss = 3.0 * math.exp(-s / 1500) + 0.02 * float(rng.standard_normal())
        if 2000 <= s < 2004:
            loss *= 8.0
        obj: dict[str, Any] = {
            "step": s,
            "_timestamp": 1.7e9 + 0.5 * s,
            "train/loss": loss,
            "train/lr": 1e-4 * min(1.0, s / 100),
            "train/grad_norm": 1.0 + 0.1 * float(rng.standard_normal()),
            "train/loss_scale": 65536.0,
            "train/tokens_per_sec": 1e5 + float(rng.integers(0, 1000)),
            "train/memory": 60.0 + s / 1e4,
        }
        if s % 7 == 3:
            del obj["train/lr"]  # a key missing on some lines
        if s % 50 == 0:
            for i in range(4):
                obj[f"grad_norm/layers.{i}"] = 0.05 + 0.001 * i
                obj[f"param_norm/layers.{i}"] = 40.0 + i
        line = json.dumps(obj)
        if s == 777:
            line = line.replace('"train/memory"', '"note": "warmup done", "train/memory"')
        if s == 1500:
            line = line.replace(
                f'"train/grad_norm": {obj["train/grad_norm"]}', '"train/grad_norm": NaN'
            )
        out.append(line)
        if s == 1234:  # the step logged again: its later value wins
            out.append(json.dumps({**obj, "train/loss": 0.5}))
        if s % 100 == 99:
            out.append(json.dumps({"step": s, "val/loss": 2.5 - s / 3000}))
        if s % 400 == 5:  # no step (a W&B summary-like line)
            out.append(json.dumps({"train/throughput": 9.0 + s}))
    return ("\n".join(out) + "\n").encode()


def _tag_runs(frame: pl.DataFrame) -> int:
    tags = frame.get_column("tag").to_physical()
    return int((tags.slice(1) != tags.slice(0, len(tags) - 1)).sum()) + 1


def _both_reads(raw: bytes, block: int | None) -> tuple[jsonl.Lines, jsonl.Lines]:
    """``raw`` read series after series and in line order, in blocks of ``block`` bytes (None:
    the reader's own size)."""
    old = jsonl_blocks.BLOCK
    try:
        jsonl_blocks.BLOCK = block or old
        return (
            jsonl.parse_lines(raw, "m.jsonl", by_series=True),
            jsonl.parse_lines(raw, "m.jsonl"),
        )
    finally:
        jsonl_blocks.BLOCK = old


@pytest.mark.parametrize("block", [4096, 20_000, None])
def test_series_after_series_are_the_line_order_rows(block: int | None) -> None:
    """Read in many small blocks or few: each tag one run, its rows in line order, and the
    same rows, notes and findings as the file read in line order."""
    raw = _real_shaped()
    by, plain = _both_reads(raw, block)
    assert by.by_series and not plain.by_series
    n_tags = by.frame.get_column("tag").n_unique()
    assert _tag_runs(by.frame) == n_tags
    per_tag = by.frame.group_by("tag", maintain_order=True).agg(pl.col("record_idx").diff().min())
    assert (per_tag.get_column("record_idx").drop_nulls() > 0).all()  # each tag in line order
    assert_frame_equal(_line_order(by.frame), plain.frame)
    got, want = jsonl.finish(by, "m.jsonl"), jsonl.finish(plain, "m.jsonl")
    assert _tag_runs(got.frame) == n_tags  # no restart: handed over series after series
    assert_frame_equal(_line_order(got.frame), want.frame)
    assert got.notes == want.notes
    assert [(f.kind, f.start_step, f.measures) for f in got.findings] == [
        (f.kind, f.start_step, f.measures) for f in want.findings
    ]


@pytest.mark.parametrize("name", sorted(CASES) + sorted(_COUNTERS))
def test_every_case_reads_the_same_rows_series_after_series(name: str) -> None:
    """The reader's cases (odd lines, nulls, counters that fall, a relative clock that starts
    again, steps that go back): the same rows, notes and findings as in line order; where the
    lines may hold a restart the rows stay in line order."""
    raw = CASES.get(name) or _COUNTERS[name]
    for block in (64, 7_000):
        old = jsonl_blocks.BLOCK
        try:
            jsonl_blocks.BLOCK = block
            by = jsonl.parse_lines(raw, "m.jsonl", by_series=True)
            plain = jsonl.parse_lines(raw, "m.jsonl")
        finally:
            jsonl_blocks.BLOCK = old
        assert (by.bad, by.config, by.relative_time, by.cut) == (
            plain.bad,
            plain.config,
            plain.relative_time,
            plain.cut,
        )
        if not by.by_series:  # (a step goes back or a relative clock starts again)
            assert by.frame.equals(plain.frame)
            assert not jsonl._no_restart(plain.frame, plain.tags)
        assert_frame_equal(_line_order(by.frame), plain.frame)
        if plain.frame.is_empty():
            continue
        got, want = jsonl.finish(by, "m.jsonl"), jsonl.finish(plain, "m.jsonl")
        assert_frame_equal(_line_order(got.frame), want.frame)
        assert got.notes == want.notes
        assert [(f.kind, f.start_step, f.measures, f.summary) for f in got.findings] == [
            (f.kind, f.start_step, f.measures, f.summary) for f in want.findings
        ]


@pytest.mark.parametrize("block", [2048, None])
def test_a_restart_keeps_line_order(block: int | None) -> None:
    """Steps that go back (a resumed job appending to its log), in one block or halfway
    through many: the rows in line order, the restart found as before."""
    raw = b"".join(
        json.dumps({"step": s, "loss": 1.0 / (s + 1), "lr": 0.1}).encode() + b"\n"
        for s in [*range(400), *range(260, 520)]
    )
    by, plain = _both_reads(raw, block)
    assert not by.by_series
    assert_frame_equal(by.frame, plain.frame)
    got = jsonl.finish(by, "m.jsonl")
    assert got.frame.get_column("record_idx").is_sorted()
    assert [f.kind.value for f in got.findings] == ["restart"]
    assert_frame_equal(got.frame, jsonl.finish(plain, "m.jsonl").frame)


def test_a_run_read_series_after_series_has_the_same_view_and_findings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole analysis on a run read series after series (in blocks of 4 KiB) and on the
    same file read in line order: the same view and findings; the view's order of the rows
    is a run a series at most."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.jsonl").write_bytes(_real_shaped())
    monkeypatch.setenv("FORENSICS_NO_CACHE", "1")
    monkeypatch.setattr(jsonl_blocks, "BLOCK", 4096)
    by = read_run(folder)
    read_lines = jsonl.read_lines
    monkeypatch.setattr(
        jsonl, "read_lines", lambda path, name, by_series=False: read_lines(path, name)
    )
    plain = read_run(folder)
    assert_frame_equal(_line_order(by.frame), plain.frame)

    runs: list[int] = []
    reorder = run_mod.Run._reorder

    def spy(self: run_mod.Run, plan: run_mod.ViewPlan) -> None:
        assert plan.order is not None
        breaks = run_mod._breaks(plan.order)
        assert breaks is not None
        runs.append(len(breaks) + 1)
        reorder(self, plan)

    monkeypatch.setattr(run_mod.Run, "_reorder", spy)
    view = by.view()
    # (a run of this size is gathered all the same; a large one is sliced, one run a series)
    assert runs == [] or runs[0] <= by.frame.get_column("tag").n_unique()
    assert_frame_equal(view, plain.view())
    a, b = analyze_run(by), analyze_run(plain)
    assert [(f.kind, f.metric, f.start_step, f.end_step, f.measures) for f in a.findings] == [
        (f.kind, f.metric, f.start_step, f.end_step, f.measures) for f in b.findings
    ]
    assert any(f.kind.value == "loss_spike" for f in a.findings)
    assert a.verdict == b.verdict


def test_the_importer_reads_series_after_series(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(_real_shaped(400))
    res = jsonl.IMPORTER.read(Source("jsonl", [path], "m.jsonl", tmp_path), jsonl.ReadOptions())
    assert _tag_runs(res.frame) == res.frame.get_column("tag").n_unique()


def test_export_reads_the_rows_in_line_order(tmp_path: Path) -> None:
    """ReadOptions(series_order=False), as export asks: the rows as read."""
    path = tmp_path / "m.jsonl"
    path.write_bytes(_real_shaped(400))
    src = Source("jsonl", [path], "m.jsonl", tmp_path)
    res = jsonl.IMPORTER.read(src, jsonl.ReadOptions(series_order=False))
    assert res.frame.get_column("record_idx").is_sorted()
    by = jsonl.IMPORTER.read(src, jsonl.ReadOptions())
    assert_frame_equal(_line_order(by.frame), res.frame)


def test_a_file_of_many_tags_is_laid_out_block_by_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """More (tag, block) pieces than are joined: each block series after series, each tag's
    rows still in line order; the same rows and findings."""
    raw = _real_shaped(1500)
    monkeypatch.setattr(jsonl_blocks, "BLOCK", 8192)
    monkeypatch.setattr(jsonl_blocks, "_MAX_PIECES", 4)
    by = jsonl.parse_lines(raw, "m.jsonl", by_series=True)
    plain = jsonl.parse_lines(raw, "m.jsonl")
    assert by.by_series
    assert _tag_runs(by.frame) > by.frame.get_column("tag").n_unique()
    assert_frame_equal(_line_order(by.frame), plain.frame)
    got, want = jsonl.finish(by, "m.jsonl"), jsonl.finish(plain, "m.jsonl")
    assert_frame_equal(_line_order(got.frame), want.frame)
    assert [(f.kind, f.start_step, f.measures) for f in got.findings] == [
        (f.kind, f.start_step, f.measures) for f in want.findings
    ]
