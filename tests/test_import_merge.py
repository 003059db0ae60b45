"""The canonical form of a source (importers.finish_source) is the same whatever the chunks of
the frame its reader returns: a reader that appends blocks leaves its columns in many chunks,
and finish_source makes each one chunk first, one column at a time (peak memory)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from polars.testing import assert_frame_equal

from forensics.importers import ImportResult, ReadOptions, discover_jobs, finish_source
from forensics.importers import _importer as importer_of

ROOT = Path(__file__).resolve().parents[1]


def _read(name: str) -> tuple[object, pl.DataFrame]:
    ((_, sources),) = discover_jobs(ROOT / "sample_runs" / name).items()
    s = sources[0]
    return s, importer_of(s.importer).IMPORTER.read(s, ReadOptions(cache=False)).frame


def test_a_frame_in_blocks_is_finished_like_one_in_one_chunk() -> None:
    for name in ("healthy", "bad_batch"):
        s, frame = _read(name)
        assert frame.height > 10
        cut = frame.height // 3
        # Blocks in some columns only: the misaligned chunks a block reader leaves.
        blocks = pl.concat([frame.slice(0, cut), frame.slice(cut)], rechunk=False)
        blocks = blocks.with_columns(frame.get_column("source").rechunk())
        assert blocks.get_column("value").n_chunks() == 2
        want, notes = finish_source(s, ImportResult(frame.rechunk()), ReadOptions())  # type: ignore[arg-type]
        got, notes_b = finish_source(s, ImportResult(blocks), ReadOptions())  # type: ignore[arg-type]
        assert_frame_equal(got.frame, want.frame)
        assert notes_b == notes
        assert all(c.n_chunks() == 1 for c in got.frame.iter_columns())


def test_one_chunk_keeps_a_frame_in_one_chunk_and_makes_blocks_one() -> None:
    from forensics.importers import _one_chunk

    n = 10_000
    whole = pl.DataFrame({"step": list(range(n)), "value": [0.5] * n}).with_columns(
        pl.lit("jsonl", dtype=pl.Categorical).alias("source"),  # a constant column
        pl.lit(0, dtype=pl.Int16).alias("segment"),
    )
    res = ImportResult(whole)
    _one_chunk(res)
    assert res.frame is whole  # nothing to do: the frame itself
    blocks = pl.concat([whole.slice(0, 1234), whole.slice(1234)], rechunk=False)
    assert blocks.select("step").n_chunks("first") == 2
    res = ImportResult(blocks)
    _one_chunk(res)
    assert_frame_equal(res.frame, whole)
    assert all(res.frame.select(c).n_chunks("first") == 1 for c in res.frame.columns)
