"""throughput_drop: a sustained fall of throughput well below its recent normal (sections 2.4
and 7.1).

The article's rule of thumb: throughput suddenly down by 30% usually means a data-loading
bottleneck or a GPU clocking down; persistently low throughput points at the input pipeline,
throttling or communication. The series is smoothed with a short centered median and
compared with a trailing rolling median (the baseline); a drop starts where the smoothed rate
falls below (1 - 30%) of the baseline frozen there and lasts until it is back above 85% of it
(half the drop: a rate hovering at the line crosses it back and forth by its noise). It is a
drop when it spans at least ``min_points`` logged points and its median is below the line, so
a handful of isolated slow steps (which the centered median removes) is not one; a stretch
whose median is above the line is a note unless its first dip under the line is clearly
below it (by twice its noise), which is then the drop, worded as a partial recovery. A short dip
(at most ``min_points`` logged intervals) that begins at the eval or checkpoint interval the
log reveals (``Evidence.revealed_periods``) is the job's own housekeeping: the stall detector
notes it (``info``), this detector does not call it a drop. Three or more recovered drops
whose starts lie on one fixed grid (at three in four of its points), each at most a tenth of
the interval long, are a pause on a schedule the log does not otherwise show (a checkpoint
save every 1,000 steps): each is a note naming the interval, the count and the share of the
run's time they cost (``recurs_every``, ``recurrences``, ``time_lost_pct``); a drop off the
grid keeps its warning.
A slow decline slips under that rule (the rolling baseline goes down with the rate): the log's
last tenth is also compared with its early tenth (after the first twentieth, start-up), and
30% or more lower on a falling Theil-Sen trend is a drop of ``shape`` gradual, unless a drop
found above is still open at the end of the log.
When only the step time is logged, its inverse is used: 30% fewer tokens/s is a step time
1/0.7 = 1.43x longer, and the finding says the step time rose.

Units are the ones the run read from the logged name (:meth:`Run.unit`: ``tok/s``,
``step_time (ms)``...; ``iteration-time`` is Megatron's seconds): step times are shown in their
own unit per step (ms/step, s/step), and a name that states no unit is assumed to be tokens/s
or s/step and said so.

Judged against: `baseline` (the frozen rolling median, in `unit`), `drop_ratio` (0.3),
`drop_line` (the level the smoothed series fell below: (1 - 0.3) x baseline in tokens/s, or
baseline / 0.7 in s/step), `baseline_points` (the rolling window), `min_points`.

The measures of its finding kinds are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from forensics.evidence import Evidence
from forensics.evidence.robust import median_interval
from forensics.evidence.rolling import (
    polars_trailing_median,
    polars_trailing_median_at,
    window_max,
)
from forensics.evidence.spike_context import Period
from forensics.evidence.trend_utils import (
    Unit,
    bin_median,
    first_at_least,
    grid_distance,
    hinge_onset,
    housekeeping_at,
    robust_sigma,
    rolling_median,
    theil_sen,
    unit_for,
    window_max_pieces,
)
from forensics.findings import Finding, FindingKind, MeasureValue, Severity
from forensics.params import ThroughputParams
from forensics.schema import STEP_TIME, THROUGHPUT

CHECK = "throughput_drop"
_CHUNK = 1 << 16


def work_rate(ev: Evidence) -> tuple[str, np.ndarray, np.ndarray]:
    """(source metric, steps, work per second): the throughput, else the inverse step time."""
    tp = ev.series(THROUGHPUT)
    if len(tp):
        return THROUGHPUT, tp.steps, tp.values
    st = ev.series(STEP_TIME)
    ok = st.values > 0
    return STEP_TIME, st.steps[ok], 1.0 / st.values[ok]


class ThroughputDetector:
    """Flags sustained stretches where throughput falls 30% below its rolling baseline."""

    name = CHECK

    def __init__(self, params: ThroughputParams | None = None) -> None:
        self.params = params or ThroughputParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        run = ev.run
        metric, x, y = work_rate(ev)
        if len(x) == 0:
            run.note(
                f"{CHECK}: not run, the run logged neither throughput (tokens/s) nor step time"
            )
            return []
        if len(x) < self.params.min_history + self.params.min_points:
            run.note(f"{CHECK}: not run, only {len(x)} throughput points")
            return []
        # a typical step time (the inverse of the work rate) picks ms or s for showing it
        unit = unit_for(
            run, metric, level=float(np.median(1.0 / y)) if metric == STEP_TIME else None
        )
        every = median_interval(x) if len(x) > 1 else 1.0
        smooth = rolling_median(y, self.params.smooth_points)
        limit = 1.0 - self.params.drop
        below, base = self._below(y, smooth, limit)
        out: list[Finding] = []
        i, n = 0, len(y)
        starts = np.flatnonzero(below)
        while i < n:  # one iteration per drop episode, its start found by a search
            at_start = int(np.searchsorted(starts, i))
            if at_start == len(starts):
                break
            i = int(starts[at_start])
            frozen = base[i]  # the baseline before the drop, not one the drop drags down
            # Recovered once back above half the drop (85% of the baseline), not at the drop
            # line: a rate that stays near the line crosses it back and forth by its noise,
            # and a sustained 31% drop read as three short dips that each "recovered".
            j = first_at_least(smooth, i, (1.0 - self.params.drop / 2) * frozen)
            short = x[j - 1] - x[i] <= self.params.min_points * every
            at = housekeeping_at(ev.revealed_periods, float(x[i]), every)
            if j - i >= self.params.min_points and not (short and at and j < n):
                lvl = float(np.median(y[i:j]))
                # the first stretch under the line itself (the end before the recovery line)
                back = np.flatnonzero(smooth[i:j] >= limit * frozen)
                k = i + int(back[0]) if len(back) else j
                if lvl < limit * frozen:
                    out.append(self._finding(metric, unit, x, y, i, j, frozen))
                elif k - i >= self.params.min_points and self._clearly_under(
                    y, i, k, limit * frozen
                ):
                    # a deep dip, then a long stretch between the line and the recovery line:
                    # the dip is the drop, and the rate came back over the line, not to 85%
                    out.append(self._finding(metric, unit, x, y, i, k, frozen, partial=True))
                    j = k  # a later, deeper dip in the same slow stretch is its own finding
                else:  # crossed by its noise: its level over the stretch is above the line
                    run.note(
                        f"{CHECK}: the rate dipped under the {self.params.drop:.0%} line from "
                        f"step {int(x[i]):,} to {int(x[j - 1]):,}, but its median there is "
                        f"{1.0 - lvl / frozen:.0%} below its baseline: not a drop by that line"
                    )
            i = max(j, i + 1)
        _recurring(out, ev, every)
        if not any(f.end_step == int(x[-1]) for f in out):  # (a drop the log ends in says it)
            slow = self._gradual(metric, unit, x, y)
            if slow is not None:
                out.append(slow)
        return out

    def _gradual(self, metric: str, unit: Unit, x: np.ndarray, y: np.ndarray) -> Finding | None:
        """A slow decline: the rate over the log's last tenth is ``drop`` (30%) or more below
        its level early on (the tenth after the first twentieth: start-up left out), on a
        falling trend, with no single drop that deep (each point within 30% of the 100 before
        it, so the drop check's rolling baseline went down with it). The onset is where the
        decline bends away from the early level (a fitted hinge), else the early window's
        end."""
        n = len(y)
        skip = max(self.params.min_history, n // 20)
        w = max(self.params.decline_points, n // 10)
        if n < skip + 2 * w:
            return None
        early = float(np.median(y[skip : skip + w]))
        late = float(np.median(y[n - w :]))
        if not early > 0 or 1.0 - late / early < self.params.drop:
            return None
        trend = theil_sen(x[skip:], y[skip:])
        if trend is None or not trend.falling:
            return None
        xb, yb = bin_median(x[skip:].astype(float), y[skip:], max_bins=100)
        h = hinge_onset(xb, -yb)  # (where the rate bends down)
        bent = h is not None and h.after > max(h.before, 0.0) and h.before <= 0.25 * h.after
        onset = int(h.onset) if h is not None and bent else int(x[skip + w - 1])
        onset_range = h.range if h is not None and bent else None
        if onset >= int(x[n - w]):  # (a bend inside the last window: no slow decline)
            return None
        drop_pct = 100.0 * (1.0 - late / early)
        step_time = metric == STEP_TIME
        as_units = (lambda v: 1.0 / v) if step_time else (lambda v: v)
        assumed = f" ({unit.assumed})" if unit.assumed else ""
        a0, a1 = int(x[skip]), int(x[skip + w - 1])
        b0, end = int(x[n - w]), int(x[-1])
        if step_time:
            what = (
                f"Step time rose slowly from {unit.show(1.0 / early)} to {unit.show(1.0 / late)}"
                f"{assumed} (over steps {a0:,}-{a1:,} and over the last {w:,} points, steps "
                f"{b0:,}-{end:,}), throughput {drop_pct:.0f}% below its early level,"
            )
        else:
            what = (
                f"Throughput declined slowly to {drop_pct:.0f}% below its early level "
                f"({unit.show(early)} over steps {a0:,}-{a1:,} -> {unit.show(late)} over the "
                f"last {w:,} points, steps {b0:,}-{end:,}{_inside(unit)}),"
            )
        low = int(round(xb[int(np.argmin(yb))]))
        return Finding(
            kind=FindingKind.THROUGHPUT_DROP,
            severity=Severity.WARNING,
            metric=metric,
            start_step=onset,
            peak_step=max(low, onset),
            end_step=end,
            onset_range=onset_range,
            measures={
                "source": metric,
                "shape": "gradual",
                "baseline": as_units(early),
                "level": as_units(late),
                "drop_pct": drop_pct,
                "window_steps": end - onset,
                "n_points": w,
                "baseline_n": w,
                "recovered": False,
                "unit": unit.source,
            },
            judged_against={
                "baseline": as_units(early),
                "drop_ratio": self.params.drop,
                "drop_line": as_units((1.0 - self.params.drop) * early),
                "baseline_points": w,
                "min_points": self.params.min_points,
            },
            summary=(
                f"{what} from about step {onset:,}, with no single drop that deep (its "
                f"{self.params.smooth_points}-point median never fell {self.params.drop:.0%} "
                f"under the median of the {self.params.baseline_points:,} points before it), "
                "and had not recovered when the log ends; both are medians."
            ),
        )

    def _clearly_under(self, y: np.ndarray, i: int, k: int, line: float) -> bool:
        """The median of ``y[i:k]`` is under ``line`` by more than twice its own noise: a dip
        that only grazes the line is the rate's noise. The noise is the rate's over the
        baseline window before (:func:`robust_sigma`: blind to a trend there), over
        sqrt(k - i)."""
        spread = robust_sigma(y[max(0, i - self.params.baseline_points) : i])
        return float(np.median(y[i:k])) < line - 2.0 * 1.2533 * spread / np.sqrt(k - i)

    def _below(
        self, y: np.ndarray, smooth: np.ndarray, limit: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Where the smoothed rate is under ``limit`` x the baseline before the point, and
        that baseline: polars' trailing rolling median of the ``baseline_points`` points before
        (NaN with fewer than ``min_history``). The baseline is exact where the rate is below
        it and NaN elsewhere, where nothing reads it.

        A median is at most its window's largest value, so a point whose smoothed rate is not
        under ``limit`` x that largest value is not below its baseline: the baseline is
        selected at the other points only (a few, where two rank-filter passes would cover
        the whole series)."""
        w, m = self.params.baseline_points, self.params.min_history
        if limit > 0:  # (limit x a larger value is larger)
            # the largest of the w points before each point (window_max(y, -w, w)), a piece
            # at a time: only the candidates are kept
            found = [np.array([], dtype=np.intp)]
            with np.errstate(invalid="ignore"):  # (anything not provably above: a candidate)
                for lo, hi, bound in window_max_pieces(y, -w, w, window_max):
                    found.append(lo + np.flatnonzero(~(smooth[lo:hi] >= limit * bound)))
            cand = np.concatenate(found)
            cand = cand[cand >= 1]
            base = np.full(len(y), np.nan)
            base[cand] = polars_trailing_median_at(y, w, m, cand - 1)
        else:
            # polars' trailing rolling median (nulls as NaN), shifted one point
            trail = polars_trailing_median(y, w, m)
            base = np.concatenate([[np.nan], trail[:-1]]) if len(trail) else trail
        below = np.empty(len(y), dtype=bool)  # smooth < limit * base, a piece at a time
        for lo in range(0, len(y), _CHUNK):
            hi = lo + _CHUNK
            np.less(smooth[lo:hi], limit * base[lo:hi], out=below[lo:hi])
        return below, base

    def _finding(
        self,
        metric: str,
        unit: Unit,
        x: np.ndarray,
        y: np.ndarray,
        i: int,
        j: int,
        frozen: float,
        partial: bool = False,
    ) -> Finding:
        lvl = float(np.median(y[i:j]))
        n_base = min(self.params.baseline_points, i)  # the trailing median's points before i
        drop_pct = 100.0 * (1.0 - lvl / frozen)
        recovered = j < len(y)
        end = int(x[j - 1])
        step_time = metric == STEP_TIME
        as_units = (lambda v: 1.0 / v) if step_time else (lambda v: v)
        peak = i + int(np.argmin(y[i:j]))
        limit = 1.0 - self.params.drop
        assumed = f" ({unit.assumed})" if unit.assumed else ""
        if step_time:
            what = (
                f"Step time rose from {unit.show(frozen**-1)} to {unit.show(lvl**-1)}"
                f"{assumed}, throughput {drop_pct:.0f}% below its recent level,"
            )
        else:  # (inside the parenthesis, the assumption after a semicolon: not nested)
            what = (
                f"Throughput fell {drop_pct:.0f}% below its recent level "
                f"({unit.show(frozen)} -> {unit.show(lvl)}{_inside(unit)})"
            )
        return Finding(
            kind=FindingKind.THROUGHPUT_DROP,
            severity=Severity.WARNING,
            metric=metric,
            start_step=int(x[i]),
            peak_step=int(x[peak]),
            end_step=end,
            measures={
                "source": metric,
                "shape": "sudden",
                "baseline": as_units(frozen),
                "level": as_units(lvl),
                "drop_pct": drop_pct,
                "window_steps": end - int(x[i]),
                "n_points": j - i,
                "baseline_n": n_base,
                "recovered": recovered and not partial,
                "unit": unit.source,
                "recurs_every": None,
                "recurrences": None,
                "time_lost_pct": None,
            },
            judged_against={
                "baseline": as_units(frozen),
                "drop_ratio": self.params.drop,
                "drop_line": as_units(limit * frozen),
                "baseline_points": self.params.baseline_points,
                "min_points": self.params.min_points,
            },
            summary=(
                f"{what} from step {int(x[i]):,} to {end:,}"
                + (
                    f", then came back over the {self.params.drop:.0%} line but not to its "
                    f"level before (under {1.0 - self.params.drop / 2:.0%} of it)"
                    if partial
                    else ", then recovered"
                    if recovered
                    else ", and had not recovered when the log ends"
                )
                # (the chart shows single points: say what the two numbers are)
                + f"; both are medians, of the {n_base:,} points before and the {j - i:,} within."
            ),
        )


# Recurring dips: at least this many recovered sudden drops, their starts this regular (each
# gap within the larger of two logging intervals and this share of the period), each at most
# this share of the period long.
_RECUR_MIN = 3
_RECUR_SLACK = 0.02
_RECUR_SHARE = 0.5  # of the recovered sudden drops, at least this share on the grid
_RECUR_FEW = 60  # among this many drops or fewer, a grid holding less is judged by chance
_RECUR_CHANCE = 1e-3  # a grid the log does not explain: kept when chance makes one this rarely
_RECUR_WIDTH = 0.1


def _recurring(out: list[Finding], ev: Evidence, every: float) -> None:
    """Recovered sudden drops that come back at one fixed interval, each short beside it, are
    a pause the job takes on a schedule (an evaluation, a checkpoint save: the dip a save every
    1,000 steps leaves), not a throughput problem: each becomes a note that names the interval,
    the count and the share of the run's time they cost. Nine such dips had read as nine
    separate warnings and nine incidents."""
    cand = [
        f
        for f in out
        if f.measures["shape"] == "sudden" and f.measures["recovered"] and f.end_step is not None
    ]
    if len(cand) < _RECUR_MIN:
        return
    revealed = ev.revealed_periods
    dips, period = _on_one_grid(cand, every, revealed)
    if not dips:
        return
    # The time the dips cost: each of their steps took baseline / level of a usual step.
    source = str(dips[0].measures["source"])
    extra = sum(int(f.measures["n_points"] or 0) * _slowdown(f.measures, source) for f in dips)
    n_logged = len(ev.logged(source).steps)
    lost = 100.0 * extra / (n_logged + extra) if n_logged else 0.0
    at = _logged_interval(revealed, dips, period, every)
    named = (
        f"on the {at.replace('_', ' ')} the log reveals"
        if at
        else "as an evaluation or a checkpoint save makes (the log shows none at this interval)"
    )
    p = int(period)
    where = {id(f): i for i, f in enumerate(out)}
    for k, f in enumerate(dips, 1):
        out[where[id(f)]] = replace(
            f,
            severity=Severity.INFO,
            measures={
                **f.measures,
                "recurs_every": p,
                "recurrences": len(dips),
                "time_lost_pct": lost,
            },
            summary=f.summary
            + (
                f" Dip {k} of {len(dips)} recurring every {p:,} steps (steps "
                f"{dips[0].start_step:,}-{dips[-1].end_step:,}), each short beside that "
                f"interval: a pause the job takes on a schedule, {named}; together about "
                f"{lost:.1f}% of the run's time: a cost of that schedule, not a fault of the "
                "hardware or the data loader."
            ),
        )


def _on_one_grid(
    cand: list[Finding], every: float, revealed: Mapping[str, Period] | None = None
) -> tuple[list[Finding], int]:
    """The largest set of ``cand`` (by start) whose starts lie on one grid ``origin + k *
    period`` (within the larger of two logging intervals and 2% of the period), at least
    :data:`_RECUR_MIN` of them, present at three in four of the grid's points between the
    first and the last, and each at most a tenth of the period long, with that period; ([],
    0) when there is none. A drop off the grid (a real one among the scheduled dips) stays a
    drop.

    The set holds at least half of ``cand`` and lies on an evaluation or save interval the log
    itself shows (``revealed``: :attr:`Evidence.revealed_periods`). Otherwise drops at random
    steps must put as many as close to a grid less than once in a thousand (:func:`_by_chance`,
    over the grids tried): among more than :data:`_RECUR_FEW` drops only for a set of half of
    them. Half of six drops at random steps over 10k steps, three evenly spaced within 2% of
    their period, were read as a schedule in 142 sets of 300; thousands put some dozens on a
    grid (54 of 4,000 random drops over 1M steps sat on a grid of 3,461 steps at three in four
    of its points); a few drops beside a checkpoint's dips still leave the dips a schedule.
    The price: three dips a few steps off an even spacing, among other drops and on no
    interval the log shows, are not told from chance and stay drops."""
    n = len(cand)
    best, period, tries = _grid(cand, every, max(_RECUR_MIN, math.ceil(_RECUR_SHARE * n)))
    if best and (
        _logged_interval(revealed or {}, best, period, every) is not None
        or _by_chance(cand, best, period, every) * tries <= _RECUR_CHANCE
    ):
        return best, period
    if n > _RECUR_FEW:
        return [], 0
    best, period, tries = _grid(cand, every, _RECUR_MIN)
    if best and _by_chance(cand, best, period, every) * tries <= _RECUR_CHANCE:
        return best, period
    return [], 0


def _logged_interval(
    revealed: Mapping[str, Period], on: list[Finding], period: int, every: float
) -> str | None:
    """The evaluation or save interval of the log (``eval_interval``, ``checkpoint_interval``)
    that the grid of ``on`` follows: its period a whole multiple of the interval and its first
    drop starting on the interval's grid, each within the grid's slack; else None."""
    slack = max(2.0 * every, _RECUR_SLACK * period)
    for name in ("eval_interval", "checkpoint_interval"):
        p = revealed.get(name)
        if p is None or not p.steps > slack:
            continue
        k = round(period / p.steps)
        if k >= 1 and abs(period - k * p.steps) <= slack:
            if grid_distance(float(on[0].start_step), p.steps, p.origin) <= slack:
                return name
    return None


def _grid(cand: list[Finding], every: float, need: int) -> tuple[list[Finding], int, int]:
    """:func:`_on_one_grid`'s search for a set of at least ``need``, with the number of grids
    (period and origin) it could have tried. Periods are tried in increasing order and
    origins in step order, a set replacing the best only when larger; a period or an origin
    that cannot hold that many is passed over (trying each origin of each period took time
    cubic in the drops: 75 s for 4,000)."""
    n = len(cand)
    starts = np.array([f.start_step for f in cand], dtype=np.int64)
    widths = np.array([(f.end_step or f.start_step) - f.start_step for f in cand])
    best: list[Finding] = []
    best_period = tries = 0
    # (the periods tried: the gaps to the next two starts, so that a drop off the grid
    # between two scheduled dips still leaves their gap among them)
    gaps = np.concatenate([starts[1:] - starts[:-1], starts[2:] - starts[:-2]])
    gaps = np.sort(gaps[gaps > 0])
    for period in (int(p) for p in np.unique(gaps)):
        slack = max(2.0 * every, _RECUR_SLACK * period)
        if not period > 2 * slack:
            continue
        tries += n
        # m >= n / 2 starts on the grid at three in four of its points have at least 2m/3 - 1
        # neighbours one grid point apart, at most (n - m) / 2 of them with two or more
        # other starts between: at least n / 12 - 1 gaps to the next two starts are within
        # two slacks of the period.
        close = np.searchsorted(gaps, period + 2 * slack, "right") - np.searchsorted(
            gaps, period - 2 * slack, "left"
        )
        if 2 * need >= n and close < n / 12 - 2:
            continue
        # How many starts share each one's phase on this grid (on either side of it): no
        # origin's set can be larger.
        mine = starts % period
        phase = np.sort(mine)
        ring = np.concatenate([phase - period, phase, phase + period])
        near = np.searchsorted(ring, mine + slack, "right") - np.searchsorted(
            ring, mine - slack, "left"
        )
        for i in np.flatnonzero(near >= max(need, len(best) + 1)):
            if n - i < max(need, len(best) + 1):
                break
            d = (starts[i:] - starts[i]) % period
            at = i + np.flatnonzero(np.minimum(d, period - d) <= slack)
            if len(at) < max(need, len(best) + 1):
                continue
            points = round((starts[at[-1]] - starts[i]) / period) + 1
            if len(at) < 0.75 * points:
                continue
            if (widths[at] > _RECUR_WIDTH * period).any():
                continue
            best, best_period = [cand[k] for k in at], period
    return best, best_period, tries


def _by_chance(cand: list[Finding], on: list[Finding], period: int, every: float) -> float:
    """How likely drops at random steps reach as many points of one given grid as closely as
    ``on`` does: each grid point after the first is within ``tol`` steps of one of the other
    drops with the chance ``q`` that ``len(cand) - 1`` random starts over the drops' span give
    it; at least as many of those points as ``on`` reaches after its first (the binomial
    tail). ``tol`` is the farthest of ``on`` from its point (at least two logging intervals,
    the precision of a start; at most the grid's slack): dips a save makes start within a step
    or two of theirs, where random drops on the grid lie anywhere within its 2%. Points, not
    drops: two drops beside one grid point are one point reached."""
    from scipy.stats import binom

    span = cand[-1].start_step - cand[0].start_step + 1
    first = on[0].start_step
    lag = [f.start_step - first for f in on]
    off = max(abs(d - round(d / period) * period) for d in lag)
    tol = min(max(2.0 * every, _RECUR_SLACK * period), max(2.0 * every, float(off)))
    q = 1.0 - math.exp(-(len(cand) - 1) * (2 * tol + 1) / span)
    reached = {round(d / period) for d in lag} - {0}
    points = round((on[-1].start_step - first) / period)
    return float(binom.sf(len(reached) - 1, points, min(q, 1.0)))


def _slowdown(m: Mapping[str, MeasureValue], source: str) -> float:
    """How much longer than a usual step a step of the dip took (0.4 = 40% longer)."""
    base, level = float(m["baseline"] or 0.0), float(m["level"] or 0.0)
    if source == STEP_TIME:  # (seconds a step: longer is slower)
        return max(0.0, level / base - 1.0) if base > 0 else 0.0
    return max(0.0, base / level - 1.0) if level > 0 else 0.0


def _inside(unit: Unit) -> str:
    """The unit's assumption for a sentence's own parenthesis: after a semicolon, so the
    parentheses do not nest ("... tokens/s; tokens/s assumed: the log states no unit)")."""
    return f"; {unit.assumed}" if unit.assumed else ""
