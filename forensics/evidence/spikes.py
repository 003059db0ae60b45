"""The spikes of one series, found and measured once per run (article 4.3-4.4).

:func:`find_spikes` runs the robust score (:mod:`~forensics.evidence.robust`), applies the
configured thresholds (``[tool.forensics.detectors.spikes]``: loss and grad norm have their own
height ratios) and measures each spike's shape (:mod:`~forensics.evidence.spike_shape`).
:meth:`forensics.evidence.Evidence.spikes` calls it once per metric and caches the list: the
spike, periodicity and loss-scale detectors judge the same spikes.

A :class:`Spike` holds only what the series itself shows, read-only. What happened around it
(a loss-scale drop, an LR kink, a grad-norm spike leading a loss spike) is the spike
detector's judgement and goes into its findings, not back into the shared spikes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from forensics.allocator import trim
from forensics.evidence import order_stats, reuse, robust
from forensics.evidence.order_stats import median_of_ints
from forensics.evidence.reuse import measure_reusing
from forensics.evidence.shape_batch import SpikeInput, measure_many
from forensics.evidence.spike_shape import ShapeParams, SpikeClass, log_steps
from forensics.params import SpikesParams
from forensics.schema import LOSS

if TYPE_CHECKING:
    from forensics.evidence import Evidence


@dataclass(frozen=True, kw_only=True)
class SpikeSearch:
    """The parameters spikes of one metric are found and measured with (from SpikesParams)."""

    window: int
    min_side: int
    z_threshold: float
    min_ratio: float
    gross_ratio: float | None
    z_gross: float
    sigma_floor: float
    shape: ShapeParams

    @classmethod
    def of(cls, p: SpikesParams, metric: str) -> SpikeSearch:
        """The loss has its own height ratios; every other series uses the grad norm's. One
        value per (parameters, loss or not): thousands of spikes of a long run ask for it."""
        return _search_of(p, metric == LOSS)


@lru_cache(maxsize=16)
def _search_of(p: SpikesParams, is_loss: bool) -> SpikeSearch:
    return SpikeSearch(
        window=p.window,
        min_side=p.min_side,
        z_threshold=p.z_threshold,
        min_ratio=p.loss_min_ratio if is_loss else p.grad_norm_min_ratio,
        gross_ratio=p.loss_gross_ratio if is_loss else p.grad_norm_gross_ratio,
        z_gross=p.z_gross,
        sigma_floor=p.sigma_floor,
        shape=ShapeParams.of(p),
    )


@dataclass(frozen=True)
class Spike:
    """One spike with its raw measures (see the table in :mod:`forensics.detectors.spikes`:
    ``peak_value`` to ``classification``). Shared by every consumer: read-only.

    Attributes:
        metric: the series.
        start_step: the onset (where the series left its noise).
        peak_step: the highest point.
        end_step: where it was back in the band (the last logged step if never).
        measures: height, shape and recovery measures (a read-only mapping).
        alarm_at: the level the series had to pass at the peak to be flagged (the local
            baseline times the larger of the height ratio and the z threshold's noise band,
            or the gross rule's line where that is lower: :func:`alarm_line`); for a surge
            found by the band (``found_by``), the band's warning line at its peak.
    """

    metric: str
    start_step: int
    peak_step: int
    end_step: int
    measures: Mapping[str, Any] = field(compare=False)
    alarm_at: float = float("nan")
    # "score": flagged by the robust score against its local baseline; "band": a surge
    # above the grad-norm band's warning line for several points (forensics.evidence.surges)
    found_by: str = "score"

    def __post_init__(self) -> None:
        object.__setattr__(self, "measures", MappingProxyType(dict(self.measures)))

    @property
    def log_interval(self) -> float:
        return float(self.measures["log_interval"])

    @property
    def classification(self) -> SpikeClass:
        return SpikeClass(self.measures["classification"])


def find_spikes(ev: Evidence, metric: str) -> list[Spike]:
    """Detect the spikes of one series and measure their shape, with the configured spike
    parameters (no co-occurrence, no severity: that is the spike detector's).

    Call it through :meth:`Evidence.spikes`, which computes each metric's spikes once.
    """
    p = SpikeSearch.of(ev.params.spikes, metric)
    series = ev.series(metric)
    interval, shape_interval = step_intervals(series.steps)
    sc = robust.score_arrays(
        series.steps,
        series.values,
        window=p.window,
        min_side=p.min_side,
        sigma_floor=p.sigma_floor,
        confirm_until=start_zone(series.steps, ev.warmup_end, p.window, interval),
    )
    if sc is None or len(sc.value) < 3:
        return []
    if len(sc.value) == len(series):  # the score's points are the series' (finite already)
        steps, values = series.steps, series.values
    else:
        steps, values = sc.step, sc.value
        interval, shape_interval = step_intervals(steps)
    log_scale = robust.use_log(values)
    _trim_after(len(steps))  # (the score's work arrays, before find_events makes its own)
    events = robust.events_in(
        sc.z,
        sc.ratio,
        z_min=p.z_threshold,
        min_ratio=p.min_ratio,
        log_scale=log_scale,
        gross_ratio=p.gross_ratio,
        z_gross=p.z_gross,
    )
    peaks = [e.peak for e in events]
    at_peak = {c: getattr(sc, c)[peaks].tolist() for c in _ROW}
    at_peak["z"] = [None if z != z else z for z in at_peak["z"]]  # (the score frame's null)
    rows = [{c: at_peak[c][k] for c in _ROW} for k in range(len(events))]
    del sc  # (the score's columns, given back as soon as read: 50 MiB at a million points)
    _trim_after(len(steps))  # (the score's columns and find_events' work arrays)
    barriers = ev.level_barriers
    # Each spike's shape reads stretches of these: computed once per series (element by
    # element the numbers measure would compute on each stretch).
    xs = log_steps(steps)
    ys = robust.transform(values, log_scale)
    alarms = [alarm_line(p, row["sigma"], log_scale) for row in rows]
    shape_kw: dict[str, Any] = dict(
        log_scale=log_scale, p=p.shape, barriers=barriers, interval=shape_interval, xs=xs, ys=ys
    )
    if reuse._ACTIVE.get() is not None:  # a watcher's memo is active
        # Through the watcher's memo (forensics.evidence.reuse): a spike that settled before
        # the last poll's end keeps its measures.
        shapes = [
            measure_reusing(
                steps,
                values,
                onset=e.onset,
                peak=e.peak,
                sigma=row["sigma"],
                baseline_at_peak=row["baseline"],
                alarm=alarm,
                **shape_kw,
            )
            for e, row, alarm in zip(events, rows, alarms, strict=True)
        ]
    else:  # all the series' spikes at once (the same numbers)
        shapes = measure_many(
            steps,
            values,
            [
                SpikeInput(e.onset, e.peak, row["sigma"], row["baseline"], alarm)
                for e, row, alarm in zip(events, rows, alarms, strict=True)
            ],
            **shape_kw,
        )
    out: list[Spike] = []
    for e, row, alarm, m in zip(events, rows, alarms, shapes, strict=True):
        rec = m["recovered_step"]
        end_step = int(rec) if isinstance(rec, (int, float)) else int(steps[-1])
        measures: dict[str, Any] = {
            "peak_value": row["value"],
            "baseline": row["baseline"],
            "height": row["value"] - row["baseline"],
            "height_ratio": row["value"] / row["baseline"] if log_scale else None,
            "z": row["z"],
            "two_sided": row["two_sided"],
            "points": e.n_flagged,
            "log_interval": interval,
            **m,
        }
        alarm_at = row["baseline"] * float(np.exp(alarm)) if log_scale else row["baseline"] + alarm
        out.append(
            Spike(
                metric,
                int(steps[e.onset]),
                int(steps[e.peak]),
                end_step,
                measures,
                float(alarm_at),
            )
        )
    return out


_ROW = ("value", "baseline", "sigma", "z", "two_sided")  # the score's columns a spike reads


def alarm_line(p: SpikeSearch, sigma: float, log_scale: bool) -> float:
    """The alarm line above the local baseline, in the score's units (log units for positive
    series): the lowest excess :func:`robust.find_events` flags. That is the z threshold's
    noise band, at least the height ratio; for positive series also the gross rule's line (a
    jump past ``gross_ratio`` needs only ``z_gross``), whichever of the two is lower. A spike
    flagged by the gross rule in a noisy stretch passed that line, not the higher one."""
    line = max(float(np.log(p.min_ratio)) if log_scale else 0.0, p.z_threshold * sigma)
    if log_scale and p.gross_ratio is not None:
        line = min(line, max(float(np.log(p.gross_ratio)), p.z_gross * sigma))
    return line


def _trim_after(points: int) -> None:
    """Give freed heap pages back (:func:`forensics.allocator.trim`) after the work arrays of
    a long series: a few milliseconds, worth it where those arrays are MiBs each (glibc keeps
    them resident and the next arrays do not always fit the holes); a short series' are not."""
    if points >= _TRIM_FROM:
        trim()


_TRIM_FROM = 1 << 18  # points (2 MiB per float64 array)


def start_zone(
    steps: np.ndarray, warmup_end: int | None, window: int, interval: float | None = None
) -> float | None:
    """Last step of the start of training, where spikes need two-sided confirmation: the LR
    warm-up, and at least the first ``window`` logged points. None when the log starts
    mid-training (its step numbers say so). ``steps`` are the series' finite points;
    ``interval`` their :func:`~forensics.evidence.robust.median_interval` when known."""
    if len(steps) == 0:
        return None
    if interval is None:
        interval = robust.median_interval(steps)
    if steps[0] > 2 * interval + 1:
        return None
    first_points = float(steps[min(window, len(steps)) - 1])
    return max(float(warmup_end or 0), first_points)


def step_intervals(steps: np.ndarray) -> tuple[float, float]:
    """``robust.median_interval(steps)`` (the median of the positive step differences) and
    the shapes' interval, ``np.median(np.diff(steps))`` (1.0 for fewer than two points), bit
    for bit. Sorted integer steps differ by small counts: both medians are read from one
    count of each difference (:func:`~forensics.evidence.order_stats.median_of_counts`)
    instead of copies and a sort of a million differences. Other steps take the plain
    computations."""
    if len(steps) < 2:
        return robust.median_interval(steps), 1.0
    counts = robust.counted_differences(steps)  # (a block at a time)
    if counts is not None:
        positive = order_stats.median_of_counts(counts[1:], offset=1)
        return (1.0 if positive is None else positive), order_stats.median_of_counts(counts) or 0.0
    return robust.median_interval(steps), median_of_ints(np.diff(steps))


__all__ = [
    "Spike",
    "SpikeSearch",
    "alarm_line",
    "find_spikes",
    "start_zone",
    "step_intervals",
]
