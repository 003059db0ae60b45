"""A run: everything one training job logged, as one long canonical frame plus provenance."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from forensics.findings import Finding
from forensics.schema import (
    ACT_ABSMAX,
    GRAD_NORM_LAYER,
    PARAM_NORM_LAYER,
    PER_LAYER,
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
            restarts included (``segment`` counts them).
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
    _metrics: dict[str, str] | None = field(default=None, repr=False)
    _parts: dict[str, pl.DataFrame] | None = field(default=None, repr=False)
    # id() of the frame the caches describe
    _span: tuple[int, tuple[int, int]] | None = field(default=None, repr=False)
    _cached_for: int | None = field(default=None, repr=False)

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
        """
        if self._cached_for != id(self.frame):  # the frame was replaced: drop the caches
            self._view, self._metrics, self._parts, self._cached_for = (
                None,
                None,
                None,
                id(self.frame),
            )
        if self._view is None:
            self._view = analysis_view(self.frame)
        return self._view

    def series(self, metric: str, layer: int | None = None) -> pl.DataFrame:
        """One canonical series: columns ``step, value, wall_time`` sorted by step.

        When several raw tags map to the same canonical metric, the tag with the most
        points is used (see :meth:`metrics`). For one layer logged as several parameter
        tensors, the values at a step are combined: L2 for grad/param norms (the layer's
        norm), max for activation absmax, mean for activation mean and std.
        """
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

    def metric_rows(self, metric: str) -> pl.DataFrame:
        """The analysis view's rows of one canonical metric (every tag and layer): a zero-copy
        slice of :meth:`view`, the same rows as ``view().filter(metric == ...)`` without
        scanning or copying the whole view."""
        return self._metric_rows(metric)

    def _metric_rows(self, metric: str) -> pl.DataFrame:
        v = self.view()
        if self._parts is None:
            # The view is sorted by metric first: each metric's rows are one zero-copy slice
            # of it (partitioning would copy the whole view once more).
            runs = (
                v.select(pl.col("metric").rle())
                .unnest("metric")
                .with_columns(pl.col("len").cum_sum().shift(1, fill_value=0).alias("start"))
                .filter(pl.col("value").is_not_null())
            )
            self._parts = {
                m: v.slice(start, n) for n, m, start in runs.select("len", "value", "start").rows()
            }
        return self._parts.get(metric, v.clear())

    def has(self, metric: str) -> bool:
        return metric in self.metrics()

    def metrics(self) -> dict[str, str]:
        """Canonical vital sign -> the raw tag it is read from (most points wins).

        Per-layer series are summarised as ``"<n> layer tags"``.
        """
        v = self.view()
        if self._metrics is not None:
            return dict(self._metrics)
        out: dict[str, str] = {}
        self._metrics = out
        # Lazy: the filter feeds the aggregation without a copy of the known rows.
        counts = (
            v.lazy()
            .filter(pl.col("metric").is_not_null())
            .group_by("metric", "tag")
            .agg(pl.len().alias("n"), pl.col("layer").first())
            .sort(["metric", "n", "tag"], descending=[False, True, False])
            .collect()
        )
        if counts.is_empty():
            return dict(out)
        for metric, grp in counts.group_by("metric", maintain_order=True):
            m = metric[0]
            if m in PER_LAYER:
                out[m] = f"{grp.height} layer tags"
            else:
                out[m] = grp.get_column("tag")[0]
        return dict(out)

    def layers(self, metric: str) -> list[int]:
        v = self._metric_rows(metric)
        return sorted(v.get_column("layer").drop_nulls().unique().to_list())

    @property
    def first_step(self) -> int:
        return self._step_span()[0]

    @property
    def last_step(self) -> int:
        return self._step_span()[1]

    def _step_span(self) -> tuple[int, int]:
        # Cached per frame object: read in loops (one rollback plan per incident).
        key = id(self.frame)
        if self._span is None or self._span[0] != key:
            s = self.frame.get_column("step").drop_nulls()
            lo, hi = (int(s.min()), int(s.max())) if len(s) else (0, 0)  # type: ignore[arg-type]
            self._span = (key, (lo, hi))
        return self._span[1]

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


def analysis_view(frame: pl.DataFrame) -> pl.DataFrame:
    """Keep, per series, only rows not pre-empted by a later segment (RustBoard semantics).

    Then one value per (series, step): the last one logged. Sorted by (metric, source, tag,
    step), rows without a canonical metric first.
    """
    if frame.is_empty():
        return frame.select(VIEW_COLUMNS)
    # Only what the analysis reads: provenance (file, record) stays in the frame, and the
    # sorted copy is about half as wide.
    f = frame.select(VIEW_COLUMNS).filter(pl.col("step").is_not_null())
    key = ["source", "tag"]
    if f.get_column("segment").n_unique() > 1:
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
        f = f.join(firsts, on=key + ["segment"], how="left")
        f = f.filter(pl.col("_later_first").is_null() | (pl.col("step") < pl.col("_later_first")))
        f = f.drop("_later_first")
    # Stable sort keeps record order among equal keys, so the last of a run of equal
    # (source, tag, step) rows is the value logged last. The metric comes first (it is a
    # function of source and tag) so that each metric's rows are contiguous (Run.series).
    f = f.sort(["metric", "source", "tag", "step"], maintain_order=True)
    last_of_key = (
        (pl.col("step") != pl.col("step").shift(-1))
        | (pl.col("tag") != pl.col("tag").shift(-1))
        | (pl.col("source") != pl.col("source").shift(-1))
    ).fill_null(True)
    return f.filter(last_of_key)
