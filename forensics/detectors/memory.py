"""memory_growth: device memory that keeps climbing without levelling off (section 2.4).

Memory normally rises during the first steps (allocator caches, optimizer state) and then
holds. Memory that is still climbing at the end of the log, at a rate comparable to its
climb over the whole run, points at fragmentation or a leak (tensors kept alive across steps).
The first ``skip_frac`` of the log is left out (start-up), spikes are filtered, and two
Theil-Sen slopes are compared: over the analysed part and over its last third. It is flagged
when both are measurably positive, the late slope keeps at least half the overall pace (no
levelling off), and the total growth is a noticeable share of the level.

Judged against: `analysed_from` (first step of the analysed part, after ``skip_frac``),
`min_growth_pct` (the growth it had to reach), `level_off` (the late/overall slope ratio it
had to keep), `late_slope_floor_per_1k_steps` (level_off x the overall slope).

Levels are in the logged series' units; the unit is the one the run read from the metric name
(:meth:`Run.unit`: ``memory/rss_mb``: MB; ``mem-allocated-bytes``: bytes, shown in GB, or MB
below a gigabyte) and shown in the summary ("grew 3.1 GB over 4000 steps").

The measures of its finding kinds are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

import numpy as np

from forensics.evidence import Evidence
from forensics.evidence.trend_utils import bin_median, stepped_hinge, theil_sen, unit_for
from forensics.findings import Finding, FindingKind, Severity
from forensics.params import MemoryParams
from forensics.schema import MEMORY

CHECK = "memory_growth"


class MemoryGrowthDetector:
    """Flags memory that climbs steadily to the end of the log."""

    name = CHECK

    def __init__(self, params: MemoryParams | None = None) -> None:
        self.params = params or MemoryParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        mem = ev.series(MEMORY)
        x, y = mem.steps, mem.values
        if len(x) < self.params.min_points:
            what = "no memory series" if len(x) == 0 else f"only {len(x)} memory points"
            ev.run.note(f"{CHECK}: not run, {what}")
            return []
        keep = ev.despiked(MEMORY)  # despike(y)
        if not keep.any():
            return []  # (nothing to fit)
        # x[keep][x[keep] >= start], without the despiked copy of the whole series
        first, last = int(np.argmax(keep)), len(keep) - 1 - int(np.argmax(keep[::-1]))
        start = x[first] + self.params.skip_frac * (x[last] - x[first])
        keep &= x >= start
        xs, ys = x[keep], y[keep]
        del keep
        if len(xs) < self.params.min_points // 2:
            return []
        overall = theil_sen(xs, ys)
        late_sel = xs >= xs[0] + (2.0 / 3.0) * (xs[-1] - xs[0])
        late = theil_sen(xs[late_sel], ys[late_sel])
        if overall is None or late is None or not overall.rising or not late.rising:
            return []
        if late.slope < self.params.level_off * overall.slope:
            return []  # the climb is slowing down: levelling off
        # Onset: where the growth bends up (a leak may start after start-up), else the analysed
        # start.
        xb, yb = bin_median(xs.astype(float), ys, max_bins=100)
        h = stepped_hinge(xb, yb)
        bent = h is not None and h[2] > max(h[1], 0) and h[1] <= 0.25 * h[2]
        onset = int(h[0]) if h is not None and bent else int(xs[0])
        # (the steps the fitted bend cannot be told from: Hinge.range)
        onset_range = h.range if h is not None and bent else None
        # The levels are the logged ones, not the fitted line's: a flat stretch before the
        # onset pulls the line's start far below any logged value (the memory_growth sample's
        # line began at 257 MB where its log sat at 368). Each is a bin's median, stated at
        # that bin's median step: the bin nearest the onset and the last one.
        j = int(np.argmin(np.abs(xb - onset)))
        a, a_step, b, b_step = float(yb[j]), int(round(xb[j])), float(yb[-1]), int(round(xb[-1]))
        growth = (b - a) / abs(a) if a else np.inf
        if growth < self.params.min_growth:
            return []
        dur = int(xs[-1] - onset)
        unit = unit_for(ev.run, MEMORY, level=max(abs(a), abs(b)))
        # A leak takes memory where it has not been. A climb that ends no higher than the
        # run's memory already stood before it is a cycle it has been through (a cache filled
        # and emptied every N steps; the log ended mid-cycle), not growth.
        earlier = xb < onset
        if earlier.any() and b <= float(yb[earlier].max()):
            k = int(np.argmax(np.where(earlier, yb, -np.inf)))
            ev.run.note(
                f"{CHECK}: memory climbed from {unit.show(a, 3)} at step {a_step:,} to "
                f"{unit.show(b, 3)} at step {b_step:,}, no higher than the "
                f"{unit.show(float(yb[k]), 3)} it stood at around step {int(round(xb[k])):,}: "
                "a cycle the run has been through before, not a leak"
            )
            return []
        # Cycles on a rising floor (memory freed and filled again before the onset: a drop
        # of more than half the climb): the hinge finds the last cycle's climb, not the leak.
        # The growth is then that of the cycles' lows, from the first to the last third.
        # A cycle frees memory at once and fills it over several bins: its drops dwarf its
        # rises. Noise (memory sampled at any phase of a step) drops and rises alike, so a
        # drop no larger than twice the largest rise is no cycle (white noise of 1,500 MB
        # read as "cycles on a rising floor" from the analysed start, 6,000 steps before the
        # leak began).
        moves = np.diff(yb[earlier]) if earlier.sum() >= 2 else np.zeros(0)
        drop = -float(moves.min()) if len(moves) else 0.0
        rise = max(float(moves.max()), 0.0) if len(moves) else 0.0
        cycles = bool(len(moves) and drop > 0.5 * (b - a) and drop > 2.0 * rise)
        if cycles:
            third = (xb[-1] - xb[0]) / 3.0
            lo1 = int(np.argmin(np.where(xb <= xb[0] + third, yb, np.inf)))
            lo2 = int(np.argmin(np.where(xb >= xb[-1] - third, yb, np.inf)))
            a, a_step, b, b_step = (
                float(yb[lo1]),
                int(round(xb[lo1])),
                float(yb[lo2]),
                int(round(xb[lo2])),
            )
            onset, onset_range = int(xs[0]), None
            growth = (b - a) / abs(a) if a else np.inf
            dur = int(xs[-1] - onset)
            if growth < self.params.min_growth:
                return []
        span = b_step - a_step
        pace = f", {unit.show(1000.0 * (b - a) / span, 3)} per 1k steps" if span > 0 else ""
        late_pace = unit.show(late.per_1k(), 3)
        # (the pace from the two stated levels is what a reader checks against them; whether it
        # levels off is judged on the fitted trend, overall against the last third: both given)
        return [
            Finding(
                kind=FindingKind.MEMORY_GROWTH,
                severity=Severity.WARNING,
                metric=MEMORY,
                start_step=onset,
                peak_step=int(xs[int(np.argmax(ys))]),
                end_step=int(xs[-1]),
                onset_range=onset_range,
                measures={
                    "start_level": a,
                    "end_level": b,
                    "start_level_step": a_step,
                    "end_level_step": b_step,
                    "growth_pct": 100.0 * growth,
                    "slope_per_1k_steps": overall.per_1k(),
                    "late_slope_per_1k_steps": late.per_1k(),
                    "late_ratio": late.slope / overall.slope,
                    "duration_steps": dur,
                    "unit": unit.source,
                },
                judged_against={
                    "analysed_from": float(start),
                    "min_growth_pct": 100.0 * self.params.min_growth,
                    "level_off": self.params.level_off,
                    "late_slope_floor_per_1k_steps": self.params.level_off * overall.per_1k(),
                },
                summary=(
                    (
                        "Memory cycles (freed and filled again) on a rising floor: its lows "
                        f"rose {unit.show(b - a, 3)} over {span:,} steps without levelling off"
                        if cycles
                        else f"Memory grew {unit.show(b - a, 3)} over {span:,} steps without "
                        "levelling off"
                    )
                    + f", from {unit.show(a, 3)} at step {a_step:,} to {unit.show(b, 3)} at step "
                    f"{b_step:,} (+{100 * growth:.0f}%{pace}; its fitted trend "
                    f"{unit.show(overall.per_1k(), 3)} per 1k steps overall and {late_pace} per 1k "
                    "steps over the last third)"
                    + (
                        "."
                        if unit.stated
                        else " (the log does not state the unit; values this large can only "
                        "be bytes)."
                        if unit.raw == "bytes"
                        else " (the log does not state the unit)."
                    )
                ),
            )
        ]
