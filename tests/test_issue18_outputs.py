"""Issue 18, outputs: the run folder is never written into; reports, JSON and exports are
complete or absent (temporary file and rename)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from conftest import ROOT, write_tb_run
from typer.testing import CliRunner

from forensics.cli import app

runner = CliRunner()


def _tree(folder: Path) -> dict[str, tuple[int, int, float]]:
    """Every entry under folder (files and folders) with size, mode and mtime."""
    out = {}
    for dirpath, dirs, files in os.walk(folder):
        for f in dirs + files:
            p = Path(dirpath) / f
            st = p.lstat()
            out[str(p.relative_to(folder))] = (st.st_size, st.st_mode, st.st_mtime)
    return out


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_tb_run(tmp_path / "exp", n=200)


def test_home_is_the_run_folder(run_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """cwd == HOME == the run, no XDG_CACHE_HOME: the report goes outside the run (temp folder)."""
    monkeypatch.chdir(run_dir)
    monkeypatch.setenv("HOME", str(run_dir))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    before = _tree(run_dir)
    res = runner.invoke(app, ["analyze", "."])
    assert res.exit_code == 0, res.output
    assert _tree(run_dir) == before
    assert list((tmp_path / "tmp").glob("forensics-*/reports/exp.html"))


def test_xdg_cache_inside_the_run(run_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """XDG_CACHE_HOME inside the run is passed over for HOME's cache."""
    monkeypatch.chdir(run_dir)
    monkeypatch.setenv("XDG_CACHE_HOME", str(run_dir / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    before = _tree(run_dir)
    res = runner.invoke(app, ["analyze", ".", "--json", str(tmp_path / "f.json")])
    assert res.exit_code == 0, res.output
    assert _tree(run_dir) == before
    assert (tmp_path / "home" / ".cache" / "forensics" / "reports" / "exp.html").is_file()


def test_a_report_hard_linked_to_a_run_file_leaves_that_file_alone(
    run_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """reports/exp.html hard-linked to a log of the run: the link is replaced, the log kept."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports").mkdir()
    log = next(run_dir.glob("events.out.tfevents*"))
    os.link(log, tmp_path / "reports" / "exp.html")
    before = _tree(run_dir)
    data = log.read_bytes()
    res = runner.invoke(app, ["analyze", str(run_dir), "--json", "reports/exp.html"])
    assert res.exit_code == 0, res.output
    assert log.read_bytes() == data
    assert _tree(run_dir) == before
    assert (tmp_path / "reports" / "exp.html").read_text().startswith("<!")


def _limited(limit: int):  # noqa: ANN202
    def pre() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return pre


def _cli(*args: str, cwd: Path, limit: int | None = None) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
        "XDG_CACHE_HOME": str(cwd / "cache"),
    }
    return subprocess.run(
        [sys.executable, "-m", "forensics", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        preexec_fn=_limited(limit) if limit else None,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args, output",
    [
        (["analyze", "{run}", "-o", "out/r.html"], "out/r.html"),
        (["analyze", "{run}", "--no-report", "--json", "out/r.json"], None),
        (["export", "{run}", "--to", "out/r.csv"], "out/r.csv"),
    ],
    ids=["report", "json", "export"],
)
def test_a_full_disk_leaves_no_partial_file(
    run_dir: Path, tmp_path: Path, args: list[str], output: str | None
) -> None:
    """A write failing half-way (a file size limit, as a full disk) leaves nothing; one line."""
    work = tmp_path / "work"
    work.mkdir()
    limit = 20_000 if output != "out/r.csv" else 2_000
    if output is None:
        limit, output = 300, "out/r.json"
    res = _cli(*[a.format(run=run_dir) for a in args], cwd=work, limit=limit)
    assert res.returncode == 2, res.stderr
    errs = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(errs) == 1 and "cannot write" in errs[0], res.stderr
    assert not (work / output).exists()
    assert not [p for p in (work / "out").iterdir()]  # no temporary file left either


def test_a_reader_never_sees_a_partial_report(run_dir: Path, tmp_path: Path) -> None:
    """Two concurrent analyze runs writing one report: a poller only ever sees whole pages."""
    work = tmp_path / "work"
    work.mkdir()
    target = work / "r.html"
    seen: list[int] = []
    bad: list[int] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            try:
                data = target.read_bytes()
            except FileNotFoundError:
                continue
            seen.append(len(data))
            if not data.rstrip().endswith(b"</html>"):
                bad.append(len(data))

    t = threading.Thread(target=poll)
    t.start()
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "forensics", "analyze", str(run_dir), "-o", str(target)],
                cwd=work,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(2)
        ]
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
    finally:
        done.set()
        t.join()
    assert seen and not bad, bad[:5]
