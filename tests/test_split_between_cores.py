"""Work split between the cores gives the numbers of the work done in one piece.

The printing resolution's sort (``robust.positive_gaps``: split at the median, each half sorted
in its own thread), ``bin_median``'s blocks of bins, and the spike batch's trend-fit and
plateau chunks (``shape_batch``) each run in two threads on a long series. Each test makes
the split happen on a small input (the thresholds lowered, two cores assumed), checks that it
did, and compares the results bit for bit with the one-piece computation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_shape_batch_chunks import _case
from test_spike_fast_path import _bits

from forensics.evidence import order_stats, robust, shape_batch, trend_utils


@pytest.fixture
def parts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Two cores assumed; the number of parts of every ``in_parts`` call, in order."""
    seen: list[int] = []
    real = order_stats.in_parts

    def counted(total: int, each_min: int, work: Any, threads: int | None = None) -> None:
        seen.append(min(threads or 2, max(1, total // each_min)))
        real(total, each_min, work, threads)

    monkeypatch.setattr(order_stats, "cores", lambda: 2)
    monkeypatch.setattr(robust, "cores", lambda: 2)
    monkeypatch.setattr(order_stats, "in_parts", counted)
    monkeypatch.setattr(trend_utils, "in_parts", counted)
    return seen


def _gaps_whole(v: np.ndarray) -> np.ndarray:
    d = np.diff(np.sort(v))
    return d[d > 0]


def _series(rng: np.random.Generator) -> list[np.ndarray]:
    n = int(rng.integers(50, 400))
    return [
        rng.standard_normal(n),
        rng.standard_normal(n + 1),  # odd length
        np.round(rng.random(n), 2),  # printed values: ties
        np.r_[np.zeros(n), -np.zeros(n), rng.random(n) - 0.5],  # zeros of both signs
        np.full(n, 3.25),  # one value
        rng.integers(0, 4, n).astype(float),  # few values
        np.r_[1e-300, 1e300, rng.lognormal(0, 5, n)],
    ]


def test_positive_gaps_split_at_the_median_are_the_whole_sorts(
    parts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(robust, "_SPLIT_SORT_MIN", 4)
    rng = np.random.default_rng(5)
    for _ in range(20):
        for v in _series(rng):
            parts.clear()
            assert np.array_equal(robust.sorted_values(v), np.sort(v))  # (-0.0 == 0.0)
            got = robust.positive_gaps(v)
            assert parts == [2, 2]
            assert _bits(got) == _bits(_gaps_whole(v))
            want = float(np.percentile(_gaps_whole(v), 5)) if len(_gaps_whole(v)) >= 2 else 0.0
            assert _bits(robust.resolution(v)) == _bits(want)


def test_a_short_series_is_sorted_whole(parts: list[int]) -> None:
    v = np.random.default_rng(2).standard_normal(1000)
    assert _bits(robust.positive_gaps(v)) == _bits(_gaps_whole(v))
    assert parts == []  # (below the threshold: no thread)


def test_bin_medians_split_between_threads_are_the_one_piece_medians(
    parts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(11)
    cases = []
    for n in (250, 1_001, 5_000, 40_000):
        steps = np.cumsum(rng.integers(1, 4, n))
        cases += [
            (steps, rng.standard_normal(n), False),
            (steps, np.round(rng.random(n), 1), False),
            (steps.astype(np.int32), rng.integers(0, 9, n).astype(np.int64), True),
            (rng.permutation(steps), rng.standard_normal(n), False),  # steps out of order
        ]
    monkeypatch.setattr(trend_utils, "_BIN_BLOCK", 500)  # several blocks even when short
    for steps, values, as_float in cases:
        monkeypatch.setattr(trend_utils, "_BIN_SPLIT_MIN", 1 << 40)
        parts.clear()
        want = trend_utils.bin_median(steps, values, max_bins=120, as_float=as_float)
        assert parts in ([], [1])
        monkeypatch.setattr(trend_utils, "_BIN_SPLIT_MIN", 0)
        parts.clear()
        got = trend_utils.bin_median(steps, values, max_bins=120, as_float=as_float)
        assert parts == ([2] if len(values) > 120 else [])
        assert _bits(got) == _bits(want)


def test_trend_fits_and_plateaus_in_threaded_chunks_are_the_whole_groups(
    parts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(23)
    split = 0
    fits: list[int | None] = []  # each trend chunk's kernel threads (1: a thread's own core)
    real_fit = shape_batch._fit_rows
    monkeypatch.setattr(shape_batch, "_fit_rows", lambda *a: fits.append(a[-1]) or real_fit(*a))
    for trial in range(10):
        steps, values, spikes, kw = _case(rng, trial)
        want = shape_batch.measure_many(steps, values, spikes, **kw)
        with monkeypatch.context() as m:
            m.setattr(shape_batch, "_CHUNK_ROWS", 3)  # trend windows: a few a chunk
            m.setattr(shape_batch, "_CHUNK_CELLS", 64)  # plateaus: a few rows a chunk
            parts.clear()
            got = shape_batch.measure_many(steps, values, spikes, **kw)
        assert _bits(got) == _bits(want), trial
        split += parts.count(2)
    assert split >= 10  # chunks went to two threads
    assert fits.count(1) > 20 and None in fits  # (None: one chunk, the kernel's own split)
