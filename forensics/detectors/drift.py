"""grad_norm_drift: the grad norm trending up while the loss keeps falling (article section 3).

The article's incident: from step ~6500 the grad norm climbed from about 0.8 to 2.5 and did
not come back down, while the loss curve fell smoothly; the benchmark score was already
slipping. Single spikes are the spike detectors' business, so they are filtered out before
any fit (rolling median + k * MAD). The level now is compared with the evidence's grad-norm
band (``Evidence.grad_norm_band``, the lines the report's chart draws): warning at 2x,
critical at 3x.
When the loss rises over the same stretch (a significant upward slope, or a level more than 2%
above the one at the onset) the pair is a divergence, left to the divergence detector.

Measures (kind ``grad_norm_drift``):

| key | meaning |
|---|---|
| `baseline` | grad-norm baseline (median after the LR warm-up) |
| `baseline_start_step` | first step of the baseline window |
| `baseline_end_step` | last step of the baseline window |
| `current` | grad-norm level now (median of the last 2% of points, >= 5) |
| `ratio` | current / baseline |
| `peak` | highest smoothed grad-norm level after the onset |
| `peak_ratio` | peak / baseline |
| `onset_value` | smoothed grad-norm level at the onset step |
| `slope_per_1k_steps` | Theil-Sen slope of the grad norm from the onset, per 1000 steps |
| `loss_slope_per_1k_steps` | Theil-Sen slope of the loss over the same window (null: no loss) |
| `loss_change_pct` | loss level change from the onset to the end, in % (medians of 5%) |
| `warning_step` | first step where the smoothed level reached warn_ratio x baseline |
| `critical_step` | same for crit_ratio (null if never reached) |
| `spikes_excluded` | number of spike points left out of the fits |
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forensics.evidence import Evidence
from forensics.evidence.trend_utils import (
    bin_median,
    despike,
    hinge_onset,
    rolling_median,
    sig,
    theil_sen,
)
from forensics.findings import Finding, FindingKind, Severity
from forensics.params import GradNormDriftParams
from forensics.schema import GRAD_NORM, LOSS

CHECK = "grad_norm_drift"


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
    keep = despike(y, k=p.spike_k) & (y >= 0)
    after = x >= base.start_step
    xs, ys = x[keep & after], y[keep & after]
    if len(xs) < p.min_points:
        run.note(f"{CHECK}: not run, too few grad_norm points after the baseline window")
        return None
    spikes = int(np.sum(~keep & after))
    n_recent = max(5, int(p.recent_frac * len(ys)))
    current = float(np.median(ys[-n_recent:]))
    ratio = current / base.value
    xb, yb = bin_median(xs, ys, max_bins=200)
    smooth = rolling_median(yb, 5)
    m: dict[str, Any] = {
        "baseline": base.value,
        "baseline_start_step": base.start_step,
        "baseline_end_step": base.end_step,
        "current": current,
        "ratio": ratio,
        "spikes_excluded": spikes,
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
    onset = _onset(xb[: warn_idx + 1], smooth[: warn_idx + 1], base.value)
    post = xs >= onset
    g_slope = theil_sen(xs[post], ys[post])
    if g_slope is None or not g_slope.rising:
        return quiet("grad norm high but not trending up")
    loss = ev.series(LOSS)
    lx, ly = loss.steps, loss.values
    loss_sel = (lx >= onset) & despike(ly, k=p.spike_k)
    l_slope = theil_sen(lx[loss_sel], ly[loss_sel]) if loss_sel.sum() >= 3 else None
    if l_slope is not None and l_slope.rising:
        return quiet("the loss rises too (divergence, not drift)")
    loss_change = None
    if l_slope is not None:
        # Levels, not the extrapolated line: a curved loss would give changes beyond -100%.
        lys = ly[loss_sel]
        k = max(3, len(lys) // 20)
        at_onset, at_end = float(np.median(lys[:k])), float(np.median(lys[-k:]))
        if at_onset != 0:
            loss_change = 100.0 * (at_end - at_onset) / abs(at_onset)
        if loss_change is not None and loss_change > 2.0:  # 2%: beyond the level noise
            return quiet("the loss ended higher than at the onset (divergence)")
    post_b = xb >= onset
    peak_i = int(np.argmax(np.where(post_b, smooth, -np.inf)))
    crit_hit = smooth >= crit_at
    m.update(
        peak=float(smooth[peak_i]),
        peak_ratio=float(smooth[peak_i] / base.value),
        onset_value=float(np.interp(onset, xb, smooth)),
        slope_per_1k_steps=g_slope.per_1k(),
        loss_slope_per_1k_steps=l_slope.per_1k() if l_slope else None,
        loss_change_pct=loss_change,
        warning_step=int(round(xb[warn_idx])),
        critical_step=int(round(xb[int(np.argmax(crit_hit))])) if crit_hit.any() else None,
    )
    sev = Severity.CRITICAL if current >= crit_at else Severity.WARNING
    return DriftResult(
        True, sev, int(onset), int(x[-1]), int(round(xb[peak_i])), m, judged_against=judged
    )


def _onset(xb: np.ndarray, smooth: np.ndarray, base: float) -> int:
    """Where the climb began: the bend of a two-piece linear fit, else the last step at baseline."""
    h = hinge_onset(xb, smooth)
    if h is not None and h[2] > 0 and h[2] > h[1]:
        return h[0]
    at_base = np.flatnonzero(smooth <= base * 1.1)
    return int(round(xb[at_base[-1]])) if len(at_base) else int(round(xb[0]))


class GradNormDriftDetector:
    """Flags a grad norm that keeps climbing while the loss keeps falling."""

    name = CHECK

    def __init__(self, params: GradNormDriftParams | None = None) -> None:
        self.params = params or GradNormDriftParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        res = ev.using(CHECK, self.params).drift
        if res is None or not res.flagged or res.severity is None:
            return []
        m = res.measures
        if m["loss_slope_per_1k_steps"] is None:
            loss_txt = "the loss was not logged"
        elif m["loss_change_pct"] is not None:
            loss_txt = f"the loss changed {m['loss_change_pct']:+.1f}%"
        else:
            loss_txt = "the loss kept falling"
        summary = (
            f"Grad norm drifted up from {sig(m['baseline'])} (baseline) to {sig(m['current'])} "
            f"({m['ratio']:.1f}x) since step {res.onset_step} while {loss_txt}."
        )
        return [
            Finding(
                kind=FindingKind.GRAD_NORM_DRIFT,
                severity=res.severity,
                metric=GRAD_NORM,
                start_step=res.onset_step,
                peak_step=res.peak_step,
                end_step=res.end_step,
                measures=dict(m),
                summary=summary,
                judged_against=res.judged_against,
            )
        ]
