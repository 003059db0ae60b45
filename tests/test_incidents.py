"""Incidents: findings that share a time window and a cause are one card, with one timeline
whose first mover includes the control inputs (issue 12), on the sample runs that showed them."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from forensics import analyze
from forensics.diagnosis import Diagnosis
from forensics.findings import Severity

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_runs"
SCHEMA = ROOT / "forensics" / "schemas" / "findings.schema.json"
RUNS = sorted(
    p.name for p in SAMPLES.iterdir() if p.is_dir() and p.name != "generator" and any(p.iterdir())
)


@cache
def diag(name: str) -> Diagnosis:
    return analyze(SAMPLES / name)


def test_nan_blow_up_is_one_incident() -> None:
    """nan: the four activation-outlier findings (layers 0-3, step 560) and the rest of the
    blow-up are one incident, caused by the LR change; its signs list the layers."""
    d = diag("nan")
    assert len(d.incidents) == 1
    inc = d.incidents[0]
    assert len(inc.findings) == len(d.findings)
    assert inc.severity is Severity.FATAL
    spread = next(s for s in inc.signs if s.metric == "act_std")
    assert spread.layers == (0, 1, 2, 3) and spread.kinds == ("activation_outlier",)
    assert "layers 0-3" in spread.text()
    assert [c.cause for c in inc.supported] == ["lr_change"]


@pytest.mark.parametrize(
    "run, lr_step", [("nan", 501), ("param_norm_jump", 500), ("divergence", 401)]
)
def test_first_mover_is_the_lr(run: str, lr_step: int) -> None:
    """The timeline's first mover is the LR change (not the activations at 560), for the
    incident and for the run."""
    d = diag(run)
    inc = next(i for i in d.incidents if i.severity is d.incidents[0].severity)
    for tl in (inc.timeline, d.timeline):
        first = tl.first
        assert first is not None and first.control and first.kind == "lr_change"
        assert first.step == lr_step and first.label == "learning rate"
        assert tl.sentence().startswith(f"The learning rate moved first (onset at step {lr_step}")
    assert inc.start_step == lr_step


def test_divergence_is_a_few_incidents() -> None:
    """divergence: 25-odd findings become a few incidents, the fatal one holding the LR blow-up."""
    d = diag("divergence")
    assert len(d.findings) > 20
    assert 1 <= len(d.incidents) <= 4
    fatal = d.incidents[0]
    assert fatal.severity is Severity.FATAL
    assert {"divergence", "activation_outlier", "param_norm_jump"} <= {
        f.kind.value for f in fatal.findings
    }


@pytest.mark.parametrize("start", [300, 650])
def test_bad_batch_timeline_is_true(start: int) -> None:
    """bad_batch: the loss spiked at 300 (650) and the loss scale fell at the next logged step;
    the timeline says the loss moved first, never that the loss scale moved first."""
    d = diag("bad_batch")
    inc = next(i for i in d.incidents if i.start_step == start)
    movers = [(m.metric, m.step) for m in inc.timeline.movers]
    assert movers == [("loss", start), ("loss_scale", start + 1)]
    assert inc.timeline.sentence() == (
        f"The training loss moved first (onset at step {start}, loss_spike); then the loss scale "
        f"1 step later (step {start + 1}, loss_scale_drop)."
    )
    assert not d.timeline.sentence().startswith("The loss scale moved first")
    assert [c.cause for c in inc.supported] == ["bad_batch"]


@pytest.mark.parametrize("run", RUNS)
def test_every_finding_above_info_is_in_one_incident(run: str) -> None:
    """Each warning, critical or fatal finding belongs to exactly one incident; an incident
    holds at least one; its steps cover its findings'."""
    d = diag(run)
    for f in d.findings:
        n = sum(any(g is f for g in inc.findings) for inc in d.incidents)
        assert n == (1 if f.severity is not Severity.INFO else n) and n <= 1, f
    for inc in d.incidents:
        assert any(f.severity is not Severity.INFO for f in inc.findings)
        assert inc.start_step <= min(f.start_step for f in inc.findings)
        assert [d.findings[i] for i in inc.indexes] == inc.findings


@pytest.mark.parametrize("run", ["nan", "bad_batch", "divergence", "healthy", "periodic_spikes"])
def test_document_incidents(run: str) -> None:
    """The findings document (schema_version 2) carries the incidents with their first mover,
    signs, finding indexes, causes and a rollback slot, and validates against the schema."""
    import jsonschema

    d = diag(run)
    doc = json.loads(json.dumps(d.to_document(), allow_nan=False))
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    assert doc["schema_version"] == 2
    assert len(doc["incidents"]) == len(d.incidents)
    for inc, di in zip(d.incidents, doc["incidents"], strict=True):
        assert list(di) == [
            "id",
            "start_step",
            "end_step",
            "severity",
            "first_mover",
            "order_resolved",
            "signs",
            "findings",
            "causes",
            "after_first_sign",
            "rollback",
        ]
        assert di["findings"] == inc.indexes
        fm = di["first_mover"]
        if fm["control"]:
            assert fm["finding"] is None
        else:
            assert doc["findings"][fm["finding"]]["start_step"] == fm["step"]


def test_periodic_spikes_are_one_incident() -> None:
    """The eight spikes of a batch that comes round every 125 steps are one incident."""
    d = diag("periodic_spikes")
    inc = next(i for i in d.incidents if any(f.kind.value == "periodic_spikes" for f in i.findings))
    spikes = {f.start_step for f in inc.findings if f.kind.value == "loss_spike"}
    assert spikes == {125, 250, 375, 500, 625, 750, 875, 1000}


@pytest.mark.parametrize("run, onset", [("histogram_layers", 300), ("activation_outlier", 500)])
def test_a_sparse_sign_joins_the_incident_it_follows(run: str, onset: int) -> None:
    """Activations logged every few steps first show the blow-up at their next point (310
    or 520): with no point of theirs in between, they join the param-norm jump's incident
    instead of standing alone without a cause."""
    d = diag(run)
    jump = next(
        i for i in d.incidents if any(f.kind.value == "param_norm_jump" for f in i.findings)
    )
    assert jump.start_step == onset
    acts = [f for f in d.findings if f.kind.value == "activation_outlier" and f.start_step > onset]
    assert acts and all(f in jump.findings for f in acts)
    assert {s.first_step for s in jump.signs if s.metric == "act_absmax"} == {
        min(f.start_step for f in acts)
    }


def test_a_densely_logged_sign_keeps_its_own_moment() -> None:
    """The sparse rule does not merge a sign whose series was logged between the two onsets:
    without the per-series check every finding within 50 steps would be one incident."""
    from forensics.findings import Finding
    from forensics.incidents import SPARSE_TOUCH_STEPS, build_incidents

    found = [
        Finding("loss_spike", "critical", "loss", 100, "a", peak_step=101, end_step=110),
        Finding("grad_norm_spike", "warning", "grad_norm", 130, "b", peak_step=131, end_step=133),
    ]
    dense = build_incidents(found, [[], []], lambda f: f.start_step - 1)
    assert len(dense) == 2
    sparse = build_incidents(found, [[], []], lambda f: f.start_step - 40)
    assert len(sparse) == 1
    assert 130 - 100 < SPARSE_TOUCH_STEPS


# ----------------------------------------------------- a cause seen after the first sign
def test_the_scalers_calibration_heads_no_incident() -> None:
    """bigscience n16, logged every 10 iterations: the fp16 scaler descends from 2^23 over
    steps 10-30 (its calibration, a note); the warm-up ends at step 30 with a loss spike that
    comes back, and the grad norm spikes at 40 (a warning). The calibration had joined the
    incident as its first mover ("the loss scale moved first (onset at step 20)"), and the
    warm-up's end "came after the first sign (loss scale, from step 20), which it does not
    explain". The scaler finding its level is no sign of what followed: the incident starts
    at the warm-up's end, its supported cause, with nothing said to come late. (The wording
    for a change after a real first sign: the next test.)"""
    from conftest import shared_path

    from forensics.summary import incident_line

    log = shared_path(
        "real_runs", "bigscience-megatron-experiments", "meg_gpt2_base_n16_dp1_tp4_pp16-1809577.out"
    )
    d = analyze(log)
    (drop,) = [f for f in d.findings if f.kind.value == "loss_scale_drop"]
    assert drop.measures["calibration"] is True and drop.severity is Severity.INFO
    inc = d.incidents[0]
    assert all(f is not drop for i in d.incidents for f in i.findings)
    assert [(f.kind.value, f.start_step) for f in inc.findings] == [
        ("loss_spike", 30),
        ("grad_norm_spike", 40),
    ]
    sched = next(c for c in inc.supported if c.cause == "lr_schedule")
    assert sched.steps[0] == 30
    assert inc.cause_note(sched) == "" and "does not explain" not in incident_line(inc)
    assert d.to_document()["incidents"][0]["after_first_sign"] == []
    assert d.order_sentence().startswith(
        "Incident-1 (warning, steps 30-50), the first of 2 warning incidents: the learning rate "
        "moved first (onset at step 30, an LR schedule effect)"
    )


def test_a_resume_at_the_onset_is_not_late(tmp_path) -> None:
    """A real torch chain whose resume loaded only the weights and restarted the LR schedule:
    the resume at step 400 is the cause of the loss trending up from that very step: no
    clause, nothing in `after_first_sign`."""
    pytest.importorskip("torch")
    from resume_chain import torch_chain

    from forensics.importers import read_run
    from forensics.pipeline import analyze_run
    from forensics.summary import incident_line

    d = analyze_run(read_run(torch_chain(tmp_path, bad_resume=True, val_every=40)))
    inc = next(i for i in d.incidents if any(c.cause == "resume" for c in i.supported))
    assert inc.start_step == 400
    assert inc.late == {}
    assert "does not explain" not in incident_line(inc)
    doc = d.to_document()["incidents"]
    (mine,) = [i for i in doc if i["start_step"] == 400 and i["first_mover"]["kind"] == "restart"]
    assert mine["after_first_sign"] == []


def test_a_change_the_lr_log_cannot_place_is_not_called_late() -> None:
    """The same incident, an LR logged every 20 steps (10, 30): the warm-up may have ended
    anywhere in 11-30, before the drop at 20 as well as after it, so nothing is said; with an
    LR point at step 20 it is known to come after. A resume after the first sign is late by
    its step alone."""
    from forensics.causes import SUPPORTED, Cause
    from forensics.findings import Finding, FindingKind
    from forensics.incidents import build_incidents

    drop = Finding(FindingKind.LOSS_SCALE_DROP, Severity.WARNING, "loss_scale", 20, "drop")
    spike = Finding(FindingKind.LOSS_SPIKE, Severity.INFO, "loss", 21, "spike")
    sched = Cause("lr_schedule", SUPPORTED, "the warm-up ended at step 30", (30,))
    causes = [[], [sched]]

    def late(lr_before):  # noqa: ANN001, ANN202
        (inc,) = build_incidents([drop, spike], causes, None, lr_before)
        return inc.late, inc.cause_note(sched)

    assert late(lambda s: 10) == ({}, "")
    assert late(None) == ({}, "")
    got, note = late(lambda s: 20)
    assert list(got) == ["lr_schedule"]
    assert (
        note
        == "; it came after the first sign (loss scale, from step 20), which it does not explain"
    )
    resume = Cause("resume", SUPPORTED, "the job resumed at step 25", (25,))
    (inc,) = build_incidents([drop, spike], [[], [resume]], None, None)
    assert list(inc.late) == ["resume"]
    resume_at = Cause("resume", SUPPORTED, "the job resumed at step 20", (20,))
    (inc,) = build_incidents([drop, spike], [[], [resume_at]], None, None)
    assert inc.late == {}


def test_the_headline_order_is_the_worst_incidents() -> None:
    """A run with a warning incident (the loss scale halved three times at step 400) and a
    later critical one (a loss spike at step 1,500 that settled 30% higher): the banner and the
    terminal said "The loss scale moved first (onset at step 400...)" for the critical run,
    the run's whole order; they now give the critical incident's order, named. The report's
    timeline keeps the run's whole order. A run of one incident reads as before."""
    from io import StringIO

    import numpy as np
    from rich.console import Console
    from synthetic import healthy_loss, long_frame, run_from_frame

    from forensics.pipeline import analyze_run
    from forensics.report import render_html
    from forensics.summary import print_summary

    steps, loss = healthy_loss(3000)
    loss = loss.copy()
    loss[1500:1510] *= 3.0
    loss[1510:] *= 1.3
    scale = np.select(
        [steps >= 404, steps >= 402, steps >= 400], [8192.0, 16384.0, 32768.0], 65536.0
    )
    lr = np.where(steps < 50, 3e-4 * steps / 50, 3e-4)
    frame = long_frame({"loss": (steps, loss), "lr": (steps, lr), "loss_scale": (steps, scale)})
    d = analyze_run(run_from_frame(frame))
    assert [(i.severity.value, i.start_step) for i in d.incidents] == [
        ("warning", 400),
        ("critical", 1500),
    ]
    worst = d.incidents[1]
    text = d.order_sentence(limit=3)
    assert text.startswith(f"Incident-2 (critical, steps {worst.steps}), the most severe of 2")
    assert "only one sign: the training loss (onset at step 1,500, loss_spike)" in text
    assert "step 400" not in text
    assert d.timeline is not None and d.timeline.first is not None
    assert d.timeline.first.step == 400  # (the run's whole order, in the timeline section)
    page = render_html(d, plotlyjs="cdn")
    banner = page[page.index('id="verdict"') : page.index("<nav>")]
    assert "only one sign: the training loss" in banner and "step 400" not in banner
    buf = StringIO()
    print_summary(d, console=Console(file=buf, width=400))
    assert "Incident-2 (critical" in buf.getvalue()
    one = diag("param_norm_jump")
    assert len(one.incidents) == 1
    assert one.order_sentence(limit=2) == one.timeline.sentence(limit=2)
    # Two incidents of one severity (bad_batch: two warnings): the first, not "the most severe".
    two = diag("bad_batch")
    assert [i.severity.value for i in two.incidents] == ["warning", "warning"]
    assert two.order_sentence(limit=2).startswith(
        f"Incident-1 (warning, steps {two.incidents[0].steps}), the first of 2 warning incidents: "
    )


def test_the_stages_of_one_overfitting_are_one_incident(tmp_path) -> None:
    """A Keras-style run (``train/`` and ``validation/`` writers, one ``epoch_loss`` tag, one
    step an epoch) whose val-train gap bends at epoch 30 and whose val loss turns up later,
    while the val accuracy slips. The gap's acceleration (from epoch 36) and the overfitting
    and the accuracy's regression (from 46) are stages of one story; they had been two
    incidents, the second headed by the accuracy as if nothing came before it."""
    import numpy as np
    from tensorboardX import SummaryWriter

    from forensics.findings import FindingKind

    rng = np.random.default_rng(0)
    tw = SummaryWriter(str(tmp_path / "logs" / "train"))
    vw = SummaryWriter(str(tmp_path / "logs" / "validation"))
    for e in range(60):
        tl = 2.0 * np.exp(-e / 15) + 0.3 + 0.01 * rng.standard_normal()
        vl = (
            2.0 * np.exp(-e / 15) + 0.35 + 2e-4 * max(0, e - 30) ** 2 + 0.01 * rng.standard_normal()
        )
        for w, v in ((tw, tl), (vw, vl)):
            w.add_scalar("epoch_loss", v, e)
            w.add_scalar("epoch_accuracy", 1 - v / 3, e)
    tw.close()
    vw.close()
    d = analyze(tmp_path / "logs")
    kinds = {f.kind for f in d.findings if f.severity is not Severity.INFO}
    held = {FindingKind.GAP_ACCELERATION, FindingKind.OVERFITTING, FindingKind.EVAL_REGRESSION}
    assert held <= kinds, kinds
    (inc,) = [i for i in d.incidents if any(f.kind in held for f in i.findings)]
    assert {f.kind for f in inc.findings} >= held
    first = min(f.start_step for f in inc.findings)
    assert (
        first
        == inc.start_step
        == min(f.start_step for f in d.findings if f.kind is FindingKind.GAP_ACCELERATION)
    )
    assert len(d.incidents) == 1
    assert d.order_sentence() == (
        "The validation loss moved first (onset at step 36, gap_acceleration); then the eval "
        "epoch_accuracy 10 steps later (step 46, eval_regression)."
    )


def test_an_incident_card_without_a_rollback_says_what_to_do() -> None:
    """The loss_scale_collapse sample's incident (a loss-scale drop, a grad-norm spike and a
    loss spike at steps 601-614) has no rollback: its card gave the cause, the mechanism and
    the order of the signs, and no next step, which only the terminal's last line gave. The
    card now ends on the same advice as the terminal."""
    import html
    import io
    import re

    from rich.console import Console

    from forensics.report import render_html
    from forensics.summary import print_summary

    d = diag("loss_scale_collapse")
    # (critical since its grad norm's ten steps at 27x the baseline are judged by the 2x / 3x
    # lines, not as one batch: the advice is the grad-norm spike's)
    (inc,) = [i for i in d.incidents if i.severity is Severity.CRITICAL]
    assert inc.rollback is None
    advice = d.what_to_do(inc.findings)
    assert advice is not None
    assert advice.where == "grad_norm_spike from step 603"
    assert advice.text.startswith("Orange light: over 3x the baseline")
    page = render_html(d, plotlyjs="cdn")
    start = page.index(f'id="{inc.id}"')
    card = re.sub(r"<[^>]+>", "", page[start : page.index("</article>", start)])
    card = " ".join(html.unescape(card).split())
    assert f"What to do ({advice.where}): {advice.text}" in card
    out = io.StringIO()
    print_summary(d, console=Console(file=out, width=400, color_system=None))
    assert f"What to do ({advice.where}): {advice.text}" in out.getvalue()
    # A card with a rollback keeps the rollback as its next step, without a second one.
    nan = diag("nan")
    rolled = [i for i in nan.incidents if i.rollback is not None]
    assert rolled
    page = render_html(nan, plotlyjs="cdn")
    for i in rolled:
        start = page.index(f'id="{i.id}"')
        assert "What to do" not in page[start : page.index("</article>", start)]
