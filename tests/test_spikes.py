"""Loss and grad-norm spikes: detection against the anchors, shape, classification, context."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import (
    excerpt,
    healthy_grad_norm,
    healthy_loss,
    long_frame,
    run_from_frame,
    spike_factor,
    spiky_loss,
)

from forensics.detectors import params_for, spikes
from forensics.detectors.spikes import SpikeDetector
from forensics.evidence import Evidence, robust
from forensics.findings import FindingKind, Severity
from forensics.measures import MEASURES
from forensics.params import resolve


# -- the anchors: what monitors in use today would say on the same data --------------------------
def kill_loss_spike(
    values: np.ndarray, window: int = 100, multiplier: float = 2.0, patience: int = 4
) -> list[int]:
    """llm-foundry's KillLossSpike: an outlier is > multiplier x the mean of the last `window`
    losses; a spike is declared after more than `patience` consecutive outliers."""
    hits, run = [], 0
    for i in range(window, len(values)):
        if values[i] > multiplier * np.mean(values[i - window : i]):
            run += 1
            if run == patience + 1:
                hits.append(i - patience)
        else:
            run = 0
    return hits


def olmo_spike(values: np.ndarray, window: int = 128, k: float = 6.0) -> list[int]:
    """OLMo-core's monitor: a value above mean + k sigma of the previous `window` values (needs a
    full window)."""
    return [
        i
        for i in range(window, len(values))
        if values[i] > values[i - window : i].mean() + k * values[i - window : i].std()
    ]


def megatron_spike(values: np.ndarray, first: int = 100, factor: float = 10.0) -> list[int]:
    """Megatron's check: a value above factor x the largest of the first `first` values."""
    if len(values) <= first:
        return []
    ref = factor * np.max(values[:first])
    return [i for i in range(first, len(values)) if values[i] > ref]


def ema_zscore(
    values: np.ndarray, alpha: float = 0.97, warmup: int = 25, z: float = 6.0
) -> list[int]:
    """The alternative we did not choose: a ZClip-style EMA mean/variance z-score of log(values)."""
    y = np.log(values)
    mu, var, hits = y[0], 0.0, []
    for i in range(1, len(y)):
        if i >= warmup and var > 0 and (y[i] - mu) / np.sqrt(var) > z:
            hits.append(i)
            continue  # like ZClip, an outlier does not update the statistics
        d = y[i] - mu
        mu += (1 - alpha) * d
        var = alpha * (var + (1 - alpha) * d * d)
    return hits


def _run(**series):
    return run_from_frame(long_frame({k.replace("__", "/"): v for k, v in series.items()}))


def _spikes(run, kind=FindingKind.LOSS_SPIKE, **params):
    return [
        f
        for f in SpikeDetector(params_for(SpikeDetector, params)).detect(Evidence(run))
        if f.kind is kind
    ]


# -- detection ------------------------------------------------------------------------------------
def test_one_step_spike_found_where_kill_loss_spike_is_blind():
    """A one-step 1.6x loss spike mid-run: found at its step; KillLossSpike needs 5 steps above
    2x."""
    (s, v), truth = spiky_loss(3000, spikes=[dict(at=1700, height=0.6)])
    found = _spikes(_run(train__loss=(s, v)))
    assert [f.start_step for f in found] == [1700]
    assert kill_loss_spike(v) == []


def test_eight_line_excerpt_mid_training_where_olmo_is_silent():
    """Eight logged lines from step 1500 (every 10 steps) with one spike: found; OLMo needs 128
    values."""
    (s, v), _ = spiky_loss(3000, every=10, spikes=[dict(at=1540, height=0.5, width=10)])
    es, ev = excerpt(s, v, 150, 8)
    assert es[0] == 1500 and len(es) == 8
    found = _spikes(_run(train__loss=(es, ev)))
    assert [f.start_step for f in found] == [1540]
    assert olmo_spike(ev) == [] and kill_loss_spike(ev) == []


def test_spike_on_the_second_line_of_an_excerpt():
    """A spike on the second logged line is judged against both neighbours; the EMA z-score has no
    warm-up yet."""
    (s, v), _ = spiky_loss(3000, every=10, spikes=[dict(at=2010, height=0.8, width=10)])
    es, ev = excerpt(s, v, 200, 8)
    found = _spikes(_run(train__loss=(es, ev)))
    assert [f.start_step for f in found] == [2010]
    assert found[0].measures["two_sided"] is True
    assert ema_zscore(ev) == []


def test_moderate_spike_found_where_megatron_is_blind():
    """A 40% spike at step 2000 is far below 10x the start-of-training maximum Megatron compares
    with."""
    (s, v), _ = spiky_loss(3000, spikes=[dict(at=2000, height=0.4, tau=20)])
    found = _spikes(_run(train__loss=(s, v)))
    assert [f.start_step for f in found] == [2000]
    assert megatron_spike(v) == []


def test_ema_zscore_misses_the_excerpt_the_median_catches():
    """Why the rolling median: on the 8-line excerpt the EMA has no variance yet and stays
    silent."""
    (s, v), _ = spiky_loss(3000, every=10, spikes=[dict(at=1540, height=0.5, width=10)])
    es, ev = excerpt(s, v, 150, 8)
    assert ema_zscore(ev) == []
    assert len(_spikes(_run(train__loss=(es, ev)))) == 1


@pytest.mark.parametrize("every", [5, 10])
def test_sparse_logging(every: int):
    """Logged every 5 or 10 steps, a spike lasting one logging interval is found at its step."""
    (s, v), _ = spiky_loss(4000, every=every, spikes=[dict(at=2500, height=0.5, width=every)])
    found = _spikes(_run(train__loss=(s, v)))
    assert [f.start_step for f in found] == [2500]
    assert found[0].measures["log_interval"] == every


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("every", [1, 5, 10])
def test_quiet_on_healthy_runs_including_the_noisy_start(seed: int, every: int):
    """A healthy run, fast-falling noisy start included, gives no spike at all."""
    run = _run(
        train__loss=healthy_loss(5000, seed=seed, every=every, noise=0.03),
        train__grad_norm=healthy_grad_norm(5000, seed=seed + 100, every=every),
    )
    assert SpikeDetector().detect(Evidence(run)) == []


def test_quiet_on_a_healthy_excerpt():
    """Eight healthy lines from mid-training give nothing."""
    s, v = healthy_loss(3000, every=10, seed=3)
    es, ev = excerpt(s, v, 120, 8)
    assert SpikeDetector().detect(Evidence(_run(train__loss=(es, ev)))) == []


def test_score_is_a_per_step_frame():
    """score() returns one row per finite point with baseline, sigma, z and ratio; the spike stands
    out."""
    (s, v), _ = spiky_loss(1000, spikes=[dict(at=600, height=1.0)])
    v[100] = np.nan
    sc = robust.score(s, v)
    assert sc.columns == list(robust.SCORE_SCHEMA)
    assert sc.height == 999
    z = dict(zip(sc["step"].to_list(), sc["z"].to_list(), strict=True))
    assert z[600] > 20 and np.nanmax([z[k] for k in z if k != 600 and z[k] is not None]) < 6


# -- shape and classification ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spike", "classification", "severity"),
    [
        (dict(at=1500, height=1.5, tau=60), "physiological", Severity.INFO),
        (dict(at=1500, height=1.5, tau=60, shift=0.15), "pathological", Severity.CRITICAL),
        (dict(at=1500, height=1.0, tau=400), "pathological", Severity.CRITICAL),
        (dict(at=1500, height=1.0, tau=40, shift=-0.12), "beneficial", Severity.INFO),
        (dict(at=2800, height=1.0, tau=400), "unresolved", Severity.WARNING),
    ],
    ids=["physiological", "settles-higher", "slow-recovery", "beneficial", "log-ends"],
)
def test_classification(spike: dict, classification: str, severity: Severity):
    """Recovery within 500 steps = physiological (info); not back or settled higher = pathological
    (critical); settled lower = beneficial; the log ends first = unresolved."""
    for seed in range(3):
        (s, v), _ = spiky_loss(3000, seed=seed, spikes=[spike])
        (f,) = _spikes(_run(train__loss=(s, v)))
        assert f.start_step == spike["at"]
        assert (f.measures["classification"], f.severity) == (classification, severity), (
            seed,
            f.summary,
        )


@pytest.mark.parametrize(("tau", "slow"), [(40, False), (170, True)])
def test_a_physiological_spike_slower_than_300_steps_says_so(tau: int, slow: bool) -> None:
    """The article: a passing fluctuation is back on its trend within 100-300 steps; one not back
    after 500 is pathological. A spike back after 300-500 steps stays physiological, and its
    sentence says it was slower than a passing fluctuation (it read like a quick one)."""
    (s, v), _ = spiky_loss(4000, spikes=[dict(at=2000, height=1.0, tau=tau)])
    (f,) = _spikes(_run(train__loss=(s, v)))
    rec = f.measures["recovery_steps"]
    assert f.measures["classification"] == "physiological"
    assert (300 < rec <= 500) is slow, rec
    said = "slower than a passing fluctuation (back within 300) but within the 500" in f.summary
    assert said is slow, f.summary


def test_shape_measures_match_the_injected_spike():
    """Height, width, recovery and plateau shift come back close to what was injected."""
    (s, v), _ = spiky_loss(4000, spikes=[dict(at=2000, height=1.0, width=5, tau=30)])
    (f,) = _spikes(_run(train__loss=(s, v)))
    m = f.measures
    assert m["height_ratio"] == pytest.approx(2.0, rel=0.1)
    assert m["height"] == pytest.approx(m["peak_value"] - m["baseline"])
    # 5 flat-top steps, then the decay stays above the 1.15x alarm line for 30*ln(1/0.15) = 57 steps
    assert 55 <= m["width_steps"] <= 70
    assert (
        40 <= m["recovery_steps"] <= 200
    )  # 1 + 1.0 * exp(-k/30) falls inside a ~6% band after ~100 steps
    assert abs(m["plateau_shift_rel"]) < 0.02
    assert m["excess_area"] > 0 and m["excess_area_rel"] == pytest.approx(5 + 30, rel=0.35)
    assert f.peak_step in range(2000, 2005) and f.end_step == m["recovered_step"]


def test_falling_loss_does_not_make_a_spike_beneficial():
    """On the steep early fall the trend is extrapolated: a spike with no lasting shift is not
    'beneficial'."""
    for seed in range(4):
        for at in (150, 300, 600):
            (s, v), _ = spiky_loss(3000, seed=seed, spikes=[dict(at=at, height=0.8, tau=20)])
            (f,) = _spikes(_run(train__loss=(s, v)))
            assert f.measures["classification"] == "physiological", (seed, at, f.summary)


def test_plateau_not_judged_across_an_epoch_start():
    """A drop at an epoch start after the spike is the epoch's, not a 'beneficial' spike."""
    (s, v), _ = spiky_loss(4000, spikes=[dict(at=1900, height=1.0)])
    v = v * np.where(s >= 2000, 0.8, 1.0)  # memorization drop at the second epoch
    (f,) = _spikes(_run(train__loss=(s, v), train__epoch=(s, s / 2000)))
    assert f.measures["classification"] == "physiological"


# -- grad-norm spikes ------------------------------------------------------------------------------
def _gn_run(gn_spike: dict, loss_spike: dict | None = None, n: int = 3000):
    (ls, lv), _ = spiky_loss(n, spikes=[loss_spike] if loss_spike else [])
    gs, gv = healthy_grad_norm(n)
    gv = gv * spike_factor(gs, **gn_spike)
    return _run(train__loss=(ls, lv), train__grad_norm=(gs, gv))


def test_transient_grad_norm_spike_with_loss_response_is_a_warning():
    """A one-step 5x grad-norm spike with the loss jumping in the same step: warning, check that
    batch."""
    run = _gn_run(dict(at=1500, height=4.0), dict(at=1500, height=0.5))
    (g,) = _spikes(run, FindingKind.GRAD_NORM_SPIKE)
    assert (g.start_step, g.severity) == (1500, Severity.WARNING)
    assert g.measures["transient"] is True and g.measures["loss_response"] is True


def test_absorbed_grad_norm_spike_is_info_by_default():
    """A one-step grad-norm outlier the loss ignores is noted (info), in the run's one note of
    absorbed outliers; the parameter makes it a warning, a grad-norm spike of its own."""
    run = _gn_run(dict(at=1500, height=9.0))
    assert _spikes(run, FindingKind.GRAD_NORM_SPIKE) == []
    (o,) = _spikes(run, FindingKind.GRAD_NORM_OUTLIERS)
    assert o.severity is Severity.INFO and o.events_at == (1500,)
    assert (o.start_step, o.peak_step, o.measures["count"]) == (1500, 1500, 1)
    assert o.measures["highest_ratio"] == pytest.approx(10, rel=0.2)
    assert o.summary.startswith("A grad-norm outlier at step 1,500: "), o.summary
    (g,) = _spikes(run, FindingKind.GRAD_NORM_SPIKE, absorbed_gn_severity="warning")
    assert g.severity is Severity.WARNING and g.measures["loss_response"] is False
    # Peak 10 x 0.6; the run baseline is the settled level 0.6 (the start-up decay of
    # healthy_grad_norm is left out of it, as no LR warm-up is logged): 10x.
    assert g.measures["ratio_to_run_baseline"] == pytest.approx(10 * 0.6 / 0.6, rel=0.2)
    assert _spikes(run, FindingKind.GRAD_NORM_OUTLIERS, absorbed_gn_severity="warning") == []


def test_grad_norm_spike_that_stays_up_is_not_transient():
    """A grad norm that jumps 4x and stays there: not transient, critical (3x the run baseline)."""
    run = _gn_run(dict(at=1500, height=3.0, tau=5000))
    (g,) = _spikes(run, FindingKind.GRAD_NORM_SPIKE)
    assert g.measures["transient"] is False and g.severity is Severity.CRITICAL


def test_critical_grad_norm_line_comes_from_the_configured_band():
    """The 3x line a grad-norm spike that stays up is judged against is the grad-norm band's:
    configured at 5x, the same 4x spike is a warning, and the finding states that line."""
    run = _gn_run(dict(at=1500, height=3.0, tau=5000))
    ev = Evidence(run, resolve({"grad_norm_drift": {"crit_ratio": 5.0}}))
    (g,) = [f for f in SpikeDetector().detect(ev) if f.kind is FindingKind.GRAD_NORM_SPIKE]
    assert g.measures["ratio_to_run_baseline"] == pytest.approx(4.0, rel=0.2)
    assert g.severity is Severity.WARNING
    band = ev.grad_norm_band
    assert band is not None and band.critical_ratio == 5.0
    assert g.judged_against["critical_at"] == pytest.approx(band.baseline.value * 5.0)


def test_judged_against_states_the_evidence_lines():
    """A spike finding states the local baseline, the alarm line it passed, the thresholds and
    the recovery limit; a grad-norm spike also the run's grad-norm band (the evidence's)."""
    run = _gn_run(dict(at=1480, height=3.0, width=25), dict(at=1500, height=0.8, tau=30))
    ev = Evidence(run)
    found = SpikeDetector().detect(ev)
    (loss,) = [f for f in found if f.kind is FindingKind.LOSS_SPIKE]
    (gn,) = [f for f in found if f.kind is FindingKind.GRAD_NORM_SPIKE]
    p = ev.params.spikes
    for f, min_ratio in ((loss, p.loss_min_ratio), (gn, p.grad_norm_min_ratio)):
        j = f.judged_against
        assert j["local_baseline"] == f.measures["baseline"]
        assert j["local_baseline"] * min_ratio <= j["alarm_at"] < f.measures["peak_value"]
        assert j["z_threshold"] == p.z_threshold and j["min_ratio"] == min_ratio
        assert j["recovery_limit_steps"] == p.recover_steps
    band = ev.grad_norm_band
    assert band is not None
    assert gn.judged_against["baseline"] == band.baseline.value == gn.measures["run_baseline"]
    assert gn.judged_against["warn_at"] == band.warn_at
    assert gn.judged_against["critical_at"] == band.critical_at
    assert "baseline" not in loss.judged_against


def test_shared_spikes_are_not_changed_by_the_detector():
    """The evidence's spikes are read-only and keep their raw measures after the spike
    detector added its context (cause, links, run baseline) to its own findings."""
    run = _gn_run(dict(at=1480, height=3.0, width=25), dict(at=1500, height=0.8, tau=30))
    ev = Evidence(run)
    before = {m: [dict(s.measures) for s in ev.spikes(m)] for m in ("loss", "grad_norm")}
    found = SpikeDetector().detect(ev)
    assert any(f.measures.get("cause") == "grad_norm_led" for f in found)
    after = {m: [dict(s.measures) for s in ev.spikes(m)] for m in ("loss", "grad_norm")}
    assert after == before and before["loss"] and before["grad_norm"]
    assert "cause" not in before["loss"][0] and "run_baseline" not in before["grad_norm"][0]
    with pytest.raises(TypeError):
        ev.spikes("loss")[0].measures["cause"] = "x"  # type: ignore[index]


def test_detector_with_its_own_parameters_finds_spikes_with_them():
    """A spike detector made with other parameters than the evidence's finds its spikes with
    its own (a higher height ratio hides a 1.6x spike), and leaves the evidence's alone."""
    (s, v), _ = spiky_loss(3000, spikes=[dict(at=1700, height=0.6)])
    ev = Evidence(_run(train__loss=(s, v)))
    assert [f.start_step for f in SpikeDetector().detect(ev)] == [1700]
    strict = SpikeDetector(
        params_for(SpikeDetector, {"loss_min_ratio": 2.5, "loss_gross_ratio": 3.0})
    )
    assert strict.detect(ev) == []
    assert [x.start_step for x in ev.spikes("loss")] == [1700]


def test_severity_parameters_reuse_the_evidence_spikes(monkeypatch: pytest.MonkeyPatch):
    """A detector that differs from the evidence only in how it grades (absorbed_gn_severity)
    judges the evidence's spikes: nothing is found twice."""
    from forensics.evidence import spikes as evidence_spikes

    calls: list[str] = []
    real = evidence_spikes.find_spikes

    def counting(ev, metric):
        calls.append(metric)
        return real(ev, metric)

    monkeypatch.setattr(evidence_spikes, "find_spikes", counting)
    ev = Evidence(_gn_run(dict(at=1500, height=9.0)))
    (g,) = [f for f in SpikeDetector().detect(ev) if f.kind is FindingKind.GRAD_NORM_OUTLIERS]
    assert g.severity is Severity.INFO and g.events_at == (1500,)
    loud = SpikeDetector(params_for(SpikeDetector, {"absorbed_gn_severity": "warning"}))
    (g,) = [f for f in loud.detect(ev) if f.kind is FindingKind.GRAD_NORM_SPIKE]
    assert g.severity is Severity.WARNING
    assert sorted(calls) == ["grad_norm", "loss"]


def test_grad_norm_spike_leading_a_loss_spike():
    """The grad norm leaves its band 20 steps before the loss spikes: the lead is reported on
    both."""
    run = _gn_run(dict(at=1480, height=3.0, width=25), dict(at=1500, height=0.8, tau=30))
    (g,) = _spikes(run, FindingKind.GRAD_NORM_SPIKE)
    (s,) = _spikes(run)
    assert s.measures["grad_norm_lead_steps"] == 20 and g.measures["leads_loss_by_steps"] == 20
    assert s.measures["cause"] == "grad_norm_led"


# -- co-occurrence ---------------------------------------------------------------------------------
def test_spike_at_a_loss_scale_drop_is_numeric_overflow():
    """The loss scale halves in the spike's step (logged at the next point): cause
    numeric_overflow."""
    (s, v), _ = spiky_loss(3000, spikes=[dict(at=1800, height=1.0)])
    scale = np.where(s > 1800, 2.0**15, 2.0**16)
    (f,) = _spikes(_run(train__loss=(s, v), loss_scale=(s, scale)))
    assert f.measures["loss_scale_drop"] is True and f.measures["cause"] == "numeric_overflow"
    (f,) = _spikes(_run(train__loss=(s, v), loss_scale=(s, np.where(s > 2500, 2.0**15, 2.0**16))))
    assert f.measures["loss_scale_drop"] is False


def test_spike_after_an_lr_restart_is_schedule_induced():
    """A spike 10 steps after a warm restart of a cosine schedule: cause schedule_induced."""
    (s, v), _ = spiky_loss(4000, spikes=[dict(at=2010, height=0.8, tau=30)])
    lr = 3e-4 * (0.5 + 0.5 * np.cos(np.pi * (s % 2000) / 2000))
    (f,) = _spikes(_run(train__loss=(s, v), train__lr=(s, lr)))
    assert f.measures["cause"] == "schedule_induced"
    assert f.measures["lr_kink_step"] == 2000 and f.measures["lr_kink_kind"] == "restart"


# -- documentation ---------------------------------------------------------------------------------
def test_every_measure_key_is_documented():
    """Each measures key a spike finding carries is declared, with a meaning, in
    forensics.measures (the table the module docstring points to)."""
    assert "forensics.measures" in (spikes.__doc__ or "")
    documented = {
        m.key for k in ("loss_spike", "grad_norm_spike") for m in MEASURES[k] if m.meaning
    }
    run = _gn_run(dict(at=1480, height=3.0, width=25), dict(at=1500, height=0.8, tau=30))
    found = SpikeDetector().detect(Evidence(run))
    assert {f.kind for f in found} == {FindingKind.LOSS_SPIKE, FindingKind.GRAD_NORM_SPIKE}
    for f in found:
        assert set(f.measures) <= documented, set(f.measures) - documented


# -- the start of training -------------------------------------------------------------------------
@pytest.mark.parametrize("rise", [10, 30, 100])
def test_grad_norm_climbing_in_the_warm_up_is_not_a_spike(rise: int):
    """A grad norm that climbs 20x during the LR warm-up and then decays is the start, not a
    spike."""
    rng = np.random.default_rng(rise)
    s = np.arange(2000)
    up = 0.1 + 1.9 * np.minimum(1, s / rise)
    gn = np.where(s > rise, 2.0 * np.exp(-(s - rise) / 500) + 0.5, up) * np.exp(
        rng.normal(0, 0.05, len(s))
    )
    run = _run(
        train__loss=healthy_loss(2000),
        train__grad_norm=(s, gn),
        train__lr=(s, 3e-4 * np.minimum(1, (s + 1) / rise)),
    )
    assert SpikeDetector().detect(Evidence(run)) == []


def test_spike_inside_the_warm_up_is_still_found():
    """A one-step 3x grad-norm spike at step 60 of a 200-step warm-up is confirmed on both sides and
    found."""
    s, g = healthy_grad_norm(2000)
    g = g * spike_factor(s, 60, 2.0)
    run = _run(
        train__loss=healthy_loss(2000),
        train__grad_norm=(s, g),
        train__lr=(s, 3e-4 * np.minimum(1, (s + 1) / 200)),
    )
    (f,) = _spikes(run, FindingKind.GRAD_NORM_SPIKE, absorbed_gn_severity="warning")
    assert f.start_step == 60 and f.measures["two_sided"] is True
    # (as a note, the one absorbed outlier of the run)
    (o,) = _spikes(run, FindingKind.GRAD_NORM_OUTLIERS)
    assert o.events_at == (60,)


def test_onset_of_a_spike_that_builds_over_several_steps():
    """A loss that climbs for 6 steps before peaking: start_step is where the climb began, peak
    where it topped."""
    for seed in range(4):
        s, v = healthy_loss(3000, seed=seed)
        climb = np.clip((s - 1999) / 6.0, 0, 1) * (s < 2006)
        decay = np.where(s >= 2006, np.exp(-(s - 2005) / 30.0), 0.0)
        (f,) = _spikes(_run(train__loss=(s, v * (1 + 1.2 * (climb + decay)))))
        assert 2000 <= f.start_step <= 2001 and 2004 <= f.peak_step <= 2006, (
            seed,
            f.start_step,
            f.peak_step,
        )


def test_series_with_negative_values_are_scored_on_the_raw_scale():
    """A loss that goes negative (preference losses do) cannot be logged: spikes are judged on raw
    values."""
    rng = np.random.default_rng(4)
    s = np.arange(2000)
    v = -0.5 + 0.05 * rng.standard_normal(2000)
    v[1200] += 1.0
    (f,) = _spikes(_run(train__loss=(s, v)))
    assert f.start_step == 1200 and f.measures["height"] == pytest.approx(1.0, abs=0.15)
    assert (
        SpikeDetector().detect(
            Evidence(_run(train__loss=(s, -0.5 + 0.05 * rng.standard_normal(2000))))
        )
        == []
    )


def test_every_spike_peaks_at_or_above_its_alarm_line():
    """The alarm line a finding states is the one its peak passed. A grad-norm jump past 4x
    is flagged at z >= 3 (the gross rule); in a noisy stretch the z threshold's line is
    higher, and the throughput_drop sample's step-71 spike (2.17 at z 5.5) was reported with
    an alarm line of 2.47 above its own peak. Every sample run's spikes, loss and grad norm."""
    from pathlib import Path

    from forensics.config import Config
    from forensics.pipeline import analyze

    root = Path(__file__).resolve().parents[1] / "sample_runs"
    checked = 0
    # (absorbed outliers as findings of their own: as notes they are one finding, without
    # a line of each)
    each = Config(detectors={"spikes": {"absorbed_gn_severity": "warning"}})
    for run in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "generator"):
        for f in analyze(run, each).findings:
            if f.kind not in (FindingKind.LOSS_SPIKE, FindingKind.GRAD_NORM_SPIKE):
                continue
            j, m = f.judged_against, f.measures
            assert m["peak_value"] >= j["alarm_at"], (run.name, f.step, m["peak_value"], j)
            checked += 1
    assert checked >= 20
    diag = analyze(root / "throughput_drop", each)
    (g,) = [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_SPIKE]
    j = g.judged_against
    assert g.measures["z"] < j["z_threshold"] and g.measures["height_ratio"] >= j["gross_ratio"]
    assert j["alarm_at"] == pytest.approx(j["local_baseline"] * j["gross_ratio"])


def test_a_spike_before_a_resume_is_not_judged_by_the_level_after_it(tmp_path) -> None:
    """A real torch chain: job_0 (steps 0-399) is healthy, with batch-noise loss spikes at
    steps 327 and 332; job_1 resumes at 400 with only the weights and a restarted schedule,
    and its loss degrades. The spikes' plateau (the level in the window after they came back)
    had been measured across the resume, on the degraded loss: "settled 104% above its earlier
    trend; pathological", critical, each its own incident with rollback advice. The level
    after a spike is measured up to the resume: both came back within a step and are notes."""
    pytest.importorskip("torch")
    from resume_chain import torch_chain

    from forensics.importers import read_run
    from forensics.pipeline import analyze_run

    d = analyze_run(read_run(torch_chain(tmp_path, bad_resume=True, val_every=40)))
    before = [f for f in d.findings if f.kind.value == "loss_spike" and f.start_step < 400]
    assert before, "the batch-noise spikes of job_0 are still found"
    for f in before:
        assert f.severity.value == "info", f.summary
        assert f.measures["classification"] == "physiological", f.summary
        assert "settled" not in f.summary, f.summary
        assert f.measures["recovered_step"] < 400
    assert all(i.start_step >= 400 for i in d.incidents)


def test_grad_norm_spike_card_states_the_configured_lines():
    """The card added "4.594x the run's baseline gradient norm (warning from 2x, critical from
    3x)" whatever the band, under the finding's own "4.6x the run's baseline (warning from 2x,
    critical from 5x)": configured at 5x, the 4x spike that stays up is a warning, and the card
    put it above a critical line it did not reach. The card no longer repeats the sentence; a
    transient's sentence names the configured lines too."""
    from report_text import card_texts

    from forensics.config import Config
    from forensics.pipeline import analyze_run

    cfg = Config(detectors={"grad_norm_drift": {"crit_ratio": 5.0}})
    diag = analyze_run(_gn_run(dict(at=1500, height=3.0, tau=5000)), cfg)
    (g,) = [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_SPIKE]
    # (a step to a level it held: judged by that level on the same configured lines)
    assert g.severity is Severity.WARNING and g.measures["judged_by"] == "level"
    (text,) = card_texts(diag, "grad_norm_spike")
    assert "critical from 3x" not in text, text
    assert text.count("x the run's baseline") == 1, text
    assert "(warning from 2x, critical from 5x)" in text, text
    # A transient (back within its limit) is judged by its recovery: its sentence names the
    # lines it was not judged by, the configured ones.
    diag = analyze_run(_gn_run(dict(at=1500, height=4.0, width=1)), cfg)
    (t,) = [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_OUTLIERS]
    assert t.events_at == (1500,), t.summary
    assert "judged by its recovery, not by the 2x / 5x lines of the grad norm's level" in (
        t.summary
    ), t.summary
