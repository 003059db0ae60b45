"""The compiled bin medians (``_slopes.medians`` through ``order_stats.bin_medians``) against
``np.median`` bin by bin, bit for bit: ties, signed zeros, NaN, heavy tails, sorted runs, and
the sizes where the bracketed selection takes its fallback."""

from __future__ import annotations

import numpy as np
import pytest

from forensics.evidence import order_stats
from forensics.evidence.trend_utils import bin_median

pytestmark = pytest.mark.skipif(order_stats._slopes is None, reason="the C kernel is not built")


def _bins(a: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """np.median of each bin, one by one."""
    return np.array([np.median(a[lo:hi]) for lo, hi in zip(edges[:-1], edges[1:], strict=True)])


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal bit for bit (every NaN alike)."""
    nan = np.isnan(want)
    return bool(
        np.array_equal(np.isnan(got), nan)
        and np.array_equal(got[~nan].view(np.int64), want[~nan].view(np.int64))
    )


def _values(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal(n)
    if kind == "ties":  # few distinct values, zeros of both signs among them
        return rng.integers(-3, 4, n).astype(float) * rng.choice([0.0, -0.0, 1.0], n)
    if kind == "zeros":
        a = np.zeros(n)
        a[rng.integers(0, n, n // 3)] = -0.0
        return a
    if kind == "walk":  # nearly sorted within a bin
        return np.cumsum(rng.standard_normal(n))
    if kind == "cauchy":  # a sample's bracket misses often
        return rng.standard_cauchy(n) ** 3
    if kind == "nan":
        a = rng.standard_normal(n)
        a[rng.integers(0, n, 2)] = np.nan
        return a
    if kind == "inf":
        a = rng.standard_normal(n)
        a[rng.integers(0, n, 5)] = np.inf
        a[rng.integers(0, n, 5)] = -np.inf
        return a
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["normal", "ties", "zeros", "walk", "cauchy", "nan", "inf"])
def test_bins_match_numpy(kind: str) -> None:
    rng = np.random.default_rng(len(kind))
    for n in [1, 2, 3, 4095, 4096, 4097, 8191, 50_001, 300_000]:
        a = _values(kind, n, rng)
        for nb in {1, 2, 7, min(n, 200)}:
            edges = np.linspace(0, n, min(nb, n) + 1).astype(np.int64)
            got = order_stats.bin_medians(a, edges)
            assert got is not None
            want = _bins(a, edges)
            assert _same(got, want), (kind, n, nb)
            whole = np.array([np.median(a)])
            assert _same(np.array([order_stats.median(a)]), whole)
            assert _same(np.array([order_stats.median_value(a)]), whole)


def test_other_layouts_are_left_to_the_caller() -> None:
    a = np.arange(10_000, dtype=float)
    assert order_stats.bin_medians(a.astype(np.float32), np.array([0, 10_000])) is None
    assert order_stats.bin_medians(a[::2], np.array([0, 5_000])) is None
    assert order_stats.bin_medians(a.astype(np.int64), np.array([0, 10_000])) is None


def test_median_value_of_other_types() -> None:
    rng = np.random.default_rng(5)
    for a in [rng.integers(-9, 9, 10_001), rng.standard_normal(9_999).astype(np.float32)]:
        assert order_stats.median_value(a) == float(np.median(a))


def test_a_bad_bin_is_an_error_not_a_crash() -> None:
    a = np.arange(100, dtype=float)
    with pytest.raises(ValueError, match="out of range or empty"):
        order_stats.bin_medians(a, np.array([0, 50, 50, 100]))
    with pytest.raises(ValueError, match="out of range or empty"):
        order_stats.bin_medians(a, np.array([0, 101]))


def test_bin_median_of_a_long_series() -> None:
    """trend_utils.bin_median (the plateau's and Theil-Sen's bins) takes the kernel on a long
    float64 series, its bins split between the cores: numpy's numbers all the same."""
    rng = np.random.default_rng(3)
    n = 1_000_003
    steps = np.arange(n, dtype=np.int64) * 2
    values = np.exp(-steps / 5e5) + 0.01 * rng.standard_normal(n)
    xs, ys = bin_median(steps, values, max_bins=200)
    edges = np.linspace(0, n, 201).astype(int)
    want = _bins(values, edges)
    assert _same(ys, want)
    assert _same(xs, _bins(steps, edges))
