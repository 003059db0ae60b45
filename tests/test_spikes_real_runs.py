"""Spike forensics on real logs (../shared/real_runs) and on the bundled sample runs.

The healthy references must stay quiet (nothing above info); the logs with real incidents
must show them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import ROOT, shared_path
from test_spikes import kill_loss_spike, megatron_spike, olmo_spike

from forensics.detectors.divergence import DivergenceDetector
from forensics.detectors.loss_scale import LossScaleDetector
from forensics.detectors.nan_inf import NanInfDetector
from forensics.detectors.periodic import PeriodicSpikeDetector
from forensics.detectors.spikes import SpikeDetector
from forensics.evidence import Evidence
from forensics.findings import FindingKind, Severity
from forensics.importers import read_run

DETECTORS = (
    SpikeDetector,
    PeriodicSpikeDetector,
    NanInfDetector,
    DivergenceDetector,
    LossScaleDetector,
)


def _all(run):
    ev = Evidence(run)  # one evidence, as in the pipeline: the spikes are found once
    return [f for d in DETECTORS for f in d().detect(ev)]


HEALTHY = [
    "llmc-gpt2-124M-hectorfcardenas/gpt2_train.11685414.log",
    "llmc-gpt2-124M-siddanthemani/main.log",
    "modded-nanogpt/2024-06-06_AdamW/f66d43d7-e449-4029-8adf-e8537bab49ea.log",
    "modded-nanogpt/2024-10-10_Muon/eb5659d0-fb6a-49e5-a311-f1f89412f726.txt",
    "hf-trainer-tinyllama-sft",
    "llamafactory-luojiu-7b-qlora-cpt",
]


@pytest.mark.parametrize("rel", HEALTHY, ids=lambda r: r.split("/")[0] + ":" + Path(r).name[:12])
def test_healthy_real_runs_stay_quiet(rel: str):
    """The healthy reference runs give no spike, NaN, divergence or loss-scale finding above
    info."""
    run = read_run(shared_path("real_runs", *rel.split("/")))
    assert run.has("loss")
    loud = [f for f in _all(run) if f.severity is not Severity.INFO]
    assert not loud, [f.summary for f in loud]


def test_llmc_grad_norm_outliers_are_noted_not_alarmed():
    """llm.c 11685414 has one-step grad-norm outliers (up to ~14x) the loss ignores: info,
    loss_response false; as notes, all of them one grad_norm_outliers finding that names
    each one's step and the highest."""
    run = read_run(
        shared_path("real_runs", "llmc-gpt2-124M-hectorfcardenas", "gpt2_train.11685414.log")
    )
    ev = Evidence(run)
    gn = [f for f in _each().detect(ev) if f.kind is FindingKind.GRAD_NORM_SPIKE]
    assert len(gn) >= 5
    assert max(f.measures["height_ratio"] for f in gn) > 10
    assert all(f.measures["loss_response"] is False and f.measures["transient"] for f in gn)
    found = SpikeDetector().detect(ev)
    assert not [f for f in found if f.kind is FindingKind.GRAD_NORM_SPIKE]
    (notes,) = [f for f in found if f.kind is FindingKind.GRAD_NORM_OUTLIERS]
    assert notes.severity is Severity.INFO and notes.measures["count"] == len(gn)
    assert notes.events_at == tuple(f.peak_step for f in gn)
    top = max(gn, key=lambda f: f.measures["height_ratio"])
    assert notes.measures["highest_ratio"] == top.measures["height_ratio"]
    assert notes.measures["highest_step"] == notes.peak_step == top.peak_step
    assert (notes.start_step, notes.end_step) == (gn[0].start_step, max(f.end_step for f in gn))
    assert f"{len(gn)} grad-norm outliers from step {gn[0].start_step:,}" in notes.summary


def _each() -> SpikeDetector:
    """The spike detector with absorbed outliers as warnings: a finding each."""
    from forensics.params import SpikesParams

    return SpikeDetector(SpikesParams(absorbed_gn_severity="warning"))


def test_the_step_named_as_a_recovery_is_back_in_the_band_itself():
    """modded-nanogpt's llm.c main.log: the grad norm reads 0.43, 0.86, 0.59, 0.58, 0.39, 0.35
    at steps 1,900-1,905 on a level near 0.315. Step 1,903 (0.58, still 1.8x) starts a
    window of three whose median is back (0.39), but is not back itself: the recovery is
    step 1,904, three steps after the peak. And every recovered grad-norm spike of the log
    names a recovery step whose value is below 1.5x its baseline (the band is a few times the
    noise, far narrower than that)."""
    run = read_run(shared_path("real_runs", "modded-nanogpt", "2024-10-13_llmc", "main.log"))
    gn = [f for f in _each().detect(Evidence(run)) if f.kind is FindingKind.GRAD_NORM_SPIKE]
    (spike,) = [f for f in gn if f.peak_step == 1901]
    assert spike.measures["recovered_step"] == 1904
    assert spike.measures["recovery_steps"] == 3
    assert "back within 3 steps" in spike.summary
    grad = dict(
        run.frame.filter(pl.col("metric") == "grad_norm").select("step", "value").iter_rows()
    )
    for f in gn:
        if f.measures.get("recovered_step") is not None:
            # (the band is a few times the noise: a point still 1.5x the level is not back)
            assert grad[f.measures["recovered_step"]] < 1.5 * f.measures["baseline"], f.summary


def test_a_climb_the_loss_never_came_back_from_says_it_went_on_rising():
    """The n16 DeepSpeed-off perf log: the loss falls to 11.6 at iteration 31 and then climbs
    steadily to 20.44 at 62, the last line, while the grad norm stays flat (no divergence by
    the article's rule). The spike search cuts a piece from the climb (peak 17.69 at 48); its
    sentence says the loss went on rising after it, to the climb's top, taken from the
    series; the run's other spikes, which came back, say nothing of the kind."""
    run = read_run(
        shared_path(
            "real_runs", "bigscience-megatron-experiments", "meg_ds_3d_gpt2_perf_n16-ds-off.out"
        )
    )
    spikes = [f for f in SpikeDetector().detect(Evidence(run)) if f.kind is FindingKind.LOSS_SPIKE]
    (climb,) = [f for f in spikes if f.measures["classification"] == "pathological"]
    assert climb.peak_step == 48
    after = run.series("loss").filter(pl.col("step") > 48)
    top = int(after["value"].arg_max())  # type: ignore[arg-type]
    assert climb.measures["rose_after_to"] == after["value"][top] == pytest.approx(20.43871)
    assert climb.measures["rose_after_step"] == after["step"][top] == after["step"][-1] == 62
    assert after["value"].min() > climb.measures["baseline"]  # (it never came back)
    assert "the loss never came back and went on rising after it, to 20.44 at step 62" in (
        climb.summary
    )
    # (not also "settled 93% above its earlier trend": the loss never settled)
    assert "settled" not in climb.summary
    assert "(1.23x), pathological; part of a climb from 11.65 at step 31;" in climb.summary
    rest = [f for f in spikes if f is not climb]
    assert rest and all(f.measures["rose_after_to"] is None for f in rest)
    assert all("went on rising" not in f.summary for f in rest)


def test_a_spike_whose_highest_point_is_not_its_peak_names_both():
    """The same log jumps from 12.45 to 44.24 at iteration 3 and tops out at 48.14 at 4; on
    the steeply falling baseline behind it the loss stands furthest above it at 5 (47.5), the
    spike's peak. The sentence keeps the peak and names the highest logged value beside it,
    the number the chart shows; a spike whose peak is its highest point says nothing more."""
    run = read_run(
        shared_path(
            "real_runs", "bigscience-megatron-experiments", "meg_ds_3d_gpt2_perf_n16-ds-off.out"
        )
    )
    spikes = [f for f in SpikeDetector().detect(Evidence(run)) if f.kind is FindingKind.LOSS_SPIKE]
    (early,) = [f for f in spikes if f.start_step == 3]
    loss = run.series("loss").filter(pl.col("step").is_between(3, early.end_step))
    top = int(loss["value"].arg_max())  # type: ignore[arg-type]
    assert early.peak_step == 5 and loss["step"][top] == 4
    assert early.measures["highest_value"] == loss["value"][top] == pytest.approx(48.1413)
    assert early.measures["highest_step"] == 4
    assert "Loss spike at step 5: 47.5 against" in early.summary
    assert "(1.49x; the highest logged value was 48.14, at step 4)" in early.summary
    bb = read_run(ROOT / "sample_runs" / "bad_batch")
    for f in SpikeDetector().detect(Evidence(bb)):
        if f.kind is FindingKind.LOSS_SPIKE:
            assert f.measures["highest_step"] == f.peak_step
            assert "highest logged value" not in f.summary


def test_bigscience_n16_early_spike():
    """The n16 log's loss jumps 12.5 -> 32.8 at iteration 30 (8 logged losses): found, with the fp16
    loss-scale halving of that interval; the anchors see nothing in so short a log."""
    run = read_run(
        shared_path(
            "real_runs",
            "bigscience-megatron-experiments",
            "meg_gpt2_base_n16_dp1_tp4_pp16-1809577.out",
        )
    )
    (s,) = [f for f in SpikeDetector().detect(Evidence(run)) if f.kind is FindingKind.LOSS_SPIKE]
    assert (s.start_step, s.peak_step) == (30, 30)
    assert s.measures["height_ratio"] == pytest.approx(32.825 / 12.493, rel=0.01)
    assert (
        s.measures["classification"] == "physiological"
        and s.measures["cause"] == "numeric_overflow"
    )
    v = run.series("loss")["value"].to_numpy()
    assert kill_loss_spike(v) == [] and olmo_spike(v) == [] and megatron_spike(v) == []
    scale = [
        f
        for f in LossScaleDetector().detect(Evidence(run))
        if f.kind is FindingKind.LOSS_SCALE_DROP
    ]
    assert (
        scale
        and scale[0].measures["calibration"] is True
        and scale[0].measures["coincides_with_spike"] is True
        # (the scaler's first descent beside a spike that came back: info, judged on its own)
        and scale[0].severity is Severity.INFO
    )


def test_llmc_nan_from_the_first_step_is_fatal():
    """llm.c 11679010 logs nan loss and norm from step 1: fatal nan_inf at step 1 for both."""
    run = read_run(
        shared_path("real_runs", "llmc-gpt2-124M-hectorfcardenas", "gpt2_train.11679010.log")
    )
    found = NanInfDetector().detect(Evidence(run))
    assert {(f.metric, f.severity, f.start_step) for f in found} == {
        ("loss", Severity.FATAL, 1),
        ("grad_norm", Severity.FATAL, 1),
    }


def test_megatron_golden_nan_padding_is_not_a_nan_finding():
    """The GPT-3 15B golden values stop early and pad with "nan": no nan_inf finding."""
    run = read_run(
        shared_path(
            "real_runs",
            "megatron-lm-golden-values",
            "gpt",
            "gpt3_15b_8t_release",
            "golden_values_lts_dgx_a100.json",
        )
    )
    assert NanInfDetector().detect(Evidence(run)) == []


def test_deepspeed_overflow_lines_give_calibration_cascades():
    """The DeepSpeed-Chat RLHF log's early overflows are read as the scaler's calibration (info)."""
    run = read_run(shared_path("real_runs", "deepspeed-chat-logs", "step3_rlhf"))
    found = LossScaleDetector().detect(Evidence(run))
    assert found and all(f.severity is Severity.INFO and f.measures["calibration"] for f in found)


def _sample(name: str) -> Path:
    p = ROOT / "sample_runs" / name
    if not p.exists():
        pytest.skip(f"{p} has not been generated")
    return p


def test_sample_bad_batch():
    """sample_runs/bad_batch (a tiny GPT fed garbage batches at steps 300 and 650): one loss spike
    at each that recovers (physiological), with the fp16 overflow of that step."""
    run = read_run(_sample("bad_batch"))
    loss = [f for f in SpikeDetector().detect(Evidence(run)) if f.kind is FindingKind.LOSS_SPIKE]
    assert [f.start_step for f in loss] == [300, 650]
    for s in loss:
        assert s.measures["classification"] == "physiological" and s.measures["height_ratio"] > 2
        assert s.measures["cause"] == "numeric_overflow"
    assert not [f for f in _all(run) if f.severity.rank >= Severity.CRITICAL.rank]
    v = run.series("loss")["value"].to_numpy()
    assert kill_loss_spike(v) == [] and np.isfinite(v).all()
