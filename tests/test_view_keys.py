"""``run._last_of_key`` (which rows of the view's order are the last of their (series,
step), the kept rows per series, and whether steps grow within every series) against the
plain computation on the series of each position, in blocks of any size."""

from __future__ import annotations

import numpy as np
import pytest

import forensics.run as run_mod


def _plain(perm: np.ndarray, rank: np.ndarray, steps: np.ndarray, k: int) -> tuple:
    r, st = rank[perm], steps[perm]
    same = r[1:] == r[:-1]
    in_order = not (st[1:][same] < st[:-1][same]).any()
    keep = np.ones(len(perm), dtype=bool)
    keep[:-1] = ~(same & (st[1:] == st[:-1]))
    return keep, np.bincount(r[keep], minlength=k), in_order


@pytest.mark.parametrize("block", [1, 3, 64, 1 << 20])
def test_last_of_key_equals_the_plain_one(monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    monkeypatch.setattr(run_mod, "_BLOCK", block)
    rng = np.random.default_rng(block + 5)
    for n, k in [(1, 1), (2, 1), (10, 3), (1000, 7), (5000, 40)]:
        for trial in range(6):
            rank = rng.integers(0, k, n).astype(np.uint16)
            if trial % 3 == 0:  # series that log nothing (empty ranks)
                rank = (rank // 2 * 2).astype(np.uint16)
            steps = np.sort(rng.integers(0, n // 2 + 2, n))  # repeated steps (re-logged values)
            if trial % 2:  # a step that goes back
                steps = rng.integers(0, n + 1, n)
            perm = np.argsort(rank, kind="stable").astype(np.uint32)
            if trial == 5:  # the general order: by series and step
                perm = np.lexsort((steps, rank)).astype(np.uint32)
            totals = np.bincount(rank, minlength=k)
            keep, counts, in_order = run_mod._last_of_key(perm, steps, totals)
            want_keep, want_counts, want_order = _plain(perm, rank, steps, k)
            assert in_order == want_order, (n, k, trial)
            if in_order:
                np.testing.assert_array_equal(keep, want_keep)
                np.testing.assert_array_equal(counts, want_counts)


def test_the_reorder_keeps_one_value_columns_and_gathers_the_rest() -> None:
    """A column of one value (or all null) is kept as it is: the reordered frame is the
    frame's rows gathered at the view's order, column for column."""
    from pathlib import Path

    import polars as pl
    from polars.testing import assert_frame_equal

    from forensics.schema import add_canonical, conform

    rng = np.random.default_rng(71)
    n = 3000
    f = pl.DataFrame(
        {
            "source": ["jsonl"] * n,  # one value
            "tag": np.resize(["loss", "lr", "grad_norm"], n),  # interleaved: a real reorder
            "step": np.repeat(np.arange(n // 3), 3),
            "value": rng.normal(size=n),
            "segment": [0] * n,  # one value
            "record_idx": np.arange(n),
        }
    )
    frame = add_canonical(conform(f), "jsonl")
    frame = frame.with_columns(
        pl.when(pl.col("record_idx") % 7 == 0).then(pl.col("segment")).alias("segment"),
    )  # one value and nulls: not one value
    order = run_mod.view_plan(frame).order
    assert order is not None
    want = frame.select(pl.all().gather(pl.Series(order)))
    kept = [c for c in frame.columns if run_mod._one_value(frame, c)]
    assert "source" in kept and "segment" not in kept and "step" not in kept
    run = run_mod.Run(name="t", path=Path("."), format="jsonl", frame=frame)
    run.view()
    assert_frame_equal(run.frame, want)
