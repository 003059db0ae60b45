"""Memory work of issue 17 (peak memory of ``analyze``): the narrower paths give the same
numbers as the whole-length ones they replace, and caches hold what they say."""

from __future__ import annotations

import numpy as np
import pytest

from forensics.detectors import train_val


def _lines_whole(x: np.ndarray, y: np.ndarray, lo: np.ndarray, hi: np.ndarray):  # type: ignore[no-untyped-def]
    """``train_val._lines`` as it was: six whole-length prefix sums."""
    c, sc = float(np.mean(x)), max(float(np.ptp(x)), 1.0)
    u = (x - c) / sc
    yc = float(np.mean(y))
    w = y - yc

    def csum(a: np.ndarray) -> np.ndarray:
        return np.concatenate([[0.0], np.cumsum(a)])

    S = [csum(a) for a in (np.ones_like(u), u, w, u * u, u * w, w * w)]
    n, su, sw, suu, suw, sww = (s[hi] - s[lo] for s in S)
    with np.errstate(invalid="ignore", divide="ignore"):
        mu, mw = su / n, sw / n
        vu = suu / n - mu * mu
        cov = suw / n - mu * mw
        b = np.where(vu > 1e-12, cov / vu, 0.0)
        res = np.maximum(sww / n - mw * mw - b * cov, 0.0)
    return train_val._Lines(
        n=n.astype(int),
        mx=np.nan_to_num(mu) * sc + c,
        my=np.nan_to_num(mw) + yc,
        slope=np.nan_to_num(b) / sc,
        resid=np.where(n > 0, np.sqrt(np.nan_to_num(res)), np.inf),
    )


@pytest.mark.parametrize("block", [7, 64, 1 << 16])
@pytest.mark.parametrize("n", [1, 5, 300, 5000])
def test_lines_blockwise_bit_for_bit(monkeypatch: pytest.MonkeyPatch, block: int, n: int) -> None:
    monkeypatch.setattr(train_val, "_SUM_BLOCK", block)
    rng = np.random.default_rng(n + block)
    x = np.sort(rng.integers(0, 10 * n + 1, n)).astype(float) * 977.0 + 1e6
    y = 3.0 + rng.standard_normal(n) * 0.1 + x * 1e-7
    m = 40
    lo = rng.integers(0, n + 1, m)
    hi = np.minimum(lo + rng.integers(0, n + 1, m), n)
    lo[:3], hi[:3] = 0, (n, 0, 1 if n > 0 else 0)  # the whole, an empty window at 0, one point
    got, want = train_val._lines(x, y, lo, hi), _lines_whole(x, y, lo, hi)
    for f in ("n", "mx", "my", "slope", "resid"):
        a, b = getattr(got, f), getattr(want, f)
        assert a.dtype == b.dtype
        assert np.array_equal(a, b, equal_nan=True), f
        assert np.array_equal(np.signbit(a), np.signbit(b)), f


@pytest.mark.parametrize("n", [0, 1, 300, 70_000])
def test_lines_over_window_sets_are_each_alone(n: int) -> None:
    """``train_val._lines_over`` (one pass of prefix sums for several window sets) gives each
    set the lines ``_lines`` computes for it alone, bit for bit."""
    rng = np.random.default_rng(n)
    x = np.sort(rng.integers(0, 10 * n + 1, n)).astype(float) * 977.0 + 1e6
    y = 3.0 + rng.standard_normal(n) * 0.1 + x * 1e-7
    sets = []
    for m in (40, 7):
        lo = rng.integers(0, n + 1, m)
        sets.append((lo, np.minimum(lo + rng.integers(0, n + 1, m), n)))
    for got, (lo, hi) in zip(train_val._lines_over(x, y, sets), sets, strict=True):
        want = train_val._lines(x, y, lo, hi)
        for f in ("n", "mx", "my", "slope", "resid"):
            a, b = getattr(got, f), getattr(want, f)
            assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), f


def _decay_shape_whole(xs: np.ndarray, vs: np.ndarray) -> tuple[str, dict[str, float]]:
    """``schedule._decay_shape`` as it was (every fit at once), with its errors."""
    xs = xs.astype(float)
    if len(xs) < 4 or vs[0] <= vs[-1] or xs[-1] == xs[0]:
        return "smooth", {}
    t = (xs - xs[0]) / (xs[-1] - xs[0])
    u = (vs - vs[-1]) / (vs[0] - vs[-1])
    fits = {"linear": 1.0 - t, "cosine": 0.5 * (1.0 + np.cos(np.pi * t))}
    if vs[-1] > 0:
        e = np.exp(np.log(vs[0]) + t * (np.log(vs[-1]) - np.log(vs[0])))
        fits["exponential"] = (e - vs[-1]) / (vs[0] - vs[-1])
    err = {k: float(np.sqrt(np.mean((u - f) ** 2))) for k, f in fits.items()}
    best = min(err, key=lambda k: err[k])
    return (best if err[best] <= 0.03 else "smooth"), err


def test_decay_shape_in_place_same_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from forensics.evidence import schedule

    seen: list[float] = []
    real_sqrt = np.sqrt

    def spy(a):  # type: ignore[no-untyped-def]
        out = real_sqrt(a)
        seen.append(float(out))
        return out

    rng = np.random.default_rng(3)
    for case in range(60):
        n = int(rng.integers(4, 3000))
        x = np.sort(rng.choice(10 * n, n, replace=False)).astype(np.int64) + 17
        t = (x - x[0]) / max(x[-1] - x[0], 1)
        kind = case % 3
        v = (
            1e-4 * (1 - t)
            if kind == 0
            else 1e-4 * 0.5 * (1 + np.cos(np.pi * t))
            if kind == 1
            else 1e-4 * np.exp(-3 * t)
        ) + rng.normal(0, 10 ** rng.uniform(-9, -5), n)
        if case % 7 == 0:
            v -= v[-1] + 1e-6  # a fall below zero: no exponential fit
        want, err = _decay_shape_whole(x, v)
        seen.clear()
        monkeypatch.setattr(schedule.np, "sqrt", spy)
        got = schedule._decay_shape(x, v.copy())
        monkeypatch.setattr(schedule.np, "sqrt", real_sqrt)
        assert got == want
        assert seen == list(err.values())  # the same errors, bit for bit
        # the views the single-stretch path passes are not written to
        xv, vv = x.copy(), v.copy()
        schedule._decay_shape(xv[1:], vv[1:])
        assert np.array_equal(xv, x) and np.array_equal(vv, v)


def _loss_run(spikes: bool = True):  # type: ignore[no-untyped-def]
    from synthetic import long_frame, run_from_frame

    rng = np.random.default_rng(0)
    ts = np.arange(0, 20_000, 2)
    train = 2.0 + 1.0 / (1.0 + ts / 500.0) + rng.normal(0.0, 0.01, len(ts))
    if spikes:
        train[::997] *= 5.0
    vs = np.arange(250, 20_001, 250)
    val = 2.1 + 1.0 / (1.0 + vs / 500.0) + rng.normal(0.0, 0.01, len(vs))
    return run_from_frame(long_frame({"loss": (ts, train), "val_loss": (vs, val)}))


def test_despike_cache_keeps_masks_not_the_band() -> None:
    from forensics.evidence import Evidence
    from forensics.evidence.trend_utils import despike
    from forensics.schema import LOSS

    ev = Evidence(_loss_run())
    values = ev.series(LOSS).values
    for k in (5.0, 3.0, 5.0):
        got = ev.despiked(LOSS, k=k)
        assert np.array_equal(got, despike(values, k=k))
        got[:] = False  # a caller's own array: the cache is not changed through it
    assert np.array_equal(ev.despiked(LOSS), despike(values))
    assert set(ev._despike) == {(LOSS, 5.0), (LOSS, 3.0)}
    for mask in ev._despike.values():
        assert mask.dtype == bool and len(mask) == len(values)  # a byte a point, no floats


def test_gap_holds_no_copy_of_the_train_series() -> None:
    from forensics.evidence import Evidence
    from forensics.evidence.trend_utils import despike
    from forensics.schema import LOSS

    ev = Evidence(_loss_run())
    g = ev.gap
    assert g is not None
    t = ev.series(LOSS)
    keep = despike(t.values)
    assert not keep.all()
    assert np.array_equal(g.train_steps, t.steps[keep])
    assert np.array_equal(g.train_values, t.values[keep])
    # what the gap holds: the evidence's own arrays and a mask, no float copy of the series
    assert g.train_all_steps is t.steps and g.train_all_values is t.values
    assert g.train_keep is not None and g.train_keep.dtype == bool
    b = g.binned(10)
    assert np.array_equal(b.train_values, g.train_values)
    ev2 = Evidence(_loss_run(spikes=False))
    g2 = ev2.gap
    assert g2 is not None
    if despike(ev2.series(LOSS).values).all():
        assert g2.train_keep is None and g2.train_values is ev2.series(LOSS).values


def _jumps_whole(v: np.ndarray, jump_ratio: float, jump_k: float) -> list[int]:
    """``schedule._jumps`` as it was (whole-length temporaries)."""
    from forensics.evidence.robust import resolution
    from forensics.evidence.rolling import centered_median
    from forensics.evidence.schedule import _distinct_at_least

    if len(v) < 2:
        return []
    d = np.abs(np.diff(v))
    local = centered_median(d, 11)
    hi = np.maximum(np.abs(v[:-1]), np.abs(v[1:]))
    lo = np.minimum(np.abs(v[:-1]), np.abs(v[1:]))
    big = (hi >= jump_ratio * lo) & (hi > 0)
    if _distinct_at_least(v, 20):
        big &= d > 1.5 * resolution(v)
    return [int(i) for i in np.flatnonzero(big & (d > jump_k * local))]


def test_jumps_in_place_same_jumps() -> None:
    from forensics.evidence.schedule import _jumps

    rng = np.random.default_rng(5)
    for case in range(40):
        n = int(rng.integers(2, 5000))
        v = np.round(3e-4 * np.exp(-np.linspace(0, 3, n)), int(rng.integers(5, 9)))
        for at in rng.integers(0, n, 3):
            v[at:] *= rng.choice([0.1, 0.5, 1.3, 4.0])
        if case % 5 == 0:
            v[rng.integers(0, n)] = 0.0
            v[rng.integers(0, n)] = -1e-5
        ratio, k = float(rng.choice([1.05, 1.25, 2.0])), float(rng.choice([3.0, 10.0]))
        before = v.copy()
        assert _jumps(v, ratio, k) == _jumps_whole(v, ratio, k)
        assert np.array_equal(v, before)


def _bin_median_whole(steps: np.ndarray, values: np.ndarray, max_bins: int):  # type: ignore[no-untyped-def]
    n = len(values)
    if n <= max_bins:
        return steps.astype(float), values.astype(float)
    edges = np.linspace(0, n, max_bins + 1).astype(int)
    xs, ys = np.empty(max_bins), np.empty(max_bins)
    sizes = np.diff(edges)
    for size in np.unique(sizes):
        rows = np.flatnonzero(sizes == size)
        idx = edges[rows][:, None] + np.arange(int(size))
        xs[rows] = np.median(steps[idx], axis=1)
        ys[rows] = np.median(values[idx], axis=1)
    return xs, ys


@pytest.mark.parametrize("block", [1, 50, 1 << 16])
def test_bin_median_by_blocks_and_theil_sen_same(
    monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    from forensics.evidence import trend_utils

    monkeypatch.setattr(trend_utils, "_BIN_BLOCK", block)
    rng = np.random.default_rng(block)
    for n in (3, 199, 200, 201, 1000, 12_345):
        steps = np.sort(rng.choice(50 * n, n, replace=False)).astype(np.int64)
        values = rng.standard_normal(n).cumsum()
        for bins in (7, 100, 200):
            want = _bin_median_whole(steps, values, bins)
            got = trend_utils.bin_median(steps, values, max_bins=bins)
            assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
            fl = _bin_median_whole(steps.astype(float), values, bins)
            got = trend_utils.bin_median(steps, values, max_bins=bins, as_float=True)
            assert all(np.array_equal(a, b) for a, b in zip(got, fl, strict=True))
        s = trend_utils.theil_sen(steps, values)
        monkeypatch.setattr(trend_utils, "_BIN_BLOCK", 1 << 40)  # one block: as before
        w = trend_utils.theil_sen(steps.astype(float), values)
        monkeypatch.setattr(trend_utils, "_BIN_BLOCK", block)
        assert s == w


def test_the_reorder_gathers_the_widest_columns_first(monkeypatch: pytest.MonkeyPatch) -> None:
    import polars as pl

    from forensics import run as run_mod
    from forensics.schema import SCHEMA

    widths = {c: run_mod._width(t) for c, t in SCHEMA.items()}
    assert widths["step"] == widths["value"] == widths["wall_time"] == 8
    assert widths["tag"] == widths["record_idx"] == 4 and widths["layer"] == 2
    # the order the columns are gathered in, from the frames dropped one column at a time
    seen: list[str] = []
    real_drop = pl.DataFrame.drop

    def drop(self, *cols, **kw):  # type: ignore[no-untyped-def]
        seen.extend(str(c) for c in cols)
        return real_drop(self, *cols, **kw)

    rng = np.random.default_rng(0)
    n = 50_000
    frame = pl.DataFrame(
        {
            "source": ["jsonl"] * n,
            "tag": rng.choice(["a", "b", "c"], n),
            "step": np.arange(n) // 3,
            "value": rng.standard_normal(n),
        }
    ).with_columns(pl.col("source", "tag").cast(pl.Categorical))
    order = rng.permutation(n).astype(np.uint32)
    plan = run_mod.ViewPlan(order, n, None, None)
    r = run_mod.Run(name="t", path=__import__("pathlib").Path("."), format="jsonl", frame=frame)
    monkeypatch.setattr(pl.DataFrame, "drop", drop)
    r._reorder(plan)
    monkeypatch.setattr(pl.DataFrame, "drop", real_drop)
    assert seen[:2] == ["step", "value"]  # 8-byte columns first, in frame order among equals
    assert r.frame.columns == frame.columns
    assert r.frame.equals(frame[order.astype(np.int64)])
