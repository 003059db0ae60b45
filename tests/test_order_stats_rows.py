"""``order_stats.median_rows`` (row medians through a row sort from 8 values on) against
``np.median`` of each row, bit for bit: odd and even widths, ties, zeros of both signs."""

from __future__ import annotations

import numpy as np
from test_spike_fast_path import _bits

from forensics.evidence import order_stats


def test_median_rows_equal_np_median_row_by_row() -> None:
    rng = np.random.default_rng(71)
    for width in [1, 2, 3, 4, 7, 8, 9, 16, 75, 150, 299, 300, 1001]:
        for kind in range(4):
            a = rng.standard_normal((12, width))
            if kind == 1:  # ties: a few distinct values
                a = np.round(a)
            elif kind == 2:  # zeros of both signs around the middle
                a = np.where(rng.random(a.shape) < 0.5, 0.0, -0.0) * (rng.random(a.shape) < 0.7)
                a += np.where(rng.random(a.shape) < 0.2, rng.standard_normal(a.shape), 0.0)
            elif kind == 3:  # huge and tiny magnitudes
                a = a * 10.0 ** rng.integers(-300, 300, a.shape)
            want = [np.float64(np.median(row)) for row in a]
            got = order_stats.median_rows(a)
            assert _bits(list(got)) == _bits(want), (width, kind)
