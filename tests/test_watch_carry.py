"""The watcher's view carried between polls (forensics.watch.carry) is the run's own view.

A run is grown poll by poll (its frame cut at increasing steps, as the watcher sees it while
the writer appends); after each poll the spliced view and tag table must equal what
:func:`~forensics.run.analysis_view` and :meth:`~forensics.run.Run.metrics` compute from the
frame from scratch, row for row; appends that cannot be spliced (a restart, a new series, a
rewritten row) are built whole.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from forensics.config import Config
from forensics.importers import read_run
from forensics.pipeline import read_options
from forensics.run import Run, analysis_view
from forensics.schema import SCHEMA
from forensics.watch.carry import ViewCarry

# The rows in record order, as the watcher's tail reads them (a read for analysis hands a job's
# rows over tag after tag: cuts of it are no prefixes of each other to splice).
_AS_WRITTEN = replace(read_options(Config()), series_order=False)

ROOT = Path(__file__).resolve().parents[1]


def _cut(run: Run, last_step: int) -> Run:
    """The run as read when the writer had logged up to ``last_step`` (rows in file order)."""
    frame = run.frame.filter(pl.col("step").is_null() | (pl.col("step") <= last_step))
    return Run(run.name, run.path, run.format, frame, config=dict(run.config))


def _check(carry: ViewCarry, run: Run) -> None:
    carry.prepare(run)
    fresh = Run(run.name, run.path, run.format, run.frame)
    assert run.view().equals(analysis_view(run.frame), null_equal=True)
    assert run.metrics() == fresh.metrics()
    # The series index: the same rows, exact (one row per series and layer) exactly when
    # the run's own is; so every series is read the same way.
    assert run._series_index().equals(fresh._series_index(), null_equal=True)
    assert run._exact_index == fresh._exact_index
    for metric in fresh.metrics():
        for layer in [None, *fresh.layers(metric)]:
            assert run.series(metric, layer).equals(fresh.series(metric, layer), null_equal=True)


@pytest.mark.parametrize(
    ("name", "spliced"),
    # resumed: cut by step, its second job's rows interleave with the first's (no append);
    # histogram_layers: rows of two kinds of record in one file, cut by step the same.
    [("periodic_spikes", 6), ("bad_batch", 6), ("nan", 6), ("healthy", 6), ("resumed", 0)]
    + [("histogram_layers", 0)],
)
def test_sample_runs_grown_poll_by_poll(name: str, spliced: int) -> None:
    run = read_run(ROOT / "sample_runs" / name, options=_AS_WRITTEN)
    steps = run.frame.get_column("step").drop_nulls()
    lo, hi = int(steps.min()), int(steps.max())
    carry = ViewCarry()
    for cut in sorted({int(x) for x in np.linspace(lo + (hi - lo) // 4, hi, 7)}):
        # A grown frame: the rows up to the cut, in the frame's own order (rows appended).
        _check(carry, _cut(run, cut))
    assert carry.spliced >= spliced, (carry.spliced, carry.whole)


def _frames() -> tuple[Run, pl.DataFrame, pl.DataFrame]:
    run = read_run(ROOT / "sample_runs" / "periodic_spikes", options=_AS_WRITTEN)
    steps = run.frame.get_column("step")
    cut = int(steps.max()) - 40  # type: ignore[operator]
    old = run.frame.filter(steps <= cut)
    return run, old, run.frame.filter(steps > cut)


def _poll(carry: ViewCarry, run: Run, frame: pl.DataFrame) -> bool:
    """One poll on ``frame``; True when the view was spliced."""
    before = carry.spliced
    _check(carry, Run(run.name, run.path, run.format, frame))
    return carry.spliced > before


def test_an_append_is_spliced() -> None:
    run, old, add = _frames()
    carry = ViewCarry()
    assert not _poll(carry, run, old)
    assert _poll(carry, run, pl.concat([old, add]))
    assert _poll(carry, run, pl.concat([old, add]))  # nothing new: the same view


def _changed_value(frame: pl.DataFrame, i: int, value: float) -> pl.DataFrame:
    v = frame.get_column("value").to_numpy().copy()
    v[i] = value
    return frame.with_columns(pl.Series("value", v))


@pytest.mark.parametrize("how", ["value", "negative zero", "nan"])
def test_a_rewritten_old_row_is_caught(how: str) -> None:
    """The mutation check: an old row that changed (a rewritten file) is never reused, even
    when it differs only in its bits (0.0 against -0.0) or becomes NaN."""
    run, old, add = _frames()
    i = old.height // 2
    x = float(old.get_column("value")[i])
    if how == "negative zero":
        old = _changed_value(old, i, 0.0)
        changed = -0.0
    else:
        changed = float("nan") if how == "nan" else x * 1.5
    carry = ViewCarry()
    _poll(carry, run, old)
    assert not _poll(carry, run, pl.concat([_changed_value(old, i, changed), add]))


def test_appends_that_move_old_rows_are_built_whole() -> None:
    run, old, add = _frames()
    tag = add.get_column("tag")[0]
    # A step logged again (its later value wins over the old row).
    again = old.filter(pl.col("tag") == tag).tail(1).with_columns(pl.col("value") * 2)
    # A new series.
    new_tag = add.head(1).with_columns(pl.lit("brand/new").cast(add.schema["tag"]).alias("tag"))
    # A restart: the appended rows in a new segment, stepping back.
    restart = add.with_columns(pl.col("segment") + 1, pl.col("step") - 100)
    for extra in (again, new_tag, restart):
        carry = ViewCarry()
        _poll(carry, run, old)
        assert not _poll(carry, run, pl.concat([old, extra, add]))
        # ... and the next plain append after it is spliced again, from the whole view.
        latest = pl.col("segment").max()
        more = add.with_columns(
            pl.col("step") + 10_000,
            pl.lit(extra.select(latest).item(), SCHEMA["segment"]).alias("segment"),
        )
        assert _poll(carry, run, pl.concat([old, extra, add, more]))


def test_an_appended_row_on_another_layer_drops_the_index() -> None:
    """The mutation check of the carried series index: appended rows that put a tag on a
    second layer leave the view spliced but the index general, as the run's own."""
    run, old, add = _frames()
    carry = ViewCarry()
    _poll(carry, run, old)
    assert carry._state is not None and carry._state.index is not None
    tag = add.get_column("tag")[0]
    moved = add.with_columns(
        pl.when(pl.col("tag") == tag)
        .then(pl.lit(7, SCHEMA["layer"]))
        .otherwise(pl.col("layer"))
        .alias("layer")
    )
    assert _poll(carry, run, pl.concat([old, moved]))
    assert carry._state.index is None


@pytest.mark.parametrize("max_chunks", [0, 16])
def test_the_spliced_view_is_slices_until_copied_whole(
    max_chunks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spliced view is zero-copy slices of the old and appended views; past
    ``_MAX_CHUNKS`` per series it is copied into one chunk: the same rows either way."""
    from forensics.watch import carry as carry_module

    monkeypatch.setattr(carry_module, "_MAX_CHUNKS", max_chunks)
    run, old, add = _frames()
    carry = ViewCarry()
    _poll(carry, run, old)
    assert _poll(carry, run, pl.concat([old, add]))
    assert carry._state is not None
    assert (carry._state.view.n_chunks() == 1) == (max_chunks == 0)
