"""A grad-norm climb started by an LR typed 10x too high (a restart with a wrong config):
the climb's onset is fitted on bin medians, so it is known to about a bin's width, and a
fit that put it 19 steps before the LR change made the change "later" than the climb it
caused: "lr_change: contradicted ... its unexplained change starts later, at step 5,000",
"the gradient norm moved first", and advice to cut the LR to a third of the wrong value.

The onset is now the LR change where one starts within a bin after the fitted bend; the LR
change is the supported cause and moved first, the sentence says the LR is 10x its
baseline's, and the advice (the terminal's next step, the first-aid plan) is to put the LR
back to its value before the change. A climb without an LR change keeps its fitted onset
and the first aid of a third of the LR.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from forensics.cli import app
from forensics.findings import FindingKind
from forensics.pipeline import analyze_run, read_run


def _write(path: Path, *, jump: bool) -> Path:
    rng = np.random.default_rng(11)
    lines = []
    for s in range(1, 8001):
        lr = 3e-4 * min(1.0, s / 500)
        loss = 2.4 + 5.0 / (1 + s / 400) + rng.normal(0, 0.015)
        gn = 0.35 + rng.normal(0, 0.02)
        if s >= 5000:
            lr = 3e-3 if jump else lr
            gn = 0.35 * (1 + (s - 5000) / 400) + rng.normal(0, 0.02)
            loss += 0.00004 * (s - 5000)
        lines.append(json.dumps({"step": s, "loss": loss, "grad_norm": gn, "lr": lr}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_climb_the_lr_jump_started_begins_at_the_jump(tmp_path: Path) -> None:
    diag = analyze_run(read_run(_write(tmp_path / "metrics.jsonl", jump=True)))
    (drift,) = [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_DRIFT]
    assert drift.start_step == 5000
    assert "at a learning rate 10x its baseline's (0.0003 -> 0.003)" in drift.summary
    (lr,) = [c for c in diag.causes_for(drift) if c.cause == "lr_change"]
    assert lr.status == "supported"
    assert "(x10: 0.0003 -> 0.003 at step 5,000); still raised at the onset" in lr.evidence
    assert diag.order_sentence().startswith("The learning rate moved first (onset at step 5,000")
    # The first aid is the LR from before the change, not a third of either LR.
    (plan,) = diag.rollbacks
    assert not plan.rollback
    assert plan.lr_text() == "back to 0.0003, its value before the change (first aid)"
    out = CliRunner().invoke(app, ["analyze", str(tmp_path / "metrics.jsonl"), "--no-report"])
    assert "What to do (lr change at step 5,000): Orange light: put the learning rate back" in (
        " ".join(out.output.split())
    )


def test_a_climb_without_an_lr_change_keeps_its_fitted_onset(tmp_path: Path) -> None:
    diag = analyze_run(read_run(_write(tmp_path / "metrics.jsonl", jump=False)))
    (drift,) = [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_DRIFT]
    assert 4900 <= drift.start_step <= 5100
    assert "that did not decay (0.0003)" in drift.summary
    (lr,) = [c for c in diag.causes_for(drift) if c.cause == "lr_change"]
    assert lr.status == "contradicted"
    assert drift.onset_range is not None
    lo, hi = drift.onset_range
    assert diag.order_sentence() == (
        f"Only one sign: the gradient norm (onset at step {drift.start_step:,}, anywhere in "
        f"{lo:,}-{hi:,}; grad_norm_drift)."
    )
    (plan,) = diag.rollbacks
    assert plan.sentence().endswith(
        "learning rate 0.0001 (down to a third of 0.0003, the LR before the incident; first aid)."
    )
