"""A resumed job whose LR does not continue where the first attempt left it: the steps both
attempts logged show it (the LR is a function of the step). Written as a training script
writes them: JSON lines appended by the resumed job, and a second event file from
tensorboardX's SummaryWriter."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze

N, WARM, PEAK = 8000, 500, 6e-4


def _sched(t: int) -> float:
    if t < WARM:
        return PEAK * t / WARM
    return PEAK * (0.1 + 0.45 * (1 + math.cos(math.pi * (t - WARM) / (N - WARM))))


def _rows(restored: bool, factor: float = 1.0, warm: bool = True) -> list[dict]:
    """Steps 1-3,500, a crash, then a resume from the checkpoint at step 3,000: with its
    scheduler state (the LR goes on, times ``factor``) or without (the schedule from its
    start: a fresh warm-up, or without ``warm`` the cosine from its peak)."""
    rng = np.random.default_rng(8)
    rows = []
    for s in range(1, 3501):
        rows.append(
            {"step": s, "loss": 2.3 + 6 / (1 + s / 600) + rng.normal(0, 0.02), "lr": _sched(s)}
        )
    for i, s in enumerate(range(3001, N + 1)):
        lr = factor * _sched(s) if restored else _sched(i + 1 + (0 if warm else WARM))
        rows.append({"step": s, "loss": 2.3 + 6 / (1 + s / 600) + rng.normal(0, 0.02), "lr": lr})
    return rows


def _restart(path: Path):
    d = analyze(path)
    (f,) = [f for f in d.findings if f.kind is FindingKind.RESTART]
    return d, f


def test_scheduler_not_restored_is_a_warning(tmp_path: Path) -> None:
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in _rows(restored=False)))
    d, f = _restart(p)
    m = f.measures
    assert f.severity is Severity.WARNING
    assert m["lr_step"] == 3001
    assert m["lr_before"] == pytest.approx(_sched(3001)) and m["lr_after"] == pytest.approx(
        _sched(1)
    )
    assert m["lr_max_ratio"] == pytest.approx(_sched(3001) / _sched(1))
    assert m["lr_reshaped"] is True
    assert (
        f"the LR follows another schedule: {_sched(3001):.4g} at step 3,001 before the "
        f"restart, {_sched(1):.4g} after it" in f.summary
    )
    assert d.prescription_for(f).startswith("Yellow light: restore the LR scheduler's state")


def test_scheduler_restored_stays_a_note(tmp_path: Path) -> None:
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in _rows(restored=True)))
    _, f = _restart(p)
    assert f.severity is Severity.INFO and f.measures["lr_step"] is None
    assert "LR" not in f.summary


def test_scheduler_not_restored_across_event_files(tmp_path: Path) -> None:
    """The resumed job writes a second event file into the same folder (TensorBoard)."""
    from tensorboardX import SummaryWriter

    rows = _rows(restored=False)
    first, second = rows[:3500], rows[3500:]
    for part, suffix in ((first, "a"), (second, "b")):
        w = SummaryWriter(str(tmp_path / "tb"), filename_suffix=suffix)
        for r in part:
            w.add_scalar("train/loss", r["loss"], r["step"])
            w.add_scalar("train/lr", r["lr"], r["step"])
        w.close()
    _, f = _restart(tmp_path / "tb")
    assert f.severity is Severity.WARNING and f.measures["lr_step"] == 3001


def test_scheduler_restarted_past_its_warmup_is_a_warning(tmp_path: Path) -> None:
    """Without its state the scheduler can also start at its peak (no warm-up in the new
    config): over the 500 steps logged twice the two cosines differ by 1.29x to 1.41x, a
    factor that moves."""
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in _rows(restored=False, warm=False)))
    _, f = _restart(p)
    assert f.severity is Severity.WARNING and f.measures["lr_reshaped"] is True


def test_lr_lowered_after_a_rollback_is_a_note(tmp_path: Path) -> None:
    """The article's treatment after a rollback: resume with the LR 20-50% lower. The same
    schedule times 0.7: said, not warned."""
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in _rows(restored=True, factor=0.7)))
    d, f = _restart(p)
    assert f.severity is Severity.INFO and f.measures["lr_reshaped"] is False
    assert (
        f"The resumed job runs the LR at 0.7x the earlier attempt's at the same steps "
        f"({_sched(3001):.4g} -> {0.7 * _sched(3001):.4g} at step 3,001): a changed LR, the "
        "same schedule." in f.summary
    )
    assert not d.prescription_for(f).startswith("Yellow light")
