"""grad_norm_drift: the grad norm trending up while the loss keeps falling (article section 3).

The article's incident: from step ~6500 the grad norm climbed from about 0.8 to 2.5 and did
not come back down, while the loss curve fell smoothly; the benchmark score was already
slipping. Single spikes are the spike detectors' business, so they are filtered out before
any fit (rolling median + k * MAD). The level now is compared with the evidence's grad-norm
band (``Evidence.grad_norm_band``, the lines the report's chart draws): warning at 2x,
critical at 3x.
When the loss rises over the same stretch (a significant upward slope, or a level more than 2%
above the one at the onset) the pair is a divergence, left to the divergence detector. A
divergence the divergence detector found after the baseline window ends the stretch judged: a
climb that led into the blow-up while the loss still fell is a drift up to its onset (and the
divergence's cause), as a climb that ran into NaN is.

A grad norm still coming down from start-up through the baseline window overstates the level
a climb begins from: when it went on falling below ``settled_below`` x the baseline, the climb
is judged from where it settled (the median of ``baseline_window`` steps around its low).

Judged against the LR schedule: with weight decay, a decaying LR raises the grad norm by itself
(Defazio et al. 2025, "Why Gradients Rapidly Increase Near the End of Training", arXiv
2506.02285: for normalized layers at equilibrium grad norm / weight norm ~ sqrt(2 wd / lr), so
the grad norm grows about as sqrt(lr_baseline / lr_now)). That rise is the envelope
``E = min(envelope_max, (lr_baseline / lr_now) ** envelope_exponent)`` (at least 1; the cap
because equilibrium is never reached as the LR nears zero), and the alarm lines move with it:
warning at ``max(2, envelope_margin * E)`` x baseline, critical at 1.5x that (at least 3x).
A climb past 2x that is under the moving warning line now, and that passed 2x while the LR was
decaying (a decay or cooldown phase of ``Evidence.schedule``, the LR down to 90% of the
baseline's or less), is ``info``: the schedule explains it, and a weight decay scaled with the
LR (AdamC) removes it if it matters. A climb past the moving line, one that began at a
constant LR (a WSD run's stable phase), or any climb at a constant LR (``E = 1``) is the
article's warning.
Without a logged LR the two cannot be told apart: the plain 2x / 3x lines are used and the
finding says so (``lr_logged`` false).

The measures of its finding kinds are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forensics.evidence import Band, Evidence
from forensics.evidence.baseline import Baseline
from forensics.evidence.trend_utils import (
    MAD_SCALE,
    bend_range,
    bin_median,
    hinge_onset,
    interp,
    num,
    rolling_median,
    sig,
    theil_sen,
    times,
)
from forensics.findings import Finding, FindingKind, Severity
from forensics.params import GradNormDriftParams
from forensics.schema import GRAD_NORM, LOSS

CHECK = "grad_norm_drift"
# The expected rise (LR at most 90% of the baseline's) by the 2x crossing for the schedule to
# explain a climb: a climb that comes before the LR moves is not the LR's doing.
_MIN_DECAYED_RISE = (1 / 0.9) ** 0.5


@dataclass
class DriftResult:
    """The drift analysis (``Evidence.drift``), shared with the eval-regression detector."""

    flagged: bool
    severity: Severity | None = None
    onset_step: int = 0
    end_step: int = 0
    peak_step: int = 0
    measures: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    judged_against: dict[str, Any] = field(default_factory=dict)
    onset_range: tuple[int, int] | None = None  # (Finding.onset_range)

    @property
    def alarming(self) -> bool:
        """A drift the LR schedule does not explain (warning or worse)."""
        return self.flagged and self.severity is not None and self.severity != Severity.INFO


def analyze_drift(ev: Evidence) -> DriftResult | None:
    """The drift analysis against ``ev.grad_norm_band`` (baseline, warn and critical ratios as
    configured) with the other ``grad_norm_drift`` parameters of ``ev.params``; None when the
    run cannot support it (reason noted). Read it as ``Evidence.drift`` (computed once)."""
    run = ev.run
    p = ev.params.grad_norm_drift
    g = ev.series(GRAD_NORM)
    x, y = g.steps, g.values
    if len(x) == 0:
        run.note(f"{CHECK}: not run, the run has no grad_norm series")
        return None
    if len(x) < p.min_points:
        run.note(f"{CHECK}: not run, only {len(x)} finite grad_norm points (need {p.min_points})")
        return None
    band = ev.grad_norm_band  # 500 steps after the warm-up; at most a fifth of a short log
    if band is None or not band.baseline.value > 0:
        run.note(f"{CHECK}: not run, no positive grad-norm baseline")
        return None
    base = band.baseline
    crit_at = band.critical_at if band.critical_at is not None else float("inf")
    judged: dict[str, Any] = {
        **band.judged(),
        "warn_ratio": band.warn_ratio,
        "critical_ratio": band.critical_ratio,
        "baseline_start_step": base.start_step,
        "baseline_end_step": base.end_step,
        "spike_k": p.spike_k,
    }
    _ = ev.schedule  # (made before the selections below are held: not beside its temporaries)
    # A divergence after the baseline window ends the stretch judged: what the grad norm and
    # the loss do from its onset on is the divergence's, and a climb that led into it is a
    # drift of its own (it reads as the divergence's cause), not a rise of the loss.
    stop = next((a for a, _ in ev.diverged if a > base.end_step), None)
    upto = len(x) if stop is None else int(np.searchsorted(x, stop, side="left"))
    # The points from the baseline on (steps sorted: a slice) that the despike keeps; one
    # copy of them, every later selection a slice of it.
    after = int(np.searchsorted(x, base.start_step, side="left"))  # x[after:] >= start
    keep = ev.despiked(GRAD_NORM, k=p.spike_k)[after:upto]  # despike(y, k=...)
    keep &= y[after:upto] >= 0
    xs, ys = _kept(x[after:upto], keep), _kept(y[after:upto], keep)
    if len(xs) < p.min_points:
        run.note(f"{CHECK}: not run, too few grad_norm points after the baseline window")
        return None
    spikes = len(keep) - int(np.count_nonzero(keep))
    del keep
    n_recent = max(5, int(p.recent_frac * len(ys)))
    current = float(np.median(ys[-n_recent:]))
    xb, yb = bin_median(xs, ys, max_bins=200)
    smooth = rolling_median(yb, 5)
    early = base
    settled = _settled(xs, ys, xb, smooth, base, float(xs[-n_recent]), current, p)
    if settled is not None:
        # Judged from where the grad norm settled: its 2x / 3x lines (drawn over the finding)
        band = Band(settled, band.warn_ratio, band.critical_ratio)
        base = settled
        crit_at = band.critical_at if band.critical_at is not None else float("inf")
        judged.update(
            band.judged(),
            baseline_start_step=base.start_step,
            baseline_end_step=base.end_step,
            early_baseline=early.value,
            settled_below=p.settled_below,
        )
    ratio = current / base.value
    env = envelope(ev, xb, base.start_step, base.end_step)
    e_now = env.at_end(xs[-n_recent:])
    warn_now, crit_now = env.lines(np.array([e_now]), band)
    judged.update(
        envelope_exponent=p.envelope_exponent,
        envelope_margin=p.envelope_margin,
        envelope_max=p.envelope_max,
        warn_line_now=float(warn_now[0]) * base.value,
        critical_line_now=float(crit_now[0]) * base.value,
    )
    m: dict[str, Any] = {
        "baseline": base.value,
        "baseline_start_step": base.start_step,
        "baseline_end_step": base.end_step,
        "baseline_kind": "early" if settled is None else "settled",
        "early_baseline": early.value,
        "early_ratio": current / early.value,
        "current": current,
        "current_points": n_recent,
        "ratio": ratio,
        "spikes_excluded": spikes,
        "lr_logged": env.lr_logged,
        "lr_baseline": env.lr_ref,
        "lr_now": env.lr_now(xs[-n_recent:]),
        "expected_rise": e_now if env.lr_logged else None,
        "excess": ratio / e_now,
        "envelope_score": ratio / float(warn_now[0]),
        "lr_phase": ev.schedule.phase_at(float(xs[-1])),
        "divergence_step": stop,
    }

    def quiet(reason: str) -> DriftResult:
        return DriftResult(False, measures=m, reason=reason, judged_against=judged)

    if current < band.warn_at:
        return quiet(f"grad norm now {ratio:.2f}x baseline")
    warn_hit = smooth >= band.warn_at
    # The crossing that starts the stretch the run ends in: an earlier excursion above the
    # line (a start-up transient, a bump that came back) is not this drift's beginning.
    below = np.flatnonzero(~warn_hit)
    warn_idx = int(below[-1] + 1) if len(below) else 0
    warn_idx = min(warn_idx, len(xb) - 1)
    # (from the settled window on: the fall before it is not part of the climb's bend)
    i0 = 0 if settled is None else min(int(np.searchsorted(xb, base.start_step)), warn_idx)
    seg = slice(i0, warn_idx + 1)
    fitted, fitted_range = _onset(xb[seg], smooth[seg], base.value)
    onset = _at_lr_change(ev, xb, fitted)
    # (an onset moved to a logged LR change is that change's step)
    onset_range = fitted_range if onset == fitted else None
    post = int(np.searchsorted(xs, onset, side="left"))  # xs[post:] >= onset
    g_slope = theil_sen(xs[post:], ys[post:])
    del xs, ys  # (not read past here: the loss's points are not held beside them)
    if g_slope is None or not g_slope.rising:
        return quiet("grad norm high but not trending up")
    loss = ev.series(LOSS)
    lx, ly = loss.steps, loss.values
    l0 = int(np.searchsorted(lx, onset, side="left"))  # lx[l0:] >= onset
    l1 = len(lx) if stop is None else int(np.searchsorted(lx, stop, side="left"))
    loss_sel = ev.despiked(LOSS, k=p.spike_k)[l0:l1]  # despike(ly, k=...)
    lys = _kept(ly[l0:l1], loss_sel)
    l_slope = theil_sen(_kept(lx[l0:l1], loss_sel), lys) if len(lys) >= 3 else None
    del loss_sel
    # Grad norm and loss climbing together is the divergence's to judge when it found one;
    # under its lines (the loss less than 10% above its low) nothing else would say it, so it
    # is a drift whose loss rose with it (the run read HEALTHY at 2.7x).
    loss_rises = bool(l_slope is not None and l_slope.rising)

    def taken() -> bool:  # (asked only when the loss rises: the series are not scanned else)
        return stop is not None or _blew_up(ev, base.end_step)

    if loss_rises and taken():
        return quiet("the loss rises too (divergence, not drift)")
    loss_change = None
    if l_slope is not None:
        # Levels, not the extrapolated line: a curved loss would give changes beyond -100%.
        k = max(3, len(lys) // 20)
        at_onset, at_end = float(np.median(lys[:k])), float(np.median(lys[-k:]))
        if at_onset != 0:
            loss_change = 100.0 * (at_end - at_onset) / abs(at_onset)
        # Higher by 2% and by more than the two levels' own noise (a noisy per-batch loss
        # moves its 5% medians by more than 2% on its own).
        dev = rolling_median(lys, 25)
        np.subtract(lys, dev, out=dev)
        np.abs(dev, out=dev)  # |lys - rolling median|, in place
        noise = MAD_SCALE * float(np.median(dev, overwrite_input=True))
        del dev
        level_noise = 3.0 * np.sqrt(2.0) * 1.2533 * noise / np.sqrt(k)  # median's std. error
        if loss_change is not None and loss_change > 2.0 and at_end - at_onset > level_noise:
            if taken():
                return quiet("the loss ended higher than at the onset (divergence)")
            loss_rises = True
    post_b = xb >= onset
    peak_i = int(np.argmax(np.where(post_b, smooth, -np.inf)))
    crit_hit = smooth >= crit_at
    # The schedule explains the climb when the level now is under the moving warning line and
    # the climb passed 2x while the LR was decaying (by then at most 90% of the baseline's
    # LR): a climb that began at a constant LR is a drift even if a later cooldown follows.
    # At a constant LR the line is the plain 2x, so a climb past it is never explained.
    at_cross = float(env.rise[warn_idx])
    phase_cross = ev.schedule.phase_at(float(xb[warn_idx]))
    beyond = not (
        current <= float(warn_now[0]) * base.value
        and phase_cross in ("decay", "cooldown")
        and at_cross >= _MIN_DECAYED_RISE
    )
    m.update(
        peak=float(smooth[peak_i]),
        peak_ratio=float(smooth[peak_i] / base.value),
        onset_value=float(np.interp(onset, xb, smooth)),
        slope_per_1k_steps=g_slope.per_1k(),
        loss_slope_per_1k_steps=l_slope.per_1k() if l_slope else None,
        loss_change_pct=loss_change,
        warning_step=int(round(xb[warn_idx])),
        lr_phase_at_warning=phase_cross,
        critical_step=int(round(xb[int(np.argmax(crit_hit))])) if crit_hit.any() else None,
    )
    # (a decaying LR explains a growing grad norm, not a rising loss)
    beyond = beyond or loss_rises
    m["loss_rises"] = loss_rises
    m["schedule_explained"] = not beyond
    if not beyond:
        sev = Severity.INFO
    elif current >= float(crit_now[0]) * base.value:
        sev = Severity.CRITICAL
    else:
        sev = Severity.WARNING
    if not env.lr_logged:
        run.note(
            f"{CHECK}: no LR logged, so a rise from a decaying LR with weight decay (expected) "
            "could not be told from a drift; judged on the plain "
            f"{p.warn_ratio:g}x / {p.crit_ratio:g}x lines"
        )
    end = int(x[upto - 1])  # (the last point before a divergence the climb ran into)
    return DriftResult(
        True,
        sev,
        int(onset),
        end,
        int(round(xb[peak_i])),
        m,
        judged_against=judged,
        onset_range=onset_range,
    )


def _blew_up(ev: Evidence, after: int) -> bool:
    """Whether the loss or the grad norm turned NaN / Inf after step ``after``: a climb of
    both into a blow-up is the nan_inf finding's (and its cause), not a drift of its own."""
    for metric in (LOSS, GRAD_NORM):
        s = ev.logged(metric)
        if (~np.isfinite(s.values[s.steps > after])).any():
            return True
    return False


# How far above every level it held since the baseline window (before its low) the grad norm
# must be now for a climb to be judged from the low: a return to a level it held is not one.
_BEYOND_HELD = 1.1


def _settled(
    xs: np.ndarray,
    ys: np.ndarray,
    xb: np.ndarray,
    smooth: np.ndarray,
    base: Baseline,
    recent_from: float,
    current: float,
    p: GradNormDriftParams,
) -> Baseline | None:
    """The level the grad norm settled at after the baseline window, when it went on falling
    to under ``settled_below`` x the baseline: the median of the points (spikes left out)
    over ``baseline_window`` steps around the lowest stretch of the smoothed bin medians
    between the baseline window and the recent points. None when it did not fall that far,
    or when the level now is not above every level it held between the baseline window and
    that low (by :data:`_BEYOND_HELD`): a grad norm back at a level it held before a dip has
    not climbed from the dip.

    A baseline taken while the grad norm was still coming down from start-up overstates its
    level: a climb to 3x of where it settled read as 1.8x of the baseline and passed as
    healthy. The article's 500-step baseline, moved to where the grad norm settled, is what
    the climb is then judged from."""
    between = np.flatnonzero((xb > base.end_step) & (xb < recent_from))
    if len(between) == 0:
        return None
    low = int(between[np.argmin(smooth[between])])
    if not smooth[low] < p.settled_below * base.value:
        return None
    held = float(np.max(smooth[between[0] : low + 1]))
    if not current > _BEYOND_HELD * held:
        return None
    start = max(float(xb[low]) - p.baseline_window / 2, float(base.end_step) + 1)
    sel = (xs >= start) & (xs < start + p.baseline_window)
    n = int(np.count_nonzero(sel))
    if n < 5:
        return None
    value = float(np.median(ys[sel]))
    if not 0 < value < p.settled_below * base.value:
        return None
    first, last = int(xs[sel][0]), int(xs[sel][-1])
    return Baseline(
        value,
        first,
        last,
        n,
        f"median of {n:,} points, steps {first:,}-{last:,}, where the grad norm settled after "
        f"falling below {p.settled_below:g}x the baseline after the warm-up ({sig(base.value)})",
    )


def _kept(a: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``a[keep]``: a view when every point is kept (no copy of a whole series)."""
    return a if bool(keep.all()) else a[keep]


@dataclass(frozen=True)
class Envelope:
    """The grad-norm rise the LR schedule explains, per bin (1 where the LR did not decay)."""

    rise: np.ndarray
    lr_ref: float | None
    exponent: float
    cap: float
    margin: float
    lr_steps: np.ndarray
    lr_values: np.ndarray

    @property
    def lr_logged(self) -> bool:
        return self.lr_ref is not None

    def lr_now(self, steps: np.ndarray) -> float | None:
        if not self.lr_logged:
            return None
        return float(np.median(interp(steps, self.lr_steps, self.lr_values)))

    def at_end(self, steps: np.ndarray) -> float:
        """The expected rise over the recent points (the LR's median there)."""
        now = self.lr_now(steps)
        return _rise(self.lr_ref, now, self.exponent, self.cap)

    def lines(self, rise: np.ndarray, band: Any) -> tuple[np.ndarray, np.ndarray]:
        """The warning and critical lines (x baseline) for a given expected rise."""
        warn = np.maximum(band.warn_ratio, self.margin * rise)
        crit_ratio = band.critical_ratio if band.critical_ratio is not None else np.inf
        crit = np.maximum(crit_ratio, warn * crit_ratio / band.warn_ratio)
        return warn, crit


def _rise(ref: float | None, now: float | None, exponent: float, cap: float) -> float:
    if ref is None or now is None or not ref > 0:
        return 1.0
    if not now > 0:
        return float(cap)
    return float(min(cap, max(1.0, (ref / now) ** exponent)))


def envelope(ev: Evidence, xb: np.ndarray, ref_start: int, ref_end: int) -> Envelope:
    """The schedule's expected grad-norm rise at the steps ``xb``, relative to the LR over the
    baseline window ``[ref_start, ref_end]`` (the evidence's LR schedule)."""
    p = ev.params.grad_norm_drift
    sched = ev.schedule
    lx, lv = sched.steps, sched.values
    if len(lx) == 0 or not np.any(lv > 0):
        return Envelope(
            np.ones(len(xb)), None, p.envelope_exponent, p.envelope_max, p.envelope_margin, lx, lv
        )
    sel = (lx >= ref_start) & (lx <= ref_end)
    ref = float(np.median(lv[sel])) if sel.any() else float(interp(ref_start, lx, lv))
    lr_b = interp(xb, lx, lv)
    rise = np.array([_rise(ref, float(v), p.envelope_exponent, p.envelope_max) for v in lr_b])
    return Envelope(rise, ref, p.envelope_exponent, p.envelope_max, p.envelope_margin, lx, lv)


def _onset(xb: np.ndarray, smooth: np.ndarray, base: float) -> tuple[int, tuple[int, int]]:
    """Where the climb began, and the steps it cannot be told from: the bend of a two-piece
    linear fit (its :attr:`Hinge.range`), else the last step at baseline (a bin either side)."""
    h = hinge_onset(xb, smooth)
    if h is not None and h[2] > 0 and h[2] > h[1]:
        return h.onset, h.range
    at_base = np.flatnonzero(smooth <= base * 1.1)
    onset = int(round(xb[at_base[-1]])) if len(at_base) else int(round(xb[0]))
    return onset, bend_range(xb, onset)


def _at_lr_change(ev: Evidence, xb: np.ndarray, onset: int) -> int:
    """The climb's onset at an LR change off the schedule that starts within one bin after
    the fitted bend. The bend is fitted on bin medians, so it is known to about a bin's
    width: a climb that a 10x LR typed at step 5,000 started was fitted to begin at step
    4,981, "before" the change that caused it (and the LR-change cause, which asks for a
    change going on at the onset, was called contradicted)."""
    if len(xb) < 2:
        return onset
    width = float(np.median(np.diff(xb)))
    for seg in ev.schedule.unexplained:
        if onset < seg.start_step <= onset + width:
            return int(seg.start_step)
    return onset


def grad_norm_ceiling(ev: Evidence) -> tuple[float, int, int, int] | None:
    """The grad norm's clip ceiling when it looks logged after clipping: (its highest value,
    points at exactly that value, finite points, the first step at it), else None. Many
    points sit at exactly the maximum, with enough points below it to show the climb into it:
    the norm after clipping, logged where the norm before it was meant (torch's
    ``clip_grad_norm_`` returns the norm before). Printed values repeat too, but not at
    their maximum for a tenth of a long log."""
    s = ev.series(GRAD_NORM)
    v, t = s.values, s.steps
    n = len(v)
    if n < _CEILING_MIN_POINTS:
        return None
    top = float(v.max())
    at_top = v == top
    k = int(at_top.sum())
    if not top > 0 or k < max(_CEILING_MIN_AT, _CEILING_SHARE * n) or n - k < _CEILING_SHARE * n:
        return None
    return top, k, n, int(t[np.argmax(at_top)])


def _ceiling_note(ev: Evidence) -> None:
    """A note for a grad norm logged after clipping (:func:`grad_norm_ceiling`): a grad norm
    doubling into a clip of 1.0 and held there for 2,000 steps read "HEALTHY" with nothing
    said, since no climb above the ceiling can show to any check of the grad norm."""
    got = grad_norm_ceiling(ev)
    if got is None:
        return
    top, k, n, first = got
    ev.run.note(
        f"{CHECK}: the grad norm is exactly {num(top)}, its highest value, at {k:,} of {n:,} "
        f"points (from step {first:,} on): it looks like the norm after "
        f"clipping at {num(top)}, so a climb above that cannot show in this log and the grad "
        "norm's checks are blind to it; log the norm before clipping (what torch's "
        "clip_grad_norm_ returns)"
    )


_CEILING_MIN_POINTS = 50  # finite grad-norm points for the clip-ceiling note
_CEILING_MIN_AT = 20  # ... at least this many at the ceiling
_CEILING_SHARE = 0.1  # ... and this share of them, with as large a share below it


class GradNormDriftDetector:
    """Flags a grad norm that keeps climbing while the loss keeps falling, beyond what the LR
    schedule explains (a climb the schedule explains is an ``info`` note)."""

    name = CHECK

    def __init__(self, params: GradNormDriftParams | None = None) -> None:
        self.params = params or GradNormDriftParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        if ev.has(GRAD_NORM):
            _ceiling_note(ev)
        res = ev.using(CHECK, self.params).drift
        if res is None or not res.flagged or res.severity is None:
            return []
        m = res.measures
        if m["loss_slope_per_1k_steps"] is None:
            loss_txt = "the loss was not logged"
        elif m["loss_rises"]:
            pct = m["loss_change_pct"]
            loss_txt = "the loss rose with it" + (f" ({pct:+.1f}%)" if pct is not None else "")
        elif m["loss_change_pct"] is not None:
            pct = m["loss_change_pct"]
            # (a rise short of "rises": at most 2%, or within the loss's level noise)
            loss_txt = (
                f"the loss fell {-pct:.1f}%" if pct < 0 else f"the loss held level ({pct:+.1f}%)"
            )
        else:
            loss_txt = "the loss kept falling"
        # (both ends are medians, of noisy points the chart shows one by one)
        if m["baseline_kind"] == "settled":
            base_txt = (
                f"{sig(m['baseline'])} (where it settled: the median of steps "
                f"{m['baseline_start_step']:,}-{m['baseline_end_step']:,}; it was "
                f"{sig(m['early_baseline'])} after the warm-up and went on falling)"
            )
        else:
            base_txt = f"{sig(m['baseline'])} (baseline)"
        until = (
            f" up to the divergence at step {m['divergence_step']:,}"
            if m["divergence_step"] is not None
            else ""
        )
        rise = (
            f"Grad norm rose from {base_txt} to {sig(m['current'])} "
            f"({m['ratio']:.1f}x; the median of its last {m['current_points']:,} points, spikes "
            f"left out) since step {res.onset_step:,}{until} while {loss_txt}"
        )
        cap = (
            "the envelope's cap; "
            if m["expected_rise"] is not None and m["expected_rise"] >= self.params.envelope_max
            else ""
        )
        if not m["lr_logged"]:
            summary = (
                f"{rise}. No LR was logged, so this check could not tell a drift from the "
                "rise a decaying LR gives with weight decay; judged on the plain "
                f"{self.params.warn_ratio:g}x / {self.params.crit_ratio:g}x lines."
            )
        elif res.severity == Severity.INFO:
            line_now = res.judged_against["warn_line_now"]
            summary = (
                f"{rise}, as the LR decayed from {sig(m['lr_baseline'])} to {sig(m['lr_now'])}: "
                f"the schedule explains up to {m['expected_rise']:.1f}x ({cap}with weight decay "
                "the grad norm grows about as sqrt(lr_baseline / lr), Defazio et al. 2025); its "
                f"level now ({m['ratio']:.1f}x) is under the {line_now / m['baseline']:.1f}x "
                f"warning line this sets (the explained {m['expected_rise']:.1f}x plus a "
                f"{self.params.envelope_margin - 1:.0%} margin). Expected, not a drift; a weight "
                "decay scaled with the LR (AdamC) keeps it flat if it matters."
            )
        elif m["expected_rise"] is not None and m["expected_rise"] > 1.0:
            summary = (
                f"{rise}, beyond the {m['expected_rise']:.1f}x the LR decay "
                f"({sig(m['lr_baseline'])} -> {sig(m['lr_now'])}) explains."
            )
        elif m["lr_baseline"] and m["lr_now"] > 1.1 * m["lr_baseline"]:
            summary = (
                f"{rise}, at a learning rate {times(m['lr_now'] / m['lr_baseline'])}x its "
                f"baseline's ({sig(m['lr_baseline'])} -> {sig(m['lr_now'])})."
            )
        else:
            summary = f"{rise}, at a learning rate that did not decay ({sig(m['lr_now'])})."
        if m["loss_rises"]:
            dp = ev.params["divergence"]
            summary += (
                " Grad norm and loss climbing together are the prelude to a divergence; not one "
                f"yet by that check's lines (the loss {dp.loss_rise:.0%} above its low, the grad "
                f"norm {dp.grad_rise:g}x its earlier level)."
            )
        return [
            Finding(
                kind=FindingKind.GRAD_NORM_DRIFT,
                severity=res.severity,
                metric=GRAD_NORM,
                start_step=res.onset_step,
                peak_step=res.peak_step,
                end_step=res.end_step,
                onset_range=res.onset_range,
                measures=dict(m),
                summary=summary,
                judged_against=res.judged_against,
            )
        ]
