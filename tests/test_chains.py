"""Resume chains: several jobs of one folder read as one run when one continues another.

The chains are written by a real tiny torch training loop that checkpoints, "times out" (stops
between two checkpoints) and resumes from its last checkpoint in a new job, logging as SLURM
jobs do: Megatron-style stdout files, JSONL files in job folders, tensorboardX event files, and
W&B offline runs written by the wandb client. The Lightning versions in ../shared/real_runs
are a real resume (version_5 continues version_0 at step 140,749).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
from conftest import shared_path

from forensics.errors import MultipleJobsError
from forensics.findings import FindingKind
from forensics.importers import ReadOptions, discover_jobs, read_job, read_run
from forensics.importers.chains import stitch_jobs

torch = pytest.importorskip("torch")

LIGHTNING = "lightning-csv-slm-wikitext103"


# ------------------------------------------------------------------ a real training loop
def _data(seed: int = 1234) -> tuple:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(512, 1, generator=g)
    return x, y


def train_job(
    log: Path,
    fmt: str,
    *,
    stop: int,
    ckpt_dir: Path,
    resume: int | None = None,
    seed: int = 0,
    lr: float = 0.02,
    save_every: int = 50,
    target_scale: float = 1.0,
    fresh_optimizer: bool = False,
) -> list[float]:
    """Train a tiny MLP from ``resume`` (a checkpoint's step, or 0) up to ``stop`` and log each
    step; save a checkpoint every ``save_every`` steps. Stopping between two checkpoints is a
    job killed by its time limit: the next job re-does the steps since the last checkpoint.
    Returns the losses logged."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    x, y = _data()
    y = y * target_scale
    start = 0
    if resume is not None:
        ck = torch.load(ckpt_dir / f"step_{resume}.pt", weights_only=True)
        model.load_state_dict(ck["model"])
        if not fresh_optimizer:
            opt.load_state_dict(ck["opt"])
        start = ck["step"]
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    writer = _Writer(log, fmt, stop)
    losses = []
    for step in range(start, stop):
        # The data order is a function of the step, so a resume sees the same batches.
        idx = torch.randperm(512, generator=torch.Generator().manual_seed(step))[:32]
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
        opt.step()
        losses.append(loss.item())
        writer.write(step, losses[-1], lr, gn)
        if (step + 1) % save_every == 0:
            torch.save(
                {"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1},
                ckpt_dir / f"step_{step + 1}.pt",
            )
    writer.close()
    return losses


class _Writer:
    """The job's log: Megatron stdout, JSONL lines or tensorboardX event files."""

    def __init__(self, log: Path, fmt: str, total: int) -> None:
        self.fmt, self.total = fmt, total
        if fmt == "tensorboard":
            from tensorboardX import SummaryWriter

            self.tb = SummaryWriter(str(log))
        else:
            self.fh = log.open("a")
            if fmt == "megatron":
                self.fh.write("using world size: 1, data-parallel size: 1\n")

    def write(self, step: int, loss: float, lr: float, gn: float) -> None:
        if self.fmt == "tensorboard":
            self.tb.add_scalar("train/loss", loss, step)
            self.tb.add_scalar("train/lr", lr, step)
            self.tb.add_scalar("train/grad_norm", gn, step)
        elif self.fmt == "jsonl":
            rec = {"step": step, "loss": loss, "lr": lr, "grad_norm": gn, "timestamp": time.time()}
            self.fh.write(json.dumps(rec) + "\n")
        else:  # Megatron prints iterations from 1
            now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
            self.fh.write(
                f" [{now}] iteration {step + 1:8d}/{self.total:8d} | consumed samples: "
                f"{(step + 1) * 32:10d} | elapsed time per iteration (ms): 3.1 | learning rate: "
                f"{lr:.6E} | global batch size: 32 | lm loss: {loss:.6E} | loss scale: 1.0 | "
                f"grad norm: {gn:.3f} | number of skipped iterations: 0 | number of nan "
                "iterations: 0 |\n"
            )

    def close(self) -> None:
        if self.fmt == "tensorboard":
            self.tb.close()
        else:
            self.fh.close()


def _units(root: Path, **kw: object) -> dict[str, list]:
    return stitch_jobs(root, discover_jobs(root), ReadOptions(**kw))  # type: ignore[arg-type]


def _read(root: Path, unit: str, units: dict[str, list]):  # noqa: ANN202
    return read_job(root, unit, units[unit], only_job=len(units) == 1)


def _seams(run) -> list:  # noqa: ANN001
    return [f for f in run.import_findings if f.kind is FindingKind.RESTART and "job" in f.measures]


class _Result:
    def __init__(self, code: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = code, stdout, stderr


def _cli(*args: str, cwd: Path) -> _Result:
    """The CLI in this process (CliRunner); --no-stitch's environment switch is undone."""
    from typer.testing import CliRunner

    from forensics.cli import app

    before = os.environ.get("FORENSICS_NO_STITCH")
    here = Path.cwd()
    os.chdir(cwd)
    try:
        res = CliRunner().invoke(app, list(args))
    finally:
        os.chdir(here)
        if before is None:
            os.environ.pop("FORENSICS_NO_STITCH", None)
        else:
            os.environ["FORENSICS_NO_STITCH"] = before
    return _Result(res.exit_code, res.stdout, res.stderr)


# ------------------------------------------------------------------ the real Lightning resume
def test_lightning_version_5_resumes_version_0() -> None:
    root = shared_path("real_runs", LIGHTNING)
    units = _units(root)
    assert sorted(units) == [
        "lightning_logs/version_0+version_5",
        "lightning_logs/version_7",
        "lightning_logs/version_8",
    ]
    run = _read(root, "lightning_logs/version_0+version_5", units)
    assert run.name == "version_0+version_5"
    assert run.path == root / "lightning_logs"
    assert run.metadata["jobs"] == [
        "lightning_logs/version_0",
        "lightning_logs/version_5",
    ]
    assert (run.first_step, run.last_step) == (49, 197035)
    (seam,) = _seams(run)
    m = seam.measures
    assert (m["previous_job"], m["job"], m["seam"]) == (
        "lightning_logs/version_0",
        "lightning_logs/version_5",
        "continuation",
    )
    assert (m["resumed_from_step"], m["last_step_before"], m["steps_replayed"]) == (
        140749,
        140739,
        0,
    )
    assert seam.summary.startswith(
        "Resumed from job version_0 at step 140,749 in job version_5 (version_0 had logged up "
        "to step 140,739)"
    )
    assert seam.end_step is None
    assert run.frame.get_column("segment").unique().sort().to_list() == [0, 1]
    # Across the seam: the val loss of all 14 epochs, its minimum after the resume and the
    # rise to the end (3.563 -> 3.604, MANIFEST.md) in one series.
    val = run.series("val_loss")
    assert val.height == 14
    vals = dict(val.select("step", "value").iter_rows())
    assert vals[140739] == pytest.approx(3.570486068725586)
    assert vals[154813] == pytest.approx(3.5629003047943115)
    assert vals[197035] == pytest.approx(3.604208469390869)
    assert run.config["num_epochs"] == 20
    assert any("num_epochs 10 -> 20" in n for n in run.notes)
    # The two fresh runs (step 49 = their first logging point) stay apart.
    for v in ("version_7", "version_8"):
        assert _read(root, f"lightning_logs/{v}", units).metadata.get("jobs") is None


def test_lightning_no_stitch_keeps_the_versions_apart() -> None:
    root = shared_path("real_runs", LIGHTNING)
    assert len(_units(root, stitch=False)) == 4
    with pytest.raises(MultipleJobsError, match="3 separate training jobs.*version_0\\+version_5"):
        read_run(root)
    with pytest.raises(MultipleJobsError, match="4 separate training jobs"):
        read_run(root, options=ReadOptions(stitch=False))


def test_lightning_cli_names_the_seam(tmp_path: Path) -> None:
    root = shared_path("real_runs", LIGHTNING)
    (tmp_path / "reports").mkdir()  # (--all --no-report writes findings where --json says)
    r = _cli("analyze", str(root), "--all", "--no-report", "--json", "reports", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "== lightning_logs/version_0+version_5" in r.stderr
    assert "version_0+version_5  steps 49-197,035" in r.stdout
    assert "Resumed from job version_0 at step 140,749 in job version_5" in r.stdout
    doc = json.loads((tmp_path / "reports" / "lightning_logs_version_0_version_5.json").read_text())
    restart = next(f for f in doc["findings"] if f["kind"] == "restart")
    assert restart["measures"]["previous_job"] == "lightning_logs/version_0"
    r = _cli("analyze", str(root), "--all", "--no-report", "--no-stitch", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "== lightning_logs/version_5" in r.stderr and "Resumed from" not in r.stdout


# ------------------------------------------------------------------ SLURM chains, real loop
def test_slurm_stdout_chain_with_redone_steps(tmp_path: Path) -> None:
    """Job 1001 times out at iteration 130 (last checkpoint: 100); job 1002 resumes from the
    checkpoint and re-does iterations 101-130: one run, the later values win."""
    logs, ck = tmp_path / "logs", tmp_path / "ckpt"
    first = train_job(logs / "slurm-1001.out", "megatron", stop=130, ckpt_dir=ck)
    second = train_job(logs / "slurm-1002.out", "megatron", stop=250, ckpt_dir=ck, resume=100)
    units = _units(logs)
    assert list(units) == ["slurm-1001.out+slurm-1002.out"]
    run = _read(logs, "slurm-1001.out+slurm-1002.out", units)
    assert run.name == "logs" and run.path == logs  # the chain is all the folder holds
    (seam,) = _seams(run)
    m = seam.measures
    assert (m["seam"], m["previous_job"], m["job"]) == (
        "overlap",
        "slurm-1001.out",
        "slurm-1002.out",
    )
    assert (m["resumed_from_step"], m["last_step_before"], m["steps_replayed"]) == (101, 130, 30)
    assert m["points_repeated"] > 0
    assert "job slurm-1002.out re-did" not in seam.summary
    assert "slurm-1002.out re-did steps 101-130" in seam.summary
    loss = dict(run.series("loss").select("step", "value").iter_rows())
    assert sorted(loss) == list(range(1, 251))
    # Iterations 101-130 as the resumed job logged them; the ones before from job 1001.
    assert [loss[s] for s in range(101, 131)] == pytest.approx(second[:30], rel=1e-6)
    assert [loss[s] for s in range(1, 101)] == pytest.approx(first[:100], rel=1e-6)
    # The same batches from the same checkpoint: the re-done steps repeat the first job's.
    assert second[:30] == pytest.approx(first[100:130], rel=1e-4)
    apart = _units(logs, stitch=False)
    assert sorted(apart) == ["slurm-1001.out", "slurm-1002.out"]
    with pytest.raises(MultipleJobsError):
        read_run(logs, options=ReadOptions(stitch=False))


def test_jsonl_job_folders_exact_continuation(tmp_path: Path) -> None:
    """job_0 checkpoints at step 100 and ends there; job_1 starts at step 100."""
    root, ck = tmp_path / "run", tmp_path / "ckpt"
    a = train_job(root / "job_0" / "metrics.jsonl", "jsonl", stop=100, ckpt_dir=ck)
    b = train_job(root / "job_1" / "metrics.jsonl", "jsonl", stop=200, ckpt_dir=ck, resume=100)
    run = read_run(root)
    assert run.metadata["jobs"] == [
        "job_0/metrics.jsonl",
        "job_1/metrics.jsonl",
    ]
    assert run.name == "run"
    (seam,) = _seams(run)
    assert seam.measures["seam"] == "continuation"
    assert (seam.start_step, seam.measures["last_step_before"]) == (100, 99)
    assert seam.measures["wall_clock_gap_s"] >= 0
    assert "the steps continue where they stopped" in seam.summary
    loss = run.series("loss").get_column("value").to_list()
    assert loss == pytest.approx(a + b)


def test_tensorboard_job_folders(tmp_path: Path) -> None:
    root, ck = tmp_path / "tb", tmp_path / "ckpt"
    train_job(root / "job_0", "tensorboard", stop=160, ckpt_dir=ck)
    train_job(root / "job_1", "tensorboard", stop=300, ckpt_dir=ck, resume=150)
    run = read_run(root)
    (seam,) = _seams(run)
    assert seam.measures["seam"] == "overlap"
    assert (seam.measures["resumed_from_step"], seam.measures["last_step_before"]) == (150, 159)
    assert run.series("loss").height == 300
    assert len(_units(root, stitch=False)) == 2


def test_a_resume_that_changes_the_optimizer_is_seen_at_the_seam(tmp_path: Path) -> None:
    """Job 2 loads the weights but not the optimizer state, with a 6x LR: the loss jumps at the
    seam. Stitched, the jump is a spike right after the resume, judged against job 1's level,
    with the resume among its supported causes; job 2 alone has no level before it."""
    from forensics.pipeline import analyze_run

    root, ck = tmp_path / "run", tmp_path / "ckpt"
    train_job(root / "job_0" / "metrics.jsonl", "jsonl", stop=300, ckpt_dir=ck)
    train_job(
        root / "job_1" / "metrics.jsonl",
        "jsonl",
        stop=600,
        ckpt_dir=ck,
        resume=300,
        lr=0.12,
        fresh_optimizer=True,
    )
    diag = analyze_run(read_run(root))
    bad = [f for f in diag.findings if f.severity.rank >= 2 and f.metric == "loss"]
    assert bad, [f.summary for f in diag.findings]
    first = min(bad, key=lambda f: f.start_step)
    assert first.kind is FindingKind.LOSS_SPIKE and 300 <= first.start_step <= 310
    causes = {c.cause: c.status for c in diag.causes_for(first)}
    assert causes.get("resume") == "supported"
    alone = analyze_run(read_run(root / "job_1"))
    assert not [
        f for f in alone.findings if f.kind is FindingKind.LOSS_SPIKE and f.severity.rank >= 2
    ]


# ------------------------------------------------------------------ the rule's edges
def test_gap_is_a_chain_only_when_the_loss_continues(tmp_path: Path) -> None:
    """job_0 0-99, job_1 (100-199) lost, job_2 resumes from step 200: the loss goes on where
    job_0's was heading, so it is a chain with a gap. A job starting at step 300 whose loss
    lies far above (another model's checkpoint) is not."""
    root, ck = tmp_path / "run", tmp_path / "ckpt"
    train_job(root / "job_0" / "metrics.jsonl", "jsonl", stop=100, ckpt_dir=ck)
    train_job(tmp_path / "lost" / "metrics.jsonl", "jsonl", stop=200, ckpt_dir=ck, resume=100)
    train_job(root / "job_2" / "metrics.jsonl", "jsonl", stop=300, ckpt_dir=ck, resume=200)
    run = read_run(root)
    (seam,) = _seams(run)
    assert seam.measures["seam"] == "gap"
    assert "steps 100-199 are in neither log" in seam.summary
    other = tmp_path / "other_ckpt"
    train_job(tmp_path / "other" / "m.jsonl", "jsonl", stop=400, ckpt_dir=other, target_scale=30)
    train_job(root / "job_9" / "metrics.jsonl", "jsonl", stop=500, ckpt_dir=other, resume=400,
              target_scale=30)  # fmt: skip
    units = _units(root)
    assert sorted(units) == ["job_0+job_2", "job_9/metrics.jsonl"]
    lone = _read(root, "job_9/metrics.jsonl", units)
    assert lone.path == root / "job_9/metrics.jsonl" and "jobs" not in lone.metadata
    note = next(n for n in lone.notes if n.startswith("job_9/metrics.jsonl starts at step 400"))
    assert "steps 300-399 are in neither log and its first losses" in note
    assert "lie outside where" in note


def test_fresh_runs_with_the_same_names_are_not_a_chain(tmp_path: Path) -> None:
    """Two seeds side by side, and a later unrelated run from step 0: all start from scratch."""
    root, ck = tmp_path / "sweep", tmp_path / "ckpt"
    for seed in (0, 1):
        log = root / f"seed_{seed}" / "metrics.jsonl"
        train_job(log, "jsonl", stop=120, ckpt_dir=ck / str(seed), seed=seed)
    train_job(root / "rerun" / "metrics.jsonl", "jsonl", stop=80, ckpt_dir=ck / "r", seed=5)
    assert sorted(_units(root)) == [f"{j}/metrics.jsonl" for j in ("rerun", "seed_0", "seed_1")]
    with pytest.raises(MultipleJobsError, match="3 separate"):
        read_run(root)


def test_two_seeds_each_resumed_are_not_guessed(tmp_path: Path) -> None:
    """Two seeds, each resumed at step 100: the resumed jobs could continue either seed (same
    names, same steps), so the tool does not guess, and says so."""
    root = tmp_path / "sweep"
    for seed in (0, 1):
        ck = tmp_path / f"ckpt{seed}"
        train_job(root / f"s{seed}_a" / "metrics.jsonl", "jsonl", stop=100, ckpt_dir=ck, seed=seed)
    for seed in (0, 1):
        ck = tmp_path / f"ckpt{seed}"
        train_job(root / f"s{seed}_b" / "metrics.jsonl", "jsonl", stop=200, ckpt_dir=ck,
                  resume=100, seed=seed)  # fmt: skip
    units = _units(root)
    assert sorted(units) == [f"{j}/metrics.jsonl" for j in ("s0_a", "s0_b", "s1_a", "s1_b")]
    run = _read(root, "s0_b/metrics.jsonl", units)
    assert run.metadata.get("jobs") is None
    assert any(
        n.startswith("s0_b/metrics.jsonl (from step 100) could continue") and "not stitched" in n
        for n in run.notes
    ), run.notes


def test_the_real_runs_folder_is_not_a_chain() -> None:
    """Every other real-run folder with several jobs keeps them apart (no false seams)."""
    stitched = []
    for folder in sorted(p for p in shared_path("real_runs").iterdir() if p.is_dir()):
        jobs = discover_jobs(folder)
        if len(jobs) < 2:
            continue
        units = stitch_jobs(folder, jobs)
        stitched += [u for u in units if u not in jobs]
    assert stitched == ["lightning_logs/version_0+version_5"]


# ------------------------------------------------------------------ W&B resumed runs
WANDB_WRITER = textwrap.dedent("""
    import copy, torch, wandb
    torch.set_num_threads(1)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(512, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(512, 1, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    saved = {}
    def job(start, stop):
        # One job: a new process in real life, one run folder per job; the run id is resumed.
        run = wandb.init(project="forensics-test", mode="offline", id="chain42",
                         resume="allow", config={"lr": 0.02})
        if start:
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["opt"])
        for step in range(start, stop):
            idx = torch.randperm(512, generator=torch.Generator().manual_seed(step))[:32]
            loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.log({"train/loss": float(loss), "train/lr": 0.02}, step=step)
            if (step + 1) % 50 == 0:  # the checkpoint
                saved["model"] = copy.deepcopy(model.state_dict())
                saved["opt"] = copy.deepcopy(opt.state_dict())
        run.finish(exit_code=1 if stop == 130 else 0)
    job(0, 130)  # killed at step 130; last checkpoint at 100
    job(100, 220)
""")


def test_wandb_offline_resumed_run(tmp_path: Path) -> None:
    """The wandb client writes one offline run folder per job (the same run id resumed): read as
    one run with the seam at step 100."""
    pytest.importorskip("wandb")
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
    }
    proc = subprocess.run(
        [sys.executable, "-c", WANDB_WRITER],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    jobs = discover_jobs(tmp_path)
    assert len(jobs) == 2
    run = read_run(tmp_path)
    (seam,) = _seams(run)
    assert seam.measures["seam"] == "overlap"
    assert (seam.measures["resumed_from_step"], seam.measures["last_step_before"]) == (100, 129)
    assert run.series("loss").height == 220
    assert run.frame.filter(pl.col("segment") == 1).get_column("step").min() == 100


# ------------------------------------------------------------------ every command reads chains
def test_metrics_export_and_sweep_read_the_chain(tmp_path: Path) -> None:
    root, ck = tmp_path / "run", tmp_path / "ckpt"
    train_job(root / "job_0" / "metrics.jsonl", "jsonl", stop=130, ckpt_dir=ck)
    train_job(root / "job_1" / "metrics.jsonl", "jsonl", stop=220, ckpt_dir=ck, resume=100)
    r = _cli("metrics", str(root), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    loss_row = next(ln for ln in r.stdout.splitlines() if ln.startswith("│ loss "))
    assert [c.strip() for c in loss_row.split("│")[4:7]] == ["250", "0", "219"]
    r = _cli("metrics", str(root), "--no-stitch", cwd=tmp_path)
    assert r.returncode == 2 and "2 separate training jobs" in r.stderr
    out = tmp_path / "frame.parquet"
    r = _cli("export", str(root), "--to", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    frame = pl.read_parquet(out)
    # Every row of both jobs is kept (the re-done steps 100-129 twice), in two segments.
    assert frame.filter(pl.col("tag") == "loss").height == 130 + 120
    assert frame.get_column("segment").unique().sort().to_list() == [0, 1]
    r = _cli("export", str(root), "--to", str(out), "--no-stitch", cwd=tmp_path)
    assert r.returncode == 2
    from forensics.sweep import sweep

    train_job(root / "other" / "metrics.jsonl", "jsonl", stop=90, ckpt_dir=tmp_path / "o", seed=3)
    rows = sweep(root, tmp_path / "sweep", jobs=1)
    assert sorted(r["name"] for r in rows) == ["job_0+job_1", "other/metrics.jsonl"]
    chain = next(r for r in rows if r["name"] == "job_0+job_1")
    assert chain["last_step"] == 219
