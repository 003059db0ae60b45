"""``robust.score`` computes its element-wise part a block of points at a time: the same frame,
bit for bit, as the whole-array computation it replaced (kept here as the reference)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from forensics.evidence import robust


def _reference(
    steps: np.ndarray,
    values: np.ndarray,
    *,
    window: int = 20,
    min_side: int = 3,
    sigma_floor: float = 0.005,
    confirm_until: float | None = None,
) -> pl.DataFrame:
    """robust.score as it was, on whole arrays."""
    steps = np.asarray(steps)
    values = np.asarray(values, dtype=float)
    ok = np.isfinite(values)
    steps, values = steps[ok], values[ok]
    n = len(values)
    if n == 0:
        return robust.empty_score()
    log_scale = robust.use_log(values)
    y = robust.transform(values, log_scale)
    w = max(int(window), 1)
    trail = robust._trail_median(w, y)
    lead = robust._lead_from_trail(w, y, trail)
    idx = np.arange(n)
    n_before, n_after = np.minimum(idx, w), np.minimum(n - 1 - idx, w)
    sig = robust.noise_scale(y, w)
    q = robust.resolution(values)
    if log_scale:
        floor = np.maximum(sigma_floor, q / np.maximum(values, 1e-300))
    else:
        floor = np.full(n, max(sigma_floor * float(np.median(np.abs(y))), q, 1e-12))
    sig = np.where(np.isfinite(sig), np.maximum(sig, floor), floor)
    with np.errstate(invalid="ignore"):
        z_trail = (y - trail) / sig
        z_lead = (y - lead) / sig
    confirm = steps <= confirm_until if confirm_until is not None else np.zeros(n, dtype=bool)
    trailing_ok = (n_before >= min_side) & ~(confirm & (n_after >= 1))
    two_sided = ~trailing_ok & (n_before >= 1) & (n_after >= 1)
    z = np.where(trailing_ok, z_trail, np.where(two_sided, np.minimum(z_trail, z_lead), np.nan))
    base_y = np.where(trailing_ok, trail, np.where(two_sided, np.maximum(trail, lead), np.nan))
    base = robust.inverse(base_y, log_scale)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = values / base if log_scale else values - base
    return pl.DataFrame(
        {
            "step": steps.astype(np.int64),
            "value": values,
            "baseline": base,
            "sigma": sig,
            "z": z,
            "ratio": ratio,
            "two_sided": two_sided,
        },
        schema=robust.SCORE_SCHEMA,
    ).with_columns(pl.col("baseline", "z", "ratio").fill_nan(None))


def _same(a: pl.DataFrame, b: pl.DataFrame) -> bool:
    if a.schema != b.schema or a.height != b.height:
        return False
    for c in a.columns:
        x, y = a.get_column(c), b.get_column(c)
        if not x.is_null().equals(y.is_null()):
            return False
        xv, yv = x.to_numpy(), y.to_numpy()
        if xv.dtype.kind == "f":
            if xv.tobytes() != yv.tobytes():  # bits: signs of zero and NaN payloads too
                return False
        elif not np.array_equal(xv, yv):
            return False
    return True


def _series(rng: np.random.Generator, n: int, kind: int) -> np.ndarray:
    if kind == 0:  # positive, log-scale, with spikes
        v = np.exp(rng.standard_normal(n) * 0.05) * np.linspace(3, 1, n)
        v[rng.integers(0, n, size=max(1, n // 50))] *= 5.0
        return v
    if kind == 1:  # signed, printed with two decimals (ties, zeros)
        return np.round(rng.standard_normal(n), 2)
    if kind == 2:  # positive with NaN and Inf among them
        v = np.exp(rng.standard_normal(n))
        v[rng.integers(0, n, size=3)] = np.array([np.nan, np.inf, -np.inf])
        return v
    v = np.exp(rng.standard_normal(n))  # zeros of both signs: a linear-scale series
    v[rng.integers(0, n, size=4)] = np.array([0.0, -0.0, 0.0, -0.0])
    return v


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 16])
def test_score_in_blocks_is_the_whole_array_score(
    block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(robust, "_SCORE_BLOCK", block)
    rng = np.random.default_rng(block)
    for trial in range(24):
        n = int(rng.choice([0, 1, 2, 3, 5, 40, 333, 2500, 70_000 if block >= 64 else 900]))
        kind = trial % 4
        v = _series(rng, n, kind) if n else np.zeros(0)
        steps = np.cumsum(rng.integers(1, 3, size=n)) + int(rng.integers(0, 50))
        kw = {
            "window": int(rng.choice([1, 5, 20])),
            "min_side": int(rng.choice([1, 3])),
            "confirm_until": None if trial % 3 else float(steps[n // 3]) if n else 10.0,
        }
        got = robust.score(steps, v, **kw)
        want = _reference(steps, v, **kw)
        assert _same(got, want), (block, trial, n, kind)


def test_score_differs_where_the_inputs_differ() -> None:
    """The comparison above can fail: a changed value changes the frame."""
    rng = np.random.default_rng(3)
    v = _series(rng, 500, 0)
    steps = np.arange(500)
    w = v.copy()
    w[250] *= 1.5
    assert not _same(robust.score(steps, v), _reference(steps, w))


@pytest.mark.parametrize("piece", [50, 97, 1000])
def test_score_in_pieces_is_the_whole_array_score(
    piece: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long series is scored a piece at a time, each piece extended by the noise scale's
    reach (pieces shorter than that reach too): the same frame, bit for bit. Series with a
    NaN or a -0.0 keep the whole-array path; the others here take the pieces."""
    monkeypatch.setattr(robust, "_SCORE_PIECE", piece)
    monkeypatch.setattr(robust, "_SCORE_BLOCK", 37)
    rng = np.random.default_rng(piece)
    pieces_taken = 0
    for trial in range(20):
        n = int(rng.choice([2 * piece - 1, 2 * piece, 2 * piece + 13, 5_000, 20_000]))
        kind = trial % 5
        # kind 4: signed values without a -0.0 (a series not taken in logs, scored in pieces)
        v = np.round(rng.standard_normal(n), 2) + 0.0 if kind == 4 else _series(rng, n, kind)
        steps = np.cumsum(rng.integers(1, 3, size=n)) + int(rng.integers(0, 50))
        kw = {
            "window": int(rng.choice([1, 5, 20])),
            "min_side": int(rng.choice([1, 3])),
            "confirm_until": None if trial % 3 else float(steps[n // 3]),
        }
        finite = v[np.isfinite(v)]
        if len(finite) >= 2 * piece and not np.signbit(finite[finite == 0]).any():
            pieces_taken += 1
        got = robust.score(steps, v, **kw)
        want = _reference(steps, v, **kw)
        assert _same(got, want), (piece, trial, n, kind)
    assert pieces_taken >= 8  # (the pieces were taken, not only the whole-array path)
