"""``order_stats.slope_stats_rows`` (the spike trend windows' Theil-Sen order statistics, one
window at a time) against the plain computation: ``np.partition`` of each window's
``pairwise_slopes`` and of its first-half pairs, value for value; both ways of computing it
(numpy, and the compiled kernel ``forensics/evidence/_slopes.c`` where it was built)."""

from __future__ import annotations

import shutil
import sysconfig
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from test_spike_fast_path import _bits, _series

from forensics.evidence import order_stats
from forensics.evidence.robust import _interval_ranks
from forensics.evidence.spike_shape import log_steps

Stats = Callable[[np.ndarray, np.ndarray, list[int], list[int]], tuple[np.ndarray, np.ndarray]]


def _compiled(x: np.ndarray, y: np.ndarray, ks: list[int], ks_h: list[int]) -> Any:
    # Three threads, so that the rows are split unevenly and some thread gets one row.
    return order_stats.slope_stats_rows_compiled(x, y, ks, ks_h, threads=3)


@pytest.fixture(params=["numpy", "compiled", "compiled-plain"])
def stats(request: pytest.FixtureRequest) -> Iterator[Stats]:
    """Each way: numpy; the compiled kernel as it runs here; the compiled kernel without its
    AVX2 loops (what a processor without them runs: the same values)."""
    if request.param == "numpy":
        yield order_stats.slope_stats_rows_numpy
        return
    kernel = order_stats._slopes
    if kernel is None:
        pytest.skip("the compiled kernel was not built here (no C compiler at install)")
    was = kernel.simd()
    if request.param == "compiled-plain":
        kernel.simd(False)
    try:
        yield _compiled
    finally:
        kernel.simd(was)


def test_the_compiled_kernel_is_built_where_a_compiler_is() -> None:
    """setup.py builds the kernel as an optional extension: a failed build leaves the numpy
    path, the same numbers several times slower. Where a C compiler is found, it must have
    been built (or the install lost its speed without a word)."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) on this machine")
    assert order_stats._slopes is not None


def _ranks(n: int) -> tuple[list[int], list[int]]:
    """The ranks the trend fit selects (shape_batch._fit_rows): the interval's ends and the
    median of the whole, the median of the first half."""
    nt, h = n * (n - 1) // 2, n // 2
    nth = h * (h - 1) // 2
    lo, mid, hi = _interval_ranks(n, nt, 1.96)
    return sorted({lo, max(mid - 1, 0), mid, hi}), sorted({max(nth // 2 - 1, 0), nth // 2})


def _plain(x: np.ndarray, y: np.ndarray, ks: list[int], ks_h: list[int]) -> tuple[Any, Any]:
    n = x.shape[1]
    whole, half = [], []
    for r in range(len(x)):
        s = order_stats.pairwise_slopes(x[r], y[r])
        whole.append(np.partition(s, ks)[ks] + 0.0)
        if ks_h:
            h = s[order_stats.first_half_pairs(n)]
            half.append(np.partition(h, ks_h)[ks_h] + 0.0)
    return _bits(np.array(whole)), _bits(np.array(half))


def _windows(rng: np.random.Generator, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    if rng.random() < 0.5:  # every step from somewhere in the run
        steps = np.arange(n)[None, :] + rng.integers(0, 10**6, (k, 1))
    else:  # sparse, irregular steps
        steps = np.sort(rng.choice(np.arange(1, 10**6), (k, n)), axis=1) + np.arange(n)
    x = log_steps(steps)
    kind = int(rng.integers(0, 7))  # (no NaN: the caller sends no window with a NaN slope)
    y = np.stack([_series(rng, n, kind) for _ in range(k)])
    if rng.random() < 0.2:  # a straight line: every slope nearly the same
        y[0] = 0.5 * x[0] + 1.0
    if rng.random() < 0.2:  # sorted values: the slopes of short offsets all positive
        y[-1] = np.sort(y[-1])
    return x, y


def test_slope_stats_rows_equal_the_plain_selection(stats: Stats) -> None:
    rng = np.random.default_rng(53)
    for trial in range(60):
        n = int(rng.choice([80, 81, 97, 150, 300, 301]))
        k = int(rng.integers(1, 6))
        x, y = _windows(rng, k, n)
        ks, ks_h = _ranks(n)
        with np.errstate(all="ignore"):
            got, got_h = stats(x, y, ks, ks_h)
            want, want_h = _plain(x, y, ks, ks_h)
        assert _bits(got + 0.0) == want, trial
        assert _bits(got_h + 0.0) == want_h, trial


@pytest.mark.parametrize("margin", [-2.0, 0.0, 1.3, 6.0])
def test_slope_stats_rows_exact_whatever_the_bounds(
    monkeypatch: pytest.MonkeyPatch, margin: float
) -> None:
    """The sample's bounds decide only the speed: with none at all (every rank missed, each
    window sorted), no margin, and a wide one, the same values; and ranks anywhere, the
    first and the last included. (The numpy path's sample; the compiled kernel's misses are
    the extreme ranks of test_compiled_kernel_on_ties_infinite_slopes_and_many_rows.)"""
    monkeypatch.setattr(order_stats, "_PICK_MARGIN", margin)
    rng = np.random.default_rng(59)
    for trial in range(8):
        n = 300
        x, y = _windows(rng, 3, n)
        ks, ks_h = _ranks(n)
        if trial % 2:
            ks, ks_h = [0, 7, 20000, 44849], [0, 11174]
        with np.errstate(all="ignore"):
            got, got_h = order_stats.slope_stats_rows_numpy(x, y, ks, ks_h)
            want, want_h = _plain(x, y, ks, ks_h)
        assert _bits(got + 0.0) == want, (margin, trial)
        assert _bits(got_h + 0.0) == want_h, (margin, trial)


def test_slope_stats_rows_of_no_window_and_tiny_ones(stats: Stats) -> None:
    got, got_h = stats(np.empty((0, 300)), np.empty((0, 300)), [1], [2])
    assert got.shape == (0, 1) and got_h.shape == (0, 1)
    x = log_steps(np.arange(10)[None, :] + np.array([[5], [900]]))
    y = np.random.default_rng(61).standard_normal((2, 10))
    got, got_h = stats(x, y, [0, 22, 44], [0, 9])
    want, want_h = _plain(x, y, [0, 22, 44], [0, 9])
    assert _bits(got + 0.0) == want and _bits(got_h + 0.0) == want_h


def test_compiled_kernel_on_ties_infinite_slopes_and_many_rows(stats: Stats) -> None:
    """Windows the numpy path meets rarely: a few distinct values (runs of equal slopes
    across the bins), values near the largest double (differences that overflow to an
    infinite slope, so an infinite bound), a constant window (every slope zero), and more
    windows than a thread takes (the rows split between threads)."""
    rng = np.random.default_rng(73)
    n = 300
    x, y = _windows(rng, 40, n)
    y[0:10] = np.round(y[0:10], 1) + 1.0  # ties (no -0.0: the values stay positive)
    y[10:14] = rng.choice([1e308, -1e308, 5e307, 1.0], (4, n))  # overflowing differences
    y[14] = 2.5  # every slope 0.0
    ks, ks_h = _ranks(n)
    for ranks, ranks_h in [(ks, ks_h), ([0, 1, 22424, 44848, 44849], [0, 5587, 11174])]:
        with np.errstate(all="ignore"):
            got, got_h = stats(x, y, ranks, ranks_h)
            want, want_h = _plain(x, y, ranks, ranks_h)
        assert _bits(got + 0.0) == want
        assert _bits(got_h + 0.0) == want_h


def test_compiled_kernel_refuses_what_it_cannot_read() -> None:
    """The kernel checks its arguments (a wrong dtype, shape, order of ranks or row range is
    a ValueError, never a read out of bounds)."""
    if order_stats._slopes is None:
        pytest.skip("the compiled kernel was not built here (no C compiler at install)")
    k, n = 2, 100
    x = np.tile(np.arange(n, dtype=float), (k, 1))
    got, got_h = np.empty((k, 2)), np.empty((k, 1))
    call = order_stats._slopes.stats_rows
    call(x, x, k, n, (3, 4), (5,), got, got_h, 0, k)  # fine
    bad = [
        (x.astype(np.float32), x, k, n, (3, 4), (5,), got, got_h, 0, k),
        (x, x, k, n + 1, (3, 4), (5,), got, got_h, 0, k),
        (x, x, k, n, (4, 3), (5,), got, got_h, 0, k),
        (x, x, k, n, (3, n * n), (5,), got, got_h, 0, k),
        (x, x, k, n, (3, 4), (5,), got, got_h, 0, k + 1),
        (x, x, k, n, (3, 4), (5,), np.empty((k, 3)), got_h, 0, k),
        (x[:, ::2].copy(), x, k, n, (3, 4), (5,), got, got_h, 0, k),
    ]
    for args in bad:
        with pytest.raises(ValueError):
            call(*args)


@pytest.mark.parametrize("margin", [-2.0, 0.0, 1.3, 6.0])
def test_select_with_part_equals_the_plain_selection(
    monkeypatch: pytest.MonkeyPatch, margin: float
) -> None:
    """The whole's ranks and, where the whole's bounds bracket them, a part's: each the value
    np.partition gives (the part's None only where they do not, and not always None)."""
    monkeypatch.setattr(order_stats, "_PICK_MARGIN", margin)
    rng = np.random.default_rng(67)
    parts = 0
    for trial in range(40):
        n = int(rng.choice([80, 150, 300]))
        x, y = _windows(rng, 1, n)
        with np.errstate(all="ignore"):
            a = order_stats.pairwise_slopes(x[0], y[0]) + 0.0
            if trial % 5 == 4:  # ties: a few distinct values
                a = np.round(a, 1)
        part = order_stats._first_half_mask(n) if trial % 2 else rng.random(len(a)) < 0.25
        ks, ks_h = _ranks(n)
        ks_part = sorted({int(v) for v in rng.integers(0, int(part.sum()), 2)})
        if trial % 3 == 0:
            ks_part = ks_h
        bracket = order_stats._Bracket(len(a), ks)
        got, got_part = bracket.select_with_part(a, part, np.asarray(ks_part, dtype=np.intp))
        assert _bits(got + 0.0) == _bits(np.partition(a, ks)[ks] + 0.0), trial
        if got_part is not None:
            parts += 1
            want = np.partition(a[part], ks_part)[ks_part] + 0.0
            assert _bits(got_part + 0.0) == _bits(want), trial
    if margin > 0:
        assert parts > 0


def test_binned_ranks_equal_the_plain_partition() -> None:
    """The bins between two bounds say which values to partition: ties, a value on each
    bound, equal bounds (no scale: one partition of all) and an infinite bound give the
    ranks np.partition gives; the first and last rank included."""
    rng = np.random.default_rng(71)
    cases = []
    for _ in range(30):
        v = rng.standard_normal(int(rng.integers(5, 5000)))
        if rng.random() < 0.3:
            v = np.round(v, 1)  # ties across bin edges
        cases.append(v)
    cases.append(np.full(700, 0.25))  # low == high
    cases.append(np.array([1.0, np.inf, 2.0, np.inf, 3.0] * 50))  # high infinite
    cases.append(np.array([-np.inf, 0.0, 1.0, 5e-324, 1e308] * 50))  # low infinite, extremes
    for i, v in enumerate(cases):
        low, high = np.float64(v.min()), np.float64(v.max())
        n = len(v)
        ks = np.array(sorted({0, n // 3, n // 2, n // 2 + 1, n - 1} & set(range(n))), np.intp)
        with np.errstate(all="ignore"):
            bins = order_stats._bins_of(v, low, high)
            got = order_stats._binned(v, low, high, ks, bins)
        assert _bits(got + 0.0) == _bits(np.partition(v, ks)[ks] + 0.0), i
        if i < 30:
            assert bins is not None  # finite, distinct bounds: binned
    assert order_stats._bins_of(cases[30], np.float64(0.25), np.float64(0.25)) is None
