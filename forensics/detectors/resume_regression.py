"""resume_regression: the training loss gets worse after a job resumed (a restart seam).

A resumed job is one run to the tool (:mod:`forensics.importers.chains`), and the seam is a
``restart`` finding. For each seam the stretch up to the next seam (or the end) is judged:

* the train loss must trend up: its Theil-Sen slope's 90% band lies above zero, and
* its level at the end (median of the last ``window`` points) must stand above its level just
  before the seam (median of the ``window`` points before it) by more than ``noise_k`` times
  the noise of such a level (robust sigma / sqrt(window)).

Both are required: a trend alone can be a slow wobble of a flat loss, a level alone a late
noisy stretch. The overfitting detector stops when the train loss rises too, and divergence
wants a rise many times larger; this is the slow degradation between them.

Where the rise began: a resume that lost part of the training state sets the loss back at
the seam. When the loss instead went on down after the seam, below its level before it, and
turned up only later (beyond the causes' reach of "near", 100 steps), the rise began at that
low (the lowest level of a centred ``window``-point rolling median after the seam): it is the
finding's onset, the sentence says so, and the resume is no longer its supported cause.

Severity from the numbers: when the val loss also ends above its best after the seam by more
than ``noise_k`` times the eval noise, the model the run would deliver is worse than one it
already had -- a warning (roll back). So is a training loss that rose by more than
``warn_rel_rise`` (10%) of its level before the seam, evals or not. Otherwise only the
training loss moved, by a little: info. On the
Lightning wikitext run (version_0 resumed as version_5 at step 140,749) the train loss level
goes from 3.682 to 3.727 (medians of 100 points; level noise 0.010) and the val loss
from its best 3.563 to 3.604 with an eval noise of 0.003: a warning. There the loss first
went on down after the seam, to 3.648 around step 146,999, and the val loss kept improving
until step 154,813: the rise began about 6,250 steps after the resume, not at it.

The same detector compares the two jobs on the steps a resume logged again
(:mod:`forensics.detectors.resume_drop`): a resumed job whose loss runs below the earlier
one's there re-reads data its checkpoint has seen.

The finding says the resume is the context (the causes test it: ``resume`` is supported when
the seam is the onset); it does not claim what went wrong at the resume, the log cannot show it.
"""

from __future__ import annotations

import math

import numpy as np

from forensics.detectors.resume_drop import resume_drops
from forensics.evidence import Evidence
from forensics.evidence.spike_context import NEAR_STEPS, near_steps
from forensics.evidence.trend_utils import (
    centred_level,
    robust_sigma,
    sig,
    steps_within,
    theil_sen,
)
from forensics.findings import Finding, FindingKind, Severity, steps_text
from forensics.params import ResumeRegressionParams
from forensics.schema import LOSS, VAL_LOSS

CHECK = "resume_regression"


class ResumeRegressionDetector:
    """Flags a training loss that trends up after a resume seam."""

    name = CHECK

    def __init__(self, params: ResumeRegressionParams | None = None) -> None:
        self.params = params or ResumeRegressionParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        seams = ev.resume_steps
        if not ev.has(LOSS):
            return []
        out: list[Finding] = []
        for i, seam in enumerate(seams):
            nxt = seams[i + 1] if i + 1 < len(seams) else None
            f = self._one(ev, seam, nxt)
            if f is not None:
                out.append(f)
        # (the steps a resume logged again, compared job against job: resume_drop)
        out.extend(resume_drops(ev, self.params))
        return out

    def _one(self, ev: Evidence, seam: int, nxt: int | None) -> Finding | None:
        p = self.params
        s = ev.series(LOSS)  # (finite values, sorted by step)
        x, y = s.steps, s.values
        # The points before the seam and those up to the next one are slices, found by a
        # search (masks over the whole loss at each seam: 13 s for 999 resumes over 1M steps).
        after = steps_within(x, seam, nxt - 1 if nxt is not None else math.inf)
        lo, n_after = after.start, after.stop - after.start
        if lo < p.min_points_after or n_after < p.min_points_after:
            return None
        # A level is the median of up to `window` points, at most a third of the stretch after.
        w = int(min(p.window, lo, n_after // 3))
        if w < 1:  # (fewer than 3 points after: no level to judge)
            return None
        xa, ya = x[after], y[after]
        trend = theil_sen(xa, ya)
        if trend is None or not trend.rising:
            return None
        # (the last w and 10w points before the seam)
        lvl_before = float(np.median(y[lo - w : lo]))
        lvl_end = float(np.median(ya[-w:]))
        noise = robust_sigma(y[max(0, lo - 10 * w) : lo]) / np.sqrt(w)
        rise = lvl_end - lvl_before
        if rise <= p.noise_k * noise:
            return None
        low_step, low_level = _low_after(xa, ya, w)
        reach = near_steps(ev.run.first_step, ev.run.last_step, NEAR_STEPS)
        later = low_step is not None and low_level < lvl_before and low_step - seam > reach
        onset = int(low_step) if later and low_step is not None else seam
        m: dict[str, float | int | str | bool | None] = {
            "seam_step": seam,
            "rise_from_step": onset,
            "low_after": low_level if later else None,
            "level_before": lvl_before,
            "level_end": lvl_end,
            "rise": rise,
            "level_noise": noise,
            "slope_per_1k": trend.slope * 1000.0,
            "slope_low_per_1k": trend.low * 1000.0,
            "slope_high_per_1k": trend.high * 1000.0,
            "points_after": n_after,
            "val_best": None,
            "val_best_step": None,
            "val_end": None,
            "val_end_step": None,
            "val_noise": None,
            "val_worse": False,
        }
        val_txt = ""
        if ev.has(VAL_LOSS):
            v = ev.series(VAL_LOSS)
            vx, vy = v.steps, v.values
            sel = np.isfinite(vy) & (vx >= seam) & ((vx < nxt) if nxt is not None else True)
            vx, vy = vx[sel], vy[sel]
            if len(vx) >= p.min_evals_after:
                gap = ev.gap
                vnoise = gap.val_noise if gap is not None else robust_sigma(v.values)
                b = int(np.argmin(vy))
                worse = bool(vy[-1] - vy[b] > p.noise_k * vnoise)
                m.update(
                    val_best=float(vy[b]),
                    val_best_step=int(vx[b]),
                    val_end=float(vy[-1]),
                    val_end_step=int(vx[-1]),
                    val_noise=float(vnoise),
                    val_worse=worse,
                )
                if worse:
                    val_txt = (
                        f"; the val loss reached its best {sig(float(vy[b]), 4)} at step "
                        f"{int(vx[b]):,} and ended at {sig(float(vy[-1]), 4)} (step "
                        f"{int(vx[-1]):,}), {float(vy[-1] - vy[b]) / max(vnoise, 1e-12):.0f}x "
                        "the eval noise above it"
                    )
        if later:
            first = (
                f"After the resume at step {seam:,} the training loss first went on down, to "
                f"{sig(low_level, 4)} around step {onset:,} ({steps_text(onset - seam)} after the "
                f"seam), then trended up: its level went from {sig(lvl_before, 4)} before the "
                f"seam to {sig(lvl_end, 4)}"
            )
        else:
            first = (
                f"After the resume at step {seam:,} the training loss trended up: its level "
                f"went from {sig(lvl_before, 4)} before the seam to {sig(lvl_end, 4)}"
            )
        # A rise this large is the training going wrong whatever the evals say (there may be
        # none): a warning, like a val loss ending worse than its best.
        rel = rise / abs(lvl_before) if lvl_before else None
        big = rel is not None and rel > p.warn_rel_rise
        m["rise_rel"] = rel
        rel_txt = f", {100 * rel:.0f}% of its level" if big and rel is not None else ""
        summary = (
            f"{first} at step {int(xa[-1]):,} ({rise:+.3g}{rel_txt}, {rise / noise:.0f}x the "
            f"level noise){val_txt}."
        )
        rest = xa >= onset
        peak = int(xa[rest][int(np.argmax(ya[rest]))])
        return Finding(
            kind=FindingKind.RESUME_REGRESSION,
            severity=Severity.WARNING if m["val_worse"] or big else Severity.INFO,
            metric=LOSS,
            start_step=onset,
            peak_step=peak,
            end_step=int(xa[-1]),
            measures=m,
            summary=summary,
            judged_against={
                "level_before": lvl_before,
                "level_noise": noise,
                "noise_k": p.noise_k,
                "rise_at": lvl_before + p.noise_k * noise,
                "warn_rel_rise": p.warn_rel_rise,
            },
        )


def _low_after(x: np.ndarray, y: np.ndarray, w: int) -> tuple[int | None, float]:
    """The step and level of the loss's low after the seam: the minimum of its centred rolling
    median over ``2 * (w // 2) + 1`` points (odd: a median is then one of the values), where
    the window is whole (None: too few points)."""
    h = w // 2
    if h < 1 or len(y) <= 2 * h + 1:
        return None, float("nan")
    level = centred_level(y, w)
    i = h + int(np.argmin(level[h : len(y) - h]))
    return int(x[i]), float(level[i])
