"""param_norm_jump for jumps spread over several logged points, and for the schedule's own
changes of pace (written as the JSONL a training script logs, read through the importer)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze


def _write(path: Path, steps: np.ndarray, pn: np.ndarray, lr: np.ndarray | None) -> Path:
    rng = np.random.default_rng(0)
    with path.open("w") as f:
        for i, s in enumerate(steps):
            row = {"step": int(s), "loss": 2.2 + 6 / (1 + s / 800) + rng.normal(0, 0.02)}
            row["param_norm"] = float(pn[i])
            if lr is not None:
                row["lr"] = float(lr[i])
            f.write(json.dumps(row) + "\n")
    return path


def _norm(n: int, pace: np.ndarray, p0: float = 300.0, seed: int = 1) -> np.ndarray:
    """A norm growing by ``pace`` (relative to p0) a step, with noisy increments."""
    rng = np.random.default_rng(seed)
    return p0 + np.cumsum(p0 * pace * (1 + 0.5 * rng.standard_normal(n)))


def _jumps(path: Path) -> list:
    d = analyze(path)
    return [f for f in d.findings if f.kind is FindingKind.PARAM_NORM_JUMP]


@pytest.mark.parametrize("with_lr", [True, False])
def test_jump_spread_over_forty_steps_is_found(tmp_path: Path, with_lr: bool) -> None:
    """40 steps of updates 40x the usual size (gradient accumulation bypassing the clip, the
    LR unchanged): no single step moves the norm 1%, the burst moves it 3.2%. Found, with
    the span and the numbers of the log."""
    n = 8000
    steps = np.arange(1, n + 1)
    pace = np.full(n, 2e-5)
    pace[5000:5040] = 8e-4
    pn = _norm(n, pace)
    lr = np.where(steps < 500, 3e-4 * steps / 500, 3e-4) if with_lr else None
    (f,) = _jumps(_write(tmp_path / "run.jsonl", steps, pn, lr))
    assert f.severity is Severity.WARNING and f.measures["abrupt"] is True
    assert 4995 <= f.start_step <= 5003 and 5036 <= (f.end_step or 0) <= 5042
    i0, i1 = f.start_step - 2, (f.end_step or 0) - 1  # the norm before and where it got
    assert f.measures["before"] == pytest.approx(pn[i0])
    rel = (pn[i1] - pn[i0]) / pn[i0]
    assert f"{rel:+.1%} in {f.end_step - f.start_step + 1} steps" in f.summary
    assert 0.025 < rel < 0.04
    # It peaks where the norm got furthest inside it (not at the step the centred scale
    # happened to rate highest).
    inside = pn[f.start_step - 1 : (f.end_step or 0)]
    assert f.peak_step == f.start_step + int(np.argmax(inside))


def test_pace_set_by_an_lr_restart_is_not_a_jump(tmp_path: Path) -> None:
    """An SGDR restart takes the LR from near zero back to its peak: the norm's pace goes
    with it (3% in 64 steps after a flat stretch). The schedule did it: no jump."""
    n, warm, period = 12000, 500, 3000
    steps = np.arange(1, n + 1)
    phase = (steps - warm) % period
    cosine = 1e-3 * 0.5 * (1 + np.cos(np.pi * phase / period))
    lr = np.where(steps < warm, 1e-3 * steps / warm, cosine)
    pn = _norm(n, 5e-4 * lr / 1e-3)
    found = _jumps(_write(tmp_path / "run.jsonl", steps, pn, lr))
    assert not [f for f in found if f.measures["abrupt"]]  # (its slow growth may be noted)


@pytest.mark.parametrize("with_lr", [True, False])
def test_fast_warmup_is_not_a_jump(tmp_path: Path, with_lr: bool) -> None:
    """A 100-step warm-up takes the norm's pace with the LR from nothing to 3e-4 of the norm
    a step: 1.1% over steps 24-92, four times the pace of the steps before them. The
    schedule's (or, without a logged LR, the first 500 steps'): no jump."""
    n = 8000
    steps = np.arange(1, n + 1)
    lr = np.where(steps < 100, 1e-3 * steps / 100, 1e-3)
    pn = _norm(n, 3e-4 * lr / 1e-3, p0=1500.0)
    found = _jumps(_write(tmp_path / "run.jsonl", steps, pn, lr if with_lr else None))
    assert not [f for f in found if f.measures["abrupt"]]


def test_first_slow_warmup_increment_is_not_a_jump(tmp_path: Path) -> None:
    """Logged every 50 steps through a 100-step warm-up: the first increment (steps 1-51)
    is a fifth of the ones after it. It departs from their median, but downwards: no
    "jump" at step 51 (it read "jumped from 40 to 40.74 at step 51 (12x its usual
    step-to-step change)")."""
    n = 3000
    steps = np.arange(1, n + 1)
    lr = np.where(steps < 100, 1e-3 * steps / 100, 1e-3)
    pn = 40.0 + np.cumsum(40.0 * 1.6e-3 * lr / 1e-3)
    keep = (steps - 1) % 50 == 0
    found = _jumps(_write(tmp_path / "run.jsonl", steps[keep], pn[keep], lr[keep]))
    assert not [f for f in found if f.measures["abrupt"]]
