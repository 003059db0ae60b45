"""plateau: the train loss flat over a long stretch, read against the LR schedule (section 2.1).

The loss should fall at a pace that matches the learning-rate schedule. A long flat stretch at
a healthy LR means the run stopped learning (or never started); a flat tail while a cosine or
linear decay has brought the LR close to zero is what the schedule asks for, and the note says
so. So is a flat stretch at a steady LR that a decay or cooldown then brings down (the stable
phase of a warm-up/stable/decay schedule: the loss falling faster once the LR decays is
expected, not a finding). The loss is reduced to bin medians; a plateau is the longest stretch
where every bin stays within a narrow band (a fraction of the loss level, widened by the bin
noise) and the robust slope over it is not measurably negative (its 90% band reaches zero). It
must cover both a minimum number of steps (or half of a short log) and a minimum share of the
run. The LR context comes from the evidence's LR schedule (``Evidence.schedule``). Always
``info``: a note, not an alarm.

The measures of its finding kinds are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forensics.evidence import Evidence
from forensics.evidence.order_stats import median_value
from forensics.evidence.schedule import Schedule
from forensics.evidence.trend_utils import (
    bin_bounds,
    bin_median,
    num,
    robust_sigma,
    steps_within,
    theil_sen,
)
from forensics.findings import Finding, FindingKind, Severity
from forensics.params import PlateauParams
from forensics.schema import LOSS

CHECK = "plateau"


class PlateauDetector:
    """Notes long flat stretches of the train loss and whether the LR schedule explains them."""

    name = CHECK

    def __init__(self, params: PlateauParams | None = None) -> None:
        self.params = params or PlateauParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        run = ev.run
        p = self.params
        loss = ev.series(LOSS)
        x, y = loss.steps, loss.values
        if len(x) < p.min_points:
            why = "no loss series" if len(x) == 0 else f"only {len(x)} loss points"
            run.note(f"{CHECK}: not run, {why}")
            return []
        keep = ev.despiked(LOSS)  # despike(y), its band shared
        x, y = x[keep], y[keep]
        # Bins of at least ~20 points, so the band reflects the level, not single-step noise.
        nb = min(self.params.bins, max(10, len(x) // 20))
        xb, yb = bin_median(x, y, max_bins=nb)
        first, last = bin_bounds(x, max_bins=nb)
        run_span = float(x[-1] - x[0])
        if run_span <= 0:
            return []
        noise_band = p.noise_k * robust_sigma(yb)
        band = np.maximum(p.flat_rel * np.abs(yb), noise_band)
        best = _longest_flat(xb, yb, band)
        if best is None:
            return []
        i, j = best
        a, b = int(first[i]), int(last[j])  # report the raw steps the flat bins cover
        span = float(b - a)
        # min_steps matters on long runs; on a short log half the log is long enough.
        min_span = max(min(p.min_steps, 0.5 * run_span), p.min_fraction * run_span)
        if span < min_span:
            return []
        # (x is sorted: each stretch is a slice, no mask and copies of a long loss)
        sel = steps_within(x, a, b)
        ts = theil_sen(x[sel], y[sel])
        if ts is not None and ts.falling:
            # The band can take in the last bins of the fall before a plateau: the stretch is
            # a plateau from the first of its bins after which the loss no longer falls
            # measurably (the loss falling to step 3,000 then flat to 6,000 was missed when
            # the band began at 2,700). A tenth of its bins at most: a stretch the loss falls
            # across for longer is a slow decline (a healthy QLoRA run's last 5,000 steps, 1.37
            # to 1.35, gave a "flat" tail from half-way), not a plateau after a fall.
            for k in range(i + 1, min(j, i + 1 + max(1, (j - i + 1) // 10))):
                if b - int(first[k]) < min_span:
                    break
                cut = steps_within(x, int(first[k]), b)
                tail = theil_sen(x[cut], y[cut])
                if tail is not None and not tail.falling:
                    a, sel, ts, span = int(first[k]), cut, tail, float(b - int(first[k]))
                    break
        lvl = median_value(y[sel])
        change = 100.0 * ts.slope * span / abs(lvl) if ts is not None and lvl else 0.0
        if abs(change) > 200.0 * p.flat_rel or (ts is not None and ts.falling):
            return []  # still falling measurably (slowly but surely): a healthy late phase
        sched = ev.schedule
        ctx = self._lr_context(sched, a, b)
        band_lvl = max(p.flat_rel * abs(lvl), noise_band)
        ctx.update(self._decay_after(sched, x, y, a, b, lvl, band_lvl, ctx))
        peak = ctx["lr_peak"]
        ctx["from_start"] = a - int(x[0]) <= 0.1 * run_span
        judged: dict[str, Any] = {
            "flat_band": float(max(p.flat_rel * abs(lvl), noise_band)),
            "flat_rel": p.flat_rel,
            "noise_band": float(noise_band),
            "max_change_pct": 200.0 * p.flat_rel,
            "min_span_steps": float(min_span),
            "decayed_lr": p.decayed_lr_ratio * peak if isinstance(peak, float) else None,
            "lr_phases": ",".join(sched.phases_between(a, b)) or None,
        }
        return [self._finding(a, b, lvl, change, span, span / run_span, ctx, judged)]

    def _lr_context(self, sched: Schedule, a: int, b: int) -> dict[str, Any]:
        """The LR over the plateau, read from the evidence's LR schedule."""
        lx, ly = sched.steps, sched.values
        if len(lx) == 0:
            return {
                "lr_start": None,
                "lr_end": None,
                "lr_peak": None,
                "lr_ratio": None,
                "lr_context": "unknown",
                "expected": False,
            }
        peak = float(np.max(ly))
        sel = (lx >= a) & (lx <= b)
        mean = float(np.mean(ly[sel])) if sel.any() else float(np.interp((a + b) / 2, lx, ly))
        ratio = mean / peak if peak > 0 else None
        end_lr = sched.lr_at(b)
        assert end_lr is not None
        # Expected: the LR over the plateau is small next to its peak, decaying or at its floor.
        decayed = (
            ratio is not None
            and ratio <= self.params.decayed_lr_ratio * 3
            and end_lr <= self.params.decayed_lr_ratio * peak
        )
        return {
            "lr_start": sched.lr_at(a),
            "lr_end": end_lr,
            "lr_peak": peak,
            "lr_ratio": ratio,
            # A peak of 0: the logged LR never left zero (no ratio to its peak exists).
            "lr_context": "zero" if ratio is None else "decayed" if decayed else "active",
            "expected": bool(decayed),
        }

    @staticmethod
    def _decay_after(
        sched: Schedule,
        x: np.ndarray,
        y: np.ndarray,
        a: int,
        b: int,
        lvl: float,
        band: float,
        ctx: dict[str, Any],
    ) -> dict[str, Any]:
        """A flat stretch at a steady LR that a decay or cooldown (WSD) then brings down: the
        stable phase waiting for its decay, which the schedule explains. The flat stretch may
        run a little way into the decay (its first steps barely move the loss: a WSD run's
        plateau ended 119 steps into a 3,000-step cooldown and read "the LR was still 99% of
        its peak, so the run stopped learning")."""
        out: dict[str, Any] = {"loss_after": None}
        if ctx["lr_context"] != "active":
            return out
        seg = sched.segment_at(b)
        if seg is None:
            return out
        if seg.kind in ("decay", "cooldown") and a < seg.start_step <= b:
            held = sched.segment_at(seg.start_step - 1)
            if held is None or held.kind != "constant":
                return out
            d = seg
        else:
            nxt = [
                s for s in sched.segments if s.start_step > b and s.kind in ("decay", "cooldown")
            ]
            if seg.kind != "constant" or not nxt:
                return out
            d = nxt[0]
        after = (x >= d.start_step) & (x <= d.end_step)
        if after.sum() < 3:
            return out
        k = max(3, int(after.sum()) // 10)
        end_lvl = median_value(y[after][-k:])
        out["loss_after"] = end_lvl
        if lvl - end_lvl > band:
            out.update(lr_context="stable_before_decay", expected=True, decay_kind=d.kind)
        return out

    def _finding(
        self,
        a: int,
        b: int,
        lvl: float,
        change: float,
        span: float,
        frac: float,
        ctx: dict[str, Any],
        judged: dict[str, Any],
    ) -> Finding:
        if ctx["lr_context"] == "stable_before_decay":
            kind = "cooldown" if ctx.get("decay_kind") == "cooldown" else "decay"
            why = (
                f"the LR held steady there and the {kind} that followed brought the loss down "
                f"to {num(ctx['loss_after'])}: a stable phase waiting for its decay (as in a "
                "warm-up/stable/decay schedule), which the schedule explains"
            )
        elif ctx["lr_context"] == "decayed":
            pct = 100 * float(ctx["lr_end"]) / float(ctx["lr_peak"])
            why = f"the LR had decayed to {pct:.1f}% of its peak, so the schedule explains it"
        elif ctx["lr_context"] == "active":
            pct = 100 * float(ctx["lr_ratio"])
            why = f"the LR was still {pct:.0f}% of its peak, so the run stopped learning"
        elif ctx["lr_context"] == "zero":
            why = (
                "the logged LR was 0 at every step of the run, so no update could move the weights"
            )
        else:
            why = "no LR was logged to judge it against"
        if ctx["from_start"] and not ctx["expected"]:
            why += "; it was flat from the start of the log, so the loss never really fell"
        return Finding(
            kind=FindingKind.PLATEAU,
            severity=Severity.INFO,
            metric=LOSS,
            start_step=a,
            peak_step=None,
            end_step=b,
            measures={
                "level": lvl,
                **{k: v for k, v in ctx.items() if k != "decay_kind"},
                "change_pct": change,
                "span_steps": span,
                "run_fraction": frac,
            },
            summary=(
                f"The loss stayed flat near {num(lvl)} from step {a:,} to {b:,} "
                f"({100 * frac:.0f}% of the run; its trend moved {change:+.1f}% across it); "
                f"{why}."
            ),
            judged_against=judged,
        )


def _longest_flat(xb: np.ndarray, yb: np.ndarray, band: np.ndarray) -> tuple[int, int] | None:
    """Longest index range whose values all lie within +-band of the range's median (two
    pointers)."""
    n = len(yb)
    best: tuple[int, int] | None = None
    best_span = -1.0
    i = 0
    for j in range(n):  # a few hundred bins: the inner checks are cheap
        while i < j:
            seg = yb[i : j + 1]
            med = np.median(seg)
            if np.all(np.abs(seg - med) <= band[j]):
                break
            i += 1
        if xb[j] - xb[i] > best_span:
            best_span, best = float(xb[j] - xb[i]), (i, j)
    return best
