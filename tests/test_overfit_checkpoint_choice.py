"""Stopping early keeps the best model the run saved, judged by the val loss the log measured
at the checkpoints' own steps.

Found in a review pass: sample_runs/late_overfit (checkpoint folders 200, 400, 600, 800, an
eval every 40 steps) has its lowest val loss at step 360, and the advice was to keep
checkpoint 200 (val loss 2.839) although checkpoint 400 measured 2.751, a hair above the
lowest; the HF command printed under it (load_best_model_at_end) would have picked 400.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from synthetic import long_frame, run_from_frame

from forensics.findings import FindingKind
from forensics.pipeline import analyze, analyze_run

ROOT = Path(__file__).resolve().parents[1]


def _plan(diag):  # noqa: ANN001, ANN202
    plans = [i.rollback for i in diag.incidents if i.rollback is not None]
    (plan,) = [p for p in plans if p.finding.kind is FindingKind.OVERFITTING]
    return plan


def _overfit(saved: list[int], rise_per_step: float):  # noqa: ANN202
    """Train falls throughout; val (every 100 steps) falls to 1.4 at step 1,500, then rises by
    ``rise_per_step``; the run's checkpoint folders are ``saved``."""
    rng = np.random.default_rng(3)
    s = np.arange(1, 3001)
    train = (3.0 - 0.0003 * s) * np.exp(rng.normal(0, 0.005, len(s)))
    vs = np.arange(100, 3001, 100)
    val = np.where(vs <= 1500, 2.0 - 0.0004 * vs, 1.4 + rise_per_step * (vs - 1500))
    run = run_from_frame(long_frame({"loss": (s, train), "val_loss": (vs, val)}))
    run.metadata["checkpoints"] = saved
    diag = analyze_run(run)
    (o,) = [f for f in diag.findings if f.kind is FindingKind.OVERFITTING]
    assert o.start_step == 1500
    return o, _plan(diag)


def test_the_sample_keeps_the_checkpoint_the_log_measures_best() -> None:
    diag = analyze(ROOT / "sample_runs" / "late_overfit")
    plan = _plan(diag)
    assert (plan.checkpoint_step, plan.last_healthy_step) == (400, 360)
    assert plan.sentence().startswith(
        "Stop early: keep the checkpoint at step 400, from checkpoints found beside the "
        "log (200, 400, 600, 800): the lowest validation loss of the checkpoints with an eval "
        "at their step (2.751; 2.839 at step 200, the last one at or before step 360)."
    )
    (o,) = [f for f in diag.findings if f.kind is FindingKind.OVERFITTING]
    assert "the best step is 360 (lowest val loss); of the checkpoints saved, step 400 has" in (
        o.summary
    )
    assert "best checkpoint is step 360" not in o.summary


def test_a_later_checkpoint_measured_better_is_kept() -> None:
    o, plan = _overfit([1000, 2000, 3000], rise_per_step=0.00005)
    assert plan.checkpoint_step == 2000  # 1.425 there, against 1.6 at checkpoint 1,000
    assert "(1.425; 1.6 at step 1,000, the last one at or before step 1,500)" in plan.sentence()
    assert "of the checkpoints saved, step 2,000 has the lowest val loss" in o.summary


def test_a_later_checkpoint_measured_worse_is_not() -> None:
    o, plan = _overfit([1000, 2000, 3000], rise_per_step=0.001)
    assert plan.checkpoint_step == 1000  # 1.9 at checkpoint 2,000
    assert "the last checkpoint saved at or before it is step 1,000" in o.summary


def test_checkpoints_without_an_eval_at_their_step_are_not_compared() -> None:
    _, plan = _overfit([1050, 2050, 3000], rise_per_step=0.00005)
    assert plan.checkpoint_step == 1050  # (no val loss measured at 1,050 to compare)


def test_the_report_says_keep_not_roll_back() -> None:
    """The report's finding card and rollback table: "Stop early: keep the checkpoint at step
    400. Lowest validation loss at step 360; ...", not "Roll back ... Last healthy step
    360 ..." for a model that was never damaged."""
    from forensics.report import render_html

    page = " ".join(
        render_html(analyze(ROOT / "sample_runs" / "late_overfit"), plotlyjs="cdn").split()
    )
    assert (
        "<strong>Stop early</strong>: keep the checkpoint at step 400. Lowest validation loss "
        "at step 360; checkpoints found beside the log"
    ) in page
    table = page[page.index('id="rollback"') : page.index('id="vitals"')]
    assert "keep the checkpoint at step 400" in table
    assert "lowest val loss" in table
    assert "<strong>Roll back</strong>" not in page
    assert "step 360))" not in page  # (no parenthesis around the source's own)
    # (the roll-back note on the data loader's position is for damaged weights only)
    assert "When you roll back" not in table


def test_a_damaged_run_keeps_the_data_position_note() -> None:
    from forensics.report import render_html

    page = render_html(analyze(ROOT / "sample_runs" / "param_norm_jump"), plotlyjs="cdn")
    table = page[page.index('id="rollback"') : page.index('id="vitals"')]
    assert "When you roll back, restore the model and optimizer state only" in table
