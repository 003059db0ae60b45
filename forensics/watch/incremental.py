"""The watcher's analysis of a poll: :func:`~forensics.pipeline.analyze_run`, reusing the last
poll's work wherever it provably gives the same numbers.

``analyze_run`` on a 1M-step run costs tens of CPU seconds, almost all of it whole-series work
that a poll with 1,000 new steps would repeat. :class:`IncrementalAnalysis` keeps, from one
poll to the next:

* the analysis view and tag table (:class:`~forensics.watch.carry.ViewCarry`): spliced
  instead of sorted again;
* each series' aligned arrays (:class:`CarriedEvidence`): when the view was spliced, the
  tag read for the metric is the same and the appended rows of the series all come after its
  last old step, the series is its old arrays followed by the arrays of the appended rows
  alone (a step's value depends only on the rows at that step, and the steps sort after);
* spike trend fits by their exact inputs and local filters on their prefix
  (:mod:`forensics.evidence.reuse`).

Everything else is computed again from the run. After every poll the findings equal those of
``analyze_run`` on the same frame from scratch (``tests/test_watch_incremental.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from forensics.evidence import Evidence, Series
from forensics.evidence.reuse import TrendMemo
from forensics.run import Run
from forensics.schema import PER_LAYER
from forensics.watch.carry import ViewCarry, seed

if TYPE_CHECKING:
    from forensics.config import Config
    from forensics.diagnosis import Diagnosis
    from forensics.params import Params

_SeriesKey = tuple[str, int | None]


class IncrementalAnalysis:
    """One watcher's analyses, poll after poll (see the module docstring).

    Attributes:
        memo: spike trend fits and local filters of the last poll.
        view: the last poll's analysis view.
        extended: series built by extending the last poll's arrays, over the tail's life.
    """

    def __init__(self) -> None:
        self.memo = TrendMemo()
        self.view = ViewCarry()
        self.extended = 0
        self._series: dict[_SeriesKey, tuple[Series, frozenset[str]]] = {}
        self._prev: dict[_SeriesKey, tuple[Series, frozenset[str]]] = {}
        self._metrics: dict[str, str] = {}

    def analyze(self, run: Run, config: Config | None = None) -> Diagnosis:
        from forensics.config import Config
        from forensics.pipeline import analyze_run

        config = config or Config()
        # Only the series of the poll just before are extended (a failed poll leaves none).
        self._prev, self._series = self._series, {}
        self.view.prepare(run)
        ev = CarriedEvidence(run, config.params, self)
        with self.memo.active():
            diag = analyze_run(run, config, evidence=ev)
        self._prev = {}
        # What the next poll may extend: the series this poll read, under the tag table.
        self._series = ev.read_series()
        self._metrics = run.metrics()
        return diag

    def _extend(
        self, run: Run, metric: str, layer: int | None
    ) -> tuple[Series, frozenset[str]] | None:
        """The series ``(metric, layer)`` of ``run`` from the last poll's arrays, when exact."""
        old = self._prev.get((metric, layer))
        added = self.view.added
        if old is None or added is None or len(old[0]) == 0:
            return None
        if run.metrics().get(metric) != self._metrics.get(metric):
            return None  # another tag is read for the metric now
        mini = Run(run.name, run.path, run.format, run.frame)
        seed(mini, added, run.metrics())  # the appended rows' view, the run's tag table
        rows = mini.metric_rows(metric)
        if layer is not None:
            rows = rows.filter(pl.col("layer") == layer)
            tags = frozenset(rows.get_column("tag").cast(pl.String).unique().to_list())
            # Several tags of one layer are combined per step when the layer has several:
            # the appended rows alone must take the same path.
            if rows.height and (not tags <= old[1] or (len(tags) > 1) != (len(old[1]) > 1)):
                return None
        elif metric not in PER_LAYER:
            rows = rows.filter(pl.col("tag") == run.metrics().get(metric))
        if rows.is_empty():
            return old
        if int(rows.get_column("step").min()) <= int(old[0].steps[-1]):  # type: ignore[arg-type]
            return None  # a step at or before the last one: values at old steps may change
        tail = _arrays(mini.series(metric, layer))
        series, wall = old[0], old[0].wall_time
        self.extended += 1
        return (
            Series(
                np.concatenate([series.steps, tail.steps]),
                np.concatenate([series.values, tail.values]),
                None
                if wall is None or tail.wall_time is None
                else np.concatenate([wall, tail.wall_time]),
            ),
            old[1],
        )


class CarriedEvidence(Evidence):
    """Evidence whose logged series come from the last poll's when that is exact."""

    def __init__(self, run: Run, params: Params, carry: IncrementalAnalysis) -> None:
        super().__init__(run, params)
        self._carry = carry
        self._tags: dict[_SeriesKey, frozenset[str]] = {}

    def logged(self, metric: str, layer: int | None = None) -> Series:
        key = (metric, layer)
        if key not in self._logged:
            got = self._carry._extend(self.run, metric, layer)
            if got is not None:
                self._logged[key], self._tags[key] = got
            else:
                self._logged[key] = super().logged(metric, layer)
                self._tags[key] = _layer_tags(self.run, metric, layer)
        return self._logged[key]

    def read_series(self) -> dict[_SeriesKey, tuple[Series, frozenset[str]]]:
        return {k: (s, self._tags[k]) for k, s in self._logged.items() if k in self._tags}


def _layer_tags(run: Run, metric: str, layer: int | None) -> frozenset[str]:
    """The tags one layer's series combines (none for a series without a layer)."""
    if layer is None:
        return frozenset()
    rows = run.metric_rows(metric).filter(pl.col("layer") == layer)
    return frozenset(rows.get_column("tag").cast(pl.String).unique().to_list())


def _arrays(s: pl.DataFrame) -> Series:
    """A series frame as :meth:`Evidence.logged` turns it into arrays."""
    return Series(
        s.get_column("step").to_numpy().astype(np.int64),
        s.get_column("value").to_numpy().astype(float),
        s.get_column("wall_time").cast(pl.Float64).to_numpy().astype(float)
        if "wall_time" in s.columns
        else None,
    )


__all__ = ["CarriedEvidence", "IncrementalAnalysis"]
