"""Causes from evidence: each finding's causes tested against the log, on the sample runs that
showed the problem (issue 12): the LR change named where the LR jumped, the overflow only as
its consequence, the bad batch where a one-step spike recovered."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from forensics import analyze
from forensics.causes import CAUSES, STATUSES, SUPPORTED, UNTESTED, Cause, find_causes
from forensics.diagnosis import Diagnosis
from forensics.findings import Finding

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"


@cache
def diag(name: str) -> Diagnosis:
    return analyze(SAMPLES / name)


def _by(d: Diagnosis, f: Finding) -> dict[str, Cause]:
    return {c.cause: c for c in d.causes_for(f) if c.cause != "article"}


def _first(d: Diagnosis, kind: str) -> Finding:
    return next(f for f in d.findings if f.kind.value == kind)


@pytest.mark.parametrize(
    "run, kinds, lr_step",
    [
        ("param_norm_jump", ["param_norm_jump", "loss_spike", "grad_norm_spike"], 500),
        ("nan", ["nan_inf", "loss_spike", "activation_outlier"], 501),
        ("divergence", ["divergence", "param_norm_jump"], 401),
    ],
)
def test_the_lr_change_is_the_supported_cause(run: str, kinds: list[str], lr_step: int) -> None:
    """LR x50 (500-509), x300 (500-600), x1e4 (from 400): the LR change no schedule explains
    is supported, with the step the LR left its schedule and its values."""
    d = diag(run)
    for kind in kinds:
        f = next(g for g in d.findings if g.kind.value == kind and g.start_step >= lr_step - 1)
        c = _by(d, f)["lr_change"]
        assert c.status == SUPPORTED, (kind, c)
        assert c.steps[0] == lr_step and c.consequence_of is None
        assert f"step {lr_step - 1:,}" in c.evidence or f"step {lr_step:,}" in c.evidence


@pytest.mark.parametrize("run", ["param_norm_jump", "nan", "divergence"])
def test_overflow_only_where_the_scale_dropped_and_as_a_consequence(run: str) -> None:
    """ "Numeric overflow" is supported only where the loss scale fell in the same steps, and then
    as a consequence of the LR change; a run without a loss scale (divergence, bf16) leaves it
    untested."""
    d = diag(run)
    for f in d.findings:
        c = _by(d, f).get("loss_scale_overflow")
        if c is None:
            continue
        if c.status == SUPPORTED:
            assert _by(d, f)["lr_change"].status == SUPPORTED
            assert c.consequence_of == "lr_change", (f.kind, f.start_step, c)
            w = d.ev.drop_windows
            assert any(lo < c.steps[0] <= hi for lo, hi in w), c
        if run == "divergence":
            assert c.status == UNTESTED


def test_bad_batch_supported_for_the_one_step_spike() -> None:
    """bad_batch: the loss spikes at 300 for one step and is back at 301; the loss scale drop
    at 301 is the overflow that batch caused; data shared across seeds stays untested."""
    d = diag("bad_batch")
    spike = next(f for f in d.findings if f.kind.value == "loss_spike" and f.start_step == 300)
    cs = _by(d, spike)
    assert cs["bad_batch"].status == SUPPORTED
    assert "step 300" in cs["bad_batch"].evidence and "301" in cs["bad_batch"].evidence
    assert "5.89" in cs["bad_batch"].evidence  # the logged loss at 300
    assert cs["loss_scale_overflow"].status == SUPPORTED
    assert cs["loss_scale_overflow"].consequence_of == "bad_batch"
    assert cs["shared_data"].status == UNTESTED
    assert cs["lr_change"].status != SUPPORTED


def test_periodic_spikes_are_a_recurring_batch_not_the_eval_interval() -> None:
    """Spikes every 125 steps on a run that evaluates every 40: the eval pause is contradicted,
    the batch that comes round is supported."""
    d = diag("periodic_spikes")
    cs = _by(d, _first(d, "periodic_spikes"))
    assert cs["eval_pause"].status == "contradicted"
    assert "125" in cs["eval_pause"].evidence and "40" in cs["eval_pause"].evidence
    assert cs["bad_batch"].status == SUPPORTED


def test_a_spike_at_the_last_step_is_untested_for_a_bad_batch() -> None:
    """A spike with nothing logged after it cannot show that it recovered."""
    d = diag("periodic_spikes")
    last = next(f for f in d.findings if f.kind.value == "loss_spike" and f.start_step == 1000)
    assert _by(d, last)["bad_batch"].status == UNTESTED


def test_a_resume_near_the_onset_is_supported() -> None:
    """A restart finding 9 steps before a spike supports the resume; without it, contradicted."""
    ev = diag("resumed").ev
    restart = Finding("restart", "info", None, 601, "restart")
    spike = Finding("loss_spike", "warning", "loss", 610, "spike", peak_step=611)
    with_restart = {c.cause: c for c in find_causes(ev, spike, [restart, spike])}
    assert with_restart["resume"].status == SUPPORTED and with_restart["resume"].steps == (601,)
    # The onset is named by its step: an incident's sentence spans several onsets.
    assert with_restart["resume"].evidence == (
        "the job resumed at step 601, 9 steps before the onset at step 610"
    )
    at_once = Finding("loss_spike", "warning", "loss", 601, "spike", peak_step=602)
    same = {c.cause: c for c in find_causes(ev, at_once, [restart, at_once])}
    assert same["resume"].evidence == "the job resumed at step 601, at the onset (step 601)"
    alone = {c.cause: c for c in find_causes(ev, spike, [spike])}
    assert alone["resume"].status == "contradicted"


@pytest.mark.parametrize(
    "run", ["bad_batch", "nan", "param_norm_jump", "divergence", "overfitting", "healthy"]
)
def test_every_finding_carries_tested_causes(run: str) -> None:
    """Every finding has causes, each with a known id, a status and evidence; the document
    carries them per finding."""
    d = diag(run)
    doc = d.to_document()
    for f, fd in zip(d.findings, doc["findings"], strict=True):
        cs = d.causes_for(f)
        assert cs, f
        for c in cs:
            assert c.cause in CAUSES and c.status in STATUSES and c.evidence
        assert fd["causes"] == [c.to_dict() for c in cs]
        # Supported causes first.
        ranks = [STATUSES.index(c.status) for c in cs]
        assert ranks == sorted(ranks)


def test_terminal_names_the_cause(capsys: pytest.CaptureFixture[str]) -> None:
    """The terminal summary names the supported cause of each incident."""
    from rich.console import Console

    from forensics.summary import print_summary

    # (wide enough that the incident line, with its list of signs, is not wrapped)
    print_summary(diag("param_norm_jump"), console=Console(width=1000, force_terminal=False))
    out = capsys.readouterr().out
    assert "cause (supported): An LR change no schedule explains" in out
    assert "0.001578 -> 0.07864 at step 500" in out


def test_a_standing_activation_outlier_is_not_what_changed() -> None:
    """divergence: every layer's activations are out of range from step 560 and stay so. The
    grad-norm spike at 685, 125 steps later, cannot be explained by them: the activations
    cause is left untested with the reason, not supported; the loss spike at 811, right after
    the activations left their range again at 780, still cites them."""
    d = diag("divergence")
    spike = next(f for f in d.findings if f.kind.value == "grad_norm_spike" and f.start_step == 685)
    act = _by(d, spike)["activations"]
    assert act.status == UNTESTED, act
    assert "since step 560" in act.evidence and "standing condition" in act.evidence
    later = next(f for f in d.findings if f.kind.value == "loss_spike" and f.start_step == 811)
    assert _by(d, later)["activations"].status == SUPPORTED
    assert "from step 780" in _by(d, later)["activations"].evidence


def test_the_run_facts_follow_the_evidence_and_its_frame() -> None:
    """The metrics and span the causes read (``Run.has`` without copying the metric table,
    thousands of times per run) are the evidence's own, however two analyses interleave and
    when a run's frame is replaced."""
    import polars as pl

    from forensics.causes import _near
    from forensics.schema import GRAD_NORM, LOSS, LOSS_SCALE

    a, b = diag("loss_scale_collapse").ev, diag("divergence").ev  # 1,000 and 1,300 steps
    names = [LOSS, LOSS_SCALE, GRAD_NORM, "act_absmax", "val_loss"]

    def near(ev: object) -> int:
        run = ev.run  # type: ignore[attr-defined]
        return int(min(100, max(5, (run.last_step - run.first_step + 1) // 10)))

    assert a.has(LOSS_SCALE) != b.has(LOSS_SCALE)
    for ev in (a, b, a, b):
        assert [ev.has(m) for m in names] == [m in ev.run.metrics() for m in names]
        assert _near(ev) == near(ev)
    assert a.has(LOSS_SCALE)  # read for a's frame, then the frame is replaced
    frame = a.run.frame
    a.run.frame = frame.filter(pl.col("metric") != LOSS_SCALE).filter(pl.col("step") < 40)
    try:
        assert not a.has(LOSS_SCALE) and _near(a) == near(a)
    finally:
        a.run.frame = frame


def test_a_loss_scale_reads_the_same_in_the_finding_and_its_cause() -> None:
    """bad_batch's scaler halves 131072 -> 65536: the drop's summary and the overflow cause of
    the spike print both numbers one way (a reader compares them), with separators."""
    from forensics.findings import scale_text

    d = diag("bad_batch")
    drop = _first(d, "loss_scale_drop")
    spike = _first(d, "loss_spike")
    cause = _by(d, spike)["loss_scale_overflow"]
    assert cause.status == SUPPORTED
    assert "from 131,072 to 65,536" in drop.summary, drop.summary
    assert "loss scale 131,072 at step" in cause.evidence, cause.evidence
    assert "65,536 at step" in cause.evidence, cause.evidence
    assert [scale_text(x) for x in (0.5, 1.0, 2.0**70, None)] == ["0.5", "1", "1.181e+21", "n/a"]


def test_the_lr_factor_reads_as_the_rollback_advice_writes_it() -> None:
    """The divergence sample's LR rose x1,634 (0.002414 -> 3.944): the cause said x1.63e+03
    beside the rollback advice's x1,634. Both write the factor the same way, and it is the
    logged values' ratio."""
    d = diag("divergence")
    c = _by(d, _first(d, "divergence"))["lr_change"]
    assert "e+0" not in c.evidence, c.evidence
    # (inside the evidence's own parenthesis: the factor after a comma, no nested one)
    assert "(from 0.002414 at step 400 the LR rose to 3.944, x1,634);" in c.evidence, c.evidence
    (advice,) = [p for p in d.rollbacks if p.finding.kind.value == "divergence"]
    assert advice.lr_change is not None and "(x1,634 at step" in advice.lr_change, advice


def test_a_scale_logged_only_at_its_halvings_starts_the_drop_from_the_attempted_scale() -> None:
    """DeepSpeed logs the loss scale only where it halves it ("Attempted loss scale: 512,
    reducing to 256"); the scale grew unlogged since the point before. The overflow cause
    states the scale the drop started from as the log prints it, as the drop's summary does,
    not the last logged point (64 at step 145 before a drop from 512 at step 482)."""
    import re

    from conftest import shared_path

    path = shared_path(
        "real_runs", "deepspeed-chat-logs", "step2_reward", "opt-350m_globalBatchSize-64.log"
    )
    attempted: dict[int, str] = {}
    current = None
    for line in path.read_text().splitlines():
        if m := re.match(r"Grad overflow on iteration (\d+)", line):
            current = int(m.group(1))
        elif m := re.search(r"Attempted loss scale: (\d+)(?:\.0)?,", line):
            attempted.setdefault(current, f"{int(m.group(1)):,}")  # type: ignore[arg-type]
    d = analyze(path)
    drops = [f for f in d.findings if f.kind.value == "loss_scale_drop" and f.start_step > 400]
    assert [f.start_step for f in drops] == [482, 557]
    for drop in drops:
        cause = _by(d, drop)["loss_scale_overflow"]
        first = attempted[drop.start_step]
        assert f"from {first} to" in drop.summary, drop.summary
        assert f"(loss scale {first} before step {drop.start_step:,}," in cause.evidence


def test_activation_outliers_looked_up_by_onset_match_the_plain_reading():
    """The activations test looks up the outliers near an onset by their onsets; the same
    statuses, steps and sentences as reading every outlier, on outliers of all spans (open
    ones too) and in any order."""
    import random

    from forensics import causes

    def plain(x: causes._Facts, f: Finding) -> tuple[str, str, tuple[int, ...]]:
        near = x.near
        covering = [
            g
            for g in x.outliers
            if g.start_step <= f.start_step + 1
            and (g.end_step if g.end_step is not None else g.start_step) >= f.start_step - near
        ]
        outs = [g for g in covering if g.start_step >= f.start_step - near]
        if not covering:
            return ("contradicted", "", (f.start_step,))
        first, lay = causes._outlier_start_and_layers(outs or covering)
        return ("supported" if outs else "untested", lay, (first,))

    rng = random.Random(3)
    for _ in range(300):
        outliers = []
        for _ in range(rng.randrange(0, 12)):
            a = rng.randrange(0, 3_000)
            end = None if rng.random() < 0.3 else a + rng.randrange(0, 600)
            layer = rng.randrange(0, 4)
            outliers.append(
                Finding(
                    "activation_outlier",
                    "warning",
                    "act_absmax",
                    a,
                    "out",
                    end_step=end,
                    measures={"layer": layer},
                )
            )
        x = causes._Facts.__new__(causes._Facts)
        x.outliers = outliers
        # (activations logged over every onset drawn: the span test is not this one's)
        x.__dict__.update(
            near=rng.choice([0, 10, 100]), has_activations=True, activation_span=(0, 3_500)
        )
        for _ in range(20):
            f = Finding("loss_spike", "warning", "loss", rng.randrange(0, 3_500), "spike")
            got = causes._activations(x, f)
            status, lay, steps = plain(x, f)
            assert got.status == status and got.steps == steps
            if status != "contradicted":
                assert lay in got.evidence


def _jsonl_run(path: Path, *, scale_until: int | None, n: int = 8000) -> Path:
    """A JSONL log of n steps with a loss spike at step 5,000 (back within 5 steps); the
    loss scale logged (steady at 65,536) up to ``scale_until``, or at every step (None)."""
    import json

    import numpy as np

    rng = np.random.default_rng(1)
    lines = []
    for s in range(1, n + 1):
        loss = 2 + 2 * np.exp(-s / 1500) + 0.02 * rng.standard_normal()
        if 5000 <= s < 5006:
            loss += 1.5 * np.exp(-(s - 5000) / 2)
        row = {"step": s, "loss": round(float(loss), 5), "lr": 3e-4}
        if scale_until is None or s <= scale_until:
            row["loss_scale"] = 65536.0
        lines.append(json.dumps(row))
    out = path / "metrics.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


def test_a_loss_scale_logged_elsewhere_cannot_say_it_held(tmp_path: Path) -> None:
    """The loss scale was logged for the first 1,000 steps only; the spike is at 5,000. The
    overflow cause had been contradicted with "the loss scale held from step 4,999 to
    5,001", steps where the log has no loss scale: it is untested, and says where the scale
    is logged. Logged through the spike, it is contradicted as before."""
    d = analyze(_jsonl_run(tmp_path, scale_until=1000))
    (spike,) = [f for f in d.findings if f.kind.value == "loss_spike" and f.start_step == 5000]
    c = _by(d, spike)["loss_scale_overflow"]
    assert (c.status, c.evidence) == (UNTESTED, "the loss scale is logged only at steps 1-1,000")
    (tmp_path / "full").mkdir()
    d = analyze(_jsonl_run(tmp_path / "full", scale_until=None))
    (spike,) = [f for f in d.findings if f.kind.value == "loss_spike" and f.start_step == 5000]
    c = _by(d, spike)["loss_scale_overflow"]
    assert c.status == "contradicted"
    assert c.evidence == "the loss scale held from step 4,999 to 5,001"


def test_the_val_set_check_names_no_step_past_the_val_loss(tmp_path: Path) -> None:
    """A Keras-style run of 60 epochs (one step each) whose val loss turns up: the check for
    a validation-set change looked 100 steps past each onset and said "no step in the
    validation loss up to step 136" of a log that ends at 59."""
    import numpy as np
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(0)
    tw = SummaryWriter(str(tmp_path / "train"))
    vw = SummaryWriter(str(tmp_path / "validation"))
    for e in range(60):
        tl = 2.0 * np.exp(-e / 15) + 0.3 + 0.01 * rng.standard_normal()
        vl = (
            2.0 * np.exp(-e / 15) + 0.35 + 2e-4 * max(0, e - 30) ** 2 + 0.01 * rng.standard_normal()
        )
        tw.add_scalar("epoch_loss", tl, e)
        vw.add_scalar("epoch_loss", vl, e)
    tw.close()
    vw.close()
    d = analyze(tmp_path)
    said = [
        c.evidence
        for f in d.findings
        for c in d.causes_for(f)
        if c.cause == "val_set_change" and c.status == "contradicted"
    ]
    assert said and all(
        e == "no step in the validation loss up to step 59 that the training loss does not share"
        for e in said
    ), said


def test_a_loss_scale_drop_finding_is_evidenced_by_all_of_its_halvings():
    """layer_grad_shift sample: the loss scale halved at step 604 and again at 643, and the
    finding says "halved 2 times ... between steps 604 and 643". Its overflow evidence read
    "overflowed or fell at 1 step, step 604 (... 262,144 at step 604)": the cause looked
    only at the first ten steps, as for a spike's rise. A drop finding's own steps are its
    evidence: both halvings and the scale at the last."""
    d = diag("layer_grad_shift")
    (drop,) = [f for f in d.findings if f.kind.value == "loss_scale_drop"]
    assert "halved 2 times from 524,288 to 131,072 between steps 604 and 643" in drop.summary
    cause = _by(d, drop)["loss_scale_overflow"]
    assert cause.evidence == (
        "the loss scale overflowed or fell at 2 steps, steps 604-643 (loss scale 524,288 at "
        "step 603, 131,072 at step 643)"
    ), cause.evidence


def test_a_restart_cause_is_a_hypothesis_not_a_doubt_of_the_restart() -> None:
    """The restart is in the log; what stopped the job is not. Its article cause (a crash, a
    preemption or a manual resume) stays untested with that reason, not "no series in the
    log shows this" beside a finding the log shows; and the card, with nothing the log can
    test, says so instead of "none supported"."""
    from forensics.report import render_html

    d = diag("resumed")
    f = _first(d, "restart")
    (article,) = [c for c in d.causes_for(f) if c.cause == "article"]
    assert article.status == UNTESTED
    assert "started again, not what stopped it" in article.evidence
    card = render_html(d).split('id="finding-restart-601"', 1)[1].split("</article>", 1)[0]
    assert "none the log can test (each below is a hypothesis)" in card
    assert "none supported" not in card
    # a card with a contradicted cause still says none supported (the step-71 outlier as a
    # finding of its own: as a note, one of the run's absorbed outliers, it is tested only
    # against other seeds)
    from forensics.config import Config

    each = analyze(
        SAMPLES / "resumed", Config(detectors={"spikes": {"absorbed_gn_severity": "warning"}})
    )
    spike = render_html(each).split('id="finding-grad_norm_spike-71"', 1)[1].split("</article>")[0]
    assert "none supported." in spike
    notes = render_html(d).split('id="finding-grad_norm_outliers-71"', 1)[1].split("</article>")[0]
    assert "none the log can test (each below is a hypothesis)" in notes
