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
  loss wanders with the data order and such wander comes back down), and is reported at its
  onset (where the gap bends upward), usually before the val loss itself turns up.
* ``overfitting`` (warning): the negative slope, train falling while val rises from its
  minimum. Critical from the fifth epoch on when the gap keeps accelerating, as the article
  grades it.
* ``val_shift`` (warning): val jumps up to a new level within a few thousand steps and stays
  there while train is flat, so the gap stops widening: the article's snapshot effect
  (section 5.4). The first thing to check is whether the validation set changed. Only upward
  shifts are looked for (a val set that got easier is not reported), and the new level must
  hold for at least half a level window before the log ends.

Measures:

kind ``gap_acceleration``

| key | meaning |
|---|---|
| `growth_last` | gap growth over the window ending at the detection step |
| `growth_prev` | gap growth over the window before it |
| `accel_ratio` | growth_last / growth_prev (null when growth_prev <= 0) |
| `window_steps` | window length in steps |
| `val_noise` | noise of the val-train gap (robust sigma, at least the val noise) |
| `gap_at_onset` | gap at the onset step |
| `gap_now` | gap at the last val step of the episode |
| `detected_step` | first val step where the acceleration was confirmed |
| `val_turned_up` | true when val was rising over the last window at detection |

kind ``overfitting``

| key | meaning |
|---|---|
| `val_min` | val loss at the onset (its lowest point) |
| `val_now` | val loss now (median of the last val points) |
| `val_rise` | val_now - val_min |
| `train_change_pct` | smoothed train-loss change from the onset to the end, in % |
| `gap_at_onset` | gap at the onset |
| `gap_now` | gap now |
| `epoch` | epoch (1-based) at the onset; null when no epoch series |
| `epoch_now` | epoch (1-based) at the last val step; null when no epoch series |
| `gap_accelerating` | true when the gap was still accelerating at the end |
| `val_noise` | noise of the val-train gap (robust sigma, at least the val noise) |

kind ``val_shift``

| key | meaning |
|---|---|
| `val_before` | val level before the shift (median) |
| `val_after` | val level after it (median) |
| `shift` | val_after - val_before |
| `shift_pct` | shift in % of val_before |
| `ramp_steps` | steps between the last old-level point and the first new-level point |
| `train_change` | train level change across the same split |
| `gap_slope_after_per_1k` | gap slope after the shift, per 1000 steps (about 0: stopped widening) |
| `val_noise` | noise of the val-train gap (robust sigma, at least the val noise) |

Judged against (``Finding.judged_against``):

* ``gap_acceleration``: `accel_ratio` (1.5), `accel_line` (accel_ratio x the previous
  window's growth, at least 0), `noise_floor` (what the growth had to exceed), `noise`,
  `noise_k`, `window_steps`.
* ``overfitting``: `rise_floor` (overfit_noise_k x noise, what the val rise had to exceed),
  `noise`, `critical_epoch`.
* ``val_shift``: `shift_floor` (the larger of shift_noise_k x noise and min_rel_shift x the
  old level), `noise`, `shift_window`.
"""

from __future__ import annotations

import numpy as np

from forensics.evidence import Evidence
from forensics.evidence.gap import Gap
from forensics.evidence.trend_utils import hinge_onset, rolling_median, theil_sen
from forensics.findings import Finding, FindingKind, Severity
from forensics.params import TrainValParams
from forensics.schema import EPOCH, LOSS, VAL_LOSS

CHECK = "train_val"


class TrainValDetector:
    """Gap acceleration, overfitting (negative slope) and val-set shifts."""

    name = CHECK

    def __init__(self, params: TrainValParams | None = None) -> None:
        self.params = params or TrainValParams()

    def _gap(self, ev: Evidence) -> Gap | None:
        """The evidence's gap, or None with a note saying why the checks did not run."""
        n_train, n_val = len(ev.series(LOSS)), len(ev.series(VAL_LOSS))
        missing = [m for m, n in ((LOSS, n_train), (VAL_LOSS, n_val)) if n == 0]
        if missing:
            ev.run.note(
                f"{CHECK}: not run (gap_acceleration, overfitting, val_shift), "
                f"no {' or '.join(missing)} series"
            )
            return None
        need = self.params.min_val_points
        g = None
        if n_val >= need and n_train >= 5:
            # The evidence's gap, built with the configured train_val parameters (a detector
            # configured apart from them, as in a test, reads evidence built with its own).
            g = ev.using(CHECK, self.params).gap
        if g is None:
            ev.run.note(
                f"{CHECK}: not run, only {n_val} val and {n_train} train points "
                f"(need {max(need, 2)} and 5)"
            )
        return g

    def detect(self, ev: Evidence) -> list[Finding]:
        g = self._gap(ev)
        if g is None:
            return []
        accel = self._acceleration(g)
        shift = self._val_shift(g)
        if shift:  # a widening that the val-set shift explains is not reported twice
            s0, s1 = shift[0].start_step, shift[0].peak_step or shift[0].start_step
            accel = [
                f
                for f in accel
                if not (f.start_step <= s1 + g.window and (f.end_step or f.start_step) >= s0)
            ]
        return accel + self._overfitting(ev, g, accel) + shift

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
            onset = self._onset(g, i, end)
            if out and onset <= (out[-1].end_step or 0) + g.window:
                # The same widening picked up again after a noisy pause: extend the episode.
                prev_f = out.pop()
                f = self._accel_finding(g, prev_f.start_step, first_i, first_det, end)
            else:
                first_i, first_det = i, det
                f = self._accel_finding(g, onset, i, det, end)
            out.append(f)
            i = end + 1
        return out

    @staticmethod
    def _sustained(g: Gap, i: int, det: int, thr: float) -> bool:
        """The widening must hold a window after detection: data-order wander comes back down."""
        later = min(float(g.steps[det]) + g.window, float(g.steps[-1]))
        return bool(g.smooth_at(later) - g.smooth_at(float(g.steps[i]) - g.window) > thr)

    @staticmethod
    def _onset(g: Gap, i: int, end: int) -> int:
        """Where the gap bends upward: a two-piece fit from 4 windows before the first
        accelerating window ending at point i to 2 windows after it (offline: later points help)."""
        vx = g.steps
        t = vx[i]
        sel = (vx >= t - 4 * g.window) & (vx <= min(vx[end], t + 2 * g.window))
        if sel.sum() >= 7:
            h = hinge_onset(vx[sel].astype(float), rolling_median(g.gap[sel], 3))
            if h is not None and h[2] > max(h[1], 0.0) and h[0] <= t:
                return int(h[0])
        return int(vx[int(np.searchsorted(vx, t - g.window))])

    @staticmethod
    def _accel_finding(g: Gap, onset: int, i: int, det: int, end: int) -> Finding:
        vx = g.steps
        gl, gp = float(g.growth_last[i]), float(g.growth_prev[i])
        vsel = (vx >= vx[det] - g.window) & (vx <= vx[det])
        vs = theil_sen(vx[vsel], g.val[vsel]) if vsel.sum() >= 3 else None
        turned = bool(vs is not None and vs.slope > 0)
        seg = (vx >= onset) & (vx <= vx[end])
        peak = int(vx[seg][int(np.argmax(g.gap[seg]))]) if seg.any() else int(vx[det])
        ratio_txt = (
            f"{gl / gp:.1f}x the previous window's"
            if gp > 0
            else "up from flat or shrinking in the previous window"
        )
        return Finding(
            kind=FindingKind.GAP_ACCELERATION,
            severity=Severity.WARNING,
            metric=VAL_LOSS,
            start_step=onset,
            peak_step=peak,
            end_step=int(vx[end]),
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
                f"The val-train gap started widening faster around step {onset}: +{gl:.3g} over "
                f"the {g.window:.0f} steps to {int(vx[i])}, {ratio_txt}"
                + ("; val loss is rising too." if turned else "; val loss has not turned up yet.")
            ),
        )

    # -- overfitting -----------------------------------------------------------------
    def _overfitting(self, ev: Evidence, g: Gap, accel: list[Finding]) -> list[Finding]:
        vx, vy = g.steps, g.val
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
        rise_floor = self.params.overfit_noise_k * g.noise
        if rise <= rise_floor:
            return []
        vs = theil_sen(vx[m:], vy[m:])
        if vs is None or vs.slope <= 0:
            return []
        tsel = g.train_steps >= vx[m]
        ts = theil_sen(g.train_steps[tsel], g.train_values[tsel]) if tsel.sum() >= 3 else None
        if ts is None or not ts.falling:
            return []  # train not falling: not the negative slope (see val_shift / divergence)
        onset, end = int(vx[m]), int(vx[-1])
        t0, t1 = float(g.train[m]), float(np.median(g.train[-n_now:]))
        train_change = 100.0 * (t1 - t0) / abs(t0) if t0 else None
        epoch, epoch_now = _epoch_at(ev, onset), _epoch_at(ev, end)
        # Still accelerating: an episode reaching the last window, or the 1.5x rule met at the
        # last val point (with the same noise floor as the episodes).
        accelerating = bool(
            any(f.end_step is not None and f.end_step >= end - g.window for f in accel)
            or g.accelerating[-1]
        )
        critical = (
            epoch_now is not None and epoch_now >= self.params.critical_epoch and accelerating
        )
        ep_txt = f" (epoch {epoch})" if epoch is not None else ""
        if train_change is not None:
            summary = (
                f"Val loss turned up at step {onset}{ep_txt}, from {float(vy[m]):.4g} to "
                f"{val_now:.4g}, while the train loss kept falling ({train_change:+.1f}%)"
                + ("; the gap is still accelerating." if accelerating else ".")
            )
        else:
            summary = (
                f"Val loss turned up at step {onset}{ep_txt} while the train loss kept falling."
            )
        return [
            Finding(
                kind=FindingKind.OVERFITTING,
                severity=Severity.CRITICAL if critical else Severity.WARNING,
                metric=VAL_LOSS,
                start_step=onset,
                peak_step=int(vx[m + int(np.argmax(vy[m:]))]),
                end_step=end,
                measures={
                    "val_min": float(vy[m]),
                    "val_now": val_now,
                    "val_rise": val_now - float(vy[m]),
                    "train_change_pct": train_change,
                    "gap_at_onset": float(g.gap[m]),
                    "gap_now": float(np.median(g.gap[-n_now:])),
                    "epoch": epoch,
                    "epoch_now": epoch_now,
                    "gap_accelerating": accelerating,
                    "val_noise": g.noise,
                },
                judged_against={
                    "rise_floor": rise_floor,
                    "noise": g.noise,
                    "critical_epoch": self.params.critical_epoch,
                },
                summary=summary,
            )
        ]

    # -- val shift -------------------------------------------------------------------
    def _val_shift(self, g: Gap) -> list[Finding]:
        g = g.binned(400)  # the pair search is quadratic: long logs work on bin medians
        vx, vy = g.steps.astype(float), g.val
        n = len(vy)
        side = 3
        if n < 2 * side:
            return []
        # Levels are medians over up to two shift windows on each side (less on short logs).
        look = min(2.0 * self.params.shift_window, max(0.25 * float(np.ptp(vx)), 3 * g.interval))
        pre_sel = [(vx >= vx[i] - look) & (vx <= vx[i]) for i in range(n)]
        post_sel = [(vx >= vx[j]) & (vx <= vx[j] + look) for j in range(n)]
        pre = np.array([np.median(vy[s]) for s in pre_sel])
        post = np.array([np.median(vy[s]) for s in post_sel])
        npre = np.array([s.sum() for s in pre_sel])
        npost = np.array([s.sum() for s in post_sel])
        ii, jj = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        ok = (
            (jj > ii)
            & (vx[jj] - vx[ii] <= self.params.shift_window)
            & (npre[ii] >= side)
            & (npost[jj] >= side)
        )
        # Upward shifts only (the article's snapshot effect: val jumps up while train is flat).
        # Downward candidates are nearly all the early fall of training, which would crowd the
        # real shift out of the few biggest candidates tried below.
        ok &= post[jj] > pre[ii]
        # "Then held" needs evidence: at least half a level window of log after the jump.
        ok &= (vx[-1] - vx[jj]) >= 0.5 * look
        jump = np.where(ok, post[jj] - pre[ii], 0.0)
        order = np.argsort(-np.abs(jump), axis=None)
        for flat in order[:20]:  # the biggest candidate shifts only
            i, j = (int(k) for k in np.unravel_index(flat, jump.shape))
            J, before = float(jump[i, j]), float(pre[i])
            floor = max(
                self.params.shift_noise_k * g.noise, self.params.min_rel_shift * abs(before)
            )
            if not ok[i, j] or abs(J) <= floor:
                break  # sorted: nothing further can pass
            f = self._shift_finding(g, i, j, J, before, float(post[j]), look)
            if f is not None:
                return [f]
        return []

    def _shift_finding(
        self, g: Gap, i: int, j: int, J: float, before: float, after: float, look: float
    ) -> Finding | None:
        vx = g.steps
        pre_sel = (vx >= vx[i] - look) & (vx <= vx[i])
        post_sel = (vx >= vx[j]) & (vx <= vx[j] + look)
        for sel in (pre_sel, post_sel):
            s = theil_sen(vx[sel], g.val[sel])
            if s is None or abs(s.slope * float(np.ptp(vx[sel]))) > 0.5 * abs(J):
                return None  # a trend, not a level change
        t_before, t_after = float(np.median(g.train[pre_sel])), float(np.median(g.train[post_sel]))
        train_change = t_after - t_before
        tx, ty = g.train_steps, g.train_values
        tsel = (tx >= vx[i] - look) & (tx <= vx[j] + look)
        ts = theil_sen(tx[tsel], ty[tsel]) if tsel.sum() >= 3 else None
        if abs(train_change) > 0.5 * abs(J) or (
            ts is not None and abs(ts.slope * float(np.ptp(tx[tsel]))) > 0.5 * abs(J)
        ):
            return None  # train moved too: not a val-only shift
        gs = theil_sen(vx[post_sel], g.gap[post_sel])
        gap_slope = gs.per_1k() if gs is not None else None
        if gs is not None and abs(gs.slope * float(np.ptp(vx[post_sel]))) > 0.5 * abs(J):
            return None  # the gap keeps widening after the jump: overfitting, not a new val set
        word = "rose" if J > 0 else "fell"
        i, j = _pin_ramp(vx.astype(float), np.sign(J) * (g.val - before) / abs(J), i, j)
        return Finding(
            kind=FindingKind.VAL_SHIFT,
            severity=Severity.WARNING,
            metric=VAL_LOSS,
            start_step=int(vx[i]),
            peak_step=int(vx[j]),
            end_step=int(vx[-1]),
            measures={
                "val_before": before,
                "val_after": after,
                "shift": J,
                "shift_pct": 100.0 * J / abs(before) if before else None,
                "ramp_steps": int(vx[j] - vx[i]),
                "train_change": train_change,
                "gap_slope_after_per_1k": gap_slope,
                "val_noise": g.noise,
            },
            judged_against={
                "shift_floor": max(
                    self.params.shift_noise_k * g.noise, self.params.min_rel_shift * abs(before)
                ),
                "noise": g.noise,
                "shift_window": self.params.shift_window,
            },
            summary=(
                f"Val loss {word} from {before:.4g} to {after:.4g} between steps {int(vx[i])} "
                f"and {int(vx[j])} and then held, while train moved only {train_change:+.3g}; "
                "check whether the validation set changed."
            ),
        )


def _epoch_at(ev: Evidence, step: int) -> int | None:
    """1-based epoch at a step, from the run's epoch series (HF floats or Lightning integers)."""
    e_series = ev.series(EPOCH)
    if e_series.empty:
        return None
    e = float(np.interp(step, e_series.steps, e_series.values))
    return int(np.floor(e + 1e-9)) + 1


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
            k0 = int(np.clip(np.searchsorted(x, s0 + 1e-9, side="right") - 1, 0, len(x) - 1))
            k1 = int(np.clip(np.searchsorted(x, s1 - 1e-9, side="left"), 0, len(x) - 1))
            return k0, max(k1, k0 + 1)
    below = np.flatnonzero(zone & (z < 0.5))
    k0 = int(below[-1]) if len(below) else i
    return k0, min(len(z) - 1, k0 + 1)
