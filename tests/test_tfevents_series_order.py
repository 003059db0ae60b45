"""Event files read for analysis (``ReadOptions.series_order``) with no restart hand their rows
over tag after tag (tags in the order the files first showed them, each tag's rows in record
order), as the JSONL reader does, so that the analysis view takes each series as one slice
instead of moving every row of the finished frame. The rows, the view and the findings are
those of the frame in record order; a job that may restart keeps record order. Real files
from tensorboardX and torch's SummaryWriter."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import forensics.importers.tfevents as tfevents
from forensics.importers import ReadOptions, read_run
from forensics.pipeline import analyze_run

pytest.importorskip("tensorboardX")


def _record_order(frame: pl.DataFrame) -> pl.DataFrame:
    # (one value a record: tensorboardX and torch write a scalar a record)
    return frame.sort("file_idx", "record_idx", maintain_order=True)


def _tag_runs(frame: pl.DataFrame) -> int:
    tags = frame.get_column("tag").to_physical()
    return int((tags.slice(1) != tags.slice(0, len(tags) - 1)).sum()) + 1


def _write_run(logdir: Path, steps: range, *, relog: int | None = None) -> None:
    """A training job as trainers log it: six vitals a step (the LR only on some), per-layer
    norms every 50 steps, validation every 100, a loss spike, one step logged again."""
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(5)
    w = SummaryWriter(str(logdir))
    for s in steps:
        loss = 3.0 * math.exp(-s / 1500) + 0.02 * float(rng.standard_normal())
        if 1200 <= s < 1204:
            loss *= 6.0
        w.add_scalar("train/loss", loss, s)
        if s % 3:
            w.add_scalar("train/lr", 1e-4 * min(1.0, s / 100), s)
        w.add_scalar("train/grad_norm", 1.0 + 0.1 * float(rng.standard_normal()), s)
        w.add_scalar("train/loss_scale", 65536.0, s)
        w.add_scalar("train/tokens_per_sec", 1e5 + float(rng.integers(0, 1000)), s)
        w.add_scalar("train/memory_gb", 60.0 + s / 1e4, s)
        if s % 50 == 0:
            for i in range(4):
                w.add_scalar(f"grad_norm/layers.{i}", 0.05 + 0.001 * i, s)
        if s % 100 == 99:
            w.add_scalar("val/loss", 2.5 - s / 3000, s)
        if s == relog:
            w.add_scalar("train/loss", 0.5, s)  # the step logged again: its later value wins
    w.close()


def _both(run_dir: Path):  # noqa: ANN202
    by_tag = read_run(run_dir, options=ReadOptions(cache=False))
    as_read = read_run(run_dir, options=ReadOptions(cache=False, series_order=False))
    return by_tag, as_read


def test_rows_come_tag_after_tag_and_are_the_rows_read(tmp_path: Path) -> None:
    _write_run(tmp_path, range(2500), relog=1234)
    by_tag, as_read = _both(tmp_path)
    f, g = by_tag.frame, as_read.frame
    tags = g.get_column("tag").unique(maintain_order=True).to_list()  # first-shown order
    assert _tag_runs(f) == len(tags) == 11
    assert f.get_column("tag").unique(maintain_order=True).to_list() == tags
    for t in tags:  # each tag's rows in record order
        rec = f.filter(pl.col("tag") == t).get_column("record_idx")
        assert rec.is_sorted()
    assert _tag_runs(g) > 1000  # (the rows as read interleave the tags)
    assert_frame_equal(_record_order(f), g)


def test_view_and_findings_are_those_of_the_rows_as_read(tmp_path: Path) -> None:
    _write_run(tmp_path, range(2500), relog=1234)
    by_tag, as_read = _both(tmp_path)
    assert_frame_equal(by_tag.view(), as_read.view())
    a, b = analyze_run(by_tag), analyze_run(as_read)
    assert [x.kind for x in a.findings]  # (a spike at least: the comparison compares something)
    assert a.to_document()["findings"] == b.to_document()["findings"]


def test_two_files_that_continue_are_grouped_too(tmp_path: Path) -> None:
    import time

    _write_run(tmp_path, range(0, 900))
    time.sleep(1.1)  # (a second file: the writer names it by the second it starts)
    _write_run(tmp_path, range(900, 1800))
    assert len(list(tmp_path.glob("*tfevents*"))) == 2
    by_tag, as_read = _both(tmp_path)
    assert _tag_runs(by_tag.frame) == 11
    assert by_tag.frame.get_column("file").n_unique() == 2
    assert_frame_equal(_record_order(by_tag.frame), as_read.frame)
    assert_frame_equal(by_tag.view(), as_read.view())


def test_a_job_that_restarts_keeps_record_order(tmp_path: Path) -> None:
    import time

    _write_run(tmp_path, range(0, 900))
    time.sleep(1.1)
    _write_run(tmp_path, range(600, 1500))  # resumed from step 600: steps go back
    by_tag, as_read = _both(tmp_path)
    assert by_tag.frame.get_column("segment").max() == 1
    assert_frame_equal(by_tag.frame, as_read.frame)


@pytest.fixture(params=["compiled", "numpy"])
def grouping(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test through the compiled kernel (_group.c) and through numpy's path."""
    if request.param == "numpy":
        monkeypatch.setattr(tfevents, "_group", None)
    elif tfevents._group is None:
        pytest.skip("the compiled grouping was not built here (no C compiler at install)")
    return str(request.param)


@pytest.mark.parametrize(
    "n", [0, 1, 7, tfevents._BLOCK - 1, tfevents._BLOCK, 3 * tfevents._BLOCK + 5]
)
@pytest.mark.parametrize("n_tags", [1, 3, 70, 70_000])
def test_rows_grouped_by_tag_in_first_shown_order(grouping: str, n: int, n_tags: int) -> None:
    rng = np.random.default_rng(n + n_tags)
    # Ids as a log interleaves them, one id far more often than the others, some never
    tag_id = (rng.integers(0, n_tags, n) * (rng.random(n) < 0.7)).astype(np.uint32)
    if n:
        tag_id[0] = n_tags - 1  # (the first row's id is not the smallest)
    seen = list(dict.fromkeys(tag_id.tolist()))  # ids in the order of their first row
    shown = tfevents._first_shown(tag_id, n_tags)
    assert shown[: len(seen)].tolist() == seen
    assert sorted(shown.tolist()) == list(range(n_tags))
    place = np.empty(n_tags, dtype=np.int64)
    place[shown] = np.arange(n_tags)
    order = np.argsort(place[tag_id], kind="stable")  # the reference
    if grouping == "numpy":
        dest = tfevents._destinations(tag_id, shown, np.bincount(tag_id, minlength=n_tags))
        expect = np.empty(n, dtype=np.int64)
        expect[order] = np.arange(n)
        assert np.array_equal(dest, expect)
    cols = {
        "a": np.arange(n, dtype=np.int64),
        "b": rng.random(n),
        "c": -np.arange(n, dtype=np.int32),
        "d": rng.integers(0, 9, n).astype(np.int8),
        "e": rng.integers(0, 9, n).astype(np.uint16),
    }
    want = {k: v[order] for k, v in cols.items()}
    files = rng.integers(0, 3, n).astype(np.uint32)
    ids, moved_files = tfevents._by_tag(cols, tag_id.copy(), n_tags, files.copy())
    for k in cols:
        assert np.array_equal(cols[k], want[k])
    assert moved_files is not None and np.array_equal(moved_files, files[order])
    assert np.array_equal(ids, tag_id[order])


def test_the_compiled_grouping_is_built_where_a_compiler_is() -> None:
    """setup.py builds the grouping as an optional extension (numpy's path otherwise: the same
    rows, more slowly and with more memory). Where a C compiler is found, it must have been
    built."""
    import shutil
    import sysconfig

    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) on this machine")
    assert tfevents._group is not None


def test_the_compiled_grouping_refuses_what_it_cannot_place() -> None:
    if tfevents._group is None:
        pytest.skip("the compiled grouping was not built here (no C compiler at install)")
    group = tfevents._group.group
    keys = np.array([1, 0, 1, 2], dtype=np.uint32)
    order = np.array([2, 0, 1], dtype=np.uint32)
    col = np.arange(4, dtype=np.int64)
    spare = np.empty(32, dtype=np.uint8)
    group(keys, order, [col], spare)
    assert col.tolist() == [3, 1, 0, 2]  # group 2, then 0, then 1 (rows in their order)
    before = col.copy()
    bad: list[tuple[tuple, str]] = [
        ((np.array([1, 0, 3], dtype=np.uint32), order, [col[:3].copy()], spare), "a key"),
        ((keys, np.array([2, 0, 2], dtype=np.uint32), [col], spare), "each group id once"),
        ((keys, np.array([2, 0, 3], dtype=np.uint32), [col], spare), "each group id once"),
        ((keys.astype(np.int64), order, [col], spare), "uint32"),
        ((keys, order.astype(np.int32), [col], spare), "uint32"),
        ((keys, order, [col[:3].copy()], spare), "n items"),
        ((keys, order, [np.zeros(4, dtype=np.complex128)], spare), "n items"),
        ((keys, order, [col], np.empty(31, dtype=np.uint8)), "spare"),
    ]
    for args, says in bad:
        with pytest.raises(ValueError, match=says):
            group(*args)
    assert col.tolist() == before.tolist()  # (refused before any row moved)
    ro = np.arange(4, dtype=np.int64)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        group(keys, order, [ro], spare)
    with pytest.raises(ValueError, match="contiguous"):
        group(keys, order, [col, np.arange(8, dtype=np.int64)[::2]], spare)
    assert col.tolist() == before.tolist()
