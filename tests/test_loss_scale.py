"""loss_scale_drop: calibration, cascades, overflow lines, sustained declines, spikes in the same
step."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl
from synthetic import healthy_loss, long_frame, run_from_frame, spiky_loss

from forensics.detectors import loss_scale
from forensics.detectors.loss_scale import LossScaleDetector
from forensics.detectors.spikes import SpikeDetector
from forensics.evidence import Evidence
from forensics.findings import FindingKind, Severity
from forensics.measures import MEASURES


def _run(**series):
    return run_from_frame(long_frame({k.replace("__", "/"): v for k, v in series.items()}))


def scaler(
    n: int,
    *,
    start: float = 2.0**16,
    overflows: tuple[int, ...] = (),
    growth: int = 1000,
    overflows_at: Callable[[int, float], bool] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A GradScaler-like scale logged after each step: halves at each overflow step (or where
    ``overflows_at(step, scale)`` says so), doubles after `growth` clean steps. Returns
    (steps, scale)."""
    steps = np.arange(n)
    scale = np.empty(n)
    cur, clean, over = start, 0, set(overflows)
    for i in steps:
        if i in over or (overflows_at is not None and overflows_at(int(i), cur)):
            cur, clean = cur / 2, 0
        else:
            clean += 1
            if clean == growth:
                cur, clean = cur * 2, 0
        scale[i] = cur
    return steps, scale


def _drops(run):
    return [
        f
        for f in LossScaleDetector().detect(Evidence(run))
        if f.kind is FindingKind.LOSS_SCALE_DROP
    ]


def test_calibration_at_the_start_is_info():
    """Eight halvings in the first eight steps (the scaler finding its level): one info finding."""
    s, sc = scaler(3000, start=2.0**24, overflows=tuple(range(8)), growth=5000)
    (f,) = _drops(_run(train__loss=healthy_loss(3000), loss_scale=(s, sc)))
    assert f.severity is Severity.INFO and f.measures["calibration"] is True
    assert f.measures["halvings"] == 7  # the first halving happens before the first logged value
    assert f.measures["to_scale"] == 2.0**16


def test_calibration_ends_once_the_scale_grows_back():
    """The first descent is the calibration; after the scale grows back (growth every 20 clean
    steps here), a single halving within the first 200 steps is ordinary dynamic scaling: a
    note, not a "calibrating" finding."""
    s, sc = scaler(3000, start=2.0**24, overflows=(*range(8), 100), growth=20)
    drops = _drops(_run(train__loss=healthy_loss(3000), loss_scale=(s, sc)))
    assert [(f.start_step, f.measures["calibration"]) for f in drops] == [(1, True)]
    assert drops[0].judged_against["calibration_end_step"] == 26  # grew at step 27


def test_calibration_ends_at_a_cascade_that_starts_above_the_last_one():
    """DeepSpeed-Chat's reward model logs its scale at overflows only: 65,536 to 64 by step 9,
    then "Attempted loss scale: 128, reducing to 64" at step 145 (it grew in between, unseen
    in the series): that halving is not calibration."""
    from conftest import shared_path

    from forensics.importers import read_run

    path = shared_path(
        "real_runs", "deepspeed-chat-logs", "step2_reward", "opt-350m_globalBatchSize-64.log"
    )
    run = read_run(path)
    drops = _drops(run)
    assert [(f.start_step, f.severity, f.measures["calibration"]) for f in drops] == [
        (0, Severity.INFO, True),
        (482, Severity.WARNING, False),
        (557, Severity.WARNING, False),
    ]
    # step 145 with the three later single halvings (1,541 to 1,724)
    assert any("4 single loss-scale halving(s) after calibration" in n for n in run.notes)


def test_later_cascade_is_a_warning_with_from_to_and_steps():
    """Four halvings at steps 1500-1530 (the article's 2^24 -> 2^16 is this, twice over):
    warning."""
    s, sc = scaler(3000, start=2.0**24, overflows=(1500, 1510, 1520, 1530), growth=5000)
    (f,) = _drops(_run(train__loss=healthy_loss(3000), loss_scale=(s, sc)))
    assert f.severity is Severity.WARNING and f.measures["calibration"] is False
    assert (f.start_step, f.end_step) == (1500, 1530)
    assert (f.measures["from_scale"], f.measures["to_scale"], f.measures["halvings"]) == (
        2.0**24,
        2.0**20,
        4,
    )
    # Logged every step: the old scale was last seen the step before the first halving.
    assert f.measures["from_step"] == 1499
    assert "from 16,777,216 to 1,048,576 between steps 1,500 and 1,530" in f.summary


def test_a_fall_of_many_halvings_in_one_logged_step_is_not_called_that_many_halvings():
    """The article's case as a log shows it: the scale 2^24 at one step, 2^16 at the next. A
    scaler halves at most once a step, so "halved 8 times at step 2,000" counts events the log
    cannot hold: it fell 256x, eight halvings' worth."""
    s = np.arange(3000)
    sc = np.where(s < 2000, 2.0**24, 2.0**16)
    (f,) = _drops(_run(train__loss=healthy_loss(3000), loss_scale=(s, sc)))
    assert f.measures["halvings"] == 8 and (f.start_step, f.end_step) == (2000, 2000)
    assert "Loss scale fell 256x (8 halvings' worth) from 16,777,216 to 65,536 at step 2,000" in (
        f.summary
    ), f.summary
    assert "halved 8 times" not in f.summary


def test_a_cascade_logged_sparsely_says_where_the_old_scale_was_last_seen():
    """A real Megatron log (every 10th iteration): the scale was 8,388,608 at iteration 10 and
    32,768 at 20, 16,384 at 30. The halvings came after step 10: the sentence names the step
    the old scale was logged at, not 'between steps 20 and 30'."""
    from conftest import shared_path

    from forensics.importers import read_run

    path = shared_path(
        "real_runs", "bigscience-megatron-experiments", "meg_gpt2_base_n16_dp1_tp4_pp16-1809577.out"
    )
    (f,) = _drops(read_run(path))
    assert (f.start_step, f.end_step) == (20, 30)
    assert (f.measures["from_scale"], f.measures["from_step"], f.measures["to_scale"]) == (
        8388608.0,
        10,
        16384.0,
    )
    assert f.measures["halvings"] == 9
    assert "from 8,388,608 at step 10 to 16,384 by step 30 (first seen lower at step 20)" in (
        f.summary
    )
    assert "between steps 20 and 30" not in f.summary


def test_ordinary_scaler_sawtooth_is_quiet():
    """Single overflows now and then with regrowth in between are normal dynamic scaling: nothing
    reported."""
    s, sc = scaler(8000, overflows=(900, 2500, 4100, 6000))
    run = _run(train__loss=healthy_loss(8000), loss_scale=(s, sc))
    assert _drops(run) == []
    assert any("single loss-scale halving" in n for n in run.notes)


def test_halving_at_a_spike_is_a_warning_and_the_spike_says_overflow():
    """One halving in the step of a loss spike: warning here, cause numeric_overflow on the
    spike."""
    (ls, lv), _ = spiky_loss(3000, spikes=[dict(at=2000, height=1.5)])
    s, sc = scaler(3000, overflows=(2000,), growth=5000)
    run = _run(train__loss=(ls, lv), loss_scale=(s, sc))
    (f,) = _drops(run)
    assert f.severity is Severity.WARNING and f.measures["coincides_with_spike"] is True
    assert f.measures["spike_step"] == 2000
    (spike,) = [
        x for x in SpikeDetector().detect(Evidence(run)) if x.kind is FindingKind.LOSS_SPIKE
    ]
    assert spike.measures["cause"] == "numeric_overflow"


def test_a_grad_norm_spike_alone_does_not_make_the_scalers_halving_a_warning():
    """truncated_log (real torch fp16 training): the scaler halves twice at steps 41-43, its
    first descent, as the grad norm spikes to 11x at step 44 and comes back at once with the
    loss unmoved. That was "at a spike in the same steps: numeric overflow", a warning that
    made the healthy run yellow; a gradient large enough to overflow is what the scaler halves
    for. It is the scaler calibrating (info), and the run is green. A loss spike in the same
    steps still makes a halving a warning (the test above)."""
    from pathlib import Path

    from forensics import analyze

    d = analyze(Path(__file__).resolve().parents[1] / "sample_runs" / "truncated_log")
    (drop,) = [f for f in d.findings if f.kind is FindingKind.LOSS_SCALE_DROP]
    assert (drop.start_step, drop.end_step, drop.measures["halvings"]) == (41, 43, 2.0)
    assert drop.severity is Severity.INFO and drop.measures["calibration"] is True
    assert drop.measures["coincides_with_spike"] is False
    assert "the scaler calibrating at the start of training" in drop.summary
    gn = next(f for f in d.findings if f.kind is FindingKind.GRAD_NORM_SPIKE and f.start_step == 43)
    assert gn.measures["loss_response"] is False
    assert d.verdict == "healthy"


def test_overflow_lines_without_a_scale_series():
    """DeepSpeed-style overflow steps only: a later burst of 3 is a warning cascade from the
    overflow source."""
    steps = np.array([3, 4, 5, 4000, 4001, 4003])
    frame = long_frame({"train/loss": healthy_loss(6000), "overflow": (steps, np.ones(len(steps)))})
    # The text-log importer maps its overflow lines to the canonical "overflow" metric.
    frame = frame.with_columns(
        pl.when(pl.col("tag") == "overflow")
        .then(pl.lit("overflow"))
        .otherwise(pl.col("metric"))
        .alias("metric")
    )
    run = run_from_frame(frame)
    found = _drops(run)
    assert [(f.start_step, f.severity, f.measures["halvings"]) for f in found] == [
        (3, Severity.INFO, 3.0),
        (4000, Severity.WARNING, 3.0),
    ]
    assert all(
        f.measures["source"] == "overflow"
        and f.measures["from_scale"] is None
        and f.measures["from_step"] is None
        for f in found
    )


def test_sustained_decline_over_separate_drops():
    """Halvings at 2000, 3500, 5000 and no regrowth: a sustained decline of 3 halvings (warning)."""
    s, sc = scaler(9000, overflows=(2000, 3500, 5000), growth=100000)
    found = _drops(_run(train__loss=healthy_loss(9000), loss_scale=(s, sc)))
    (d,) = [f for f in found if f.measures["pattern"] == "sustained_decline"]
    assert (
        d.severity is Severity.WARNING and d.measures["halvings"] == 3 and d.measures["drops"] == 3
    )
    assert d.start_step == 2000
    assert d.measures["from_step"] == 1999  # the last point at the peak scale


def test_no_scale_series_is_noted():
    """bf16 runs log no loss scale: nothing reported, a note says why."""
    run = _run(train__loss=healthy_loss(500))
    assert _drops(run) == [] and any(n.startswith("loss_scale: not run") for n in run.notes)


def test_measures_documented():
    """Each measures key is declared, with a meaning, in forensics.measures (the table the
    module docstring points to)."""
    assert "forensics.measures" in (loss_scale.__doc__ or "")
    documented = {m.key for m in MEASURES["loss_scale_drop"] if m.meaning}
    s, sc = scaler(9000, overflows=(10, 2000, 2010, 2020, 3500, 5000), growth=100000)
    found = _drops(_run(train__loss=healthy_loss(9000), loss_scale=(s, sc)))
    assert {f.measures["pattern"] for f in found} == {"cascade", "sustained_decline"}
    for f in found:
        assert set(f.measures) <= documented


def test_scale_logged_only_when_reduced():
    """DeepSpeed's 'reducing to Y' lines: the scale is known only at overflow steps, one halving
    each."""
    over = np.array([3000, 3004, 3009])
    frame = long_frame(
        {
            "train/loss": healthy_loss(6000),
            "loss_scale": (over, np.array([2.0**15, 2.0**14, 2.0**13])),
            "overflow": (over, np.ones(3)),
        }
    )
    frame = frame.with_columns(
        pl.when(pl.col("tag") == "overflow")
        .then(pl.lit("overflow"))
        .otherwise(pl.col("metric"))
        .alias("metric")
    )
    (f,) = _drops(run_from_frame(frame))
    assert f.severity is Severity.WARNING and (f.start_step, f.end_step) == (3000, 3009)
    assert (f.measures["from_scale"], f.measures["to_scale"], f.measures["halvings"]) == (
        2.0**16,
        2.0**13,
        3,
    )
    assert f.measures["overflow_steps"] == 3
    assert f.measures["from_step"] is None  # (the scale before the first reduction: not logged)


def test_spike_windows_lookup_matches_looking_through_every_window():
    """The cascade's coinciding spike is looked up only where a window can reach: the same
    onset (the first in onset order) as checking every window, on windows of all widths."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(0, 40))
        onsets = np.sort(rng.integers(0, 5_000, n))
        windows = sorted(
            (int(s), float(s) - float(rng.uniform(0, 300)), float(s) + float(rng.uniform(0, 900)))
            for s in onsets
        )
        index = loss_scale._SpikeWindows([(*w, True) for w in windows])
        for _ in range(30):
            a = float(rng.integers(-100, 5_100))
            b = a + float(rng.integers(1, 400))
            every = next((s for s, lo, hi in windows if lo < b and hi > a), None)
            assert index.first_overlap(a, b) == every


def _calibrating_beside(spike: dict):
    """The one loss-scale drop of a scaler descending from 2^24 over the first 60 steps (a
    halving every 6 steps, the last at step 60) beside a loss spike shaped by ``spike``."""
    (ls, lv), _ = spiky_loss(3000, spikes=[spike])
    s, sc = scaler(3000, start=2.0**24, overflows=(*range(0, 50, 6), 60), growth=5000)
    (f,) = _drops(_run(train__loss=(ls, lv), loss_scale=(s, sc)))
    return f


def test_calibration_beside_a_spike_that_came_back_is_info():
    """bigscience's Megatron runs: the scale falls from 2^23 to 2^14 over the first 30
    iterations (the scaler's first descent) while an early loss spike comes and goes. The
    scaler overflows at ordinary gradients until it finds its level, so the drop does not show
    numeric trouble: info, the text says so and names the spike (judged on its own). Before,
    "at a spike in the same steps: numeric overflow", a warning on a healthy start."""
    f = _calibrating_beside(dict(at=60, height=1.5))
    assert f.measures["calibration"] is True and f.measures["coincides_with_spike"] is True
    assert f.severity is Severity.INFO
    assert "the scaler calibrating at the start of training" in f.summary
    assert "the loss spike that began at step 60 in the same steps came back" in f.summary


def test_calibration_beside_a_spike_that_stays_up_is_a_warning():
    """The same descent beside a loss spike that settles well above its trend (pathological):
    the drop joins that evidence, a warning as at a later spike."""
    f = _calibrating_beside(dict(at=60, height=1.5, shift=1.5))
    assert f.measures["calibration"] is True and f.measures["coincides_with_spike"] is True
    assert f.severity is Severity.WARNING
    spike = f.measures["spike_step"]
    assert f": numeric overflow, beside the loss spike that began at step {spike:,}." in f.summary


def test_a_first_halving_after_the_scale_held_is_a_warning_at_a_spike():
    """periodic_spikes: the scale held at 65,536 for 125 steps, then halved once at a bad
    batch's loss spike that came back at once. Within the first 200 steps, but the scaler had
    found a level the spike overflowed: still "numeric overflow", a warning."""
    (ls, lv), _ = spiky_loss(3000, spikes=[dict(at=125, height=1.5)])
    s, sc = scaler(3000, overflows=(125,), growth=5000)
    run = _run(train__loss=(ls, lv), loss_scale=(s, sc))
    (f,) = _drops(run)
    assert f.measures["calibration"] is True and f.measures["coincides_with_spike"] is True
    assert f.severity is Severity.WARNING
    assert ": numeric overflow, beside the loss spike that began at step 125." in f.summary


def test_a_decline_that_grew_back_part_of_the_way_says_so():
    """Eleven overflows 600 steps apart take the scale from 65,536 down to 32 by step 7,500;
    then it doubles every 2,000 clean steps, to 2,048 at the end of the log. The decline spans
    its fall (1,500-7,500, to the lowest level it held) and its drops on the way down, and the
    sentence says it grew back: it read "declined ... over 17,999 steps ... without growing
    back" beside a chart where it had grown 64x."""
    overflows = tuple(range(1500, 7501, 600))
    s, sc = scaler(20000, overflows=overflows, growth=2000)
    found = _drops(_run(train__loss=healthy_loss(20000), loss_scale=(s, sc)))
    (d,) = [f for f in found if f.measures["pattern"] == "sustained_decline"]
    m = d.measures
    assert (m["from_scale"], m["to_scale"], m["to_step"]) == (65536.0, 32.0, 7500)
    assert m["steps"] == 6000 and m["drops"] == len(overflows) and m["halvings"] == 11
    assert m["last_scale"] == sc[-1] == 2048.0
    assert "over 6,000 steps (steps 1,500-7,500) in 11 separate drops" in d.summary
    # Its held level at the end: the median of the last 2,000 steps (1,500 of them at 1,024).
    assert "it was back at 2,048 by step 19,999, its held level still 64x below" in d.summary
    assert "without growing back" not in d.summary


def test_a_healthy_scaler_sawtooth_is_no_decline():
    """A GradScaler at its level: up after each quiet growth interval (2^17), down at the next
    overflow (2^16), and now and then an outlier batch's extra halving (2^15, 2^14) it grows
    back from. The scale sits 2-3 halvings below its all-time highest point for thousands of
    steps; that read as a sustained decline (a warning on a healthy fp16 run). Against the
    level it held (its median over 2,000 steps) it is none; nor is a burst of three outlier
    overflows the scaler then grew back from."""
    rng = np.random.default_rng(4)
    n = 60000

    burst = set(range(30000, 30300, 100))  # three outliers within 300 steps

    def level(i: int, cur: float) -> bool:
        limit = 2.0**17 * float(np.exp(rng.normal(0, 0.3)))
        return bool(cur > limit or rng.random() < 0.0002 or i in burst)

    steps, scale = scaler(n, growth=1000, overflows_at=level)
    assert np.log2(scale).min() <= 14  # it did dip 3 halvings below its highest
    found = _drops(_run(train__loss=healthy_loss(n), loss_scale=(steps, scale)))
    assert [f for f in found if f.measures["pattern"] == "sustained_decline"] == []
    assert all(f.severity is not Severity.WARNING for f in found)


def test_a_scale_halved_until_it_underflowed_to_zero_is_a_cascade():
    """Every step overflowing from step 2,000 on: the scale halves each step until it is 0.
    The cascade is counted on its positive points and the sentence says it reached 0 (the
    zeros once hid every cascade of the run: the nan sample's collapse went unreported)."""

    def overflow(step: int, scale: float) -> bool:
        return step >= 2000 or step == 700

    s, sc = scaler(3000, start=2.0**16, overflows_at=overflow, growth=5000)
    sc = np.where(sc < 2.0**-140, 0.0, sc)  # (a float32 log underflows far above float64)
    first_zero = int(s[np.argmax(sc == 0)])
    (f,) = [
        d
        for d in _drops(_run(train__loss=healthy_loss(3000), loss_scale=(s, sc)))
        if d.start_step >= 2000
    ]
    assert f.severity is Severity.WARNING
    assert (f.start_step, f.end_step) == (2000, first_zero - 1)
    assert f.measures["from_scale"] == 2.0**15 and f.measures["halvings"] == first_zero - 2000
    assert f.summary.endswith(
        f"; then the scale was 0 from step {first_zero:,} to 2,999 (it underflowed)."
    )


def test_the_nan_sample_reports_its_loss_scale_collapse():
    from pathlib import Path

    from forensics import analyze

    run = Path(__file__).resolve().parents[1] / "sample_runs" / "nan"
    (f,) = [f for f in analyze(run).findings if f.kind is FindingKind.LOSS_SCALE_DROP]
    assert (f.start_step, f.end_step, f.severity) == (611, 800, Severity.WARNING)
    assert f.measures["from_scale"] == 131072 and f.measures["halvings"] == 166
    assert "then the scale was 0 from step 801 to 1,000 (it underflowed)" in f.summary
