"""Recurring stalls are one stall finding with each one's step.

Found in a review pass: a log without a wall clock whose tokens/s fell 240x at 12 isolated
steps read as 12 stall warnings and 12 incidents, each "a hang or a pre-emption inside the
step"; a log with eight ten-minute silences of its wall clock read as eight, and nothing said
they took 62% of its time. Three or more stalls are now one warning listing them
(``events_at``), with their count, the share of the time they took, and the prescription for
hangs that recur; one or two stay findings of their own.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

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
    assert m["stalls"] == 12 and m["pauses"] is None
    # each hang's time beyond the usual pace over the logged steps' time (time ~ 1 / rate)
    lost = 12 * (m["ratio"] - 1) / (10_000 - 12 + 12 * m["ratio"])
    assert m["time_lost_pct"] == pytest.approx(100 * lost, rel=0.03)
    assert f"together {m['time_lost_pct']:.0f}% of the logged steps' time" in f.summary
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


def _write_wall(folder: Path, silences: int) -> tuple[Path, list[int]]:
    """6,000 steps of half a second with a wall clock; ``silences`` ten-minute silences
    before as many steps at random (pre-emptions)."""
    rng = np.random.default_rng(13)
    n = 6000
    at = sorted(int(s) for s in rng.choice(np.arange(100, n - 100), silences, replace=False))
    folder.mkdir()
    t = 1.7e9
    with open(folder / "metrics.jsonl", "w") as fh:
        for s in range(n):
            t += 0.5 + (600 if s in at else 0)
            loss = 2 * np.exp(-s / 3000) + 1.5 + 0.01 * rng.normal()
            fh.write(json.dumps({"step": s, "loss": loss, "lr": 3e-4, "_timestamp": t}) + "\n")
    return folder, at


def test_eight_silences_are_one_warning_with_the_time_they_took(tmp_path: Path) -> None:
    run, at = _write_wall(tmp_path / "run", 8)
    d = analyze(run)
    (f,) = _stalls(d)
    # (each silence lies between the step before the added time and that step)
    assert f.events_at == tuple(s - 1 for s in at) and f.end_step == at[-1]
    m = f.measures
    assert m["stalls"] == 8 and m["gap_seconds"] == pytest.approx(600.5)
    assert m["time_lost_pct"] == pytest.approx(100 * 8 * 600 / (6000 * 0.5 + 8 * 600), abs=0.1)
    assert f.summary.startswith(
        f"Nothing was logged for 10 min at 8 points from step {at[0] - 1:,}"
    )
    assert "together 1.3 h, 62% of the wall time: hangs or pre-emptions, recurring" in f.summary
    assert len(d.incidents) == 1


def test_two_silences_stay_two_findings(tmp_path: Path) -> None:
    run, at = _write_wall(tmp_path / "run", 2)
    found = _stalls(analyze(run))
    assert [f.end_step for f in found] == at
    assert all(f.events_at is None and f.measures["stalls"] is None for f in found)


def test_a_hang_between_the_silences_is_still_found(tmp_path: Path) -> None:
    """The wall clock is logged every 50 steps: three 20-minute silences (one finding of
    three) and, between them, a 400-second hang inside step 2,000 that only the step time
    shows (its 50-step interval is 17x the usual, under the 20x stall line). The hang lies
    within the silences' finding's steps but at none of its silences: still a stall of its
    own (the finding's whole span had hidden it)."""
    folder = tmp_path / "run"
    folder.mkdir()
    rng = np.random.default_rng(14)
    t = 1.7e9
    silent, hang = {1000, 3000, 5000}, 2000
    with open(folder / "metrics.jsonl", "w") as fh:
        for s in range(6000):
            took = 0.5 * np.exp(rng.normal(0, 0.03)) + (1200 if s in silent else 0)
            took += 400 if s == hang else 0
            t += took
            row: dict[str, float | int] = {"step": s, "loss": 2 * np.exp(-s / 3000) + 1.5}
            row["step_time"] = took
            if s % 50 == 0:
                row["_timestamp"] = t
            fh.write(json.dumps(row) + "\n")
    found = _stalls(analyze(folder))
    grouped = [f for f in found if f.events_at is not None]
    (g,) = grouped
    assert g.events_at == (950, 2950, 4950) and g.measures["stalls"] == 3
    (h,) = [f for f in found if f.events_at is None]
    assert h.start_step == hang and h.summary.startswith("Step 2,000 took "), h.summary
