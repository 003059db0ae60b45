"""param_norm_jump: an abrupt change in the parameter norm against its local trend.

Under AdamW the parameter norm grows slowly and steadily (article section 2.2); a sudden
jump means an update that was far too large or a numerical overflow. Each logged increment
is compared with the typical increment around it (rolling median of the increments, scaled
by their rolling MAD). Growth that crosses 1.5x the baseline (the article's warning level for
the param norm, section 6.1) is an ``info`` note when it came at a steady pace, as AdamW's
slow growth does, and a warning when the pace just before the crossing was three times the
pace of the whole way there (a surge: the norm took off, it did not creep).
When only per-layer param norms are logged, the total is rebuilt as the root of their sum of
squares at the steps where every layer was logged.

The measures of its finding kinds are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forensics.evidence import Band, Evidence
from forensics.evidence.rolling import trailing_median
from forensics.evidence.trend_utils import (
    MAD_SCALE,
    bin_median,
    hinge_onset,
    rolling_median,
    theil_sen,
)
from forensics.findings import Finding, FindingKind, Severity
from forensics.params import ParamNormParams
from forensics.schema import PARAM_NORM

CHECK = "param_norm"
PAST_MOVE_K = 3.0  # a jump's increment is at least this many times the preceding median one


class ParamNormDetector:
    """Flags abrupt param-norm changes; notes slow growth past 1.5x the baseline."""

    name = CHECK

    def __init__(self, params: ParamNormParams | None = None) -> None:
        self.params = params or ParamNormParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        ev = ev.using(CHECK, self.params)
        run = ev.run
        total, source = ev.param_norm_total
        x, y = total.steps, total.values
        if len(x) < self.params.min_points:
            why = (
                "the run has no param_norm series"
                if len(x) == 0
                else f"only {len(x)} param_norm points"
            )
            run.note(f"param_norm_jump: not run, {why}")
            return []
        band = ev.param_norm_band  # the 1.5x line the report's chart draws
        out = self._jumps(x, y, band, source)
        # A crossing of the 1.5x line is reported too, unless a jump carried the norm across it
        # (the jump's finding already states the level it reached).
        for g in self._growth(x, y, band, source):
            cross = g.measures["crossing_step"]
            carried = any(
                f.start_step <= int(cross) <= (f.end_step or f.start_step) + self.params.window
                for f in out
                if isinstance(cross, int)
            )
            if not carried:
                out.append(g)
        return out

    def _judged(self, band: Band | None) -> dict[str, Any]:
        judged: dict[str, Any] = {"baseline": None, "warn_at": None, "warn_ratio": None}
        if band is not None:
            judged.update(
                baseline=band.baseline.value,
                warn_at=band.warn_at,
                warn_ratio=band.warn_ratio,
                baseline_start_step=band.baseline.start_step,
                baseline_end_step=band.baseline.end_step,
            )
        return judged

    def _jumps(self, x: np.ndarray, y: np.ndarray, band: Band | None, source: str) -> list[Finding]:
        base = band.baseline.value if band is not None else float("nan")
        d = np.diff(y)
        med = rolling_median(d, self.params.window)
        resid = d - med
        scale = rolling_median(np.abs(resid), self.params.window) * MAD_SCALE
        scale = np.maximum(
            scale, 1e-5 * np.abs(y[:-1]) + 1e-12
        )  # a perfectly smooth norm has zero MAD
        z = np.abs(resid) / scale
        judged = {
            **self._judged(band),
            "jump_k": self.params.jump_k,
            "min_rel_jump": self.params.min_rel_jump,
        }
        # Both the departure from the trend and the move itself must be large: a pause in a
        # fast climb departs from the trend without the norm jumping anywhere.
        big_move = np.abs(d) > self.params.min_rel_jump * np.abs(y[:-1])
        # ... and large against what the norm did just before it: an increment no bigger than a
        # few of the preceding ones is the same climb going on (a residual scale of zero after
        # the weights freeze would make any step look like a jump).
        past = trailing_median(np.abs(d), self.params.window)
        big_move &= np.abs(d) > PAST_MOVE_K * past
        flag = (
            (z > self.params.jump_k)
            & (np.abs(resid) > self.params.min_rel_jump * np.abs(y[:-1]))
            & big_move
        )
        idx = np.flatnonzero(flag)
        if len(idx) == 0:
            return []
        # Increments within two points of each other are one event (a blip is up then down).
        groups = np.split(idx, np.flatnonzero(np.diff(idx) > 2) + 1)
        out = []
        for g in groups:
            i0, i1 = int(g[0]), int(g[-1])
            before = float(y[i0])
            reached = float(y[i1 + 1])  # where the flagged increments ended
            # The level it settled at: the median of up to `window` points from the jump's end.
            settled_pts = y[i1 + 1 : i1 + 1 + self.params.window]
            after = float(np.median(settled_pts))
            big = int(g[np.argmax(np.abs(resid[g]))])
            inside = y[i0 + 1 : i1 + 2]
            up = float(np.median(d[g])) >= 0
            k_ext = int(np.argmax(inside) if up else np.argmin(inside))
            extreme, extreme_step = float(inside[k_ext]), int(x[i0 + 1 + k_ext])
            change = 100.0 * (after - before) / before if before else None
            persistent = bool(
                before and abs(after - before) > 0.5 * self.params.min_rel_jump * abs(before)
            )
            what = "jumped" if up else "dropped"
            s0, s1 = int(x[i0 + 1]), int(x[i1 + 1])
            when = f"at step {s0:,}" if s0 == s1 else f"over steps {s0:,}-{s1:,}"
            times = f"{abs(resid[big]) / scale[big]:,.0f}x its usual step-to-step change"
            biggest = times if s0 == s1 else f"the largest step, at {int(x[big + 1]):,}, {times}"
            n_after = len(settled_pts) - 1
            if persistent:
                level = (
                    f"; it settled at {after:.4g}"
                    + (
                        f" (median of the {len(settled_pts)} points from step {s1:,})"
                        if n_after >= 2
                        else " (the log ends there)"
                    )
                    + f", {after / before:.2f}x its level before."
                )
                summary = (
                    f"Param norm {what} from {before:.4g} to {reached:.4g} {when} "
                    f"({biggest}){level}"
                )
            else:
                summary = (
                    f"Param norm {what} from {before:.4g} to {extreme:.4g} at step "
                    f"{extreme_step:,} ({biggest}), then returned to its trend ({after:.4g})."
                )
            out.append(
                Finding(
                    kind=FindingKind.PARAM_NORM_JUMP,
                    severity=Severity.WARNING,
                    metric=PARAM_NORM,
                    start_step=int(x[i0 + 1]),
                    peak_step=int(x[big + 1]),
                    end_step=int(x[min(len(x) - 1, i1 + 1)]),
                    measures={
                        "abrupt": True,
                        "before": before,
                        "after": after,
                        "change_pct": change,
                        "robust_z": float(z[big]),
                        "persistent": persistent,
                        "baseline": base,
                        "ratio": after / base,
                        "crossing_step": None,
                        "growth_pct_per_1k_steps": None,
                        "pace_ratio": None,
                        "source": source,
                    },
                    summary=summary,
                    judged_against={**judged, "robust_z": float(z[big])},
                )
            )
        return out

    def _growth(
        self, x: np.ndarray, y: np.ndarray, band: Band | None, source: str
    ) -> list[Finding]:
        """Crossing the band's line (ratio_limit x baseline): info when the pace was steady,
        warning when it surged."""
        if band is None:
            return []
        base = band.baseline.value
        smooth = rolling_median(y, self.params.window)
        over = smooth >= band.warn_at
        if not over.any() or not over[-1]:
            return []
        cross = int(np.argmax(over))
        current = float(np.median(y[-max(3, len(y) // 50) :]))
        # Pace before the crossing (last tenth of the way there) against the pace of the whole way.
        k = max(5, cross // 10)
        whole = theil_sen(x[: cross + 1], y[: cross + 1])
        recent = theil_sen(x[max(0, cross - k) : cross + 1], y[max(0, cross - k) : cross + 1])
        rate = 100.0 * whole.per_1k() / base if whole is not None else None
        pace = (
            recent.slope / whole.slope
            if whole is not None and recent is not None and whole.slope > 0
            else None
        )
        surged = pace is not None and pace >= self.params.surge_ratio
        start = int(x[cross])
        if surged:
            xb, yb = bin_median(x[: cross + 1].astype(float), smooth[: cross + 1], max_bins=200)
            h = hinge_onset(xb, yb)
            if h is not None and h[2] > max(h[1], 0.0):
                start = h[0]
        measures = {
            "abrupt": False,
            "before": None,
            "after": None,
            "change_pct": 100.0 * (current - base) / base,
            "robust_z": None,
            "persistent": True,
            "baseline": base,
            "ratio": current / base,
            "crossing_step": int(x[cross]),
            "growth_pct_per_1k_steps": rate,
            "pace_ratio": pace,
            "source": source,
        }
        if surged:
            summary = (
                f"Param norm surged from step {start:,}: it grew {pace:.1f}x faster than before "
                f"and passed {band.warn_ratio}x its baseline ({base:.4g}) at step "
                f"{int(x[cross]):,}, now {current / base:.2f}x its baseline."
            )
        else:
            summary = (
                f"Param norm grew steadily to {current / base:.2f}x its baseline ({base:.4g}), "
                f"passing {band.warn_ratio}x at step {int(x[cross]):,}; slow growth like this is "
                "usual under AdamW."
            )
        return [
            Finding(
                kind=FindingKind.PARAM_NORM_JUMP,
                severity=Severity.WARNING if surged else Severity.INFO,
                metric=PARAM_NORM,
                start_step=start,
                peak_step=int(x[int(np.argmax(smooth))]),
                end_step=int(x[-1]),
                measures=measures,
                summary=summary,
                judged_against={**self._judged(band), "surge_ratio": self.params.surge_ratio},
            )
        ]
