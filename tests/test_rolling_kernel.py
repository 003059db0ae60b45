"""The compiled rank filter (forensics/evidence/_rolling.c) against the plain sort of each
window. (tests/test_rolling_exact.py runs the rolling medians through it and through scipy's
filter against the libraries' numbers.)"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from tests.test_rolling_exact import _data


def _kernel() -> ModuleType:
    from forensics.evidence import rolling

    if rolling._rolling is None:
        pytest.skip("the compiled rank filter was not built here (no C compiler at install)")
    return rolling._rolling


def test_the_compiled_rank_filter_is_built_where_a_compiler_is() -> None:
    """setup.py builds the rank filter as an optional extension (scipy's filter otherwise: the
    same numbers, one pass per rank, holding the GIL). Where a C compiler is found, it must
    have been built."""
    import shutil
    import sysconfig

    from forensics.evidence import rolling

    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) on this machine")
    assert rolling._rolling is not None


def _sorted_windows(v: np.ndarray, size: int) -> np.ndarray:
    """Each position's window (mode="nearest": the ends repeated), sorted: the plain answer."""
    left = size // 2
    padded = np.concatenate([np.full(left, v[0]), v, np.full(size - 1 - left, v[-1])])
    return np.sort(np.lib.stride_tricks.sliding_window_view(padded, size), axis=1)


@pytest.mark.parametrize("kind", ["normal", "heavy", "ties", "steps"])
@pytest.mark.parametrize("size", [1, 2, 3, 8, 9, 20, 41, 64])
@pytest.mark.parametrize("n", [1, 2, 5, 64, 65, 700])
def test_compiled_rank_filter_is_the_sorted_windows(kind: str, size: int, n: int) -> None:
    """The kernel itself: every rank of every window (the ends too), one rank or two a pass,
    the series in one piece or cut in three at uneven places (as the threads split it)."""
    _rolling = _kernel()

    v = _data(kind, n, seed=size * 13 + n)
    want = _sorted_windows(v, size)
    cuts = [0, n // 3, n // 3 + (n > 2), n]
    for rank in range(size):
        other = size - 1 - rank
        a, b = np.full(n, np.nan), np.full(n, np.nan)
        _rolling.rank(v, size, (rank, other), (a, b), 0, n)
        c = np.full(n, np.nan)
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            if hi > lo:
                _rolling.rank(v, size, (rank,), (c,), lo, hi)
        for got, r in ((a, rank), (b, other), (c, rank)):
            assert np.array_equal(got.view(np.int64), want[:, r].view(np.int64)), (r, got)


def test_compiled_rank_filter_refuses_what_it_cannot_rank() -> None:
    """A NaN in the windows read, a bad window, rank or output: a ValueError (rolling then
    takes scipy's filter), never a wrong number; a NaN outside the windows read is no bar."""
    _rolling = _kernel()

    v = _data("normal", 100, seed=3)
    out = np.zeros(100)
    bad = v.copy()
    bad[50] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        _rolling.rank(bad, 5, (2,), (out,), 40, 60)
    _rolling.rank(bad, 5, (2,), (out,), 0, 40)  # windows up to index 41: no NaN read
    assert np.array_equal(out[:40], _sorted_windows(v, 5)[:40, 2])
    for args in (
        (v, 0, (0,), (out,), 0, 100),  # no window
        (v, 1025, (3,), (out,), 0, 100),  # wider than the kernel takes
        (v, 5, (5,), (out,), 0, 100),  # a rank outside the window
        (v, 5, (1, 2, 3), (out, out, out), 0, 100),  # three ranks
        (v, 5, (2,), (np.zeros(99),), 0, 100),  # an output of another length
        (v.astype(np.float32), 5, (2,), (out,), 0, 100),  # not float64
        (v, 5, (2,), (out,), 0, 101),  # a range past the end
    ):
        with pytest.raises(ValueError):
            _rolling.rank(*args)
