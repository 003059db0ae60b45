"""A rollback plan that can be run (issue 12): checkpoint, last healthy step, the LR from before
the incident, the data position, the batches to skip, the trainer's own commands."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from synthetic import healthy_grad_norm, healthy_loss, long_frame, run_from_frame

from forensics.diagnosis import diagnose
from forensics.evidence import Evidence
from forensics.findings import Finding
from forensics.pipeline import analyze_run, read_run
from forensics.rollback import rollback_advice, rollback_plan

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_runs"
JSON_KEYS = [
    "checkpoint_step",
    "checkpoint_known",
    "last_healthy_step",
    "lr_before",
    "lr_cut_from",
    "lr_resume",
    "skip_steps",
    "commands",
]


def _sample(name: str):  # noqa: ANN202
    return analyze_run(read_run(SAMPLES / name))


def _run(
    n: int = 3000,
    lr: np.ndarray | float = 3e-4,
    fmt: str | None = None,
    checkpoints: list[int] | None = None,
):  # noqa: ANN202
    s, loss = healthy_loss(n)
    gs, gn = healthy_grad_norm(n)
    lrs = np.full(len(s), lr) if np.isscalar(lr) else lr
    run = run_from_frame(
        long_frame({"train/loss": (s, loss), "grad_norm": (gs, gn), "lr": (s, lrs)})
    )
    if fmt is not None:
        run.format = fmt
    if checkpoints is not None:
        run.metadata["checkpoints"] = checkpoints
    return run


def _spike(step: int, cls: str = "pathological", **measures: object) -> Finding:
    return Finding(
        "loss_spike",
        "critical",
        "loss",
        step,
        f"spike at {step}",
        peak_step=step + 2,
        end_step=step + 20,
        measures={"classification": cls, "height": 2.5, **measures},
    )


# -- the samples the issue names -----------------------------------------------------------


@pytest.fixture(scope="module")
def nan_diag():  # noqa: ANN201
    return _sample("nan")


def test_nan_resumes_from_the_lr_before_the_incident(nan_diag) -> None:  # noqa: ANN001
    """sample_runs/nan: LR x~200 over 501-962, a divergence from 522, then NaN at 637. The
    plan (on the incident's first red light, the divergence) cuts the LR that was stable
    before (0.001573 at step 500) by 10%, not the raised 0.0135 at step 540."""
    (plan,) = [r for r in nan_diag.rollbacks if r.rollback]
    assert plan.finding.kind.value == "divergence"
    lr = nan_diag.ev.series("lr")
    before = float(lr.values[lr.steps == 500][0])
    assert plan.lr_before == pytest.approx(before) and before == pytest.approx(0.001573, rel=1e-3)
    assert plan.lr_resume == pytest.approx((0.9 * before, 0.9 * before))
    assert plan.last_healthy_step == 500 and plan.onset_step == 501
    assert "0.0135" not in plan.sentence() and "0.01215" not in plan.sentence()
    assert "0.001416" in plan.sentence() and "keep the data position" in plan.sentence()
    # No checkpoint folders: the every-500 habit is stated as an assumption.
    assert plan.checkpoint_step == 500 and plan.checkpoint_known is False
    assert "assuming a checkpoint every 500 steps" in plan.sentence()
    assert "x208 at step 600" in plan.sentence()  # the LR peak the series shows


def test_nan_json_has_a_rollback_object_per_incident(nan_diag) -> None:  # noqa: ANN001
    doc = nan_diag.to_document()
    rbs = [inc["rollback"] for inc in doc["incidents"] if inc["rollback"] is not None]
    assert len(rbs) == 1
    assert list(rbs[0]) == JSON_KEYS
    assert rbs[0]["lr_before"] == pytest.approx(0.001573, rel=1e-3)
    assert rbs[0]["checkpoint_step"] == 500 and rbs[0]["checkpoint_known"] is False


@pytest.mark.parametrize("name", ["param_norm_jump", "divergence", "activation_outlier"])
def test_no_step_0_checkpoint_unless_one_is_known(name: str) -> None:
    """Four samples advised "roll back to the checkpoint at step 0": with no checkpoint known
    before the onset, the plan says so."""
    diag = _sample(name)
    plans = [r for r in diag.rollbacks if r.rollback]
    assert plans
    for plan in plans:
        assert plan.checkpoint_step != 0
        text = plan.sentence()
        assert "step 0 " not in text and "step 0." not in text and "step 0," not in text
        if plan.checkpoint_step is None:
            assert f"no checkpoint before step {plan.onset_step:,} is known" in text


def test_param_norm_jump_lr_before_the_jump() -> None:
    """LR x50 for steps 500-509: resume 20-50% below the LR before the jump (0.001578)."""
    (plan,) = [r for r in _sample("param_norm_jump").rollbacks if r.rollback]
    assert plan.lr_before == pytest.approx(0.001578, rel=1e-3)
    lo, hi = plan.lr_resume
    assert lo == pytest.approx(0.5 * plan.lr_before) and hi == pytest.approx(0.8 * plan.lr_before)
    assert plan.last_healthy_step == 499 and plan.onset_step == 500


def test_divergence_lr_before_the_raise() -> None:
    """LR raised from step 401 (no schedule explains it): the plan goes back before it."""
    (plan, *_) = [r for r in _sample("divergence").rollbacks if r.rollback]
    assert plan.finding.kind.value == "divergence"
    assert plan.onset_step == 401 and plan.last_healthy_step == 400
    assert plan.lr_before == pytest.approx(0.002414, rel=1e-3)
    assert plan.lr_resume == pytest.approx((0.9 * plan.lr_before,) * 2)


def test_overfitting_wording() -> None:
    """Not "last healthy step 240, before the overfitting at step 240": the best validation
    loss is at 240, the checkpoint at 200 is known from the folders beside the log."""
    (plan,) = [r for r in _sample("overfitting").rollbacks if r.rollback]
    text = plan.sentence()
    assert "before the overfitting at step 240" not in text
    assert "best validation loss is at step 240" in text
    assert plan.checkpoint_step == 200 and plan.checkpoint_known is True
    assert plan.trainer == "hf"


# -- rules on synthetic runs ---------------------------------------------------------------


def test_checkpoint_at_step_0_only_when_saved() -> None:
    run = _run()
    (rb,) = rollback_advice(run, [_spike(300)])  # the every-500 habit would give step 0
    assert rb.checkpoint_step is None and rb.checkpoint_known is False
    run = _run(checkpoints=[0, 1000])
    (rb,) = rollback_advice(run, [_spike(300)])
    assert rb.checkpoint_step == 0 and rb.checkpoint_known is True
    run = _run()
    run.config["save_steps"] = 1000  # an interval saves nothing at step 0
    (rb,) = rollback_advice(run, [_spike(300)])
    assert rb.checkpoint_step is None and "save_steps = 1000" in rb.checkpoint_source


def test_lr_before_an_unexplained_raise() -> None:
    """An LR raised x20 at step 1500 and a spike at 1600: the LR before the raise is the base,
    and the rollback goes back before the raise."""
    lr = np.full(3000, 3e-4)
    lr[1500:] = 6e-3
    run = _run(lr=lr)
    (rb,) = rollback_advice(Evidence(run), [_spike(1600)])
    assert rb.lr_before == pytest.approx(3e-4)
    assert rb.lr_resume == pytest.approx((1.5e-4, 2.4e-4))
    assert rb.onset_step == 1500 and rb.last_healthy_step == 1499
    assert rb.checkpoint_step == 1000 and rb.skip_steps is None  # an LR cause: nothing to skip


def test_bad_batch_is_skipped_and_megatron_commands() -> None:
    """A loss spike the grad norm led, in a Megatron log: skip its batches, and the lines to
    run are Megatron's."""
    run = _run(fmt="text_logs")
    run.frame = run.frame.with_columns(source=pl.lit("megatron_text"))
    (rb,) = rollback_advice(run, [_spike(1700, grad_norm_lead_steps=0)])
    assert rb.skip_steps == (1698, 1704)
    assert rb.trainer == "megatron"
    assert "--skip-train-iteration-range 1698-1704" in rb.commands
    assert any(c.startswith("--lr ") for c in rb.commands)
    assert rb.to_dict()["skip_steps"] == [1698, 1704]
    assert "skip the batches of steps 1,698-1,704" in rb.sentence()


def test_hf_and_lightning_commands() -> None:
    run = _run(fmt="hf_trainer_state", checkpoints=[1000, 1500])
    run.config["output_dir"] = "out"
    (rb,) = rollback_advice(run, [_spike(1700)])
    assert 'trainer.train(resume_from_checkpoint="out/checkpoint-1500")' in rb.commands
    assert "--resume_from_checkpoint out/checkpoint-1500" in rb.commands
    run = _run(fmt="lightning_csv")
    (rb,) = rollback_advice(run, [_spike(1700)])
    assert any("ckpt_path=" in c for c in rb.commands)
    (rb,) = rollback_advice(_run(), [_spike(1700)])
    assert rb.commands == ()  # no trainer known: no invented command line


def test_rollback_plan_for_an_incident() -> None:
    """rollback_plan takes one incident's findings: the strictest rule leads, the onset is the
    earliest ongoing dynamics finding, benign incidents get none."""
    drift = Finding("grad_norm_drift", "warning", "grad_norm", 1100, "climb", end_step=2999)
    nan = Finding("nan_inf", "fatal", "loss", 2100, "nan", end_step=2999)
    plan = rollback_plan(_run(), [drift, _spike(2000), nan])
    assert plan is not None and plan.finding is nan and plan.lr_cut == (0.1, 0.1)
    assert plan.onset_step == 1100 and plan.last_healthy_step == 1099
    assert rollback_plan(_run(), [_spike(500, "physiological")]) is None


def test_diagnose_attaches_plans_to_incidents() -> None:
    diag = diagnose(_run(), [_spike(1700)])
    doc = diag.to_document()
    (inc,) = doc["incidents"]
    assert list(inc["rollback"]) == JSON_KEYS
    assert inc["rollback"]["checkpoint_step"] == 1500
    assert inc["rollback"]["lr_before"] == pytest.approx(3e-4)


def test_unresolved_spike_is_a_conditional_rollback() -> None:
    """A spike the log ends on cannot be judged yet: roll back only if it is still up after the
    recovery window (peak + 500 steps)."""
    (rb,) = rollback_advice(_run(), [_spike(2990, "unresolved")])
    assert rb.decide_by == 2992 + 500
    assert rb.sentence().startswith(
        "The loss_spike at step 2,990 is unresolved (the log ends before it could recover): "
        "if it is not back on its trend by step 3,492, roll back"
    )


def test_a_recurring_batch_is_not_a_range_to_skip() -> None:
    """Periodic spikes: the data problem recurs, so no batch range is offered to skip."""
    periodic = Finding("periodic_spikes", "warning", "loss", 125, "every 125", end_step=2999)
    spike = _spike(1700, grad_norm_lead_steps=0)
    (rb,) = rollback_advice(_run(), [spike, periodic])[:1]
    assert rb.finding is spike and rb.skip_steps is None
    assert "before the periodic_spikes at step 125 (still going on at the loss_spike" in (
        rb.sentence()
    )


def test_periodic_spikes_sample_plan() -> None:
    """sample_runs/periodic_spikes: the loss spike at the last step is unresolved; lr_before is
    the LR logged just before the plan's onset, the cut applies to the LR at the checkpoint
    and nothing is skipped."""
    diag = _sample("periodic_spikes")
    plans = [r for r in diag.rollbacks if r.rollback]
    assert plans and all(p.skip_steps is None for p in plans)
    lr = diag.ev.series("lr")
    for p in plans:
        before = lr.values[lr.steps == p.onset_step - 1]
        assert len(before) == 1 and p.lr_before == pytest.approx(float(before[0]))
        assert p.checkpoint_step is not None
        at_ckpt = float(lr.values[lr.steps == p.checkpoint_step][0])
        assert p.lr_cut_from == pytest.approx(at_ckpt)


def test_the_lr_cut_applies_to_the_lr_the_checkpoint_resumes_at() -> None:
    """sample_runs/periodic_spikes: the spike at step 1,000 is the cosine schedule's last step
    (LR 7.9e-09) and the plan goes back to the checkpoint assumed at step 500, where the LR
    was 0.001573. It said "Resume with learning rate 3.934e-09-6.294e-09 (20-50% lower than
    7.867e-09, the LR before the incident)": a run resumed from step 500 at that rate would
    stop learning. The cut is taken from the LR at the checkpoint, and the one at the
    incident is still named."""
    diag = _sample("periodic_spikes")
    (p,) = [r for r in diag.rollbacks if r.rollback]
    assert p.checkpoint_step == 500 and p.lr_before == pytest.approx(7.8671e-09)
    assert p.lr_resume == pytest.approx((0.5 * 0.001573, 0.8 * 0.001573), rel=1e-3)
    assert (
        "Resume with learning rate 0.0007864-0.001258 (20-50% lower than 0.001573, the LR at "
        "the checkpoint's step 500; 7.867e-09 by the incident)" in p.sentence()
    ), p.sentence()
    as_json = p.to_dict()
    assert as_json["lr_before"] == pytest.approx(7.8671e-09)
    assert as_json["lr_cut_from"] == pytest.approx(0.001573, rel=1e-3)
    # the report's rollback row shows the cut from that LR
    from forensics.report import render_html

    html = render_html(diag)
    assert "0.001573 &rarr; 0.0007864–0.001258" in html


def test_a_periodic_series_that_came_back_each_time_is_not_rolled_back_past() -> None:
    """sample_runs/periodic_spikes: a corrupt shard every 125 steps, seven spikes that each
    came back at once, and the eighth at the last logged step, unresolved. The plan went
    back before step 125 ("Last healthy step 124, before the periodic_spikes at step 125
    (still going on at the loss_spike at step 1,000)"): it threw away 875 steps the log shows
    healthy between the spikes, and would meet the same shard again. It now goes back before
    the unresolved spike."""
    diag = _sample("periodic_spikes")
    (plan,) = [r for r in diag.rollbacks if r.rollback]
    assert plan.finding.start_step == 1000
    assert (plan.onset_step, plan.last_healthy_step) == (1000, 999)
    assert "Last healthy step 999, before the loss_spike at step 1,000." in plan.sentence()
    assert "still going on" not in plan.sentence()
    lr = diag.ev.series("lr")
    assert plan.lr_before == pytest.approx(float(lr.values[lr.steps == 999][0]))
    assert plan.skip_steps is None  # (a recurring batch is data to fix, not a range to skip)


def test_the_rollback_table_says_an_unresolved_spikes_plan_is_conditional() -> None:
    """The report's rollback table read "checkpoint at step 500 (assumed)" for the
    periodic_spikes sample's spike at the last logged step, an order with no condition; the
    incident's sentence said "if it is not back on its trend by step 1,500". The table's cell
    now says so too."""
    import re

    from forensics.report import render_html

    diag = _sample("periodic_spikes")
    page = render_html(diag, plotlyjs="cdn")
    table = page[page.index('id="rollback"') : page.index('id="vitals"')]
    text = " ".join(re.sub(r"<[^>]+>", " ", table).split())
    assert (
        "checkpoint at step 500 (assumed) only if it is not back on its trend by step 1,500 "
        "(the log ends before it could be)" in text
    ), text


def test_a_periodic_series_with_a_spike_that_did_not_come_back_still_counts() -> None:
    """Where a spike of the series before the lead did not come back, the series is not shown
    healthy between its spikes: the plan goes back before its first, as before."""
    periodic = Finding("periodic_spikes", "warning", "loss", 125, "every 125", end_step=2999)
    spikes = [_spike(125, "physiological"), _spike(250, "pathological"), _spike(375)]
    lead = _spike(1700, grad_norm_lead_steps=0)
    (rb,) = rollback_advice(_run(), [lead, periodic, *spikes])[:1]
    assert rb.finding is lead and rb.onset_step == 125
    recovered = [_spike(s, "physiological") for s in (125, 250, 375)]
    (rb,) = rollback_advice(_run(), [lead, periodic, *recovered])[:1]
    assert rb.finding is lead and rb.onset_step == 1700


def test_a_resume_regression_goes_back_to_the_checkpoint_it_resumed_from(tmp_path) -> None:
    """A real torch chain whose resume loaded only the weights and restarted the LR schedule
    (the loss and the val loss worse from the seam at step 400 on): the plan goes back to the
    resume's own checkpoint, keeps the LR, and restores the whole state rather than keeping
    the data position."""
    pytest.importorskip("torch")
    from resume_chain import torch_chain

    from forensics.config import Config
    from forensics.importers import read_run
    from forensics.pipeline import analyze_run

    d = analyze_run(read_run(torch_chain(tmp_path, bad_resume=True, val_every=40)), Config())
    # One incident: the regression, the LR the resume raised and the spikes under it (the
    # LR change had been an incident of its own, advised a 20-50% cut and no checkpoint).
    (inc,) = [
        i for i in d.incidents if any(f.kind.value == "resume_regression" for f in i.findings)
    ]
    assert len(d.incidents) == 1
    plan = inc.rollback
    assert plan is not None
    # The last healthy step is the last one logged before the resume (399), not the resume's
    # first step, where the regression starts.
    # It goes back to the checkpoint the resume loaded: the state after step 399, the last
    # step job_0 logged (it had read "the checkpoint at step 400", the resume's own first).
    assert (plan.checkpoint_step, plan.checkpoint_known, plan.last_healthy_step) == (
        399,
        True,
        399,
    )
    assert plan.lr_resume is None and plan.skip_steps is None
    text = plan.sentence()
    assert text.startswith(
        "Roll back to the checkpoint at step 399, from the resume at step 400 (the job loaded it)."
    )
    assert "data loader's position with the model" in text
    assert "keep the data position" not in text
    # The resume restarted the schedule (the LR logged rose from 0.01054 to 0.2 after it): the
    # LR to resume with is the one before the seam, not "unchanged".
    lr = d.run.frame.filter(pl.col("metric") == "lr", pl.col("step") == 399)["value"]
    assert f"Learning rate back to {lr[0]:.4g}, its value before the resume changed it" in text
    assert "unchanged" not in text
    from forensics.report.render import render_html

    page = render_html(d, plotlyjs="cdn")
    section = page[page.index('id="rollback"') : page.index('id="vitals"')]
    assert "after a resume that regressed, the opposite" in section
    assert f"back to {lr[0]:.4g}, its value before the resume changed it" in section
    assert "the resume, not the LR, is the suspect" not in section


def test_a_resume_regression_without_an_lr_logged_keeps_the_lr(tmp_path) -> None:
    """The same chain with no LR in the log: nothing shows the resume changed the LR, so it
    stays unchanged and the resume is the suspect; the report says to load that checkpoint
    again with the whole state."""
    pytest.importorskip("torch")
    from resume_chain import torch_chain

    from forensics.importers import read_run
    from forensics.pipeline import analyze_run
    from forensics.report.render import render_html

    root = torch_chain(tmp_path, bad_resume=True, val_every=40, log_lr=False)
    d = analyze_run(read_run(root))
    (plan,) = [
        i.rollback
        for i in d.incidents
        if i.rollback is not None and i.rollback.finding.kind.value == "resume_regression"
    ]
    assert (plan.checkpoint_step, plan.checkpoint_known) == (399, True)  # job_0's last step
    text = plan.sentence()
    assert "The weights it holds were healthy: the loss turned up only after the resume" in text
    assert "Learning rate unchanged (the resume, not the LR, is the suspect)" in text
    page = render_html(d, plotlyjs="cdn")
    section = page[page.index('id="rollback"') : page.index('id="vitals"')]
    assert "load that checkpoint again with the optimizer moments" in section


def test_a_regression_that_began_after_the_resume_is_not_sent_back_to_it() -> None:
    """The real Lightning chain (version_0 resumed as version_5 at step 140,749): the loss went
    on down after the seam and turned up at step 146,999, the val loss improving until step
    154,813. The plan goes back to the last step before the rise, not to the resume's
    checkpoint (the report advised reloading step 140,749, dropping the 6,000 steps of
    improvement after it), and does not call the resume the suspect."""
    from conftest import shared_path

    from forensics.config import Config
    from forensics.importers import discover_jobs, read_job
    from forensics.importers.chains import stitch_jobs
    from forensics.pipeline import analyze_run, read_options

    root = shared_path("real_runs", "lightning-csv-slm-wikitext103")
    job = "lightning_logs/version_0+version_5"
    jobs = stitch_jobs(root, discover_jobs(root), read_options(Config()))
    d = analyze_run(read_job(root, job, jobs[job], options=read_options(Config())), Config())
    (inc,) = [i for i in d.incidents if i.rollback is not None]
    plan = inc.rollback
    assert plan.finding.kind.value == "resume_regression"
    assert plan.finding.start_step == 146_999
    assert plan.last_healthy_step is not None and 140_749 < plan.last_healthy_step < 146_999
    assert plan.checkpoint_step is not None and plan.checkpoint_step <= plan.last_healthy_step
    text = plan.sentence()
    assert "from the resume" not in text and "the resume, not the LR" not in text
    assert "Learning rate unchanged (nothing in the log points at the LR)" in text
    from forensics.report.render import render_html

    page = render_html(d, plotlyjs="cdn")
    section = page[page.index('id="rollback"') : page.index('id="vitals"')]
    assert "keep the data loader's position" in section
    assert "after a resume that regressed, the opposite" not in section


def test_a_note_calls_for_no_first_aid() -> None:
    """The grad_norm_drift sample's climb stays inside what its decaying LR explains: an info
    note whose prescription says no action gets no LR cut and no row in the rollback advice
    (the report offered "down to a third (first aid)" beside "No action"). The same climb as a
    warning still gets its first aid."""
    diag = _sample("grad_norm_drift")
    (drift,) = [f for f in diag.findings if f.kind == "grad_norm_drift"]
    assert drift.severity == "info" and "not a drift" in drift.summary
    assert rollback_advice(_run(), [drift]) == []
    assert not [p for p in diag.rollbacks if p.finding.kind == "grad_norm_drift"]
    warned = Finding("grad_norm_drift", "warning", "grad_norm", 1100, "climb", end_step=2999)
    (aid,) = rollback_advice(_run(), [warned])
    assert not aid.rollback and "first aid" in aid.lr_cut_text


def test_a_run_non_finite_from_its_first_step_has_nothing_to_roll_back_to() -> None:
    """llm.c job 11679010: the loss and the grad norm are nan from step 1 and the validation
    loss already at step 0, before any update. No step is healthy: no checkpoint, no LR to
    resume with (a 10% cut of the warm-up's first LR was advised), no command; the plan says
    to look at what the run started from."""
    from conftest import shared_path

    path = shared_path("real_runs", "llmc-gpt2-124M-hectorfcardenas", "gpt2_train.11679010.log")
    diag = analyze_run(read_run(path))
    (plan,) = [r for r in diag.rollbacks if r.rollback]
    assert plan.finding.kind.value == "nan_inf" and plan.nothing_healthy
    assert plan.last_healthy_step is None and plan.checkpoint_step is None
    assert plan.lr_resume is None and plan.skip_steps is None and plan.commands == ()
    assert plan.sentence().startswith(
        "Nothing to roll back to: the nan_inf starts at the first logged step (step 1)"
    )
    assert plan.to_dict()["lr_resume"] is None
    from forensics.report.render import build_context

    # (the page's light does not ask for the rollback the plan says cannot be made)
    assert build_context(diag)["light"].label == (
        "Red light: stop the run; no step of it is known healthy"
    )


def test_a_nan_after_finite_steps_still_rolls_back() -> None:
    """The same run with finite losses for its first 50 steps: the last healthy step is the
    last finite one and the plan rolls back with a lower LR."""
    n = 300
    steps, loss = healthy_loss(n)
    loss[50:] = np.nan
    _, gn = healthy_grad_norm(n)
    gn[50:] = np.nan
    lr = np.full(n, 3e-4)
    run = run_from_frame(
        long_frame(
            {"train/loss": (steps, loss), "train/grad_norm": (steps, gn), "train/lr": (steps, lr)}
        )
    )
    diag = analyze_run(run)
    (plan,) = [r for r in diag.rollbacks if r.rollback]
    assert not plan.nothing_healthy and plan.last_healthy_step == 49
    assert plan.lr_resume is not None and plan.sentence().startswith("Roll back")
    from forensics.report.render import build_context

    assert build_context(diag)["light"].label == "Red light: the run needs a rollback"


def _resumed_jsonl(path: Path, bump_at: int) -> Path:
    """A JSONL log of a job that logged to step 2,600, was resumed from step 2,000 (steps
    2,001-2,600 logged again) and took a loss bump of +0.6 at ``bump_at`` that took hundreds
    of steps to fade (a pathological spike), with the grad norm up beside it."""
    import json
    import math
    import random

    r = random.Random(2)

    def rec(s: int, bump: float) -> str:
        loss = 2.0 + 3 * math.exp(-s / 800) + bump + r.gauss(0, 0.03)
        gn = 0.8 + 2.5 * bump + r.gauss(0, 0.05)
        return json.dumps({"step": s, "loss": loss, "lr": 3e-4, "grad_norm": gn})

    lines = [rec(s, 0.0) for s in range(1, 2601)]
    lines += [
        rec(s, 0.6 * math.exp(-(s - bump_at) / 400) if s >= bump_at else 0.0)
        for s in range(2001, 5001)
    ]
    path.mkdir()
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_a_spike_that_began_at_a_resume_reloads_the_whole_state(tmp_path) -> None:
    """The loss jumped at the resume (step 2,001) and took ~600 steps to come back: the
    incident's supported cause is the resume. The plan said "resume with learning rate
    0.00015-0.00024 (20-50% lower ...); restore the model and optimizer, keep the data
    position", an LR cut nothing in the log points at. Now: back to the checkpoint the job
    resumed from, the LR unchanged, the whole state restored. A spike 300 steps after the
    resume keeps the spike's own plan."""
    from forensics.config import Config

    d = analyze_run(read_run(_resumed_jsonl(tmp_path / "at", 2001)), Config())
    (inc,) = [i for i in d.incidents if i.rollback is not None]
    assert [c.cause for c in inc.supported] == ["resume"]
    plan = inc.rollback
    assert plan.resumed_at == 2001 and plan.at_resume
    # The checkpoint the resume loaded: the state after step 2,000, the last logged before it.
    assert (plan.checkpoint_step, plan.checkpoint_known, plan.lr_resume) == (2000, True, None)
    text = plan.sentence()
    assert "the loss_spike began at the resume at step 2,001" in text
    assert "Learning rate unchanged (the resume, not the LR, is the suspect)" in text
    assert "data loader's position with the model" in text
    assert "keep the data position" not in text

    d = analyze_run(read_run(_resumed_jsonl(tmp_path / "later", 2300)), Config())
    plans = [i.rollback for i in d.incidents if i.rollback is not None]
    assert plans and all(p.resumed_at is None for p in plans)
    assert all("20-50% lower" in p.sentence() for p in plans)


def test_the_spike_card_of_a_slow_recovery_says_it_came_back(tmp_path) -> None:
    """The resumed run's spike came back after 586 steps (pathological: past the 500-step
    limit). Its card said "The loss did not return to its trend (or settled higher)" and
    "to a level 7% above its earlier trend" beside the summary's "back only after 586 steps"."""
    from forensics.config import Config
    from forensics.report.render import render_html

    d = analyze_run(read_run(_resumed_jsonl(tmp_path / "at", 2001)), Config())
    (spike,) = [f for f in d.findings if f.kind.value == "loss_spike"]
    assert "back only after 586 steps" in spike.summary
    page = render_html(d, plotlyjs="cdn")
    card = page[page.index('id="finding-loss_spike-2001"') :]
    card = card[: card.index("</article>")]
    assert "The loss came back to its trend only after the 500-step limit" in card
    assert "Recovery took 586 steps." in card
    assert "did not return" not in card and "above its earlier trend" not in card


def test_the_report_row_says_where_its_checkpoint_comes_from_in_words() -> None:
    """The rollback table's last column read "checkpoint from the log shows no checkpoint
    folders or save interval" (divergence) and "checkpoint from assuming a checkpoint every
    500 steps" (nan). It now says no checkpoint is known, or states the assumption."""
    from forensics.pipeline import analyze
    from forensics.report.render import render_html

    root = Path(__file__).resolve().parents[1] / "sample_runs"
    for name, expect in (
        ("divergence", "; no checkpoint known: the log shows no checkpoints or save"),
        ("nan", "; assuming a checkpoint every 500 steps"),
    ):
        page = render_html(analyze(root / name), plotlyjs="cdn")
        section = page[page.index('id="rollback"') : page.index('id="vitals"')]
        assert expect in section, name
        assert "checkpoint from the log shows" not in section
        assert "checkpoint from assuming" not in section


def test_an_hf_resume_names_the_checkpoint_it_loaded(tmp_path) -> None:
    """An HF Trainer run logged every 10 steps (torch's SummaryWriter, the hparams as HF
    writes them): the first job logged up to step 600 and was resumed from checkpoint-400, so
    the second logs from step 410 on, with a training loss that climbs 39% from the seam.
    The plan goes back to checkpoint-400; it had named "checkpoint-410", which the trainer
    never wrote (the resume's first logged step). The climb is a warning with no eval."""
    pytest.importorskip("torch")
    import time

    from torch.utils.tensorboard import SummaryWriter

    rng = np.random.default_rng(5)
    args = {
        "output_dir": "out",
        "per_device_train_batch_size": 8,
        "save_steps": 100,
        "logging_steps": 10,
        "learning_rate": 5e-5,
    }

    def level(s: int) -> float:
        return float(1.5 + 1.5 * np.exp(-s / 300))

    for job, steps, loss in (
        ("a", range(10, 610, 10), level),
        ("b", range(410, 1210, 10), lambda s: level(400) + 0.0015 * (s - 400)),
    ):
        w = SummaryWriter(str(tmp_path / "runs" / job))
        w.add_hparams(args, {}, run_name=".")
        for s in steps:
            w.add_scalar("train/loss", loss(s) + 0.01 * rng.standard_normal(), s)
            w.add_scalar("train/learning_rate", 5e-5, s)
        w.close()
        time.sleep(1.1)  # the second job's files are written after the first's
    from forensics import analyze

    d = analyze(tmp_path / "runs")
    (f,) = [f for f in d.findings if f.kind.value == "resume_regression"]
    assert f.severity.value == "warning" and f.measures["rise_rel"] > 0.1
    (plan,) = [i.rollback for i in d.incidents if i.rollback is not None]
    assert (plan.checkpoint_step, plan.last_healthy_step) == (400, 400)
    assert plan.commands[0] == 'trainer.train(resume_from_checkpoint="out/checkpoint-400")'
