"""Checkpoints beside a log, found by the names the trainers give them (Megatron, DeepSpeed,
torchtitan, HF weights-only folders, Lightning, Composer). Before, only HF's checkpoint
folders with a trainer_state.json were seen: a Megatron or Lightning run with its
checkpoints right beside the log got "assuming a checkpoint every 500 steps"."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from conftest import snapshot

from forensics.importers import read_run
from forensics.importers.checkpoint_names import checkpoint_steps
from forensics.pipeline import analyze


def test_names_of_every_trainer(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for d in (
        "checkpoints/iter_0000500/mp_rank_00",  # Megatron-LM
        "ckpt/global_step1000",  # DeepSpeed
        "outputs/checkpoint/step-1500",  # torchtitan
        "checkpoint-2000",  # HF Trainer, weights only
        "iter_12",  # (not Megatron's seven digits)
        ".hidden/global_step9",  # (a hidden folder is not looked into)
        "a/b/c/global_step7",  # (four levels down: not looked for)
    ):
        (run / d).mkdir(parents=True)
    for f in (
        "checkpoints/epoch=2-step=2500.ckpt",  # Lightning
        "ep1-ba3000-rank0.pt",  # Composer
        "last.ckpt",  # (no step in the name)
        "step.txt",
    ):
        (run / f).parent.mkdir(parents=True, exist_ok=True)
        (run / f).write_text("")
    # (global_step1000's own contents are not entered: a checkpoint holds no other checkpoint)
    (run / "ckpt/global_step1000/global_step5").mkdir()
    assert checkpoint_steps(run) == [500, 1000, 1500, 2000, 2500, 3000]


def _spike_run(folder: Path) -> Path:
    """A JSONL run whose loss jumps at step 1,200 and takes 2,000 steps to come down, with
    Lightning checkpoints every 500 steps beside it."""
    rng = random.Random(3)
    folder.mkdir()
    with (folder / "metrics.jsonl").open("w") as f:
        for s in range(1, 2001):
            loss = 3 * math.exp(-s / 400) + 1.5 + rng.gauss(0, 0.01)
            if s >= 1200:
                loss += 1.2 * math.exp(-(s - 1200) / 2000)
            f.write(json.dumps({"step": s, "loss": loss, "lr": 3e-4}) + "\n")
    (folder / "checkpoints").mkdir()
    for s in (500, 1000, 1500, 2000):
        (folder / "checkpoints" / f"epoch=0-step={s}.ckpt").write_text("")
    return folder


def test_the_rollback_goes_back_to_a_checkpoint_the_run_has(tmp_path: Path) -> None:
    run = _spike_run(tmp_path / "run")
    before = snapshot(run)
    diag = analyze(run)
    (plan,) = [i.rollback for i in diag.incidents if i.rollback is not None]
    assert plan.checkpoint_step == 1000 and plan.checkpoint_known
    assert plan.checkpoint_source == "checkpoints found beside the log (500, 1,000, 1,500, 2,000)"
    assert snapshot(run) == before  # (names read, nothing written)


def test_a_log_file_given_alone_is_not_given_the_checkpoints_beside_it(tmp_path: Path) -> None:
    """The folder a log file sits in may hold other runs' checkpoints: only a run folder (or
    a job's own subfolder) is looked into."""
    run = _spike_run(tmp_path / "run")
    assert read_run(run).metadata.get("checkpoints") == [500, 1000, 1500, 2000]
    assert read_run(run / "metrics.jsonl").metadata.get("checkpoints") is None
