"""Any fsspec URL (issue 19): memory:// stands in for the backends that need no server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT
from typer.testing import CliRunner

from forensics.cli import app

fsspec = pytest.importorskip("fsspec")
runner = CliRunner()
SAMPLES = ROOT / "sample_runs"


@pytest.fixture
def mem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 - fsspec filesystem
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fs = fsspec.filesystem("memory")
    if fs.exists("/runs"):
        fs.rm("/runs", recursive=True)
    for f in (SAMPLES / "val_shift").iterdir():
        fs.pipe(f"/runs/val_shift/{f.name}", f.read_bytes())
    yield fs
    fs.rm("/runs", recursive=True)


def test_memory_url_reads_like_the_folder(mem, tmp_path: Path) -> None:
    """memory:// goes through the same mirror as s3:// and gives the same findings."""
    res = runner.invoke(
        app, ["analyze", "memory://runs/val_shift", "--no-report", "--format", "json"]
    )
    assert res.exit_code == 0, res.output
    remote = json.loads(res.stdout)
    res = runner.invoke(
        app, ["analyze", str(SAMPLES / "val_shift"), "--no-report", "--format", "json"]
    )
    here = json.loads(res.stdout)

    def key(doc: dict) -> list[tuple]:
        return [(f["kind"], f["severity"], f["start_step"]) for f in doc["findings"]]

    assert key(remote) == key(here) and remote["verdict"] == here["verdict"]
    assert remote["run"]["name"] == "val_shift"


def test_mirror_follows_the_store(mem, tmp_path: Path) -> None:
    """A changed object is fetched again and a deleted one leaves the mirror."""
    from forensics.remote import fetch

    mem.pipe("/runs/val_shift/extra.jsonl", b'{"step": 1, "loss": 2.0}\n')
    local = fetch("memory://runs/val_shift", cache=tmp_path / "mirror")
    assert (local / "extra.jsonl").is_file()
    mem.pipe("/runs/val_shift/extra.jsonl", b'{"step": 1, "loss": 3.0}\n{"step": 2, "loss": 2.5}\n')
    fetch("memory://runs/val_shift", cache=tmp_path / "mirror")
    assert (local / "extra.jsonl").read_bytes().count(b"\n") == 2
    mem.rm("/runs/val_shift/extra.jsonl")
    fetch("memory://runs/val_shift", cache=tmp_path / "mirror")
    assert not (local / "extra.jsonl").exists()
    assert not [p for p in local.rglob("*.part")]


def test_missing_backend_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """gs:// without gcsfs: one line naming the extra to install."""
    import builtins

    real_import = builtins.__import__

    def no_gcsfs(name, *args, **kwargs):  # noqa: ANN001, ANN202
        if name == "gcsfs" or name.startswith("gcsfs."):
            raise ImportError("No module named 'gcsfs'", name="gcsfs")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gcsfs)
    res = runner.invoke(app, ["analyze", "gs://bucket/run"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "forensics[gcs]" in res.stderr or "gcsfs" in res.stderr
