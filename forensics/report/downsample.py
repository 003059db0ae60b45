"""Shrink long series for plotting without losing the events the report is about.

Striding (every k-th point) drops spikes at random; a report that loses the spike it talks
about is worse than none. We use min/max decimation (the M4 rule: first, last, min and max of
each bucket), which keeps every extreme, keep one non-finite point per bucket so NaN gaps
stay visible, and always keep the steps the findings point at.
"""

from __future__ import annotations

import numpy as np

DEFAULT_BUCKETS = 1000  # per trace: at most 4 points per bucket


def minmax_indices(
    y: np.ndarray, n_buckets: int = DEFAULT_BUCKETS, keep: np.ndarray | None = None
) -> np.ndarray:
    """Sorted indices of the points to plot.

    Args:
        y: values (may contain NaN / inf).
        n_buckets: number of equal-count buckets; each contributes its first, last, minimum
            and maximum point (and its first non-finite point, if any).
        keep: indices that must survive (findings' peaks and onsets).
    """
    n = len(y)
    if n <= 4 * n_buckets:
        return np.arange(n)
    y = np.asarray(y, dtype=float)
    k = -(-n // n_buckets)  # bucket size, ceil
    b = -(-n // k)
    pad = b * k - n
    finite = np.isfinite(y)
    lo_src = np.where(finite, y, np.inf)
    hi_src = np.where(finite, y, -np.inf)
    lo = np.concatenate([lo_src, np.full(pad, np.inf)]).reshape(b, k)
    hi = np.concatenate([hi_src, np.full(pad, -np.inf)]).reshape(b, k)
    base = np.arange(b) * k
    parts = [
        base,
        np.minimum(base + k - 1, n - 1),
        base + np.argmin(lo, axis=1),
        base + np.argmax(hi, axis=1),
    ]
    bad = np.concatenate([~finite, np.zeros(pad, dtype=bool)]).reshape(b, k)
    has_bad = bad.any(axis=1)
    if has_bad.any():
        parts.append((base + np.argmax(bad, axis=1))[has_bad])
    if keep is not None and len(keep):
        keep = np.asarray(keep, dtype=np.int64)
        parts.append(keep[(keep >= 0) & (keep < n)])
    idx = np.unique(np.concatenate(parts))
    return idx[idx < n]


def downsample(
    x: np.ndarray, y: np.ndarray, n_buckets: int = DEFAULT_BUCKETS, keep_x: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Min/max-decimate a series, keeping the points at ``keep_x`` (steps) when present."""
    keep = None
    if keep_x is not None and len(keep_x) and len(x):
        pos = np.searchsorted(x, keep_x)
        pos = np.clip(pos, 0, len(x) - 1)
        keep = pos[x[pos] == keep_x]
    idx = minmax_indices(y, n_buckets, keep)
    return x[idx], y[idx]


def bucket_mean(x: np.ndarray, z: np.ndarray, n_cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Average the columns of ``z`` (rows x len(x)) into at most ``n_cols`` buckets (heatmaps)."""
    n = len(x)
    if n <= n_cols:
        return x, z
    edges = np.unique(np.linspace(0, n, n_cols + 1).astype(int))[:-1]
    ok = np.isfinite(z)
    sums = np.add.reduceat(np.where(ok, z, 0.0), edges, axis=1)
    counts = np.add.reduceat(ok.astype(float), edges, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return x[edges], np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
