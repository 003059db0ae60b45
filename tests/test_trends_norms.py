"""param_norm_jump, layer_grad_shift and activation_outlier on seeded synthetic runs (issue 7)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest
from synthetic import (
    long_frame,
    run_from_frame,
    trend_activations,
    trend_layer_shift,
    trend_param_norm,
)

from forensics.detectors import params_for
from forensics.detectors.activations import ActivationDetector
from forensics.detectors.layers import LayerGradShiftDetector
from forensics.detectors.param_norm import ParamNormDetector
from forensics.diagnosis import Diagnosis
from forensics.evidence import Evidence
from forensics.findings import FindingKind, Severity
from forensics.params import resolve
from forensics.pipeline import analyze

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"


@cache
def _sample(name: str) -> Diagnosis:
    """One analysis of a bundled sample run, shared by the tests that read it (not changed)."""
    return analyze(SAMPLES / name)


@pytest.mark.parametrize(("jump", "seed"), [(0.08, 0), (0.03, 1), (-0.05, 2)])
def test_param_norm_jump_found_at_its_step(jump: float, seed: int) -> None:
    """An abrupt param-norm change (up or down) is a warning at the injected step."""
    frame, truth = trend_param_norm(jump=jump, seed=seed)
    (f,) = ParamNormDetector().detect(Evidence(run_from_frame(frame)))
    assert f.kind is FindingKind.PARAM_NORM_JUMP and f.severity is Severity.WARNING
    assert f.start_step == truth["jump_at"]
    assert f.measures["abrupt"] is True and f.measures["persistent"] is True
    assert f.measures["change_pct"] == pytest.approx(100 * jump, abs=1.0)


def test_param_norm_steady_growth_is_quiet() -> None:
    """Steady AdamW-like growth below 1.5x the baseline draws nothing."""
    frame, _ = trend_param_norm(jump_at=None, growth=0.3)
    assert ParamNormDetector().detect(Evidence(run_from_frame(frame))) == []


@pytest.mark.parametrize("every", [10, 100])
def test_param_norm_slow_growth_past_limit_is_info(every: int) -> None:
    """Slowly crossing 1.5x the baseline is an info note, not a jump."""
    frame, _ = trend_param_norm(jump_at=None, growth=0.8, every=every)
    (f,) = ParamNormDetector().detect(Evidence(run_from_frame(frame)))
    assert f.severity is Severity.INFO and f.measures["abrupt"] is False
    assert f.measures["ratio"] >= 1.5 and f.measures["crossing_step"] == f.start_step


def test_param_norm_rebuilt_from_layers() -> None:
    """With only per-layer param norms, the total is rebuilt and checked (quiet here)."""
    frame, _ = trend_layer_shift(shift=False)
    run = run_from_frame(frame)
    assert ParamNormDetector().detect(Evidence(run)) == []
    assert not any(n.startswith("param_norm_jump: not run") for n in run.notes)


@pytest.mark.parametrize(
    ("kw", "layers"),
    [
        ({}, "0-3"),
        ({"seed": 5}, "0-3"),
        ({"group": (5, 6), "before": 0.1, "after": 0.3, "onset": 3000}, "5-6"),
        ({"every": 50}, "0-3"),
    ],
)
def test_layer_shift_names_the_group(kw: dict, layers: str) -> None:
    """The article's case (first layers 8% -> 20% of the gradient) is flagged, naming the layers
    and onset."""
    frame, truth = trend_layer_shift(**kw)
    (f,) = LayerGradShiftDetector().detect(Evidence(run_from_frame(frame)))
    assert f.kind is FindingKind.LAYER_GRAD_SHIFT and f.severity is Severity.WARNING
    assert f.measures["layers"] == layers and f.measures["layer"] == truth["group"][0]
    assert f.measures["share_ratio"] >= 2.0
    assert abs(f.start_step - truth["onset"]) <= 1000
    assert f.measures["param_growth_group_pct_per_1k"] > f.measures["param_growth_rest_pct_per_1k"]
    assert layers in f.summary


@pytest.mark.parametrize("kw", [{"shift": False}, {"after": 0.12}])
def test_layer_shift_quiet_without_doubling(kw: dict) -> None:
    """Stable shares, or a share that grows by only half, are not flagged."""
    frame, _ = trend_layer_shift(**kw)
    assert LayerGradShiftDetector().detect(Evidence(run_from_frame(frame))) == []


def test_activation_absmax_names_layer_and_step() -> None:
    """An absmax above 1e4 in one layer is a warning naming that layer and the first step over."""
    frame, truth = trend_activations()
    (f,) = ActivationDetector().detect(Evidence(run_from_frame(frame)))
    assert f.kind is FindingKind.ACTIVATION_OUTLIER and f.metric == "act_absmax"
    assert f.measures["layer"] == truth["absmax_layer"] and f.start_step == truth["absmax_at"]
    assert f.measures["trigger"] == "absmax" and f.measures["value"] > 1e4
    assert f"Layer {truth['absmax_layer']}" in f.summary


def test_activation_std_jump() -> None:
    """A sudden std jump in one layer is flagged at its step, with the ratio."""
    frame, truth = trend_activations(absmax_layer=None, std_layer=2)
    (f,) = ActivationDetector().detect(Evidence(run_from_frame(frame)))
    assert f.metric == "act_std" and f.measures["layer"] == 2 and f.start_step == truth["std_at"]
    assert f.measures["trigger"] == "std_jump" and f.measures["ratio"] > 4


def test_activations_quiet_when_normal() -> None:
    """Activation stats that drift gently draw nothing."""
    frame, _ = trend_activations(absmax_layer=None)
    assert ActivationDetector().detect(Evidence(run_from_frame(frame))) == []


def test_activation_std_growth_from_the_warm_up_is_not_a_jump() -> None:
    """histogram_layers (real torch training, activations from histograms every 10 steps):
    block 0's activation std grows from its initial values over the warm-up (0.10, 0.27, 0.41
    to step 30), then 1.17 at step 40 and on up to about 2, the model leaving its
    initialisation. It was a warning, "4.3x the median of its 3 points before (steps 10-30)":
    the warm-up's points are no level to judge later ones against. The blow-up at step 310 in
    blocks 2 and 3 is still found."""
    from pathlib import Path

    from forensics.importers import read_run

    ev = Evidence(
        read_run(Path(__file__).resolve().parents[1] / "sample_runs" / "histogram_layers")
    )
    std0 = ev.series("act_std", 0)
    assert ev.warmup_end == 30
    assert [round(float(v), 2) for v in std0.values[:4]] == [0.1, 0.27, 0.41, 1.17]
    found = ActivationDetector().detect(ev)
    assert not [f for f in found if f.metric == "act_std" and f.measures["layer"] == 0]
    assert {(f.measures["layer"], f.start_step) for f in found if f.metric == "act_absmax"} == {
        (2, 310),
        (3, 310),
    }


def test_param_norm_judged_against_the_evidence_band() -> None:
    """The param-norm finding states the evidence's band (the line the chart draws), built with
    the configured window and ratio; a lower configured ratio flags an earlier crossing."""
    frame, _ = trend_param_norm(jump_at=None, growth=0.8)
    run = run_from_frame(frame)
    default_ev = Evidence(run)
    (f,) = ParamNormDetector().detect(default_ev)
    band = default_ev.param_norm_band
    assert band is not None and band.warn_ratio == 1.5
    assert f.measures["baseline"] == f.judged_against["baseline"] == band.baseline.value
    assert f.judged_against["warn_at"] == band.warn_at
    params = resolve({"param_norm": {"ratio_limit": 1.3, "baseline_window": 200}})
    ev = Evidence(run, params)
    (g,) = ParamNormDetector(params.param_norm).detect(ev)
    assert ev.param_norm_band is not None
    assert g.judged_against["warn_at"] == ev.param_norm_band.warn_at
    assert g.judged_against["warn_ratio"] == 1.3
    assert g.judged_against["baseline_end_step"] < f.judged_against["baseline_end_step"]
    assert g.measures["crossing_step"] < f.measures["crossing_step"]
    own = ParamNormDetector(params_for(ParamNormDetector, {"ratio_limit": 1.3}))
    assert own.detect(default_ev)[0].judged_against["warn_ratio"] == 1.3


def test_layer_shift_judged_against() -> None:
    """The layer finding states the share it started from and the share it had to reach."""
    frame, _ = trend_layer_shift()
    ev = Evidence(run_from_frame(frame))
    (f,) = LayerGradShiftDetector().detect(ev)
    j = f.judged_against
    assert j["share_before"] == f.measures["share_before"]
    assert j["share_before"] < j["flag_at_share"] <= f.measures["share_after"]
    assert j["early_end_step"] < j["late_start_step"]
    lm = ev.layer_matrix("grad_norm_layer")
    assert lm.values.shape == (len(lm.steps), len(lm.layers)) and len(lm.layers) >= 2


def test_activation_limit_is_the_evidence_limit() -> None:
    """The absmax limit comes from the evidence (configured): a higher limit silences the
    warning. The jump itself (far above its recent level) stays a note under any limit."""
    frame, truth = trend_activations()
    run = run_from_frame(frame)
    (f,) = ActivationDetector().detect(Evidence(run))
    assert f.judged_against["limit"] == f.measures["limit"] == 1e4
    params = resolve({"activations": {"absmax_limit": 1e9}})
    ev = Evidence(run, params)
    assert ev.activation_limit == 1e9
    left = ActivationDetector(params.activations).detect(ev)
    assert all(g.severity is Severity.INFO for g in left), [g.summary for g in left]
    assert all(g.measures["trigger"] == "absmax_jump" for g in left)
    assert all(g.measures["limit"] == 1e9 and "under the 1e+09 line" in g.summary for g in left)


@pytest.mark.parametrize(
    ("group", "after", "severity"),
    [((3,), 0.25, "info"), ((3,), 0.40, "warning"), ((1,), 0.24, "warning")],
)
def test_the_last_block_alone_creeping_up_is_a_note(
    group: tuple[int, ...], after: float, severity: str
) -> None:
    """Issue 12: a healthy cosine run with weight decay (4 blocks) saw the last block go from
    9% to 19% of the squared grad norm, reported as a warning. The deepest block alone is a
    note unless its share triples; a shallower block (the article's pattern) stays a warning."""
    frame, _ = trend_layer_shift(n_layers=4, group=group, before=0.09, after=after)
    (f,) = LayerGradShiftDetector().detect(Evidence(run_from_frame(frame)))
    assert f.severity == severity and f.peak_step >= f.start_step
    assert ("a note" in f.summary) == (severity == "info")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_layer_matrix_is_the_pivot(seed: int) -> None:
    """``layer_matrix`` builds the polars pivot's table (the last value of each step and
    layer, NaN where a layer has none) without the pivot: steps out of order and repeated,
    layers missing at some steps, NaN values, bit for bit."""
    from forensics.evidence.trend_utils import _pivoted, layer_matrix

    rng = np.random.default_rng(seed)
    series: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for i in range(9):
        steps = rng.permutation(np.arange(0, 3000, 10))[: rng.integers(150, 300)]
        steps = np.concatenate([steps, steps[: rng.integers(0, 40)]])  # repeated steps
        values = np.exp(rng.normal(size=len(steps)))
        values[rng.random(len(steps)) < 0.02] = np.nan
        series[f"grad_norm/layers.{i}"] = (steps, values)
    series["loss"] = (np.arange(0, 3000, 10), np.ones(300))
    run = run_from_frame(long_frame(series))
    got = layer_matrix(run, "grad_norm_layer")
    want = _pivoted(run.metric_rows("grad_norm_layer"), run.layers("grad_norm_layer"))
    assert got.layers == want.layers == list(range(9))
    assert np.array_equal(got.steps, want.steps) and got.steps.dtype == want.steps.dtype
    assert np.array_equal(got.values.view(np.int64), want.values.view(np.int64))


@pytest.mark.parametrize("spread", [1, 10**7])
def test_layer_matrix_keeps_the_last_row_of_a_step_and_layer(spread: int) -> None:
    """Rows of one step and layer from two tags (or sources): the cell holds the last row's
    value in the view's order, as the pivot's ``last``; nulls are NaN (steps close together
    and far apart)."""
    import polars as pl

    from forensics.evidence.trend_utils import _pivoted, layer_matrix

    rng = np.random.default_rng(3)
    n = 5000
    rows = pl.DataFrame(
        {
            "step": rng.integers(-3, 400, n) * spread,
            "layer": rng.integers(0, 6, n).astype(np.int16),
            "value": rng.normal(size=n),
        },
        schema={"step": pl.Int64, "layer": pl.Int16, "value": pl.Float64},
    ).with_columns(  # nulls and NaN among the values
        pl.when(pl.int_range(pl.len()) % 37 == 0)
        .then(None)
        .when(pl.int_range(pl.len()) % 41 == 0)
        .then(float("nan"))
        .otherwise(pl.col("value"))
        .alias("value")
    )

    class _Rows:
        def layers(self, metric: str) -> list[int]:
            return list(range(6))

        def metric_rows(self, metric: str) -> pl.DataFrame:
            return rows

    got = layer_matrix(_Rows(), "grad_norm_layer")  # type: ignore[arg-type]
    want = _pivoted(rows, list(range(6)))
    assert np.array_equal(got.steps, want.steps)
    assert np.array_equal(got.values.view(np.int64), want.values.view(np.int64))


def test_param_norm_surge_text_groups_the_crossing_step() -> None:
    """A surge that passes 1.5x past step 10,000 names the step as the other sentences do
    (12,345, not 12345) and says what the ratio now is against."""
    from synthetic import healthy_loss, long_frame

    steps = np.arange(0, 20000, 10)
    pn = 100.0 * (1 + 0.1 * steps / 20000) + 0.02 * np.clip(steps - 8000, 0, None)
    frame = long_frame({"loss": healthy_loss(20000, 0, 10)[0:2], "param_norm": (steps, pn)})
    (f,) = ParamNormDetector().detect(Evidence(run_from_frame(frame)))
    assert "surged" in f.summary, f.summary
    crossing = f.measures["crossing_step"]
    assert crossing >= 10_000 and f"at step {crossing:,}, now" in f.summary, f.summary
    assert f"now {f.measures['ratio']:.2f}x its baseline." in f.summary


def test_activation_absmax_peak_at_the_crossing_is_said_once() -> None:
    """The activation_outlier sample's layer-2 absmax passes 1e4 at its peak, step 520: the
    sentence names that step once ("passed 10,000 at step 520 with 12,112, its peak") where
    it read "passed 10000 at step 520 and reached 1.21e+04 at step 520"."""
    diag = _sample("activation_outlier")
    (f,) = [
        g
        for g in diag.findings
        if g.kind is FindingKind.ACTIVATION_OUTLIER and g.measures["trigger"] == "absmax"
        if g.measures["layer"] == 2
    ]
    assert f.start_step == f.peak_step == 520
    assert f.summary.count("step 520") == 1, f.summary
    assert f"with {f.measures['value']:,.0f}, its peak" in f.summary  # (12,112, not 1.21e+04)
    assert "absmax passed 10,000 at step 520" in f.summary, f.summary  # separators, as counts


def test_the_articles_shallow_layer_ramp_still_rising_at_the_end(tmp_path) -> None:
    """Article 3.4 as tensorboardX writes it: 32 blocks' grad norms every 50 steps; blocks 0-3
    hold 8% of the squared gradient until step 6,500, then climb steadily to 20% at the log's
    end (step 10,000). The late window's median is the middle of that ramp (about 18%), which
    missed the 10-point line: nothing was reported. Where the share is still rising through
    the late window, the level now is the median of its second half. The incident names the
    whole group, not its first layer."""
    from tensorboardX import SummaryWriter

    from forensics.importers import read_run
    from forensics.pipeline import analyze_run

    rng = np.random.default_rng(6)
    w = SummaryWriter(str(tmp_path))
    for s in range(1, 10_001):
        w.add_scalar("train/loss", 2.0 + 1.5 * np.exp(-s / 3000) + 0.02 * rng.standard_normal(), s)
        if s % 50:
            continue
        share = 0.08 if s < 6500 else 0.08 + 0.12 * (s - 6500) / 3500
        for layer in range(32):
            sq = (share / 4 if layer < 4 else (1 - share) / 28) * np.exp(0.1 * rng.normal())
            w.add_scalar(f"grad_norm/model.layers.{layer}", np.sqrt(sq), s)
    w.close()
    diag = analyze_run(read_run(tmp_path))
    (f,) = [g for g in diag.findings if g.kind is FindingKind.LAYER_GRAD_SHIFT]
    assert f.severity is Severity.WARNING and f.measures["layers"] == "0-3"
    assert f.measures["share_before"] == pytest.approx(0.08, abs=0.01)
    assert 0.18 <= f.measures["share_after"] <= 0.205
    assert abs(f.start_step - 6500) <= 500
    (inc,) = diag.incidents
    assert "(layers 0-3)" in inc.signs[0].text(), inc.signs[0].text()


@pytest.mark.parametrize(
    ("peak", "severity"), [(9_900.0, Severity.INFO), (10_100.0, Severity.WARNING)]
)
def test_an_absmax_jump_under_the_limit_is_a_note(
    tmp_path, peak: float, severity: Severity
) -> None:
    """Layer 2's activation absmax jumps from about 12 to 9,900 (nearly 800x) for steps
    2,000-2,100: under the article's absolute 1e4 line nothing was said. It is a note now;
    at 10,100 it is the warning it was."""
    import json

    from forensics.importers import read_run

    rng = np.random.default_rng(7)
    rows = []
    for s in range(1, 3001):
        r: dict = {"step": s, "loss": 2 + np.exp(-s / 1000) + 0.02 * rng.standard_normal()}
        if s % 20 == 0:
            for layer in range(4):
                v = 12.0 * np.exp(0.05 * rng.standard_normal())
                r[f"act/absmax/layers.{layer}"] = peak if layer == 2 and 2000 <= s <= 2100 else v
        rows.append(r)
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    found = ActivationDetector().detect(Evidence(read_run(tmp_path)))
    (f,) = [g for g in found if g.kind is FindingKind.ACTIVATION_OUTLIER]
    assert f.severity is severity and f.measures["layer"] == 2 and f.start_step == 2000
    if severity is Severity.INFO:
        assert f.measures["trigger"] == "absmax_jump" and f.measures["ratio"] > 700
        assert "jumped to 9,900 at step 2,000" in f.summary
        assert "under the 10,000 line" in f.summary


def test_param_growth_rates_keep_the_digits_that_matter() -> None:
    """The divergence sample's layer 3 param norm grew 4,677% per 1k steps: written
    "+4677.05%" beside "+4822.64%", decimals of a number whose size is the point. Rates keep
    two decimals at the article's scale (a few percent), one from 10%, none from 100%."""
    from forensics.detectors.layers import _rate

    assert [_rate(v) for v in (2.3, -0.4, 22.71, -91.2, 4677.05)] == [
        "+2.30",
        "-0.40",
        "+22.7",
        "-91.2",
        "+4,677",
    ]
    d = _sample("divergence")
    (f,) = [g for g in d.findings if g.kind is FindingKind.LAYER_GRAD_SHIFT]
    assert (
        "its param norm grows +4,677%/1k steps vs +1,790% for layer 0, +6,131% for layer 1 and "
        "+6,547% for layer 2" in f.summary
    )


def test_the_other_layers_param_growth_is_not_averaged_across_signs() -> None:
    """The layer_grad_shift sample: weight decay drives blocks 2 and 3 to nothing while block 0
    grows. Their mean read "-91.2% for the rest"; each is named (three or fewer), and more
    layers give a median with its range."""
    from forensics.detectors.layers import _Growth, _rest_text

    d = _sample("layer_grad_shift")
    (f,) = [g for g in d.findings if g.kind is FindingKind.LAYER_GRAD_SHIFT]
    assert "vs +7.55% for layer 0" in f.summary
    pcts = {0: 1.0, 1: 50.0, 2: -3.0, 3: 2.0, 4: 4.0}
    rates = {layer: _Growth(r, 10.0, 10.0, 1_000) for layer, r in pcts.items()}
    assert _rest_text(rates, [1], [0, 1, 2, 3, 4]) == (
        "+1.50% for the median other layer (from -3.00% to +4.00%)"
    )
    assert _rest_text(rates, [1], [0, 1]) == "+1.00% for layer 0"


def test_a_param_norm_decayed_to_nothing_reads_as_its_fall_not_a_rate() -> None:
    """The layer_grad_shift sample: weight decay takes blocks 2 and 3 from about 18 to 0.01
    over the 890 steps after the onset (medians of the first and last three points). Their
    fitted rates, -138% and -144% per 1k steps,
    put the norms below zero before the log ends: no steady rate describes a fall to nothing.
    The sentence gives each such layer's measured fall; the measures keep the fitted rates."""
    from forensics.detectors.layers import _Growth, _rest_text

    d = _sample("layer_grad_shift")
    (f,) = [g for g in d.findings if g.kind is FindingKind.LAYER_GRAD_SHIFT]
    assert "-138%" not in f.summary and "-144%" not in f.summary
    assert (
        "vs +7.55% for layer 0, while layer 2's fell from 17.96 to 0.01361 (-99.9%) and "
        "layer 3's from 18.59 to 0.01601 (-99.9%) since step 310" in f.summary
    ), f.summary
    assert f.measures["param_growth_by_layer"] == "0:+7.55,1:+22.71,2:-137.53,3:-143.74"
    # more than three such layers: their falls as a range
    fell = {k: _Growth(-150.0, 20.0, 0.1 * k, 1_000) for k in range(2, 7)}
    rest = {0: _Growth(1.0, 10.0, 10.1, 1_000), 1: _Growth(50.0, 10.0, 15.0, 1_000)}
    assert _rest_text(rest | fell, [1], list(range(7)), since=400) == (
        "+1.00% for layer 0, while layers 2-6's fell by 97.0-99.0% since step 400"
    )


def test_an_activation_std_jump_reads_in_one_number_style() -> None:
    """activation_outlier sample: the std jumped to 3,000 at step 520 and that point was its
    highest. It read "jumped to 3e+03 at step 520, 1082.7x the median ..., and peaked at 3,000
    at step 520": one value in two styles, said twice, and a ratio with a decimal of noise."""
    d = _sample("activation_outlier")
    stds = [
        f
        for f in d.findings
        if f.kind is FindingKind.ACTIVATION_OUTLIER and f.measures["trigger"] == "std_jump"
    ]
    assert stds and all("e+0" not in f.summary for f in stds)
    f = next(f for f in stds if f.measures["layer"] == 2)
    assert f.summary == (
        "Layer 2 activation std jumped to 3,000 at step 520, 1,083x the median of its 10 points "
        "before (2.77, steps 320-500), its highest."
    )


def test_diverged_losses_are_written_grouped() -> None:
    """The divergence sample's loss reaches four digits: "rose from 2.169 to 1,154 (highest
    logged value 1,492 ...)", and its spikes "1,492 against a local baseline of 727.4"; they
    read "1154", "1492", beside "step 1,016" on the same line."""
    from forensics.evidence.trend_utils import num

    assert [num(v) for v in (2.2514, 727.43, 1153.9, 12345.6, float("nan"))] == [
        "2.251",
        "727.4",
        "1,154",
        "12,346",
        "n/a",
    ]
    d = _sample("divergence")
    (div,) = [f for f in d.findings if f.kind is FindingKind.DIVERGENCE]
    assert "the smoothed loss rose from 2.169 to 1,154 (highest logged value 1,492" in div.summary
    assert any(
        "Loss spike at step 1,016: 1,492 against a local baseline of 727.4" in f.summary
        for f in d.findings
    )


def test_eval_regression_names_the_held_out_losses_it_leaves_to_the_gap_checks() -> None:
    """multi_eval_sets logs eval/idlelib_loss and eval/stdlib_loss, and a gap finding is about
    the first; the note read "the run logged no eval metric (eval/<name>)" beside it."""
    (note,) = [n for n in _sample("multi_eval_sets").run.notes if "eval_regression" in n]
    assert "held-out losses (eval/idlelib_loss, eval/stdlib_loss)" in note
    assert "no eval metric" not in note
    (note,) = [n for n in _sample("healthy").run.notes if "eval_regression" in n]
    assert note == "eval_regression: not run, the run logged no eval metric (eval/<name>)"


def test_the_layer_shift_card_names_one_layer_in_the_singular() -> None:
    """The divergence sample's shift is layer 3's alone: its card read "Layers 3 went from
    12.5% to 99.3%". (The card now states the shares once, in the summary:
    tests/test_report.py.)"""
    from forensics.report.render import render_html

    d = _sample("divergence")
    page = render_html(d, plotlyjs="cdn")
    assert "Layer 3 went from 12% to 99% of the squared grad norm" in page
    assert "Layers 3 " not in page


def test_layer_shift_onset_is_where_a_slowing_rise_began(tmp_path: Path) -> None:
    """The embedding's grad norm climbs linearly from step 4,000 to 5x by 12,000 (the middle
    layers steady), per-layer norms logged every 500 steps by tensorboardX: its share of the
    squared grad norm sits near 27% up to step 4,000, then reads about 38% at 4,500, 49% at
    5,000, 65% at 6,000 and 90% at 12,000, a rise that slows down. The two-piece fit finds no
    upward bend there, and the fallback took the half-way crossing: "since step 6,000"
    (anywhere in 5,500-6,500), a range that left out the first 2,000 steps of the rise. The
    onset is now where the share first left its early level (by more than its noise and a
    tenth of the rise)."""
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(3)
    w = SummaryWriter(str(tmp_path / "embed"))
    for s in range(1, 12001):
        climb = 1.0 + max(0, s - 4000) / 8000 * 4.0
        layer = {i: 0.25 * (1 + rng.normal(0, 0.03)) for i in range(1, 12)}
        layer[0] = 0.5 * climb * (1 + rng.normal(0, 0.03))
        if s % 10 == 0:
            w.add_scalar("train/loss", 2.2 + 3.0 * np.exp(-s / 2500) + rng.normal(0, 0.015), s)
            w.add_scalar("train/grad_norm", float(np.sqrt(sum(v * v for v in layer.values()))), s)
        if s % 500 == 0:
            for i, v in layer.items():
                w.add_scalar(f"grad_norm/model.layers.{i}", v, s)
    w.close()
    (f,) = [f for f in analyze(tmp_path / "embed").findings if f.kind.value == "layer_grad_shift"]
    assert f.measures["layers"] == "0"
    assert 4000 < f.start_step <= 4500, f.summary
    assert f.onset_range is not None and f.onset_range[0] <= 4000 < f.onset_range[1]
    assert "since step 4,500" in f.summary
