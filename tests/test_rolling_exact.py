"""The fast rolling medians (forensics.evidence.rolling) give the libraries' numbers bit for bit."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from forensics.evidence import robust
from forensics.evidence.rolling import centered_median, trailing_median

# Loaded here, the rank filter serves series of any length >= 512 (otherwise only from 50k
# points): the tests below compare the fast path, not polars with itself.
pytest.importorskip("scipy.ndimage")


@pytest.fixture(autouse=True, params=["compiled", "scipy"])
def rank_filter(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test both ways: the compiled rank filter (forensics/evidence/_rolling.c) as it
    serves windows up to 64 points here, and scipy's filter (what an install without a C
    compiler, and every longer window, uses)."""
    from forensics.evidence import rolling

    if request.param == "compiled" and rolling._rolling is None:
        pytest.skip("the compiled rank filter was not built here (no C compiler at install)")
    if request.param == "scipy":
        monkeypatch.setattr(rolling, "_rolling", None)
    return str(request.param)


def _data(kind: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.normal(size=n)
    if kind == "heavy":  # spans many magnitudes: the midpoint's rounding shows
        return rng.normal(size=n) * np.exp(rng.normal(size=n) * 8)
    if kind == "ties":  # few distinct values, zeros among them
        return rng.integers(-3, 4, size=n).astype(float) * 0.1
    if kind == "steps":  # a slowly rising logged counter with plateaus
        return np.floor(np.cumsum(rng.random(n)) / 7.0)
    raise AssertionError(kind)


def _polars(v: np.ndarray, w: int) -> np.ndarray:
    return pl.Series(v).rolling_median(w, min_samples=1, center=True).to_numpy().astype(float)


def _numpy_trailing(v: np.ndarray, w: int) -> np.ndarray:
    out = np.zeros(len(v))
    for i in range(1, len(v)):
        out[i] = float(np.median(v[max(0, i - w) : i]))
    return out


@pytest.mark.parametrize("kind", ["normal", "heavy", "ties", "steps"])
@pytest.mark.parametrize("window", [1, 2, 3, 4, 5, 9, 10, 21, 25, 100, 101])
@pytest.mark.parametrize("n", [0, 7, 600, 2100])
def test_centered_median_is_polars(kind: str, window: int, n: int) -> None:
    v = _data(kind, n, seed=window * 1000 + n)
    got, want = centered_median(v, window), (_polars(v, window) if n else v)
    assert got.shape == want.shape
    assert np.array_equal(got.view(np.int64), want.view(np.int64))  # bits, signs of zero too


@pytest.mark.parametrize("kind", ["normal", "heavy", "ties", "steps"])
@pytest.mark.parametrize("window", [1, 2, 3, 20, 21, 100])
@pytest.mark.parametrize("n", [0, 5, 700, 2500])
def test_trailing_median_is_numpy(kind: str, window: int, n: int) -> None:
    v = _data(kind, n, seed=window * 7 + n)
    got, want = trailing_median(v, window), _numpy_trailing(v, window)
    assert np.array_equal(got.view(np.int64), want.view(np.int64))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -0.0])
def test_unselectable_values_take_the_library_path(bad: float) -> None:
    v = _data("normal", 2000, seed=1)
    v[[5, 900, 1999]] = bad
    for w in (4, 25):
        a, b = centered_median(v, w), _polars(v, w)
        assert np.array_equal(a, b, equal_nan=True)
        assert np.array_equal(np.signbit(a), np.signbit(b))
        c, d = trailing_median(v, w), _numpy_trailing(v, w)
        assert np.array_equal(c, d, equal_nan=True)
        assert np.array_equal(np.signbit(c), np.signbit(d))


@pytest.mark.parametrize("n", [3, 30, 99, 100, 101, 2000])
@pytest.mark.parametrize("nan_at", [None, 0, 50])
def test_local_noise_is_the_windowed_loop(n: int, nan_at: int | None) -> None:
    from forensics.evidence.gap import local_noise
    from forensics.evidence.trend_utils import robust_sigma

    rng = np.random.default_rng(n)
    val = 2.0 + np.cumsum(rng.normal(size=n)) * 1e-3 + rng.normal(size=n) * 0.01
    gap = val - 1.9 + rng.normal(size=n) * np.exp(rng.normal(size=n))
    if nan_at is not None and nan_at < n:
        gap[nan_at] = np.nan  # a val point with no train loss near it
    want = np.zeros(n)
    for i in range(n):
        lo, hi = max(0, i - 12), min(n, i + 13)
        want[i] = max(robust_sigma(val[lo:hi]), robust_sigma(gap[lo:hi]))
    assert np.array_equal(local_noise(val, gap).view(np.int64), want.view(np.int64))


@pytest.mark.parametrize("kind", ["normal", "heavy", "ties"])
@pytest.mark.parametrize(("window", "min_samples"), [(100, 10), (5, 1), (4, 3), (25, 25)])
@pytest.mark.parametrize("n", [0, 8, 900, 2100])
def test_polars_trailing_median_is_polars(kind: str, window: int, min_samples: int, n: int) -> None:
    from forensics.evidence.rolling import polars_trailing_median

    v = _data(kind, n, seed=window + n)
    want = pl.Series(v).rolling_median(window, min_samples=min_samples).to_numpy().astype(float)
    got = polars_trailing_median(v, window, min_samples)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("n", [150, 201, 1000, 4099, 20000])
@pytest.mark.parametrize("nan", [False, True])
def test_bin_median_is_the_per_bin_loop(n: int, nan: bool) -> None:
    from forensics.evidence.trend_utils import bin_median

    rng = np.random.default_rng(n)
    steps = np.cumsum(rng.integers(1, 4, size=n))
    values = rng.normal(size=n) * np.exp(rng.normal(size=n) * 5)
    if nan:
        values[n // 3] = np.nan
    for max_bins in (100, 200):
        xs, ys = bin_median(steps, values, max_bins=max_bins)
        if n <= max_bins:
            continue
        edges = np.linspace(0, n, max_bins + 1).astype(int)
        wx = np.array([np.median(steps[a:b]) for a, b in zip(edges[:-1], edges[1:], strict=True)])
        wy = np.array([np.median(values[a:b]) for a, b in zip(edges[:-1], edges[1:], strict=True)])
        assert np.array_equal(xs, wx) and np.array_equal(ys, wy, equal_nan=True)


@pytest.mark.parametrize("half", [0.4, 3.0, 50.0, 2500.0])
def test_align_is_the_per_window_loop(half: float) -> None:
    from forensics.evidence.trend_utils import align

    rng = np.random.default_rng(int(half * 10))
    ts = np.cumsum(rng.integers(1, 3, size=5000)).astype(np.int64)
    tv = rng.normal(size=5000) * np.exp(rng.normal(size=5000) * 4)
    at = np.sort(rng.uniform(-100, ts[-1] + 100, size=300))
    want = np.full(len(at), np.nan)
    lo = np.searchsorted(ts, at - half, side="left")
    hi = np.searchsorted(ts, at + half, side="right")
    for i in range(len(at)):
        if hi[i] > lo[i]:
            want[i] = np.median(tv[lo[i] : hi[i]])
        else:
            want[i] = tv[int(np.clip(np.searchsorted(ts, at[i]), 0, len(ts) - 1))]
    assert np.array_equal(align(ts, tv, at, half), want)


def _old_trail(w: int, y: np.ndarray) -> np.ndarray:
    return pl.Series(y).shift(1).rolling_median(w, min_samples=1).to_numpy().astype(float)


def _old_lead(w: int, y: np.ndarray) -> np.ndarray:
    s = pl.Series(y).reverse().shift(1).rolling_median(w, min_samples=1)
    return s.to_numpy().astype(float)[::-1]


def _old_noise(w: int, y: np.ndarray) -> np.ndarray:
    d = np.diff(y)
    trend = pl.Series(d).rolling_median(w, center=True, min_samples=1).to_numpy()
    dev = pl.Series(np.abs(d - trend)).rolling_median(w, center=True, min_samples=1).to_numpy()
    sig = robust.MAD_TO_SIGMA * dev / np.sqrt(2.0)
    return np.maximum(np.concatenate([[sig[0]], sig]), np.concatenate([sig, [sig[-1]]]))


@pytest.mark.parametrize("kind", ["normal", "rounded", "cauchy", "chi2_log", "integers"])
def test_spike_score_medians_equal_polars(kind: str) -> None:
    """The spike score's trailing / leading medians and noise scale (robust.py) equal the
    polars expressions they replace, bit for bit (ties, -0.0, heavy tails, short series)."""
    rng = np.random.default_rng(hash(kind) % 2**32)
    for n in (1, 2, 3, 5, 50, 600, 60_000):
        z = rng.normal(size=n)
        y = {
            "normal": z,
            "rounded": np.round(z, 1),  # holds -0.0
            "cauchy": rng.standard_cauchy(size=n),
            "chi2_log": np.log(0.3 + 0.05 * z**2),
            "integers": np.round(z * 3) + 0.0,
        }[kind]
        for w in (1, 2, 3, 20, 21):
            assert robust._trail_median(w, y).tobytes() == _old_trail(w, y).tobytes()
            assert robust._lead_median(w, y).tobytes() == _old_lead(w, y).tobytes()
            lead = robust._lead_from_trail(w, y, robust._trail_median(w, y))
            assert lead.tobytes() == _old_lead(w, y).tobytes()
            if n >= 3:
                ww = max(2 * w + 1, 5)
                assert robust._noise_scale(ww, y).tobytes() == _old_noise(ww, y).tobytes()


@pytest.mark.parametrize("kind", ["normal", "heavy", "ties", "steps"])
@pytest.mark.parametrize("size", [2, 3, 4, 9, 20, 21, 41])
@pytest.mark.parametrize("n", [1, 3, 41, 42, 600, 5000])
def test_rank_is_ndimage_rank_filter(kind: str, size: int, n: int) -> None:
    """The rank filter loaded on its own (rolling._rank_filter_1d) gives ndimage.rank_filter's
    numbers for every rank, also where _rank leaves a case to ndimage (ends, short arrays)."""
    from scipy import ndimage

    from forensics.evidence import rolling

    assert rolling._rank_filter_1d() is not None  # the layout of the installed scipy
    v = _data(kind, n, seed=size * 31 + n)
    for rank in range(size):
        got = rolling._rank(v, rank, size)
        want = ndimage.rank_filter(v, rank=rank, size=size, mode="nearest")
        assert np.array_equal(got.view(np.int64), want.view(np.int64)), rank


def test_rolling_medians_do_not_import_scipy_ndimage() -> None:
    """The spike score of a long series uses the rank filter without importing scipy.ndimage
    (0.35 s of CPU)."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from forensics.evidence import robust, rolling\n"
        "v = np.random.default_rng(0).normal(size=60_000)\n"
        "robust.score(np.arange(len(v)), np.exp(v))\n"
        "assert rolling._rank_filter_1d() is not None\n"
        "print('scipy.ndimage' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_private_rank_filter_is_checked_before_use() -> None:
    """The extension is trusted only after it ranks a small array as a plain sort does: one
    that means something else by its arguments (another scipy) is refused, and ndimage's own
    rank_filter runs instead."""
    from forensics.evidence import rolling

    fn = rolling._rank_filter_1d()
    assert fn is not None and rolling._answers_as_expected(fn)

    def off_by_one(v, rank, size, out, *rest):  # type: ignore[no-untyped-def]
        fn(v, min(rank + 1, size - 1), size, out, *rest)

    def other_origin(v, rank, size, out, mode, cval, origin):  # type: ignore[no-untyped-def]
        fn(v, rank, size, out, mode, cval, 1)

    assert not rolling._answers_as_expected(off_by_one)
    assert not rolling._answers_as_expected(other_origin)


@pytest.mark.parametrize("kind", ["normal", "heavy", "ties", "steps"])
@pytest.mark.parametrize("window", [1, 2, 5, 24, 25, 100])
@pytest.mark.parametrize("n", [0, 1, 30, 401, 2100])
def test_window_max_is_the_windowed_loop(kind: str, window: int, n: int) -> None:
    """``window_max`` is the largest value of each window (cut at the ends, -inf where empty),
    for trailing, centred and leading windows."""
    from forensics.evidence.rolling import window_max

    v = _data(kind, n, seed=window * 13 + n)
    for start in sorted({-window, -(window // 2), 0}):
        got = window_max(v, start, window)
        want = np.full(n, -np.inf)
        for i in range(n):
            seg = v[max(0, i + start) : max(0, i + start + window)]
            if len(seg):
                want[i] = seg.max()
        assert np.array_equal(got, want), start


@pytest.mark.parametrize("kind", ["normal", "heavy", "ties", "steps"])
@pytest.mark.parametrize("window", [2, 3, 5, 20, 25, 100, 101])
@pytest.mark.parametrize("n", [0, 12, 404, 900, 2100])
def test_medians_at_points_are_the_whole_ones(
    kind: str, window: int, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``centered_median_at`` and ``polars_trailing_median_at`` equal the whole series'
    medians at the points asked, bit for bit (both ends, a few points and many)."""
    from forensics.evidence import rolling
    from forensics.evidence.rolling import (
        centered_median_at,
        polars_trailing_median,
        polars_trailing_median_at,
    )

    selected = []
    plain = rolling._select_medians
    monkeypatch.setattr(rolling, "_select_medians", lambda *a: selected.append(1) or plain(*a))

    v = _data(kind, n, seed=window * 17 + n)
    rng = np.random.default_rng(window + n)
    whole_c = centered_median(v, window)
    m = min(10, window)
    whole_t = polars_trailing_median(v, window, m)
    ends = [i for i in (0, 1, window // 2, window - 1, n - window, n - 2, n - 1) if 0 <= i < n]
    for k in (0, 3, n // 60, n):
        idx = np.unique(np.concatenate([rng.integers(0, max(n, 1), size=k), ends])).astype(int)
        idx = idx[idx < n]
        got_c, got_t = (
            centered_median_at(v, window, idx),
            polars_trailing_median_at(v, window, m, idx),
        )
        assert np.array_equal(got_c.view(np.int64), whole_c[idx].view(np.int64))
        assert np.array_equal(got_t.view(np.int64), whole_t[idx].view(np.int64))
    # The points are selected one by one on a long series (not only the whole computed).
    assert bool(selected) == (n >= 4 * window and n >= 400)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -0.0])
def test_medians_at_points_of_unselectable_values(bad: float) -> None:
    """A NaN, an Inf or a -0.0 sends the medians at points to the whole series' path."""
    from forensics.evidence.rolling import (
        centered_median_at,
        polars_trailing_median,
        polars_trailing_median_at,
    )

    v = _data("ties", 3000, seed=2)
    v[1500] = bad
    idx = np.array([3, 1499, 1500, 1520, 2999])
    got = centered_median_at(v, 25, idx)
    assert np.array_equal(got.view(np.int64), centered_median(v, 25)[idx].view(np.int64))
    got = polars_trailing_median_at(v, 100, 10, idx)
    want = polars_trailing_median(v, 100, 10)[idx]
    assert np.array_equal(got.view(np.int64), want.view(np.int64))


@pytest.mark.parametrize("n", [150, 201, 1000, 4099, 20000])
@pytest.mark.parametrize(
    "order", ["int", "int_repeats", "float", "float_zeros", "shuffled", "float_nan", "uint"]
)
def test_bin_median_steps_are_the_per_bin_medians(n: int, order: str) -> None:
    """The bins' median steps, read from the middle of each bin where the steps are in
    order, are np.median's per bin, bit for bit, as floats or not (repeated steps, both
    signs of zero, negative steps; unordered steps and NaN take the per-bin medians)."""
    from forensics.evidence.trend_utils import bin_median

    rng = np.random.default_rng(n)
    steps: np.ndarray = np.cumsum(rng.integers(1, 4, size=n)) - n
    if order == "int_repeats":
        steps = np.sort(rng.integers(-50, 50, size=n))
    elif order == "float":
        steps = np.sort(rng.normal(size=n) * 1e6)
    elif order == "float_zeros":
        steps = np.sort(np.round(rng.normal(size=n), 1))
        steps[steps == 0] = np.where(rng.random(int((steps == 0).sum())) < 0.5, -0.0, 0.0)
    elif order == "shuffled":
        steps = rng.permutation(steps)
    elif order == "float_nan":
        steps = steps.astype(float)
        steps[n // 2] = np.nan
    elif order == "uint":
        steps = np.cumsum(rng.integers(0, 3, size=n)).astype(np.uint64)
    values = rng.normal(size=n)
    for max_bins in (100, 200):
        if n <= max_bins:
            continue
        edges = np.linspace(0, n, max_bins + 1).astype(int)
        bins = list(zip(edges[:-1], edges[1:], strict=True))
        for as_float in (False, True):
            xs, _ = bin_median(steps, values, max_bins=max_bins, as_float=as_float)
            src = steps.astype(float) if as_float else steps
            want = np.array([np.median(src[a:b]) for a, b in bins])
            assert np.array_equal(xs.view(np.int64), want.view(np.int64)), (max_bins, as_float)


@pytest.mark.parametrize("kind", ["normal", "heavy", "ties", "steps", "spiky", "flat"])
@pytest.mark.parametrize("n", [3, 7, 60, 700, 5000])
@pytest.mark.parametrize("window", [25, 24, 5])
def test_despike_masks_are_the_band_masks(kind: str, n: int, window: int) -> None:
    """``despike_masks`` (the MAD selected only where it can decide) gives the masks of the
    whole band, bit for bit, for several k at once."""
    from forensics.evidence.trend_utils import despike_band, despike_mask, despike_masks

    rng = np.random.default_rng(n + window)
    if kind == "spiky":  # a falling loss with noise and upward spikes
        v = 3.0 * np.exp(-np.arange(n) / 2000.0) + rng.normal(0, 0.02, n)
        v[rng.random(n) < 0.01] *= 4.0
    elif kind == "flat":  # constant stretches: a zero MAD, the floor decides
        v = np.repeat(rng.normal(size=n // 50 + 1), 50)[:n]
        v[rng.random(n) < 0.02] += 1.0
    else:
        v = _data(kind, n, seed=window * 3 + n)
    for ks in ([5.0], [5.0, 3.0], [0.5, 10.0], [1e-9]):
        band = despike_band(v, window=window)
        want = [despike_mask(v, band, k=k) for k in ks]
        got = despike_masks(v, ks, window=window)
        for g, w_ in zip(got, want, strict=True):
            assert g.dtype == bool and np.array_equal(g, w_), ks


def test_nan_in_a_long_series_takes_scipys_filter(rank_filter: str) -> None:
    """rolling._ranks on a series the kernel refuses (a NaN): scipy's numbers, no error."""
    from scipy import ndimage

    from forensics.evidence import rolling

    v = _data("normal", 200_000, seed=5)
    v[123_456] = np.nan
    got = rolling._ranks(v, (9, 10), 20)
    for g, r in zip(got, (9, 10), strict=True):
        want = ndimage.rank_filter(v, rank=r, size=20, mode="nearest")
        assert np.array_equal(g, want, equal_nan=True)


@pytest.mark.parametrize("size", [20, 41, 65])
def test_long_series_split_between_threads(rank_filter: str, size: int) -> None:
    """A series long enough to be split between the cores: the same numbers as scipy's filter
    (65 points: scipy's own, past the kernel's windows)."""
    from scipy import ndimage

    from forensics.evidence import rolling

    v = _data("heavy", 300_001, seed=size)
    h = size // 2
    got = rolling._ranks(v, (h - 1, h), size)
    for g, r in zip(got, (h - 1, h), strict=True):
        want = ndimage.rank_filter(v, rank=r, size=size, mode="nearest")
        assert np.array_equal(g.view(np.int64), want.view(np.int64)), r
