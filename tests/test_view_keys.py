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


def _plain_function_of_key(col, key: np.ndarray, one: np.ndarray) -> bool:  # type: ignore[no-untyped-def]
    import polars as pl

    return bool(col.eq_missing(col.gather(pl.Series(one[key].astype(np.int64)))).all())


@pytest.mark.parametrize("block", [1, 3, 64, 1 << 20])
def test_the_series_value_check_equals_the_plain_gather(
    monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    # metric (categorical codes, nulls for unknown tags) and layer (Int16, null for the
    # scalar series) checked against each series' last row, as _ranked_series does
    import polars as pl

    monkeypatch.setattr(run_mod, "_BLOCK", block)
    rng = np.random.default_rng(block)
    names = ["loss", "lr", None, "grad_norm_layer", "x"]
    # (one-row blocks: the small sizes only, a Python step per row)
    for n, k in [(1, 1), (7, 2), (500, 5), (3000, 40)][: 3 if block == 1 else 4]:
        for trial in range(6):
            key = rng.integers(0, k, n).astype(np.uint32)
            metric = [names[int(t) % len(names)] for t in key]
            layer = [None if int(t) % 3 else int(t) - 20 for t in key]  # negative layers too
            if trial % 2 and n > 1:  # one row disagrees with its series
                i = int(rng.integers(0, n))
                metric[i] = "other" if trial % 4 == 1 else None
                layer[i] = 5 if layer[i] is None else None
            one = np.full(k, np.iinfo(np.uint32).max, dtype=np.uint32)
            one[key] = np.arange(n, dtype=np.uint32)
            keys = np.flatnonzero(one != np.iinfo(np.uint32).max)
            cols = [
                pl.Series(metric, dtype=pl.Categorical),
                pl.Series(metric, dtype=pl.String),  # a frame outside the canonical schema
                pl.Series(layer, dtype=pl.Int16),
                pl.Series(layer, dtype=pl.Int64),
            ]
            for col in cols:
                got = run_mod._function_of_key(col, key, one, keys)
                assert got == _plain_function_of_key(col, key, one), (n, k, trial, col.dtype)


def test_the_blockwise_counts_and_rank_widths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_mod, "_BLOCK", 7)
    rng = np.random.default_rng(1)
    for n, k in [(0, 3), (5, 1), (1000, 300)]:
        rank = rng.integers(0, k, n).astype(np.uint16)
        np.testing.assert_array_equal(
            run_mod._counts(rank, k), np.bincount(rank.astype(np.int64), minlength=k)
        )
    assert run_mod._rank_dtype(256) == np.uint8 and run_mod._rank_dtype(257) == np.uint16
    assert run_mod._rank_dtype(1 << 16) == np.uint16 and run_mod._rank_dtype(70_000) == np.uint32


def test_last_of_key_on_rows_in_order_takes_no_order() -> None:
    rng = np.random.default_rng(11)
    for n, k in [(1, 1), (10, 3), (5000, 40)]:
        rank = np.sort(rng.integers(0, k, n)).astype(np.uint16)
        steps = rng.integers(0, n, n)
        steps = steps[np.lexsort((steps, rank))] if n % 2 else steps
        totals = np.bincount(rank, minlength=k)
        ident = np.arange(n, dtype=np.uint32)
        got = run_mod._last_of_key(None, steps, totals)
        want = run_mod._last_of_key(ident, steps, totals)
        assert got[2] == want[2]
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
