"""gap_acceleration, overfitting and val_shift on seeded synthetic runs (issue 7, article
section 5)."""

from __future__ import annotations

import numpy as np
import pytest
from report_text import card_texts
from synthetic import run_from_frame, trend_train_val

from forensics.detectors.train_val import TrainValDetector
from forensics.evidence import Evidence
from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze_run


def _kinds(findings: list) -> dict[FindingKind, list]:
    out: dict[FindingKind, list] = {}
    for f in findings:
        out.setdefault(f.kind, []).append(f)
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("val_every", [250, 1000, 2000])
def test_quiet_on_healthy_train_val(seed: int, val_every: int) -> None:
    """Train and val falling together with a steady gap draw nothing."""
    frame, _ = trend_train_val("healthy", seed=seed, val_every=val_every, n=20000)
    assert TrainValDetector().detect(Evidence(run_from_frame(frame))) == []


@pytest.mark.parametrize("seed", range(4))
def test_gap_acceleration_before_val_turns_up(seed: int) -> None:
    """Train starts memorising at 7000 while val keeps falling: a gap warning near the onset,
    val not up yet."""
    frame, truth = trend_train_val("accelerate", seed=seed)
    found = _kinds(TrainValDetector().detect(Evidence(run_from_frame(frame))))
    assert set(found) == {FindingKind.GAP_ACCELERATION}
    (f,) = found[FindingKind.GAP_ACCELERATION]
    assert f.severity is Severity.WARNING and f.metric == "val_loss"
    assert truth["onset"] - 500 <= f.start_step <= truth["onset"] + 3000
    assert f.start_step <= f.measures["detected_step"]
    assert f.measures["val_turned_up"] is False
    assert f.measures["window_steps"] == 1000


@pytest.mark.parametrize("seed", range(4))
def test_overfitting_negative_slope(seed: int) -> None:
    """Val turning up at 7000 while train keeps falling: overfitting at the onset, plus the gap
    warning."""
    frame, truth = trend_train_val("overfit", seed=seed)
    found = _kinds(TrainValDetector().detect(Evidence(run_from_frame(frame))))
    (o,) = found[FindingKind.OVERFITTING]
    assert o.severity is Severity.WARNING and abs(o.start_step - truth["onset"]) <= 500
    assert o.measures["train_change_pct"] < 0 and o.measures["val_rise"] > 0
    assert o.measures["epoch"] is None
    (g,) = found[FindingKind.GAP_ACCELERATION]
    assert abs(g.start_step - truth["onset"]) <= 1000


@pytest.mark.parametrize(
    ("steps_per_epoch", "severity", "epoch"),
    [(1500, Severity.CRITICAL, 5), (5000, Severity.WARNING, 2)],
)
def test_overfitting_graded_by_epoch(steps_per_epoch: int, severity: Severity, epoch: int) -> None:
    """From the fifth epoch with the gap still accelerating, overfitting is critical (article
    5.2)."""
    frame, _ = trend_train_val("overfit", steps_per_epoch=steps_per_epoch)
    (o,) = _kinds(TrainValDetector().detect(Evidence(run_from_frame(frame))))[
        FindingKind.OVERFITTING
    ]
    assert o.severity is severity and o.measures["epoch"] == epoch
    assert o.measures["gap_accelerating"] is True


def test_overfitting_sparse_val() -> None:
    """With val every 2000 steps the window widens to two intervals and the onset is still found."""
    frame, truth = trend_train_val("overfit", val_every=2000, n=30000, onset=15000)
    found = _kinds(TrainValDetector().detect(Evidence(run_from_frame(frame))))
    (o,) = found[FindingKind.OVERFITTING]
    assert abs(o.start_step - truth["onset"]) <= 2000
    assert found[FindingKind.GAP_ACCELERATION][0].measures["window_steps"] == 4000


@pytest.mark.parametrize(
    ("seed", "ramp"), [(0, 3000), (1, 3000), (2, 3000), (3, 3000), (0, 1), (1, 1000)]
)
def test_val_shift_snapshot_effect(seed: int, ramp: int) -> None:
    """Val 1.95 -> 2.1 within 3000 steps (or at once) then flat, train flat: val_shift only
    (article 5.4)."""
    frame, truth = trend_train_val("val_shift", seed=seed, ramp=ramp)
    found = _kinds(TrainValDetector().detect(Evidence(run_from_frame(frame))))
    assert set(found) == {FindingKind.VAL_SHIFT}
    (f,) = found[FindingKind.VAL_SHIFT]
    assert abs(f.start_step - truth["onset"]) <= 500
    assert f.measures["shift"] == pytest.approx(0.15, abs=0.02)
    assert f.measures["val_before"] == pytest.approx(1.95, abs=0.01)
    assert abs(f.measures["train_change"]) < 0.02
    assert "validation set" in f.summary
    # The sentence's steps read with separators; the values logged at them (which the chart
    # shows) stand beside the fitted levels when those differ in their four digits.
    val = Evidence(run_from_frame(frame)).series("val_loss")
    at = dict(zip(val.steps.tolist(), val.values.tolist(), strict=True))
    a, b = at[f.start_step], at[f.peak_step]
    assert f.measures["val_logged_before"] == a and f.measures["val_logged_after"] == b
    assert f"between steps {f.start_step:,} and {f.peak_step:,}" in f.summary
    fitted = f"{f.measures['val_before']:.4g} to {f.measures['val_after']:.4g}"
    logged = f"(levels of lines fitted on each side; {a:.4g} and {b:.4g} logged)"
    assert fitted in f.summary
    if f"{f.measures['val_before']:.4g} to {f.measures['val_after']:.4g}" != f"{a:.4g} to {b:.4g}":
        assert logged in f.summary
    else:
        assert "logged)" not in f.summary


def test_missing_val_is_noted() -> None:
    """Without a val series the three checks say they did not run."""
    frame, _ = trend_train_val("healthy")
    import polars as pl

    from forensics.schema import VAL_LOSS

    run = run_from_frame(frame.filter(pl.col("metric") != VAL_LOSS))
    assert TrainValDetector().detect(Evidence(run)) == []
    assert any("val_loss" in n and "not run" in n for n in run.notes)


def test_quiet_when_the_noise_shrinks_with_the_loss() -> None:
    """A long healthy run whose noise falls with the loss level: no gap alarm early on.

    Found on a 300k-step run: a run-wide noise estimate, dominated by the quiet end, made an
    early 0.012 wobble of a constant gap look like a 4-sigma widening.
    """
    from synthetic import long_frame, run_from_frame

    from forensics.detectors.train_val import TrainValDetector

    rng = np.random.default_rng(0)
    n = 300_000
    s = np.arange(n)
    loss = 2 + 8 / (1 + s / 400) ** 0.7 * np.exp(
        rng.normal(0, 0.02, n)
    )  # noise only on the falling part
    val_steps = s[::1000]
    run = run_from_frame(
        long_frame({"loss": (s, loss), "val_loss": (val_steps, loss[::1000] + 0.05)})
    )
    found = [f for f in TrainValDetector().detect(Evidence(run)) if f.severity.value != "info"]
    assert not found, [f.summary for f in found]


def test_val_shift_late_in_a_full_log() -> None:
    """A full 40k-step log: val jumps +0.15 at step 25000 and holds while train creeps on. The early
    fall of training must not crowd the real shift out of the candidates (found in review)."""
    from synthetic import long_frame, run_from_frame

    rng = np.random.default_rng(0)
    s = np.arange(0, 40_000, 50)
    curve = 2 + 8 / (1 + s / 150) ** 0.9
    train = curve * np.exp(rng.normal(0, 0.01, len(s)))
    vs = s[s % 500 == 0][1:]
    val = (
        2.05
        + 8 / (1 + vs / 150) ** 0.9
        + np.where(vs >= 25_000, 0.15, 0.0)
        + rng.normal(0, 0.003, len(vs))
    )
    found = TrainValDetector().detect(
        Evidence(run_from_frame(long_frame({"loss": (s, train), "val_loss": (vs, val)})))
    )
    shifts = [f for f in found if f.kind is FindingKind.VAL_SHIFT]
    assert len(shifts) == 1 and abs(shifts[0].start_step - 25_000) <= 500, [
        (f.kind, f.start_step) for f in found
    ]
    assert not [f for f in found if f.kind is FindingKind.GAP_ACCELERATION]


def test_findings_judged_against_the_evidence_gap() -> None:
    """Each train/val finding states what it was judged against, and those numbers are the
    evidence's gap (the one charts and checklists read), computed once."""
    from forensics.evidence.gap import Gap

    frame, _ = trend_train_val("overfit", steps_per_epoch=1500)
    ev = Evidence(run_from_frame(frame))
    found = _kinds(TrainValDetector().detect(ev))
    g = ev._gaps.get("val_loss")  # cached on the evidence by the detector
    assert isinstance(g, Gap) and ev.gap is g
    (a,) = found[FindingKind.GAP_ACCELERATION]
    j = a.judged_against
    assert j["accel_ratio"] == 1.5 and j["window_steps"] == g.window == a.measures["window_steps"]
    assert j["noise"] == g.noise == a.measures["val_noise"]
    i = int(np.searchsorted(g.steps, a.measures["detected_step"])) - 1  # first of the two points
    assert j["noise_floor"] == pytest.approx(g.growth_floor[i])
    assert a.measures["growth_last"] > j["noise_floor"]
    assert a.measures["growth_last"] > j["accel_line"]
    assert j["accel_line"] == pytest.approx(1.5 * max(a.measures["growth_prev"], 0.0))
    (o,) = found[FindingKind.OVERFITTING]
    # the rise is judged against the held-out loss's own eval noise
    assert o.judged_against["rise_floor"] == pytest.approx(3.0 * g.val_noise)
    assert o.judged_against["noise"] == o.measures["eval_noise"] == g.val_noise
    assert o.measures["val_rise"] > o.judged_against["rise_floor"]
    assert o.judged_against["critical_epoch"] == 5
    # the end-of-log acceleration the severity rests on is the evidence's own rule
    assert o.measures["gap_accelerating"] is True


def test_val_shift_judged_against_its_floor() -> None:
    frame, _ = trend_train_val("val_shift")
    ev = Evidence(run_from_frame(frame))
    (f,) = TrainValDetector().detect(ev)
    j = f.judged_against
    assert ev.gap is not None and j["noise"] == ev.gap.noise
    assert j["shift_floor"] == pytest.approx(
        max(4.0 * ev.gap.noise, 0.02 * f.measures["val_before"])
    )
    assert f.measures["shift"] > j["shift_floor"] and j["shift_window"] == 3000


def test_detector_configured_apart_from_the_evidence() -> None:
    """A detector with its own parameters judges with them (the evidence's gap keeps its own)."""
    from forensics.detectors import params_for

    frame, _ = trend_train_val("overfit", n=20000)
    ev = Evidence(run_from_frame(frame))
    det = TrainValDetector(params_for(TrainValDetector, {"min_window": 2000}))
    (a,) = _kinds(det.detect(ev))[FindingKind.GAP_ACCELERATION]
    assert a.measures["window_steps"] == a.judged_against["window_steps"] == 2000
    assert ev.gap is not None and ev.gap.window == 1000


def test_too_few_points_is_noted() -> None:
    """Fewer val points than min_val_points: the checks say they did not run, and why."""
    import polars as pl

    frame, _ = trend_train_val("healthy")
    run = run_from_frame(frame.filter((pl.col("metric") != "val_loss") | (pl.col("step") <= 1000)))
    assert TrainValDetector().detect(Evidence(run)) == []
    assert any("only 4 val" in n and "need 5" in n for n in run.notes), run.notes


def _steady_gap_run(seed: int, accelerate: bool) -> object:
    """12,000 steps; val every 250. The gap widens 0.01 per 1,000 steps, about twice its noise
    per window (val noise 0.004, train noise 0.02 a step); with accelerate, 0.07 per 1,000
    from step 7,000 on."""
    from synthetic import long_frame

    rng = np.random.default_rng(seed)
    s = np.arange(1, 12_001)
    loss = 2.0 + 2.0 * np.exp(-s / 2500) + 0.02 * rng.standard_normal(len(s))
    vs = s[s % 250 == 0]
    gap = 0.05 + 1e-5 * vs + (np.where(vs < 7000, 0.0, 6e-5 * (vs - 7000)) if accelerate else 0)
    val = 2.0 + 2.0 * np.exp(-vs / 2500) + gap + 0.004 * rng.standard_normal(len(vs))
    return run_from_frame(long_frame({"train/loss": (s, loss), "val/loss": (vs, val)}))


def test_a_gap_widening_at_a_steady_pace_is_rarely_called_accelerating() -> None:
    """At a steady pace near the noise floor the ratio of two one-window growths crosses 1.5x
    by noise alone: 25 of these 30 seeded runs drew a gap_acceleration warning. The faster pace
    must now hold in the window after detection against the pace over the two windows before,
    past the 1.5x line by a tenth of the growth's noise floor (6 of 30 still did, 8 without
    that margin), and the lines fitted through every gap reading before and after must show
    it too, by half a standard error (2 of 30: seeds 0 and 5). The same runs with a real
    bend at step 7,000 all have it found, dated between 5,000 and 7,250 (a noise crossing
    at 3,250 in seed 7 had been extended through the bend and dated 3,750 steps early)."""
    alarms = [
        seed
        for seed in range(30)
        if any(
            f.kind is FindingKind.GAP_ACCELERATION
            for f in TrainValDetector().detect(Evidence(_steady_gap_run(seed, False)))
        )
    ]
    assert len(alarms) <= 2, alarms
    misdated = []
    for seed in range(30):
        found = TrainValDetector().detect(Evidence(_steady_gap_run(seed, True)))
        spans = [
            (f.start_step, f.end_step or f.start_step)
            for f in found
            if f.kind is FindingKind.GAP_ACCELERATION
        ]
        assert any(a <= 7250 <= b for a, b in spans), (seed, spans)  # the bend is found
        if not any(5000 <= a <= 7250 for a, _ in spans):
            misdated.append((seed, spans))
    assert misdated == [], misdated


def _bent_gap_run(seed: int, extra: float) -> object:
    """_steady_gap_run's widening, ``extra`` per step faster from step 7,000 on."""
    from synthetic import long_frame

    rng = np.random.default_rng(seed)
    s = np.arange(1, 12_001)
    loss = 2.0 + 2.0 * np.exp(-s / 2500) + 0.02 * rng.standard_normal(len(s))
    vs = s[s % 250 == 0]
    gap = 0.05 + 1e-5 * vs + np.where(vs < 7000, 0.0, extra * (vs - 7000))
    val = 2.0 + 2.0 * np.exp(-vs / 2500) + gap + 0.004 * rng.standard_normal(len(vs))
    return run_from_frame(long_frame({"train/loss": (s, loss), "val/loss": (vs, val)}))


def test_a_gap_bending_to_three_times_its_pace_is_found() -> None:
    """The pace test above must not cost the detector its real bends: a widening that turns
    three times as fast at step 7,000 (0.03 per 1,000 steps against 0.01, near the noise) is
    found between 7,000 and 9,500 in 19 of 20 seeds, as before that test; seed 4 is missed
    by both. (At twice the pace, a weaker bend than this test asks about, 11 of these 20 are
    found, 13 before.)"""
    missed = []
    for seed in range(20):
        found = TrainValDetector().detect(Evidence(_bent_gap_run(seed, 2e-5)))
        spans = [
            (f.start_step, f.end_step or f.start_step)
            for f in found
            if f.kind is FindingKind.GAP_ACCELERATION
        ]
        if not any(b >= 7000 and a <= 9500 for a, b in spans):
            missed.append(seed)
    assert missed == [4], missed


def _flat_train_rising_val():  # noqa: ANN202
    """Train flat at 1.9 (1% noise), val falling 2.3 -> 2.0 until step 6,000, then rising."""
    from synthetic import _constant_lr, long_frame

    rng = np.random.default_rng(0)
    steps, vs = np.arange(0, 12000, 10), np.arange(250, 12001, 250)
    train = 1.9 * np.exp(rng.normal(0, 0.01, len(steps)))
    val = np.where(vs < 6000, 2.3 - 0.3 * vs / 6000, 2.0 + 0.1 * (vs - 6000) / 6000)
    val = val + rng.normal(0, 0.003, len(vs))
    series = {"loss": (steps, train), "val_loss": (vs, val), "lr": (steps, _constant_lr(steps))}
    return run_from_frame(long_frame(series))


def test_overfitting_card_with_a_flat_train_loss():
    """The card said "The training and validation curves slope in opposite directions." under
    a sentence that read "while the train loss did not rise (+0.1%)": the train loss was flat."""
    diag = analyze_run(_flat_train_rising_val())
    (o,) = [f for f in diag.findings if f.kind is FindingKind.OVERFITTING]
    assert o.measures["train_change_pct"] >= 0
    (text,) = card_texts(diag, "overfitting")
    assert "opposite directions" not in text, text
    assert (
        f"The validation loss rose while the training loss held "
        f"({o.measures['train_change_pct']:+.1f}%)" in text
    ), text


def test_overfitting_card_with_a_falling_train_loss():
    frame, _ = trend_train_val("overfit", seed=0)
    diag = analyze_run(run_from_frame(frame))
    (o,) = [f for f in diag.findings if f.kind is FindingKind.OVERFITTING]
    (text,) = card_texts(diag, "overfitting")
    assert (
        "The training and validation curves slope in opposite directions: the training loss "
        f"fell ({o.measures['train_change_pct']:+.1f}%) while the validation loss rose" in text
    ), text


@pytest.mark.parametrize("case", ["accelerate", "overfit"])
def test_gap_card_says_whether_val_had_turned_up(case: str):
    """The card said the finding "comes before the validation loss turns upward" also when
    its own sentence read "val loss is rising too" (overfitting at 7,000: the gap's
    acceleration was confirmed with the val loss already up)."""
    frame, _ = trend_train_val(case, seed=0)
    diag = analyze_run(run_from_frame(frame))
    (g,) = [f for f in diag.findings if f.kind is FindingKind.GAP_ACCELERATION]
    (text,) = card_texts(diag, "gap_acceleration")
    if g.measures["val_turned_up"]:
        assert "comes before the validation loss turns upward" not in text, text
        assert "the validation loss was rising already when it was confirmed" in text, text
    else:
        assert (
            "usually comes before the validation loss turns upward; it had not turned up when "
            "this was confirmed" in text
        ), text
    assert g.measures["val_turned_up"] is (case == "overfit")
