"""The detectors' memory-bounded paths (issue 17) against the plain whole-array computations,
bit for bit: pieces made small so that long, real-shaped series (spikes, restarts, step drops,
constant stretches) cross many piece borders."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

from forensics.detectors import loss_scale, stall, throughput
from forensics.detectors.drift import analyze_drift
from forensics.detectors.stall import StallDetector
from forensics.detectors.throughput import ThroughputDetector
from forensics.detectors.train_val import TrainValDetector
from forensics.evidence import Evidence, Series, gap, schedule, trend_utils
from forensics.evidence.rolling import centered_median, window_max
from forensics.evidence.trend_utils import MAD_SCALE, despike_band, despike_mask
from tests.synthetic import run_from_frame, trend_grad_norm_drift, trend_infra, trend_train_val


def _noisy_series(n: int, seed: int = 0) -> np.ndarray:
    """A loss-like series: a decay with noise, upward spikes, a level jump (a restart) and a
    constant stretch (zero MAD)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    v = 2.0 + 3.0 * np.exp(-t / (n / 5)) + rng.normal(0, 0.05, n)
    v[rng.choice(n, size=n // 200, replace=False)] *= rng.uniform(1.5, 4.0, n // 200)
    v[n // 2 :] += 0.7  # a restart
    v[n // 3 : n // 3 + 300] = 1.25  # a constant stretch
    return v


def _lr_with_restarts(n: int) -> tuple[np.ndarray, np.ndarray]:
    """A warm-up, cosine decays with warm restarts, a step drop, printed with few decimals."""
    x = np.arange(0, 10 * n, 10, dtype=np.int64)
    t = np.arange(n)
    lr = np.empty(n)
    warm = n // 20
    lr[:warm] = 3e-4 * (t[:warm] + 1) / warm
    cycle = (n - warm) // 3
    for c in range(3):
        a = warm + c * cycle
        b = n if c == 2 else a + cycle
        u = (t[a:b] - a) / max(b - a - 1, 1)
        lr[a:b] = 3e-5 + 0.5 * (3e-4 - 3e-5) * (1 + np.cos(np.pi * u))
    lr[int(0.9 * n) :] *= 0.1  # a step drop
    return x, np.round(lr, 7)


@pytest.mark.parametrize("n", [5_000, 40_001])
def test_despike_masks_in_pieces(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    v = _noisy_series(n)
    band = despike_band(v)
    want = [despike_mask(v, band, k=k) for k in (5.0, 3.0)]
    monkeypatch.setattr(trend_utils, "_DESPIKE_CHUNK", 997)
    got = trend_utils.despike_masks(v, [5.0, 3.0])
    for w, g in zip(want, got, strict=True):
        assert np.array_equal(w, g)
    assert not want[1].all()  # spikes were dropped


@pytest.mark.parametrize("window", [3, 5, 24, 25, 101])
def test_centered_median_in_pieces(monkeypatch: pytest.MonkeyPatch, window: int) -> None:
    v = _noisy_series(60_123, seed=window)
    want = centered_median(v, window)
    monkeypatch.setattr(trend_utils, "_MEDIAN_PIECE", 1024)
    got = trend_utils._centered_median_pieces(v, window)
    assert np.array_equal(want, got)
    assert np.array_equal(trend_utils.rolling_median(v, window), want)


def test_interp_without_whole_float_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trend_utils, "_INTERP_BLOCK", 64)
    x, lr = _lr_with_restarts(5_000)
    x = np.concatenate([x[:2000], x[2000:] + 777])  # a gap in the steps
    rng = np.random.default_rng(3)
    q = np.concatenate(
        [
            rng.uniform(-100, x[-1] + 100, 500),
            x[rng.choice(len(x), 200)].astype(float),  # exactly at logged steps
            [x[0] - 1.0, float(x[0]), float(x[-1]), x[-1] + 0.5],
        ]
    )
    assert np.array_equal(trend_utils.interp(q, x, lr), np.interp(q, x, lr))
    for s in (q[0], float(x[17]), -5.0, 1e12):
        assert trend_utils.interp(s, x, lr) == np.interp(s, x, lr)


@pytest.mark.parametrize("start_of", [lambda w: -w, lambda w: -(w // 2), lambda w: 0])
def test_window_max_pieces(start_of: object) -> None:
    v = _noisy_series(20_011)
    for w in (1, 7, 50, 200):
        start = start_of(w)  # type: ignore[operator]
        want = window_max(v, start, w)
        got = np.empty_like(want)
        for lo, hi, part in trend_utils.window_max_pieces(v, start, w, piece=333):
            got[lo:hi] = part
        assert np.array_equal(want, got)


def test_align_in_row_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.arange(0, 200_000, 2, dtype=np.int64)
    y = _noisy_series(len(x))
    at = np.arange(0, 200_000, 250).astype(float)
    want = np.array(
        [np.median(y[(x >= s - 300) & (x <= s + 300)]) for s in at]
    )  # the plain window medians
    monkeypatch.setattr(trend_utils, "_BIN_BLOCK", 1000)
    assert np.array_equal(trend_utils.align(x, y, at, 300.0), want)


def test_searchsorted_as_float(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trend_utils, "_INTERP_BLOCK", 50)
    a = np.cumsum(np.random.default_rng(2).integers(1, 4, 1000)).astype(np.int64)
    v = np.concatenate([a[::7] - 0.5, a[::11].astype(float), [-1.0, 1e9, np.nan]])
    for side in ("left", "right"):
        want = np.searchsorted(a, v, side=side)  # type: ignore[call-overload]
        assert np.array_equal(trend_utils.searchsorted_as_float(a, v, side), want)
        assert trend_utils.searchsorted_as_float(a, v[3], side) == want[3]


def test_align_with_empty_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trend_utils, "_INTERP_BLOCK", 64)
    x = np.concatenate([np.arange(0, 5000, 5), np.arange(9000, 12000, 5)]).astype(np.int64)
    y = _noisy_series(len(x))
    at = np.arange(0, 12000, 250).astype(float)
    got = trend_utils.align(x, y, at, 2.0)  # most windows empty: the nearest point
    j = np.clip(np.searchsorted(x, at), 0, len(x) - 1)
    empty = np.searchsorted(x, at - 2.0, "left") == np.searchsorted(x, at + 2.0, "right")
    assert empty.any() and np.array_equal(got[empty], y[j[empty]])


# -- the LR schedule -------------------------------------------------------------------------
def _jumps_plain(v: np.ndarray, jump_ratio: float, jump_k: float) -> list[int]:
    """``schedule._jumps`` as it was: whole-length arrays."""
    from forensics.evidence.robust import resolution

    d = np.abs(np.diff(v))
    av = np.abs(v)
    hi, lo = np.maximum(av[:-1], av[1:]), np.minimum(av[:-1], av[1:])
    big = (hi >= jump_ratio * lo) & (hi > 0)
    if schedule._distinct_at_least(v, 20):
        big &= d > 1.5 * resolution(v)
    big &= d > jump_k * centered_median(d, 11)
    return [int(i) for i in np.flatnonzero(big)]


def _rdp_plain(x: np.ndarray, y: np.ndarray, tolerance: float) -> list[int]:
    """``schedule._rdp`` as it was: float steps, one argmax over each stretch."""
    n = len(x)
    keep = np.zeros(n, dtype=bool)
    keep[0] = keep[-1] = True
    stack = [(0, n - 1)]
    while stack:
        i, j = stack.pop()
        if j - i < 2:
            continue
        xs, ys = x[i + 1 : j], y[i + 1 : j]
        chord = y[i] + (y[j] - y[i]) * (xs - x[i]) / (x[j] - x[i])
        dev = np.abs(ys - chord)
        k = int(np.argmax(dev))
        if dev[k] > tolerance:
            keep[i + 1 + k] = True
            stack.append((i, i + 1 + k))
            stack.append((i + 1 + k, j))
    return [int(i) for i in np.flatnonzero(keep)]


def test_schedule_pieces_match_the_plain_computation(monkeypatch: pytest.MonkeyPatch) -> None:
    x, lr = _lr_with_restarts(30_000)
    want_jumps = _jumps_plain(lr, 1.25, 10.0)
    y = np.log(np.maximum(lr, 1e-3 * float(np.median(lr))))
    want_rdp = _rdp_plain(x.astype(float), y, 0.05)
    want_schedule = schedule.lr_schedule(Series(x, lr), warmup_end=int(x[1499]))
    monkeypatch.setattr(schedule, "_CHUNK", 509)
    assert want_jumps  # the restarts and the drop
    assert schedule._jumps(lr, 1.25, 10.0) == want_jumps
    assert schedule._rdp(x, y, 0.05) == want_rdp
    got = schedule.lr_schedule(Series(x, lr), warmup_end=int(x[1499]))
    assert got.segments == want_schedule.segments and got.changes == want_schedule.changes
    assert any(s.kind == "decay" for s in got.segments) and got.changes
    for s in (0.0, 12_345.5, float(x[-1]) + 10):
        assert got.lr_at(s) == float(np.interp(s, x, lr))


def test_decay_shape_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 20_000
    x = np.arange(n, dtype=np.int64) * 3
    u = np.arange(n) / (n - 1)
    shapes = {
        "cosine": 1e-5 + 0.5 * (3e-4 - 1e-5) * (1 + np.cos(np.pi * u)),
        "linear": 3e-4 - (3e-4 - 1e-5) * u,
        "exponential": 3e-4 * (1e-5 / 3e-4) ** u,
    }
    for name, v in shapes.items():
        whole = schedule._decay_shape(x, v)
        monkeypatch.setattr(schedule, "_CHUNK", 777)
        assert schedule._decay_shape(x, v) == whole == name
        monkeypatch.setattr(schedule, "_CHUNK", 1 << 18)


# -- detectors end to end: tiny pieces against one piece ---------------------------------------
def _small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    for mod, name, size in (
        (trend_utils, "_DESPIKE_CHUNK", 211),
        (trend_utils, "_MEDIAN_PIECE", 256),
        (trend_utils, "_INTERP_BLOCK", 97),
        (trend_utils, "_BIN_BLOCK", 500),
        (schedule, "_CHUNK", 313),
        (stall, "_CHUNK", 89),
        (throughput, "_CHUNK", 89),
        (loss_scale, "_CHUNK", 89),
        (gap, "_BLOCK", 89),
    ):
        monkeypatch.setattr(mod, name, size)


def _findings(run: object, detectors: list[object]) -> list[dict]:
    ev = Evidence(run)  # type: ignore[arg-type]
    return [asdict(f) for d in detectors for f in d.detect(ev)]  # type: ignore[attr-defined]


def test_drift_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    frame, _ = trend_grad_norm_drift(n=60_000, onset=35_000, every=1)
    run = run_from_frame(frame)
    want = asdict(analyze_drift(Evidence(run)))  # type: ignore[arg-type]
    _small_pieces(monkeypatch)
    got = asdict(analyze_drift(Evidence(run_from_frame(frame))))  # type: ignore[arg-type]
    assert want["flagged"] and got == want


def test_infra_detectors_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    frame, _ = trend_infra(n=120_000, every=2, drop=(60_000, 64_000), stall_at=90_000)
    detectors = [ThroughputDetector(), StallDetector()]
    want = _findings(run_from_frame(frame), detectors)
    _small_pieces(monkeypatch)
    got = _findings(run_from_frame(frame), detectors)
    assert {f["kind"] for f in want} >= {"throughput_drop", "stall"}
    assert got == want


def test_train_val_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    for case in ("overfit", "val_shift"):
        frame, _ = trend_train_val(case=case, n=80_000, every=2, val_every=400, onset=50_000)
        want = _findings(run_from_frame(frame), [TrainValDetector()])
        with monkeypatch.context() as m:
            _small_pieces(m)
            got = _findings(run_from_frame(frame), [TrainValDetector()])
        assert want and got == want


def test_gap_train_selections() -> None:
    frame, _ = trend_train_val(n=40_000, every=2)
    g = Evidence(run_from_frame(frame)).gap
    assert g is not None and g.train_keep is not None  # spikes dropped: copies needed
    for s in (0, 123, float(g.steps[len(g.steps) // 2]), 10**9):
        sel = g.train_steps >= s
        got_s, got_v = g.train_after(s)
        assert np.array_equal(got_s, g.train_steps[sel])
        assert np.array_equal(got_v, g.train_values[sel])
    assert np.array_equal(g.train_steps_float(), g.train_steps.astype(float))


def test_loss_scale_decline_test_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    lvl = np.log2(2.0 ** rng.integers(8, 17, 10_000).astype(float))
    peak = np.maximum.accumulate(lvl)
    monkeypatch.setattr(loss_scale, "_CHUNK", 333)
    assert np.array_equal(loss_scale._at_least(peak, lvl, 3 - 1e-9), (peak - lvl) >= 3 - 1e-9)


def test_despike_noise_of_the_loss_in_place() -> None:
    """drift's loss noise: the in-place |lys - rolling median| and its median, overwritten,
    are the plain expression's."""
    lys = _noisy_series(30_001)
    want = MAD_SCALE * float(np.median(np.abs(lys - trend_utils.rolling_median(lys, 25))))
    dev = trend_utils.rolling_median(lys, 25)
    np.subtract(lys, dev, out=dev)
    np.abs(dev, out=dev)
    assert MAD_SCALE * float(np.median(dev, overwrite_input=True)) == want
