"""Non-finite grad norms at the first logged steps of an fp16 run, the loss finite and falling:
the HF Trainer logs "grad_norm": NaN for each step its GradScaler skips, and the scaler skips
the first few while it lowers its scale from 65,536 (written here as the Trainer writes
trainer_state.json: json.dumps, NaN literal, a line per step). No loss scale is logged.

Four such steps read FATAL ("nothing to roll back to: no step of this run is known healthy")
on a run that trained normally. The loss shows the updates were skipped: a note, the run
green. A loss that was not finite there, or that rose after, or a stretch longer than the
scaler's 16 halvings, is not excused.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze


def _trainer_state(
    folder: Path,
    nan_steps: range | tuple[int, ...],
    *,
    loss_nan: bool = False,
    jump_after: float = 0.0,
    later_nan: tuple[int, ...] = (),
) -> Path:
    rng = np.random.default_rng(4)
    log = []
    for s in range(1, 2001):
        loss = 1.2 + 2.0 / (1 + s / 200) + rng.normal(0, 0.02)
        if s > max(nan_steps, default=0):
            loss += jump_after
        gn = float(0.3 + 1.5 / (1 + s / 500) + abs(rng.normal(0, 0.05)))
        if s in nan_steps or s in later_nan:
            gn = float("nan")
            loss = float("nan") if loss_nan and s in nan_steps else loss
        lr = 5e-5 * min(1.0, s / 100)
        log.append(
            {"epoch": s / 2000, "grad_norm": gn, "learning_rate": lr, "loss": loss, "step": s}
        )
    state = {"epoch": 1.0, "global_step": 2000, "log_history": log, "logging_steps": 1}
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps(state, indent=2))
    return folder


def _nan(diag) -> list:  # type: ignore[no-untyped-def]
    return [f for f in diag.findings if f.kind is FindingKind.NAN_INF]


def test_skipped_updates_at_the_start_are_a_note(tmp_path: Path) -> None:
    d = analyze(_trainer_state(tmp_path / "run", range(1, 5)))
    (f,) = _nan(d)
    assert f.severity is Severity.INFO and d.verdict == "healthy"
    m = f.measures
    assert m["skipped_at_start"] is True and m["persistent"] is False
    assert (f.start_step, f.end_step, m["bad_points"], m["recovered_step"]) == (1, 4, 4, 5)
    assert m["loss_back"] is True and m["loss_after"] <= m["loss_before"]
    assert "at the first 4 logged step(s) (1-4) and finite from step 5 on" in f.summary
    assert "a hypothesis: the log has no loss scale to show it" in f.summary
    assert not d.rollbacks or not [r for r in d.rollbacks if r.rollback]
    assert d.prescription_for(f).startswith("Nothing to do if the run trains in fp16")


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"nan_steps": range(1, 5), "loss_nan": True}, "the loss was NaN there too"),
        ({"nan_steps": range(1, 5), "jump_after": 0.5}, "the loss rose after"),
        ({"nan_steps": range(1, 21)}, "longer than 16 halvings of the scale"),
    ],
    ids=["loss-nan", "loss-rose", "too-long"],
)
def test_other_start_up_nans_are_not_excused(tmp_path: Path, kwargs: dict, why: str) -> None:
    d = analyze(_trainer_state(tmp_path / "run", **kwargs))
    worst = max(f.severity.rank for f in _nan(d))
    assert worst >= Severity.CRITICAL.rank, why
    assert not any(f.measures["skipped_at_start"] for f in _nan(d)), why


def test_later_stretches_are_judged_on_their_own(tmp_path: Path) -> None:
    d = analyze(_trainer_state(tmp_path / "run", range(1, 5), later_nan=(1200,)))
    (f,) = _nan(d)
    assert f.start_step == 1200 and f.measures["skipped_at_start"] is False
    assert f.severity is Severity.WARNING  # an isolated step the loss ignored
    assert any("the first 4 logged step(s) (1-4)" in n for n in d.run.notes)
