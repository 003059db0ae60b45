"""A grad-norm step up that never comes back reads as settled higher, not as a late return
(written as the JSONL a training script logs, read through the importer)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from forensics.findings import FindingKind
from forensics.pipeline import analyze
from forensics.report.render import spike_cell


def _run(path: Path) -> Path:
    """The LR raised 10x at step 6,000 (a config typo): the grad norm steps up from 0.42 to
    about 0.72 and stays there, the param norm jumps 21% over 30 steps, the loss bumps and
    goes on falling."""
    rng = np.random.default_rng(3)
    pn = 100.0
    with path.open("w") as f:
        for s in range(1, 10001):
            lr = 3e-4 if s < 6000 else 3e-3
            pn += 0.002 + (0.8 if 6000 <= s < 6030 else 0) + rng.normal(0, 0.001)
            bump = 0.25 * np.exp(-(s - 6000) / 400) if s >= 6000 else 0.0
            loss = 2.2 + 6 / (1 + s / 800) + rng.normal(0, 0.02) + bump
            gn = 0.4 + 0.05 * rng.standard_normal() ** 2 + (0.3 if s >= 6000 else 0)
            row = {"step": s, "loss": round(loss, 4), "lr": lr, "grad_norm": round(gn, 4)}
            row["param_norm"] = round(pn, 4)
            f.write(json.dumps(row) + "\n")
    return path


def test_grad_norm_step_up_reads_settled_higher(tmp_path: Path) -> None:
    d = analyze(_run(tmp_path / "run.jsonl"))
    (f,) = [f for f in d.findings if f.kind is FindingKind.GRAD_NORM_SPIKE and f.start_step == 6000]
    m = f.measures
    # Back inside the trend's band (it widens with the distance) only after 500 steps: the
    # sentence said "back only after N steps" though the grad norm never came down.
    assert m["recovered"] and m["recovery_steps"] > 500
    assert m["classification"] == "pathological" and m["settled"] == "higher"
    # The data after the step: never back near the 0.42 before it.
    rel = m["plateau_shift_rel"]
    assert 0.4 < rel < 0.8
    assert f"settled {rel:.0%} above its earlier trend" in f.summary
    assert "back only after" not in f.summary
    assert spike_cell(f, "classification") == "settled higher"


def test_signs_after_an_lr_change_are_treated_at_the_change(tmp_path: Path) -> None:
    """Every sign of the incident whose supported cause is the LR raise is treated at that
    raise, not by its own row ("usually no action" for the grad-norm step, "check the
    gradient-clipping configuration" for the param-norm jump)."""
    d = analyze(_run(tmp_path / "run.jsonl"))
    signs = [f for f in d.findings if f.start_step == 6000]
    assert {f.kind for f in signs} == {FindingKind.GRAD_NORM_SPIKE, FindingKind.PARAM_NORM_JUMP}
    for f in signs:
        (lr,) = [c for c in d.causes_for(f) if c.cause == "lr_change"]
        assert lr.status == "supported"
        rx = d.prescription_for(f)
        assert rx.startswith("Yellow light: the learning rate left its schedule at step 6,000")
        assert "clipping" not in rx and "no action" not in rx


def _shifted(path: Path) -> Path:
    """A loss spike at step 5,000 (1.6x) that falls back only to 5% above where the loss was
    heading, and stays there to the end of the log (step 10,000)."""
    rng = np.random.default_rng(11)
    with path.open("w") as f:
        for s in range(1, 10001):
            base = 2.0 + 2.0 * np.exp(-s / 1500)
            extra = base * (0.6 * np.exp(-(s - 5000) / 60) + 0.05) if s >= 5000 else 0.0
            row = {"step": s, "loss": base + extra + rng.normal(0, 0.01), "lr": 3e-4}
            f.write(json.dumps(row) + "\n")
    return path


def test_a_loss_spike_not_back_says_how_far_off(tmp_path: Path) -> None:
    """The sentence said only "not back on its trend 5,000 steps later; pathological": the
    reader could not tell a loss stuck 1% above its trend from one stuck 50% above. It now
    gives the plateau the shape measured (``plateau_shift_rel``, the median from 500 steps
    after the peak against the trend), the number in the finding's measures."""
    d = analyze(_shifted(tmp_path / "run.jsonl"))
    (f,) = [f for f in d.findings if f.kind is FindingKind.LOSS_SPIKE]
    m = f.measures
    assert f.start_step == 5000 and m["classification"] == "pathological"
    assert m["recovered"] is False
    rel = m["plateau_shift_rel"]
    assert isinstance(rel, float) and 0.04 < rel < 0.08  # (5% built in, against its fitted trend)
    assert (
        f"not back on its trend 5,000 steps later (from 500 steps after the peak, a median "
        f"{rel:.1%} above it); pathological"
    ) in f.summary, f.summary
