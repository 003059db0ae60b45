"""``forensics export --to x.parquet`` writes a plain Parquet file (zstd level 1, no column
statistics: see run_frame.export_run) that reads back to the run's frame exactly, with polars
and with another reader (pyarrow), and nothing is written into the run folder."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from forensics.importers import ReadOptions, read_run
from forensics.run import Run
from forensics.run_frame import export_run
from tests.conftest import ROOT


def _bench_run(tmp_path: Path) -> Run:
    """The benchmark's JSONL shape (layer norms every 50 steps, val every 500), with a
    restart so that two segments are exported."""
    from benchmarks.generate import series, write_jsonl

    path = write_jsonl(tmp_path / "run", series(1200, n_layers=4))
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines + lines[600:700]))  # a resume from step 600
    return read_run(path.parent, options=ReadOptions(cache=False))


def _expected(run: Run) -> pl.DataFrame:
    return run.frame.select(pl.lit(run.name, dtype=pl.Categorical).alias("run"), pl.all())


@pytest.mark.parametrize(
    "make", [_bench_run, lambda _: read_run(ROOT / "sample_runs" / "histogram_layers")]
)
def test_parquet_export_reads_back_to_the_frame(tmp_path: Path, make: object) -> None:
    run = make(tmp_path)  # type: ignore[operator]
    before = sorted(p.relative_to(run.path) for p in Path(run.path).rglob("*"))
    out = export_run(run, tmp_path / "out" / "frame.parquet")
    assert sorted(p.relative_to(run.path) for p in Path(run.path).rglob("*")) == before
    want = _expected(run)
    back = pl.read_parquet(out)
    assert back.schema == want.schema
    assert back.equals(want)
    if make is _bench_run:
        assert back.get_column("segment").unique().to_list() == [0, 1]
    # Another reader: the same columns and values, categorical columns as dictionaries.
    table = pq.read_table(out)
    assert table.column_names == want.columns
    other = pl.from_arrow(table)
    assert isinstance(other, pl.DataFrame)
    strings = [c for c, t in want.schema.items() if t == pl.Categorical]
    assert other.with_columns(pl.col(strings).cast(pl.String)).equals(
        want.with_columns(pl.col(strings).cast(pl.String))
    )
    meta = pq.ParquetFile(out).metadata
    chunks = [meta.row_group(g).column(c) for g in range(meta.num_row_groups) for c in range(3)]
    assert {c.compression for c in chunks} == {"ZSTD"}
    assert not any(c.is_stats_set for c in chunks)


def test_csv_export_reads_back(tmp_path: Path) -> None:
    run = _bench_run(tmp_path)
    out = export_run(run, tmp_path / "frame.csv")
    back = pl.read_csv(out)
    assert back.columns == ["run", *run.frame.columns] and back.height == run.frame.height
    assert back.get_column("value").equals(run.frame.get_column("value"))
    assert set(back.get_column("run").to_list()) == {run.name}
