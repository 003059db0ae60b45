"""Train and validation loss together (article section 5): gap_acceleration, overfitting, val_shift.

The gap is the evidence layer's (``ev.gap``, :mod:`forensics.evidence.gap`): val minus train,
with the train loss smoothed (median around each val step) and aligned to the val steps; it
may be negative (dropout makes train look worse than val). Its window growths, noise floor
and the 1.5x acceleration rule are computed there, once per run; this module decides.

* ``gap_acceleration`` (warning): the gap grew over the last window by more than 1.5x its
  growth over the window before, and by more than the val noise; window = 1000 steps or two
  val intervals, whichever is longer (the article's yellow light, section 5.2). Logs shorter
  than six windows use a sixth of their length instead of the 1000 steps. It is
  confirmed on two consecutive val points, must still hold one window later (the train
  loss wanders with the data order and such wander comes back down), the pace in that later
  window past 1.5x the pace before by ``SUSTAIN_MARGIN`` of the noise floor and, on lines
  fitted through every gap reading, by ``PACE_SE_K`` standard errors, and is reported at its
  onset (where the gap bends upward), usually before the val loss itself turns up. One first
  confirmed at or after the onset of a divergence of the train loss is a note, part of that
  divergence: the held-out loss read after the blow-up follows it.
* ``overfitting`` (warning): the negative slope, train falling (or at least not rising)
  while the held-out loss rises from its minimum over at least two later evals by more than
  overfit_noise_k x its own eval noise, however small (a 1-2% rise in the last epoch of an
  SFT run counts). The finding names the best checkpoint: the eval step of the minimum
  (``best_step``), and the saved checkpoint at or before it when the run states them.
  Critical from the fifth epoch on when the gap keeps accelerating, as the article grades it.
* ``val_shift`` (warning): the held-out loss steps, up or down, between consecutive evals
  (or within ``shift_window`` steps) to a new level that then holds, while the train loss
  does not step: the article's snapshot effect (section 5.4), or a val set that got easier.
  The old and the new level are lines fitted over the window before and after the step, so
  a train loss still falling slowly (and the val falling with it) is allowed: what must hold
  is the gap's ramp, the same before and after the step (a gap that keeps ramping up is gap
  acceleration, not a new val set). The first thing to check is whether the validation set
  changed. The new level must hold for at least half a level window before the log ends.

Every held-out loss counts: ``val_loss`` and each eval set's ``eval/<set>_loss`` (from
``eval_<set>_loss``, ``val/<set>/loss`` ...; :func:`forensics.schema.held_out_set`) is judged
on its own gap (``Evidence.gap_of``); a finding's ``metric`` names the set. Scores (accuracy,
BLEU, WER, perplexity) are eval_regression's.

Measures:

Judged against (``Finding.judged_against``):

* ``gap_acceleration``: `accel_ratio` (1.5), `accel_line` (accel_ratio x the previous
  window's growth, at least 0), `noise_floor` (what the growth had to exceed), `noise`,
  `noise_k`, `window_steps`.
* ``overfitting``: `rise_floor` (overfit_noise_k x val_noise, what the val rise had to
  exceed), `noise` (the eval noise of the held-out loss), `critical_epoch`.
* ``val_shift``: `shift_floor` (the larger of shift_noise_k x noise and min_rel_shift x the
  old level), `noise`, `shift_window`.

The measures of its finding kinds are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from forensics.evidence import Evidence
from forensics.evidence.checkpoints import measured_best
from forensics.evidence.gap import Gap, held_out_losses
from forensics.evidence.spike_context import epoch_at
from forensics.evidence.trend_utils import (
    bend_range,
    hinge_onset,
    num,
    ordinal,
    rolling_median,
    theil_sen,
)
from forensics.findings import Finding, FindingKind, Severity
from forensics.params import TrainValParams
from forensics.schema import EPOCH, LOSS, VAL_LOSS

CHECK = "train_val"


SUSTAIN_MARGIN = 0.1  # of the growth floor: how far past the 1.5x line the later pace must be
PACE_SE_K = 0.5  # standard errors the fitted later pace must clear 1.5x the earlier one by


class TrainValDetector:
    """Gap acceleration, overfitting (negative slope) and val-set shifts."""

    name = CHECK

    def __init__(self, params: TrainValParams | None = None) -> None:
        self.params = params or TrainValParams()
        self._shift_score = 0.0  # set by _val_shift (see scores)

    def _gap(self, ev: Evidence, metric: str) -> Gap | None:
        """The evidence's gap of one held-out loss, or None with a note saying why the checks
        did not run on it."""
        n_train, n_val = len(ev.series(LOSS)), len(ev.series(metric))
        need = self.params.min_val_points
        g = None
        if n_val >= need and n_train >= 5:
            # The evidence's gap, built with the configured train_val parameters (a detector
            # configured apart from them, as in a test, reads evidence built with its own).
            g = ev.using(CHECK, self.params).gap_of(metric)
        if g is None:
            what = "val" if metric == VAL_LOSS else metric
            ev.run.note(
                f"{CHECK}: not run, only {n_val} {what} and {n_train} train points "
                f"(need {max(need, 2)} and 5)"
            )
        return g

    def detect(self, ev: Evidence) -> list[Finding]:
        metrics = held_out_losses(ev)
        missing = [m for m, ok in ((LOSS, ev.has(LOSS)), (VAL_LOSS, bool(metrics))) if not ok]
        if missing:
            ev.run.note(
                f"{CHECK}: not run (gap_acceleration, overfitting, val_shift), "
                f"no {' or '.join(missing)} series"
                + (" (nor an eval set's eval/<set>_loss)" if not metrics else "")
            )
            return []
        out: list[Finding] = []
        for metric in metrics:  # every held-out loss is judged on its own gap
            g = self._gap(ev, metric)
            if g is not None:
                out += self._judge(ev, g)
        return out

    def _judge(self, ev: Evidence, g: Gap) -> list[Finding]:
        accel = self._acceleration(g)
        shift = self._val_shift(g)
        if shift:  # a widening that the val-set shift explains is not reported twice
            s0, s1 = shift[0].start_step, shift[0].peak_step or shift[0].start_step
            accel = [
                f
                for f in accel
                if not (f.start_step <= s1 + g.window and (f.end_step or f.start_step) >= s0)
            ]
        since = float(shift[0].peak_step or shift[0].start_step) if shift else None
        over = self._overfitting(ev, g, accel, since)
        return [_in_divergence(ev, f) for f in accel] + over + shift

    def scores(self, ev: Evidence) -> dict[str, dict[str, float]]:
        """Calibration scores per held-out loss, each the ratio to its alarm line (> 1 fires):
        ``overfitting`` (the rise from the minimum over rise_floor, 0 when train rises or the
        later trend is not up), ``val_shift`` (the biggest step of a val-only shape over its
        floor), ``gap_acceleration`` (growth over the larger of the 1.5x line and the noise
        floor, the smallest over ``confirm`` consecutive val steps, at its largest; the
        detector also asks it to hold a window later)."""
        out: dict[str, dict[str, float]] = {}
        for metric in held_out_losses(ev):
            if not ev.has(LOSS) or len(ev.series(metric)) < self.params.min_val_points:
                continue
            g = ev.using(CHECK, self.params).gap_of(metric)
            if g is None:
                continue
            self._shift_score = 0.0
            self._val_shift(g)
            with np.errstate(invalid="ignore", divide="ignore"):
                line = np.maximum(
                    g.growth_floor, g.accel_ratio * np.maximum(np.nan_to_num(g.growth_prev), 0.0)
                )
                accel = np.nan_to_num(g.growth_last / line, nan=0.0, neginf=0.0, posinf=0.0)
            c = self.params.confirm  # the rule must hold on `confirm` consecutive val steps
            held = [float(np.min(accel[k : k + c])) for k in range(len(accel) - c + 1)]
            out[metric] = {
                "overfitting": self._overfit_score(g),
                "val_shift": self._shift_score,
                "gap_acceleration": max(held, default=0.0),
            }
        return out

    def _overfit_score(self, g: Gap) -> float:
        vy = g.val
        if len(vy) < 3:
            return 0.0
        smooth = rolling_median(vy, 3)
        m = int(np.argmin(smooth))
        lo, hi = max(0, m - 1), min(len(vy), m + 2)
        m = lo + int(np.argmin(vy[lo:hi]))
        after = len(vy) - 1 - m
        if after < 2:
            return 0.0
        rise = float(np.median(vy[-min(3, after) :])) - float(smooth[m])
        vs = theil_sen(g.steps[m:], vy[m:])
        t_s, t_v = g.train_after(g.steps[m])  # the train points from the val minimum on
        ts = theil_sen(t_s, t_v) if len(t_s) >= 3 else None
        del t_s, t_v
        if vs is None or vs.slope <= 0 or ts is None or ts.rising:
            return 0.0
        return max(rise, 0.0) / (self.params.overfit_noise_k * max(g.val_noise, 1e-9))

    # -- gap acceleration ------------------------------------------------------------
    def _acceleration(self, g: Gap) -> list[Finding]:
        hit, widening, thr = g.accelerating, g.widening, g.growth_floor
        confirm = self.params.confirm
        out: list[Finding] = []
        i, n = 0, len(hit)
        first_i = first_det = 0
        while i < n:
            if not (hit[i] and hit[i : i + confirm].all() and i + confirm <= n):
                i += 1
                continue
            det = i + confirm - 1
            end = det
            while end + 1 < n and widening[end + 1]:
                end += 1
            if not self._sustained(g, i, det, float(thr[det])):
                i = end + 1
                continue
            onset, onset_range = self._onset(g, i, end)
            if out and onset <= (out[-1].end_step or 0) + g.window:
                # The same widening picked up again after a noisy pause: extend the episode.
                prev_f = out.pop()
                assert prev_f.onset_range is not None
                f = self._accel_finding(
                    g, prev_f.start_step, prev_f.onset_range, first_i, first_det, end
                )
            else:
                first_i, first_det = i, det
                f = self._accel_finding(g, onset, onset_range, i, det, end)
            out.append(f)
            i = end + 1
        return out

    @staticmethod
    def _sustained(g: Gap, i: int, det: int, thr: float) -> bool:
        """The widening must hold a window after detection: data-order wander comes back down.
        And so must the faster pace. A gap widening at a steady pace near its noise floor
        crosses the 1.5x line now and then by noise alone (the ratio of two noisy one-window
        differences) and then goes on at its old pace: the pace in the window after detection
        (from the detection step; the window up to it where the log ends within half a window)
        must still be 1.5x the pace before the first accelerating window, taken over the two
        windows before it where the log has them (half the noise of one)."""
        det_step = float(g.steps[det])
        later = min(det_step + g.window, float(g.steps[-1]))
        a = float(g.steps[i]) - g.window
        if not g.smooth_at(later) - g.smooth_at(a) > thr:
            return False
        if later - det_step >= g.window / 2:
            after = (
                float(g.smooth_at(later) - g.smooth_at(det_step)) * g.window / (later - det_step)
            )
        else:  # the log ends within half a window: the window up to detection
            after = float(g.growth_last[det])
        kb = 2 if a - 2 * g.window >= float(g.steps[0]) else 1
        before = max(float(g.smooth_at(a) - g.smooth_at(a - kb * g.window)) / kb, 0.0)
        # Past the 1.5x line by a tenth of the growth's noise floor: both paces are noisy
        # differences, and a steady widening at twice its noise a window crossed the bare line
        # by noise in 17 of 60 seeded runs (11 of 60 with the margin). A larger margin cuts
        # more (0.3: 6 of 60) but finds a gap that bends gradually (quadratic from step 8,000)
        # later, and dates it up to 5,000 steps after its bend.
        if not after - g.accel_ratio * before > SUSTAIN_MARGIN * thr:
            return False
        return _paces_part(g, a - kb * g.window, a, later)

    @staticmethod
    def _onset(g: Gap, i: int, end: int) -> tuple[int, tuple[int, int]]:
        """Where the gap bends upward: a two-piece fit from 4 windows before the first
        accelerating window ending at point i to 2 windows after it (offline: later points help).
        With the steps it cannot be told from: the fit's :attr:`Hinge.range`, else the evals
        either side."""
        vx = g.steps
        t = vx[i]
        sel = (vx >= t - 4 * g.window) & (vx <= min(vx[end], t + 2 * g.window))
        if sel.sum() >= 7:
            h = hinge_onset(vx[sel].astype(float), rolling_median(g.gap[sel], 3))
            if h is not None and h[2] > max(h[1], 0.0) and h[0] <= t:
                return h.onset, h.range
        onset = int(vx[int(np.searchsorted(vx, t - g.window))])
        return onset, bend_range(vx, onset)

    @staticmethod
    def _accel_finding(
        g: Gap, onset: int, onset_range: tuple[int, int], i: int, det: int, end: int
    ) -> Finding:
        vx = g.steps
        gl, gp = float(g.growth_last[i]), float(g.growth_prev[i])
        vsel = (vx >= vx[det] - g.window) & (vx <= vx[det])
        vs = theil_sen(vx[vsel], g.val[vsel]) if vsel.sum() >= 3 else None
        turned = bool(vs is not None and vs.slope > 0)
        seg = (vx >= onset) & (vx <= vx[end])
        peak = int(vx[seg][int(np.argmax(g.gap[seg]))]) if seg.any() else int(vx[det])
        floor = float(g.growth_floor[i])
        # A previous growth below the floor a growth must pass is flat within the noise:
        # a ratio to it ("190.8x") would be noise over noise.
        ratio_txt = (
            f"{gl / gp:.1f}x the previous window's"
            if gp >= floor and gp > 0
            else f"up from a previous window that was flat within the noise ({gp:+.2g}, "
            f"under the {floor:.2g} a growth must pass)"
            if gp > 0
            else "up from flat or shrinking in the previous window"
        )
        return Finding(
            kind=FindingKind.GAP_ACCELERATION,
            severity=Severity.WARNING,
            metric=g.metric,
            start_step=onset,
            peak_step=peak,
            end_step=int(vx[end]),
            onset_range=onset_range,
            measures={
                "growth_last": gl,
                "growth_prev": gp,
                "accel_ratio": gl / gp if gp > 0 else None,
                "window_steps": g.window,
                "val_noise": g.noise,
                "gap_at_onset": float(np.interp(onset, vx, g.gap)),
                "gap_now": float(g.gap[end]),
                "detected_step": int(vx[det]),
                "val_turned_up": turned,
            },
            judged_against={
                "accel_ratio": g.accel_ratio,
                "accel_line": g.accel_ratio * max(gp, 0.0),
                "noise_floor": float(g.growth_floor[i]),
                "noise": g.noise,
                "noise_k": g.noise_k,
                "window_steps": g.window,
            },
            summary=(
                f"The {'val' if g.metric == VAL_LOSS else g.metric}-train gap started widening "
                f"faster around step {onset:,}: +{num(gl, 3)} over the {g.window:,.0f} steps to "
                f"step {int(vx[i]):,}, {ratio_txt}"
                + (
                    f"; {_label(g)} is rising too."
                    if turned
                    else f"; {_label(g)} has not turned up yet."
                )
            ),
        )

    # -- overfitting -----------------------------------------------------------------
    def _overfitting(
        self, ev: Evidence, g: Gap, accel: list[Finding], since: float | None = None
    ) -> list[Finding]:
        """The held-out loss rising from its minimum while train falls; only the evals from
        ``since`` on are read (after a val-set shift, the new set's own minimum)."""
        keep = g.steps >= since if since is not None else np.ones(len(g.steps), dtype=bool)
        base = int(np.flatnonzero(keep)[0]) if keep.any() else len(g.steps)
        vx, vy = g.steps[keep], g.val[keep]
        if len(vy) < 3:
            return []
        smooth = rolling_median(vy, 3)
        m = int(np.argmin(smooth))
        lo, hi = max(0, m - 1), min(len(vy), m + 2)
        m = lo + int(np.argmin(vy[lo:hi]))
        after = len(vy) - 1 - m
        if after < 2:
            return []
        n_now = min(3, after)
        val_now = float(np.median(vy[-n_now:]))
        val_min = float(smooth[m])
        rise = val_now - val_min
        # Beyond the held-out loss's own eval noise, however small the rise is relative to
        # its level (a 1-2% rise over the last epoch of an SFT run counts).
        eval_noise = max(g.val_noise, 1e-9)
        rise_floor = self.params.overfit_noise_k * eval_noise
        if rise <= rise_floor:
            return []
        vs = theil_sen(vx[m:], vy[m:])
        if vs is None or vs.slope <= 0:
            return []
        t_s, t_v = g.train_after(vx[m])  # the train points from the val minimum on
        ts = theil_sen(t_s, t_v) if len(t_s) >= 3 else None
        del t_s, t_v
        if ts is None or ts.rising:
            return []  # train rising too: not the negative slope (see divergence)
        gi = base + m  # index of the minimum in the gap's arrays
        onset, end = int(vx[m]), int(vx[-1])
        t0, t1 = float(g.train[gi]), float(np.median(g.train[-n_now:]))
        train_change = 100.0 * (t1 - t0) / abs(t0) if t0 else None
        epoch, epoch_now = epoch_at(ev.series(EPOCH), onset), epoch_at(ev.series(EPOCH), end)
        # Still accelerating: an episode reaching the last window, or the 1.5x rule met at the
        # last val point (with the same noise floor as the episodes).
        accelerating = bool(
            any(f.end_step is not None and f.end_step >= end - g.window for f in accel)
            or g.accelerating[-1]
        )
        critical = (
            epoch_now is not None and epoch_now >= self.params.critical_epoch and accelerating
        )
        cps = ev.checkpoints
        best_ckpt = cps.before(onset)[0] if (cps.saved or cps.interval) else None
        tb = ev.trainer_best
        why_best = [f"lowest {_label(g)}"]
        if best_ckpt == onset:
            why_best.append("saved")
        if tb is not None and tb.step == onset:
            why_best.append("the trainer's recorded best too")
        mb = measured_best(cps, vx, vy, onset) if best_ckpt != onset else None
        if mb is not None:
            # (a later checkpoint the log measures as better than the last one before the
            # lowest val loss: the one to keep, as the rollback advice says)
            saved_txt = (
                f"; of the checkpoints saved, step {mb.step:,} has the lowest val loss at its "
                f"step ({num(mb.value)}; {num(mb.before_value)} at step "
                f"{mb.before_step:,}, the last saved at or before step {onset:,})"
            )
        elif best_ckpt is not None and best_ckpt != onset:
            saved_txt = f"; the last checkpoint saved at or before it is step {best_ckpt:,}"
        else:
            saved_txt = ""
        # (not "the best checkpoint is step 360" beside checkpoints known to be 200 and 400: a
        # model nobody kept; with none known, the step is the checkpoint to keep if saved)
        best_word = (
            "step is" if best_ckpt is not None and best_ckpt != onset else "checkpoint is step"
        )
        ckpt_txt = (
            f"; the best {best_word} {onset:,} ({'; '.join(why_best)})"
            + saved_txt
            + _trainer_best_text(ev, onset)
            + "."
        )
        # (1-based, the epoch running: "epoch 2" beside an HF log's epoch 1.25 read as a slip)
        ep_txt = f" (in the {ordinal(epoch)} epoch)" if epoch is not None else ""
        rise_pct = 100.0 * (val_now - float(vy[m])) / abs(float(vy[m])) if vy[m] else None
        pct_txt = f", {rise_pct:+.1f}%" if rise_pct is not None else ""
        train_txt = (
            f"while the train loss kept falling ({train_change:+.1f}%)"
            if train_change is not None and train_change < 0
            else (
                f"while the train loss did not rise ({train_change:+.1f}%)"
                if train_change is not None
                else "while the train loss kept falling"
            )
        )
        summary = (
            f"{_label(g, cap=True)} turned up at step {onset:,}{ep_txt}, from {num(float(vy[m]))} "
            f"to {num(val_now)} over {after} evals{pct_txt} (the median of the last {n_now}; "
            f"{num(float(vy[-1]))} at step {end:,}), {train_txt}"
            + ("; the gap is still accelerating" if accelerating else "")
            + ckpt_txt
        )
        return [
            Finding(
                kind=FindingKind.OVERFITTING,
                severity=Severity.CRITICAL if critical else Severity.WARNING,
                metric=g.metric,
                start_step=onset,
                peak_step=int(vx[m + int(np.argmax(vy[m:]))]),
                end_step=end,
                # The val loss turned up after its lowest eval and by the next one: evals are
                # all the log has of the turn (as eval_regression's best score).
                onset_range=(onset, int(vx[m + 1])) if m + 1 < len(vx) else None,
                measures={
                    "val_min": float(vy[m]),
                    "val_now": val_now,
                    "val_rise": val_now - float(vy[m]),
                    "val_rise_pct": rise_pct,
                    "evals_after_min": after,
                    "train_change_pct": train_change,
                    "gap_at_onset": float(g.gap[gi]),
                    "gap_now": float(np.median(g.gap[-n_now:])),
                    "epoch": epoch,
                    "epoch_now": epoch_now,
                    "gap_accelerating": accelerating,
                    "val_noise": g.noise,
                    "eval_noise": eval_noise,
                    "best_step": onset,
                    "best_checkpoint": best_ckpt,
                    "trainer_best_step": tb.step if tb else None,
                    "trainer_best_metric": tb.metric if tb else None,
                },
                judged_against={
                    "rise_floor": rise_floor,
                    "noise": eval_noise,
                    "critical_epoch": self.params.critical_epoch,
                },
                summary=summary,
            )
        ]

    # -- val shift -------------------------------------------------------------------
    def _val_shift(self, g: Gap) -> list[Finding]:
        """A step of the held-out loss, up or down, to a level that then holds, train smooth.

        For each pair of evals (i, j) at most ``shift_window`` apart, lines are fitted to the
        val and to the (despiked) train loss over the level window before i and after j; the
        step is the difference of the two lines in the middle of (i, j). A val-only step has
        a val step beyond the floor, a train step under half of it, and the same gap slope on
        both sides (the new level holds: no ramp starting there).
        """
        g = g.binned(400)  # long logs work on bin medians
        p = self.params
        vx, vy = g.steps.astype(float), g.val
        n = len(vy)
        side = 3
        if n < 2 * side:
            return []
        look = min(2.0 * p.shift_window, max(0.25 * float(np.ptp(vx)), 3 * g.interval))
        # Val lines over [x_i - look, x_i] (pre) and [x_j, x_j + look] (post), by index.
        pre_lo = np.searchsorted(vx, vx - look, side="left")
        post_hi = np.searchsorted(vx, vx + look, side="right")
        vpre, vpost = _lines_over(vx, vy, [(pre_lo, np.arange(n) + 1), (np.arange(n), post_hi)])
        tx, ty = g.train_steps_float(), g.train_values
        # (one pass of prefix sums over the train loss for both sides)
        tpre, tpost = _lines_over(
            tx,
            ty,
            [
                (np.searchsorted(tx, vx - look, side="left"), np.searchsorted(tx, vx, "right")),
                (np.searchsorted(tx, vx, side="left"), np.searchsorted(tx, vx + look, "right")),
            ],
        )
        del tx, ty  # (the lines are all that is read of the train loss: not held below)
        ii, jj = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        ok = (
            (jj > ii)
            # a step, or a ramp no longer than the level windows that judge it
            & (vx[jj] - vx[ii] <= min(float(p.shift_window), look))
            & (vpre.n[ii] >= side)
            & (vpost.n[jj] >= side)
            & (tpre.n[ii] >= 2)
            & (tpost.n[jj] >= 2)
            # "Then held" needs evidence: at least half a level window of log after the step.
            & ((vx[-1] - vx[jj]) >= 0.5 * look)
        )
        mid = 0.5 * (vx[ii] + vx[jj])
        jv = vpost.at(mid, jj) - vpre.at(mid, ii)
        jt = tpost.at(mid, jj) - tpre.at(mid, ii)
        jg = jv - jt
        # The gap's ramp is the same on both sides of the step: it holds, not accelerates.
        ramp = np.abs((vpost.slope[jj] - tpost.slope[jj]) - (vpre.slope[ii] - tpre.slope[ii]))
        # ... and its own ramp does not cover the step over the same distance (a steady climb
        # read through two line fits is not a step).
        span = np.maximum(vx[jj] - vx[ii], g.interval)
        own = np.maximum(
            np.abs(vpre.slope[ii] - tpre.slope[ii]), np.abs(vpost.slope[jj] - tpost.slope[jj])
        )
        level = np.abs(vpre.at(mid, ii))
        floor = np.maximum(p.shift_noise_k * g.noise, p.min_rel_shift * level)
        with np.errstate(invalid="ignore"):
            ok &= (
                (np.abs(jt) <= 0.5 * np.abs(jv))
                & (np.sign(jv) == np.sign(jg))
                & (ramp * look <= 0.5 * np.abs(jg))
                & (own * span <= 0.5 * np.abs(jg))
                & (vpre.resid[ii] <= 0.25 * np.abs(jv))
                & (vpost.resid[jj] <= 0.25 * np.abs(jv))
            )
        # The calibration score: the biggest step of the right shape, over its floor.
        self._shift_score = float(np.max(np.where(ok, np.abs(jv) / floor, 0.0), initial=0.0))
        ok &= np.abs(jv) > floor
        score = np.where(ok, np.abs(jg), 0.0)
        order = np.argsort(-score, axis=None)
        for flat in order[:20]:  # the biggest candidate steps only
            i, j = (int(k) for k in np.unravel_index(flat, score.shape))
            if not ok[i, j]:
                break  # sorted: nothing further passed
            f = self._shift_finding(
                g,
                i,
                j,
                float(jv[i, j]),
                float(vpre.at(mid[i, j], i)),
                float(vpost.at(mid[i, j], j)),
                float(jt[i, j]),
                float(floor[i, j]),
                look,
            )
            if f is not None:
                return [f]
        return []

    def _shift_finding(
        self,
        g: Gap,
        i: int,
        j: int,
        J: float,
        before: float,
        after: float,
        train_change: float,
        floor: float,
        look: float,
    ) -> Finding | None:
        vx = g.steps
        pre_sel = (vx >= vx[i] - look) & (vx <= vx[i])
        post_sel = (vx >= vx[j]) & (vx <= vx[j] + look)
        # Robust confirmation: the gap's Theil-Sen slopes before and after agree.
        gpre = theil_sen(vx[pre_sel], g.gap[pre_sel])
        gpost = theil_sen(vx[post_sel], g.gap[post_sel])
        if gpre is None or gpost is None:
            return None
        if abs(gpost.slope - gpre.slope) * look > 0.5 * abs(J):
            return None  # the gap ramps on after the step: acceleration, not a new val set
        gap_slope = gpost.per_1k()
        word = "rose" if J > 0 else "fell"
        # The start and end of the step: z is 0 on the old line and 1 on the new one.
        x = vx.astype(float)
        old = np.polyval(np.polyfit(x[pre_sel], g.val[pre_sel], 1), x)
        new = np.polyval(np.polyfit(x[post_sel], g.val[post_sel], 1), x)
        step = np.where(np.abs(new - old) > 1e-12, new - old, J)
        i, j = _pin_ramp(x, (g.val - old) / step, i, j)
        # The levels stated are the two lines, refitted on the windows of the pinned step, at
        # the last old and the first new eval.
        pre_sel = (vx >= vx[i] - look) & (vx <= vx[i])
        post_sel = (vx >= vx[j]) & (vx <= vx[j] + look)
        if pre_sel.sum() >= 2 and post_sel.sum() >= 2:
            old = np.polyval(np.polyfit(x[pre_sel], g.val[pre_sel], 1), x)
            new = np.polyval(np.polyfit(x[post_sel], g.val[post_sel], 1), x)
        before, after = float(old[i]), float(new[j])
        tx, ty, mid = g.train_steps_float(), g.train_values, 0.5 * float(vx[i] + vx[j])
        tpre = (tx >= vx[i] - look) & (tx <= vx[i])
        tpost = (tx >= vx[j]) & (tx <= vx[j] + look)
        if tpre.sum() >= 2 and tpost.sum() >= 2:
            train_change = float(
                np.polyval(np.polyfit(tx[tpost], ty[tpost], 1), mid)
                - np.polyval(np.polyfit(tx[tpre], ty[tpre], 1), mid)
            )
        J = after - before
        floor = max(self.params.shift_noise_k * g.noise, self.params.min_rel_shift * abs(before))
        if abs(J) <= floor:
            return None
        logged = _logged_text(before, after, g.val[i], g.val[j])
        why = (
            "check whether the validation set changed"
            if J > 0
            else "check whether the validation set changed (an easier set reads as progress)"
        )
        return Finding(
            kind=FindingKind.VAL_SHIFT,
            severity=Severity.WARNING,
            metric=g.metric,
            start_step=int(vx[i]),
            peak_step=int(vx[j]),
            end_step=int(vx[-1]),
            measures={
                "direction": "up" if J > 0 else "down",
                "val_before": before,
                "val_after": after,
                "val_logged_before": float(g.val[i]),
                "val_logged_after": float(g.val[j]),
                "shift": J,
                "shift_pct": 100.0 * J / abs(before) if before else None,
                "ramp_steps": int(vx[j] - vx[i]),
                "train_change": train_change,
                "gap_slope_after_per_1k": gap_slope,
                "gap_slope_before_per_1k": gpre.per_1k(),
                "val_noise": g.noise,
            },
            judged_against={
                "shift_floor": floor,
                "noise": g.noise,
                "shift_window": self.params.shift_window,
            },
            summary=(
                f"{_label(g, cap=True)} {word} from {num(before)} to {num(after)} between steps "
                f"{int(vx[i]):,} and {int(vx[j]):,}{logged} and then held, while the train loss "
                f"stepped only {train_change:+.3g}; {why}."
            ),
        )


@dataclass(frozen=True)
class _Lines:
    """Least-squares lines over index windows [lo, hi) of one series, one per window."""

    n: np.ndarray
    mx: np.ndarray
    my: np.ndarray
    slope: np.ndarray
    resid: np.ndarray  # root-mean-square residual around the line

    def at(self, x: np.ndarray | float, k: np.ndarray | int) -> np.ndarray:
        return self.my[k] + self.slope[k] * (x - self.mx[k])


def _lines(x: np.ndarray, y: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> _Lines:
    """Least-squares lines of y on x over each window [lo, hi) (see :func:`_lines_over`)."""
    return _lines_over(x, y, [(lo, hi)])[0]


def _lines_over(
    x: np.ndarray, y: np.ndarray, windows: list[tuple[np.ndarray, np.ndarray]]
) -> list[_Lines]:
    """Least-squares lines of y on x over each window [lo, hi), for each (lo, hi) of
    ``windows``, from one pass of prefix sums (x centred and scaled first, so that long step
    counts lose no precision). The sums read at a window's ends do not depend on which other
    ends are read: each window set's lines are the ones computed alone.

    The prefix sums are read only at the windows' ends: they are accumulated block by block
    (each block's running sum continued from the last, the same additions in the same order
    as one ``np.cumsum``), so a million-point train loss costs a few blocks of temporaries
    instead of six whole-length sums and their products (about 80 MiB)."""
    if len(x) == 0:
        out = []
        for lo, _ in windows:
            z = np.zeros(len(lo))
            out.append(_Lines(z.astype(int), z, z, z, z + np.inf))
        return out
    c, sc = float(np.mean(x)), max(float(np.ptp(x)), 1.0)
    yc = float(np.mean(y))
    ends = [(np.asarray(lo), np.asarray(hi)) for lo, hi in windows]
    where = np.concatenate([a.ravel() for pair in ends for a in pair])
    need, sums = _prefix_sums_at(x, y, c, sc, yc, where)
    return [_fit_lines(need, sums, lo, hi, c, sc, yc) for lo, hi in ends]


def _fit_lines(
    need: np.ndarray,
    sums: list[np.ndarray],
    lo: np.ndarray,
    hi: np.ndarray,
    c: float,
    sc: float,
    yc: float,
) -> _Lines:
    """The lines over windows [lo, hi) from the prefix sums at ``need`` (their positions)."""
    at_lo, at_hi = np.searchsorted(need, lo), np.searchsorted(need, hi)
    su, sw, suu, suw, sww = (s[at_hi] - s[at_lo] for s in sums)
    n = hi.astype(float) - lo.astype(float)  # the prefix sums of ones (exact below 2**53)
    with np.errstate(invalid="ignore", divide="ignore"):
        mu, mw = su / n, sw / n
        vu = suu / n - mu * mu
        cov = suw / n - mu * mw
        b = np.where(vu > 1e-12, cov / vu, 0.0)
        res = np.maximum(sww / n - mw * mw - b * cov, 0.0)
    return _Lines(
        n=n.astype(int),
        mx=np.nan_to_num(mu) * sc + c,
        my=np.nan_to_num(mw) + yc,
        slope=np.nan_to_num(b) / sc,
        resid=np.where(n > 0, np.sqrt(np.nan_to_num(res)), np.inf),
    )


_SUM_BLOCK = 1 << 16  # points of a prefix sum accumulated at a time


def _prefix_sums_at(
    x: np.ndarray, y: np.ndarray, c: float, sc: float, yc: float, where: np.ndarray
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The prefix sums ``s = concatenate([[0], cumsum(a)])`` of a = u, w, u*u, u*w, w*w
    (u = (x - c) / sc, w = y - yc) at the positions ``where``: returns the sorted distinct
    positions and each sum's values there."""
    n = len(x)
    need = np.unique(where)
    got = [np.zeros(len(need)) for _ in range(5)]  # s[0] = 0
    carry = [0.0] * 5
    for a in range(0, n, _SUM_BLOCK):
        b = min(a + _SUM_BLOCK, n)
        u = (x[a:b] - c) / sc
        w = y[a:b] - yc
        # s[a + 1 .. b] are this block's running sums
        first, last = np.searchsorted(need, a + 1, "left"), np.searchsorted(need, b, "right")
        at = need[first:last] - (a + 1)
        for k, term in enumerate((u, w, u * u, u * w, w * w)):
            if a == 0:
                run = np.cumsum(term)
            else:  # the running sum continued: carry + a0, then + a1, ... (cumsum's order)
                run = np.cumsum(np.concatenate(([carry[k]], term)))[1:]
            got[k][first:last] = run[at]
            carry[k] = run[-1]
    return need, got


def _logged_text(before: float, after: float, at_before: float, at_after: float) -> str:
    """The values logged at a level shift's two ends, where they differ from the fitted levels
    the sentence states (to its four digits): the chart beside it shows the logged ones."""
    if f"{num(before)}" == f"{num(at_before)}" and f"{num(after)}" == f"{num(at_after)}":
        return ""
    return f" (levels of lines fitted on each side; {num(at_before)} and {num(at_after)} logged)"


def _trainer_best_text(ev: Evidence, best: int) -> str:
    """What the trainer's own record of its best checkpoint adds (HF's
    ``best_model_checkpoint``) when it is another step: its step and the eval series it judged
    by (whisper fine-tunes pick by WER, which may keep improving while the val loss turns up)."""
    text = ev.trainer_best_clause(best)
    return f"; {text}" if text else ""


def _label(g: Gap, cap: bool = False) -> str:
    """How a summary names the held-out loss: "val loss", or the eval set's metric."""
    if g.metric == VAL_LOSS:
        return "Val loss" if cap else "val loss"
    return g.metric


def _pin_ramp(x: np.ndarray, z: np.ndarray, i: int, j: int) -> tuple[int, int]:
    """Refine a level shift's start and end indices; z is 0 at the old level and 1 at the new.

    The mid-section of the ramp (0.2 <= z <= 0.8) is fitted with a line; where the line meets
    the old and the new level gives the start and the end, snapped to logged val steps. An
    abrupt jump has no mid-section: the last point below half-way and the next one are used.
    """
    idx = np.arange(len(z))
    zone = (idx >= max(0, i - 2)) & (idx <= min(len(z) - 1, j + 2))
    mid = zone & (z >= 0.2) & (z <= 0.8)
    if mid.sum() >= 2 and np.ptp(x[mid]) > 0:
        b, a = np.polyfit(x[mid], z[mid], 1)
        if b > 0:
            s0, s1 = -a / b, (1.0 - a) / b
            first, last = max(0, i - 2), min(len(x) - 1, j + 2)  # within the zone
            k0 = int(np.clip(np.searchsorted(x, s0 + 1e-9, side="right") - 1, first, last))
            k1 = int(np.clip(np.searchsorted(x, s1 - 1e-9, side="left"), first, last))
            return k0, max(k1, k0 + 1)
    below = np.flatnonzero(zone & (z < 0.5))
    k0 = int(below[-1]) if len(below) else i
    return k0, min(len(z) - 1, k0 + 1)


def _paces_part(g: Gap, start: float, bend: float, later: float) -> bool:
    """Do the gap's own readings say the pace changed? Least-squares lines through every gap
    reading from ``start`` to ``bend`` and from ``bend`` to ``later``: the later slope must
    pass accel_ratio x the earlier one (a falling one counts as 0) by ``PACE_SE_K`` standard
    errors of that difference, the noise taken from both lines' residuals.
    :meth:`TrainValDetector._sustained` compares paces that are differences of two smoothed
    readings each; every reading between counts here, so a steady widening whose two end
    readings happened to fall apart is not taken for a bend (11 of 60 seeded steady
    widenings drew the warning on the endpoint test alone, 4 with this one; bends to 3x and
    7x the pace were found as often as before, one to 2x the pace in 19 of 40 seeds against
    23). One standard error cut the false alarms to 1 of 60 but found the 2x bend in 12 of
    40 and the 3x in 35 of 40 instead of 38."""
    x = g.steps.astype(float)
    ok = np.isfinite(g.gap)
    pre = ok & (x >= start) & (x <= bend)
    post = ok & (x >= bend) & (x <= later)
    if pre.sum() < 3 or post.sum() < 3:  # too few readings for a line: the endpoint test
        return True
    fits = [_line(x[sel], g.gap[sel]) for sel in (pre, post)]
    (b0, sxx0, rss0), (b1, sxx1, rss1) = fits
    dof = int(pre.sum() + post.sum()) - 4
    if dof < 1 or not (sxx0 > 0 and sxx1 > 0):
        return True
    var = (rss0 + rss1) / dof
    se = float(np.sqrt(var / sxx1 + g.accel_ratio**2 * var / sxx0))
    return bool(b1 - g.accel_ratio * max(b0, 0.0) > PACE_SE_K * se)


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least-squares slope, the spread of ``x`` (sum of squared deviations) and the residual
    sum of squares."""
    xc, yc = x - x.mean(), y - y.mean()
    sxx = float(xc @ xc)
    b = float(xc @ yc) / sxx if sxx > 0 else 0.0
    r = yc - b * xc
    return b, sxx, float(r @ r)


def _in_divergence(ev: Evidence, f: Finding) -> Finding:
    """A gap acceleration first confirmed at or after the onset of a divergence of the train
    loss is part of it: the held-out loss read after the blow-up follows it, and the
    widening could not be told without those readings. It is a note pointing at the
    divergence, as a spike inside one is (an acceleration confirmed before the blow-up is
    the article's yellow light and stays a warning)."""
    det = f.measures["detected_step"]
    assert isinstance(det, int)
    hit = next(((a, b) for a, b in ev.diverged if a <= det), None)
    measures = {**f.measures, "divergence_from": hit[0] if hit is not None else None}
    if hit is None:
        return replace(f, measures=measures)
    a, b = hit
    return replace(
        f,
        severity=Severity.INFO,
        measures=measures,
        summary=f.summary
        + (
            f" Confirmed at step {det:,}, inside the divergence of steps {a:,}-{b:,}: part of"
            " it (judged there), not an event of its own."
        ),
    )
