"""Issue 18, scale of discovery: linear in the number of files; long job lists summarized."""

from __future__ import annotations

import time
from pathlib import Path

from typer.testing import CliRunner

from forensics.cli import app
from forensics.importers import discover_jobs

runner = CliRunner()

# A minimal valid TFRecord: length 24, its masked CRC, then 24 data bytes and a data CRC.
_EVENT = b"\x18\x00\x00\x00\x00\x00\x00\x00\xa3\x7fK\x22" + b"\x00" * 28


def _folders(root: Path, n: int) -> Path:
    """n run folders of each kind that claims folders: TensorBoard, HF Trainer, Lightning, W&B."""
    state = '{"global_step": 1, "log_history": [{"step": 1, "loss": 1}]}'
    for i in range(n):
        (root / f"tb{i}").mkdir(parents=True)
        (root / f"tb{i}" / "events.out.tfevents.1.host").write_bytes(_EVENT)
        (root / f"hf{i}" / "checkpoint-10").mkdir(parents=True)
        (root / f"hf{i}" / "trainer_state.json").write_text(state)
        (root / f"hf{i}" / "checkpoint-10" / "trainer_state.json").write_text(state)
        (root / f"pl{i}").mkdir()
        (root / f"pl{i}" / "metrics.csv").write_text("step,train_loss\n1,1\n")
        wb = root / f"wb{i}" / "wandb" / f"run-20240101_000000-r{i}" / "files"
        wb.mkdir(parents=True)
        (wb / "wandb-history.jsonl").write_text('{"_step": 1, "loss": 1}\n')
    return root


def _cpu(root: Path) -> tuple[float, int]:
    t = time.process_time()
    jobs = discover_jobs(root)
    return time.process_time() - t, len(jobs)


def test_discovery_is_linear_in_the_number_of_run_folders(tmp_path: Path) -> None:
    """4x the run folders costs about 4x the CPU, not 16x (each importer once quadratic)."""
    small, n_small = _cpu(_folders(tmp_path / "small", 150))
    big, n_big = _cpu(_folders(tmp_path / "big", 600))
    assert (n_small, n_big) == (600, 2400)
    assert big < max(8 * small, 1.0), (small, big)
    assert big < 20


def test_a_long_list_of_jobs_is_summarized(tmp_path: Path) -> None:
    """Forty jobs: one short line naming the first ten and the count, not every job."""
    for i in range(40):
        (tmp_path / "runs" / f"job{i:02d}").mkdir(parents=True)
        (tmp_path / "runs" / f"job{i:02d}" / "events.out.tfevents.1.host").write_bytes(_EVENT)
    res = runner.invoke(app, ["analyze", str(tmp_path / "runs"), "--no-report"])
    assert res.exit_code == 2
    (line,) = res.stderr.splitlines()
    assert "40 separate training jobs" in line and "(first 10 of 40)" in line
    assert "job09" in line and "job10" not in line and len(line) < 600


def test_a_sparse_event_file_is_not_read_into_memory(tmp_path: Path) -> None:
    """A 1 GiB event file that is mostly a hole (a crash's preallocated tail): read through a
    memory map, holes skipped, so the reader's peak memory stays far below the file size."""
    import subprocess
    import sys

    from conftest import ROOT, write_tb_run

    run = write_tb_run(tmp_path / "run", n=200, spike_at=None)
    (f,) = run.glob("events*")
    with open(f, "r+b") as fh:
        fh.truncate(1 << 30)
    reader = (
        "import sys; from forensics.importers import read_run; "
        f"r = read_run({str(run)!r}); assert r.series('loss').height == 200"
    )
    # A fresh parent whose only child is the reader: RUSAGE_CHILDREN is then the reader's peak.
    probe = (
        "import resource, subprocess, sys; "
        f"subprocess.run([sys.executable, '-c', {reader!r}], check=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr
    peak_mib = int(out.stdout.strip()) / 1024
    assert peak_mib < 700, peak_mib
