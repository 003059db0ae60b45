"""grad_norm_drift and eval_regression on seeded synthetic runs with injected ground truth
(issue 7)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from report_text import card_texts
from synthetic import run_from_frame, trend_eval_regression, trend_grad_norm_drift

from forensics.detectors import detect, params_for
from forensics.detectors.drift import GradNormDriftDetector
from forensics.detectors.eval_regression import EvalRegressionDetector
from forensics.evidence import Evidence
from forensics.findings import FindingKind, Severity
from forensics.importers import read_run
from forensics.params import resolve
from forensics.pipeline import analyze_run

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_drift_article_case_onset_and_ratio(seed: int) -> None:
    """The article's case (0.8 -> 2.5 from step 6500, loss falling) is found with its onset and
    ratio."""
    frame, truth = trend_grad_norm_drift(seed=seed)
    (f,) = GradNormDriftDetector().detect(Evidence(run_from_frame(frame)))
    assert f.kind is FindingKind.GRAD_NORM_DRIFT and f.metric == "grad_norm"
    assert abs(f.start_step - truth["onset"]) <= 500
    assert f.measures["baseline"] == pytest.approx(truth["baseline"], rel=0.1)
    assert f.measures["ratio"] == pytest.approx(truth["ratio"], rel=0.15)
    assert f.measures["loss_slope_per_1k_steps"] < 0
    assert f.measures["warning_step"] > f.start_step
    # The level now is the median of the last 2% of the points the despike keeps (at least
    # 5), and the sentence says of how many.
    gn = Evidence(run_from_frame(frame)).series("grad_norm")
    n = f.measures["current_points"]
    after = int(np.count_nonzero(gn.steps >= f.measures["baseline_start_step"]))
    assert max(5, int(0.02 * (after - f.measures["spikes_excluded"]))) == n
    assert np.min(gn.values[-2 * n :]) <= f.measures["current"] <= np.max(gn.values[-2 * n :])
    assert f"the median of its last {n:,} points, spikes left out" in f.summary


@pytest.mark.parametrize(
    ("end", "severity"),
    [
        (1.8, Severity.WARNING),
        (2.2, Severity.WARNING),
        (2.8, Severity.CRITICAL),
        (3.5, Severity.CRITICAL),
    ],
)
def test_drift_severity_follows_ratio(end: float, severity: Severity) -> None:
    """Warning from 2x the baseline, critical from 3x (article 6.3)."""
    frame, _ = trend_grad_norm_drift(end=end, seed=1)
    (f,) = GradNormDriftDetector().detect(Evidence(run_from_frame(frame)))
    assert f.severity is severity


@pytest.mark.parametrize("onset", [2000, 4000, 8000])
def test_drift_onset_tracks_injection(onset: int) -> None:
    """The reported start is the onset of the climb, not the step where 2x was crossed."""
    frame, truth = trend_grad_norm_drift(onset=onset, end=2.4, seed=2)
    (f,) = GradNormDriftDetector().detect(Evidence(run_from_frame(frame)))
    assert abs(f.start_step - onset) <= 0.05 * 10000
    assert f.start_step < f.measures["warning_step"]


def test_drift_quiet_below_twice_baseline() -> None:
    """A mild climb (1.6x) is not a drift finding."""
    frame, _ = trend_grad_norm_drift(end=1.3, seed=0)
    assert GradNormDriftDetector().detect(Evidence(run_from_frame(frame))) == []


def test_drift_left_to_divergence_when_loss_rises() -> None:
    """Grad norm and loss climbing together is divergence territory, not a drift."""
    frame, _ = trend_grad_norm_drift(loss_rises=True)
    assert GradNormDriftDetector().detect(Evidence(run_from_frame(frame))) == []


def test_drift_ignores_isolated_spikes() -> None:
    """Dozens of single-step spikes on a flat grad norm are not a drift."""
    frame, _ = trend_grad_norm_drift(end=0.8, spikes=60, seed=4)
    assert GradNormDriftDetector().detect(Evidence(run_from_frame(frame))) == []


def test_drift_thresholds_are_parameters() -> None:
    """A stricter configured warn ratio silences a 2.25x drift, whether it reaches the detector
    through the configuration (the evidence's band) or through the detector's own parameters."""
    frame, _ = trend_grad_norm_drift(end=1.8, seed=1)
    stricter = {"grad_norm_drift": {"warn_ratio": 2.5, "crit_ratio": 4.0}}
    assert [f.kind for f in detect(run_from_frame(frame))].count(FindingKind.GRAD_NORM_DRIFT) == 1
    assert FindingKind.GRAD_NORM_DRIFT not in [
        f.kind for f in detect(run_from_frame(frame), stricter)
    ]
    params = resolve(stricter)
    run = run_from_frame(frame)
    assert GradNormDriftDetector(params.grad_norm_drift).detect(Evidence(run, params)) == []
    own = params_for(GradNormDriftDetector, stricter["grad_norm_drift"])
    assert GradNormDriftDetector(own).detect(Evidence(run)) == []
    (f,) = GradNormDriftDetector().detect(Evidence(run, params))  # the detector's own: defaults
    assert f.judged_against["warn_ratio"] == 2.0


def test_drift_judged_against_the_evidence_band() -> None:
    """The finding states the band of the evidence (configured window and ratios): the numbers
    the report's chart draws."""
    frame, _ = trend_grad_norm_drift(seed=0)
    params = resolve({"grad_norm_drift": {"baseline_window": 300, "warn_ratio": 1.8}})
    ev = Evidence(run_from_frame(frame), params)
    (f,) = GradNormDriftDetector(params.grad_norm_drift).detect(ev)
    band = ev.grad_norm_band
    assert band is not None and band.warn_ratio == 1.8
    assert f.judged_against["baseline"] == f.measures["baseline"] == band.baseline.value
    assert f.judged_against["warn_at"] == band.warn_at
    assert f.judged_against["critical_at"] == band.critical_at
    assert f.judged_against["baseline_end_step"] - f.judged_against["baseline_start_step"] < 300
    assert ev.drift is ev.drift  # computed once, shared with eval_regression


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_eval_regression_article_case(seed: int) -> None:
    """A benchmark losing ~3 points after step 6000 while the loss falls: warning, onset at the
    best eval."""
    frame, truth = trend_eval_regression(seed=seed)
    (f,) = EvalRegressionDetector().detect(Evidence(run_from_frame(frame)))
    assert f.kind is FindingKind.EVAL_REGRESSION and f.metric == "eval/benchmark"
    assert f.severity is Severity.WARNING
    assert abs(f.start_step - truth["best"]) <= 500
    assert f.measures["direction"] == "higher_is_better"
    assert 1.5 < f.measures["drop"] < 4.0
    assert f.measures["loss_change_pct"] < 0
    assert f.measures["grad_norm_drift"] is False


def test_eval_regression_critical_with_drift() -> None:
    """When a grad-norm drift overlaps the regression, the finding is critical."""
    frame, _ = trend_eval_regression(with_drift=True)
    (f,) = EvalRegressionDetector().detect(Evidence(run_from_frame(frame)))
    assert f.severity is Severity.CRITICAL and f.measures["grad_norm_drift"] is True


def test_eval_regression_lower_is_better() -> None:
    """WER going up is a regression: the direction comes from the metric name."""
    frame, truth = trend_eval_regression(lower_better=True, name="eval/wer")
    (f,) = EvalRegressionDetector().detect(Evidence(run_from_frame(frame)))
    assert f.metric == "eval/wer" and f.measures["direction"] == "lower_is_better"
    assert f.measures["current"] > f.measures["best"]
    assert abs(f.start_step - truth["best"]) <= 500


@pytest.mark.parametrize("drop", [0.0, -3.0])
def test_eval_regression_quiet_when_eval_holds_or_improves(drop: float) -> None:
    """An eval that holds or keeps improving is not flagged."""
    frame, _ = trend_eval_regression(drop=drop)
    assert EvalRegressionDetector().detect(Evidence(run_from_frame(frame))) == []


def test_drift_found_when_no_warmup_is_logged() -> None:
    """The article's case (0.8 -> 2.5 from step 6500) in a log without an LR series: the grad
    norm's start-up decay must not inflate the baseline and hide the drift (found in review)."""
    import numpy as np
    from synthetic import long_frame, run_from_frame

    from forensics.detectors.drift import GradNormDriftDetector

    rng = np.random.default_rng(0)
    s = np.arange(0, 10_000, 10)
    gn = (0.8 + 3 * np.exp(-s / 200) + np.where(s >= 6500, (s - 6500) / 3500 * 1.7, 0)) * np.exp(
        rng.normal(0, 0.05, len(s))
    )
    loss = (2 + 5 / (1 + s / 200) ** 0.6) * np.exp(rng.normal(0, 0.01, len(s)))
    run = run_from_frame(long_frame({"loss": (s, loss), "grad_norm": (s, gn)}))
    (f,) = GradNormDriftDetector().detect(Evidence(run))
    assert abs(f.start_step - 6500) <= 500
    assert f.measures["baseline"] == pytest.approx(0.8, rel=0.1)
    assert f.measures["ratio"] >= 2.5


def test_drift_onset_is_not_the_start_up_transient() -> None:
    """A start-up decay above 2x the baseline, then a climb from step 3000: the onset is the
    climb."""
    import numpy as np
    from synthetic import long_frame, run_from_frame

    from forensics.detectors.drift import GradNormDriftDetector

    rng = np.random.default_rng(1)
    s = np.arange(6000)
    gn = (0.6 + 2 * np.exp(-s / 150) + np.where(s >= 3000, (s - 3000) / 3000 * 1.6, 0)) * np.exp(
        rng.normal(0, 0.05, len(s))
    )
    loss = (2 + 5 / (1 + s / 200) ** 0.6) * np.exp(rng.normal(0, 0.01, len(s)))
    run = run_from_frame(long_frame({"loss": (s, loss), "grad_norm": (s, gn)}))
    (f,) = GradNormDriftDetector().detect(Evidence(run))
    assert abs(f.start_step - 3000) <= 400, f.start_step
    assert (
        f.measures["ratio"] >= 3.0 and f.severity is Severity.CRITICAL
    )  # 2.2 / 0.6: the article's orange light


def test_eval_regression_judged_against() -> None:
    """The eval finding states its best score, the noise and the line a score had to pass."""
    frame, _ = trend_eval_regression(seed=0)
    (f,) = EvalRegressionDetector().detect(Evidence(run_from_frame(frame)))
    j = f.judged_against
    assert j["best"] == f.measures["best"] and j["noise"] == f.measures["noise"]
    assert f.measures["current"] < j["regression_at"] < f.measures["best"]


def test_theil_sen_is_scipys() -> None:
    """The one Theil-Sen gives scipy's numbers (slope, intercept, 90% band with tie corrections),
    and its confidence widens the band."""
    import numpy as np
    from scipy.stats import theilslopes

    from forensics.evidence.trend_utils import theil_sen

    rng = np.random.default_rng(3)
    for k in range(30):
        x = np.sort(rng.integers(0, 40, 60)).astype(float) if k % 2 else np.arange(60.0)
        y = np.round(0.02 * x + rng.normal(size=60), 1)
        ours = theil_sen(x, y, max_points=None)
        ref = theilslopes(y, x, alpha=0.90)
        assert ours is not None
        assert (ours.slope, ours.intercept, ours.low, ours.high) == (
            ref.slope,
            ref.intercept,
            ref.low_slope,
            ref.high_slope,
        )
        wide = theil_sen(x, y, max_points=None, confidence=0.95)
        assert wide is not None and wide.low <= ours.low and wide.high >= ours.high
    assert theil_sen(np.ones(5), np.arange(5.0)) is None


def test_drift_card_rules_out_a_bad_batch_not_the_data():
    """The card read "the data is an unlikely cause (bad batches make spikes that fall
    back)": what a steady climb rules out is a bad batch. Alone, it points at the optimizer."""
    frame, _ = trend_grad_norm_drift(seed=0)
    diag = analyze_run(run_from_frame(frame))
    (text,) = card_texts(diag, "grad_norm_drift")
    assert "the data is an unlikely cause" not in text, text
    assert (
        "A steady climb, not a spike: a bad batch is an unlikely cause (bad batches make spikes "
        "that fall back). Look at the optimizer, then the layers." in text
    ), text


def test_drift_card_beside_a_widening_gap_names_memorization_as_a_hypothesis():
    """multi_eval_sets: 12 of 16 rows of each batch come from 2 KB of text; the model memorizes
    it, the gap to the held-out idlelib loss widens faster from step 200 and the grad norm
    climbs from 220, in one incident. The card told the reader the data was an unlikely cause;
    it now points at the gap in the same incident, as a hypothesis."""
    diag = analyze_run(read_run(SAMPLES / "multi_eval_sets"))
    (drift,) = [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_DRIFT]
    (gap,) = [
        f
        for f in diag.incident_of(drift).findings
        if f.kind is FindingKind.GAP_ACCELERATION and f.severity is not Severity.INFO
    ]
    (text,) = card_texts(diag, "grad_norm_drift")
    assert "the data is an unlikely cause" not in text, text
    assert (
        f"In the same incident the gap to the held-out loss ({gap.metric}) widens faster from "
        f"step {gap.start_step:,}: a model memorizing part of its training data may be what "
        "drives the climb (a hypothesis), so check the data mix as well as the optimizer and "
        "the layers." in text
    ), text
    # The drift's data check said "Rule out the data" for the same reason.
    checks = [c.text for inv in diag.investigation for c, _ in inv.checks]
    assert not [c for c in checks if c.startswith("Rule out the data")], checks
    assert any(c.startswith("Rule out a bad batch") and "memorizing" in c for c in checks), checks


def test_drift_without_lr_names_the_configured_lines():
    """With no LR logged the sentence and the run note said "judged on the plain 2x / 3x
    lines" also when the lines were configured elsewhere (here at 2x / 4x)."""
    import polars as pl

    frame, _ = trend_grad_norm_drift(seed=0)
    frame = frame.filter(pl.col("tag") != "lr")
    run = run_from_frame(frame)
    ev = Evidence(run, resolve({"grad_norm_drift": {"crit_ratio": 4.0}}))
    (f,) = [f for f in detect(run, ev.params, evidence=ev) if f.kind is FindingKind.GRAD_NORM_DRIFT]
    assert f.measures["lr_logged"] is False
    assert "judged on the plain 2x / 4x lines." in f.summary, f.summary
    assert any("judged on the plain 2x / 4x lines" in n for n in run.notes), run.notes


def _climbing_together(up: float = 0.7):  # noqa: ANN202
    """Grad norm climbing to 2.7x its baseline from step 3,000 while the loss, which had been
    falling, turns up by ~9%: under the divergence's lines (10% above its low; the grad norm
    at 2x over the rise or its last third is met, the loss's rise is not)."""
    from synthetic import _constant_lr, long_frame

    rng = np.random.default_rng(0)
    s = np.arange(1, 6001)
    g = 0.6 + 0.3 * np.exp(-s / 300) + np.abs(rng.normal(0, 0.04, len(s)))
    v = 2.0 + 6.0 / (1 + s / 300) ** 0.7 + rng.normal(0, 0.02, len(s))
    late = s > 3000
    g = np.where(late, g * (1 + (s - 3000) / 1500), g)
    v = np.where(late, v + up * (s - 3000) / 3000, v)
    series = {"loss": (s, v), "grad_norm": (s, g), "lr": (s, _constant_lr(s))}
    return run_from_frame(long_frame(series))


def test_grad_norm_and_loss_climbing_together_under_the_divergence_lines():
    """The drift check left a grad norm at 2.7x to the divergence because the loss rose too,
    and the divergence did not fire (the loss 9% above its low, under its 10%): HEALTHY. With
    no divergence to take it, it is a drift whose sentence says the loss rose with it."""
    diag = analyze_run(_climbing_together())
    assert not [f for f in diag.findings if f.kind is FindingKind.DIVERGENCE]
    (f,) = [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_DRIFT]
    assert f.severity is Severity.WARNING and 2900 <= f.start_step <= 3100
    assert f.measures["loss_rises"] is True and f.measures["loss_change_pct"] > 2
    assert f"while the loss rose with it ({f.measures['loss_change_pct']:+.1f}%)" in f.summary, (
        f.summary
    )
    assert "the prelude to a divergence" in f.summary, f.summary
    assert "healthy" not in diag.verdict.lower()


def _article_case_jsonl(path, seed: int = 1):  # noqa: ANN001, ANN202
    """The article's section 3 case as a JSONL log: a fixed LR after a 500-step warm-up, the
    loss falling smoothly, a benchmark that has held at 62 since early on and loses three
    points from step 6,000 to 8,000 (and on), and the grad norm climbing from 0.8 to 2.5 from
    step 6,500."""
    import json

    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    with (path / "metrics.jsonl").open("w") as fh:
        for s in range(1, 9001):
            g = 0.8 if s < 6500 else min(2.5, 0.8 + 1.7 * (s - 6500) / 1500)
            row = {
                "step": s,
                "train/loss": 1.6 + 0.8 * np.exp(-s / 3000) + 0.02 * rng.standard_normal(),
                "train/lr": 2e-5 * min(1.0, s / 500),
                "train/grad_norm": g * (1 + 0.05 * rng.standard_normal()),
            }
            if s % 500 == 0:
                acc = 62.0 if s <= 6000 else 62.0 - 3.0 * (s - 6000) / 2000
                row["eval/mmlu_acc"] = acc + 0.3 * rng.standard_normal()
            fh.write(json.dumps(row) + "\n")
    return path


def test_an_eval_that_held_flat_regresses_from_where_it_turned(tmp_path) -> None:  # noqa: ANN001
    """The benchmark held at 62 (noise 0.3) from early on and turned down after step 6,000.
    The regression's onset was its best smoothed eval, a noise peak at step 3,000: "slipped
    from 62.02 around step 3,000", 3,500 steps before the grad norm began to climb, and the
    two became separate incidents with no cause. The onset is now the last eval still at its
    best level; the drift joins it, as in the article."""
    from forensics.pipeline import analyze

    d = analyze(_article_case_jsonl(tmp_path / "run"))
    (f,) = [g for g in d.findings if g.kind is FindingKind.EVAL_REGRESSION]
    assert f.start_step == 6_000, f.summary
    assert f.measures["best_step"] <= 6_000
    assert "held near its best" in f.summary and "until step 6,000" in f.summary, f.summary
    assert f.severity is Severity.CRITICAL and f.measures["grad_norm_drift"] is True
    (inc,) = [i for i in d.incidents if any(g is f for g in i.findings)]
    assert any(g.kind is FindingKind.GRAD_NORM_DRIFT for g in inc.findings)


def test_the_article_case_names_the_grad_norm_climb_as_its_cause(tmp_path) -> None:  # noqa: ANN001
    """The benchmark turned down after step 6,000 (its onset known to 5,500-6,500 on evals every
    500 steps) and the grad norm began its climb at 6,514 (6,471-6,557): the log cannot put the
    climb after the turn. The climb cause read "contradicted: the grad-norm drift the log shows
    is not going on at step 6,000"; it is supported, and says the two onsets overlap."""
    from forensics.causes import SUPPORTED, find_causes
    from forensics.pipeline import analyze

    d = analyze(_article_case_jsonl(tmp_path / "run"))
    (f,) = [g for g in d.findings if g.kind is FindingKind.EVAL_REGRESSION]
    (c,) = [c for c in find_causes(d.ev, f, d.findings) if c.cause == "grad_norm_climb"]
    assert c.status == SUPPORTED, c.evidence
    assert c.evidence.startswith("the grad norm has been climbing since step 6,514"), c.evidence
    assert "cannot put it after this onset" in c.evidence


def test_two_onsets_whose_ranges_overlap_are_not_put_in_order(tmp_path) -> None:  # noqa: ANN001
    """The benchmark's onset lies anywhere in 5,500-6,500, the grad norm's in about 6,470-6,560:
    neither onset lies in the other's range, but the ranges overlap, so the log cannot tell
    which moved first. It read "The eval mmlu_acc moved first ...; then the gradient norm 514
    steps later"."""
    from forensics.pipeline import analyze

    d = analyze(_article_case_jsonl(tmp_path / "run"))
    (drift,) = [g for g in d.findings if g.kind is FindingKind.GRAD_NORM_DRIFT]
    lo, hi = drift.onset_bounds
    assert drift.start_step > 6_500 and lo <= 6_500  # (neither onset in the other's range)
    text = d.timeline.sentence()
    assert text.startswith("The eval mmlu_acc's onset is the earliest (step 6,000"), text
    assert "the eval mmlu_acc's onset lies anywhere in steps 5,500-6,500" in text, text
    assert f"the gradient norm's onset lies anywhere in steps {lo:,}-{hi:,}" in text, text
    assert text.endswith("the log cannot tell which moved first."), text
