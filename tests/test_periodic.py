"""periodic_spikes: regular and shrinking intervals, periods the log reveals, no pattern in chance
spikes."""

from __future__ import annotations

import numpy as np
import pytest
from report_text import card_texts
from synthetic import healthy_grad_norm, long_frame, run_from_frame, spiky_loss

from forensics.detectors import params_for, periodic
from forensics.detectors.periodic import PeriodicSpikeDetector
from forensics.evidence import Evidence
from forensics.findings import FindingKind, Severity
from forensics.measures import MEASURES
from forensics.pipeline import analyze_run


def _run(n: int, at: list[int], *, seed: int = 0, every: int = 1, **extra):
    (s, v), _ = spiky_loss(
        n, seed=seed, every=every, spikes=[dict(at=a, height=0.8, tau=10) for a in at]
    )
    series = {"train/loss": (s, v)}
    series.update(
        {k.replace("__", "/"): fn(s) for k, fn in extra.items()}
    )  # fn(steps) -> (steps, values)
    return run_from_frame(long_frame(series))


def _periodic(run, **params):
    return [
        f
        for f in PeriodicSpikeDetector(params_for(PeriodicSpikeDetector, params)).detect(
            Evidence(run)
        )
        if f.kind is FindingKind.PERIODIC_SPIKES
    ]


def test_regular_spikes_are_a_warning_with_their_period():
    """Spikes every 700 steps from step 1000: warning, period 700, count 5."""
    (f,) = _periodic(_run(5000, [1000, 1700, 2400, 3100, 3800]))
    assert f.severity is Severity.WARNING and f.metric == "loss"
    assert f.measures["period_steps"] == pytest.approx(700, abs=2)
    assert f.measures["count"] == 5 and f.start_step == 1000 and f.end_step == 3800
    assert f.measures["shrinking"] is False


def test_shrinking_intervals_are_critical():
    """Intervals 1200, 1000, 800, 600 (the article's data-refresh pattern): critical, trend
    negative."""
    (f,) = _periodic(_run(5000, [600, 1800, 2800, 3600, 4200]))
    assert f.severity is Severity.CRITICAL and f.measures["shrinking"] is True
    assert f.measures["interval_trend"] == pytest.approx(-200, abs=5)
    assert f.measures["first_interval"] > f.measures["last_interval"]


def test_shrinking_intervals_of_thousands_of_steps_are_written_with_separators():
    """The article's every-3,000-steps pattern, shrinking: the sentence printed "from about
    2523 to 1538 steps" beside "every 2,004 steps"; every count a reader sees has separators."""
    (f,) = _periodic(_run(12000, [3000, 5550, 7717, 9558, 11122]))
    assert f.severity is Severity.CRITICAL
    first, last = f.measures["first_interval"], f.measures["last_interval"]
    assert first > 1000 and last > 1000
    assert f"from about {first:,.0f} to {last:,.0f} steps" in f.summary, f.summary
    assert "," in f"{first:,.0f}"


def test_spikes_at_epoch_starts_match_the_epoch_length():
    """Spikes at each epoch start (epoch = 800 steps) plus two unrelated ones: matched to the
    epoch."""
    at = [800, 1600, 2400, 3200, 4000, 1234, 2950]
    run = _run(4600, sorted(at), train__epoch=lambda s: (s, s / 800.0))
    (f,) = _periodic(run)
    assert f.measures["matches"] == "epoch" and f.measures["matched_period_steps"] == pytest.approx(
        800
    )
    assert f.measures["count"] == 5 and abs(f.measures["phase_steps"]) <= 2


def test_regular_spikes_matched_to_the_eval_interval():
    """Spikes every 500 steps, evals every 250: matched to the eval interval, multiple 2."""
    run = _run(
        4000,
        [1000, 1500, 2000, 2500, 3000],
        val__loss=lambda s: (s[::250], np.full(len(s[::250]), 3.0)),
    )
    (f,) = _periodic(run)
    assert f.measures["matches"] == "eval_interval" and f.measures["multiple"] == 2


@pytest.mark.parametrize("seed", range(8))
def test_chance_spikes_make_no_pattern(seed: int):
    """Six spikes at random steps are not called periodic."""
    rng = np.random.default_rng(seed)
    at = sorted(rng.choice(np.arange(300, 9500, 50), 6, replace=False).tolist())
    assert _periodic(_run(10000, at, seed=seed)) == []


def test_too_few_spikes():
    """Three regular spikes are below min_count."""
    assert _periodic(_run(4000, [1000, 2000, 3000])) == []


def test_grad_norm_periodicity_is_reported_on_the_grad_norm():
    """Periodic grad-norm spikes give a finding with metric grad_norm."""
    s, g = healthy_grad_norm(5000)
    g = g * np.where(np.isin(s, [1000, 1800, 2600, 3400, 4200]), 6.0, 1.0)
    run = run_from_frame(long_frame({"train/grad_norm": (s, g)}))
    (f,) = _periodic(run)
    assert f.metric == "grad_norm" and f.measures["period_steps"] == pytest.approx(800)


def test_every_measure_key_is_documented():
    """Each measures key is declared, with a meaning, in forensics.measures (the table the
    module docstring points to)."""
    assert "forensics.measures" in (periodic.__doc__ or "")
    names = {m.key for m in MEASURES["periodic_spikes"] if m.meaning}
    (f,) = _periodic(_run(5000, [1000, 1700, 2400, 3100, 3800]))
    assert set(f.measures) <= names, set(f.measures) - names


def test_spikes_after_each_lr_restart_match_the_restart_interval():
    """Cosine restarts every 1000 steps with a spike 5 steps after each: matched to lr_restart."""
    run = _run(
        6000,
        [1005, 2005, 3005, 4005, 5005],
        train__lr=lambda s: (s, 3e-4 * (0.55 + 0.45 * np.cos(np.pi * (s % 1000) / 1000))),
    )
    (f,) = _periodic(run)
    assert f.measures["matches"] == "lr_restart" and f.measures[
        "matched_period_steps"
    ] == pytest.approx(1000)
    assert f.measures["phase_steps"] == pytest.approx(5, abs=1)


def _card_text(run) -> str:  # noqa: ANN001
    """The text of the report's "Recurring spikes" card."""
    (text,) = card_texts(analyze_run(run), "periodic_spikes")
    return text


def test_card_of_a_steady_period_says_it_holds():
    """The card said "A period that shrinks over time points at a data source refreshed on a
    schedule." beside a period that holds (the periodic_spikes sample: 125 steps at the first
    spike and at the last): a reader took the run for the shrinking case. It now says what
    was measured."""
    text = _card_text(_run(5000, [1000, 1700, 2400, 3100, 3800]))
    assert (
        "About every 700 steps, the interval about the same from the first spike to the last "
        "(about 700 then 700 steps): not the shrinking interval" in text
    ), text
    assert "A period that shrinks over time" not in text


def test_card_of_a_shrinking_period_gives_its_intervals():
    """Intervals of thousands of steps, with separators, as in the sentence above the card; the
    cause is the article's, which the log cannot show: a hypothesis."""
    run = _run(12000, [3000, 5550, 7717, 9558, 11122])
    (f,) = _periodic(run)
    first, last = f.measures["first_interval"], f.measures["last_interval"]
    text = _card_text(run)
    assert (
        f"About every {f.measures['period_steps']:,.0f} steps, the interval shrinking from about "
        f"{first:,.0f} to {last:,.0f} steps: the pattern a data subset refreshed on a timer "
        "leaves (a hypothesis: the log does not show the data source)" in text
    ), text


def test_card_of_a_growing_period_does_not_call_it_steady():
    """Intervals 600, 800, 1,000, 1,200: growing, neither steady nor the shrinking case."""
    run = _run(6000, [600, 1200, 2000, 3000, 4200])
    (f,) = _periodic(run)
    assert f.measures["shrinking"] is False
    first, last = f.measures["first_interval"], f.measures["last_interval"]
    text = _card_text(run)
    assert f"the interval growing from about {first:,.0f} to {last:,.0f} steps" in text, text
    assert "about the same" not in text


def test_thousands_of_regular_spikes_are_still_periodic_and_chance_ones_are_not():
    """The Monte Carlo throws at most ``_MC_ONSETS`` random onsets (it threw one per spike:
    2.4 s of CPU for 5,000 spikes, growing with each). 1,000 onsets every 200 steps are
    regular; 1,000 drawn at random over the same span are not."""
    from forensics.detectors.periodic import _MC_ONSETS, _Intervals, _regularity_p

    regular = np.arange(1000, 201_000, 200, dtype=float)
    assert len(regular) > _MC_ONSETS
    line = _Intervals.of(regular)
    assert line.spread == 0.0
    assert _regularity_p(regular, line.spread, line.linear) == pytest.approx(1 / 2001)
    chance = np.sort(np.random.default_rng(3).uniform(1000, 201_000, len(regular)))
    drawn = _Intervals.of(chance)
    assert drawn.spread > 0.5  # (far from the 0.2 a pattern needs: judged anyway)
    assert _regularity_p(chance, drawn.spread, drawn.linear) > 0.5


def test_the_onset_cap_only_makes_the_test_stricter():
    """Random onsets look less regular the more there are: a spread that 200 random onsets
    reach some of the time, 1,000 reach less often. So judging a long run's spikes against 200
    gives a p-value no smaller than its own (checked here against the uncapped simulation)."""
    from forensics.detectors import periodic as mod

    onsets = np.arange(0.0, 1000 * 50, 50)
    observed = (0.85, 1.05, 1.15)
    capped = [mod._regularity_p(onsets, o, True, sims=400) for o in observed]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mod, "_MC_ONSETS", len(onsets))
        full = [mod._regularity_p(onsets, o, True, sims=400) for o in observed]
    # (1,000 random onsets never reach 1.15 in 400 draws; 200 do one time in ten)
    assert full == [pytest.approx(1 / 401)] * 3
    assert capped[0] == pytest.approx(1 / 401) and 0.01 < capped[1] < capped[2]
