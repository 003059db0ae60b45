"""A hand-written loop's JSONL log: ``{"epoch": e, "step": i, "loss": ...}`` with ``i`` from
``enumerate(loader)``, so the step counts from 0 again in each epoch. Read as restarts, each
epoch replaced the one before: a three-epoch log was analysed as its last epoch only ("The job
was resumed at step 0 ... 600 earlier points give way"). Steps that go back at an epoch
increase are now one continuous count, with a note; a resume within an epoch is still one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from forensics.findings import FindingKind
from forensics.importers import read_run
from forensics.pipeline import analyze_run


def _write(path: Path, epochs: list[int], steps_per_epoch: int = 2000, every: int = 10) -> Path:
    rng = np.random.default_rng(9)
    rows, g = [], 0
    for ep in epochs:
        for s in range(0, steps_per_epoch, every):
            g += every
            loss = 2.2 + 6 / (1 + g / 400) + rng.normal(0, 0.01)
            rows.append(json.dumps({"epoch": ep, "step": s, "loss": loss, "lr": 3e-4}))
    path.write_text("\n".join(rows) + "\n")
    return path


def test_steps_counted_per_epoch_are_one_run(tmp_path: Path) -> None:
    run = read_run(_write(tmp_path / "train.jsonl", [0, 1, 2]))
    loss = run.frame.filter(pl.col("metric") == "loss").sort("step")
    steps = loss.get_column("step").to_list()
    assert len(steps) == 600 and steps == list(range(0, 6000, 10))
    assert any(
        "the step counts from 0 again at each new epoch (2 time(s))" in n
        and "epoch 1 from step 2,000, epoch 2 from step 4,000" in n
        for n in run.notes
    ), run.notes
    assert not [f for f in run.import_findings if f.kind is FindingKind.RESTART]
    diag = analyze_run(run)
    assert diag.run.first_step == 0 and diag.run.last_step == 5990


def test_a_resume_within_an_epoch_is_still_a_restart(tmp_path: Path) -> None:
    """Epoch 1 logged to step 1,990, then the job resumed from epoch 1's start: the epoch did
    not rise at the step-back, so it is a restart (the replaced attempt's rows give way)."""
    run = read_run(_write(tmp_path / "train.jsonl", [0, 1, 1]))
    assert not any("again at each new epoch" in n for n in run.notes)
    assert [f for f in run.import_findings if f.kind is FindingKind.RESTART]
