"""Repeated pauses that together cost as much as a throughput drop are a warning.

A job that hung for two minutes every 300 steps of half a second lost 44% of its wall time
and read healthy: each pause is far shorter than a stall (5 minutes), and the tokens/s the
job logs is measured within a step, so it never drops. The stall detector now sums the
pauses (intervals 3x the usual pace, the slow-step factor) and warns when they cost 30% of
the wall time or more (the article's throughput-drop line), leaving out the stalls, the
intervals across a restart and the pauses at the evaluations the log shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze


def _write(
    folder: Path,
    pause: float,
    every: int = 300,
    evals: bool = False,
    step: float = 0.5,
    eval_shift: int = 0,
) -> Path:
    """3,000 steps of half a second, a pause of ``pause`` seconds before every ``every``-th
    step is logged (before steps 299, 599, ..., 2,999: ten); ``evals``: a val_loss logged at
    those steps."""
    rng = np.random.default_rng(3)
    n = 3000
    s = np.arange(n)
    loss = 4.0 * (1 + s / 500) ** -0.3 + 0.01 * rng.standard_normal(n)
    gn = 1.0 + 0.05 * rng.standard_normal(n)
    tps = 30_000 + 300 * rng.standard_normal(n)
    wall = 1.7e9 + step * s + pause * ((s + 1) // every)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "metrics.jsonl", "w") as fh:
        for i in range(n):
            row = {
                "step": int(s[i]),
                "loss": float(loss[i]),
                "grad_norm": float(gn[i]),
                "lr": 3e-4,
                "tokens_per_sec": float(tps[i]),
                "wall_time": float(wall[i]),
            }
            if evals and i > eval_shift and (i + 1 - eval_shift) % every == 0:
                row["val_loss"] = float(loss[i]) + 0.1
            fh.write(json.dumps(row) + "\n")
    return folder


def _lost(d):  # noqa: ANN001, ANN202
    return [
        f
        for f in d.findings
        if f.kind is FindingKind.STALL and f.measures.get("pauses") is not None
    ]


def test_pauses_costing_44_percent_of_the_time_are_a_warning(tmp_path: Path) -> None:
    d = analyze(_write(tmp_path / "run", pause=120.0))
    (f,) = _lost(d)
    assert f.severity is Severity.WARNING
    assert d.verdict == "warning"
    m = f.measures
    assert m["pauses"] == 10
    # 10 pauses of 120 s beyond the 0.5 s a step, in 2,999 x 0.5 + 10 x 120 seconds
    assert m["time_lost_pct"] == pytest.approx(100 * 10 * 120 / (2999 * 0.5 + 10 * 120))
    assert m["gap_seconds"] == pytest.approx(120.5)
    assert m["usual_step_seconds"] == pytest.approx(0.5)
    assert (f.start_step, f.end_step) == (298, 2999)
    assert "paused 10 times between logged steps from step 298 to 2,999" in f.summary
    assert "together 44% of the run's wall time" in f.summary
    # no stall of its own: each pause is under the 5-minute line
    assert not [g for g in d.findings if g.kind is FindingKind.STALL and g is not f]
    # the advice is for pauses that add up, not for one silence
    assert "profile a few steps around one of the pauses" in d.prescription_for(f).lower()


def test_pauses_under_the_line_are_no_finding(tmp_path: Path) -> None:
    """A minute every 300 steps: 10 x 60 s of 2,099.5 s is 29%, under the 30% line."""
    d = analyze(_write(tmp_path / "run", pause=60.0))
    assert not _lost(d)
    assert d.verdict == "healthy"


def test_pauses_at_the_logs_evaluations_are_the_jobs_own(tmp_path: Path) -> None:
    """The same two-minute pauses, each at a step that logs a validation loss: the job's
    evaluations, a cost it chose, not lost time."""
    d = analyze(_write(tmp_path / "run", pause=120.0, evals=True))
    assert not _lost(d)
    assert not [f for f in d.findings if f.severity is not Severity.INFO]


def test_pauses_a_step_or_two_before_the_logged_evaluations_are_the_jobs_own(
    tmp_path: Path,
) -> None:
    """The validation loss logged two steps after each pause (as the slow_eval_steps sample
    logs it): the pauses sit on the evaluations' 300-step grid within its slack."""
    d = analyze(_write(tmp_path / "run", pause=120.0, evals=True, eval_shift=2))
    assert not _lost(d)


def test_a_log_written_in_seconds_loses_no_time(tmp_path: Path) -> None:
    """Steps of a millisecond with a 10 ms pause every 10: half the wall time, but 3 seconds
    in all, the flushes of a writer in a test or a toy run (real tensorboardX logs in this
    suite have them). Less than a minute lost is no finding."""
    d = analyze(_write(tmp_path / "run", pause=0.01, every=10, step=0.001))
    assert not _lost(d)


def _write_rates(folder: Path, key: str, values: np.ndarray) -> Path:
    """3,000 steps with no wall clock: the loss and one rate series (``key``)."""
    rng = np.random.default_rng(4)
    s = np.arange(len(values))
    loss = 4.0 * (1 + s / 500) ** -0.3 + 0.01 * rng.standard_normal(len(s))
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "metrics.jsonl", "w") as fh:
        for i in s:
            row = {"step": int(i), "loss": float(loss[i]), "lr": 3e-4, key: float(values[i])}
            fh.write(json.dumps(row) + "\n")
    return folder


def test_slow_steps_without_a_wall_clock_cost_the_same(tmp_path: Path) -> None:
    """No wall clock, a step time per step: ten steps of two minutes among steps of half a
    second are the same 44%, read from the step times."""
    st = np.full(3000, 0.5)
    st[299::300] = 120.0
    d = analyze(_write_rates(tmp_path / "run", "step_time", st))
    (f,) = _lost(d)
    assert f.severity is Severity.WARNING
    m = f.measures
    assert (m["source"], m["pauses"]) == ("step_time", 10)
    assert m["time_lost_pct"] == pytest.approx(100 * 10 * 119.5 / (2990 * 0.5 + 10 * 120))
    assert m["gap_seconds"] == pytest.approx(120.0)
    assert m["usual_step_seconds"] == pytest.approx(0.5)
    assert "10 isolated slow steps in the step time from step 299 to 2,999" in f.summary
    assert "(the log has no wall clock to confirm it)" in f.summary


def test_slow_steps_in_tokens_per_second_alone(tmp_path: Path) -> None:
    """Only tokens/s: every 20th step at a tenth of the rate (each 10x slower, under the 20x
    of a stall). The share is read the same way (a step's time is the inverse of its rate):
    150 steps of 10 units among 2,850 of 1, 31%; the seconds are unknown."""
    tps = np.full(3000, 30_000.0)
    tps[19::20] = 3_000.0
    d = analyze(_write_rates(tmp_path / "run", "tokens_per_sec", tps))
    (f,) = _lost(d)
    m = f.measures
    assert (m["source"], m["pauses"], m["gap_seconds"]) == ("throughput", 150, None)
    assert m["time_lost_pct"] == pytest.approx(100 * 150 * 9 / (2850 + 150 * 10))
    assert "typically 10.0x slower than the steps around them" in f.summary
    assert not [g for g in d.findings if g.kind is FindingKind.STALL and g is not f]
