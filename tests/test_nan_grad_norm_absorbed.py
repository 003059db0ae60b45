"""A grad norm non-finite at isolated steps that the loss did not follow: the HF Trainer
with fp16 logs "grad_norm": NaN for a step its GradScaler skipped (written here as the
Trainer writes trainer_state.json: json.dumps, NaN literal), and logs no loss scale to
excuse it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze


def _trainer_state(folder: Path, nan_at: tuple[int, ...], loss_nan: bool = False) -> Path:
    rng = np.random.default_rng(2)
    log = []
    for s in range(10, 3001, 10):
        loss = 1.2 + 0.8 * np.exp(-s / 500) + rng.normal(0, 0.03)
        gn = float(0.9 + 0.3 * rng.standard_normal() ** 2)
        if s in nan_at:
            gn = float("nan")
            loss = float("nan") if loss_nan else loss
        lr = 2e-5 * (1 - s / 3000)
        log.append(
            {"epoch": s / 1000, "grad_norm": gn, "learning_rate": lr, "loss": loss, "step": s}
        )
    state = {"epoch": 3.0, "global_step": 3000, "log_history": log, "logging_steps": 10}
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps(state, indent=2))
    return folder


def test_isolated_nan_grad_norm_the_loss_ignored_is_a_warning(tmp_path: Path) -> None:
    d = analyze(_trainer_state(tmp_path / "run", (1450, 2210)))
    (f,) = [f for f in d.findings if f.kind is FindingKind.NAN_INF]
    assert f.metric == "grad_norm" and f.measures["loss_back"] is True
    assert f.severity is Severity.WARNING and d.verdict == "warning"
    assert not [r for r in d.rollbacks if r.rollback]
    assert d.prescription_for(f).startswith("Yellow light: look, but do not roll back")


def test_the_same_steps_with_a_nan_loss_stay_critical(tmp_path: Path) -> None:
    """The article's orange light: a non-finite loss, even one the run came back from."""
    d = analyze(_trainer_state(tmp_path / "run", (1450, 2210), loss_nan=True))
    assert max(f.severity.rank for f in d.findings if f.kind is FindingKind.NAN_INF) == (
        Severity.CRITICAL.rank
    )
