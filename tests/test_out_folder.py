"""An output option that names an existing folder: the default file name goes inside it (as
``cp FILE DIR`` does), never into a run folder; before, the path was opened as a file and
the command failed with "Is a directory" after all its work (a sweep's reports left beside)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest
from conftest import write_tb_run
from typer.testing import CliRunner

from forensics.cli import app

runner = CliRunner()


def _tree(folder: Path) -> dict[str, tuple[int, float]]:
    out = {}
    for dirpath, dirs, files in os.walk(folder):
        for f in dirs + files:
            st = (Path(dirpath) / f).lstat()
            out[str((Path(dirpath) / f).relative_to(folder))] = (st.st_size, st.st_mtime)
    return out


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Two jobs under one folder (tensorboardX), each its own run."""
    root = tmp_path / "runs"
    write_tb_run(root / "a", n=200, seed=1)
    write_tb_run(root / "b", n=200, seed=2)
    return root


def test_analyze_outputs_into_a_folder(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    before = _tree(runs)
    args = ["analyze", str(runs / "a"), "--plotlyjs", "cdn"]
    args += ["--out", str(out), "--json", str(out), "--sarif", str(out), "--junit", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == [
        "a.html",
        "a.json",
        "forensics-junit.xml",
        "forensics.sarif",
    ]
    assert json.loads((out / "a.json").read_text())["run"]["name"] == "a"
    assert _tree(runs) == before


def test_analyze_all_into_a_folder_and_a_file_still_refused(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    res = runner.invoke(app, ["analyze", str(runs), "--all", "--out", str(out), "--json", str(out)])
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in out.iterdir())
    assert names == ["a.html", "a.json", "b.html", "b.json"]
    res = runner.invoke(app, ["analyze", str(runs), "--all", "--out", str(out / "one.html")])
    assert res.exit_code == 2
    assert f"--out ({out / 'one.html'}) names one file, but 2 jobs were found" in res.output
    assert not (out / "one.html").exists()
    res = runner.invoke(app, ["analyze", str(runs), "--all", "--json", str(out / "one.json")])
    assert res.exit_code == 2
    assert f"--json ({out / 'one.json'}) names one file, but 2 jobs" in res.output
    assert not (out / "one.json").exists()
    # A name without a suffix that does not exist was meant as a folder: said so.
    res = runner.invoke(app, ["analyze", str(runs), "--all", "--out", str(out / "later")])
    assert res.exit_code == 2
    assert f"--out ({out / 'later'}) names a folder that does not exist, but 2 jobs" in res.output
    assert "(create it first)" in res.output
    assert not (out / "later").exists()


def test_analyze_all_findings_go_beside_the_reports(
    runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--all with --out FOLDER and no --json: each job's findings document goes into that
    folder beside its report, not to reports/ under the current folder."""
    out = tmp_path / "out"
    out.mkdir()
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    res = runner.invoke(
        app, ["analyze", str(runs), "--all", "--out", str(out), "--plotlyjs", "cdn"]
    )
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["a.html", "a.json", "b.html", "b.json"]
    assert list(cwd.iterdir()) == []


def test_analyze_all_without_a_report_writes_nothing(
    runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--all --no-report and no --json: the verdicts on stdout, no file anywhere (each job's
    findings had gone to reports/<job>.json under the current folder); with --json FOLDER the
    findings go there, still no report."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    res = runner.invoke(app, ["analyze", str(runs), "--all", "--no-report"])
    assert res.exit_code == 0, res.output
    assert "== a" in res.output and "== b" in res.output
    assert list(cwd.iterdir()) == []
    out = tmp_path / "json"
    out.mkdir()
    res = runner.invoke(app, ["analyze", str(runs), "--all", "--no-report", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "b.json"]
    assert list(cwd.iterdir()) == []


def test_sweep_into_a_folder(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    res = runner.invoke(
        app, ["sweep", str(runs), "--out", str(out), "-j", "1", "--plotlyjs", "cdn"]
    )
    assert res.exit_code == 0, res.output
    assert (out / "index.html").is_file()
    assert sorted(p.name for p in (out / "index-runs").iterdir()) == ["a.html", "b.html"]


def test_export_into_a_folder(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    res = runner.invoke(app, ["export", str(runs / "b"), "--to", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["export", str(runs / "b"), "--to", str(tmp_path / "b.parquet")])
    assert res.exit_code == 0, res.output
    got = pl.read_parquet(out / "b.parquet")
    assert got.height > 0
    assert got.equals(pl.read_parquet(tmp_path / "b.parquet"))


def test_compare_into_a_folder(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    args = ["compare", str(runs / "a"), str(runs / "b"), "--out", str(out), "--json", str(out)]
    res = runner.invoke(app, [*args, "--plotlyjs", "cdn"])
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in out.iterdir())
    assert names == ["compare-a-vs-b.html", "compare.json"]


def test_the_run_folder_named_as_the_output_folder_is_refused(runs: Path) -> None:
    """A folder given for an output is a place like any other: the run's own is refused."""
    before = _tree(runs)
    for args in (
        ["analyze", str(runs / "a"), "--out", str(runs / "a")],
        ["analyze", str(runs / "a"), "--no-report", "--json", str(runs / "a")],
        ["export", str(runs / "a"), "--to", str(runs / "a")],
        ["sweep", str(runs), "--out", str(runs), "-j", "1"],
    ):
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert "refusing to write inside the run folder" in res.output, args
    assert _tree(runs) == before
