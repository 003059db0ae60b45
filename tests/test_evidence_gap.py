"""The train/val gap of the evidence layer (forensics/evidence/gap.py) on synthetic series with
a known gap and a known eval noise."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import long_frame, run_from_frame

from forensics.evidence import Evidence
from forensics.evidence.gap import Gap, train_val_gap
from forensics.params import resolve


def _curve(s: np.ndarray) -> np.ndarray:
    return 1.5 + 2.0 / (1.0 + s / 500.0) ** 0.6


def _run(
    *,
    n: int = 20_000,
    every: int = 10,
    val_every: int = 250,
    gap: float | np.ndarray = 0.1,
    val_sigma: float = 0.01,
    train_sigma: float = 0.02,
    seed: int = 0,
    spikes: bool = False,
):
    """Train = curve with multiplicative noise; val = curve + ``gap`` + N(0, val_sigma)."""
    rng = np.random.default_rng(seed)
    ts = np.arange(0, n, every)
    train = _curve(ts) * np.exp(rng.normal(0.0, train_sigma, len(ts)))
    if spikes:  # loss spikes right at some val steps: the smoothed train must ignore them
        at = np.isin(ts, np.arange(val_every, n, 4 * val_every))
        train = np.where(at, 5.0 * train, train)
    vs = np.arange(val_every, n + 1, val_every)
    g = gap(vs) if callable(gap) else np.full(len(vs), gap)
    val = _curve(vs) + g + rng.normal(0.0, val_sigma, len(vs))
    return run_from_frame(long_frame({"loss": (ts, train), "val_loss": (vs, val)}))


@pytest.mark.parametrize("seed", range(3))
def test_known_gap_and_noise(seed: int) -> None:
    """A constant 0.1 gap with 0.01 eval noise: the gap is 0.1 at every eval, the noise 0.01."""
    g = Evidence(_run(seed=seed)).gap
    assert isinstance(g, Gap)
    assert g.steps.tolist() == list(range(250, 20_001, 250))
    np.testing.assert_allclose(g.gap, g.val - g.train)
    assert np.median(g.gap) == pytest.approx(0.1, abs=0.005)
    assert np.abs(g.gap - 0.1).max() < 0.06  # no eval is far off: train is smoothed, not raw
    np.testing.assert_allclose(g.train, _curve(g.steps), rtol=0.02)
    assert g.val_noise == pytest.approx(0.01, rel=0.35)
    # The gap also carries what smoothing leaves of the train noise: a median of 25 train
    # points with 2% noise on a loss near 2 is about 1.25 x 0.04 / 5 = 0.01.
    assert g.noise >= g.val_noise
    assert g.noise == pytest.approx(np.hypot(0.01, 0.01), rel=0.35)


def test_geometry_of_the_windows() -> None:
    """Interval, train half width and acceleration window follow the documented rules."""
    g = Evidence(_run()).gap
    assert g is not None
    assert g.interval == 250
    assert g.half_width == 125  # max(interval / 2, 2 x train interval of 10)
    assert g.window == 1000  # the article's 1000 steps on a long log
    assert (g.accel_ratio, g.noise_k) == (1.5, 2.0)
    short = Evidence(_run(n=3000, val_every=100)).gap
    assert short is not None
    # a short log: a sixth of its span (2900 / 6), still at least two val intervals
    assert short.window == pytest.approx(2900 / 6)
    sparse = Evidence(_run(n=20_000, val_every=2000)).gap
    assert sparse is not None and sparse.window == 4000  # two val intervals
    assert sparse.half_width == 1000


def test_train_spikes_do_not_reach_the_gap() -> None:
    """Loss spikes logged at val steps are dropped before the train loss is smoothed."""
    g = Evidence(_run(spikes=True, train_sigma=0.005)).gap
    assert g is not None
    np.testing.assert_allclose(g.train, _curve(g.steps), rtol=0.01)
    assert len(g.train_values) < 2000  # the spikes left the train series


def test_growth_of_a_widening_gap() -> None:
    """A gap widening by 0.1 per 1000 steps grows 0.1 per window, the same as the window
    before: widening above the floor, but not accelerating (1x, not 1.5x)."""
    g = Evidence(_run(gap=lambda s: 0.05 + 1e-4 * s, val_sigma=0.002, train_sigma=0.005)).gap
    assert g is not None
    two = g.steps - 2 * g.window >= g.steps[0]
    assert np.isnan(g.growth_last[~two]).all() and np.isnan(g.growth_prev[~two]).all()
    assert np.median(g.growth_last[two]) == pytest.approx(0.1, abs=0.003)
    assert np.median(g.growth_prev[two]) == pytest.approx(0.1, abs=0.003)
    assert g.widening[two].mean() > 0.9
    assert not g.accelerating.any()


def test_acceleration_after_an_onset() -> None:
    """A flat gap that starts growing quadratically at 10000: accelerating after the onset
    only, and the floor is what the growth beats there."""
    gap = lambda s: 0.1 + np.where(s > 10_000, 4e-9 * (s - 10_000) ** 2, 0.0)  # noqa: E731
    g = Evidence(_run(gap=gap, val_sigma=0.003, train_sigma=0.005)).gap
    assert g is not None
    hits = g.steps[g.accelerating]
    assert len(hits) and hits.min() > 10_000 and hits.min() <= 13_000
    first = int(np.argmax(g.accelerating))
    assert g.growth_last[first] > g.growth_floor[first]
    assert g.growth_last[first] > g.accel_ratio * max(g.growth_prev[first], 0.0)
    np.testing.assert_allclose(
        g.growth_floor, g.noise_k * np.sqrt(2) * np.maximum(g.noise, g.local_noise)
    )


@pytest.mark.parametrize("seed", range(3))
def test_constant_gap_never_accelerates(seed: int) -> None:
    g = Evidence(_run(seed=seed)).gap
    assert g is not None and not g.accelerating.any()


def test_binned_keeps_noise_and_window() -> None:
    """Long logs are searched on bin medians: same noise, window and interval."""
    g = Evidence(_run(n=100_000, every=20, val_every=50)).gap
    assert g is not None and len(g) == 2000
    b = g.binned(400)
    assert len(b) == 400 and len(b.train) == 400
    assert (b.noise, b.window, b.interval) == (g.noise, g.window, g.interval)
    np.testing.assert_allclose(b.gap, b.val - b.train)
    assert np.median(b.gap) == pytest.approx(0.1, abs=0.005)
    assert g.binned(5000) is g


def test_computed_once_with_the_configured_parameters() -> None:
    """ev.gap is cached and built with the configured train_val parameters."""
    run = _run()
    ev = Evidence(run, resolve({"train_val": {"min_window": 600, "accel_ratio": 2.0}}))
    assert ev.gap is ev.gap
    assert ev.gap is not None and ev.gap.window == 600 and ev.gap.accel_ratio == 2.0
    assert train_val_gap(ev) is not ev.gap  # the function computes, the evidence caches
    own = ev.using("train_val", resolve({})["train_val"]).gap  # a detector configured apart
    assert own is not None and own.window == 1000 and ev.gap.window == 600


def test_no_gap_without_both_series() -> None:
    run = _run()
    frame = run.frame
    import polars as pl

    no_val = run_from_frame(frame.filter(pl.col("metric") != "val_loss"))
    assert Evidence(no_val).gap is None
    no_train = run_from_frame(frame.filter(pl.col("metric") != "loss"))
    assert Evidence(no_train).gap is None
    one_val = run_from_frame(
        frame.filter((pl.col("metric") != "val_loss") | (pl.col("step") == 250))
    )
    assert Evidence(one_val).gap is None
