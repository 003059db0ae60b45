"""A watched run's analysis view carried from one poll to the next.

:meth:`forensics.run.Run.view` sorts the whole frame (about 3 s for a 1M-step run) and
:meth:`~forensics.run.Run.metrics` counts every row of it; a poll that appended 1,000 steps
would pay both again. :class:`ViewCarry` keeps the last poll's frame, view and per-tag counts
and, when the new frame is the old one with rows appended that provably leave every old row
of the view in place, builds the new view by splicing the appended rows' own view after each
series' old rows, and the tag counts by adding theirs. The conditions (each checked, else the
view is built whole as :func:`~forensics.run.analysis_view` does):

* the new frame's first rows are the old frame, value for value, in the columns the view
  reads (:data:`~forensics.run.VIEW_COLUMNS`; floats compared bit for bit);
* every appended row is in the frame's latest segment (so it pre-empts nothing older and
  nothing pre-empts it);
* each appended row's series (source, tag) is a series of the old view, and its steps are
  all after that series' last old step (so no old row is replaced by a re-logged value and
  the old rows keep their places; a restart that steps back fails this).

Under these, the view of the grown frame is each series' old rows followed by the appended
rows' view of that series: the sort is by (metric, source, tag, step), stable, the last row
of a repeated step wins, and the appended steps sort after the old ones. ``tests/
test_watch_carry.py`` compares it with ``analysis_view`` on runs grown poll by poll.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.run import VIEW_COLUMNS, Run, view_and_index
from forensics.schema import PER_LAYER

_KEY = ["source", "tag"]
# Chunks per series the spliced view may hold before it is copied into one (each poll adds
# about two per series that grew; reading a series of many chunks copies it).
_MAX_CHUNKS = 16


@dataclass
class _State:
    frame: pl.DataFrame  # the frame's view columns, as last seen
    view: pl.DataFrame
    groups: pl.DataFrame  # per series in view order: source, tag, start, len, last step
    counts: pl.DataFrame  # per (metric, tag): rows in the view and the first row's layer
    segment: int | None  # the frame's latest segment
    # The view's series index (:func:`~forensics.run.view_and_index`), None when the view has
    # none (a tag on two layers, a null tag: the run reads its series the general way).
    index: pl.DataFrame | None = None


class ViewCarry:
    """The watcher's view of the run, grown with the run when that is exact.

    Attributes:
        spliced: polls whose view was built by splicing (the rest were built whole).
    """

    def __init__(self) -> None:
        self._state: _State | None = None
        self.spliced = 0
        self.whole = 0
        # This poll's appended rows as a view (empty: none), None when built whole.
        self.added: pl.DataFrame | None = None

    def prepare(self, run: Run) -> None:
        """Give ``run`` its analysis view and tag counts (spliced when exact, else whole)."""
        cols = run.frame.select(VIEW_COLUMNS)
        self.added = None
        got = self._splice(cols) if self._state is not None else None
        if got is None:
            self.whole += 1
            view, index = view_and_index(run.frame)
            state = _State(cols, view, _groups(view), _counts(view), _max_segment(cols), index)
        else:
            self.spliced += 1
            state, self.added = got
        self._state = state
        seed(run, state.view, _metrics(state.counts), state.index)

    def _splice(self, cols: pl.DataFrame) -> tuple[_State, pl.DataFrame] | None:
        old = self._state
        assert old is not None
        m = old.frame.height
        if cols.height < m or not _same_rows(cols.slice(0, m), old.frame):
            return None
        if cols.height == m:
            return old, old.view.clear()
        add = cols.slice(m)
        segment = _max_segment(cols)
        seg = add.get_column("segment")
        if segment != old.segment or seg.null_count() or not (seg == segment).all():
            return None
        new_view, new_index = view_and_index(add)
        if new_view.is_empty():
            return _State(cols, old.view, old.groups, old.counts, segment, old.index), new_view
        firsts = new_view.group_by(_KEY, maintain_order=True).agg(
            pl.col("step").first().alias("first"),
            pl.col("step").last().alias("last_new"),
            pl.len().alias("add"),
        )
        joined = firsts.join(old.groups, on=_KEY, how="left", maintain_order="left")
        if (
            joined.get_column("start").null_count()
            or not (joined.get_column("first") > joined.get_column("last")).all()
        ):
            return None  # a new series, or a step at or before a series' last step
        # Where each series' appended rows start in the appended view.
        add_lens = firsts.get_column("add").to_numpy().astype(np.int64)
        firsts = firsts.with_columns(
            pl.Series("add_start", np.concatenate([[0], np.cumsum(add_lens)[:-1]]))
        )
        groups = (
            old.groups.join(
                firsts.select(*_KEY, "add", "add_start", "last_new"),
                on=_KEY,
                how="left",
                maintain_order="left",
            )
            .with_columns(pl.col("add").fill_null(0), pl.col("add_start").fill_null(0))
            .with_columns(
                pl.col("last_new").fill_null(pl.col("last")).alias("last"),
                (pl.col("len") + pl.col("add")).alias("len"),
            )
        )
        # The spliced view: each series' old rows, then its appended rows, as zero-copy
        # slices of the two views (old series with nothing appended stay one slice).
        add_len = groups.get_column("add").to_numpy()
        add_start = groups.get_column("add_start").to_numpy()
        old_start = old.groups.get_column("start").to_numpy()
        old_len = old.groups.get_column("len").to_numpy()
        parts: list[pl.DataFrame] = []
        run_start = run_len = 0  # the old rows not yet taken
        for s, n, a0, a in zip(old_start, old_len, add_start, add_len, strict=True):
            if run_len and s != run_start + run_len:
                parts.append(old.view.slice(int(run_start), int(run_len)))
                run_len = 0
            if not run_len:
                run_start = s
            run_len += n
            if a:
                parts.append(old.view.slice(int(run_start), int(run_len)))
                parts.append(new_view.slice(int(a0), int(a)))
                run_len = 0
        if run_len:
            parts.append(old.view.slice(int(run_start), int(run_len)))
        view = pl.concat(parts, how="vertical", rechunk=False)
        if view.n_chunks() > _MAX_CHUNKS * (groups.height + 1):
            view = view.rechunk()  # poll after poll the slices would pile up
        lens = groups.get_column("len").to_numpy()
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        groups = groups.with_columns(pl.Series("start", starts)).select(old.groups.columns)
        counts = (
            pl.concat([old.counts, _counts(new_view)], how="vertical")
            .group_by("metric", "tag", maintain_order=True)
            .agg(pl.col("n").sum(), pl.col("layer").first())
        )
        index = _spliced_index(old.index, new_index, groups)
        return _State(cols, view, groups, counts, segment, index), new_view


def _spliced_index(
    old: pl.DataFrame | None, added: pl.DataFrame | None, groups: pl.DataFrame
) -> pl.DataFrame | None:
    """The spliced view's series index: the old one with each series' new start and length,
    when the old view had one and the appended rows keep every (source, tag) one series of
    one metric and layer (the metric and layer of its old rows); else None (no index, as
    :func:`~forensics.run.view_and_index` gives for such a frame)."""
    if old is None or added is None or old.height != groups.height:
        return None
    if not old.select(_KEY).equals(groups.select(_KEY)):
        return None  # not one index row per series of the view, in view order
    cols = ["metric", *_KEY, "layer"]
    same = added.select(cols).join(old.select(cols), on=cols, how="semi", nulls_equal=True)
    if same.height != added.height:
        return None  # an appended row of another metric or layer than its series' old rows
    return old.with_columns(
        groups.get_column("start").cast(pl.Int64), groups.get_column("len").cast(pl.Int64)
    )


def _same_rows(a: pl.DataFrame, b: pl.DataFrame) -> bool:
    """Equal frames, floats bit for bit (a NaN equals itself, -0.0 does not equal 0.0)."""
    for name in a.columns:
        x, y = a.get_column(name), b.get_column(name)
        if x.dtype != y.dtype or x.null_count() != y.null_count():
            return False
        if x.dtype.is_float():
            if x.null_count() and not (x.is_null() == y.is_null()).all():
                return False
            xa, ya = x.fill_null(0.0).to_numpy(), y.fill_null(0.0).to_numpy()
            if not np.array_equal(xa.view(np.uint64), ya.view(np.uint64)):
                return False
        elif not x.equals(y, null_equal=True):
            return False
    return True


def _max_segment(cols: pl.DataFrame) -> int | None:
    got = cols.get_column("segment").max()
    return None if got is None else int(got)  # type: ignore[arg-type]


def _groups(view: pl.DataFrame) -> pl.DataFrame:
    """The view's series in view order: where each starts, how many rows, its last step."""
    g = view.group_by(_KEY, maintain_order=True).agg(
        pl.len().alias("len"), pl.col("step").last().alias("last")
    )
    lens = g.get_column("len").to_numpy()
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    g = g.with_columns(pl.Series("start", starts), pl.col("len").cast(pl.Int64))
    return g.select(*_KEY, "start", "len", "last")


def _counts(view: pl.DataFrame) -> pl.DataFrame:
    return (
        view.lazy()
        .filter(pl.col("metric").is_not_null())
        .group_by("metric", "tag", maintain_order=True)
        .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("layer").first())
        .collect()
    )


def _metrics(counts: pl.DataFrame) -> dict[str, str]:
    """:meth:`Run.metrics` from the tag counts: the tag with the most rows (ties: the first
    tag by name), per-layer series as their number of tags."""
    out: dict[str, str] = {}
    ordered = counts.sort(["metric", "n", "tag"], descending=[False, True, False])
    for metric, grp in ordered.group_by("metric", maintain_order=True):
        m = metric[0]
        out[m] = f"{grp.height} layer tags" if m in PER_LAYER else grp.get_column("tag")[0]
    return out


def seed(
    run: Run, view: pl.DataFrame, metrics: dict[str, str], index: pl.DataFrame | None = None
) -> None:
    """Give the run the view, series index and tag table it would compute itself (its
    caches; without an index the run builds the general one from the view when asked)."""
    run._cached_for = id(run.frame)
    run._view, run._metrics, run._parts = view, metrics, None
    run._index, run._exact_index = index, index is not None


__all__ = ["ViewCarry", "seed"]
