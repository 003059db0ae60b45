"""The analysis view built by ranking series (Run.view, metrics, series, metric_rows) equals the
plain definition: drop rows a later segment pre-empts, stable-sort by (metric, source, tag,
step), keep the last row of each (source, tag, step). Checked on frames made to hit every
branch: restarts, re-logged steps, steps out of order, two sources sharing a tag, a tag on
two layers, null steps and tags, and frames already in view order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import forensics.run as run_mod
from forensics.run import PER_LAYER, VIEW_COLUMNS, Run
from forensics.schema import add_canonical, conform


def _reference_view(frame: pl.DataFrame) -> pl.DataFrame:
    """The view's definition, written the direct way (a sort of every row)."""
    f = frame.select(VIEW_COLUMNS).filter(pl.col("step").is_not_null())
    if f.is_empty():
        return f
    rows = f.with_row_index("_row")
    key = ["source", "tag"]
    firsts = rows.group_by([*key, "segment"]).agg(pl.col("step").min().alias("_first"))
    later = (
        rows.select("_row", *key, "segment", "step")
        .join(firsts.rename({"segment": "_seg"}), on=key)
        .filter(pl.col("_seg") > pl.col("segment"))
        .group_by("_row")
        .agg(pl.col("_first").min().alias("_later"))
    )
    rows = rows.join(later, on="_row", how="left").sort("_row")
    rows = rows.filter(pl.col("_later").is_null() | (pl.col("step") < pl.col("_later")))
    rows = rows.sort(["metric", "source", "tag", "step", "_row"])
    last = (
        (pl.col("step") != pl.col("step").shift(-1))
        | (pl.col("tag") != pl.col("tag").shift(-1))
        | (pl.col("source") != pl.col("source").shift(-1))
    ).fill_null(True)
    return rows.filter(last).select(VIEW_COLUMNS)


def _frame(seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    tags = ["loss", "lr", "grad_norm", "val_loss", "custom/thing", "grad_norm/layer_3"]
    tags += [f"grad_norm/layer_{i}" for i in range(int(rng.integers(0, 4)))]
    n = int(rng.integers(1, 400))
    kind = seed % 5
    if kind == 0:  # in order, interleaved tags: the fast path
        step = np.repeat(np.arange(n // len(tags) + 1), len(tags))[:n]
        tag = np.resize(tags, n)
    elif kind == 1:  # series by series (a column-major reader): slices of the frame
        per = n // len(tags) + 1
        step = np.tile(np.arange(per), len(tags))[:n]
        tag = np.repeat(tags, per)[:n]
    else:  # anything: steps back, repeats
        step = rng.integers(0, 30, n)
        tag = rng.choice(tags, n)
    steps = [None if kind == 4 and rng.random() < 0.1 else int(s) for s in step]
    sources = rng.choice(["jsonl", "tfevents"], n) if kind >= 3 else np.repeat("jsonl", n)
    segment = np.cumsum(rng.random(n) < (0.02 if kind >= 2 else 0.0))
    f = pl.DataFrame(
        {
            "source": sources,
            "tag": tag,
            "step": steps,
            "value": rng.normal(size=n),
            "wall_time": rng.random(n) * 1e9,
            "segment": segment,
            "record_idx": np.arange(n),
        },
        schema_overrides={"step": pl.Int64},
    )
    f = add_canonical(conform(f), "jsonl")
    if seed % 7 == 0 and n > 4:  # one tag on two layers: the general sort
        f = f.with_columns(
            pl.when((pl.col("tag") == "grad_norm/layer_3") & (pl.col("step") % 2 == 0))
            .then(pl.lit(4, dtype=f.schema["layer"]))
            .otherwise(pl.col("layer"))
            .alias("layer")
        )
    return f


def _reference_series(v: pl.DataFrame, metrics: dict[str, str], m: str, layer: int | None):  # noqa: ANN202
    sub = v.filter(pl.col("metric") == m)
    if layer is not None:
        sub = sub.filter(pl.col("layer") == layer)
    if layer is None and m not in PER_LAYER:
        sub = sub.filter(pl.col("tag") == metrics[m])
    if layer is not None and sub.get_column("tag").n_unique() > 1:
        return None  # combined per layer: compared through the run's own general way
    return (
        sub.group_by("step", maintain_order=True)
        .agg(pl.col("value").last(), pl.col("wall_time").last())
        .sort("step")
    )


@pytest.mark.parametrize("block", [3, 1 << 20])
def test_view_equals_its_definition(monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    monkeypatch.setattr(run_mod, "_BLOCK", block)  # the key checks in blocks, at block ends
    for seed in range(120):
        frame = _frame(seed)
        run = Run(name="t", path=Path("."), format="jsonl", frame=frame)
        ref = _reference_view(frame)
        assert_frame_equal(run.view(), ref, check_row_order=True)
        for m in ref.get_column("metric").drop_nulls().unique().to_list():
            assert_frame_equal(run.metric_rows(m), ref.filter(pl.col("metric") == m))
            layers = sorted(
                ref.filter(pl.col("metric") == m).get_column("layer").drop_nulls().unique()
            )
            assert run.layers(m) == layers
            for layer in [None, *layers]:
                want = _reference_series(ref, run.metrics(), m, layer)
                if want is not None:
                    assert_frame_equal(run.series(m, layer), want)


def test_metrics_pick_the_tag_with_most_points() -> None:
    f = pl.DataFrame(
        {
            "tag": ["loss"] * 3 + ["train/loss"] * 5 + ["grad_norm/layer_0", "grad_norm/layer_1"],
            "step": [1, 2, 3, 1, 2, 3, 4, 5, 1, 1],
            "value": [1.0] * 10,
        }
    )
    run = Run(name="t", path=Path("."), format="jsonl", frame=add_canonical(conform(f), "jsonl"))
    assert run.metrics()["loss"] == "train/loss"
    assert run.metrics()["grad_norm_layer"] == "2 layer tags"
    assert run.series("loss").get_column("step").to_list() == [1, 2, 3, 4, 5]


def test_a_frame_in_view_order_is_not_copied() -> None:
    f = pl.DataFrame(
        {
            "source": ["jsonl"] * 10,
            "tag": ["loss"] * 5 + ["lr"] * 5,
            "step": list(range(5)) * 2,
            "segment": [0] * 10,
        }
    )
    f = f.with_columns(pl.Series("value", np.arange(10, dtype=np.float64)))
    frame = add_canonical(conform(f), "jsonl")
    run = Run(name="t", path=Path("."), format="jsonl", frame=frame)
    v = run.view()
    assert v.get_column("step").to_list() == list(range(5)) * 2

    # The view's columns are the frame's own buffers (a zero-copy selection).
    def address(s: pl.Series) -> int:
        return s.to_numpy().__array_interface__["data"][0]

    assert address(v.get_column("value")) == address(frame.get_column("value"))


def test_a_frame_written_series_by_series_is_sliced() -> None:
    # Tags whose canonical order differs from the frame's: the view is the frame's slices.
    tags = ["val_loss", "lr", "loss", "grad_norm"]
    n = 5000
    f = pl.DataFrame(
        {
            "source": ["jsonl"] * (n * len(tags)),
            "tag": np.repeat(tags, n),
            "step": np.tile(np.arange(n), len(tags)),
            "value": np.arange(n * len(tags), dtype=np.float64),
            "segment": [0] * (n * len(tags)),
        }
    )
    frame = add_canonical(conform(f), "jsonl")
    run = Run(name="t", path=Path("."), format="jsonl", frame=frame)
    assert_frame_equal(run.view(), _reference_view(frame), check_row_order=True)
    assert run.view().get_column("value").n_chunks() == len(tags)
    assert run.series("val_loss").get_column("value")[0] == 0.0


def test_the_frame_is_put_in_view_order_keeping_every_row() -> None:
    # Run.view reorders the run's frame rather than copying it: every row is still there (the
    # record order recoverable from record_idx), the view is the frame's own first rows, and
    # the reordered frame gives the same view again (a re-logged step's rows stay in record
    # order, so the value logged last still wins).
    for seed in range(120):
        frame = _frame(seed)
        run = Run(name="t", path=Path("."), format="jsonl", frame=frame)
        view = run.view()
        assert run.frame.height == frame.height
        assert_frame_equal(run.frame.sort("record_idx"), frame)
        assert_frame_equal(view, _reference_view(frame), check_row_order=True)
        again = Run(name="t", path=Path("."), format="jsonl", frame=run.frame)
        assert_frame_equal(again.view(), view, check_row_order=True)
        assert again.frame is run.frame  # already in view order: left as it is
        assert run.view() is view  # cached for the reordered frame


def test_the_view_shares_the_reordered_frames_buffers() -> None:
    rng = np.random.default_rng(3)
    n = 3000
    f = pl.DataFrame(
        {
            "source": ["jsonl"] * n,
            "tag": np.resize(["loss", "lr", "grad_norm"], n),  # interleaved: a real reorder
            "step": np.repeat(np.arange(n // 3), 3),
            "value": rng.normal(size=n),
            "segment": [0] * n,
            "record_idx": np.arange(n),
        }
    )
    frame = add_canonical(conform(f), "jsonl")
    run = Run(name="t", path=Path("."), format="jsonl", frame=frame)
    v = run.view()
    assert run.frame is not frame
    assert frame.get_column("tag").to_list()[:3] == ["loss", "lr", "grad_norm"]  # untouched

    def address(s: pl.Series) -> int:
        return s.to_numpy().__array_interface__["data"][0]

    assert address(v.get_column("value")) == address(run.frame.get_column("value"))
    assert address(v.get_column("step")) == address(run.frame.get_column("step"))


def test_an_interrupted_reorder_leaves_the_frame_in_record_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    frame = _frame(2)
    run = Run(name="t", path=Path("."), format="jsonl", frame=frame)
    calls = {"n": 0}
    drop = pl.DataFrame.drop

    def failing_drop(self: pl.DataFrame, *a: object, **k: object) -> pl.DataFrame:
        calls["n"] += 1
        if calls["n"] == 4:
            raise MemoryError
        return drop(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(pl.DataFrame, "drop", failing_drop)
    with pytest.raises(MemoryError):
        run.view()
    assert calls["n"] == 4
    assert_frame_equal(run.frame, frame)
    monkeypatch.setattr(pl.DataFrame, "drop", drop)
    assert_frame_equal(run.view(), _reference_view(frame), check_row_order=True)


@pytest.mark.parametrize("block", [3, 64, 1 << 20])
def test_the_blockwise_stable_order_is_numpys_stable_argsort(
    monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    monkeypatch.setattr(run_mod, "_BLOCK", block)
    rng = np.random.default_rng(block)
    for n, k in [(0, 3), (1, 1), (10, 3), (1000, 7), (50_000, 300)]:
        rank = rng.integers(0, k, n).astype(np.uint16)
        got = run_mod._stable_order(rank, k, np.uint32)
        assert got.dtype == np.uint32
        np.testing.assert_array_equal(got, np.argsort(rank, kind="stable"))


@pytest.mark.parametrize("block", [3, 64, 1 << 20])
def test_the_stable_order_of_a_few_runs_is_numpys_stable_argsort(
    monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    """Ranks in a few runs (a frame laid out series by series, a series split over pieces
    of the log, the run limit either side): the runs' order is the stable argsort."""
    monkeypatch.setattr(run_mod, "_BLOCK", block)
    rng = np.random.default_rng(block)
    limit = run_mod._MAX_RUNS
    for n_runs, k in [(1, 1), (2, 2), (7, 3), (40, 40), (300, 12), (limit, 50), (limit + 1, 50)]:
        lengths = rng.integers(1, 40, n_runs)
        # (each run's rank differs from the one before: n_runs runs exactly)
        values = np.cumsum(rng.integers(1, k, n_runs) if k > 1 else np.zeros(n_runs, int)) % k
        rank = np.repeat(values, lengths).astype(np.uint16)
        runs = run_mod._rank_runs(rank)
        assert (runs is None) is (n_runs > limit)
        counts = run_mod._counts(rank, k, runs)
        np.testing.assert_array_equal(counts, np.bincount(rank, minlength=k))
        got = run_mod._stable_order(rank, k, np.uint32, counts, runs)
        assert got.dtype == np.uint32
        np.testing.assert_array_equal(got, np.argsort(rank, kind="stable"))


def test_a_frame_with_string_tags_takes_the_same_view() -> None:
    # Frames built outside the importers may hold source and tag as plain strings.
    for seed in range(0, 120, 7):
        frame = _frame(seed).with_columns(pl.col("source", "tag").cast(pl.String))
        run = Run(name="t", path=Path("."), format="jsonl", frame=frame)
        assert_frame_equal(run.view(), _reference_view(frame), check_row_order=True)


@pytest.mark.parametrize("block", [1, 3, 64, 1 << 20])
def test_the_blockwise_breaks_are_the_whole_lengths(
    monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    monkeypatch.setattr(run_mod, "_BLOCK", block)
    rng = np.random.default_rng(block)
    cases = [np.arange(0, dtype=np.uint32), np.arange(1, dtype=np.uint32)]
    cases += [np.arange(n, dtype=np.uint32) for n in (2, 5000)]
    cases += [rng.permutation(n).astype(np.uint32) for n in (2, 7, 300)]
    runs = [np.arange(a, a + 900) for a in (3000, 0, 900, 2000, 1800)]  # a few long runs
    cases.append(np.concatenate(runs).astype(np.uint32))
    for perm in cases:
        want = np.flatnonzero(np.diff(perm.astype(np.int64)) != 1) + 1
        got = run_mod._breaks(perm)
        assert got is not None
        np.testing.assert_array_equal(got, want)
        for limit in (0, 1, 3, 1024):
            capped = run_mod._breaks(perm, limit)
            if len(want) > limit:
                assert capped is None
            else:
                np.testing.assert_array_equal(capped, want)  # type: ignore[arg-type]
        assert run_mod._few_runs(perm) == (len(want) < 1024 and len(perm) >= 4096 * (len(want) + 1))


@pytest.mark.parametrize("seed", [0, 2])
def test_an_interrupted_reorder_at_any_column_leaves_every_row(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    # Interrupted while numpy scatters the plain columns, between the two, and while polars
    # gathers the others. Seed 0 (steps in order) is put in view order at once: an
    # interruption leaves the frame in record order. Seed 2 (steps that go back) is put in
    # series order, then ordered further by step: an interruption of that second move leaves
    # the rows in series order (every row kept, the view the same once built).
    frame = _frame(seed)
    drop = pl.DataFrame.drop
    calls = {"n": 0, "fail_at": 1}

    def failing_drop(self: pl.DataFrame, *a: object, **k: object) -> pl.DataFrame:
        calls["n"] += 1
        if calls["n"] == calls["fail_at"]:
            raise MemoryError
        return drop(self, *a, **k)  # type: ignore[arg-type]

    while True:
        run = Run(name="t", path=Path("."), format="jsonl", frame=frame)
        calls["n"] = 0
        monkeypatch.setattr(pl.DataFrame, "drop", failing_drop)
        try:
            run.view()
        except MemoryError:
            monkeypatch.setattr(pl.DataFrame, "drop", drop)
            if seed == 0:
                assert_frame_equal(run.frame, frame)
            else:
                assert_frame_equal(run.frame.sort("record_idx"), frame)
            assert_frame_equal(run.view(), _reference_view(frame), check_row_order=True)
            calls["fail_at"] += 1
            continue
        monkeypatch.setattr(pl.DataFrame, "drop", drop)
        assert_frame_equal(run.view(), _reference_view(frame), check_row_order=True)
        break
    assert calls["fail_at"] > 4  # (several columns moved each way)


@pytest.mark.parametrize("block", [1, 5, 1 << 20])
def test_the_reorder_equals_a_gather_of_every_column(
    monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    # numpy's scatter (plain numbers), polars' gather (the rest) and the columns kept as they
    # are (one value), against one gather of the whole frame
    monkeypatch.setattr(run_mod, "_BLOCK", block)
    rng = np.random.default_rng(block)
    n = 400
    value = rng.standard_normal(n)
    value[[0, n - 1]] = np.nan  # NaN at both ends: not surely two values (gathered)
    ints = pl.Series("ints", rng.integers(0, 9, n), dtype=pl.Int32)
    frame = pl.DataFrame(
        {
            "source": ["jsonl"] * n,
            "tag": rng.choice(["a", "b", "c"], n),
            "step": np.arange(n) // 3,
            "value": value,
            "wall_time": rng.standard_normal(n),
            "ints": ints,
            "nullable": pl.Series(rng.integers(0, 5, n), dtype=pl.Int16).set(
                pl.Series(rng.random(n) < 0.3), None
            ),
            "small": rng.integers(-3, 3, n).astype(np.int8),
        }
    ).with_columns(
        pl.col("source", "tag").cast(pl.Categorical),
        pl.lit(2.5).alias("constant"),  # a constant column (kept as one value)
        pl.lit(-0.0).alias("zero"),
    )
    # a column of two chunks (numpy would copy it: gathered)
    frame = frame.with_columns(pl.concat([ints.slice(0, 100), ints.slice(100)], rechunk=False))
    assert frame.get_column("ints").n_chunks() == 2
    order = rng.permutation(n).astype(np.uint32)
    want = frame[order.astype(np.int64)]
    run = Run(name="t", path=Path("."), format="jsonl", frame=frame)
    scattered: list[str] = []
    real = run_mod._scatter

    def scatter(col: pl.Series, dest: np.ndarray) -> pl.Series:
        scattered.append(col.name)
        return real(col, dest)

    monkeypatch.setattr(run_mod, "_scatter", scatter)
    run._reorder(run_mod.ViewPlan(order.copy(), n, None, None))
    assert sorted(scattered) == ["small", "step", "wall_time"]
    assert run.frame.schema == frame.schema
    assert_frame_equal(run.frame, want)
    for name in ("value", "zero"):  # bit for bit (NaN, the sign of zero)
        got = run.frame.get_column(name).to_numpy().view(np.uint64)
        np.testing.assert_array_equal(got, want.get_column(name).to_numpy().view(np.uint64))
    inverse = run_mod._inverse(order)
    np.testing.assert_array_equal(inverse, np.argsort(order))
    assert inverse.dtype == order.dtype


def test_the_deferred_plan_settled_on_the_moved_rows_is_the_plain_plan() -> None:
    # Run.view orders by series, then reads steps, metrics and layers from the moved rows
    # (_settle), ordering further when they ask for it; the frame, view and index are the
    # ones of the plain plan made on the frame in record order.
    for seed in range(0, 140, 3):
        frame = _frame(seed)
        plain = run_mod.view_plan(frame)
        want_frame = frame if plain.order is None else frame[plain.order.astype(np.int64)]
        want_view, want_index = run_mod.view_and_index(frame)
        run = Run(name="t", path=Path("."), format="jsonl", frame=frame)
        assert_frame_equal(run.view(), want_view, check_row_order=True)
        assert_frame_equal(run.frame, want_frame, check_row_order=True)
        if want_index is None:
            assert run._index is None
        else:
            assert run._index is not None
            assert_frame_equal(run._index, want_index, check_row_order=True)


def test_the_run_moves_are_the_stable_order_of_a_few_runs() -> None:
    # Joined end to end, the ranges are the stable argsort's rows (adjacent ranges merged).
    rng = np.random.default_rng(11)
    for n_runs, k in [(1, 1), (2, 2), (7, 3), (40, 40), (300, 12)]:
        lengths = rng.integers(1, 40, n_runs)
        values = np.cumsum(rng.integers(1, k, n_runs) if k > 1 else np.zeros(n_runs, int)) % k
        rank = np.repeat(values, lengths).astype(np.uint16)
        runs = run_mod._rank_runs(rank)
        assert runs is not None
        moves = run_mod._run_moves(rank, runs, len(rank))
        rows = np.concatenate([np.arange(a, b) for a, b in moves])
        np.testing.assert_array_equal(rows, np.argsort(rank, kind="stable"))
        assert all(b > a for a, b in moves)
        assert all(moves[i][1] != moves[i + 1][0] for i in range(len(moves) - 1))


def test_a_log_read_series_by_series_is_moved_without_an_order_array() -> None:
    # Series after series, in pieces (a series' rows in two runs of the log), not in view
    # order: the deferred plan holds row ranges, no array of every row, and the run's frame,
    # view and index are the plain plan's.
    n = 5000
    pieces = [("val_loss", 0), ("lr", 0), ("loss", 0), ("grad_norm", 0), ("loss", 1)]
    tags = np.concatenate([np.repeat(t, n) for t, _ in pieces])
    steps = np.concatenate([np.arange(n) + h * n for _, h in pieces])
    f = pl.DataFrame(
        {
            "source": ["jsonl"] * len(tags),
            "tag": tags,
            "step": steps,
            "value": np.arange(len(tags), dtype=np.float64),
            "segment": [0] * len(tags),
        }
    )
    frame = add_canonical(conform(f), "jsonl")
    plan = run_mod.view_plan(frame, deferred=True)
    assert plan.order is None and plan.moves is not None
    # grad_norm; loss in its two pieces; lr; val_loss
    assert plan.moves == [(15000, 20000), (10000, 15000), (20000, 25000), (5000, 10000), (0, 5000)]
    plain = run_mod.view_plan(frame)
    assert plain.order is not None
    want_view, want_index = run_mod.view_and_index(frame)
    run = Run(name="t", path=Path("."), format="jsonl", frame=frame)
    assert_frame_equal(run.view(), want_view, check_row_order=True)
    assert_frame_equal(run.frame, frame[plain.order.astype(np.int64)], check_row_order=True)
    assert run._index is not None and want_index is not None
    assert_frame_equal(run._index, want_index, check_row_order=True)
    assert run.view().get_column("value").n_chunks() == len(plan.moves)
