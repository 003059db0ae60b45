"""The spike batch's (spikes x points) arrays are formed a few rows at a time
(``shape_batch._chunked``): the same numbers as one array per group, with the arrays bounded."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_spike_fast_path import _bits, _spiky

from forensics.evidence import shape_batch
from forensics.evidence.spike_shape import ShapeParams, log_steps
from forensics.params import SpikesParams


def _case(rng: np.random.Generator, trial: int) -> tuple[Any, ...]:
    log = trial % 3 != 2
    n = int(rng.integers(600, 3000))
    steps, values = _spiky(rng, n, log)
    peaks = np.unique(rng.integers(320, n - 40, size=int(rng.integers(20, 60))))
    spikes = []
    for pk in peaks:
        values[pk] = values[pk] * 4.0 if log else values[pk] + 3.0
        if rng.random() < 0.1:  # a NaN in a plateau: that spike leaves the batch
            values[min(n - 1, pk + int(rng.integers(5, 30)))] = np.nan
        sig = float(rng.choice([0.01, 0.05, 0.2]))
        base = float(np.nanmedian(values[pk - 20 : pk]))
        spikes.append(shape_batch.SpikeInput(int(pk), int(pk), sig, base, 0.5 * (trial % 2)))
    barriers = [int(steps[n // 2])] if trial % 4 == 0 else None
    ys = np.log(values) if log else values.astype(float)
    kw = {
        "log_scale": log,
        "p": ShapeParams.of(SpikesParams()),
        "barriers": barriers,
        "interval": float(np.median(np.diff(steps))),
        "xs": log_steps(steps),
        "ys": ys,
    }
    return steps, values, spikes, kw


@pytest.mark.parametrize("cells", [1, 50, 700])
def test_chunked_plateaus_and_areas_are_the_whole_groups(
    cells: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(41 + cells)
    split = 0
    chunked = shape_batch._chunked
    shapes: list[tuple[int, int]] = []

    def seen(groups: dict[int, np.ndarray]) -> Any:
        for length, rows in chunked(groups):
            shapes.append((len(rows), length))
            yield length, rows

    for trial in range(12):
        steps, values, spikes, kw = _case(rng, trial)
        want = shape_batch.measure_many(steps, values, spikes, **kw)
        shapes.clear()
        with monkeypatch.context() as m:
            m.setattr(shape_batch, "_CHUNK_CELLS", cells)
            m.setattr(shape_batch, "_chunked", seen)
            got = shape_batch.measure_many(steps, values, spikes, **kw)
        assert _bits(got) == _bits(want), trial
        assert all(r == 1 or r * length <= cells for r, length in shapes)
        split += sum(1 for r, _ in shapes if r < len(spikes))
    assert split > 0  # groups were cut


def test_chunks_cover_every_row_once() -> None:
    groups = {3: np.arange(10), 500: np.arange(10, 13), 1: np.array([20])}
    seen = [(length, r) for length, rows in shape_batch._chunked(groups) for r in rows.tolist()]
    assert sorted(seen) == sorted((length, r) for length, rr in groups.items() for r in rr.tolist())
    sizes = [len(rows) * length for length, rows in shape_batch._chunked(groups)]
    assert max(sizes) <= max(shape_batch._CHUNK_CELLS, 500)
