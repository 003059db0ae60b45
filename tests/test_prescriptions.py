"""The symptom -> causes -> prescription table (article section 7.1) as data."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from forensics.findings import Finding, FindingKind
from forensics.prescriptions import AREAS, STANDING_GUIDANCE, TABLE, needs_action, prescribe

TEMPLATES = Path(__file__).resolve().parents[1] / "forensics" / "report" / "templates"


@pytest.mark.parametrize("kind", list(FindingKind))
def test_every_kind_has_an_entry_and_a_partial(kind: FindingKind) -> None:
    """Each finding kind has a table entry with causes and a treatment, and its own report
    partial."""
    p = TABLE[kind]
    assert p.kind is kind
    assert p.symptom and p.causes and p.treatment
    assert (TEMPLATES / "findings" / f"_{kind.value}.html").is_file()


def test_the_articles_seven_rows_are_covered() -> None:
    """Every row of the article's table is followed by a kind or by standing guidance."""
    rows = {p.article_row for p in TABLE.values()} | {p.article_row for p in STANDING_GUIDANCE}
    assert {1, 2, 3, 4, 5, 6, 7} <= rows
    # The two rows without a finding kind of their own are standing guidance.
    assert {p.article_row for p in STANDING_GUIDANCE} == {6, 7}
    assert all(p.kind is None for p in STANDING_GUIDANCE)


def test_row_assignments_follow_the_article() -> None:
    """Kinds sit on the article row whose symptom they detect."""
    assert TABLE[FindingKind.GRAD_NORM_DRIFT].article_row == 1
    assert TABLE[FindingKind.LOSS_SPIKE].article_row == 2
    assert TABLE[FindingKind.NAN_INF].article_row == 3
    assert TABLE[FindingKind.OVERFITTING].article_row == 4
    assert TABLE[FindingKind.PARAM_NORM_JUMP].article_row == 5
    assert TABLE[FindingKind.THROUGHPUT_DROP].article_row == 7


def test_checks_use_known_areas_and_english() -> None:
    """Every check names a known area; no text is left in the article's language."""
    cjk = re.compile(r"[\u3000-\u9fff\uff00-\uffef]")
    for p in list(TABLE.values()) + list(STANDING_GUIDANCE):
        for chk in p.checks:
            assert chk.area in AREAS
        texts = [
            p.symptom,
            p.treatment,
            *p.causes,
            *(c.text for c in p.checks),
            *p.variants.values(),
        ]
        assert not any(cjk.search(t) for t in texts), p.symptom


@pytest.mark.parametrize(
    "classification, expected",
    [
        ("physiological", "No action"),
        ("beneficial", "No action"),
        ("pathological", "20-50%"),
        ("unresolved", "500 steps"),
    ],
)
def test_spike_prescription_follows_the_classification(classification: str, expected: str) -> None:
    """A recovered spike is left alone; a non-recovering one gets the rollback and the 20-50%
    cut."""
    f = Finding(
        "loss_spike", "warning", "loss", 100, "s", measures={"classification": classification}
    )
    assert expected in prescribe(f)


def test_lr_cuts_match_the_article() -> None:
    """The three learning-rate cuts: 20-50% for a spike, 10% on red light, a third for drift first
    aid."""
    assert "20-50%" in TABLE[FindingKind.LOSS_SPIKE].treatment
    assert "10%" in TABLE[FindingKind.DIVERGENCE].treatment
    assert "a third" in TABLE[FindingKind.GRAD_NORM_DRIFT].treatment


def test_severity_variant() -> None:
    """A critical grad-norm spike (past 3x baseline) gets the orange-light advice."""
    mild = Finding("grad_norm_spike", "warning", "grad_norm", 5, "s")
    bad = Finding("grad_norm_spike", "critical", "grad_norm", 5, "s")
    assert prescribe(mild) != prescribe(bad)
    assert "Orange" in prescribe(bad)


@pytest.mark.parametrize(
    "severity, classification, expected",
    [
        ("info", None, False),
        ("warning", "physiological", False),
        ("warning", "beneficial", False),
        ("warning", "pathological", True),
        ("critical", None, True),
    ],
)
def test_needs_action(severity: str, classification: str | None, expected: bool) -> None:
    """Notes and recovered or helpful spikes need no action; the rest do."""
    measures = {"classification": classification} if classification else {}
    assert (
        needs_action(Finding("loss_spike", severity, "loss", 1, "s", measures=measures)) is expected
    )


_LIGHTS = ("green", "blue", "yellow", "orange", "red")


@pytest.mark.parametrize("kind", list(FindingKind))
@pytest.mark.parametrize("severity", ["info", "warning", "critical", "fatal"])
def test_the_light_named_follows_the_severity(kind: FindingKind, severity: str) -> None:
    """One rule per severity: a prescription names its finding's light and no other (the fatal
    NaN used to say "Orange light")."""
    f = Finding(kind, severity, "loss", 5, "s")
    text = prescribe(f).lower()
    named = {c for c in _LIGHTS if f"{c} light" in text}
    if needs_action(f):
        assert named == {f.severity.light}, text
        assert text.startswith(f"{f.severity.light} light: ")
    else:
        assert not named, text


def test_a_loss_scale_note_calls_for_no_action() -> None:
    """The loss_scale_collapse sample's calibration cascade (steps 2-48, info) read 'check the
    loss scale history ... move to bf16' beside 'the scaler calibrating at the start of
    training'; a note says no action, the warning cascade keeps the treatment."""
    from forensics.pipeline import analyze

    root = Path(__file__).resolve().parents[1]
    diag = analyze(root / "sample_runs" / "loss_scale_collapse")
    drops = {f.severity.value: f for f in diag.findings if f.kind is FindingKind.LOSS_SCALE_DROP}
    assert set(drops) == {"info", "warning"}
    note, warning = prescribe(drops["info"]), prescribe(drops["warning"])
    assert note.startswith("No action") and "bf16" not in note
    assert "calibrating" in drops["info"].summary
    assert warning.startswith("Yellow light: check the loss scale history") and "bf16" in warning


def test_a_drift_note_names_the_level_now() -> None:
    """The grad_norm_drift sample's grad norm rises above the moving warning line around steps
    600-780 and is under it at the end; the rule judges the level now, so the note's
    prescription must say that, not that the whole climb stayed inside the envelope."""
    from forensics.pipeline import analyze

    root = Path(__file__).resolve().parents[1]
    diag = analyze(root / "sample_runs" / "grad_norm_drift")
    (drift,) = [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_DRIFT]
    assert drift.severity.value == "info"
    note = prescribe(drift)
    assert note.startswith("No action") and "level now" in note
    assert "stays inside" not in note
    assert "level now" in drift.summary
    # The same envelope in both: the finding names sqrt(lr_baseline / lr), and the note said
    # sqrt(lr_start / lr) (the baseline's LR is after the warm-up, not at its start).
    assert "sqrt(lr_baseline / lr)" in note and "lr_start" not in note


def test_a_grad_norm_spike_the_loss_followed_is_looked_at() -> None:
    """histogram_layers: the grad-norm spike at step 302 came back within 3 steps but the loss
    moved with it, a warning whose sentence says "check that batch"; its prescription said
    "Usually no action" and it counted as needing none. Now the prescription says to look at
    the batch, with the warning's light. A spike the optimizer absorbed keeps "no action"."""
    from forensics import analyze

    d = analyze(Path(__file__).resolve().parents[1] / "sample_runs" / "histogram_layers")
    spikes = [f for f in d.findings if f.kind is FindingKind.GRAD_NORM_SPIKE]
    moved = next(f for f in spikes if f.measures["loss_response"])
    assert moved.start_step == 302 and moved.severity.value == "warning"
    assert moved.measures["judged_by"] == "recovery"
    assert moved.measures["classification"] == "physiological"
    assert "but the loss moved with it: check that batch" in moved.summary
    rx = d.prescription_for(moved)
    assert rx.startswith("Yellow light: look at the batch behind it") and "no action" not in rx
    assert needs_action(moved)
    # (the absorbed ones: one note)
    (absorbed,) = [f for f in d.findings if f.kind is FindingKind.GRAD_NORM_OUTLIERS]
    assert absorbed.severity.value == "info" and not needs_action(absorbed)
    assert d.prescription_for(absorbed).startswith("No action")


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        (
            "gpt2_train.11672072.log",
            "Orange light: out of device memory: lower the micro-batch size",
        ),
        (
            "gpt2_train.11678978.log",
            "Orange light: a CUDA error: rerun with CUDA_LAUNCH_BLOCKING=1",
        ),
        (
            "gpt2_train.11673594.log",
            "Orange light: a failed assertion: its message names the check",
        ),
        ("gpt2_train.11672114.log", "Yellow light: not a training failure: resume from the last"),
    ],
)
def test_a_crash_is_prescribed_for_what_ended_it(job: str, expected: str) -> None:
    """Real llm.c jobs that ended before their first step (out of memory, a CUDA error, an
    assertion) or at the scheduler's time limit all got one text: "check the vitals in the
    last steps before it and resume from the last healthy checkpoint", where there were no
    steps. Each now gets the advice for the reason its log gives."""
    from conftest import shared_path

    import forensics

    path = shared_path("real_runs", "llmc-gpt2-124M-hectorfcardenas", job)
    diag = forensics.analyze(path)
    (crash,) = [f for f in diag.findings if f.kind is FindingKind.CRASH]
    assert diag.prescription_for(crash).startswith(expected), diag.prescription_for(crash)


@pytest.mark.parametrize(("turn_epoch", "early"), [(1.5, True), (3.5, False)])
def test_overfitting_in_the_first_two_epochs_is_prescribed_as_the_article_reads_it(
    tmp_path: Path, turn_epoch: float, early: bool
) -> None:
    """The article grades the negative slope by epoch: in epochs 1-2 the model is large for the
    data. A trainer_state.json (as TrainerState.save_to_json writes it) of 4 epochs of 500
    steps, eval every 50 steps, the eval loss turning up at ``turn_epoch`` while the train
    loss falls: epoch 2 gets the capacity-and-data advice, epoch 4 the general one."""
    import json

    import numpy as np

    import forensics

    rng = np.random.default_rng(3)
    hist: list[dict] = []
    turn = int(turn_epoch * 500)
    for s in range(10, 2001, 10):
        hist.append({"epoch": s / 500, "loss": round(2.5 - s / 1000, 4), "step": s})
        if s % 50 == 0:
            val = 2.6 - 0.0004 * min(s, turn) + 0.0004 * max(0, s - turn)
            hist.append({"epoch": s / 500, "eval_loss": val + 0.002 * rng.normal(), "step": s})
    state = {"global_step": 2000, "log_history": hist, "logging_steps": 10, "eval_steps": 50}
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    diag = forensics.analyze(tmp_path)
    (f,) = [g for g in diag.findings if g.kind is FindingKind.OVERFITTING]
    assert f.measures["epoch"] == (2 if early else 4), f.summary
    rx = diag.prescription_for(f)
    assert ("the model is large for this data" in rx) is early, rx


def test_a_loss_scale_drop_behind_a_bad_batch_names_the_batch() -> None:
    """The bad_batch sample: each loss-scale drop (steps 301, 651) has a supported bad batch
    (the loss spiked at 300 / 650 and was back the next step). Their cards read "check the
    loss scale history ...; if drops repeat, move to bf16", and drops do repeat there, though
    each came with one batch: the terminal's advice (the incident's root) said to find the
    batch, the report's cards to change precision. Now the cards name the batch, and bf16
    only for drops without one; a drop with no bad batch keeps the row (loss_scale_collapse,
    above)."""
    from forensics.pipeline import analyze

    root = Path(__file__).resolve().parents[1]
    diag = analyze(root / "sample_runs" / "bad_batch")
    drops = [f for f in diag.findings if f.kind is FindingKind.LOSS_SCALE_DROP]
    assert [f.start_step for f in drops] == [301, 651]
    for f, at in zip(drops, (300, 650), strict=True):
        text = diag.prescription_for(f)
        assert text.startswith(
            f"Yellow light: the overflow came with a bad batch at step {at:,} (see its causes): "
            "find that batch"
        ), text
        assert "only if the scale keeps falling at steps without such a batch" in text


def test_a_loss_spike_beside_an_overflow_is_not_called_a_hard_batch() -> None:
    """The loss_scale_collapse sample: a loss spike at step 603, back on its trend in 7 steps,
    in the steps where the loss scale fell from 131,072 to 16,384 (its supported cause: the
    overflow). Its card read "a normal reaction to a hard batch" and "Likely mechanism:
    numeric overflow" one after the other, and its prescription called it "a reaction to a
    hard batch", a cause nothing in the log shows; the overflow is the one shown. Now the
    prescription names the overflow and sends the reader to the loss-scale drop's card, and
    the card says no hard batch."""
    from forensics.pipeline import analyze
    from forensics.report import render_html

    root = Path(__file__).resolve().parents[1]
    diag = analyze(root / "sample_runs" / "loss_scale_collapse")
    (spike,) = [f for f in diag.findings if f.kind is FindingKind.LOSS_SPIKE]
    assert spike.start_step == 603 and spike.measures["classification"] == "physiological"
    assert spike.measures["cause"] == "numeric_overflow"
    text = diag.prescription_for(spike)
    assert "hard batch" not in text, text
    assert text == (
        "No action for the loss itself: it came back to its trend quickly. The loss scale fell "
        "in the same steps (an fp16 overflow, see its causes): the loss-scale drop's card says "
        "what to check."
    )
    page = render_html(diag, plotlyjs="cdn")
    start = page.index('id="finding-loss_spike-603"')
    card = " ".join(html.unescape(page[start : page.index("</article>", start)]).split())
    assert "The loss returned to its trend quickly. " in card
    assert "hard batch" not in card and "Likely mechanism: numeric overflow." in card
    assert text in card
    # The bad_batch sample's spikes came with an overflow too, but there the log shows the
    # batch (a supported bad batch, the overflow its consequence): the hard batch stays.
    bb = analyze(root / "sample_runs" / "bad_batch")
    spikes = [f for f in bb.findings if f.kind is FindingKind.LOSS_SPIKE]
    assert [f.start_step for f in spikes] == [300, 650]
    page = render_html(bb, plotlyjs="cdn")
    for f in spikes:
        assert f.measures["cause"] == "numeric_overflow"
        assert any(c.cause == "bad_batch" and c.status == "supported" for c in bb.causes_for(f))
        assert bb.prescription_for(f).endswith("a reaction to a hard batch.")
        start = page.index(f'id="finding-loss_spike-{f.start_step}"')
        card = " ".join(html.unescape(page[start : page.index("</article>", start)]).split())
        assert "The loss returned to its trend quickly: a normal reaction to a hard batch." in card
