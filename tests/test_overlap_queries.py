"""``spike_context.Overlaps`` (a binary search per query) answers as ``overlaps`` does."""

from __future__ import annotations

import numpy as np

from forensics.evidence.spike_context import Overlaps, overlaps


def test_overlap_queries_equal_the_plain_test() -> None:
    rng = np.random.default_rng(67)
    for trial in range(200):
        k = int(rng.integers(0, 12))
        a = rng.integers(0, 100, k).astype(float)
        w = np.column_stack([a, a + rng.integers(0, 30, k)])
        if trial % 7 == 0 and k:
            w[int(rng.integers(0, k)), 1] = np.nan  # asked of overlaps itself
        if trial % 11 == 0:
            w = np.empty((0, 2))
        test = Overlaps(w)
        for _ in range(40):
            lo = float(rng.integers(-10, 130)) + float(rng.choice([0.0, 0.5, -0.5]))
            hi = lo + float(rng.integers(0, 20))
            assert test(lo, hi) == overlaps(w, lo, hi), (trial, lo, hi, w.tolist())
            assert test(int(lo), int(hi)) == overlaps(w, int(lo), int(hi))
