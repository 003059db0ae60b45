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


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("FORENSICS_CACHE_DIR", str(d))
    monkeypatch.delenv("FORENSICS_NO_CACHE", raising=False)
    monkeypatch.delenv("FORENSICS_CACHE_MAX_MB", raising=False)
    return d


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
