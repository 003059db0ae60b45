"""lr_restart: the LR schedule started over in the middle of the run, and what the loss did.

A restart is a schedule that begins again after its warm-up: the LR falls back (to zero, or
to a low) and warms up again, or jumps from the end of a decay straight back to its peak
(:mod:`forensics.evidence.schedule` reads both: a later ``warmup`` segment, a ``restart``
change). The article (4.4) treats the loss bump at a planned warm restart as no disease, but
a large bump at every restart says the LR climbs back too fast: lengthen the restart's
warm-up. A single restart nobody planned is the signature of a scheduler whose state was
lost (a resume that rebuilt it from its first step, a config that reset it): the LR goes
through a second warm-up and the loss gives back progress it had made.

For each restart the loss is read around it: its level before (median of the points of
the ``window`` steps before the restart, at least ``level_points`` of them within
``window_steps``), the highest level of its centred rolling median (as many points) before
the next restart or the end, and the first
step after that high where the level is back at or below the level before. The rise counts
when it exceeds ``noise_k`` times the noise of a level (robust sigma / sqrt(window)).

Severity: a warning for a single restart (no second one in the log, so not a schedule with
warm restarts) after which the loss rose and was not back within ``slow_recovery`` steps
(500: the article's line between a spike that recovers and one that does not) -- the run
lost that much progress. A log that ends sooner after the restart (a live job) cannot tell
yet: a note. Every other restart is a note that states the numbers: a schedule
with restarts (two or more), a loss that did not visibly move, or one back within 500 steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from forensics.evidence import Evidence
from forensics.evidence.spike_context import NEAR_STEPS, near_steps
from forensics.evidence.trend_utils import centred_level, robust_sigma, sig, steps_within
from forensics.findings import Finding, FindingKind, Severity, steps_text
from forensics.params import LrRestartParams
from forensics.schema import LOSS, LR

CHECK = "lr_restart"


@dataclass(frozen=True)
class _Restart:
    step: int  # the first logged step of the restarted schedule
    lr_before: float  # the LR at the logged point before it
    lr_from: float  # the LR the restart starts from
    lr_to: float  # the LR it warms up (or jumps) to
    rewarm_end: int | None  # the warm-up's last step (None: a jump straight back up)


def restarts(ev: Evidence) -> list[_Restart]:
    """The schedule's restarts after its first warm-up, in step order."""
    sched = ev.schedule
    out: list[_Restart] = []
    for i, seg in enumerate(sched.segments):
        if i > 0 and seg.kind == "warmup" and seg.lr_before is not None:
            # Where the fall ended: the lowest logged LR of the warm-up's first point and the
            # few before it (the segments may split the fall's last point either way), and the
            # LR logged just before that low.
            k = int(np.searchsorted(sched.steps, seg.start_step))
            lo = max(0, k - 3) + int(np.argmin(sched.values[max(0, k - 3) : k + 1]))
            if lo == 0 or not sched.values[lo - 1] >= 2.0 * sched.values[lo]:
                continue  # (no fall: a cyclic LR's rise from its low, a warm-up after zeros)
            out.append(
                _Restart(
                    int(sched.steps[lo]),
                    float(sched.values[lo - 1]),
                    float(sched.values[lo]),
                    seg.lr_end,
                    seg.end_step,
                )
            )
    for c in sched.changes:
        if c.kind == "restart":
            out.append(_Restart(c.step, c.lr_before, c.lr_after, c.lr_after, None))
    out.sort(key=lambda r: r.step)
    # A jump back up followed at once by a warm-up from a low (or a fall split over two
    # segments) is one restart: of two within three logged LR points, the later is kept.
    pos = np.searchsorted(sched.steps, [r.step for r in out])
    return [r for i, r in enumerate(out) if i + 1 == len(out) or pos[i + 1] - pos[i] > 3]


class LrRestartDetector:
    """Flags an LR schedule that started over mid-run, with the loss's rise and recovery."""

    name = CHECK

    def __init__(self, params: LrRestartParams | None = None) -> None:
        self.params = params or LrRestartParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        if not ev.has(LR) or ev.schedule.empty:
            return []
        found = restarts(ev)
        if not found:
            return []
        if not ev.has(LOSS):
            ev.run.note(f"{CHECK}: the LR schedule restarts, but no training loss to judge it by")
            return []
        seams = set(ev.resume_steps)
        reach = near_steps(ev.run.first_step, ev.run.last_step, NEAR_STEPS)
        s = ev.series(LOSS)
        ok = np.isfinite(s.values)
        x, y = s.steps[ok], s.values[ok]  # (read once for every restart)
        out = []
        for i, r in enumerate(found):
            nxt = found[i + 1].step if i + 1 < len(found) else None
            f = self._one(ev, x, y, r, nxt, len(found), seams, reach)
            if f is not None:
                out.append(f)
        return out

    def _one(
        self,
        ev: Evidence,
        x: np.ndarray,
        y: np.ndarray,
        r: _Restart,
        nxt: int | None,
        count: int,
        seams: set[int],
        reach: int,
    ) -> Finding | None:
        p = self.params
        # (x is sorted: the points before the restart and those up to the next one are
        # slices, found by a search; masks over the whole loss for each restart cost 15 s for
        # an LR restarted every 300 steps over 1M)
        after = steps_within(x, r.step, nxt - 1 if nxt is not None else math.inf)
        lo, n_after = after.start, after.stop - after.start
        if lo < p.min_points or n_after < p.min_points:
            ev.run.note(
                f"{CHECK}: the LR schedule restarts at step {r.step:,}, but the loss has fewer "
                f"than {p.min_points} points before or after it: not judged"
            )
            return None
        # A level: the points of the last `window` steps before the restart, at least
        # `level_points` of them within `window_steps` (a log written every 10 steps has 10
        # points, one written every 100 steps 5, not the whole run's first half). In points,
        # a sparse log's level spanned 5-10x the steps of an every-step log's, took in a
        # loss still falling before the restart and flattened the bump after it.
        recent = lo - int(np.searchsorted(x[:lo], r.step - p.window_steps))
        span = lo - int(np.searchsorted(x[:lo], r.step - p.window))
        w = int(max(1, min(max(span, p.level_points), recent, n_after)))
        level_before = float(np.median(y[max(0, lo - w) : lo]))
        noise = robust_sigma(y[max(0, lo - 10 * w) : lo]) / np.sqrt(w)
        xa, ya = x[after], y[after]
        level = centred_level(ya, w)
        hi = int(np.argmax(level))
        peak_level, peak_step = float(level[hi]), int(xa[hi])
        rise = peak_level - level_before
        visible = rise > p.noise_k * noise
        back = np.flatnonzero(level[hi:] <= level_before)
        recovered = int(xa[hi + int(back[0])]) if len(back) else None
        recovery = recovered - r.step if recovered is not None else None
        resumed = any(abs(seam - r.step) <= reach for seam in seams)
        periodic = count >= 2
        # (not back yet, but the log ends within slow_recovery steps of the restart: too soon
        # to tell, as a live job read mid-way)
        slow = (
            recovery > p.slow_recovery
            if recovery is not None
            else xa[-1] - r.step > p.slow_recovery
        )
        warn = not periodic and visible and slow
        m: dict[str, float | int | str | bool | None] = {
            "restart_step": r.step,
            "rewarm_end_step": r.rewarm_end,
            "lr_before": r.lr_before,
            "lr_from": r.lr_from,
            "lr_to": r.lr_to,
            "restarts": count,
            "at_resume": resumed,
            "level_before": level_before,
            "level_noise": noise,
            "peak_level": peak_level,
            "peak_level_step": peak_step,
            "rise_pct": 100.0 * rise / abs(level_before) if level_before else None,
            "rise_visible": visible,
            "recovered_step": recovered,
            "recovery_steps": recovery,
        }
        if r.rewarm_end is not None:
            how = (
                f"the LR fell from {sig(r.lr_before)} to {sig(r.lr_from)} and warmed up again to "
                f"{sig(r.lr_to)} by step {r.rewarm_end:,}"
            )
        else:
            how = f"the LR jumped from {sig(r.lr_before)} back up to {sig(r.lr_to)}"
        if periodic:
            which = f"one of {count} restarts in the log (a schedule with warm restarts)"
        else:
            which = "the only restart in the log"
        which += ", at a resume of the job" if resumed else ", and the job did not resume there"
        if not visible and rise <= 0:
            effect = (
                f"the loss did not rise after it (level {sig(level_before, 4)} before, at most "
                f"{sig(peak_level, 4)} after)"
            )
        elif not visible:
            effect = (
                f"the loss did not visibly rise (level {sig(level_before, 4)} before, highest "
                f"{sig(peak_level, 4)} after, within {p.noise_k:g}x the level noise)"
            )
        else:
            pct = m["rise_pct"]
            effect = (
                f"the loss rose from {sig(level_before, 4)} to {sig(peak_level, 4)}"
                + (f" (+{pct:.1f}%)" if isinstance(pct, float) else "")
                + f" by step {peak_step:,}"
            )
            if recovered is not None and recovery is not None:
                effect += (
                    f" and was back at its level before the restart at step {recovered:,}, "
                    f"{steps_text(recovery)} after it"
                )
                if warn:
                    effect += f" (more than {p.slow_recovery:,})"
            else:
                end = int(xa[-1])
                effect += f" and was not back at its level before the restart by step {end:,}" + (
                    " (the next restart)" if nxt is not None and end < nxt else ""
                )
        summary = f"The LR schedule started over at step {r.step:,}: {how}, {which}; {effect}."
        return Finding(
            kind=FindingKind.LR_RESTART,
            severity=Severity.WARNING if warn else Severity.INFO,
            metric=LR,
            start_step=r.step,
            peak_step=None,  # (the loss's high is a measure: the LR has no peak here)
            end_step=(
                (recovered if recovered is not None else int(xa[-1]))
                if visible
                else (r.rewarm_end if r.rewarm_end is not None else r.step)
            ),
            measures=m,
            summary=summary,
            # (loss levels, named so: the finding's own series is the LR, whose chart must
            # not draw them)
            judged_against={
                "loss_level_before": level_before,
                "loss_rise_line": level_before + p.noise_k * noise,
                "noise_k": p.noise_k,
                "slow_recovery": p.slow_recovery,
                "window": w,
            },
        )
