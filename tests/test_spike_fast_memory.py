"""The spike search's lean paths against the plain computations, bit for bit.

* :func:`forensics.evidence.spikes.step_intervals` and ``robust.median_interval`` read the
  step intervals from one count of the step differences; the plain computations are the
  median of the positive differences of the steps as floats and
  ``np.median(np.diff(steps))``.
* :func:`forensics.evidence.spikes.find_spikes` reads the series' own arrays instead of the
  score's copies and gives the score back early: the same spikes as the reference
  computation (tests/spike_reference.py), on long spiky series with restarts.
"""

from __future__ import annotations

import numpy as np
import pytest

from forensics.evidence import robust
from forensics.evidence.spikes import step_intervals


def _plain_interval(steps: np.ndarray) -> float:
    """The median of the positive step differences, the plain way (float copies, np.median):
    what ``robust.median_interval`` computed before it counted the differences."""
    if len(steps) < 2:
        return 1.0
    d = np.diff(np.asarray(steps, dtype=float))
    d = d[d > 0]
    return float(np.median(d)) if len(d) else 1.0


def _plain(steps: np.ndarray) -> tuple[float, float]:
    shape = float(np.median(np.diff(steps))) if len(steps) > 1 else 1.0
    return _plain_interval(steps), shape


def _same(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return all(
        np.float64(x).tobytes() == np.float64(y).tobytes() for x, y in zip(a, b, strict=True)
    )


def _cases() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    every = np.arange(1, 200_001, dtype=np.int64)
    # A restarted run: a stretch logged again from an earlier step (sorted: repeated steps).
    restart = np.sort(np.concatenate([every[:5000], every[3000:9000]]))
    sparse = np.cumsum(rng.choice([10, 10, 10, 20, 50], size=30_001)).astype(np.int64)
    gaps = np.cumsum(rng.choice([1, 1, 1, 2, 100_000], size=5_001)).astype(np.int64)
    return {
        "every_step": every,
        "every_step_odd": every[:-1],
        "restart": restart,
        "sparse": sparse,
        "sparse_even": sparse[:-1],
        "gaps_beyond_count": gaps,
        "huge_gap": np.array([0, 1, 2, 3, 10**12], dtype=np.int64),
        "one_point": np.array([5], dtype=np.int64),
        "two_points": np.array([5, 9], dtype=np.int64),
        "repeated_only": np.full(10, 7, dtype=np.int64),
        "mostly_repeated": np.array([3, 3, 3, 3, 4, 4, 4, 9], dtype=np.int64),
        "unsorted": np.array([5, 3, 8, 8, 1, 20], dtype=np.int64),
        "empty": np.array([], dtype=np.int64),
        "float_steps": np.array([0.0, 1.0, 2.5, 4.0, 4.0, 7.0]),
        "halves": np.array([0, 1, 2, 4, 6, 7], dtype=np.int64),
        # Steps beyond 2^53: their float values differ by other amounts than the integers.
        "beyond_float": np.array([2**60, 2**60 + 1, 2**60 + 3, 2**60 + 200], dtype=np.int64),
        "int32": np.arange(0, 5000, 10, dtype=np.int32),
    }


@pytest.mark.parametrize("block", [1, 7, 1 << 16])
@pytest.mark.parametrize("name", sorted(_cases()))
def test_step_intervals_are_the_plain_medians(
    name: str, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(robust, "_DIFF_BLOCK", block)
    steps = _cases()[name]
    if len(steps) == 0:
        assert _same(step_intervals(steps), (robust.median_interval(steps), 1.0))
        return
    assert _same(step_intervals(steps), _plain(steps)), name


@pytest.mark.parametrize("block", [1, 7, 1 << 16])
@pytest.mark.parametrize("name", sorted(_cases()))
def test_median_interval_is_the_plain_median(
    name: str, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the differences counted a block at a time, of every size: the same median)
    monkeypatch.setattr(robust, "_DIFF_BLOCK", block)
    steps = _cases()[name]
    got, want = robust.median_interval(steps), _plain_interval(steps)
    assert np.float64(got).tobytes() == np.float64(want).tobytes(), name


def test_step_intervals_random_ints() -> None:
    rng = np.random.default_rng(11)
    for n in (2, 3, 4, 17, 1000, 70_001):
        for spread in (1, 3, 50, 5000):
            steps = np.sort(rng.integers(0, spread * n, size=n)).astype(np.int64)
            assert _same(step_intervals(steps), _plain(steps)), (n, spread)
            assert robust.median_interval(steps) == _plain_interval(steps), (n, spread)


def test_long_restarted_series_spikes_equal_the_reference() -> None:
    """A series longer than the score's blocks (65,536 points) with a restart (steps logged
    again), NaN and injected spikes: the lean search's spikes are the reference's."""
    from synthetic import long_frame, run_from_frame
    from test_spike_fast_path import _compare_runs

    rng = np.random.default_rng(3)
    n = 90_000
    steps = np.arange(1, n + 1, dtype=np.int64)
    steps[60_000:] -= 2_000  # the run went back 2,000 steps and logged them again
    level = 3.0 * (1.0 + steps / 5_000.0) ** -0.3
    loss = level * np.exp(rng.standard_normal(n) * 0.01)
    gn = np.abs(rng.standard_normal(n)) * 0.05 + 0.5
    for arr in (loss, gn):
        hits = rng.integers(1_000, n - 100, size=40)
        arr[hits] *= 6.0
    loss[rng.integers(0, n, size=5)] = np.nan
    frame = long_frame({"loss": (steps, loss), "grad_norm": (steps, gn)})
    assert _compare_runs(run_from_frame(frame)) >= 40


def test_log_steps_in_place_is_the_plain_abscissa() -> None:
    """log_steps of a 1-D array (computed in one array) equals the plain expression, bit for
    bit, and leaves its input alone."""
    from forensics.evidence.spike_shape import log_steps

    rng = np.random.default_rng(5)
    cases = [
        np.arange(-5, 200_000, dtype=np.int64),
        rng.integers(0, 2**40, size=1000),
        np.array([-0.0, 0.0, -3.5, 1e-300, 2.5, np.nan, np.inf, 1e308]),
        np.array([], dtype=np.int64),
        np.arange(10, dtype=np.int32),
    ]
    for steps in cases:
        before = steps.copy()
        got = log_steps(steps)
        want = np.log1p(np.maximum(np.asarray(steps, dtype=float), 0.0))
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
        assert np.array_equal(steps, before, equal_nan=steps.dtype.kind == "f")
    assert log_steps(7.0) == np.log1p(7.0)


def test_rolling_medians_in_their_own_mappings_are_polars() -> None:
    """Series long enough for the rolling medians' arrays to get mappings of their own
    (rolling._fresh): the same bits as polars' rolling medians, and ordinary writable arrays
    (robust.score writes its results over them)."""
    import polars as pl

    from forensics.evidence import rolling

    rng = np.random.default_rng(9)
    n = rolling._OWN_MAPPING_MIN + 12_345
    v = np.log(np.round(1.0 + np.abs(rng.standard_normal(n)), 3))  # ties, exact zeros
    v[rng.integers(0, n, size=200)] += 3.0  # spikes
    for w in (3, 5, 20, 41):
        got = rolling.centered_median(v, w)
        want = pl.Series(v).rolling_median(w, min_samples=1, center=True).to_numpy()
        assert got.tobytes() == want.astype(float).tobytes(), w
        assert got.flags.writeable and got.dtype == np.float64
    for w in (20, 21):
        got = rolling.polars_trailing_median(v, w, 1)
        want = pl.Series(v).rolling_median(w, min_samples=1).to_numpy()
        assert got.tobytes() == want.astype(float).tobytes(), w
        got[:5] = 0.0  # writable


def test_score_written_over_its_work_arrays_is_the_plain_score(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """robust.score writes each block's results over the work arrays it has read (when no
    watcher's memo holds them): the same frame, bit for bit, as with new result arrays."""
    rng = np.random.default_rng(4)
    n = 3 * (1 << 16) + 777  # several of the score's blocks, the last one short
    steps = np.arange(n, dtype=np.int64)
    loss = 2.0 * np.exp(rng.standard_normal(n) * 0.02)
    loss[rng.integers(0, n, size=100)] *= 4.0
    signed = np.round(rng.standard_normal(n), 2)
    signed[rng.integers(0, n, size=50)] = np.nan
    cases = [(loss, None), (signed, 500.0), (loss[:5000], 2000.0)]
    got = [robust.score(steps[: len(v)], v, confirm_until=c) for v, c in cases]
    monkeypatch.setattr(robust, "_reused", lambda a, own, n: np.empty(n))
    want = [robust.score(steps[: len(v)], v, confirm_until=c) for v, c in cases]
    for g, w in zip(got, want, strict=True):
        assert g.schema == w.schema and g.height == w.height
        for c in g.columns:
            a, b = g.get_column(c), w.get_column(c)
            assert a.is_null().to_list() == b.is_null().to_list(), c
            assert a.fill_null(0).to_numpy().tobytes() == b.fill_null(0).to_numpy().tobytes(), c
