"""stall: a wall-clock gap between logged steps far beyond the usual step time.

A hang (a stuck collective, a dead data worker) or a pre-emption shows up as a long silence
between two consecutive logged steps. The usual time per step is the median of wall-time
increments divided by step increments along the main training series. A gap is a stall when
it is both ``factor`` times longer than that expectation and at least ``min_seconds`` long.
Regular pauses (evaluations, checkpoints) are not stalls: when candidate gaps line up with
val/eval steps, their typical length sets the bar, and only gaps several times longer than a
normal pause are reported. Gaps across a restart are left to the ``restart`` finding.

Slow steps in the step-time (or throughput) series the log records are read too: a step
``slow_factor`` x slower than the rolling median that stays isolated (shorter than a
throughput drop's ``min_points``) is the job's housekeeping when it sits at the eval or
checkpoint interval the log reveals (``Evidence.revealed_periods``): one ``info`` finding
names them all. An isolated step ``factor`` x slower than usual (and at least ``min_seconds``
long, when its time is known in seconds) is a stall wherever it sits. Three or more stalls
(silences of the wall clock, or such hangs) are one finding with each one's step
(``events_at``), their count (``stalls``) and the share of the time they took
(``time_lost_pct``). Step times are read in the unit their name states (``step_time (ms)``:
milliseconds).

Pauses too short to be stalls can still cost the run: intervals ``slow_factor`` x the usual
pace that together take the throughput detector's ``drop`` share (30%) of the wall time or
more are one warning (``pauses``, ``time_lost_pct``), leaving out the stalls and the pauses at
the evaluations or save interval the log shows. A rate the log measures within a step
(tokens/s) never shows them. A log without a wall clock is judged the same way from its
isolated slow steps (each step's time the inverse of its rate).

Judged against: `factor` and `expected_seconds` (factor x the usual interval), `min_seconds`,
`pause_factor` and `usual_pause_seconds`, and `stall_line_seconds`: the silence a gap had to
exceed, the largest of factor x expected_seconds, min_seconds and pause_factor x the usual
pause. The clock is the run's wall times (not a vital sign: no ``Evidence.series``).

The measures of its finding kinds are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from forensics.evidence import Evidence
from forensics.evidence.order_stats import median_value
from forensics.evidence.robust import median_interval
from forensics.evidence.rolling import centered_median_at, pieces, window_max
from forensics.evidence.trend_utils import (
    grid_distances,
    housekeeping_at,
    unit_for,
    window_max_pieces,
)
from forensics.findings import Finding, FindingKind, MeasureValue, Severity
from forensics.params import StallParams
from forensics.run import Run
from forensics.schema import EVAL_PREFIX, LOSS, STEP_TIME, VAL_LOSS

CHECK = "stall"


class StallDetector:
    """Flags long silences in wall time between consecutive logged steps."""

    name = CHECK

    def __init__(self, params: StallParams | None = None) -> None:
        self.params = params or StallParams()

    def _clock(self, run: Run) -> pl.DataFrame | None:
        """step, wall_time, segment of the densest series with wall times (train loss first)."""
        timed = (
            pl.col("wall_time").is_not_null()
            & pl.col("wall_time").is_finite()
            & pl.col("layer").is_null()
        )
        tag = run.metrics().get(LOSS)
        # The loss tag's timed rows first, without copying every timed row of the run.
        rows = (
            run.view()
            .lazy()
            .filter(pl.col("tag") == tag)
            .filter(timed)
            .select("step", "wall_time", "segment")  # only these copied
            .collect()
            if tag is not None
            else None
        )
        if rows is None or rows.height < self.params.min_points:
            v = run.view().filter(timed)
            if v.is_empty():
                return None
            counts = v.group_by("tag").len().sort(["len", "tag"], descending=[True, False])
            rows = v.filter(pl.col("tag") == counts.get_column("tag")[0])
        steps = rows.get_column("step").to_numpy()
        if len(steps) < 2 or bool(np.all(steps[1:] > steps[:-1])):
            # one row per step, in step order: the group-by below would return these rows
            return rows.select("step", "wall_time", "segment")
        return (
            rows.group_by("step")
            .agg(pl.col("wall_time").min(), pl.col("segment").max())
            .sort("step")
        )

    def detect(self, ev: Evidence) -> list[Finding]:
        run = ev.run
        c = self._clock(run)
        if c is None or c.height < self.params.min_points:
            from forensics.detectors.throughput import work_rate

            timed = len(work_rate(ev)[1]) >= self.params.min_points
            run.note(
                f"{CHECK}: "
                + ("wall-clock silences not judged" if timed else "not run")
                + f", the log has no wall-clock times (or fewer than {self.params.min_points})"
                + ("; slow steps judged from the step times" if timed else "")
            )
            return self._slow_steps(ev, [], time_lost=True) if timed else []
        # (the frame's own arrays where they already have the type; each column dropped from
        # the frame once read, so a frame of several chunks, whose arrays are copies, is not
        # held whole beside them)
        steps = c.get_column("step").to_numpy().astype(np.int64, copy=False)
        c = c.drop("step")
        wall = c.get_column("wall_time").to_numpy().astype(float, copy=False)
        c = c.drop("wall_time")
        seg = c.get_column("segment").to_numpy()
        del c
        out, silences = self._wall_stalls(ev, steps, wall, seg)
        del steps, wall, seg
        return out + self._slow_steps(ev, silences)

    def _wall_stalls(
        self, ev: Evidence, steps: np.ndarray, wall: np.ndarray, seg: np.ndarray
    ) -> tuple[list[Finding], list[tuple[int, int]]]:
        """Silences of the wall clock (the steps, wall times and segments of the clock): the
        findings, and the steps each stall lies between (a slow step there is that silence:
        not the whole span of a finding of many, nor the pauses' time-lost finding)."""
        run = ev.run
        # The intervals' seconds (dt) and steps (ds) are made a piece at a time, never whole
        # (two whole-length floats, with their gathers, were most of this detector's memory).
        ok = seg[1:] == seg[:-1]  # same segment
        for lo, hi, dt, ds in _intervals(wall, steps):
            ok[lo:hi] &= (ds > 0) & (dt >= 0)
        if ok.sum() < self.params.min_points - 1:
            run.note(f"{CHECK}: not run, too few ordered wall-clock points")
            return [], []
        rates = np.empty(int(np.count_nonzero(ok)))  # dt[ok] / ds[ok]
        at = 0
        for lo, hi, dt, ds in _intervals(wall, steps):
            m = ok[lo:hi]
            r = dt[m] / ds[m]
            rates[at : at + len(r)] = r
            at += len(r)
        per_step = median_value(rates)
        del rates
        if not per_step > 0:
            run.note(f"{CHECK}: not run, wall times do not advance")
            return [], []
        # over: dt > factor * expected, with expected = ds * per_step; in the same pass the
        # pauses (dt > slow_factor * expected) and the wall time of the ordered intervals
        over = np.empty(len(ok), dtype=bool)
        cand = ok.copy()
        pause = np.empty(len(ok), dtype=bool)
        total = 0.0
        for lo, hi, dt, ds in _intervals(wall, steps):
            pace = ds * per_step
            np.greater(dt, self.params.factor * pace, out=over[lo:hi])
            cand[lo:hi] &= over[lo:hi] & (dt >= self.params.min_seconds)
            m = ok[lo:hi]
            pause[lo:hi] = m & (dt > self.params.slow_factor * pace)
            total += float(dt[m].sum())
        pause &= ~cand  # (the stalls are their own findings)
        lost = self._time_lost(ev, steps, wall, per_step, np.flatnonzero(pause), total)
        del pause
        if not cand.any():
            return lost, []
        # Pauses at val/eval steps are expected; their typical length raises the bar.
        eval_steps = self._eval_steps(run)
        evals = np.fromiter(eval_steps, dtype=np.int64) if eval_steps else np.array([], np.int64)
        at_eval = np.isin(steps[:-1], evals) | np.isin(steps[1:], evals)
        k_pause = np.flatnonzero(ok & at_eval & over)
        pauses = wall[k_pause + 1] - wall[k_pause]  # dt[ok & at_eval & over]
        usual_pause = float(np.median(pauses)) if len(pauses) else None
        if usual_pause is not None:
            k_cand = np.flatnonzero(cand)
            line = self.params.pause_factor * usual_pause
            cand[k_cand] = (wall[k_cand + 1] - wall[k_cand]) > line  # dt > line
        ks = np.flatnonzero(cand)
        silences = [(int(steps[k]), int(steps[k + 1])) for k in ks]
        if len(ks) >= _MIN_PAUSES:
            # Recurring silences are one finding with each one's step (events_at): eight
            # ten-minute pre-emptions had read as eight warnings and eight incidents, and
            # nothing said they took 62% of the run's wall time.
            group = self._wall_group(steps, wall, ks, per_step, usual_pause, total)
            return [group, *lost], silences
        out = []
        for k in ks:
            dt_k = wall[k + 1] - wall[k]  # (np.diff's numbers at k)
            ds_k = float(steps[k + 1] - steps[k])
            expected = float(ds_k * per_step)
            out.append(
                Finding(
                    kind=FindingKind.STALL,
                    severity=Severity.WARNING,
                    metric=None,
                    start_step=int(steps[k]),
                    peak_step=int(steps[k]),
                    end_step=int(steps[k + 1]),
                    measures=_measures(
                        "wall_time",
                        gap=float(dt_k),
                        expected=expected,
                        usual_step=per_step,
                        ratio=float(dt_k / expected),
                        steps_between=int(ds_k),
                        usual_pause=usual_pause,
                    ),
                    judged_against={
                        "factor": self.params.factor,
                        "expected_seconds": expected,
                        "min_seconds": self.params.min_seconds,
                        "pause_factor": self.params.pause_factor,
                        "usual_pause_seconds": usual_pause,
                        "stall_line_seconds": max(
                            self.params.factor * expected,
                            self.params.min_seconds,
                            self.params.pause_factor * usual_pause if usual_pause else 0.0,
                        ),
                    },
                    summary=(
                        f"Nothing was logged for {_human(float(dt_k))} between steps "
                        f"{int(steps[k]):,} and {int(steps[k + 1]):,}, about "
                        f"{dt_k / expected:,.0f}x the usual pace: a hang or a pre-emption."
                    ),
                )
            )
        return out + lost, silences

    def _wall_group(
        self,
        steps: np.ndarray,
        wall: np.ndarray,
        ks: np.ndarray,
        per_step: float,
        usual_pause: float | None,
        total: float,
    ) -> Finding:
        """One warning for three or more silences of the wall clock (``ks``: the interval
        before each), with the share of the wall time (``total``, the ordered intervals')
        they took beyond the usual pace."""
        gaps = wall[ks + 1] - wall[ks]
        ds = (steps[ks + 1] - steps[ks]).astype(float)
        expected = ds * per_step
        ratios = gaps / expected
        share = float((gaps - expected).sum() / total) if total > 0 else None
        longest = int(np.argmax(gaps))
        first, last = int(steps[ks[0]]), int(steps[ks[-1] + 1])
        lo, hi = _human(float(gaps.min())), _human(float(gaps.max()))
        each = lo if lo == hi else f"{lo} to {hi}"
        k_long = int(ks[longest])
        if lo == hi:
            which = f"each about {float(np.median(ratios)):,.0f}x the usual pace"
        else:
            which = (
                f"the longest between steps {int(steps[k_long]):,} and "
                f"{int(steps[k_long + 1]):,}, about {float(ratios[longest]):,.0f}x the usual pace"
            )
        lost = f"; together {_human(float(gaps.sum()))}" + (
            f", {_pct(share)} of the wall time" if share is not None else ""
        )
        return Finding(
            kind=FindingKind.STALL,
            severity=Severity.WARNING,
            metric=None,
            start_step=first,
            peak_step=int(steps[k_long]),
            end_step=last,
            measures=_measures(
                "wall_time",
                gap=float(np.median(gaps)),
                expected=float(np.median(expected)),
                usual_step=per_step,
                ratio=float(np.median(ratios)),
                steps_between=int(np.median(ds)),
                usual_pause=usual_pause,
                stalls=len(ks),
                time_lost=100.0 * share if share is not None else None,
            ),
            judged_against={
                "factor": self.params.factor,
                "min_seconds": self.params.min_seconds,
                "pause_factor": self.params.pause_factor,
                "usual_pause_seconds": usual_pause,
            },
            summary=(
                f"Nothing was logged for {each} at {len(ks):,} points from step {first:,} to "
                f"{last:,} ({which}){lost}: hangs or pre-emptions, recurring."
            ),
            events_at=tuple(int(steps[k]) for k in ks),
        )

    def _time_lost(
        self,
        ev: Evidence,
        steps: np.ndarray,
        wall: np.ndarray,
        per_step: float,
        k: np.ndarray,
        total: float,
    ) -> list[Finding]:
        """Repeated pauses, each too short to be a stall, that together cost as large a share
        of the run's wall time as a throughput drop (30%): one warning naming them all.

        A pause is an interval ``slow_factor`` x longer than the usual pace. The rate a log
        records within a step (tokens/s) does not see the time between steps: a job that hung
        for two minutes every 300 steps of half a second lost 44% of its time and read
        healthy. Not counted: the stalls (each its own warning), the intervals across a
        restart, and pauses at the evaluations or the save interval the log shows (the job's
        own housekeeping, a cost it chose). Less than :data:`_MIN_LOST` seconds lost in all is
        no finding. ``k``: the pauses' intervals (no stall among them); ``total``: the wall
        time of the ordered intervals."""
        p = self.params
        if len(k) < _MIN_PAUSES or not total > 0:
            return []
        # (cheap first: the pauses' whole excess, before the housekeeping ones are taken out)
        gaps = wall[k + 1] - wall[k]
        expected = (steps[k + 1] - steps[k]) * per_step
        if float((gaps - expected).sum()) < ev.params.throughput.drop * total:
            return []
        evals = self._eval_steps(ev.run)
        if evals:
            held = np.fromiter(evals, dtype=np.int64)
            own = np.isin(steps[k], held) | np.isin(steps[k + 1], held)
        else:
            own = np.zeros(len(k), dtype=bool)
        every = median_interval(steps)
        for name in ("eval_interval", "checkpoint_interval"):
            grid = ev.revealed_periods.get(name)
            if grid is None or not grid.steps > 0:
                continue
            # A point of the grid within the pause's two steps, give or take the slack the
            # throughput's schedule allows (a log may write the eval a step or two after).
            slack = max(2.0 * every, 0.02 * grid.steps)
            a, b = steps[k].astype(float), steps[k + 1].astype(float)
            own |= grid_distances(b + slack, grid.steps, grid.origin) <= b - a + 2 * slack
        k, gaps, expected = k[~own], gaps[~own], expected[~own]
        excess = float((gaps - expected).sum())
        share = excess / total
        if len(k) < _MIN_PAUSES or share < ev.params.throughput.drop or excess < _MIN_LOST:
            return []
        worst = int(np.argmax(gaps))
        gap = float(np.median(gaps))
        exp = float(np.median(expected))
        first, last = int(steps[k[0]]), int(steps[k[-1] + 1])
        return [
            Finding(
                kind=FindingKind.STALL,
                severity=Severity.WARNING,
                metric=None,
                start_step=first,
                peak_step=int(steps[k[worst]]),
                end_step=last,
                measures=_measures(
                    "wall_time",
                    gap=gap,
                    expected=exp,
                    usual_step=per_step,
                    ratio=float(np.median(gaps / expected)),
                    steps_between=int(np.median(steps[k + 1] - steps[k])),
                    pauses=int(len(k)),
                    time_lost=100.0 * share,
                ),
                judged_against={
                    "slow_factor": p.slow_factor,
                    "time_lost_share": ev.params.throughput.drop,
                },
                summary=(
                    f"The job paused {len(k):,} times between logged steps from step "
                    f"{first:,} to {last:,}, each typically for {_human(gap)} where the usual "
                    f"pace takes {_human(exp)} (the longest {_human(float(gaps[worst]))}, "
                    f"after step {int(steps[k[worst]]):,}), at no evaluation or save interval "
                    f"the log shows: together {share:.0%} of the run's wall time, lost beyond "
                    "the usual pace. Each pause is shorter than a stall, and a rate measured "
                    "within a step (tokens/s) does not show them: over the run the job made "
                    f"{share:.0%} less progress an hour than its steps' pace gives."
                ),
            )
        ]

    def _slow_steps(
        self, ev: Evidence, silences: list[tuple[int, int]], time_lost: bool = False
    ) -> list[Finding]:
        """Isolated slow steps of the step-time / throughput series (see the module text),
        but for those at a silence the wall clock's stalls already name (``silences``: the
        steps each lies between); ``time_lost`` (a log without a wall clock): also what they
        cost together (:meth:`_slow_time_lost`)."""
        from forensics.detectors.throughput import work_rate

        metric, x, rate = work_rate(ev)
        ok = rate > 0
        if not ok.all():  # (no copies of an all-positive rate)
            x, rate = x[ok], rate[ok]
        del ok
        if len(x) < self.params.min_points:
            return []
        tp = ev.params.throughput
        slower = self._slower(rate, tp.baseline_points)
        slow = slower >= self.params.slow_factor
        if not slow.any():
            return []
        unit = unit_for(ev.run, metric)
        seconds = None
        if metric == STEP_TIME:
            seconds = unit.seconds / rate  # seconds per step (a name in ms is scaled)
        every = median_interval(x)
        # runs of consecutive slow points; a run as long as a throughput drop is not isolated
        idx = np.flatnonzero(slow)
        groups = np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1)
        house: dict[str, list[int]] = {}
        out: list[Finding] = []
        paused: list[int] = []  # the isolated slow points no stall names, no housekeeping
        hangs: list[int] = []  # the isolated steps slow enough to be stalls
        for g in groups:
            # the throughput detector's rule: a short dip at the housekeeping grid is no drop
            at = housekeeping_at(ev.revealed_periods, float(x[g[0]]), every)
            if at is not None and x[g[-1]] - x[g[0]] <= tp.min_points * every:
                house.setdefault(at, []).extend(int(k) for k in g)
                continue
            if len(g) >= tp.min_points:
                continue  # as long as a throughput drop: not isolated
            k = int(g[np.argmax(slower[g])])
            secs = float(seconds[k]) if seconds is not None else None
            if slower[k] < self.params.factor or (
                secs is not None and secs < self.params.min_seconds
            ):
                paused.extend(int(i) for i in g)
                continue
            if any(a <= x[k] <= b for a, b in silences):
                continue  # the wall clock already shows this silence
            hangs.append(k)
        if len(hangs) >= _MIN_PAUSES:
            # Recurring hangs are one finding with each one's step (events_at): a log of a
            # job that hung inside 12 of its steps read as 12 warnings and 12 incidents.
            out.append(self._hangs_finding(metric, x, rate, hangs, slower, seconds, every))
        else:
            for k in hangs:
                usual_s = float(seconds[k] / slower[k]) if seconds is not None else None
                out.append(
                    self._slow_finding(metric, x, [k], slower, seconds, None, usual_s, every)
                )
        for at, ks in house.items():
            usual_s = float(np.median(seconds[ks] / slower[ks])) if seconds is not None else None
            out.append(self._slow_finding(metric, x, ks, slower, seconds, at, usual_s, every))
        if time_lost:
            out += self._slow_time_lost(ev, metric, x, rate, slower, seconds, paused, every)
        return out

    def _slow_time_lost(
        self,
        ev: Evidence,
        metric: str,
        x: np.ndarray,
        rate: np.ndarray,
        slower: np.ndarray,
        seconds: np.ndarray | None,
        ks: list[int],
        every: float,
    ) -> list[Finding]:
        """:meth:`_time_lost` for a log without a wall clock: the isolated slow steps ``ks``
        (no stall, no housekeeping) against the time of all the logged steps, each step's time
        the inverse of its rate. Read as a sample where the log keeps every n-th step or
        averages over n: the share is the same, the seconds lost about n times the points'."""
        if len(ks) < _MIN_PAUSES:
            return []
        k = np.asarray(ks, dtype=np.intp)
        share = _steps_lost(rate, slower, k)
        if share < ev.params.throughput.drop:
            return []
        if (
            seconds is not None
            and float(seconds[k].sum() - (seconds[k] / slower[k]).sum()) * every < _MIN_LOST
        ):
            return []
        worst = int(k[np.argmax(slower[k])])
        ratio = float(np.median(slower[k]))
        first, last = int(x[k[0]]), int(x[k[-1]])
        secs, usual = _typical_seconds(seconds, slower, k)
        if secs is not None and usual is not None:
            typical = f"typically {_human(secs)} where the usual pace takes {_human(usual)}"
        else:
            typical = f"typically {ratio:.1f}x slower than the steps around them"
        judged = {
            "slow_factor": self.params.slow_factor,
            "time_lost_share": ev.params.throughput.drop,
        }
        summary = (
            f"{len(k):,} isolated slow steps in the {metric.replace('_', ' ')} from "
            f"step {first:,} to {last:,}, {typical} (the slowest at step "
            f"{int(x[worst]):,}), at no evaluation or save interval the log shows: "
            f"together {share:.0%} of the logged steps' time, lost beyond the usual "
            "pace. Each is too short to be a stall and too brief to be a throughput "
            f"drop: over the run the job made {share:.0%} less progress an hour than "
            "its usual pace gives (the log has no wall clock to confirm it)."
        )
        counted = _SlowSteps(metric, x, k, worst, secs, usual, ratio, every, share)
        return [counted.finding(judged, summary, pauses=len(k))]

    def _slower(self, rate: np.ndarray, window: int) -> np.ndarray:
        """How many times slower than the usual pace (``rolling_median(rate, window)``) each
        point ran: exact where it can reach ``slow_factor``, NaN elsewhere (only slow points
        are read).

        The usual pace is a median, at most its window's largest rate: where that largest
        rate over the point's own is under ``slow_factor`` the point is not slow, and the
        median is selected at the other points only (a few, where rank-filter passes would
        cover the whole series)."""
        n = len(rate)
        w = max(1, min(int(window), n))  # as rolling_median shrinks it
        # ~(bound / rate < slow_factor), bound = window_max(rate, -(w // 2), w) (the centred
        # window, cut at the ends), a piece at a time
        found = [np.array([], dtype=np.intp)]
        with np.errstate(invalid="ignore"):  # (an infinite rate: a candidate, NaN here)
            for lo, hi, bound in window_max_pieces(rate, -(w // 2), w, window_max):
                found.append(lo + np.flatnonzero(~(bound / rate[lo:hi] < self.params.slow_factor)))
        cand = np.concatenate(found)
        slower = np.full(n, np.nan)
        slower[cand] = centered_median_at(rate, w, cand) / rate[cand]
        return slower

    def _slow_finding(
        self,
        metric: str,
        x: np.ndarray,
        ks: list[int],
        slower: np.ndarray,
        seconds: np.ndarray | None,
        at: str | None,
        usual_s: float | None,
        every: float,
    ) -> Finding:
        ratio = float(np.median(slower[ks]))
        secs = float(np.median(seconds[ks])) if seconds is not None else None
        first, last = int(x[ks[0]]), int(x[ks[-1]])
        worst = ks[int(np.argmax(slower[ks]))]
        took = ""
        if secs is not None:
            usual = f", the usual step {_human(usual_s)}" if usual_s is not None else ""
            took = f" ({_human(secs)} each{usual})"
        if at is not None:
            what = "evaluation" if at == "eval_interval" else "checkpoint"
            summary = (
                f"{len(ks):,} slow step(s){took}, about {ratio:.1f}x the usual pace, from step "
                f"{first:,} to {last:,}, each at the {what} interval: the job's own {what} pauses, "
                "not a throughput drop."
            )
        else:
            summary = (
                f"Step {first:,} took {ratio:,.0f}x the usual pace{took} and the steps around it "
                "ran normally: a hang or a pre-emption inside the step."
            )
        return Finding(
            kind=FindingKind.STALL,
            severity=Severity.INFO if at is not None else Severity.WARNING,
            metric=metric,
            start_step=first,
            peak_step=int(x[worst]),
            end_step=last,
            measures=_measures(
                metric,
                slow_steps=len(ks),
                housekeeping=at,
                gap=secs,
                expected=usual_s,
                usual_step=usual_s,
                ratio=ratio,
                steps_between=int(round(every)),
            ),
            judged_against={
                "factor": self.params.factor,
                "slow_factor": self.params.slow_factor,
                "min_seconds": self.params.min_seconds,
                "isolated_below_points": self.params.min_points,
            },
            summary=summary,
        )

    def _hangs_finding(
        self,
        metric: str,
        x: np.ndarray,
        rate: np.ndarray,
        ks: list[int],
        slower: np.ndarray,
        seconds: np.ndarray | None,
        every: float,
    ) -> Finding:
        """One warning for three or more isolated steps each slow enough to be a stall, with
        the share of the logged steps' time they cost beyond the usual pace (each step's time
        the inverse of its rate, as :meth:`_slow_time_lost` counts it)."""
        k = np.asarray(ks, dtype=np.intp)
        ratios = slower[k]
        share = _steps_lost(rate, slower, k)
        ratio = float(np.median(ratios))
        worst = int(k[np.argmax(ratios)])
        first, last = int(x[k[0]]), int(x[k[-1]])
        lo, hi = float(ratios.min()), float(ratios.max())
        each = f"{lo:,.0f}x" if f"{lo:,.0f}" == f"{hi:,.0f}" else f"{lo:,.0f}x-{hi:,.0f}x"
        secs, usual = _typical_seconds(seconds, slower, k)
        took = ""
        if secs is not None and usual is not None:
            took = f", typically {_human(secs)} where the usual step takes {_human(usual)}"
        judged = {
            "factor": self.params.factor,
            "slow_factor": self.params.slow_factor,
            "min_seconds": self.params.min_seconds,
            "isolated_below_points": self.params.min_points,
        }
        summary = (
            f"{len(k):,} isolated steps from step {first:,} to {last:,} each took {each} "
            f"the usual pace (median {ratio:,.0f}x{took}; the slowest at step "
            f"{int(x[worst]):,}), the steps around each running normally: hangs or "
            f"pre-emptions inside single steps, recurring; together {_pct(share)} of the "
            "logged steps' time, lost beyond the usual pace."
        )
        counted = _SlowSteps(metric, x, k, worst, secs, usual, ratio, every, share)
        at = tuple(int(x[i]) for i in k)
        return counted.finding(judged, summary, stalls=len(k), events_at=at)

    @staticmethod
    def _eval_steps(run: Run) -> set[int]:
        # The val and eval metrics' rows: slices of the view (metric_rows), not a scan of it.
        held = [m for m in run.metrics() if m == VAL_LOSS or m.startswith(EVAL_PREFIX)]
        out: set[int] = set()
        for m in held:
            out.update(run.metric_rows(m).get_column("step").unique().to_list())
        return out


_CHUNK = 1 << 16


class _SlowSteps(NamedTuple):
    """Isolated slow steps ``k`` (indices into the steps ``x``) as one stall finding: the
    time-lost warning and the recurring hangs share everything but their counts, what they
    were judged against and their sentence."""

    metric: str
    x: np.ndarray
    k: np.ndarray
    worst: int
    secs: float | None
    usual: float | None
    ratio: float
    every: float
    share: float

    def finding(
        self,
        judged: dict[str, Any],
        summary: str,
        *,
        pauses: int | None = None,
        stalls: int | None = None,
        events_at: tuple[int, ...] | None = None,
    ) -> Finding:
        x, k = self.x, self.k
        return Finding(
            kind=FindingKind.STALL,
            severity=Severity.WARNING,
            metric=self.metric,
            start_step=int(x[k[0]]),
            peak_step=int(x[self.worst]),
            end_step=int(x[k[-1]]),
            measures=_measures(
                self.metric,
                slow_steps=len(k),
                gap=self.secs,
                expected=self.usual,
                usual_step=self.usual,
                ratio=self.ratio,
                steps_between=int(round(self.every)),
                pauses=pauses,
                stalls=stalls,
                time_lost=100.0 * self.share,
            ),
            judged_against=judged,
            summary=summary,
            events_at=events_at,
        )


def _measures(
    source: str,
    *,
    ratio: float,
    steps_between: int,
    slow_steps: int | None = None,
    housekeeping: str | None = None,
    gap: float | None = None,
    expected: float | None = None,
    usual_step: float | None = None,
    usual_pause: float | None = None,
    pauses: int | None = None,
    stalls: int | None = None,
    time_lost: float | None = None,
) -> dict[str, MeasureValue]:
    """A stall finding's measures (every key its kind declares, in one order)."""
    return {
        "source": source,
        "slow_steps": slow_steps,
        "housekeeping": housekeeping,
        "gap_seconds": gap,
        "expected_seconds": expected,
        "usual_step_seconds": usual_step,
        "ratio": ratio,
        "steps_between": steps_between,
        "usual_pause_seconds": usual_pause,
        "pauses": pauses,
        "stalls": stalls,
        "time_lost_pct": time_lost,
    }


_MIN_PAUSES = 3  # pauses at least, to be a pattern (one or two long ones are stalls or not)
# Seconds the pauses must cost in all: a log written in a second or two (a test's, a toy
# run's) has pauses of milliseconds, the writer's flushes, that can add up to a third of it.
_MIN_LOST = 60.0


def _intervals(
    wall: np.ndarray, steps: np.ndarray
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """``(lo, hi, np.diff(wall)[lo:hi], np.diff(steps)[lo:hi].astype(float))`` over the
    intervals a piece at a time."""
    for lo, hi, _, _ in pieces(len(steps) - 1, _CHUNK):
        yield lo, hi, np.diff(wall[lo : hi + 1]), np.diff(steps[lo : hi + 1]).astype(float)


def _steps_lost(rate: np.ndarray, slower: np.ndarray, k: np.ndarray) -> float:
    """The share of the logged steps' time that the slow steps ``k`` took beyond the usual
    pace: each step's time the inverse of its (positive) rate, a slow step's excess
    ``1 - 1 / slower`` of its own."""
    t = 1.0 / rate
    return float((t[k] * (1.0 - 1.0 / slower[k])).sum() / t.sum())


def _typical_seconds(
    seconds: np.ndarray | None, slower: np.ndarray, k: np.ndarray
) -> tuple[float | None, float | None]:
    """The slow steps' median seconds and the usual step's (their seconds over how many times
    slower each ran), or (None, None) where the log gives no seconds."""
    if seconds is None:
        return None, None
    return float(np.median(seconds[k])), float(np.median(seconds[k] / slower[k]))


def _pct(share: float) -> str:
    """A share as a percentage, "0.4%" under 1%, else whole ("22%")."""
    return f"{share:.1%}" if share < 0.01 else f"{share:.0%}"


def _human(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    if seconds >= 10:
        return f"{seconds:.0f} s"
    if seconds >= 1:
        return f"{seconds:.1f} s"
    return f"{seconds * 1000:.0f} ms"  # a step time of 850 ms, not "1 s"
