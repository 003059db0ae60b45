"""Recurring hangs inside single steps are one stall finding with each one's step.

Found in a review pass: a log without a wall clock whose tokens/s fell 240x at 12 isolated
steps read as 12 stall warnings and 12 incidents, each "a hang or a pre-emption inside the
step". Three or more such steps are now one warning listing them (``events_at``), with the
prescription for hangs that recur; one or two stay findings of their own.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze


def _write(folder: Path, hangs: int, step_time: bool = False) -> tuple[Path, list[int]]:
    """10,000 steps logged each step with no wall clock; ``hangs`` isolated steps at random
    take 240x the usual pace (tokens/s), or 800x in a step time of 0.5 s (400 s each, past
    the 5-minute stall line)."""
    rng = np.random.default_rng(12)
    n = 10_000
    slow = sorted(int(s) for s in rng.choice(np.arange(100, n - 100), hangs, replace=False))
    folder.mkdir()
    with open(folder / "metrics.jsonl", "w") as fh:
        for s in range(n):
            row: dict[str, float | int] = {
                "step": s,
                "loss": 2 * np.exp(-s / 3000) + 1.5 + 0.01 * rng.normal(),
                "lr": 3e-4,
            }
            if step_time:
                row["step_time"] = 0.5 * np.exp(rng.normal(0, 0.03)) * (800 if s in slow else 1)
            else:
                row["tokens_per_sec"] = (
                    10_000 * np.exp(rng.normal(0, 0.03)) / (240 if s in slow else 1)
                )
            fh.write(json.dumps(row) + "\n")
    return folder, slow


def _stalls(d):  # noqa: ANN001, ANN202
    return [f for f in d.findings if f.kind is FindingKind.STALL]


def test_twelve_hangs_are_one_warning_with_their_steps(tmp_path: Path) -> None:
    run, slow = _write(tmp_path / "run", 12)
    d = analyze(run)
    (f,) = _stalls(d)
    assert f.severity is Severity.WARNING and f.events_at == tuple(slow)
    assert (f.start_step, f.end_step) == (slow[0], slow[-1])
    m = f.measures
    assert m["slow_steps"] == 12 and 200 < m["ratio"] < 280 and m["gap_seconds"] is None
    assert f.summary.startswith(f"12 isolated steps from step {slow[0]:,} to {slow[-1]:,} each ")
    assert "hangs or pre-emptions inside single steps, recurring" in f.summary
    assert len(d.incidents) == 1
    i = d.findings.index(f)
    assert "match the hangs' steps against the cluster's" in d.prescriptions[i]


def test_hangs_with_their_seconds(tmp_path: Path) -> None:
    run, slow = _write(tmp_path / "run", 4, step_time=True)
    (f,) = _stalls(analyze(run))
    assert f.events_at == tuple(slow) and f.measures["slow_steps"] == 4
    assert f.measures["gap_seconds"] > 300 and 0.4 < f.measures["usual_step_seconds"] < 0.6
    assert "where the usual step takes" in f.summary, f.summary


def test_two_hangs_stay_two_findings(tmp_path: Path) -> None:
    run, slow = _write(tmp_path / "run", 2)
    found = _stalls(analyze(run))
    assert [f.start_step for f in found] == slow
    assert all(f.events_at is None and f.summary.startswith("Step ") for f in found)
