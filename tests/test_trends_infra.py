"""plateau, throughput_drop, stall and memory_growth on seeded synthetic runs (issue 7)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from synthetic import long_frame, run_from_frame, trend_infra, trend_plateau

from forensics.detectors.memory import MemoryGrowthDetector
from forensics.detectors.plateau import PlateauDetector
from forensics.detectors.stall import StallDetector
from forensics.detectors.throughput import ThroughputDetector
from forensics.evidence import Evidence, Series
from forensics.evidence.schedule import Schedule, lr_schedule
from forensics.findings import FindingKind, Severity


def test_plateau_stuck_at_active_lr() -> None:
    """A loss flat from the start at a constant LR is an info note saying the run stopped
    learning."""
    frame, _ = trend_plateau(case="stuck")
    (f,) = PlateauDetector().detect(Evidence(run_from_frame(frame)))
    assert f.kind is FindingKind.PLATEAU and f.severity is Severity.INFO
    assert f.measures["lr_context"] == "active" and f.measures["expected"] is False
    assert f.measures["from_start"] is True and f.measures["run_fraction"] > 0.9
    assert f.start_step <= 200


def test_plateau_at_end_of_cosine_is_expected() -> None:
    """A flat tail while the cosine LR decays to ~0 is noted as expected."""
    frame, _ = trend_plateau(case="cosine_end")
    (f,) = PlateauDetector().detect(Evidence(run_from_frame(frame)))
    assert f.measures["lr_context"] == "decayed" and f.measures["expected"] is True
    assert 6000 <= f.start_step <= 7500 and f.end_step >= 11900
    assert "schedule explains" in f.summary


@pytest.mark.parametrize(("n", "every"), [(12000, 10), (30000, 1)])
def test_plateau_quiet_while_learning(n: int, every: int) -> None:
    """A loss still falling slowly (power law) is not a plateau, even late in the run."""
    frame, _ = trend_plateau(case="learning", n=n, every=every)
    assert PlateauDetector().detect(Evidence(run_from_frame(frame))) == []


def test_plateau_without_lr_says_unknown() -> None:
    """Without an LR series the plateau is reported with an unknown LR context."""
    frame, _ = trend_plateau(case="stuck")
    (f,) = PlateauDetector().detect(
        Evidence(run_from_frame(frame.filter(pl.col("metric") != "lr")))
    )
    assert f.measures["lr_context"] == "unknown" and f.measures["lr_peak"] is None


@pytest.mark.parametrize("seed", range(8))
def test_plateau_after_a_fall_at_a_constant_lr(seed: int) -> None:
    """The loss falls until step 3,000, then holds for the 3,000 steps left, at a constant LR.
    The flat band took in the fall's last bins (steps 2,700-3,000), so the slope over the
    stretch was measurably negative and the plateau went unnoted. It is noted from its bend."""
    rng = np.random.default_rng(seed)
    steps = np.arange(10, 6001, 10)
    curve = 2.2 + 5.0 / (1 + np.minimum(steps, 3000) / 200) ** 0.8
    loss = curve * np.exp(rng.normal(0, 0.01, len(steps)))
    frame = long_frame({"loss": (steps, loss), "lr": (steps, np.full(len(steps), 1e-3))})
    (f,) = PlateauDetector().detect(Evidence(run_from_frame(frame)))
    assert f.measures["lr_context"] == "active" and f.measures["expected"] is False
    assert 2700 <= f.start_step <= 3300 and f.end_step == 6000, f.summary


@pytest.mark.parametrize("use_step_time", [False, True])
def test_throughput_drop_window_and_size(use_step_time: bool) -> None:
    """A 45% throughput drop over steps 3000-3600 is found with its window and size (tokens/s or
    step time)."""
    frame, truth = trend_infra(use_step_time=use_step_time)
    (f,) = ThroughputDetector().detect(Evidence(run_from_frame(frame)))
    assert f.kind is FindingKind.THROUGHPUT_DROP and f.severity is Severity.WARNING
    assert f.start_step == truth["drop"][0] and abs(f.end_step - (truth["drop"][1] - 10)) <= 20
    assert f.measures["drop_pct"] == pytest.approx(100 * truth["drop_frac"], abs=5)
    assert f.measures["recovered"] is True
    assert f.measures["source"] == ("step_time" if use_step_time else "throughput")


def test_throughput_drop_unrecovered() -> None:
    """A drop lasting to the end of the log is reported as not recovered."""
    frame, _ = trend_infra(drop=(3000, 6000))
    (f,) = ThroughputDetector().detect(Evidence(run_from_frame(frame)))
    assert f.measures["recovered"] is False and f.start_step == 3000


@pytest.mark.parametrize("drop_frac", [0.0, 0.2])
def test_throughput_small_dips_are_quiet(drop_frac: float) -> None:
    """A 20% dip is under the article's 30% line."""
    frame, _ = trend_infra(drop_frac=drop_frac)
    assert ThroughputDetector().detect(Evidence(run_from_frame(frame))) == []


def test_throughput_single_slow_step_is_quiet() -> None:
    """One slow step (a checkpoint save) is not a throughput drop."""
    steps = np.arange(0, 2000, 10)
    tps = np.full(len(steps), 40000.0)
    tps[100] = 5000.0
    assert (
        ThroughputDetector().detect(
            Evidence(run_from_frame(long_frame({"tokens_per_sec": (steps, tps)})))
        )
        == []
    )


def _rate_run(levels: list[tuple[int, float]], n: int = 6000, seed: int = 4) -> object:
    """tokens/s of 10,000 with 2% noise a step; ``levels``: (from step, fraction lost)."""
    rng = np.random.default_rng(seed)
    s = np.arange(1, n + 1)
    lost = np.zeros(n)
    for start, frac in levels:
        lost[s >= start] = frac
    tps = 10_000 * (1 - lost) * (1 + 0.02 * rng.standard_normal(n))
    return run_from_frame(long_frame({"tokens_per_sec": (s, tps)}))


def test_a_sustained_drop_near_the_line_is_one_unrecovered_drop() -> None:
    """31% lost from step 3,000 to the end: the smoothed rate crosses the 30% line back and forth
    by its 2% noise, and this read as three short dips, each "then recovered". A drop recovers
    when the rate is back above 85% of its baseline."""
    (f,) = ThroughputDetector().detect(Evidence(_rate_run([(3000, 0.31)])))
    assert (f.start_step, f.end_step) == (3000, 6000)
    assert f.measures["recovered"] is False and "had not recovered" in f.summary
    assert f.measures["drop_pct"] == pytest.approx(31, abs=1)
    assert f"-> {f.measures['level']:,.0f} tokens/s" in f.summary  # "6,898", not "6898"


def test_a_sustained_drop_just_under_the_line_is_a_note() -> None:
    """29% lost from step 3,000: a few smoothed points graze the 30% line (step 3,004), but the
    rate's median there is 29% down: a counted note, not a warning of a 30% drop."""
    run = _rate_run([(3000, 0.29)])
    assert ThroughputDetector().detect(Evidence(run)) == []
    assert any("throughput_drop: the rate dipped under the 30% line" in n for n in run.notes)


def test_a_deep_dip_then_a_partial_recovery_is_worded_so() -> None:
    """50% lost for 100 steps, then 20% to the end: the dip is the drop, and the rate came back
    over the line but not to its level before (it said "then recovered")."""
    (f,) = ThroughputDetector().detect(Evidence(_rate_run([(3000, 0.5), (3100, 0.2)])))
    assert (f.start_step, f.end_step) == (3000, 3099)
    assert f.measures["recovered"] is False
    assert "came back over the 30% line but not to its level before" in f.summary


def test_stall_found_between_steps() -> None:
    """An hour of silence between two logged steps is a run-level stall warning."""
    frame, truth = trend_infra(drop=None, stall_at=4000)
    (f,) = StallDetector().detect(Evidence(run_from_frame(frame)))
    assert f.kind is FindingKind.STALL and f.metric is None
    assert f.end_step == truth["stall_at"] and f.start_step == truth["stall_at"] - 10
    assert f.measures["gap_seconds"] == pytest.approx(3600 + 5, abs=1)
    # Steps are written as the rest of the report writes them: digits grouped.
    assert "between steps 3,990 and 4,000," in f.summary


def test_stall_ignores_regular_eval_pauses() -> None:
    """Regular pauses at val steps are not stalls; a pause ten times longer is."""
    steps = np.arange(0, 5000, 10)
    wall = steps * 0.5
    pauses = np.cumsum(np.where(steps % 500 == 10, 600.0, 0.0))  # 10 min eval after each val step
    wall = wall + pauses + np.where(steps >= 3333, 7200.0, 0.0)
    frame = long_frame(
        {"loss": (steps, np.ones(len(steps))), "val_loss": (steps[steps % 500 == 0], np.ones(10))}
    )
    wall_of = dict(zip(steps.tolist(), (wall + 1.7e9).tolist(), strict=True))
    frame = frame.with_columns(
        pl.col("step").replace_strict(wall_of, return_dtype=pl.Float64).alias("wall_time")
    )
    (f,) = StallDetector().detect(Evidence(run_from_frame(frame)))
    assert f.end_step == 3340 and f.measures["usual_pause_seconds"] == pytest.approx(600, abs=5)
    assert "between steps 3,330 and 3,340," in f.summary


def test_stall_quiet_on_steady_clock() -> None:
    """A steady clock draws nothing."""
    frame, _ = trend_infra(drop=None)
    assert StallDetector().detect(Evidence(run_from_frame(frame))) == []


@pytest.mark.parametrize("leak", [0.5, 1.0, 2.0])
def test_memory_growth_leak(leak: float) -> None:
    """Memory climbing steadily to the end of the log is a warning with its slope."""
    frame, truth = trend_infra(drop=None, leak=leak)
    (f,) = MemoryGrowthDetector().detect(Evidence(run_from_frame(frame)))
    assert f.kind is FindingKind.MEMORY_GROWTH and f.severity is Severity.WARNING
    assert f.measures["slope_per_1k_steps"] == pytest.approx(leak, rel=0.1)
    assert 0.7 < f.measures["late_ratio"] < 1.3
    assert f.start_step <= 1000
    # Two paces, each named for what it is: the one between the two stated levels, then the
    # fitted trend's overall and over the last third (what levelling off is judged on).
    m = f.measures
    by_levels = (
        1000 * (m["end_level"] - m["start_level"]) / (m["end_level_step"] - m["start_level_step"])
    )
    assert f"{by_levels:,.3g}" in f.summary or f"{by_levels:,.0f}" in f.summary
    assert "; its fitted trend " in f.summary and " per 1k steps overall and " in f.summary


def test_memory_warmup_then_flat_is_quiet() -> None:
    """Memory that rises at start-up and then holds draws nothing; so does a tiny creep."""
    for leak in (0.0, 0.05):
        frame, _ = trend_infra(drop=None, leak=leak)
        assert MemoryGrowthDetector().detect(Evidence(run_from_frame(frame))) == []


def test_memory_levelling_off_is_quiet() -> None:
    """Memory that climbs then levels off (a cache filling up) is not a leak."""
    steps = np.arange(0, 6000, 10)
    mem = 20.0 + 6.0 * (1 - np.exp(-steps / 1200.0))
    assert (
        MemoryGrowthDetector().detect(
            Evidence(run_from_frame(long_frame({"memory": (steps, mem)})))
        )
        == []
    )


# -- the LR schedule (forensics/evidence/schedule.py) ----------------------------------------
def _schedule(lr: np.ndarray, warmup_end: int | None = 30) -> Schedule:
    steps = np.arange(1, len(lr) + 1, dtype=np.int64)
    return lr_schedule(Series(steps, np.asarray(lr, dtype=float)), warmup_end)


def _kinds(s: Schedule) -> list[tuple[str, int, int]]:
    return [(g.kind, g.start_step, g.end_step) for g in s.segments]


_X = np.arange(1, 1001)
_PEAK = 3e-3
_WARM = _PEAK * _X / 30


def test_schedule_cosine_with_warmup() -> None:
    """Warm-up to step 30, then one cosine decay to zero."""
    lr = np.where(_X <= 30, _WARM, _PEAK * 0.5 * (1 + np.cos(np.pi * (_X - 30) / 970)))
    s = _schedule(lr)
    assert _kinds(s) == [("warmup", 1, 30), ("decay", 31, 1000)]
    assert s.segments[1].shape == "cosine" and s.unexplained == [] and s.changes == ()
    assert s.peak == pytest.approx(_PEAK)
    assert s.phase_at(10) == "warmup" and s.phase_at(500) == "decay" and s.phase_at(2000) is None
    assert s.lr_at(500) == pytest.approx(lr[499])
    assert s.segments[0].lr_start == pytest.approx(_PEAK / 30) and s.segments[1].lr_end == 0.0


def test_schedule_wsd_has_a_cooldown() -> None:
    """Warm-up, stable to step 800, then a fast linear decay: WSD's cooldown."""
    lr = np.where(_X <= 30, _WARM, np.where(_X <= 800, _PEAK, _PEAK * (1 - (_X - 800) / 200)))
    s = _schedule(lr)
    assert _kinds(s) == [("warmup", 1, 30), ("constant", 31, 800), ("cooldown", 801, 1000)]
    assert s.segments[2].shape == "linear"
    assert s.phase_at(900) == "cooldown" and s.unexplained == []


def test_schedule_constant() -> None:
    """A constant LR is one constant segment; no warm-up without a warm-up end."""
    s = _schedule(np.full(1000, _PEAK), None)
    assert _kinds(s) == [("constant", 1, 1000)] and s.unexplained == []


def test_schedule_step_decay() -> None:
    """Two x0.1 drops (at 400 and 700) after the warm-up: one step decay, two explained drops."""
    lr = np.where(_X <= 30, _WARM, _PEAK * 0.1 ** ((_X >= 400).astype(int) + (_X >= 700)))
    s = _schedule(lr)
    assert _kinds(s) == [("warmup", 1, 30), ("constant", 31, 399), ("decay", 400, 1000)]
    assert s.segments[2].shape == "step" and s.unexplained == []
    assert [(c.step, c.kind) for c in s.changes] == [(400, "step_drop"), (700, "step_drop")]
    assert s.changes[0].factor == pytest.approx(0.1)


def test_schedule_x50_for_ten_steps_is_unexplained() -> None:
    """A cosine schedule with the LR x50 at steps 500-509: that stretch is unexplained, and the
    decay around it is still read as one cosine."""
    lr = np.where(_X <= 30, _WARM, _PEAK * 0.5 * (1 + np.cos(np.pi * (_X - 30) / 970)))
    lr[499:509] *= 50
    s = _schedule(lr)
    (u,) = s.unexplained
    assert (u.start_step, u.end_step) == (500, 509)
    assert u.lr_start / u.lr_before == pytest.approx(50, rel=0.01)
    assert [(c.step, c.kind) for c in s.changes] == [(500, "jump_up"), (510, "jump_down")]
    assert s.phase_at(505) == "unexplained" and s.phase_at(520) == "decay"
    assert {g.shape for g in s.segments if g.kind == "decay"} == {"cosine"}
    assert s.peak == pytest.approx(_PEAK)


def test_schedule_restart_is_explained() -> None:
    """Cosine with a warm restart at step 500 (SGDR): a restart, nothing unexplained."""
    t = (_X - 1) % 500
    lr = _PEAK * 0.5 * (1 + np.cos(np.pi * t / 500))
    s = _schedule(lr, None)
    assert s.unexplained == []
    assert [(c.step, c.kind) for c in s.changes] == [(501, "restart")]


def test_schedule_printed_lr_is_not_a_staircase() -> None:
    """An LR printed with six decimals moves one digit at a time near zero: no step drops."""
    lr = np.round(_PEAK * 0.5 * (1 + np.cos(np.pi * _X / 1000)), 6)
    s = _schedule(lr, None)
    assert s.changes == () and _kinds(s) == [("decay", 1, 1000)]


def test_schedule_empty_and_tiny() -> None:
    """No LR: no segment, lr_at None; one point: one constant segment."""
    empty = _schedule(np.array([]), None)
    assert empty.empty and empty.lr_at(5) is None and empty.phase_at(5) is None
    assert _kinds(_schedule(np.array([1e-3]), None)) == [("constant", 1, 1)]


def test_plateau_reads_the_schedule() -> None:
    """The plateau's LR context is the schedule's: the phases it covers are stated."""
    frame, _ = trend_plateau(case="cosine_end")
    ev = Evidence(run_from_frame(frame))
    (f,) = PlateauDetector().detect(ev)
    assert f.measures["lr_end"] == ev.schedule.lr_at(f.end_step)
    assert f.judged_against["lr_phases"] == ",".join(
        ev.schedule.phases_between(f.start_step, f.end_step)
    )
    assert "decay" in str(f.judged_against["lr_phases"])
    peak = f.measures["lr_peak"]
    assert f.judged_against["decayed_lr"] == pytest.approx(0.1 * peak)  # an LR, not a level


@pytest.mark.parametrize("use_step_time", [False, True])
@pytest.mark.parametrize("noisy", [False, True])
def test_slow_points_found_from_window_maxima(
    use_step_time: bool, noisy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stall and throughput detectors select their rolling medians only where the
    window's largest rate could make a point slow or below its baseline: their findings are
    the ones computed with the medians of every point, bit for bit (a drop, isolated slow
    steps; a very noisy stretch, where the candidates are too many and the whole is
    computed)."""
    from forensics.detectors import stall, throughput
    from forensics.evidence import rolling

    frame, _ = trend_infra(n=200_000, drop=(90_000, 92_000), use_step_time=use_step_time)
    tag = "step_time" if use_step_time else "tokens_per_sec"
    rng = np.random.default_rng(7)
    slow_at = rng.choice(np.arange(0, 200_000, 10), size=12, replace=False).tolist()
    noise = pl.Series("noise", np.exp(rng.normal(0, 0.6, frame.height)))
    frame = (
        frame.with_columns(noise)
        .with_columns(
            pl.when(pl.col("step").is_in(slow_at) & (pl.col("tag") == tag))
            .then(pl.col("value") * (500.0 if use_step_time else 0.02))
            .when(pl.col("step").is_between(20_000, 30_000) & (pl.col("tag") == tag) & noisy)
            .then(pl.col("value") * pl.col("noise"))
            .otherwise(pl.col("value"))
            .alias("value")
        )
        .drop("noise")
    )
    run = run_from_frame(frame)
    selected: list[int] = []
    select = rolling._select_medians
    monkeypatch.setattr(rolling, "_select_medians", lambda *a: selected.append(1) or select(*a))
    found = [d.detect(Evidence(run)) for d in (ThroughputDetector(), StallDetector())]
    assert found[0] and found[1]
    assert bool(selected) != noisy  # a few candidates are selected; many: the whole series
    for mod in (stall, throughput):  # no bound: every point a candidate, the whole medians
        monkeypatch.setattr(mod, "window_max", lambda v, *_: np.full(len(v), np.inf))
    plain = [d.detect(Evidence(run)) for d in (ThroughputDetector(), StallDetector())]
    assert found == plain


def _sawtooth(leak_per_1k: float) -> object:
    """8,000 steps of memory filling from 1,000 to 3,000 MB over each 1,000 steps and freed,
    plus ``leak_per_1k`` MB per 1,000 steps that is never freed."""
    rng = np.random.default_rng(8)
    s = np.arange(1, 8001)
    mem = (
        1000 + 2000 * ((s % 1000) / 1000) + leak_per_1k * s / 1000 + 5 * rng.standard_normal(len(s))
    )
    return run_from_frame(long_frame({"memory_allocated_mb": (s, mem)}))


def test_a_memory_cycle_cut_by_the_end_of_the_log_is_not_a_leak() -> None:
    """A cache filled and emptied every 1,000 steps, the log ending mid-cycle: the last cycle
    read as "grew 1,007 MB over 506 steps without levelling off" (a warning) although memory
    never went higher than in the seven cycles before. A note says so."""
    run = _sawtooth(0.0)
    assert MemoryGrowthDetector().detect(Evidence(run)) == []
    assert any("a cycle the run has been through before, not a leak" in n for n in run.notes)


def test_a_leak_under_a_memory_cycle_is_still_found() -> None:
    """The same cycles over a floor that rises 400 MB every 1,000 steps: each cycle peaks
    higher than the last, a leak."""
    (f,) = MemoryGrowthDetector().detect(Evidence(_sawtooth(400.0)))
    assert f.kind is FindingKind.MEMORY_GROWTH and f.severity is Severity.WARNING
    # The sentence is about the leak, the cycles' rising lows, not the last cycle's climb (it
    # read "grew 1,204 MB over 504 steps", from 4,908 MB at step 7,460).
    assert f.summary.startswith("Memory cycles (freed and filled again) on a rising floor"), (
        f.summary
    )
    pace = 1000 * (f.measures["end_level"] - f.measures["start_level"])
    pace /= f.measures["end_level_step"] - f.measures["start_level_step"]
    assert pace == pytest.approx(400, rel=0.1)
    assert f.measures["end_level_step"] - f.measures["start_level_step"] > 4000


def test_noisy_memory_is_not_read_as_cycles() -> None:
    """Memory read at any phase of a step scatters (here 1,500 MB of white noise on 20 GB)
    and began to leak at step 8,000 (150 MB per 1,000 steps). Its bins' medians drop as often
    and as far as they rise, and a drop of half the last bins' climb read as "Memory cycles
    (freed and filled again) on a rising floor" in 3 of 20 seeds, the onset put at the
    analysed start (step 2,000, 6,000 steps before the leak); in 2 more the cycles' lows grew
    too little and the leak was missed. A cycle's drops dwarf its rises; noise's do not: all
    20 are found as growth, none as cycles."""
    found = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        s = np.arange(0, 20_000, 5)
        mem = 20_000 + rng.normal(0, 1500, len(s)) + np.where(s > 8000, (s - 8000) * 0.15, 0)
        run = run_from_frame(long_frame({"memory_allocated_mb": (s, mem)}))
        found += MemoryGrowthDetector().detect(Evidence(run))
    assert len(found) == 20
    assert not [f for f in found if f.summary.startswith("Memory cycles")]
    assert all(f.summary.startswith("Memory grew ") for f in found)
