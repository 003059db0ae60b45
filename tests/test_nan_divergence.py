"""nan_inf and divergence on seeded synthetic runs with injected ground truth."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import healthy_grad_norm, healthy_loss, long_frame, run_from_frame, spike_factor

from forensics.detectors import divergence, nan_inf
from forensics.detectors.divergence import DivergenceDetector
from forensics.detectors.nan_inf import NanInfDetector
from forensics.evidence import Evidence
from forensics.evidence.trend_utils import num
from forensics.findings import FindingKind, Severity
from forensics.measures import MEASURES


def _run(**series):
    return run_from_frame(long_frame({k.replace("__", "/"): v for k, v in series.items()}))


def _documented(module) -> set[str]:
    """The measures declared (with a meaning) for the kinds the detector's module reports: the
    docstrings point to forensics.measures, the one declaration."""
    kinds = {"nan_inf": ("nan_inf",), "divergence": ("divergence",)}[module.__name__.split(".")[-1]]
    return {m.key for k in kinds for m in MEASURES[k] if m.meaning}


# -- nan_inf ---------------------------------------------------------------------------------------
def test_isolated_nan_is_critical_at_its_step():
    """One NaN loss at step 1234, finite again next step: critical, onset 1234, recovered 1235."""
    s, v = healthy_loss(3000)
    v[1234] = np.nan
    (f,) = NanInfDetector().detect(Evidence(_run(train__loss=(s, v))))
    assert (f.kind, f.severity, f.metric, f.start_step) == (
        FindingKind.NAN_INF,
        Severity.CRITICAL,
        "loss",
        1234,
    )
    assert f.measures["recovered_step"] == 1235 and f.measures["persistent"] is False
    assert f.measures["first_bad_value"] == "nan" and f.measures["last_finite_step"] == 1233


def _jsonl_run(tmp_path, shift_after: float):
    """A JSONL log (json.dumps writes NaN as the trainers do) of 8,000 steps, the loss NaN at
    step 3,000 only; from step 3,001 the loss is ``shift_after`` higher than its trend."""
    import json

    from forensics.importers import read_run

    rng = np.random.default_rng(5)
    rows = []
    for s in range(1, 8001):
        loss = 2.0 + 1.5 * np.exp(-s / 3000) + 0.02 * rng.standard_normal()
        loss += shift_after if s > 3000 else 0.0
        rows.append({"step": s, "loss": float("nan") if s == 3000 else round(loss, 4)})
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return read_run(tmp_path)


def test_an_isolated_nan_after_which_the_loss_is_back_needs_no_rollback(tmp_path) -> None:
    """One NaN loss at step 3,000, the loss at its level from step 3,001: the update was
    skipped (or only the logged value was bad). It was "roll back to the checkpoint at step
    2,500 and resume with the LR 10% lower" for a run that had trained on unharmed."""
    from forensics.pipeline import analyze_run

    diag = analyze_run(_jsonl_run(tmp_path, 0.0))
    (f,) = [g for g in diag.findings if g.kind is FindingKind.NAN_INF]
    assert f.severity is Severity.CRITICAL and f.measures["loss_back"] is True
    assert "the loss is back at its level after it" in f.summary
    assert not [r for r in diag.rollbacks if r.rollback]
    assert diag.prescription_for(f).startswith(
        "Orange light: look, but do not roll back: the loss came back"
    ), diag.prescription_for(f)


def test_an_isolated_nan_after_which_the_loss_stays_higher_keeps_its_rollback(tmp_path) -> None:
    """The same NaN with the loss 0.3 higher from step 3,001 on: the step did harm; the
    rollback before it stays."""
    from forensics.pipeline import analyze_run

    diag = analyze_run(_jsonl_run(tmp_path, 0.3))
    (f,) = [g for g in diag.findings if g.kind is FindingKind.NAN_INF]
    assert f.measures["loss_back"] is False
    assert "the loss did not come back to its level" in f.summary
    (plan,) = [r for r in diag.rollbacks if r.rollback][:1]
    assert "Roll back" in plan.sentence() and "2,999" in plan.sentence()


def test_persisting_nan_is_fatal():
    """Loss and grad norm NaN from step 2000 to the end: two fatal findings starting at 2000."""
    s, v = healthy_loss(3000)
    gs, g = healthy_grad_norm(3000)
    v[2000:] = np.nan
    g[2000:] = np.inf
    found = NanInfDetector().detect(Evidence(_run(train__loss=(s, v), train__grad_norm=(gs, g))))
    assert {(f.metric, f.severity, f.start_step) for f in found} == {
        ("loss", Severity.FATAL, 2000),
        ("grad_norm", Severity.FATAL, 2000),
    }
    assert {f.measures["first_bad_value"] for f in found} == {"nan", "inf"}


def test_isolated_then_persisting():
    """An isolated Inf at 500, then NaN for good from 2500: fatal, first step 500, persistent from
    2500."""
    s, v = healthy_loss(3000)
    v[500] = np.inf
    v[2500:] = np.nan
    (f,) = NanInfDetector().detect(Evidence(_run(train__loss=(s, v))))
    assert f.severity is Severity.FATAL and f.start_step == 500
    assert f.measures["persistent_from"] == 2500 and f.measures["bad_runs"] == 2


def test_nan_tail_shared_with_memory_is_missing_data():
    """A 'nan' tail that the memory readings share (a padded record) is noted, not reported."""
    s, v = healthy_loss(3000, every=5)
    mem = np.full(len(s), 2.0e10)
    v[-20:] = np.nan
    mem[-20:] = np.nan
    run = _run(lm_loss=(s, v), mem_allocated_bytes=(s, mem))
    assert NanInfDetector().detect(Evidence(run)) == []
    assert any("missing values" in n for n in run.notes)


def test_nan_inf_measures_documented():
    """Each measures key appears in the module docstring's table."""
    s, v = healthy_loss(300)
    v[100] = np.nan
    (f,) = NanInfDetector().detect(Evidence(_run(train__loss=(s, v))))
    assert set(f.measures) <= _documented(nan_inf)


# -- divergence ------------------------------------------------------------------------------------
def _diverging(
    n: int = 4000,
    at: int = 2000,
    loss_up: float = 0.6,
    gn_up: float = 4.0,
    tau: float = 150.0,
    seed: int = 0,
):
    """Loss and grad norm ramp up together from `at` (1 - exp(-t/tau)) and stay up."""
    s, v = healthy_loss(n, seed=seed)
    gs, g = healthy_grad_norm(n, seed=seed + 1)
    ramp = np.where(s >= at, 1 - np.exp(-(s - at) / tau), 0.0)
    return s, v * (1 + loss_up * ramp), g * (1 + (gn_up - 1) * ramp)


@pytest.mark.parametrize("seed", range(3))
def test_divergence_is_fatal_with_its_onset(seed: int):
    """Loss +60% and grad norm x4 from step 2000, never back: fatal, onset within 60 steps of
    2000."""
    s, v, g = _diverging(seed=seed)
    (f,) = DivergenceDetector().detect(Evidence(_run(train__loss=(s, v), train__grad_norm=(s, g))))
    assert f.kind is FindingKind.DIVERGENCE and f.severity is Severity.FATAL
    assert 1990 <= f.start_step <= 2060
    assert f.measures["confirmed"] is True and f.measures["grad_norm_ratio"] > 2.5
    assert f.measures["loss_rise_rel"] == pytest.approx(0.6, abs=0.15)
    assert set(f.measures) <= _documented(divergence)


def test_loss_rise_without_grad_norm_is_not_divergence():
    """The loss rising alone (grad norm flat) is not this detector's red light: no
    divergence; the rise, lasting to the end of the log, is a loss climb (a warning)."""
    s, v, _ = _diverging()
    _, g = healthy_grad_norm(4000)
    found = DivergenceDetector().detect(Evidence(_run(train__loss=(s, v), train__grad_norm=(s, g))))
    assert [(f.kind.value, f.severity.value) for f in found] == [("loss_climb", "warning")]
    assert "the grad norm held" in found[0].summary


def test_rise_that_comes_back_within_the_window_is_not_divergence():
    """Both rise at 2000 and are back by ~2300: a pathological-looking bump, not a divergence."""
    s, v = healthy_loss(4000)
    gs, g = healthy_grad_norm(4000)
    bump = spike_factor(s, 2000, 0.5, width=150, tau=40)
    assert (
        DivergenceDetector().detect(
            Evidence(_run(train__loss=(s, v * bump), train__grad_norm=(gs, g * bump**2)))
        )
        == []
    )


def test_divergence_ending_in_nan():
    """A rise that turns into NaN 300 steps later is confirmed at once (fatal, ended_nonfinite)."""
    s, v, g = _diverging(n=4000, at=2000, tau=100)
    v[2300:] = np.nan
    g[2300:] = np.nan
    (f,) = DivergenceDetector().detect(Evidence(_run(train__loss=(s, v), train__grad_norm=(s, g))))
    assert f.severity is Severity.FATAL and f.measures["ended_nonfinite"] is True


def test_divergence_cut_short_by_the_log_is_critical():
    """The log ends 250 steps into the rise: critical, not confirmed."""
    s, v, g = _diverging(n=2250, at=2000, tau=60)
    (f,) = DivergenceDetector().detect(Evidence(_run(train__loss=(s, v), train__grad_norm=(s, g))))
    assert f.severity is Severity.CRITICAL and f.measures["confirmed"] is False


@pytest.mark.parametrize("seed", range(4))
def test_healthy_runs_do_not_diverge(seed: int):
    """A healthy run, falling start included, gives no divergence and no NaN."""
    run = _run(
        train__loss=healthy_loss(5000, seed=seed),
        train__grad_norm=healthy_grad_norm(5000, seed=seed + 9),
    )
    assert (
        DivergenceDetector().detect(Evidence(run)) == []
        and NanInfDetector().detect(Evidence(run)) == []
    )


def test_missing_grad_norm_is_noted():
    """Without a grad-norm series the detector says so in the run notes."""
    run = _run(train__loss=healthy_loss(500))
    assert DivergenceDetector().detect(Evidence(run)) == []
    assert any(n.startswith("divergence: not run") for n in run.notes)


def test_inf_grad_norm_at_an_fp16_overflow_is_the_scaler_at_work():
    """An inf grad norm in the step where the loss scale halves (a skipped step) is noted, not
    reported; the same inf with no scale drop is reported: a warning while the loss stays at
    its level (a transient the loss did not follow), critical where the loss does not come
    back."""
    s, v = healthy_loss(3000)
    gs, g = healthy_grad_norm(3000)
    g[1500] = np.inf
    scale = np.where(s > 1500, 2.0**15, 2.0**16)
    run = _run(train__loss=(s, v), train__grad_norm=(gs, g), loss_scale=(s, scale))
    assert NanInfDetector().detect(Evidence(run)) == []
    assert any("scaler skipped" in n for n in run.notes)
    (f,) = NanInfDetector().detect(Evidence(_run(train__loss=(s, v), train__grad_norm=(gs, g))))
    assert f.severity is Severity.WARNING and f.start_step == 1500
    assert f.measures["loss_back"] is True
    hurt = np.where(s > 1500, v + 0.3, v)
    (f,) = NanInfDetector().detect(Evidence(_run(train__loss=(s, hurt), train__grad_norm=(gs, g))))
    assert f.severity is Severity.CRITICAL and f.measures["loss_back"] is False


@pytest.mark.parametrize(("nans", "again"), [((3000,), False), ((2000, 3000), True)])
def test_a_nan_on_the_last_logged_step_of_an_fp16_run_is_not_known_to_persist(
    nans: tuple, again: bool
) -> None:
    """With a dynamic loss scale logged, the scaler skips non-finite steps: one NaN on the log's
    last line was "the loss is nan from step 3,000 to the end of the log: all 1 logged points
    are non-finite", fatal, the red light. Read live by watch (one poll from the next line),
    it fired FATAL and --on-fatal for a step the next line showed finite. Such a stretch,
    shorter than persist_points, is critical and said to be too soon to tell."""
    s = np.arange(1, 3001)
    v = healthy_loss(3000)[1].copy()
    for n in nans:
        v[n - 1] = np.nan
    scale = (s, np.full(len(s), 65536.0))
    (f,) = NanInfDetector().detect(Evidence(_run(train__loss=(s, v), loss_scale=scale)))
    assert f.severity is Severity.CRITICAL and f.measures["persistent"] is False
    assert "the log ends there, too soon to tell whether it persists" in f.summary, f.summary
    assert ("finite again at step 2,001" in f.summary) is again


def test_a_nan_on_the_last_logged_step_without_a_scaler_persists() -> None:
    """Without a loss scaler a non-finite gradient makes the weights non-finite at the next
    update: a NaN at the end of the log is persistent (fatal), as the trainer integrations
    rely on to write the rollback plan at the first NaN they see."""
    s = np.arange(1, 3001)
    v = healthy_loss(3000)[1].copy()
    v[-1] = np.nan
    (f,) = NanInfDetector().detect(Evidence(_run(train__loss=(s, v))))
    assert f.severity is Severity.FATAL and f.measures["persistent"] is True


def test_one_nan_at_the_last_step_is_said_once() -> None:
    """A NaN at the last logged step (what a watcher sees first) read "The loss is nan from
    step 300 to the end of the log (step 300): all 1 logged points are non-finite"."""
    s = np.arange(1, 301)
    v = 2.0 + 1.0 / s
    v[-1] = np.nan
    (f,) = [x for x in NanInfDetector().detect(Evidence(_run(train__loss=(s, v))))]
    assert f.severity is Severity.FATAL and f.start_step == 300
    assert (
        f.summary == "The loss is nan at step 300, the last step logged: nothing finite after it."
    )


def test_a_divergence_that_begins_with_a_jump_rises_from_the_level_before_it():
    """The loss steps up by 0.8 at step 6,200 (from about 4.5) and climbs on; the grad norm
    with it. The sentence's "rose from" is the level the loss left, not the smoothed curve
    half-way up the jump (it read 5.285, a level the loss never held)."""
    rng = np.random.default_rng(7)
    s = np.arange(1, 6501)
    v = 3.3 + 7.7 / (1 + s / 300) ** 0.6 + rng.normal(0, 0.03, len(s))
    g = 0.4 + np.abs(rng.normal(0, 0.03, len(s)))
    up = s >= 6200
    v[up] += 0.8 + (s[up] - 6200) * 0.004
    g[up] *= 4
    (f,) = DivergenceDetector().detect(Evidence(_run(train__loss=(s, v), train__grad_norm=(s, g))))
    before = float(np.median(v[(s >= 6100) & (s < 6200)]))  # about 4.52
    assert f.measures["loss_before"] == pytest.approx(before, rel=0.01)
    m = f.measures
    assert m["loss_rise_rel"] == pytest.approx(m["loss_peak"] / m["loss_before"] - 1)
    assert m["loss_rise_rel"] > 0.4  # (4.5 -> 6.5; it read 22% from the half-way level)
    assert f"rose from {num(m['loss_before'])} " in f.summary and m["loss_before"] < 4.6


def test_divergence_card_of_a_rise_the_log_cuts_short():
    """The card said "the loss kept rising without coming back. This is the case for rolling
    back automatically." under a sentence saying the rise was seen "for the 246 steps the log
    still shows" (critical, not confirmed): it now says the log ends before the rise could be
    confirmed and when it would be."""
    from report_text import card_texts

    from forensics.pipeline import analyze_run

    s, v, g = _diverging(n=2250, at=2000, tau=60)
    diag = analyze_run(_run(train__loss=(s, v), train__grad_norm=(s, g)))
    (f,) = [f for f in diag.findings if f.kind is FindingKind.DIVERGENCE]
    assert f.measures["confirmed"] is False
    (text,) = card_texts(diag, "divergence")
    assert "kept rising without coming back" not in text, text
    by = f.start_step + f.measures["window"]
    assert (
        f"Orange light: the loss had not come back when the log ends, "
        f"{f.measures['steps_observed']:,} steps into the rise, fewer than the "
        f"{f.measures['window']:,} that confirm a divergence: if it is not back by step {by:,}, "
        "this is the case for rolling back automatically." in text
    ), text


def test_divergence_card_of_a_confirmed_rise():
    from report_text import card_texts

    from forensics.pipeline import analyze_run

    s, v, g = _diverging(n=4000, at=2000, tau=100)
    diag = analyze_run(_run(train__loss=(s, v), train__grad_norm=(s, g)))
    (f,) = [f for f in diag.findings if f.kind is FindingKind.DIVERGENCE]
    assert f.measures["confirmed"] is True
    (text,) = card_texts(diag, "divergence")
    assert (
        "Red light: the loss kept rising without coming back. This is the case for rolling back "
        "automatically." in text
    ), text


@pytest.mark.parametrize("seed", range(3))
def test_divergence_with_a_grad_norm_climbing_through_it(seed: int):
    """Loss and grad norm climbing linearly together from step 3,000 (the watcher's poll at
    step 3,682: loss +23%, grad norm 2.3x its baseline and still climbing). The grad norm's
    median over the whole rise was 1.9x, under the 2x it must reach, so no divergence; the
    drift check left it to the divergence because the loss rises too: the run read HEALTHY.
    The grad norm's level over the rise's last third counts too."""
    rng = np.random.default_rng(seed)
    s = np.arange(1, 3683)
    g = 0.6 + 0.3 * np.exp(-s / 300) + np.abs(rng.normal(0, 0.04, len(s)))
    v = 2.0 + 6.0 / (1 + s / 300) ** 0.7 + rng.normal(0, 0.02, len(s))
    late = s > 3000
    g = np.where(late, g * (1 + (s - 3000) / 400), g)
    v = np.where(late, v + (s - 3000) / 800, v)
    (f,) = DivergenceDetector().detect(Evidence(_run(train__loss=(s, v), train__grad_norm=(s, g))))
    assert 2950 <= f.start_step <= 3150
    assert f.measures["grad_norm_ratio"] < 2.0 <= f.measures["grad_norm_late_ratio"]
    assert (
        f"the grad norm ran at {f.measures['grad_norm_ratio']:.1f}x its earlier level over the "
        f"rise and {f.measures['grad_norm_late_ratio']:.1f}x over its last third"
    ) in f.summary, f.summary
    assert set(f.measures) <= _documented(divergence)


def test_a_rise_into_nan_is_judged_up_to_the_nan():
    """The loss climbs from step 2000 and is NaN from 2150 to the end of the log (4000); the
    grad norm holds, then runs at 10x over the 50 steps before the NaN, and is not logged
    after it (a job that skips a non-finite step logs no grad norm). The rise's last third is
    the one before the NaN, not of the 2,000 steps to the end of the log, which hold no grad
    norm (the nan sample's divergence went unreported so)."""
    s, v = healthy_loss(4000, seed=3)
    gs, g = healthy_grad_norm(4000, seed=4)
    v = np.where(s >= 2000, v * (1 + 0.6 * (1 - np.exp(-(s - 2000) / 150.0))), v)
    v = np.where(s >= 2150, np.nan, v)
    g = np.where((gs >= 2100) & (gs < 2150), g * 10, g)
    keep = gs < 2150
    run = _run(train__loss=(s, v), train__grad_norm=(gs[keep], g[keep]))
    found = DivergenceDetector().detect(Evidence(run))
    assert [(f.kind, f.severity) for f in found] == [(FindingKind.DIVERGENCE, Severity.FATAL)]
    (f,) = found
    assert 1990 <= f.start_step <= 2060 and f.measures["ended_nonfinite"] is True
    assert f.measures["grad_norm_ratio"] < 2.0 <= f.measures["grad_norm_late_ratio"]
    assert f.summary.endswith("until the values turned non-finite.")


def test_the_peak_shown_is_the_highest_logged_loss_the_sentence_names() -> None:
    """The nan sample: the loss climbs from step 522 and is NaN from 637. The smoothed curve
    tops out at the last finite point (636, logged 9.90), so the card read "peak at 636" and
    the chart's marker sat at 9.90 while the sentence named 14.65 at step 634. The peak a
    reader is shown is the highest logged value, at the step the sentence gives."""
    from pathlib import Path

    from forensics.importers import read_run

    run = read_run(Path(__file__).resolve().parents[1] / "sample_runs" / "nan")
    (f,) = [
        g for g in DivergenceDetector().detect(Evidence(run)) if g.kind is FindingKind.DIVERGENCE
    ]
    loss = Evidence(run).series("loss")
    finite = np.isfinite(loss.values)
    top = int(loss.steps[finite][np.argmax(loss.values[finite])])
    assert f.peak_step == top, (f.peak_step, top)
    assert (
        f"highest logged value {num(float(loss.values[loss.steps == top][0]))} at step {top:,}"
        in f.summary
    )
