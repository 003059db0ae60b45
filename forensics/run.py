"""A run: everything one training job logged, as one long canonical frame plus provenance."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from forensics.allocator import trim
from forensics.findings import Finding
from forensics.schema import (
    ACT_ABSMAX,
    GRAD_NORM_LAYER,
    PARAM_NORM_LAYER,
    PER_LAYER,
    SCHEMA,
    empty_frame,
)


@dataclass
class Run:
    """One training job.

    Attributes:
        name: folder name (or file stem) of what the user pointed at.
        path: absolute path.
        format: importer name(s) that produced the rows, e.g. ``"tfevents"``.
        frame: the long canonical frame (see :mod:`forensics.schema`), every row kept,
            restarts included (``segment`` counts them); in the order read until the analysis
            view is built, then in view order (see :meth:`view`).
        notes: data-quality notes for the report (skipped lines, alternative sources,
            checks that could not run).
        import_findings: run-level findings the importers saw (restart, truncated_log, crash).
        config: the run's hyper-parameters when the log carries them.
        metadata: anything else worth showing (host, start time, framework version).
    """

    name: str
    path: Path
    format: str
    frame: pl.DataFrame = field(default_factory=empty_frame)
    notes: list[str] = field(default_factory=list)
    import_findings: list[Finding] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    _view: pl.DataFrame | None = field(default=None, repr=False)
    # One row per series of the view (metric, source, tag, layer, start, len), in view order.
    _index: pl.DataFrame | None = field(default=None, repr=False)
    _metrics: dict[str, str] | None = field(default=None, repr=False)
    _parts: dict[str, tuple[int, int]] | None = field(default=None, repr=False)
    _exact_index: bool = field(default=False, repr=False)  # one index row per series and layer
    # id() of the frame the caches describe
    _span: tuple[int, tuple[int, int]] | None = field(default=None, repr=False)
    _last: tuple[int, int] | None = field(default=None, repr=False)  # (frame id, last step)
    _cached_for: int | None = field(default=None, repr=False)
    _unit: tuple[int, str] | None = field(default=None, repr=False)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def unit(self, metric: str) -> str | None:
        """The unit of the tag read for ``metric`` as its name states it (``mem_gb`` -> GB),
        from ``metadata["units"]``; None when the name states none."""
        tag = self.metrics().get(metric)
        return self.metadata.get("units", {}).get(tag) if tag is not None else None

    # -- the analysis view -------------------------------------------------------------
    def view(self) -> pl.DataFrame:
        """Rows the analysis uses: per series, a later segment pre-empts earlier rows.

        TensorBoard's data-server rule: a record at step s pre-empts earlier records at
        steps >= s. Within a segment the last row for a step wins (a re-logged value).
        Sorted by (metric, source, tag, step); columns :data:`VIEW_COLUMNS`.

        The view is a zero-copy part of the frame: building it puts :attr:`frame`'s rows in
        view order (the view's rows first, each series' re-logged rows before the value that
        wins, then the rows the view leaves out in record order), so that the run never holds
        its rows twice. The frame keeps every row; ``file`` and ``record_idx`` still say where
        each was read. (Rows are moved by series first, then by step where a series' steps go
        back: a second move interrupted, out of memory, leaves them in series order.)
        """
        if self._cached_for != id(self.frame):  # the frame was replaced: drop the caches
            self._view, self._index, self._metrics, self._parts = None, None, None, None
            self._cached_for = id(self.frame)
        if self._view is None:
            plan = view_plan(self.frame, deferred=True)
            trim()  # the plan's temporaries given back before the rows are moved
            if plan.order is not None:
                self._reorder(plan)  # takes the plan's order (freed once the rows are moved)
                self._cached_for = id(self.frame)
            elif plan.moves is not None:
                self.frame = _slices(self.frame, plan.moves)
                self._cached_for = id(self.frame)
            if plan.pending is not None:  # the rest read from the rows in series order
                settled = _settle(self.frame, plan)
                if settled is None:  # steps that go back, a tag on two layers: the plain plan
                    settled = view_plan(self.frame)  # (the same as on the frame in record order)
                    trim()
                    if settled.order is not None:
                        self._reorder(settled)
                        self._cached_for = id(self.frame)
                plan = settled
            self._view, self._index = plan.view_of(self.frame.select(VIEW_COLUMNS)), plan.index
            self._exact_index = self._index is not None
            if plan.keep is not None:
                self._note_relogged(plan.keep)
            trim()
        return self._view

    def _note_relogged(self, keep: np.ndarray) -> None:
        """A note for the values the view leaves out because a later row logged the same step
        of the same series again with another value (two ranks writing one log, a step logged
        twice): the last value is used, as TensorBoard does, and the reader is told. The rows
        are in view order (a repeated step's rows next to each other, the kept one last), so
        each left-out row is compared with the row after it; equal values are no loss."""
        dropped = np.flatnonzero(~keep)
        if not len(dropped):
            return
        rows = self.frame.select("tag", "step", "value")
        here = rows[dropped]
        after = rows.get_column("value")[dropped + 1].to_numpy()
        v = here.get_column("value").to_numpy()
        differ = ~((v == after) | (np.isnan(v) & np.isnan(after)))
        if not differ.any():
            return
        lost = here.filter(pl.Series(differ))
        by_tag = lost.group_by("tag", maintain_order=True).agg(
            pl.len().alias("n"), pl.col("step").first().alias("first")
        )
        shown = "; ".join(
            f"{tag}: {n:,} (first at step {first:,})" for tag, n, first in by_tag.rows()[:5]
        ) + ("; ..." if by_tag.height > 5 else "")
        self.note(
            f"{lost.height:,} value(s) were logged again at a step their series had already "
            f"logged, with another value ({shown}): the last value logged for each step is "
            "used, as TensorBoard does; two ranks writing one log do this"
        )

    def _reorder(self, plan: ViewPlan) -> None:
        """The frame's rows put at the plan's order, one column at a time: each column is
        freed once its reordered copy is made (when nothing else holds the frame), so the rows
        are never held twice. A frame written series by series is put in order by zero-copy
        slices. The order is taken from the plan (``plan.order`` None after). Interrupted, the
        moved columns are put back: the frame is as it was."""
        order, plan.order = plan.order, None
        assert order is not None
        if _few_runs(order):
            self.frame = _take(self.frame, order)
            return
        trim()  # (the run check's temporaries given back before the first gather)
        frame, self.frame = self.frame, self.frame.clear()  # the run's reference dropped
        columns = frame.columns
        # The widest columns first: each later (narrower) one then fits in the pages freed
        # from an earlier column instead of new ones (the reorder peaked at about two wide
        # columns over the frame instead of one). A column of one value is already in every
        # order: kept as it is. Plain numbers are scattered by numpy, the others gathered by
        # polars.
        scattered: list[str] = []
        gathered: list[str] = []
        for name in sorted(columns, key=lambda c: -_width(frame.schema[c])):
            if not _one_value(frame, name):
                (scattered if _scatters(frame, name) else gathered).append(name)
        # Where each row goes (the order's inverse) while columns are scattered, then the
        # order again for the gathers: one of the two held at a time.
        perm: np.ndarray | None = order
        dest: np.ndarray | None = None
        if scattered:
            dest = _inverse(order)
            perm = None
        del order
        trim()  # (glibc keeps a freed order resident)
        moved: list[pl.DataFrame] = []
        try:
            for name in scattered:
                assert dest is not None
                moved.append(_scatter(frame.get_column(name), dest).to_frame())
                frame = frame.drop(name)  # the old column freed
                trim()
            if dest is not None:
                perm, dest = _inverse(dest), None
                trim()
            assert perm is not None
            # The gather's index is the order's own array (no copy of 4-8 bytes a row).
            idx = pl.Series(perm.astype(_index_dtype(len(perm)), copy=False))
            for name in gathered:
                # A one-column frame indexed by the order: the gather reads the index as it is
                # (an expression's gather copies it: 4 bytes a row more at the peak).
                moved.append(frame.select(name)[idx])
                frame = frame.drop(name)  # the old column freed
                trim()
        except BaseException:  # interrupted (out of memory): the columns put back in order
            back = dest if dest is not None else _inverse(perm)  # type: ignore[arg-type]
            undo = pl.Series(back.astype(np.int64))
            restored = [d.select(pl.all().gather(undo)) for d in moved]
            got = {d.columns[0] for d in moved}  # (a column moved but not yet dropped)
            rest = frame.select([c for c in frame.columns if c not in got])
            self.frame = pl.concat([*restored, rest], how="horizontal").select(columns)
            raise
        self.frame = pl.concat([*moved, frame], how="horizontal").select(columns)

    def _series_index(self) -> pl.DataFrame:
        v = self.view()
        if self._index is None:
            # The general view (a tag on two layers, a null tag): runs of (metric, source, tag)
            # are still contiguous; their layers are not told apart (``layer`` null).
            self._index = (
                v.select("metric", "source", "tag")
                .with_row_index("start")
                .group_by("metric", "source", "tag", maintain_order=True)
                .agg(pl.col("start").min(), pl.len().alias("len"))
                .select(
                    "metric",
                    "source",
                    "tag",
                    pl.lit(None, dtype=SCHEMA["layer"]).alias("layer"),
                    pl.col("start").cast(pl.Int64),
                    pl.col("len").cast(pl.Int64),
                )
            )
            self._exact_index = False
        return self._index

    def series(self, metric: str, layer: int | None = None) -> pl.DataFrame:
        """One canonical series: columns ``step, value, wall_time`` sorted by step.

        When several raw tags map to the same canonical metric, the tag with the most
        points is used (see :meth:`metrics`). For one layer logged as several parameter
        tensors, the values at a step are combined: L2 for grad/param norms (the layer's
        norm), max for activation absmax, mean for activation mean and std.
        """
        one = self._one_series(metric, layer)
        if one is not None:
            # The rows of one series in the view are already one per step, sorted by step.
            start, n = one
            return self.view().slice(start, n).select("step", "value", "wall_time")
        sub = self._metric_rows(metric)
        if layer is not None:
            sub = sub.filter(pl.col("layer") == layer)
        if sub.is_empty():
            return pl.DataFrame(
                schema={"step": pl.Int64, "value": pl.Float64, "wall_time": pl.Float64}
            )
        if layer is None and metric not in PER_LAYER:
            tag = self.metrics().get(metric)
            sub = sub.filter(pl.col("tag") == tag)
        if layer is not None and sub.get_column("tag").n_unique() > 1:
            agg = _LAYER_COMBINE.get(metric, pl.col("value").mean())
            return (
                sub.group_by("step").agg(agg.alias("value"), pl.col("wall_time").max()).sort("step")
            )
        return (
            sub.group_by("step", maintain_order=True)
            .agg(pl.col("value").last(), pl.col("wall_time").last())
            .sort("step")
        )

    def one_series(self, metric: str, layer: int | None = None) -> pl.DataFrame | None:
        """:meth:`series` when it reads exactly one (source, tag) series of the view: a
        zero-copy slice (its arrays are the frame's own); None when series combines rows."""
        one = self._one_series(metric, layer)
        if one is None:
            return None
        return self.view().slice(*one).select("step", "value", "wall_time")

    def _one_series(self, metric: str, layer: int | None) -> tuple[int, int] | None:
        """(start, len) in the view when :meth:`series` reads exactly one (source, tag)
        series, else None (the general way combines several)."""
        idx = self._series_index().filter(pl.col("metric") == metric)
        if not self._exact_index:
            return None
        if layer is not None:
            idx = idx.filter(pl.col("layer") == layer)
        elif metric not in PER_LAYER:
            tag = self.metrics().get(metric)
            if tag is None:
                return None
            idx = idx.filter(pl.col("tag") == tag)
        else:
            return None
        if idx.height != 1:
            return None
        start, n = idx.row(0)[-2:]
        return int(start), int(n)

    def metric_rows(self, metric: str) -> pl.DataFrame:
        """The analysis view's rows of one canonical metric (every tag and layer): a zero-copy
        slice of :meth:`view`, the same rows as ``view().filter(metric == ...)`` without
        scanning or copying the whole view."""
        return self._metric_rows(metric)

    def _metric_rows(self, metric: str) -> pl.DataFrame:
        v = self.view()
        if self._parts is None:
            # The view is sorted by metric first: each metric's rows are one zero-copy slice.
            idx = self._series_index().filter(pl.col("metric").is_not_null())
            spans = idx.group_by("metric", maintain_order=True).agg(
                pl.col("start").min(), pl.col("len").sum()
            )
            self._parts = {m: (int(a), int(n)) for m, a, n in spans.iter_rows()}
        span = self._parts.get(metric)
        return v.slice(*span) if span is not None else v.clear()

    def has(self, metric: str) -> bool:
        return metric in self._metric_tags()  # asked thousands of times: no copy

    def sources(self) -> set[str]:
        """The source names on the run's rows (``llmc_text``, ``tfevents``...)."""
        if "source" not in self.frame.columns or not self.frame.height:
            return set()
        return set(self.frame.get_column("source").unique().drop_nulls().cast(pl.Utf8).to_list())

    def metrics(self) -> dict[str, str]:
        """Canonical vital sign -> the raw tag it is read from (most points wins).

        Per-layer series are summarised as ``"<n> layer tags"``.
        """
        return dict(self._metric_tags())

    def _metric_tags(self) -> dict[str, str]:
        """:meth:`metrics`, the run's own cached dict (callers must not change it)."""
        idx = self._series_index()
        if self._metrics is not None:
            return self._metrics
        out: dict[str, str] = {}
        self._metrics = out
        counts = (
            idx.filter(pl.col("metric").is_not_null())
            .group_by("metric", "tag")
            .agg(pl.col("len").sum().alias("n"))
            .sort(["metric", "n", "tag"], descending=[False, True, False])
        )
        if counts.is_empty():
            return out
        for metric, grp in counts.group_by("metric", maintain_order=True):
            m = metric[0]
            if m in PER_LAYER:
                out[m] = f"{grp.height} layer tags"
            else:
                out[m] = grp.get_column("tag")[0]
        return out

    def layers(self, metric: str) -> list[int]:
        idx = self._series_index().filter(pl.col("metric") == metric)
        if not self._exact_index:
            idx = self._metric_rows(metric)
        return sorted(idx.get_column("layer").drop_nulls().unique().to_list())

    @property
    def first_step(self) -> int:
        return self._step_span()[0]

    @property
    def last_step(self) -> int:
        """The view's last step: a job resumed from an earlier checkpoint that has not yet got
        back to where the earlier attempt stopped is at its own last step, not the earlier
        attempt's (whose later rows give way). Without a second segment, the frame's."""
        key = id(self.frame)
        if self._last is None or self._last[0] != key:
            hi = self._step_span()[1]
            if self._resumed():
                top = self.view().get_column("step").max()  # (may put the rows in order)
                hi = hi if top is None else int(top)  # type: ignore[arg-type]
            self._last = (id(self.frame), hi)
        return self._last[1]

    @property
    def x_unit(self) -> str:
        """``epoch`` when the training loss is logged once an epoch against the epoch's index
        (Keras' ``epoch_*`` tags, a Lightning CSV without a step column: x kind ``epoch``,
        consecutive steps), ``point`` when the log prints no step and its points are numbered
        in order (x kind ``points``), else ``step``: what the log's "steps" count, for the
        reader."""
        key = id(self.frame)
        if self._unit is None or self._unit[0] != key:
            rows = self.frame.filter(pl.col("metric") == "loss").select("x_kind", "step")
            unit = "step"
            if rows.height and (rows.get_column("x_kind") == "epoch").all():
                steps = rows.get_column("step").unique().sort()
                if steps.len() < 2 or (steps.diff().drop_nulls() == 1).all():
                    unit = "epoch"
            elif (
                (rows if rows.height else self.frame)
                .select(pl.len().gt(0) & (pl.col("x_kind") == "points").all())
                .item()
            ):
                # (a log that prints no step: its points numbered in order, HF's stdout
                # without progress bars, a W&B chart export without a step column)
                unit = "point"
            self._unit = (key, unit)
        return self._unit[1]

    def _step_span(self) -> tuple[int, int]:
        # Cached per frame object: read in loops (one rollback plan per incident).
        key = id(self.frame)
        if self._span is None or self._span[0] != key:
            s = self.frame.get_column("step")  # min and max skip nulls (no copy without them)
            lo, hi = s.min(), s.max()
            # (the first step is the view's too: each series keeps its lowest step)
            self._span = (key, (0, 0) if lo is None else (int(lo), int(hi)))  # type: ignore[arg-type]
        return self._span[1]

    def _resumed(self) -> bool:
        """Whether the log has a second segment (a restart the view resolves)."""
        if "segment" not in self.frame.columns:
            return False
        top = self.frame.get_column("segment").max()
        return top is not None and int(top) > 0  # type: ignore[arg-type]

    def to_arrow(self) -> Any:
        """The frame as a pyarrow Table (see :mod:`forensics.notebook`)."""
        from forensics.notebook import to_arrow

        return to_arrow(self)

    def to_pandas(self) -> Any:
        """The frame as pandas through Arrow (see :mod:`forensics.notebook`)."""
        from forensics.notebook import to_pandas

        return to_pandas(self)

    def unmapped_tags(self) -> list[str]:
        v = self.frame.filter(pl.col("metric").is_null())
        return sorted(v.get_column("tag").unique().to_list())


_LAYER_COMBINE = {
    GRAD_NORM_LAYER: (pl.col("value") ** 2).sum().sqrt(),
    PARAM_NORM_LAYER: (pl.col("value") ** 2).sum().sqrt(),
    ACT_ABSMAX: pl.col("value").max(),
}


# Columns of the analysis view (the frame keeps every canonical column).
VIEW_COLUMNS = ["source", "tag", "metric", "layer", "step", "value", "wall_time", "segment"]


INDEX_SCHEMA: dict[str, pl.DataType] = {
    "metric": SCHEMA["metric"],
    "source": SCHEMA["source"],
    "tag": SCHEMA["tag"],
    "layer": SCHEMA["layer"],
    "start": pl.Int64(),
    "len": pl.Int64(),
}


def analysis_view(frame: pl.DataFrame) -> pl.DataFrame:
    """Keep, per series, only rows not pre-empted by a later segment (RustBoard semantics).

    Then one value per (series, step): the last one logged. Sorted by (metric, source, tag,
    step), rows without a canonical metric first.
    """
    return view_and_index(frame)[0]


def view_and_index(frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """The analysis view (:func:`analysis_view`) and its series index: one row per (source,
    tag) series with its ``metric``, ``layer`` and the ``start`` and ``len`` of its rows
    (None for a frame where a tag is not one series of one layer). ``frame`` is left as it is
    (the view's rows gathered from it); :meth:`Run.view` reorders the run's frame instead."""
    plan = view_plan(frame)
    cols = frame.select(VIEW_COLUMNS)
    if plan.order is None:
        return plan.view_of(cols), plan.index
    rows = plan.order[: plan.usable]
    if plan.keep is not None:
        rows = rows[plan.keep]
    return _take(cols, rows), plan.index


@dataclass
class ViewPlan:
    """Where the analysis view's rows are in a frame.

    Attributes:
        order: every row of the frame, in the order that puts the view's rows first (sorted
            by series and step, a repeated step's rows in record order), then the rows the
            view leaves out (null steps, rows a later segment pre-empts) in record order;
            None when the frame is in that order already.
        usable: how many rows of that order are candidates (sorted; the rest are left out).
        keep: which candidates are view rows (the last of a repeated step); None: all.
        index: the view's series index (see :func:`view_and_index`).
        pending: for a deferred plan (see :func:`view_plan`), its series (as the index, without
            ``start`` and ``len``) and the candidate rows of each; ``keep`` and ``index`` are
            then left to :func:`_settle`.
    """

    order: np.ndarray | None
    usable: int
    keep: np.ndarray | None
    index: pl.DataFrame | None
    pending: tuple[pl.DataFrame, np.ndarray] | None = None
    # Instead of ``order``, for a frame of a few long runs: the (start, end) row ranges whose
    # concatenation is that order (see :func:`_run_moves`).
    moves: list[tuple[int, int]] | None = None

    def view_of(self, ordered: pl.DataFrame) -> pl.DataFrame:
        """The view from the frame's view columns already in :attr:`order` (zero-copy unless
        a repeated step's earlier rows are dropped)."""
        if self.keep is not None:
            return _take(ordered, np.flatnonzero(self.keep))
        return ordered if self.usable == ordered.height else ordered.slice(0, self.usable)


def view_plan(frame: pl.DataFrame, deferred: bool = False) -> ViewPlan:
    """The order of ``frame``'s rows that makes its analysis view a prefix (see
    :class:`ViewPlan`). Only keys are copied, never the frame (the view columns of the usable
    rows when a null step or a restart leaves some out).

    ``deferred``: where the rows are numbered by series, the order is their stable sort by
    series alone, and what reads each row in that order (a series of one metric and layer,
    steps that grow, re-logged steps) is left to :func:`_settle`, once the frame is in that
    order: contiguous reads instead of gathers."""
    f = frame.select(VIEW_COLUMNS)  # only what the analysis reads; no copy
    n_all = f.height
    usable = None  # positions of the rows the view may use, None: every row
    if f.get_column("step").null_count():
        usable = np.flatnonzero(f.get_column("step").is_not_null().to_numpy())
    fu = f if usable is None else _take(f, usable)
    if fu.is_empty():
        empty = pl.DataFrame(schema=INDEX_SCHEMA)
        return ViewPlan(None if usable is None else _order(None, usable, n_all), 0, None, empty)
    # Expressions, not the Series: a constant segment column stays one value (a Series of it
    # is made per row, and kept by the frame).
    seg = pl.col("segment")
    lo, hi, seg_nulls = fu.select(
        seg.min(), seg.max().alias("hi"), seg.null_count().alias("n")
    ).row(0)
    if seg_nulls or lo != hi:
        later = _not_preempted(fu)
        if not later.all():
            usable = np.flatnonzero(later) if usable is None else usable[later]
            fu = _take(f, usable)
        del later
    ranked = _ranked_series(fu, check=not deferred)
    trim()  # (the temporaries of each step given back: see forensics.allocator)
    if ranked is None:
        # A tag with two layers, a null tag: the general way.
        general, keep = _sorted_order(fu)
        del fu
        return ViewPlan(
            _order(general, usable, n_all), len(general), None if keep.all() else keep, None
        )
    # Series in view order; each row's rank among them; then a stable sort of the rows by
    # rank (a radix sort of small integers) is the view's order whenever every series'
    # steps already grow in record order (else by rank and step).
    pairs, rank = ranked
    n_series = pairs.height
    pos = np.uint32 if n_all < 1 << 32 else np.int64
    n_use = len(rank)
    runs = _rank_runs(rank)
    totals = _counts(rank, n_series, runs)
    perm: np.ndarray | None = None  # None: the rows are in that order already
    if runs is None or (np.diff(rank[runs].astype(np.int64)) < 0).any():
        if deferred and usable is None and runs is not None and n_use >= 4096 * len(runs):
            # A log read series after series, its series not in view order: the rows are put
            # in order by zero-copy slices of the runs, with no order array of every row
            # (whose new pages alone took 0.12 s of a 1M-step JSONL run's view).
            moves = _run_moves(rank, runs, n_use)
            del rank, fu
            return ViewPlan(None, n_use, None, None, (pairs, totals), moves)
        # (a log read series after series is in order: no whole-length order array made,
        # whose new pages alone cost more than the rest of the plan)
        perm = _stable_order(rank, n_series, pos, totals, runs)
    trim()
    if deferred:
        del rank, fu
        return ViewPlan(_order(perm, usable, n_all), n_use, None, None, (pairs, totals))
    steps = fu.get_column("step").to_numpy()
    keep, counts, in_order = _last_of_key(perm, steps, totals)
    trim()
    if not in_order:
        perm = np.lexsort((steps, rank)).astype(pos)  # stable: equal keys keep record order
        keep, counts, _ = _last_of_key(perm, steps, totals)
    del rank, steps, fu
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    index = pairs.with_columns(
        pl.Series("start", starts, dtype=pl.Int64), pl.Series("len", counts, dtype=pl.Int64)
    ).filter(pl.col("len") > 0)
    return ViewPlan(
        _order(perm, usable, n_all),
        n_use,
        None if keep.all() else keep,
        index.select(list(INDEX_SCHEMA)),
    )


def _settle(frame: pl.DataFrame, plan: ViewPlan) -> ViewPlan | None:
    """A deferred plan finished on ``frame`` already in its order (each series' candidate
    rows contiguous, in record order); None when a series holds two metrics or layers or its
    steps go back (the plain plan then orders the rows further)."""
    assert plan.pending is not None
    pairs, totals = plan.pending
    n = plan.usable
    f = frame.slice(0, n)
    firsts = np.cumsum(totals)[:-1]  # where each series after the first begins
    for name in ("metric", "layer"):
        if n < 2 or _one_value(f, name):
            continue
        col = f.get_column(name)
        changed = col.slice(1).ne_missing(col.slice(0, n - 1)).arg_true().to_numpy()
        if not np.isin(changed + 1, firsts).all():
            return None
    # (the step column read a block at a time: after a zero-copy reorder it is one chunk per
    # series, and to_numpy() of the whole would copy it, 8 bytes a row at the analysis' peak)
    keep, counts, in_order = _last_of_key(None, f.get_column("step"), totals)
    if not in_order:
        return None
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    index = pairs.with_columns(
        pl.Series("start", starts, dtype=pl.Int64), pl.Series("len", counts, dtype=pl.Int64)
    ).filter(pl.col("len") > 0)
    return ViewPlan(None, n, None if keep.all() else keep, index.select(list(INDEX_SCHEMA)))


def _index_dtype(n: int) -> type:
    return np.uint32 if n < 1 << 32 else np.uint64


def _inverse(perm: np.ndarray) -> np.ndarray:
    """The inverse permutation (where each position of ``perm`` comes from -> goes to), in
    blocks: a whole-length index or ``arange`` would add 8 bytes a row."""
    out: np.ndarray = np.empty(len(perm), dtype=perm.dtype)
    for a in range(0, len(perm), _INDEX_BLOCK):
        p = perm[a : a + _INDEX_BLOCK].astype(np.intp)  # (see _scatter)
        out[p] = np.arange(a, a + len(p), dtype=perm.dtype)
    return out


def _scatters(frame: pl.DataFrame, name: str) -> bool:
    """Is column ``name`` plain numbers numpy moves without a copy (integers or floats, no
    null, one chunk)? Only when it surely holds two values: polars keeps a constant column
    as one value, which numpy would make a whole column of."""
    dtype = frame.schema[name]
    if not (dtype.is_integer() or dtype.is_float()):
        return False
    col = pl.col(name)
    first, last, nulls = frame.select(
        col.first(), col.last().alias("b"), col.null_count().alias("n")
    ).row(0)
    if nulls or not (first != last and first == first and last == last):  # (NaN: not surely two)
        return False
    return frame.get_column(name).n_chunks() == 1


def _scatter(col: pl.Series, dest: np.ndarray) -> pl.Series:
    """``col`` with row ``i`` moved to position ``dest[i]``: numpy writes the rows where they
    go in blocks (reading the column in order, which on an interleaved frame is several
    times faster than gathering from everywhere), into an array the new Series takes
    without a copy."""
    src = col.to_numpy()  # (no copy: checked by _scatters)
    out = np.empty_like(src)
    for a in range(0, len(src), _INDEX_BLOCK):
        # Each block's positions as numpy's own index type: an index of another width is
        # converted element by element inside the assignment, about twice as slow.
        b = a + _INDEX_BLOCK
        out[dest[a:b].astype(np.intp)] = src[a:b]
    return pl.Series(col.name, out)


def _one_value(frame: pl.DataFrame, name: str) -> bool:
    """Does every row of column ``name`` hold the same value (all null, or one value and no
    null)? Asked only of columns stored as integers (integers, categoricals, enums: equal
    codes are equal values); a float column's min and max would not see a NaN or a zero's
    sign."""
    if frame.height == 0 or not _physical(frame.schema[name]).is_integer():
        return False
    code = pl.col(name).to_physical()
    first, last = frame.select(code.first().alias("a"), code.last().alias("b")).row(0)
    if first != last:  # (two values, or a value and a null: no pass over the column)
        return False
    got = frame.select(code.null_count().alias("n"), code.min().alias("lo"), code.max().alias("hi"))
    nulls, lo, hi = got.row(0)
    return bool(nulls == frame.height or (nulls == 0 and lo == hi))


def _physical(dtype: pl.DataType) -> pl.DataType:
    return pl.Series(dtype=dtype).to_physical().dtype


def _width(dtype: pl.DataType) -> int:
    """Bytes a row of a column of ``dtype`` takes: its physical type's (a categorical's
    codes take 4, an Enum of few categories 1)."""
    return _WIDTHS.get(type(_physical(dtype)), 8)


_WIDTHS: dict[type, int] = {
    pl.Int8: 1, pl.UInt8: 1, pl.Boolean: 1, pl.Int16: 2, pl.UInt16: 2,
    pl.Int32: 4, pl.UInt32: 4, pl.Float32: 4,
}  # fmt: skip


def _order(perm: np.ndarray | None, usable: np.ndarray | None, n_all: int) -> np.ndarray | None:
    """Frame positions: the usable rows in ``perm`` order (positions among the usable rows;
    None: in order), then the unusable ones in record order; None when that is every row in
    record order."""
    if usable is None:
        if perm is None or _is_identity(perm):
            return None
        return perm
    pos = np.uint32 if n_all < 1 << 32 else np.int64
    rest = np.ones(n_all, dtype=bool)
    rest[usable] = False
    first = usable if perm is None else usable[perm]
    order = np.concatenate((first.astype(pos, copy=False), np.flatnonzero(rest).astype(pos)))
    return None if _is_identity(order) else order


def _is_identity(perm: np.ndarray) -> bool:
    n = len(perm)
    if n == 0 or perm[0] != 0 or perm[-1] != n - 1:
        return False
    for a in range(0, n, _BLOCK):  # in blocks: no whole-length temporaries
        p = perm[a : a + _BLOCK + 1]
        if not (np.diff(p) == 1).all():
            return False
    return True


_BLOCK = 1 << 20  # rows of keys gathered at a time
_INDEX_BLOCK = 1 << 17  # rows moved at a time by an index converted to np.intp (1 MiB)


def _counts(rank: np.ndarray, n_series: int, runs: np.ndarray | None = None) -> np.ndarray:
    """``np.bincount(rank, minlength=n_series)`` in blocks: bincount reads its input as
    int64, a whole-length copy of 8 bytes a row for the narrow ranks. ``runs``: where the
    runs of equal ranks start (:func:`_rank_runs`), when known: their lengths summed."""
    counts = np.zeros(n_series, dtype=np.int64)
    if runs is not None:
        np.add.at(counts, rank[runs], np.diff(np.append(runs, len(rank))))
        return counts
    for a in range(0, len(rank), _BLOCK):
        counts += np.bincount(rank[a : a + _BLOCK], minlength=n_series)
    return counts


def _stable_order(
    rank: np.ndarray,
    n_series: int,
    dtype: type,
    counts: np.ndarray | None = None,
    runs: np.ndarray | None = None,
) -> np.ndarray:
    """``np.argsort(rank, kind="stable")`` as ``dtype``, in blocks: each block's rows are
    sorted by rank and put after the earlier blocks' rows of the same rank, so the only
    whole-length array is the result (argsort's own int64 result and buffers would add
    about 16 bytes a row at the peak). ``counts``: the rows of each rank, when known;
    ``runs``: :func:`_rank_runs` of ``rank`` where it found few runs (the caller looks once)."""
    n = len(rank)
    out: np.ndarray = np.empty(n, dtype=dtype)
    if runs is not None:
        # A frame laid out series by series: its runs of one rank, in order of rank (then of
        # place), are the stable order; no sort of the rows.
        starts = np.concatenate((runs, [n]))
        at = 0
        for i in np.lexsort((runs, rank[runs])):
            for a in range(int(starts[i]), int(starts[i + 1]), _BLOCK):  # (no whole arange)
                b = min(a + _BLOCK, int(starts[i + 1]))
                out[at : at + b - a] = np.arange(a, b, dtype=dtype)
                at += b - a
        return out
    if counts is None:
        counts = _counts(rank, n_series)
    free = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)  # next slot per rank
    # (blocks of a quarter of _BLOCK: each block's argsort and slots are about 50 bytes a row)
    block = max(1, _BLOCK >> 2)
    for a in range(0, n, block):
        r = rank[a : a + block]
        o = np.argsort(r, kind="stable")
        c = np.bincount(r, minlength=n_series)
        first = np.concatenate(([0], np.cumsum(c)[:-1]))  # where each rank starts in the block
        # The block's j-th row in rank order (rank s) goes to free[s] + j - first[s]: the
        # ranks in that order are runs of c[s] (no gather of them).
        slot = np.repeat(free - first, c)
        slot += np.arange(len(r))
        out[slot] = o + a
        free += c
    return out


def _rank_runs(rank: np.ndarray) -> np.ndarray | None:
    """Where each run of equal ranks starts (0 first), when there are at most
    :data:`_MAX_RUNS` runs; else None (found in blocks, stopping at the first block that
    shows too many: an interleaved frame's ranks change at nearly every row)."""
    if not len(rank):
        return None
    found = [np.zeros(1, dtype=np.int64)]
    count = 0
    for a in range(0, len(rank) - 1, _BLOCK):
        r = rank[a : a + _BLOCK + 1]
        change = r[1:] != r[:-1]
        count += int(np.count_nonzero(change))
        if count >= _MAX_RUNS:
            return None
        found.append(np.flatnonzero(change) + (a + 1))
    return np.concatenate(found)


def _last_of_key(
    perm: np.ndarray | None, steps: np.ndarray | pl.Series, totals: np.ndarray
) -> tuple[np.ndarray, np.ndarray, bool]:
    """For rows taken in ``perm`` order (sorted by series, ``totals`` rows of each): which
    are the last of a run of equal (series, step) (the value logged last), the kept rows per
    series, and whether steps grow within every series. In blocks, so no whole-frame copy of
    the keys is made; the series of each position follows from ``totals`` (no gather).
    ``perm`` None: the rows are in that order already (slices of ``steps``, no gather;
    ``steps`` may then be a Series, read a block at a time)."""
    n = len(steps) if perm is None else len(perm)
    keep = np.ones(n, dtype=bool)
    ends = np.cumsum(totals)  # one past each series' last position
    for a in range(0, n, _BLOCK):
        b = min(a + _BLOCK + 1, n)  # one row of overlap: the next block's first
        if isinstance(steps, pl.Series):
            st = steps.slice(a, b - a).to_numpy()
        else:
            st = steps[a:b] if perm is None else steps[perm[a:b].astype(np.intp)]  # (_scatter)
        same = np.ones(b - a - 1, dtype=bool)  # position q and q + 1 in one series
        same[ends[(ends > a) & (ends < b)] - 1 - a] = False
        down = st[1:] < st[:-1]
        down &= same
        if down.any():
            return keep, totals, False
        tie = st[1:] == st[:-1]
        tie &= same
        np.logical_not(tie, out=keep[a : b - 1])
    dropped = np.searchsorted(ends, np.flatnonzero(~keep), side="right")
    return keep, totals - np.bincount(dropped, minlength=len(totals)), True


def _ranked_series(f: pl.DataFrame, check: bool = True) -> tuple[pl.DataFrame, np.ndarray] | None:
    """The series of ``f`` (one row per (source, tag): metric, source, tag, layer) sorted by
    (metric, source, tag), and each row's rank among them; None when a source or tag is null
    or a (source, tag) has two metrics or layers (the general way). ``check`` False: a
    series' metric and layer are its last row's, the other rows not read (see _settle).

    On the categorical codes with lookup tables: a ``unique()`` of the four key columns would
    hash every row (about 50 bytes a row of transient memory on a 7M-row frame)."""
    tag = f.get_column("tag")
    if tag.null_count() or f.select(pl.col("source").null_count()).item():
        return None
    if not (
        isinstance(tag.dtype, pl.Categorical) and isinstance(f.schema["source"], pl.Categorical)
    ):
        return _ranked_series_by_join(f)  # a frame not in the canonical schema (strings)
    key = tag.to_physical().to_numpy()  # each row's series: its tag code (one source) ...
    n_tags = int(key.max()) + 1
    # (the source's codes by expressions first: one source, a constant column, is never made
    # per row; a Series of it would be, and kept by the frame)
    code = pl.col("source").to_physical()
    if f.select(code.min() != code.max()).item():
        src_codes = f.get_column("source").to_physical().to_numpy()
        present = np.zeros(int(src_codes.max()) + 1, dtype=bool)
        present[src_codes] = True
        # ... or its (source, tag) pair: source number * n_tags + tag code
        dense = np.cumsum(present, dtype=np.int64) - 1
        if int(present.sum()) * n_tags >= 1 << 32:
            return _ranked_series_by_join(f)
        key = dense.astype(np.uint32)[src_codes] * np.uint32(n_tags) + key
        del src_codes, present
    # One row of each series (the last), then every row checked against it: the same metric
    # and layer (else a tag spans two layers: the general way).
    idx = np.uint32 if len(key) < (1 << 32) - 1 else np.uint64
    none = np.iinfo(idx).max
    one = np.full(int(key.max()) + 1, none, dtype=idx)
    for a in range(0, len(key), _BLOCK):  # (a later row overwrites: the last of each series)
        one[key[a : a + _BLOCK].astype(np.intp)] = np.arange(
            a, min(a + _BLOCK, len(key)), dtype=idx
        )
    keys = np.flatnonzero(one != none)
    for name in ("metric", "layer") if check else ():
        if not _function_of_key(f.get_column(name), key, one, keys):
            return None
    pairs = (
        f.select("metric", "source", "tag", "layer")
        .gather(one[keys])
        .with_columns(pl.Series("_key", keys))
        .sort(["metric", "source", "tag"], maintain_order=True)
    )
    dtype = _rank_dtype(pairs.height)
    lut: np.ndarray = np.zeros(len(one), dtype=dtype)
    lut[pairs.get_column("_key").to_numpy()] = np.arange(pairs.height, dtype=dtype)
    return pairs.drop("_key"), lut[key]


def _rank_dtype(n_series: int) -> type:
    """The narrowest unsigned integers that number ``n_series`` series (a stable argsort of
    one-byte ranks is a single radix pass)."""
    if n_series <= 1 << 8:
        return np.uint8
    return np.uint16 if n_series <= 1 << 16 else np.uint32


def _function_of_key(col: pl.Series, key: np.ndarray, one: np.ndarray, keys: np.ndarray) -> bool:
    """Does every row of ``col`` hold the value of its series' row ``one[key]`` (nulls
    included)? For a column stored as integers of up to 4 bytes (categorical codes, layers):
    in blocks, against a table of the series' values (a lookup in a small table instead of
    a gather from the column)."""
    phys = col.to_physical()
    if not (phys.dtype.is_integer() and _width(phys.dtype) <= 4):
        for a in range(0, len(key), _BLOCK):
            rows = pl.Series(one[key[a : a + _BLOCK]])
            if not col.slice(a, len(rows)).eq_missing(col.gather(rows)).all():
                return False
        return True
    # Each series' value: in the column's own type (blocks without nulls are read with no
    # copy), and as int64 with nulls as a value below every 4-byte integer (other blocks).
    has = phys.gather(one[keys])
    null = np.zeros(len(one), dtype=bool)
    null[keys] = has.is_null().to_numpy()
    some_null = bool(null.any())
    wanted = np.zeros(len(one), dtype=has.fill_null(0).to_numpy().dtype)
    wanted[keys] = has.fill_null(0).to_numpy()
    none = -(1 << 40)
    wanted64 = np.full(len(one), none, dtype=np.int64)
    wanted64[keys] = has.cast(pl.Int64).fill_null(none).to_numpy()
    for a in range(0, len(key), _BLOCK):
        k = key[a : a + _BLOCK]
        got = phys.slice(a, _BLOCK)
        if got.null_count():
            same = np.array_equal(wanted64[k], got.cast(pl.Int64).fill_null(none).to_numpy())
        else:
            same = not (some_null and null[k].any()) and np.array_equal(wanted[k], got.to_numpy())
        if not same:
            return False
    return True


def _ranked_series_by_join(f: pl.DataFrame) -> tuple[pl.DataFrame, np.ndarray] | None:
    """:func:`_ranked_series` for a key space too large for a lookup table (a hash join)."""
    pairs = f.select("metric", "source", "tag", "layer").unique()
    if pairs.select("source", "tag").is_duplicated().any():
        return None
    pairs = pairs.sort(["metric", "source", "tag"], maintain_order=True)
    dtype = np.uint16 if pairs.height < 1 << 16 else np.uint32
    ranked = pairs.select("source", "tag").with_row_index("_rank")
    got = f.select("source", "tag").join(
        ranked, on=["source", "tag"], how="left", maintain_order="left"
    )
    return pairs, got.get_column("_rank").to_numpy().astype(dtype)


def _run_moves(rank: np.ndarray, runs: np.ndarray, n: int) -> list[tuple[int, int]]:
    """The stable order by rank of rows that come in runs of one rank (``runs``: where each
    starts, :func:`_rank_runs`), as (start, end) row ranges in order, adjacent ones joined:
    the ranges :func:`_take` would slice from :func:`_stable_order`'s array."""
    ends = np.append(runs[1:], n)
    out: list[tuple[int, int]] = []
    for i in np.lexsort((runs, rank[runs])):
        a, b = int(runs[i]), int(ends[i])
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _slices(f: pl.DataFrame, moves: list[tuple[int, int]]) -> pl.DataFrame:
    """The rows of ``f`` in the ranges ``moves``, in that order (zero-copy slices)."""
    if len(moves) == 1 and moves[0] == (0, f.height):
        return f
    parts = [f.slice(a, b - a) for a, b in moves]
    return pl.concat(parts, how="vertical", rechunk=False)


def _take(f: pl.DataFrame, perm: np.ndarray) -> pl.DataFrame:
    """The rows of ``f`` at ``perm``: ``f`` itself when that is every row in order, zero-copy
    slices when the rows come in a few long runs (a frame written series by series), else
    one gather."""
    n = len(perm)
    if n == 0:
        return f.clear()
    breaks = _breaks(perm, _MAX_RUNS)
    if breaks is not None:
        if not len(breaks) and n == f.height and perm[0] == 0:
            return f
        if _few_runs(perm, breaks):
            bounds = np.concatenate(([0], breaks, [n]))
            return _slices(
                f, [(int(perm[a]), int(perm[a]) + int(b - a)) for a, b in pairwise(bounds)]
            )
    idx = pl.Series(perm.astype(np.uint32 if f.height < 1 << 32 else np.uint64))
    return f.select(pl.all().gather(idx))


_MAX_RUNS = 1024  # runs of a permutation still taken as zero-copy slices


def _breaks(perm: np.ndarray, limit: int | None = None) -> np.ndarray | None:
    """Where ``perm`` stops counting up by one (the starts of its runs after the first); None
    once more than ``limit`` are found. In blocks: an interleaved frame's order breaks at
    nearly every row, and the whole-length differences and positions would cost about 13
    bytes a row."""
    found: list[np.ndarray] = []
    count = 0
    for a in range(0, max(len(perm) - 1, 0), _BLOCK):
        p = perm[a : a + _BLOCK + 1]
        step = np.diff(p) != 1
        count += int(np.count_nonzero(step))
        if limit is not None and count > limit:
            return None  # (before the positions: an interleaved block's are nearly all rows)
        found.append(np.flatnonzero(step) + (a + 1))
    return np.concatenate(found) if found else np.empty(0, dtype=np.int64)


def _few_runs(perm: np.ndarray, breaks: np.ndarray | None = None) -> bool:
    """Do ``perm``'s rows come in a few long runs (worth zero-copy slices, not a gather)?"""
    if breaks is None:
        breaks = _breaks(perm, _MAX_RUNS)
        if breaks is None:
            return False
    return len(breaks) < _MAX_RUNS and len(perm) >= 4096 * (len(breaks) + 1)


def _not_preempted(f: pl.DataFrame) -> np.ndarray:
    """Which rows no later segment of the same series pre-empts (its first step at or
    before theirs)."""
    key = ["source", "tag"]
    # For each segment, the smallest first step of any *later* segment of the same series:
    # rows at or beyond it were replayed by the restart and lose to the later values.
    firsts = (
        f.group_by(key + ["segment"])
        .agg(pl.col("step").min().alias("_first"))
        .sort(key + ["segment"], descending=[False, False, True])
        .with_columns(pl.col("_first").shift(1).over(key).alias("_next_first"))
        .with_columns(pl.col("_next_first").cum_min().over(key).alias("_later_first"))
        .select(key + ["segment", "_later_first"])
    )
    later = (
        f.select(key + ["segment"])
        .join(firsts, on=key + ["segment"], how="left", maintain_order="left")
        .get_column("_later_first")
    )
    kept = later.is_null() | (f.get_column("step") < later)
    return kept.fill_null(False).to_numpy()


def _sorted_order(f: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The general way (any frame): a stable sort of every row's key; returns the rows in
    view order and which of them are the last of their (source, tag, step)."""
    # Stable sort keeps record order among equal keys, so the last of a run of equal
    # (source, tag, step) rows is the value logged last. The metric comes first (it is a
    # function of source and tag) so that each metric's rows are contiguous (Run.series).
    keys = f.select("metric", "source", "tag", "step").with_row_index("_row")
    keys = keys.sort(["metric", "source", "tag", "step"], maintain_order=True)
    last_of_key = (
        (pl.col("step") != pl.col("step").shift(-1))
        | (pl.col("tag") != pl.col("tag").shift(-1))
        | (pl.col("source") != pl.col("source").shift(-1))
    ).fill_null(True)
    got = keys.select(pl.col("_row"), last_of_key.alias("_keep"))
    return got.get_column("_row").to_numpy(), got.get_column("_keep").to_numpy()
