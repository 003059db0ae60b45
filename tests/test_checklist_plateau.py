"""The late phase's "Does the loss decline match the learning-rate schedule?" against the
plateau finding. A plateau is a note (info), and the checklist's finding rule reads only
findings above info: a run whose loss stayed flat for 8,000 steps at 37% of its peak LR ("the
run stopped learning") passed the item with "no plateau found". An unexplained plateau now
fails it; one the schedule explains passes, and says so instead of "no plateau found"."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from forensics.checklists import FAIL, PASS
from forensics.findings import FindingKind
from forensics.pipeline import analyze_run, read_run

Q = "Does the loss decline match the learning-rate schedule?"


def _write(path: Path, *, frozen: bool) -> Path:
    rng = np.random.default_rng(3)
    n, rows = 12000, []
    for s in range(1, n + 1):
        lr = 3e-4 * min(1, s / 500) * (0.1 + 0.45 * (1 + np.cos(np.pi * s / n)))
        base = 2.2 + 6 / (1 + min(s, 4000 if frozen else s) / 400) ** 0.8
        rows.append(json.dumps({"step": s, "loss": base * (1 + rng.normal(0, 0.01)), "lr": lr}))
    path.write_text("\n".join(rows) + "\n")
    return path


def _late(diag) -> tuple[str, str]:
    (late,) = [p for p in diag.phases if p.key == "late"]
    return {i.question: (i.status, i.evidence) for i in late.items}[Q]


def test_a_plateau_at_an_active_lr_fails_the_schedule_item(tmp_path: Path) -> None:
    diag = analyze_run(read_run(_write(tmp_path / "m.jsonl", frozen=True)))
    (flat,) = [f for f in diag.findings if f.kind is FindingKind.PLATEAU]
    assert flat.measures["lr_context"] == "active" and "stopped learning" in flat.summary
    status, evidence = _late(diag)
    assert status == FAIL and f"plateau at step {flat.start_step:,}" in evidence


def test_a_falling_loss_passes_with_no_plateau_found(tmp_path: Path) -> None:
    diag = analyze_run(read_run(_write(tmp_path / "m.jsonl", frozen=False)))
    assert not [f for f in diag.findings if f.kind is FindingKind.PLATEAU]
    status, evidence = _late(diag)
    assert status == PASS and evidence.endswith("no plateau found")


def test_a_plateau_the_schedule_explains_passes_and_is_named(tmp_path: Path) -> None:
    """A warm-up/stable/decay run: the loss flat through the stable phase at a steady LR,
    brought down by the decay that follows (a plateau the schedule explains)."""
    rng = np.random.default_rng(4)
    rows = []
    for s in range(1, 12001):
        lr = 3e-4 * min(1, s / 300) if s <= 9000 else 3e-4 * (1 - (s - 9000) / 3000) + 3e-6
        base = (
            2.2
            + 6 / (1 + min(s, 3000) / 400) ** 0.8
            - (0.25 * (s - 9000) / 3000 if s > 9000 else 0)
        )
        rows.append(json.dumps({"step": s, "loss": base * (1 + rng.normal(0, 0.01)), "lr": lr}))
    (tmp_path / "m.jsonl").write_text("\n".join(rows) + "\n")
    diag = analyze_run(read_run(tmp_path / "m.jsonl"))
    flat = [f for f in diag.findings if f.kind is FindingKind.PLATEAU]
    assert flat and all(f.measures["expected"] for f in flat), [f.summary for f in flat]
    status, evidence = _late(diag)
    assert status == PASS and "is one the schedule explains" in evidence, evidence
