"""Divergence: the loss and the grad norm rising together and not coming back (the red light).

Article 2.2: "grad norm and loss soaring together without falling back is the prelude to
divergence"; 6.3: red = a divergence that does not recover for N steps.

Only a rise the loss never comes back from within the log is a divergence: a rise that falls
back to its earlier level before the log ends, however long it took and however short the log,
is a spike (the spike detector judges how slowly it recovered), not a divergence.

Severity: fatal when confirmed; critical when the log ends before ``window`` steps have passed
(the rise is there but the log cannot show that it lasts).

The measures of its finding kinds are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

import numpy as np

from forensics.evidence import Evidence
from forensics.evidence.rolling import centered_median
from forensics.evidence.spike_shape import SpikeClass
from forensics.evidence.trend_utils import first_below, last_not_above, num, robust_sigma
from forensics.findings import Finding, FindingKind, MeasureValue, Severity, steps_text
from forensics.params import DivergenceParams
from forensics.schema import GRAD_NORM, LOSS


def _smooth(v: np.ndarray, points: int) -> np.ndarray:
    w = max(1, min(points, len(v)))
    return centered_median(v, w)  # polars' centred rolling median, computed faster


_GRAD_HELD = 1.2  # a grad norm within this ratio of its earlier level "held" over a climb


class DivergenceDetector:
    """Loss and grad norm up together, not back within ``window`` steps."""

    name = "divergence"

    def __init__(self, params: DivergenceParams | None = None) -> None:
        self.params = params or DivergenceParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        # A loss climb in whose steps the loss spiked and did not come back is that spike's
        # aftermath: its finding says the loss settled above its trend or went on rising.
        found = self._found(ev)
        if not any(f.kind is FindingKind.LOSS_CLIMB for f in found):
            return found
        unsettled = [
            s
            for s in ev.spikes(LOSS)
            if s.classification in (SpikeClass.PATHOLOGICAL, SpikeClass.UNRESOLVED)
        ]
        return [
            f
            for f in found
            if f.kind is not FindingKind.LOSS_CLIMB
            or not any(f.start_step <= s.peak_step <= (f.end_step or 0) for s in unsettled)
        ]

    def divergences(self, ev: Evidence) -> list[Finding]:
        """The divergence findings alone (what the spike search reads: it must not wait on
        the loss climbs, which read the spikes)."""
        return [f for f in self._found(ev) if f.kind is FindingKind.DIVERGENCE]

    def _found(self, ev: Evidence) -> list[Finding]:
        # Once per evidence and parameters: the spike detector reads the diverged stretches
        # (Evidence.diverged) before this detector reports them.
        return ev.shared_findings(self.name, self.params, lambda: self._detect(ev))

    def _detect(self, ev: Evidence) -> list[Finding]:
        run = ev.run
        if not run.has(LOSS):
            return []
        if not run.has(GRAD_NORM):
            # (a loss climb is still looked for: it needs only the loss)
            run.note("divergence: not run, it needs both a loss and a grad-norm series")
        loss = ev.series(LOSS)
        if len(loss) < self.params.min_points or (loss.values <= 0).any():
            if len(loss) >= self.params.min_points:
                run.note("divergence: not run, the loss takes non-positive values")
            return []
        # NaN and Inf are evidence here: once the loss is non-finite it has exploded, and it
        # counts as risen from there on.
        logged = ev.logged(LOSS)
        bad = logged.steps[~np.isfinite(logged.values)]
        first_bad = int(bad[0]) if len(bad) else None
        last_logged = int(logged.steps[-1])
        tf, y = loss.steps, np.log(loss.values)
        sm = _smooth(y, self.params.smooth_points)
        rise = sm - np.minimum.accumulate(sm)
        thr = np.log1p(self.params.loss_rise)
        has_grad = run.has(GRAD_NORM)
        if has_grad:
            g_logged = ev.logged(GRAD_NORM)
            g_bad_steps = g_logged.steps[~np.isfinite(g_logged.values)]
            g_last = int(g_logged.steps.max())
            grad = ev.series(GRAD_NORM)
            gt, gv = grad.steps[grad.values > 0], grad.values[grad.values > 0]
        else:
            g_bad_steps, g_last = np.empty(0, dtype=np.int64), last_logged
            gt, gv = np.empty(0, dtype=np.int64), np.empty(0)

        # Resume seams: a climb judged across one is resume_regression's (its level before the
        # seam, the resumed job's after).
        seams = ev.resume_steps
        out: list[Finding] = []
        n = len(y)
        above = np.flatnonzero(rise >= thr)
        i = int(above[0]) if len(above) else n
        while i < n:
            if rise[i] < thr:  # jump to the next point above the threshold
                k = int(np.searchsorted(above, i))
                i = int(above[k]) if k < len(above) else n
                continue
            # Onset: back to where the climb left the running best (the point after the last
            # one before it not a quarter of the threshold above that best); the return: the
            # first point from here back under half the threshold. Both searched outward in
            # growing blocks: a search of the rest of the series at each climb made a run of
            # many short climbs quadratic (a 1M-step loss with a climb every 200 steps: 2.5 s
            # of CPU, now 0.09).
            onset = last_not_above(rise, i, 0.25 * thr) + 1
            back = first_below(rise, i, 0.5 * thr)
            ret = back if back < n else None
            t0 = int(tf[onset])
            end_idx = ret if ret is not None else n - 1
            t_end = int(tf[end_idx])
            nonfinite = (
                first_bad is not None and first_bad >= t0 and (ret is None or first_bad <= t_end)
            )
            g_until = t_end if ret is not None else g_last
            g_bad = bool(((g_bad_steps >= t0) & (g_bad_steps <= g_until)).any())
            nonfinite = nonfinite or g_bad
            last_step = last_logged if ret is None else t_end
            observed = last_step - t0
            if ret is not None:
                # Came back within the log, however long it took: a spike (the spike detector
                # judges its recovery), not a divergence. Only a rise the log never sees
                # undone is the red light.
                i = end_idx + 1
                continue
            pre = (gt < t0) & (gt >= t0 - self.params.window)
            if pre.sum() < 3:
                pre = gt < t0
            # A rise the loss ran into NaN or Inf with is judged up to that step: past it a
            # job that skips its non-finite steps logs no grad norm, and the rise's "last
            # third" reached into those unlogged steps (the nan sample: the grad norm at 3-50x
            # its level over the 25 steps before the NaN at step 637, no divergence found).
            g_end = first_bad if nonfinite and first_bad is not None and ret is None else last_step
            during = (gt >= t0) & (gt <= g_end)
            g_before = float(np.median(gv[pre])) if pre.any() else None
            g_during = float(np.median(gv[during])) if during.any() else None
            g_ratio = g_during / g_before if (g_before and g_during) else None
            # A grad norm climbing through the rise (still climbing at the log's end) has its
            # median over the whole rise half-way up: at 1.9x it read as no divergence while
            # the grad norm stood at 2.3x and the loss 23% up. Its level over the rise's last
            # third counts too.
            late = (gt >= t0 + (2.0 / 3.0) * (g_end - t0)) & (gt <= g_end)
            g_late = float(np.median(gv[late])) if late.sum() >= 3 else None
            g_late_ratio = g_late / g_before if (g_before and g_late) else None
            if not has_grad or not (
                (g_ratio is not None and g_ratio >= self.params.grad_rise)
                or (g_late_ratio is not None and g_late_ratio >= self.params.grad_rise)
                or g_bad
            ):
                # Not the divergence (the grad norm did not climb with the loss): a loss
                # climbing on its own is still looked at, once it has lasted.
                climb = None if nonfinite else self._climb(tf, y, onset, last_step, g_ratio, seams)
                if climb is not None:
                    out.append(climb)
                i = end_idx + 1
                continue
            confirmed = observed >= self.params.window or nonfinite
            seg = slice(onset, end_idx + 1)
            peak_i = onset + int(np.argmax(sm[seg]))
            # The level the rise left: the median of the logged loss over the smoothing's
            # width of points before the onset, what the chart shows there. (The centred
            # median at the onset itself is half-way up a jump: a loss that stepped from 4.52
            # to 5.3 read "rose from 5.285".)
            w = max(1, self.params.smooth_points)
            loss_before = (
                float(np.median(loss.values[max(0, onset - w) : onset]))
                if onset > 0
                else float(np.exp(sm[0]))
            )
            loss_peak = float(np.exp(sm[peak_i]))
            # The sentence's numbers are the smoothed curve's; the highest logged value beside
            # them (single steps of a diverging loss swing far above and below it).
            raw_i = onset + int(np.argmax(y[seg]))
            measures: dict[str, MeasureValue] = {
                "loss_before": loss_before,
                "loss_peak": None
                if nonfinite and first_bad is not None and ret is None
                else loss_peak,
                "loss_rise_rel": loss_peak / loss_before - 1.0,
                "grad_norm_before": g_before,
                "grad_norm_during": g_during,
                "grad_norm_ratio": g_ratio,
                "grad_norm_late": g_late,
                "grad_norm_late_ratio": g_late_ratio,
                "steps_observed": observed,
                "returned_step": int(tf[ret]) if ret is not None else None,
                "ended_nonfinite": bool(nonfinite),
                "confirmed": bool(confirmed),
                "window": self.params.window,
            }
            how = (
                f"not back within {steps_text(observed)}"
                if confirmed and not nonfinite
                else (
                    "until the values turned non-finite"
                    if nonfinite
                    else f"for the {steps_text(observed)} the log still shows"
                )
            )
            gtxt = f"{g_ratio:.1f}x" if g_ratio is not None else "non-finite"
            gtxt += " its earlier level"
            if g_ratio is not None and g_ratio < self.params.grad_rise and g_late_ratio:
                # (passed on the rise's last third only: both numbers, so neither reads wrong)
                gtxt += f" over the rise and {g_late_ratio:.1f}x over its last third"
            summary = (
                f"Divergence from step {t0:,}: the smoothed loss rose from {num(loss_before)} "
                f"to {num(loss_peak)} (highest logged value {num(float(np.exp(y[raw_i])))} at "
                f"step {int(tf[raw_i]):,}) and the grad norm ran at {gtxt}, {how}."
            )
            sev = Severity.FATAL if confirmed else Severity.CRITICAL
            out.append(
                Finding(
                    FindingKind.DIVERGENCE,
                    sev,
                    LOSS,
                    t0,
                    summary,
                    # The peak a reader is shown (the header's "peak at", the chart's marker)
                    # is the highest logged value the sentence names, not the smoothed curve's
                    # top: a rise that ran into NaN had its smoothed top at the last finite
                    # point (nan sample: "peak at 636", logged 9.90, beside 14.65 at 634).
                    int(tf[raw_i]),
                    last_step,
                    measures,
                    judged_against={
                        "loss_rise": self.params.loss_rise,
                        "grad_rise": self.params.grad_rise,
                        "window_steps": self.params.window,
                    },
                )
            )
            if ret is None:
                break
            i = end_idx + 1
        return out

    def _climb(
        self,
        tf: np.ndarray,
        y: np.ndarray,
        onset: int,
        last_step: int,
        g_ratio: float | None,
        seams: list[int],
    ) -> Finding | None:
        """The ``loss_climb`` finding of a rise from ``onset`` to the end of the log (``y``:
        the log loss), or None: it must have lasted ``climb_min_steps`` over
        ``climb_min_points`` points, and the median of its last third must stand ``loss_rise``
        above the median of as many points before it as the rise has (at most), and
        ``climb_noise_k`` standard errors clear of the loss's noise."""
        p = self.params
        n = len(y)
        t0 = int(tf[onset])
        observed = last_step - t0
        points = n - onset
        if observed < p.climb_min_steps or points < p.climb_min_points:
            return None
        first = max(0, onset - points)
        if any(int(tf[first]) < s <= last_step for s in seams):
            return None  # (resume_regression judges a loss across a resume)
        before = y[first:onset]
        after = y[n - points // 3 :]
        if len(before) < p.climb_min_points // 2 or len(after) < 3:
            return None
        lb, la = float(np.median(before)), float(np.median(after))
        sigma = robust_sigma(y)
        # (a median's standard error is about 1.25 sigma / sqrt(points))
        se = 1.25 * sigma * float(np.sqrt(1.0 / len(before) + 1.0 / len(after)))
        if la - lb < np.log1p(p.loss_rise) or la - lb <= p.climb_noise_k * se:
            return None
        loss_before, loss_after = float(np.exp(lb)), float(np.exp(la))
        rise = loss_after / loss_before - 1.0
        if g_ratio is None:
            grad = (
                "the grad norm was not logged, so the log cannot tell this from a divergence "
                "(loss and grad norm climbing together)"
            )
        elif g_ratio < _GRAD_HELD:
            grad = (
                f"the grad norm held ({g_ratio:.2f}x its earlier level): the loss rose on its "
                "own, not the divergence where loss and grad norm climb together"
            )
        else:
            grad = (
                f"the grad norm ran at {g_ratio:.2f}x its earlier level, under the "
                f"{p.grad_rise:g}x at which loss and grad norm climbing together make a "
                "divergence"
            )
        summary = (
            f"The training loss climbed from {num(loss_before)} (median of the {len(before):,} "
            f"points before step {t0:,}) to {num(loss_after)} (median of the last "
            f"{len(after):,}), +{100 * rise:.1f}%, and had not come back when the log ends "
            f"{steps_text(observed)} later (step {last_step:,}); {grad}."
        )
        measures: dict[str, MeasureValue] = {
            "loss_before": loss_before,
            "loss_after": loss_after,
            "rise_pct": 100.0 * rise,
            "points_before": len(before),
            "points_after": len(after),
            "steps_observed": observed,
            "noise_sigma": sigma,
            "grad_norm_ratio": g_ratio,
        }
        return Finding(
            FindingKind.LOSS_CLIMB,
            Severity.WARNING,
            LOSS,
            t0,
            summary,
            None,
            last_step,
            measures,
            judged_against={
                "loss_rise": p.loss_rise,
                "grad_rise": p.grad_rise,
                "climb_min_steps": p.climb_min_steps,
                "climb_min_points": p.climb_min_points,
                "climb_noise_k": p.climb_noise_k,
            },
        )
