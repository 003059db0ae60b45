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

from collections.abc import Callable
from typing import Any

import numpy as np

from forensics.evidence import Band, Evidence
from forensics.evidence.rolling import trailing_median
from forensics.evidence.trend_utils import (
    MAD_SCALE,
    bin_median,
    hinge_onset,
    num,
    rolling_median,
    theil_sen,
)
from forensics.findings import Finding, FindingKind, Severity, steps_text
from forensics.params import BASELINE_STEPS, ParamNormParams
from forensics.schema import PARAM_NORM

CHECK = "param_norm"
PAST_MOVE_K = 3.0  # a jump's increment is at least this many times the preceding median one


def _planned_pace(ev: Evidence) -> Callable[[int, int], bool]:
    """Whether steps ``[a, b]`` lie where the LR schedule itself changes the norm's pace: in
    the warm-up, or within ``_AFTER_RESTART`` steps of a restart (the pace of AdamW's
    growth follows the LR). Without a logged LR, the first ``BASELINE_STEPS`` steps stand
    for the warm-up nobody logged. An LR change no schedule explains is not planned: a jump
    after it is reported, with the change as its cause."""
    sched = ev.schedule
    if sched.empty:
        return lambda a, b: a <= BASELINE_STEPS
    restarts = [c.step for c in sched.changes if c.kind == "restart"]
    warm = ev.warmup_end

    def planned(a: int, b: int) -> bool:
        if warm is not None and a <= warm:
            return True
        if "warmup" in sched.phases_between(a, b):
            return True
        return any(r - 1 <= b and a <= r + _AFTER_RESTART for r in restarts)

    return planned


_AFTER_RESTART = 500  # steps after an LR restart over which the norm's new pace is planned


def _against_pace(x: np.ndarray, y: np.ndarray, pace: float, i0: int, i1: int) -> str:
    """``"+21% in 30 steps, where it had moved +0.06% in as many logged points before"``
    (``pace``: the median increment before ``i0``, as :meth:`_spread_jumps` judged it)."""
    steps = int(x[i1 + 1] - x[i0])
    rel = (y[i1 + 1] - y[i0]) / y[i0] if y[i0] else float("nan")
    rel_before = pace * (i1 - i0 + 1) / y[i0] if y[i0] else float("nan")
    return (
        f"{rel:+.1%} in {steps_text(steps)}, where it had moved {rel_before:+.2%} in as many "
        "logged points before"
    )


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
        out = self._jumps(x, y, band, source, _planned_pace(ev))
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

    def _jumps(
        self,
        x: np.ndarray,
        y: np.ndarray,
        band: Band | None,
        source: str,
        planned: Callable[[int, int], bool] = lambda a, b: False,
    ) -> list[Finding]:
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
        # ... and beyond the local pace in its own direction: an increment smaller than the
        # steps around it (the warm-up's first, slow one) departs from them without jumping.
        beyond = resid * d > 0
        flag = (
            (z > self.params.jump_k)
            & (np.abs(resid) > self.params.min_rel_jump * np.abs(y[:-1]))
            & big_move
            & beyond
        )
        spread, pace, noise = self._spread_jumps(x, y, d, past, flag, planned)
        flag |= spread
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
            z_big = float(z[big])
            is_spread = bool(spread[g].any())
            if is_spread:
                # Spread over several points: the centred scale is the jump's own, so the
                # move is set against the pace the norm kept before it instead.
                biggest = _against_pace(x, y, float(pace[i0]), i0, i1)
                m = i1 - i0 + 1
                z_big = abs(y[i1 + 1] - y[i0] - m * pace[i0]) / (noise[i0] * np.sqrt(m))
            if persistent:
                level = (
                    f"; it settled at {num(after)}"
                    + (
                        f" (median of the {len(settled_pts)} points from step {s1:,})"
                        if n_after >= 2
                        else " (the log ends there)"
                    )
                    + f", {after / before:.2f}x its level before."
                )
                summary = (
                    f"Param norm {what} from {num(before)} to {num(reached)} {when} "
                    f"({biggest}){level}"
                )
            else:
                summary = (
                    f"Param norm {what} from {num(before)} to {num(extreme)} at step "
                    f"{extreme_step:,} ({biggest}), then returned to its trend ({num(after)})."
                )
            out.append(
                Finding(
                    kind=FindingKind.PARAM_NORM_JUMP,
                    severity=Severity.WARNING,
                    metric=PARAM_NORM,
                    start_step=int(x[i0 + 1]),
                    # A jump spread over several points peaks where it got furthest.
                    peak_step=extreme_step if is_spread else int(x[big + 1]),
                    end_step=int(x[min(len(x) - 1, i1 + 1)]),
                    measures={
                        "abrupt": True,
                        "before": before,
                        "after": after,
                        "change_pct": change,
                        "robust_z": z_big,
                        "persistent": persistent,
                        "baseline": base,
                        "ratio": after / base,
                        "crossing_step": None,
                        "growth_pct_per_1k_steps": None,
                        "pace_ratio": None,
                        "source": source,
                    },
                    summary=summary,
                    judged_against={**judged, "robust_z": z_big},
                )
            )
        return out

    def _spread_jumps(
        self,
        x: np.ndarray,
        y: np.ndarray,
        d: np.ndarray,
        past: np.ndarray,
        single: np.ndarray,
        planned: Callable[[int, int], bool],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The increments of jumps spread over 2 or more logged points within
        ``jump_max_steps`` steps, that no single increment shows: the change over ``k``
        increments (k = 2, 4, 8, ...) is at least ``min_rel_jump`` of the level, ``jump_k``
        times the noise of the pace before it (scaled by sqrt(k)) away from that pace, and
        ``PAST_MOVE_K`` times what the norm moved in as many increments before. Each such
        stretch is cut to its first and last increment that stands out on its own against
        the pace before the stretch (a one-step jump inside a wider window stays one step),
        and kept when the stretch itself passes the same tests, spans at most
        ``jump_max_steps``, lies clear of the single-increment jumps ``single`` (whose
        settling tail it would otherwise annex) and is not a pace the LR schedule set
        (``planned``: the norm's pace follows the LR up a warm-up and after a restart).
        Returns the increments' mask, and the pace and its noise before each increment."""
        p = self.params
        n = len(d)
        out = np.zeros(n, dtype=bool)
        if n < 3:
            return out, np.zeros(n), np.ones(n)
        pace = trailing_median(d, p.window)  # signed pace before each increment
        noise = trailing_median(np.abs(d - pace), p.window) * MAD_SCALE
        noise = np.maximum(noise, 1e-5 * np.abs(y[:-1]) + 1e-12)
        cand = np.zeros(n + 1, dtype=np.int64)  # +1 at a stretch's start, -1 after its end
        k = 2
        while k <= n:
            span = x[k:] - x[:-k]
            ok = span <= p.jump_max_steps
            if not ok.any():
                break
            move = y[k:] - y[:-k]
            head = slice(0, n - k + 1)
            hit = (
                ok
                & (np.abs(move) > p.min_rel_jump * np.abs(y[:-k]))
                & (np.abs(move - k * pace[head]) > p.jump_k * noise[head] * np.sqrt(k))
                & (np.abs(move) > PAST_MOVE_K * k * past[head])
            )
            at = np.flatnonzero(hit)
            np.add.at(cand, at, 1)
            np.add.at(cand, at + k, -1)
            k *= 2
        inside = np.cumsum(cand[:n]) > 0
        if not inside.any():
            return out, pace, noise
        starts = np.flatnonzero(inside & ~np.concatenate([[False], inside[:-1]]))
        ends = np.flatnonzero(inside & ~np.concatenate([inside[1:], [False]]))
        for a, b in zip(starts, ends, strict=True):
            if a < p.window:  # no full window of pace before it (the warm-up's first steps)
                continue
            seg = d[a : b + 1]
            stands = (np.abs(seg - pace[a]) > 3.0 * noise[a]) & (
                np.abs(seg) > PAST_MOVE_K * past[a]
            )
            own = np.flatnonzero(stands)
            if len(own) < 2:
                continue
            i0, i1 = int(a) + int(own[0]), int(a) + int(own[-1])
            m = i1 - i0 + 1
            move = y[i1 + 1] - y[i0]
            if (
                x[i1 + 1] - x[i0] <= p.jump_max_steps
                and abs(move) > p.min_rel_jump * abs(y[i0])
                and abs(move - m * pace[i0]) > p.jump_k * noise[i0] * np.sqrt(m)
                and abs(move) > PAST_MOVE_K * m * past[i0]
                and not single[max(0, i0 - 2) : i1 + 3].any()
                and not planned(int(x[i0]), int(x[i1 + 1]))
            ):
                out[i0 : i1 + 1] = True
        return out, pace, noise

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
        onset_range: tuple[int, int] | None = None
        if surged:
            xb, yb = bin_median(x[: cross + 1].astype(float), smooth[: cross + 1], max_bins=200)
            h = hinge_onset(xb, yb)
            if h is not None and h[2] > max(h[1], 0.0):
                start = h[0]
                onset_range = h.range  # (the steps the fitted bend cannot be told from)
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
                f"and passed {band.warn_ratio}x its baseline ({num(base)}) at step "
                f"{int(x[cross]):,}, now {current / base:.2f}x its baseline."
            )
        else:
            summary = (
                f"Param norm grew steadily to {current / base:.2f}x its baseline ({num(base)}), "
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
                onset_range=onset_range,
                measures=measures,
                summary=summary,
                judged_against={**self._judged(band), "surge_ratio": self.params.surge_ratio},
            )
        ]
