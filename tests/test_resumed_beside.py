"""One job of a resume chain analyzed alone: the tool says which jobs beside it it continues
(or that continue it) and to analyze the folder above to read them as one run
(:mod:`forensics.resumed_beside`). The real Lightning versions (version_5 resumes version_0 at
step 140,749) and tensorboardX jobs of a real torch training loop that checkpoints and
resumes."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import shared_path, snapshot
from test_chains import train_job
from typer.testing import CliRunner

from forensics import resumed_beside
from forensics.cli import app
from forensics.importers import ReadOptions, read_run

runner = CliRunner()


def _lightning(version: str) -> Path:
    return shared_path(
        "real_runs", "lightning-csv-slm-wikitext103", "lightning_logs", f"version_{version}"
    )


def test_a_resumed_lightning_version_names_the_version_it_continues(tmp_path: Path) -> None:
    """version_5 alone reads HEALTHY: its regression shows only against version_0. The
    command says so before the summary and the report keeps it among its notes; nothing is
    written into the log folders."""
    v5 = _lightning("5")
    before = snapshot(v5.parent)
    out = tmp_path / "v5.html"
    res = runner.invoke(app, ["analyze", str(v5), "--out", str(out)])
    assert res.exit_code == 0, res.output
    want = (
        f"This job continues version_0 in {v5.parent} (a resume chain): the report reads only "
        f"its own steps (140,749-197,035); analyze {v5.parent} to read version_0+version_5 as "
        "one run, seams included."
    )
    assert f"forensics: {want}" in res.stderr
    assert want in out.read_text()
    assert snapshot(v5.parent) == before


def test_a_fresh_start_and_stitching_off_get_no_hint() -> None:
    """version_0 starts at its first logging point (the start of training): nothing to say.
    With stitching off (--no-stitch) no chain is looked for."""
    options = ReadOptions()
    v0 = _lightning("0")
    assert resumed_beside.hint(v0, read_run(v0, options=options), options) is None
    v5 = _lightning("5")
    off = ReadOptions(stitch=False)
    assert resumed_beside.hint(v5, read_run(v5, options=off), off) is None


@pytest.fixture(scope="module")
def tb_jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """job_0 trains steps 0-159 (checkpoints every 50), job_1 resumes from step 150 up to 299,
    and job_9 is another seed from scratch."""
    root = tmp_path_factory.mktemp("chain") / "runs"
    ck = root.parent / "ckpt"
    train_job(root / "job_0", "tensorboard", stop=160, ckpt_dir=ck)
    train_job(root / "job_1", "tensorboard", stop=300, ckpt_dir=ck, resume=150)
    train_job(root / "job_9", "tensorboard", stop=200, ckpt_dir=root.parent / "ck9", seed=9)
    return root


def test_a_resumed_tensorboard_job_names_the_job_before_it(tb_jobs: Path) -> None:
    options = ReadOptions()
    job = tb_jobs / "job_1"
    got = resumed_beside.hint(job, read_run(job, options=options), options)
    assert got is not None
    assert got.startswith(f"This job continues job_0 in {tb_jobs} (a resume chain)")
    assert "(150-299)" in got and "job_9" not in got
    # The same job named by one of its files.
    (event,) = job.glob("events.out.tfevents.*")
    assert resumed_beside.hint(event, read_run(event, options=options), options) == got


def test_the_bounds_keep_a_large_folder_unread(
    tb_jobs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More bytes, or more jobs, beside it than the bounds allow: no hint (the siblings are
    not read)."""
    options = ReadOptions()
    job = tb_jobs / "job_1"
    run = read_run(job, options=options)
    monkeypatch.setattr(resumed_beside, "MAX_BYTES", 1)
    assert resumed_beside.hint(job, run, options) is None
    monkeypatch.setattr(resumed_beside, "MAX_BYTES", 1 << 30)
    monkeypatch.setattr(resumed_beside, "MAX_JOBS", 2)
    assert resumed_beside.hint(job, run, options) is None
    monkeypatch.setattr(resumed_beside, "MAX_JOBS", 32)
    monkeypatch.setattr(resumed_beside, "MAX_ENTRIES", 5)  # (the folder is not even walked)
    assert resumed_beside.hint(job, run, options) is None


def test_slurm_logs_side_by_side(tmp_path: Path) -> None:
    """Megatron stdout files of two SLURM jobs in one folder, the second resuming from the
    first's checkpoint at step 100: pointed at the second file, the hint names the first."""
    logs = tmp_path / "logs"
    ck = tmp_path / "ckpt"
    train_job(logs / "slurm-1001.out", "megatron", stop=130, ckpt_dir=ck)
    train_job(logs / "slurm-1002.out", "megatron", stop=250, ckpt_dir=ck, resume=100)
    options = ReadOptions()
    second = logs / "slurm-1002.out"
    got = resumed_beside.hint(second, read_run(second, options=options), options)
    assert got is not None
    assert got.startswith(f"This job continues slurm-1001.out in {logs} (a resume chain)")
    first = logs / "slurm-1001.out"
    assert resumed_beside.hint(first, read_run(first, options=options), options) is None
