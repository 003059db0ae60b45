"""The run cache: an unchanged run is read back from Parquet; any change to its files is seen."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

from forensics import cache
from forensics.cli import app
from forensics.importers import ReadOptions, read_run

OLD = time.time() - 3600  # files settled an hour ago


def _write_run(folder: Path, n: int = 300, loss0: float = 5.0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    f = folder / "metrics.jsonl"
    with f.open("w") as fh:
        for s in range(n):
            fh.write(json.dumps({"step": s, "loss": loss0 / (1 + s / 50), "lr": 3e-4}) + "\n")
    os.utime(f, (OLD, OLD))
    return folder


def _entries(d: Path) -> list[Path]:
    return [e for e in d.iterdir() if not e.name.startswith(".")] if d.exists() else []


def _no_parsing(monkeypatch):
    from forensics.importers import jsonl

    def boom(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("parsed again")

    monkeypatch.setattr(jsonl.IMPORTER, "read", boom)


def test_second_read_comes_from_the_cache(tmp_path, cache_dir, monkeypatch):
    """The second read of an unchanged run gives the same Run without parsing a file."""
    run_dir = _write_run(tmp_path / "run")
    first = read_run(run_dir)
    assert len(_entries(cache_dir)) == 1
    _no_parsing(monkeypatch)
    second = read_run(run_dir)
    assert_frame_equal(first.frame, second.frame)
    assert (first.name, first.path, first.format) == (second.name, second.path, second.format)
    assert first.notes == second.notes and first.import_findings == second.import_findings
    assert first.metadata == second.metadata and first.config == second.config


def test_export_does_not_take_the_analysis_order_from_the_cache(tmp_path, cache_dir):
    """The analysis reads a JSONL log series after series; export asks for line order. The
    two reads are two entries: an export after an analysis still writes line order."""
    run_dir = _write_run(tmp_path / "run")
    analysis = read_run(run_dir)
    assert not analysis.frame.get_column("record_idx").is_sorted()  # loss rows, then lr rows
    exported = read_run(run_dir, options=ReadOptions(series_order=False))
    assert exported.frame.get_column("record_idx").is_sorted()
    assert len(_entries(cache_dir)) == 2
    key = ["record_idx", "tag"]
    assert_frame_equal(analysis.frame.sort(key), exported.frame.sort(key))


@pytest.mark.parametrize("change", ["append", "same_size_new_mtime", "new_file"])
def test_a_changed_run_is_parsed_again(tmp_path, cache_dir, change):
    """A file that grows, a rewrite of the same size at another time, a new file: a new read."""
    run_dir = _write_run(tmp_path / "run")
    first = read_run(run_dir)
    f = run_dir / "metrics.jsonl"
    if change == "append":
        with f.open("a") as fh:
            fh.write(json.dumps({"step": 300, "loss": 9.0, "lr": 3e-4}) + "\n")
        os.utime(f, (OLD + 10, OLD + 10))
        assert read_run(run_dir).frame.height == first.frame.height + 2
    elif change == "same_size_new_mtime":
        text = f.read_text().replace('"loss": 5.0,', '"loss": 7.0,', 1)
        f.write_text(text)
        os.utime(f, (OLD + 10, OLD + 10))
        second = read_run(run_dir)
        assert second.frame.height == first.frame.height
        assert 7.0 in second.frame.get_column("value").to_list()
    else:
        extra = run_dir / "more.jsonl"
        extra.write_text(json.dumps({"step": 1, "val_loss": 2.0}) + "\n")
        os.utime(extra, (OLD, OLD))
        with pytest.raises(Exception):  # noqa: B017 - two jobs now: the folder was re-discovered
            read_run(run_dir)


def test_no_cache_reads_and_writes_nothing(tmp_path, cache_dir, monkeypatch):
    """ReadOptions(cache=False) and FORENSICS_NO_CACHE leave the cache folder alone."""
    run_dir = _write_run(tmp_path / "run")
    read_run(run_dir, options=ReadOptions(cache=False))
    monkeypatch.setenv("FORENSICS_NO_CACHE", "1")
    read_run(run_dir)
    assert not _entries(cache_dir)


def test_fresh_files_are_not_kept(tmp_path, cache_dir):
    """A file modified in the last seconds (a live run, or a same-tick rewrite) is not cached."""
    run_dir = _write_run(tmp_path / "run")
    os.utime(run_dir / "metrics.jsonl")  # now
    read_run(run_dir)
    assert not _entries(cache_dir)


def test_size_cap_evicts_least_recently_used(tmp_path, cache_dir, monkeypatch):
    """Over the cap, the oldest entries go; a run larger than the cap is never kept."""
    a = read_run(_write_run(tmp_path / "a"))
    (entry_a,) = _entries(cache_dir)
    size = sum(f.stat().st_size for f in entry_a.iterdir())
    os.utime(entry_a, (OLD, OLD))
    monkeypatch.setenv("FORENSICS_CACHE_MAX_MB", str(1.5 * size / 2**20))
    read_run(_write_run(tmp_path / "b", loss0=6.0))
    assert len(_entries(cache_dir)) == 1 and not entry_a.exists()
    monkeypatch.setenv("FORENSICS_CACHE_MAX_MB", str(0.5 * size / 2**20))
    read_run(_write_run(tmp_path / "c", loss0=7.0))
    assert len(_entries(cache_dir)) == 1  # c was too large to keep
    assert a.frame.height


def test_cache_inside_the_run_folder_is_never_written(tmp_path, monkeypatch):
    """A cache folder that lies inside the run (evidence) is not used."""
    run_dir = _write_run(tmp_path / "run")
    monkeypatch.setenv("FORENSICS_CACHE_DIR", str(run_dir / "cache"))
    monkeypatch.delenv("FORENSICS_NO_CACHE", raising=False)
    before = sorted(p.name for p in run_dir.iterdir())
    read_run(run_dir)
    read_run(run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == before


def test_a_damaged_entry_is_a_miss(tmp_path, cache_dir):
    """A truncated Parquet file in the cache is ignored and replaced."""
    run_dir = _write_run(tmp_path / "run")
    first = read_run(run_dir)
    (entry,) = _entries(cache_dir)
    (entry / "frame.parquet").write_bytes(b"PAR1 broken")
    assert_frame_equal(read_run(run_dir).frame, first.frame)


def test_cli_no_cache(tmp_path, cache_dir, monkeypatch):
    """`analyze --no-cache` and `forensics --no-cache export` leave the cache empty."""
    run_dir = _write_run(tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["analyze", str(run_dir), "--no-report", "--no-cache"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(
        app, ["--no-cache", "export", str(run_dir), "--to", str(tmp_path / "x.parquet")]
    )
    assert r.exit_code == 0, r.output
    assert not _entries(cache_dir)
    monkeypatch.delenv("FORENSICS_NO_CACHE", raising=False)
    r = CliRunner().invoke(app, ["analyze", str(run_dir), "--no-report"])
    assert r.exit_code == 0, r.output
    assert len(_entries(cache_dir)) == 1


def test_cache_dir_defaults_to_the_user_cache_folder(monkeypatch, tmp_path):
    """XDG_CACHE_HOME, else ~/.cache: forensics/runs."""
    monkeypatch.delenv("FORENSICS_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / "forensics" / "runs"


# -- the entry layout (FORMAT 4): constants, memory-mapped arrays, Parquet for the rest -----


def _entry_files(d: Path) -> list[str]:
    (entry,) = _entries(d)
    return sorted(f.name for f in entry.iterdir())


def _write_odd_run(folder: Path) -> Path:
    """Values a byte-level layout could get wrong: NaN, inf, -0.0, a gap in a series."""
    folder.mkdir(parents=True, exist_ok=True)
    f = folder / "metrics.jsonl"
    with f.open("w") as fh:
        for s in range(200):
            row: dict = {"step": s * 3, "loss": 2.0 - s / 100}
            if s % 7 == 0:
                row["grad_norm"] = [-0.0, 0.0, float("nan"), float("inf"), 1e-308][s % 5]
            fh.write(json.dumps(row) + "\n")
    os.utime(f, (OLD, OLD))
    return folder


def test_layout_keeps_constants_as_one_value_and_numbers_as_mapped_arrays(tmp_path, cache_dir):
    """The fast read back is really used: constant columns in the metadata, the null-free
    numeric columns as .npy arrays, the rest in Parquet; the frame read back is identical
    (dtypes and every bit: NaN, inf, -0.0)."""
    import numpy as np

    run_dir = _write_odd_run(tmp_path / "run")
    fresh = read_run(run_dir, options=ReadOptions(cache=False))
    v = fresh.frame.get_column("value").to_numpy()
    assert np.isnan(v).any() and np.isinf(v).any() and (np.signbit(v) & (v == 0)).any()
    read_run(run_dir)  # fills
    files = _entry_files(cache_dir)
    assert {"step.npy", "value.npy", "record_idx.npy"} <= set(files)
    assert "source.npy" not in files and "segment.npy" not in files  # constants
    cached = read_run(run_dir)
    assert cached.frame.schema == fresh.frame.schema
    assert_frame_equal(cached.frame, fresh.frame)
    for col in ("value", "wall_time", "step"):
        a = fresh.frame.get_column(col).to_numpy()
        b = cached.frame.get_column(col).to_numpy()
        assert a.tobytes() == b.tobytes(), col  # bit for bit, -0.0 and NaN payloads included


def test_a_mapped_array_written_to_leaves_the_entry_as_it_was(tmp_path, cache_dir):
    """The raw arrays are mapped copy-on-write: writing into the memory a cached read maps
    leaves the entry's file with its bytes, and the next read gives the run back unchanged."""
    run_dir = _write_run(tmp_path / "run")
    fresh = read_run(run_dir, options=ReadOptions(cache=False))
    read_run(run_dir)  # fills
    (entry,) = _entries(cache_dir)
    f = entry / "value.npy"
    before = f.read_bytes()
    offset = cache._data_offset(f)
    arr = cache._mapped(f, "<f8", offset, fresh.frame.height)
    assert arr is not None and arr.flags.writeable
    arr[:] = -1.0
    assert f.read_bytes() == before
    assert cache._mapped(f, "<f8", offset, fresh.frame.height + 1) is None  # another length
    assert_frame_equal(read_run(run_dir).frame, fresh.frame)


@pytest.mark.parametrize("rows", [0, 1, 2])
def test_layout_of_tiny_and_empty_frames(tmp_path, cache_dir, rows):
    """An empty frame, and frames where every column is constant, round-trip."""
    run_dir = _write_run(tmp_path / "run", n=max(rows, 1))
    run = read_run(run_dir, options=ReadOptions(cache=False))
    run.frame = run.frame.head(rows)
    cache.store("e" * 40, run, run_dir)
    back = cache.load("e" * 40, run_dir)
    assert back is not None
    assert back.frame.schema == run.frame.schema
    assert_frame_equal(back.frame, run.frame)


def test_layout_with_nulls_and_all_null_columns(tmp_path, cache_dir):
    """Nullable columns (layer, wall_time) and a column null on every row round-trip."""
    import polars as pl

    run_dir = _write_run(tmp_path / "run")
    run = read_run(run_dir, options=ReadOptions(cache=False))
    n = run.frame.height
    run.frame = run.frame.with_columns(
        pl.when(pl.int_range(n) % 3 == 0).then(pl.col("wall_time")).alias("wall_time"),
        pl.lit(None, dtype=pl.Int16).alias("layer"),
        pl.when(pl.int_range(n) % 2 == 0).then(pl.col("step")).alias("step"),
    )
    cache.store("n" * 40, run, run_dir)
    back = cache.load("n" * 40, run_dir)
    assert back is not None
    assert_frame_equal(back.frame, run.frame)


def test_columns_of_few_values_are_kept_as_codes(tmp_path, cache_dir):
    """Tags, metrics and the nullable layer are kept as their distinct values and a .npy
    file of codes (one byte each up to 256 values, two bytes beyond), not in Parquet; the
    frame read back is identical: nulls, a layer at both ends of Int16, 300 distinct tags."""
    import numpy as np
    import polars as pl

    run_dir = _write_run(tmp_path / "run", n=600)
    run = read_run(run_dir, options=ReadOptions(cache=False))
    n = run.frame.height
    ends = pl.Series([-32768, 32767, None, 0], dtype=pl.Int16)
    many = pl.Series([f"t{i % 300}" for i in range(n)], dtype=pl.Categorical)
    run.frame = run.frame.with_columns(
        ends.gather(pl.int_range(n, eager=True) % 4).alias("layer"),
        pl.when(pl.int_range(n) % 7 == 0).then(None).otherwise(many).alias("tag"),
    )
    cache.store("c" * 40, run, run_dir)
    files = _entry_files(cache_dir)
    assert {"tag.npy", "metric.npy", "layer.npy"} <= set(files)
    entry = cache_dir / ("c" * 40)
    assert pl.read_parquet(entry / "frame.parquet").columns == ["wall_time"]  # (all null)
    assert np.load(entry / "tag.npy").dtype == np.uint16  # 301 values with the null
    assert np.load(entry / "layer.npy").dtype == np.uint8
    back = cache.load("c" * 40, run_dir)
    assert back is not None
    assert back.frame.schema == run.frame.schema
    assert_frame_equal(back.frame, run.frame)


def test_a_column_of_too_many_values_stays_in_parquet(tmp_path, cache_dir, monkeypatch):
    """Past the codes' limit of distinct values a column goes to the Parquet file."""
    import polars as pl

    monkeypatch.setattr(cache, "_MAX_CODES", 1)  # (the run has two tags, loss and lr)
    run_dir = _write_run(tmp_path / "run")
    fresh = read_run(run_dir, options=ReadOptions(cache=False))
    read_run(run_dir)
    (entry,) = _entries(cache_dir)
    assert "tag.npy" not in _entry_files(cache_dir)
    assert "tag" in pl.read_parquet(entry / "frame.parquet").columns
    assert_frame_equal(read_run(run_dir).frame, fresh.frame)


def test_codes_past_their_values_are_a_miss(tmp_path, cache_dir):
    """A codes file that points past the entry's values: the entry is not used."""
    import numpy as np

    run_dir = _write_run(tmp_path / "run")
    first = read_run(run_dir)
    (entry,) = _entries(cache_dir)
    f = entry / "tag.npy"
    codes = np.load(f)
    codes[-1] = 200
    np.save(f, codes)
    assert cache.load(entry.name, run_dir) is None
    assert_frame_equal(read_run(run_dir).frame, first.frame)


def test_a_run_that_would_crowd_the_cache_is_kept_compact(tmp_path, cache_dir, monkeypatch):
    """Plain arrays over a quarter of the cap: the compact encodings are kept instead (the
    steps and record indices as runs, no file of their own); a run too large even so goes to
    the Parquet file (tests/test_cache_compact.py)."""
    run_dir = _write_run(tmp_path / "run", n=2000)
    fresh = read_run(run_dir, options=ReadOptions(cache=False))
    raw = fresh.frame.height * (4 + 8 + 8 + 8)  # record_idx, step, value, wall_time
    monkeypatch.setattr(cache, "RAW_MIN_BYTES", 0)
    monkeypatch.setenv("FORENSICS_CACHE_MAX_MB", str(2 * raw / 2**20))  # raw > cap / 4
    read_run(run_dir)
    files = _entry_files(cache_dir)
    assert "step.npy" not in files and "record_idx.npy" not in files, files
    assert "codes.npy" in files and "tag.npy" not in files, files
    assert_frame_equal(read_run(run_dir).frame, fresh.frame)


@pytest.mark.parametrize("damage", ["truncated", "other_dtype", "other_length"])
def test_a_damaged_array_is_a_miss(tmp_path, cache_dir, damage):
    """A .npy file cut short, of another dtype or length: the entry is not used."""
    import numpy as np

    run_dir = _write_run(tmp_path / "run")
    first = read_run(run_dir)
    (entry,) = _entries(cache_dir)
    f = entry / "value.npy"
    if damage == "truncated":
        f.write_bytes(f.read_bytes()[:-16])
    elif damage == "other_dtype":
        np.save(f, np.load(f).astype(np.float32))
    else:
        np.save(f, np.load(f)[:-1])
    assert cache.load(entry.name, run_dir) is None
    assert_frame_equal(read_run(run_dir).frame, first.frame)


def test_a_mapped_frame_survives_its_entry_being_replaced(tmp_path, cache_dir):
    """A Run read from the cache (its arrays memory-mapped) keeps its values when the log
    changes, a new entry is written and the whole cache is cleared; the new read is fresh."""
    run_dir = _write_run(tmp_path / "run")
    read_run(run_dir)
    held = read_run(run_dir)  # from the cache: mapped
    before = held.frame.get_column("value").to_list()
    f = run_dir / "metrics.jsonl"
    f.write_text(f.read_text().replace('"loss": 5.0,', '"loss": 8.0,', 1))
    os.utime(f, (OLD + 20, OLD + 20))
    changed = read_run(run_dir)
    assert 8.0 in changed.frame.get_column("value").to_list()
    assert (
        read_run(run_dir).frame.get_column("value").to_list()
        == changed.frame.get_column("value").to_list()
    )
    cache.clear()
    assert held.frame.get_column("value").to_list() == before
    assert 8.0 not in before


def test_old_format_entries_are_ignored(tmp_path, cache_dir):
    """An entry of an earlier layout (FORMAT 3: one Parquet frame) under the same name is a
    miss, never read as this layout."""
    import pickle

    run_dir = _write_run(tmp_path / "run")
    first = read_run(run_dir)
    (entry,) = _entries(cache_dir)
    meta = pickle.loads((entry / "run.pickle").read_bytes())
    meta["format"] = 3
    (entry / "run.pickle").write_bytes(pickle.dumps(meta))
    assert cache.load(entry.name, run_dir) is None
    assert_frame_equal(read_run(run_dir).frame, first.frame)


GOLDEN = json.loads((Path(__file__).parent / "golden" / "findings.json").read_text())


@pytest.mark.parametrize("tier", ["plain", "compact"])
@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_cached_runs_give_the_golden_findings(name, tier, cache_dir, monkeypatch):
    """Every sample run and real log analysed from a cache hit (literal and memory-mapped
    columns; or, as a run too large for plain arrays is kept, the compact encodings) gives
    exactly the golden findings, without parsing a file."""
    import sys

    if tier == "compact":
        monkeypatch.setattr(cache, "RAW_SHARE", 0.0)
        monkeypatch.setattr(cache, "RAW_MIN_BYTES", 0)

    import forensics.importers as importers

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import golden_findings

    targets = dict(golden_findings.targets())
    if name not in targets:
        pytest.skip(f"{name} is absent (../shared is not beside the project)")
    golden_findings.job_findings(targets[name])  # fills the cache
    if tier == "compact":
        import pickle

        kinds = {
            k
            for meta in cache_dir.glob("*/run.pickle")
            for k, _ in pickle.loads(meta.read_bytes())["frame"]["columns"].values()
        }
        assert kinds & {"ramps", "deltas", "float32", "joint"}, kinds
    parsed = []
    real = importers._read_job

    def counting(*a, **k):  # noqa: ANN002, ANN003, ANN202
        parsed.append(a[1])
        return real(*a, **k)

    monkeypatch.setattr(importers, "_read_job", counting)
    got = json.loads(json.dumps(golden_findings.job_findings(targets[name])))
    assert got == GOLDEN[name]
    assert not parsed, f"parsed again: {parsed}"


# -- the discovery memo -----------------------------------------------------------------------
def _megatron_log(folder: Path, n: int = 200, lr: float = 1e-4) -> Path:
    """A Megatron-style text log (the family whose discovery sniffs the text)."""
    folder.mkdir(parents=True, exist_ok=True)
    f = folder / "train.log"
    lines = [
        f" iteration {s:8d}/    1000 | consumed samples: {s * 8:10d} | elapsed time per "
        f"iteration (ms): 100.0 | learning rate: {lr:.6E} | global batch size:     8 | "
        f"lm loss: {5.0 / (1 + s / 50):.6E} | loss scale: 65536.0 | grad norm: 1.000 |"
        for s in range(1, n + 1)
    ]
    f.write_text("\n".join(lines) + "\n")
    os.utime(f, (OLD, OLD))
    return folder


def _no_discovery(monkeypatch):
    from forensics import importers

    def boom(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("discovered again")

    monkeypatch.setattr(importers, "discover_jobs", boom)


def test_an_unchanged_listing_is_not_sniffed_again(tmp_path, cache_dir, monkeypatch):
    run_dir = _megatron_log(tmp_path / "run")
    first = read_run(run_dir)
    assert first.format == "text_logs" and first.frame.height > 0
    assert len(list((cache_dir / ".discovery").iterdir())) == 1
    _no_discovery(monkeypatch)
    second = read_run(run_dir)
    assert_frame_equal(first.frame, second.frame)
    assert first.notes == second.notes


@pytest.mark.parametrize("change", ["rewritten", "new_file"])
def test_a_changed_listing_is_discovered_again(tmp_path, cache_dir, monkeypatch, change):
    """The memo is keyed by every file's name, size and time: a change means a fresh sniff
    (here the patched discovery raises, so the read fails only if the memo was skipped)."""
    run_dir = _megatron_log(tmp_path / "run")
    read_run(run_dir)
    if change == "rewritten":
        _megatron_log(run_dir, lr=2e-4)  # the same size, another time stamp
        os.utime(run_dir / "train.log", (OLD + 10, OLD + 10))
    else:
        _write_run(run_dir)  # a JSONL file beside the log
    _no_discovery(monkeypatch)
    with pytest.raises(AssertionError, match="discovered again"):
        read_run(run_dir)


def test_no_memo_without_the_cache_or_for_unsettled_files(tmp_path, cache_dir, monkeypatch):
    run_dir = _megatron_log(tmp_path / "run")
    read_run(run_dir, options=ReadOptions(cache=False))
    assert not (cache_dir / ".discovery").exists()
    os.utime(run_dir / "train.log")  # written just now: a live run's file
    read_run(run_dir)
    assert not (cache_dir / ".discovery").exists() or not any((cache_dir / ".discovery").iterdir())


def test_a_damaged_memo_is_a_miss(tmp_path, cache_dir):
    run_dir = _megatron_log(tmp_path / "run")
    first = read_run(run_dir)
    (memo,) = (cache_dir / ".discovery").iterdir()
    memo.write_bytes(b"not a pickle")
    assert_frame_equal(read_run(run_dir).frame, first.frame)


def test_a_link_to_the_same_folder_has_its_own_memo(tmp_path, cache_dir):
    """The memo's sources name files under the path they were found through: a run read
    through a link keeps the link's paths, never the other path's."""
    run_dir = _megatron_log(tmp_path / "exp42")
    link = tmp_path / "latest"
    link.symlink_to(run_dir, target_is_directory=True)
    from forensics import importers

    first = read_run(run_dir)
    read_run(link)
    assert len(list((cache_dir / ".discovery").iterdir())) == 2
    again = read_run(link)
    assert str(again.path) == str(link)
    assert_frame_equal(first.frame, again.frame)
    (sources,) = importers._discovered(link, None).values()  # from the memo
    assert all(str(f).startswith(str(link) + "/") for s in sources for f in s.files)
    (sources,) = importers._discovered(run_dir, None).values()
    assert all(str(f).startswith(str(run_dir) + "/") for s in sources for f in s.files)


@pytest.mark.parametrize("const_rows", [0, 1 << 20])
def test_constant_columns_read_back_as_literals_or_whole(
    tmp_path, cache_dir, monkeypatch, const_rows
):
    """Constant columns come back as polars literals for a long run and made whole for a
    short one (`_CONST_ROWS`): either way the frame and its schema are the stored ones,
    a column null on every row included."""
    import polars as pl

    run_dir = _write_run(tmp_path / "run")
    run = read_run(run_dir, options=ReadOptions(cache=False))
    run.frame = run.frame.with_columns(pl.lit(None, dtype=pl.Int16).alias("layer"))
    monkeypatch.setattr(cache, "_CONST_ROWS", const_rows)
    cache.store("k" * 40, run, run_dir)
    layout = cache._layout(run.frame, cache.max_bytes())
    assert {c for c, (kind, _) in layout.items() if kind == "const"} >= {"source", "layer"}
    back = cache.load("k" * 40, run_dir)
    assert back is not None
    assert back.frame.schema == run.frame.schema
    assert_frame_equal(back.frame, run.frame)
