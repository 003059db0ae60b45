"""Shared helpers for the trend detectors: robust slopes, spike filtering, binning, onsets.

Everything works on plain numpy arrays of steps and values. Long series are reduced to
per-bin medians before a Theil-Sen fit: the estimator compares every pair of points, so
twenty thousand raw points would cost hundreds of millions of pairs, while a few hundred
bin medians keep the slope robust and the cost negligible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.run import Run

MAD_SCALE = 1.4826  # MAD -> standard deviation for normal noise


@dataclass(frozen=True)
class Slope:
    """A Theil-Sen fit: slope per step, intercept, and the 90% confidence band of the slope."""

    slope: float
    intercept: float
    low: float
    high: float
    n: int

    @property
    def rising(self) -> bool:
        return self.low > 0

    @property
    def falling(self) -> bool:
        return self.high < 0

    def per_1k(self) -> float:
        return self.slope * 1000.0


def arrays(run: Run, metric: str, layer: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Steps and values of one canonical series, non-finite values dropped."""
    s = run.series(metric, layer)
    if s.is_empty():
        return np.array([], dtype=np.int64), np.array([], dtype=float)
    x = s.get_column("step").to_numpy().astype(np.int64)
    y = s.get_column("value").to_numpy().astype(float)
    ok = np.isfinite(y)
    return x[ok], y[ok]


def rolling_median(values: np.ndarray, window: int, *, center: bool = True) -> np.ndarray:
    """Rolling median that tolerates short series (the window shrinks at the edges)."""
    if len(values) == 0:
        return values.astype(float)
    window = max(1, min(int(window), len(values)))
    out = pl.Series(values.astype(float)).rolling_median(window, min_samples=1, center=center)
    return out.to_numpy().astype(float)


def robust_sigma(values: np.ndarray) -> float:
    """Noise level of a series around its local trend, from second differences.

    A second difference cancels a locally linear trend and has variance 6 sigma^2 for white
    noise, so its MAD gives sigma without being fooled by the trend itself.
    """
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) < 4:
        if len(v) >= 2:
            return float(np.std(v))
        return 0.0
    d2 = np.diff(v, 2)
    return float(MAD_SCALE * np.median(np.abs(d2 - np.median(d2))) / np.sqrt(6.0))


def despike(values: np.ndarray, *, window: int = 25, k: float = 5.0) -> np.ndarray:
    """Mask of points to keep: drops upward outliers above rolling median + k * rolling MAD.

    Spikes belong to the spike detectors; a trend fit must not be dragged by them.
    """
    v = np.asarray(values, dtype=float)
    if len(v) < 5:
        return np.isfinite(v)
    med = rolling_median(v, window)
    dev = np.abs(v - med)
    mad = rolling_median(dev, window) * MAD_SCALE
    floor = 1e-3 * np.abs(med) + 1e-12  # constant stretches have zero MAD
    return np.isfinite(v) & (v <= med + k * np.maximum(mad, floor))


def bin_median(
    steps: np.ndarray, values: np.ndarray, *, max_bins: int = 200
) -> tuple[np.ndarray, np.ndarray]:
    """Per-bin median steps and values (equal numbers of points per bin)."""
    n = len(values)
    if n <= max_bins:
        return steps.astype(float), values.astype(float)
    edges = np.linspace(0, n, max_bins + 1).astype(int)
    xs = np.empty(max_bins)
    ys = np.empty(max_bins)
    for i in range(max_bins):  # at most max_bins iterations: cheap
        a, b = edges[i], edges[i + 1]
        xs[i] = np.median(steps[a:b])
        ys[i] = np.median(values[a:b])
    return xs, ys


def bin_bounds(steps: np.ndarray, *, max_bins: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """First and last step of each bin, with the same bins as :func:`bin_median`."""
    n = len(steps)
    if n <= max_bins:
        return steps.copy(), steps.copy()
    edges = np.linspace(0, n, max_bins + 1).astype(int)
    return steps[edges[:-1]], steps[edges[1:] - 1]


def theil_sen(steps: np.ndarray, values: np.ndarray, *, max_points: int = 200) -> Slope | None:
    """Robust slope with a 90% band; None with fewer than three distinct steps."""
    from scipy.stats import theilslopes

    x, y = bin_median(np.asarray(steps, float), np.asarray(values, float), max_bins=max_points)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.ptp(x) == 0:
        return None
    res = theilslopes(y, x, alpha=0.90)
    return Slope(
        float(res.slope), float(res.intercept), float(res.low_slope), float(res.high_slope), len(x)
    )


def hinge_onset(
    steps: np.ndarray, values: np.ndarray, *, min_side: int = 3
) -> tuple[int, float, float] | None:
    """Where a series bends upward: best continuous two-piece linear fit.

    Returns ``(onset_step, slope_before, slope_after)``. Least squares on bin medians, so a
    few residual outliers matter little. None when too short.
    """
    x = np.asarray(steps, float)
    y = np.asarray(values, float)
    n = len(x)
    if n < 2 * min_side + 1:
        return None
    best: tuple[float, int, float, float] | None = None
    ones = np.ones(n)
    for i in range(min_side, n - min_side):  # a few hundred candidates at most
        t = x[i]
        a = np.column_stack([ones, x - t, np.maximum(0.0, x - t)])
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        sse = float(np.sum((a @ coef - y) ** 2))
        if best is None or sse < best[0]:
            best = (sse, i, float(coef[1]), float(coef[1] + coef[2]))
    if best is None:
        return None
    _, i, before, after = best
    return int(round(x[i])), before, after


def warmup_start(run: Run, steps: np.ndarray) -> int | None:
    """End of the LR warm-up (``baseline.warmup_end``) when it is plausible, else None.

    The LR peak is only a warm-up end when it comes early: an LR that is ramped up late in
    the run (or a schedule that peaks at the end) would otherwise put the "baseline" at the
    very end of the log. Past the first quarter of the log the first window is used instead.
    """
    from forensics.evidence.baseline import warmup_end

    w = warmup_end(run)
    if w is None or len(steps) == 0:
        return None
    return w if w <= steps[0] + 0.25 * (steps[-1] - steps[0]) else None


def level(values: np.ndarray) -> float:
    v = values[np.isfinite(values)]
    return float(np.median(v)) if len(v) else float("nan")


def window_median(steps: np.ndarray, values: np.ndarray, lo: float, hi: float) -> float:
    """Median of values with lo <= step <= hi (NaN when the window is empty)."""
    sel = (steps >= lo) & (steps <= hi)
    return level(values[sel]) if sel.any() else float("nan")


def align(
    train_steps: np.ndarray, train_values: np.ndarray, at: np.ndarray, half_width: float
) -> np.ndarray:
    """Median of the train series in [s - half_width, s + half_width] for each step s in ``at``.

    Used to put a smoothed train loss next to each validation point. Falls back to the
    nearest train point when the window is empty.
    """
    out = np.full(len(at), np.nan)
    if len(train_steps) == 0:
        return out
    lo = np.searchsorted(train_steps, at - half_width, side="left")
    hi = np.searchsorted(train_steps, at + half_width, side="right")
    for i in range(len(at)):  # one iteration per validation point (a few hundred at most)
        if hi[i] > lo[i]:
            out[i] = np.median(train_values[lo[i] : hi[i]])
        else:
            j = int(np.clip(np.searchsorted(train_steps, at[i]), 0, len(train_steps) - 1))
            out[i] = train_values[j]
    return out


def fmt_layers(layers: list[int]) -> str:
    """Compact layer list: [0, 1, 2, 3, 7] -> "0-3,7"."""
    if not layers:
        return ""
    parts: list[str] = []
    start = prev = layers[0]
    for v in layers[1:] + [None]:  # type: ignore[list-item]
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
        if v is not None:
            start = prev = v
    return ",".join(parts)


def sig(x: float, digits: int = 3) -> str:
    """Short human number for summaries."""
    if x is None or not np.isfinite(x):
        return "n/a"
    return f"{x:.{digits}g}"
