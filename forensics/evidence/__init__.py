"""The evidence layer: every signal a run's judgement rests on, computed once per run.

``read -> evidence -> detect -> diagnose -> render``. Detectors, checklists, charts, compare
and watch all read one :class:`Evidence`, built with the configured parameters, so a baseline
drawn in a chart is the baseline a finding states. Nothing outside this package recomputes a
baseline, a spike, a gap or a warm-up end.

Everything is lazy (``functools.cached_property`` or a per-key cache): a run that logs no grad
norm never pays for its baseline, and a value asked for twice is computed once.

The helper modules (robust scores, Theil-Sen slopes, spike shapes, LR kinks, loss-scale
cascades) live beside this file; they work on plain arrays or on the run, and only this class
decides the parameters they are called with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from forensics.params import Params

if TYPE_CHECKING:
    from forensics.detectors.drift import DriftResult
    from forensics.evidence.baseline import Baseline
    from forensics.evidence.checkpoints import Checkpoints, TrainerBest
    from forensics.evidence.gap import Gap
    from forensics.evidence.schedule import Schedule
    from forensics.evidence.spike_context import Kink, Period, ScaleCascade, ScheduleEvent
    from forensics.evidence.spikes import Spike
    from forensics.evidence.trend_utils import LayerMatrix
    from forensics.findings import Finding
    from forensics.run import Run


@dataclass(frozen=True)
class Series:
    """One vital sign as aligned arrays: finite values only, sorted by step."""

    steps: np.ndarray  # int64
    values: np.ndarray  # float64
    # Seconds since the epoch per point (NaN where the log has none); None when not read.
    wall_time: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def empty(self) -> bool:
        return len(self.steps) == 0


@dataclass(frozen=True)
class Band:
    """A baseline with its alarm lines: what a chart draws and a finding is judged against."""

    baseline: Baseline
    warn_ratio: float
    critical_ratio: float | None = None

    @property
    def warn_at(self) -> float:
        return self.baseline.value * self.warn_ratio

    @property
    def critical_at(self) -> float | None:
        return None if self.critical_ratio is None else self.baseline.value * self.critical_ratio

    def judged(self) -> dict[str, float | None]:
        """The numbers a finding records as what it was judged against."""
        return {
            "baseline": self.baseline.value,
            "warn_at": self.warn_at,
            "critical_at": self.critical_at,
        }


class Evidence:
    """What one run shows, computed lazily with the configured parameters.

    Attributes:
        run: the run read by the importers.
        params: every detector's parameters (:mod:`forensics.params`).
    """

    def __init__(self, run: Run, params: Params | None = None) -> None:
        self.run = run
        self.params = params or Params()
        self._series: dict[tuple[str, int | None], Series] = {}
        self._spikes: dict[str, list[Spike]] = {}
        self._layer_matrix: dict[str, LayerMatrix] = {}
        self._logged: dict[tuple[str, int | None], Series] = {}
        self._gaps: dict[str, Gap | None] = {}
        self._despike: dict[tuple[str, float], np.ndarray] = {}  # (metric, k) -> despike mask
        self._shared: list[tuple[str, Any, list[Finding]]] = []  # (detector, params, found)

    # -- aligned arrays ----------------------------------------------------------------------
    def series(self, metric: str, layer: int | None = None) -> Series:
        """Steps and finite values of one canonical series (cached)."""
        key = (metric, layer)
        if key not in self._series:
            got = self.logged(metric, layer)  # read from the run once, for both views
            ok = np.isfinite(got.values)
            if ok.all():
                self._series[key] = got
            else:
                wall = got.wall_time[ok] if got.wall_time is not None else None
                self._series[key] = Series(got.steps[ok], got.values[ok], wall)
        return self._series[key]

    def ran_into(self, metric: str, end: int, step: int) -> bool:
        """Did a finding on ``metric`` that ends at ``end`` last up to ``step`` (> ``end``):
        its series read nothing finite after ``end`` before ``step``, and either logged
        non-finite points from there up to ``step`` or reached ``step`` within one logging
        interval. A grad-norm climb that ran into a NaN ends at the last finite point (the
        drift to step 8,999, the NaN from step 9,000): it was still going on at the NaN's
        onset. A series no longer logged at all does not carry a finding on."""
        if end >= step:
            return True
        from forensics.evidence.robust import median_interval
        from forensics.schema import PER_LAYER

        if metric in PER_LAYER:
            return False  # (one series per layer: a finding's own layer is not known here)
        finite, logged = self.series(metric).steps, self.logged(metric).steps
        nxt = int(np.searchsorted(finite, end, side="right"))
        if nxt < len(finite) and int(finite[nxt]) < step:
            return False  # read again, finite, before ``step``: the finding had ended
        after = int(np.searchsorted(logged, end, side="right"))
        if after < len(logged) and int(logged[after]) <= step:
            return True
        return len(logged) > 1 and step - end <= median_interval(logged)

    def logged(self, metric: str, layer: int | None = None) -> Series:
        """Every logged point of one series, NaN and Inf included (they are evidence), sorted
        by step (cached). For where a value was logged, not for statistics."""
        key = (metric, layer)
        if key not in self._logged:
            s = _one_row_per_step(self.run, metric, layer)
            if s is None:
                s = self.run.series(metric, layer)
            self._logged[key] = Series(
                s.get_column("step").to_numpy().astype(np.int64, copy=False),
                s.get_column("value").to_numpy().astype(float, copy=False),
                s.get_column("wall_time").cast(pl.Float64).to_numpy().astype(float, copy=False)
                if "wall_time" in s.columns
                else None,
            )
        return self._logged[key]

    def has(self, metric: str) -> bool:
        return self.run.has(metric)

    def despiked(self, metric: str, k: float = 5.0) -> np.ndarray:
        """``trend_utils.despike(self.series(metric).values, k=k)``: the mask of points a trend
        fit keeps (a new array each call), the rolling band computed once per series (plateau,
        gap, drift and eval regression all despike the loss).

        The cache keeps masks, not the band: the masks of the ``k`` the configured detectors
        ask for (5 and the drift's ``spike_k``) are made when the band is, and the band (two
        whole-length floats, 16 bytes a point) is dropped; any other ``k`` makes it again."""
        from forensics.evidence.trend_utils import despike_masks

        key = (metric, float(k))
        if key not in self._despike:
            values = self.series(metric).values
            ks = list(dict.fromkeys((float(k), 5.0, float(self.params.grad_norm_drift.spike_k))))
            for kk, mask in zip(ks, despike_masks(values, ks), strict=True):
                self._despike.setdefault((metric, kk), mask)
        return self._despike[key].copy()

    def layer_matrix(self, metric: str) -> LayerMatrix:
        """A per-layer series as a steps x layers matrix (NaN where missing), cached."""
        if metric not in self._layer_matrix:
            from forensics.evidence.trend_utils import layer_matrix

            self._layer_matrix[metric] = layer_matrix(self.run, metric)
        return self._layer_matrix[metric]

    @cached_property
    def param_norm_total(self) -> tuple[Series, str]:
        """The total param norm (logged, or rebuilt from per-layer norms) and its source."""
        from forensics.evidence.baseline import total_param_norm

        return total_param_norm(self)

    def using(self, name: str, params: Any) -> Evidence:
        """This evidence when ``params`` are detector ``name``'s configured parameters, else
        evidence of the same run built with them (a detector made with other parameters than
        the evidence's reads numbers computed with its own)."""
        if self.params[name] == params:
            return self
        return Evidence(self.run, Params({**self.params.by_detector, name: params}))

    def shared_findings(
        self, name: str, params: Any, compute: Callable[[], list[Finding]]
    ) -> list[Finding]:
        """Detector ``name``'s findings with ``params``, computed once (``compute``) when
        another detector reads them too; every caller gets its own copies (a finding's
        measures are a dict)."""
        found = next((f for n, p, f in self._shared if n == name and p == params), None)
        if found is None:
            found = compute()
            self._shared.append((name, params, found))
        return [replace(f) for f in found]

    # -- LR schedule -------------------------------------------------------------------------
    @cached_property
    def warmup_end(self) -> int | None:
        """The step where the LR warm-up ends (its first peak), when the log shows one early."""
        from forensics.evidence.baseline import warmup_end
        from forensics.schema import LR

        return warmup_end(self.logged(LR))

    @cached_property
    def schedule(self) -> Schedule:
        """The LR schedule's segments: warm-up, constant, decay, cooldown, unexplained changes."""
        from forensics.evidence.schedule import lr_schedule

        return lr_schedule(self.series_of_lr(), warmup_end=self.warmup_end)

    @cached_property
    def schedule_events(self) -> list[ScheduleEvent]:
        """The schedule's warm-up end, restarts, step drops and cooldown starts, by step."""
        from forensics.evidence.spike_context import schedule_events

        return schedule_events(self.schedule, self.warmup_end)

    def series_of_lr(self) -> Series:
        from forensics.schema import LR

        return self.series(LR)

    @cached_property
    def lr_kinks(self) -> list[Kink]:
        """Non-smooth points of the LR schedule (warm-up end, restarts, drops)."""
        from forensics.evidence.spike_context import lr_kinks
        from forensics.schema import LR

        return lr_kinks(self.series(LR))

    @cached_property
    def level_barriers(self) -> list[int]:
        """Steps where the loss level may jump for its own reasons (epochs, LR restarts/drops,
        resumes: a resume that lost the optimizer state moves the level from its first step)."""
        kinks = [k.step for k in self.lr_kinks if k.kind in ("restart", "drop")]
        return sorted(set(self.epoch_boundaries) | set(kinks) | set(self.resume_steps))

    @cached_property
    def resume_steps(self) -> list[int]:
        """The first step after each resume seam (the import's ``restart`` findings), in order."""
        from forensics.findings import FindingKind

        return sorted(
            {int(f.start_step) for f in self.run.import_findings if f.kind is FindingKind.RESTART}
        )

    @cached_property
    def epoch_boundaries(self) -> list[int]:
        """Steps at which a new epoch began (from the ``epoch`` series)."""
        from forensics.evidence.spike_context import epoch_boundaries
        from forensics.schema import EPOCH

        return epoch_boundaries(self.series(EPOCH))

    # -- baselines and bands -----------------------------------------------------------------
    @cached_property
    def grad_norm_band(self) -> Band | None:
        """The grad-norm baseline (configured window) with its 2x / 3x lines (configured)."""
        from forensics.evidence.baseline import grad_norm_baseline

        p = self.params.grad_norm_drift
        base = grad_norm_baseline(self, window=p.baseline_window)
        if base is None:
            return None
        return Band(base, p.warn_ratio, p.crit_ratio)

    @cached_property
    def param_norm_band(self) -> Band | None:
        """The param-norm baseline with its 1.5x line (configured)."""
        from forensics.evidence.baseline import param_norm_baseline

        p = self.params.param_norm
        base = param_norm_baseline(self, window=p.baseline_window)
        if base is None:
            return None
        return Band(base, p.ratio_limit)

    @cached_property
    def drift(self) -> DriftResult | None:
        """The grad-norm drift analysis (judged against :attr:`grad_norm_band`), shared by the
        drift and eval-regression detectors; None when the run cannot support it."""
        from forensics.detectors.drift import analyze_drift

        return analyze_drift(self)

    @property
    def activation_limit(self) -> float:
        """The absolute activation past which a layer is the suspect (configured; 1e4)."""
        return float(self.params.activations.absmax_limit)

    # -- spikes ------------------------------------------------------------------------------
    def spikes(self, metric: str) -> list[Spike]:
        """The spikes of one series with their shapes, found with the configured spike
        parameters (computed once; the spike, periodicity and loss-scale detectors share them).
        The spikes are read-only; do not change the list."""
        if metric not in self._spikes:
            from forensics.evidence.spikes import find_spikes

            self._spikes[metric] = find_spikes(self, metric) if self.has(metric) else []
        return self._spikes[metric]

    @cached_property
    def diverged(self) -> list[tuple[int, int]]:
        """The loss's diverged stretches as ``(onset, end)`` steps: the divergence detector's
        findings with the configured parameters (spikes inside one are part of it)."""
        from forensics.detectors.divergence import DivergenceDetector

        found = DivergenceDetector(self.params["divergence"]).divergences(self)
        return [(f.start_step, f.start_step if f.end_step is None else f.end_step) for f in found]

    @cached_property
    def scale_cascades(self) -> list[ScaleCascade]:
        """Groups of loss-scale halvings with no growth between them (configured gap)."""
        from forensics.evidence.spike_context import scale_cascades
        from forensics.schema import LOSS_SCALE, OVERFLOW

        return scale_cascades(
            self.series(LOSS_SCALE),
            self.series(OVERFLOW),
            cascade_gap=self.params["loss_scale"].cascade_gap,
        )

    @cached_property
    def drop_windows(self) -> np.ndarray:
        """Where the loss scale fell, as ``(lo, hi]`` step windows."""
        from forensics.evidence.spike_context import drop_windows
        from forensics.schema import LOSS_SCALE, OVERFLOW

        return drop_windows(self.series(LOSS_SCALE), self.series(OVERFLOW))

    @cached_property
    def revealed_periods(self) -> dict[str, Period]:
        """Periods the log shows (epoch, eval, checkpoint, LR restart intervals), each with
        where its grid starts."""
        from forensics.evidence.spike_context import revealed_periods

        return revealed_periods(self)

    # -- train / val -------------------------------------------------------------------------
    @property
    def gap(self) -> Gap | None:
        """The train/val gap at each eval (train smoothed around it), with its noise."""
        return self.gap_of("val_loss")

    def gap_of(self, metric: str) -> Gap | None:
        """The gap of one held-out loss (``val_loss`` or an eval set's ``eval/<set>_loss``),
        computed once."""
        if metric not in self._gaps:
            from forensics.evidence.gap import train_val_gap

            self._gaps[metric] = train_val_gap(self, metric)
        return self._gaps[metric]

    # -- checkpoints -------------------------------------------------------------------------
    @cached_property
    def checkpoints(self) -> Checkpoints:
        """Checkpoints the run shows (folders beside the log) or states (its save interval)."""
        from forensics.evidence.checkpoints import known_checkpoints

        return known_checkpoints(self.run)

    @cached_property
    def trainer_best(self) -> TrainerBest | None:
        """The checkpoint the trainer recorded as its best (HF's ``best_model_checkpoint``)
        and the eval series it judged by, when the log says."""
        from forensics.evidence.checkpoints import trainer_best
        from forensics.schema import EVAL_PREFIX, VAL_LOSS

        names = [m for m in self.run.metrics() if m == VAL_LOSS or m.startswith(EVAL_PREFIX)]
        return trainer_best(self.run.config, names, self.value_at)

    def trainer_best_clause(self, best: int) -> str:
        """:meth:`TrainerBest.clause` for a finding whose own best is step ``best``, with the
        trainer's metric as logged there ("" when the trainer names no best, or that step)."""
        tb = self.trainer_best
        if tb is None:
            return ""
        return tb.clause(best, self.value_at(tb.metric, best) if tb.metric else None)

    def value_at(self, metric: str, step: int) -> float | None:
        """The finite value of ``metric`` logged at exactly ``step``, else None."""
        s = self.series(metric)
        i = int(np.searchsorted(s.steps, step))
        return float(s.values[i]) if i < len(s.steps) and s.steps[i] == step else None

    @cached_property
    def trainer(self) -> str | None:
        """The trainer that wrote the log (megatron, hf, lightning), when its format says."""
        from forensics.rollback import trainer_of

        return trainer_of(self.run)

    # -- for the report ----------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """The evidence's headline numbers, for the JSON document and the report."""
        gb = self.grad_norm_band
        pb = self.param_norm_band
        return {
            "warmup_end": self.warmup_end,
            "grad_norm_band": gb.judged() if gb else None,
            "param_norm_band": pb.judged() if pb else None,
            "activation_limit": self.activation_limit,
        }


def _one_row_per_step(run: Run, metric: str, layer: int | None) -> pl.DataFrame | None:
    """``run.series(metric)`` when its rows are already one per step in step order (the
    usual case), read straight from the view's slice; None when the group-by is needed.

    The view's slice of one tag is sorted by step within each source; strictly increasing
    steps mean one row per step, so ``Run.series``'s group-by (last value per step) and sort
    return these rows unchanged: a million-point series is read in a millisecond instead of
    a fifth of a second.
    """
    from forensics.schema import PER_LAYER

    one = run.one_series(metric, layer)  # one slice of the view: its arrays, not a copy
    if one is not None:
        return one
    if layer is not None or metric in PER_LAYER:
        return None
    tag = run.metrics().get(metric)
    if tag is None:
        return None
    sub = run.metric_rows(metric).filter(pl.col("tag") == tag)
    steps = sub.get_column("step").to_numpy()
    if len(steps) == 0 or not bool(np.all(steps[1:] > steps[:-1])):
        return None
    return sub.select("step", "value", "wall_time")


__all__ = ["Band", "Evidence", "Series"]
