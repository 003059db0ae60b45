"""Every number right, and one rule per severity (issue 12), each on the sample run or real log
that showed the problem.

Spikes, NaN, param norm, periodicity, the phase checklists and coverage, and a run that never
learned. The numbers a summary states are checked against the series themselves.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_path
from synthetic import long_frame, run_from_frame

from forensics.detectors.no_learning import NoLearningDetector
from forensics.detectors.periodic import PeriodicSpikeDetector
from forensics.diagnosis import Diagnosis
from forensics.evidence import Evidence
from forensics.findings import Finding, FindingKind, Severity
from forensics.pipeline import analyze_run, read_run
from forensics.schema import LOSS, PARAM_NORM

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_runs"


@cache
def _diag(name: str) -> Diagnosis:
    return analyze_run(read_run(SAMPLES / name))


def _of(diag: Diagnosis, kind: str) -> list[Finding]:
    return [f for f in diag.findings if f.kind == kind]


def _numbers(text: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*\.?\d*", text)]


# -- nan: the range and the text state the real extent -----------------------------------------
def test_nan_states_its_real_extent() -> None:
    """sample_runs/nan: the loss is NaN from 637 to the end (one finite value at 641); the
    finding used to say "for 4 logged points" (637-640) while counting 363 bad points."""
    diag = _diag("nan")
    (f,) = _of(diag, "nan_inf")
    logged = diag.evidence.logged(LOSS)
    bad = ~np.isfinite(logged.values)
    last_bad = int(logged.steps[bad][-1])
    assert f.start_step == int(logged.steps[bad][0]) == 637
    assert f.end_step == last_bad == 1000 and f.measures["last_bad_step"] == last_bad
    assert f.measures["bad_points"] == int(bad.sum()) == 363
    in_span = (logged.steps >= 637) & (logged.steps <= 1000)
    finite = logged.steps[in_span & ~bad]
    assert list(finite) == [641]
    assert "to the end of the log (step 1,000)" in f.summary
    assert f"{int(bad[in_span].sum())} of the {int(in_span.sum())} logged points" in f.summary
    assert "finite only at step 641" in f.summary
    assert "for 4 logged points" not in f.summary


# -- param norm: the level it settled at -------------------------------------------------------
def test_param_norm_jump_states_the_level_it_settled_at() -> None:
    """sample_runs/param_norm_jump: 42.7 at step 499, 99.8 at 509, near 100 afterwards; the
    finding said "to 76.35 at step 506, the new level held"."""
    diag = _diag("param_norm_jump")
    (f,) = _of(diag, "param_norm_jump")
    s = diag.evidence.series(PARAM_NORM)
    at = dict(zip(s.steps.tolist(), s.values.tolist(), strict=True))
    later = s.values[(s.steps >= 509) & (s.steps <= 600)]
    assert f.measures["before"] == pytest.approx(at[499])
    assert f.measures["after"] == pytest.approx(float(np.median(later)), rel=0.01)
    assert 99 < f.measures["after"] < 102
    assert f"from {at[499]:.4g} to {at[509]:.4g} over steps 500-509" in f.summary
    assert f"settled at {f.measures['after']:.4g}" in f.summary
    assert "76.35" not in f.summary or "largest" in f.summary


# -- periodic: a match is a real match ----------------------------------------------------------
def test_period_125_does_not_match_an_eval_interval_of_40() -> None:
    """sample_runs/periodic_spikes: spikes every 125 steps, evals every 40: 125 is not a small
    multiple of 40 in phase (the finding said "matches the eval interval (40 steps, x3)")."""
    (f,) = _of(_diag("periodic_spikes"), "periodic_spikes")
    assert f.measures["period_steps"] == 125 and f.measures["count"] == 8
    assert f.measures["matches"] is None and f.measures["multiple"] is None
    assert "matches the eval interval" not in f.summary
    assert "no interval the log shows matches it (eval interval 40 steps)" in f.summary


def _periodic_run(onsets: list[int], eval_every: int, eval_origin: int = 0) -> Evidence:
    s = np.arange(0, 4000)
    rng = np.random.default_rng(0)
    loss = 2 + 3 / (1 + s / 300) + rng.normal(0, 0.01, len(s))
    for o in onsets:
        loss[o] *= 3.0
    ev_steps = np.arange(eval_origin or eval_every, 4000, eval_every)
    return Evidence(
        run_from_frame(
            long_frame({"loss": (s, loss), "val_loss": (ev_steps, 2 + 3 / (1 + ev_steps / 300))})
        )
    )


def test_a_period_matches_only_in_phase_and_at_a_small_multiple() -> None:
    """Spikes every 600 steps: on the grid of evals every 200 steps (x3) they match; shifted by
    70 steps off that grid, or against evals every 50 (x12), they do not."""
    on_grid = [600, 1200, 1800, 2400, 3000, 3600]
    (f,) = PeriodicSpikeDetector().detect(_periodic_run(on_grid, 200))
    assert f.measures["matches"] == "eval_interval" and f.measures["multiple"] == 3
    assert "in phase" in f.summary
    (g,) = PeriodicSpikeDetector().detect(_periodic_run([o + 70 for o in on_grid], 200))
    assert g.measures["matches"] is None
    (h,) = PeriodicSpikeDetector().detect(_periodic_run(on_grid, 50))
    assert h.measures["matches"] is None


# -- one rule per severity ---------------------------------------------------------------------
SPIKE_SAMPLES = ["bad_batch", "periodic_spikes", "param_norm_jump", "nan", "divergence", "healthy"]


@pytest.mark.parametrize("name", SPIKE_SAMPLES)
def test_grad_norm_spike_severity_is_the_one_its_text_announces(name: str) -> None:
    """Over the critical line is critical when the text prints the 2x / 3x lines; a transient
    judged by its recovery says so and does not print them as if they applied."""
    for f in _of(_diag(name), "grad_norm_spike"):
        by = f.measures["judged_by"]
        r = f.measures["ratio_to_run_baseline"] or f.measures["height_ratio"]
        if "warning from 2x, critical from 3x" in f.summary:
            assert by in ("band", "unresolved"), f.summary
            want = Severity.CRITICAL if r >= 3 else Severity.WARNING if r >= 2 else Severity.INFO
            assert f.severity == want or (by == "unresolved" and want == Severity.CRITICAL)
        if by == "band":
            assert "warning from 2x, critical from 3x" in f.summary
        if by == "recovery":
            assert "judged by its recovery" in f.summary
            assert f.severity is (
                Severity.WARNING if f.measures["loss_response"] else Severity.INFO
            )


def test_a_spike_at_the_last_logged_step_is_unresolved_and_at_most_a_warning() -> None:
    """sample_runs/periodic_spikes: a grad-norm spike at step 1000, the last logged step, was
    "not back on its trend" and made the verdict CRITICAL."""
    diag = _diag("periodic_spikes")
    last = [f for f in _of(diag, "grad_norm_spike") if f.peak_step == 1000]
    (f,) = last
    assert f.measures["steps_logged_after_peak"] == 0
    assert f.measures["judged_by"] == "unresolved" and f.severity is Severity.WARNING
    assert "unresolved" in f.summary and "not back on its trend" not in f.summary
    assert diag.verdict == "warning"


def test_spikes_inside_a_divergence_are_part_of_it() -> None:
    """sample_runs/divergence: spikes of 641.8 and 824 at steps 929 and 964 were called
    "physiological, no action" inside a fatal divergence from step 446."""
    diag = _diag("divergence")
    (div,) = _of(diag, "divergence")
    inside = [
        f
        for f in diag.findings
        if f.kind in ("loss_spike", "grad_norm_spike") and f.start_step >= div.start_step
    ]
    assert {f.peak_step for f in inside} >= {929, 964}
    for f in inside:
        assert f.measures["classification"] == "diverged", f.summary
        assert f.measures["divergence_from"] == div.start_step
        assert f.severity is Severity.INFO
        assert "physiological" not in f.summary and "part of it" in f.summary
    assert diag.verdict == "fatal"
    assert not _of(diag, "no_learning")  # it learned (to 1.9), then diverged


def test_the_healthy_sample_has_nothing_above_info() -> None:
    diag = _diag("healthy")
    assert all(f.severity is Severity.INFO for f in diag.findings), [
        f.summary for f in diag.findings if f.severity is not Severity.INFO
    ]


# -- checklists: phases and coverage -----------------------------------------------------------
@pytest.mark.parametrize("name", ["healthy", "divergence"])
def test_short_runs_have_ordered_non_overlapping_phases(name: str) -> None:
    """Runs under 2,000 steps: "Middle (steps 1,000-500)" and overlapping phases before."""
    diag = _diag(name)
    bounds = [(p.start, p.end) for p in diag.phases]
    assert bounds[0][0] == diag.run.first_step and bounds[-1][1] == diag.run.last_step
    for (a0, a1), (b0, b1) in zip(bounds, bounds[1:], strict=False):
        assert a0 <= a1 < b0 <= b1 and b0 == a1 + 1
    for p in diag.phases:
        lo, hi = (
            int(x.replace(",", "")) for x in re.findall(r"steps ([\d,]+)-([\d,]+)", p.title)[0]
        )
        assert (lo, hi) == (p.start, p.end), p.title


def test_coverage_never_prints_a_zero_interval() -> None:
    """sample_runs/healthy logs throughput a few times a second: "every 0 s" before."""
    rows = {c.signs: c for c in _diag("healthy").coverage}
    observed = rows["throughput, memory"].observed
    assert "every 0 s" not in observed and " ms" in observed
    wall = _diag("healthy").evidence.logged("throughput").wall_time
    ms = float(np.median(np.diff(wall[np.isfinite(wall)]))) * 1000
    shown = _numbers(observed.split("throughput:")[1].split(";")[0])[0]
    assert shown == pytest.approx(ms, rel=0.01)


def test_divergence_fails_the_late_schedule_item() -> None:
    """The late phase of sample_runs/divergence (loss 3 -> 150) passed "Does the loss decline
    match the learning-rate schedule?"."""
    late = next(p for p in _diag("divergence").phases if p.key == "late")
    item = next(i for i in late.items if "learning-rate schedule" in i.question)
    assert item.status == "fail"


# -- a run that never learned ------------------------------------------------------------------
def test_a_run_that_never_learned_is_a_warning() -> None:
    """Lightning version_7 (real log): the loss sits at 7.6 for 11k steps; it was HEALTHY."""
    run = read_run(
        shared_path("real_runs", "lightning-csv-slm-wikitext103", "lightning_logs", "version_7")
    )
    diag = analyze_run(run)
    (f,) = _of(diag, "no_learning")
    assert f.severity is Severity.WARNING and diag.verdict == "warning"
    s = diag.evidence.series(LOSS)
    k, m = f.measures["start_points"], f.measures["end_points"]
    assert f.measures["loss_start"] == pytest.approx(float(np.median(s.values[:k])))
    assert f.measures["loss_end"] == pytest.approx(float(np.median(s.values[-m:])))
    assert f"{f.measures['loss_start']:.4g} over the first {k:,} logged points" in f.summary
    assert f"{f.measures['loss_end']:.4g} over the last {m:,}" in f.summary
    assert abs(f.measures["fall_pct"]) < 5


@pytest.mark.parametrize(
    "rel",
    [
        "mlperf-training-v3.0-gpt3-175b/NVIDIA/results/dgxh100_n64_nemo/gpt3/result_0.txt",
        "lightning-csv-slm-wikitext103/lightning_logs/version_5",
        "lightning-csv-slm-wikitext103/lightning_logs/version_8",
        "llamafactory-luojiu-7b-qlora-cpt",
    ],
)
def test_runs_that_learn_slowly_or_resume_are_not_no_learning(rel: str) -> None:
    """GPT-3 175B from a checkpoint falls 2% and keeps falling; version_5 is a resume (its
    log starts at step 140,749); both learn."""
    run = read_run(shared_path("real_runs", *rel.split("/")))
    assert NoLearningDetector().detect(Evidence(run)) == []


def test_no_learning_on_synthetic_runs() -> None:
    s = np.arange(0, 5000, 10)
    rng = np.random.default_rng(1)
    flat = 7.6 + rng.normal(0, 0.05, len(s))
    (f,) = NoLearningDetector().detect(Evidence(run_from_frame(long_frame({"loss": (s, flat)}))))
    assert f.kind is FindingKind.NO_LEARNING and f.start_step == 0 and f.end_step == 4990
    learning = 2 + 3 / (1 + s / 300) + rng.normal(0, 0.05, len(s))
    assert (
        NoLearningDetector().detect(Evidence(run_from_frame(long_frame({"loss": (s, learning)}))))
        == []
    )


def test_a_long_run_whose_loss_fell_early_learned() -> None:
    """The 10M-step benchmark run (loss 10 -> 2 within its first 1% of steps, then flat) was
    "The loss never fell": its start was the median of the first 5% of the points, 500,000
    steps, long after the fall. The start window is capped at ``head_max_points``."""
    s = np.arange(0, 200_000, 1)
    rng = np.random.default_rng(2)
    early = 2 + 8 / (1 + s / 40) + rng.normal(0, 0.02, len(s))
    start_5pct = float(np.median(early[: len(s) // 20]))
    assert (start_5pct - float(np.median(early[-len(s) // 10 :]))) / start_5pct < 0.05
    ev = Evidence(run_from_frame(long_frame({"loss": (s, early)})))
    assert NoLearningDetector().detect(ev) == []
    # The cap leaves a flat long run a warning, with the start window's size in its text.
    flat = 7.6 + rng.normal(0, 0.05, len(s))
    (f,) = NoLearningDetector().detect(Evidence(run_from_frame(long_frame({"loss": (s, flat)}))))
    assert f.measures["start_points"] == 1000 and f.measures["end_points"] == 20_000
    assert "over the first 1,000 logged points" in f.summary
    assert "over the last 20,000 (steps 180,000-199,999)" in f.summary


def test_param_norm_surge_before_a_nan_is_reported_with_its_level() -> None:
    """sample_runs/nan: the param norm climbs from about 40 at step 500 to 399 at step 650;
    the only param-norm finding was a "jump" of 2% at step 641 (the weights freeze there)."""
    diag = _diag("nan")
    (f,) = _of(diag, "param_norm_jump")
    s = diag.evidence.series(PARAM_NORM)
    base = f.measures["baseline"]
    assert 500 <= f.start_step <= 560 and f.measures["crossing_step"] == 560
    assert float(s.values[s.steps == 560][0]) >= 1.5 * base > float(s.values[s.steps == 559][0])
    assert f.measures["ratio"] == pytest.approx(float(np.median(s.values[-20:])) / base, rel=0.01)
    assert f"now {f.measures['ratio']:.2f}x" in f.summary


def test_divergence_says_its_peak_is_the_smoothed_curves() -> None:
    """sample_runs/divergence: "the loss rose from 2.169 to 1154" beside a chart whose raw loss
    reaches 1,492 at step 1,016 (1154 is the smoothed curve's top). The sentence says which
    curve its numbers are on and gives the highest logged value with its step."""
    diag = _diag("divergence")
    (div,) = _of(diag, "divergence")
    loss = diag.run.series(LOSS)
    seg = loss.filter((loss["step"] >= div.start_step) & (loss["step"] <= div.end_step))
    top = int(np.argmax(seg["value"].to_numpy()))
    raw, at = float(seg["value"][top]), int(seg["step"][top])
    assert (round(raw), at) == (1492, 1016)
    # (thousands grouped, as the steps beside them are)
    assert "the smoothed loss rose from 2.169 to 1,154" in div.summary
    assert f"(highest logged value {raw:,.0f} at step {at:,})" in div.summary


@pytest.mark.parametrize(
    "tag, level, expect",
    [
        ("train/tokens_per_sec", 3.2e4, "median 32,000 tokens/s, no drop"),
        ("throughput", 12.5, "median 12.5 tokens/s (tokens/s assumed: the log states no unit)"),
        ("throughput", 0.0, None),
    ],
)
def test_the_throughput_checklist_states_its_unit_and_never_passes_zero(
    tag: str, level: float, expect: str | None
) -> None:
    """The start-up checklist said "median 0 tokens/s, no drop or stall: pass" for a throughput
    logged as 0 on every line (LLaMA-Factory's placeholder), and called every rate tokens/s
    whatever the log's name said. A zero level is not measurable; an unstated unit says it is
    assumed, as the throughput finding does."""
    from forensics.diagnosis import diagnose

    steps, loss = np.arange(0, 400), 2.0 + 8.0 / (1.0 + np.arange(0, 400) / 40.0)
    frame = long_frame({"loss": (steps, loss), tag: (steps, np.full(400, level))})
    diag = diagnose(Evidence(run_from_frame(frame)), [])
    (item,) = [
        it
        for ph in diag.phases
        if ph.key == "startup"
        for it in ph.items
        if "throughput" in it.question
    ]
    if expect is None:
        assert item.status == "not measurable" and "placeholder" in item.evidence
    else:
        assert item.status == "pass" and item.evidence.startswith(expect), item.evidence


def test_an_astronomical_value_is_written_in_scientific_notation(tmp_path: Path) -> None:
    """A loss logged once as 1e30 (an overflow the next step did not keep) read "Loss spike at
    step 1,500: 1,000,000,000,000,000,019,884,624,838,656 against a local baseline of 2.748
    (363868546842641843227419738112.00x)"; values from 1e12 on are now written as 1e+30."""
    import json

    from forensics.evidence.trend_utils import num, times

    assert (num(1492.0), num(1.23456e9), num(1e30), num(-3e15)) == (
        "1,492",
        "1,234,560,000",
        "1e+30",
        "-3e+15",
    )
    assert (times(1634.2), times(3.6e29)) == ("1,634", "3.6e+29")
    rng = np.random.default_rng(30)
    n = 3000
    loss = 2 + 3 / (1 + np.arange(n) / 500) + rng.normal(0, 0.02, n)
    loss[1500] = 1e30
    rows = [json.dumps({"step": i, "loss": loss[i], "lr": 3e-4}) for i in range(n)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    d = analyze_run(read_run(tmp_path))
    (f,) = [f for f in d.findings if f.kind is FindingKind.LOSS_SPIKE and f.peak_step == 1500]
    assert f.summary.startswith("Loss spike at step 1,500: 1e+30 against a local baseline of ")
    assert re.search(r"\(\d\.\d+e\+29x\)", f.summary), f.summary
