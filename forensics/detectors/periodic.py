"""Spikes that recur at a regular interval (article 4.4: periodic spikes are the more dangerous,
especially when the interval shrinks; typical causes are a data subset refreshed on a timer,
epoch boundaries and LR restarts).

Two ways to see a period among the spike onsets found by the spike detector:

* the intervals between consecutive spikes follow a line (constant or steadily changing) with a
  small spread around it;
* at least half of the spikes sit on the grid of a period the log itself reveals (epoch starts,
  evals, checkpoint saves, LR restarts), far more than chance would put there (binomial tail
  below ``max_p``). This second test tolerates unrelated spikes in between.

Evenly spaced spikes also happen by luck: the first test asks how often random onsets between
the same first and last spike look as regular (seeded Monte Carlo) and wants that below
``max_p_regular``.

Severity: warning; critical when the intervals shrink.

The measures of its finding kinds are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from forensics.evidence import Evidence
from forensics.evidence.robust import MAD_TO_SIGMA, median_interval
from forensics.evidence.spike_context import Period
from forensics.findings import Finding, FindingKind, MeasureValue, Severity
from forensics.params import PeriodicParams
from forensics.schema import GRAD_NORM, LOSS


def _spread(iv: np.ndarray, linear: bool) -> np.ndarray:
    """Robust relative spread of intervals (rows) around a constant or a least-squares line."""
    iv = np.atleast_2d(iv)
    m = iv.shape[1]
    period = np.median(iv, axis=1, keepdims=True)
    if linear:
        k = np.arange(m, dtype=float)
        kc = k - k.mean()
        slope = (iv * kc).sum(axis=1, keepdims=True) / (kc**2).sum()
        model = iv.mean(axis=1, keepdims=True) + slope * kc
    else:
        model = period
    dev = np.abs(iv - model)
    # With few intervals the median deviation is blind (one of three is zero by construction):
    # use the largest; with five or more, the robust median tolerates one odd interval.
    stat = np.median(dev, axis=1) * MAD_TO_SIGMA if m >= 5 else np.max(dev, axis=1)
    return stat / np.maximum(period[:, 0], 1e-12)


# The most onsets the Monte Carlo below throws at random. Random onsets look less regular the
# more there are (the 0.1% quantile of their spread: 0.37 for 20, 0.64 for 50, 0.81 for 100,
# 0.94 for 200; 50,000 draws each), so a run with more spikes judged against this many gets a
# p-value no smaller than its own: the test can only be stricter. Throwing all of them cost
# 2,000 x n values: 2.4 s of CPU and 80 MB an array for 5,000 spikes, growing with each one.
_MC_ONSETS = 200


def _regularity_p(onsets: np.ndarray, observed: float, linear: bool, sims: int = 2000) -> float:
    """How often spikes thrown at random between the first and the last onset look this regular
    (Monte Carlo, seeded: the same log always gives the same answer); at most
    :data:`_MC_ONSETS` of them."""
    rng = np.random.default_rng(12345)
    n = min(len(onsets), _MC_ONSETS)
    inner = np.sort(rng.uniform(onsets[0], onsets[-1], size=(sims, n - 2)), axis=1)
    pts = np.concatenate(
        [np.full((sims, 1), onsets[0]), inner, np.full((sims, 1), onsets[-1])], axis=1
    )
    null = _spread(np.diff(pts, axis=1), linear)
    return float((1 + np.sum(null <= observed)) / (sims + 1))


def _offsets(onsets: np.ndarray, origin: float, p: float) -> np.ndarray:
    """Signed distance of each onset to the nearest point of the grid origin + k x p."""
    off = np.mod(onsets - origin, p)
    return np.where(off > p / 2, off - p, off)


def _phase(onsets: np.ndarray, period: Period) -> float:
    """Median offset of the onsets from the period's grid."""
    return float(np.median(_offsets(onsets, period.origin, period.steps)))


def _binom_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), exact (n is a count of spikes: small)."""
    return float(sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)))


@dataclass(frozen=True)
class _Intervals:
    """The intervals between spike onsets as a line: their median, the fitted first and last
    interval, the change per spike, and the spread around the line."""

    period: float
    first: float
    last: float
    slope: float
    spread: float
    linear: bool  # the spread was judged around the line (else around a constant)
    positive: bool  # the fitted line stays above zero

    @classmethod
    def of(cls, onsets: np.ndarray) -> _Intervals:
        iv = np.diff(onsets)
        k = np.arange(len(iv), dtype=float)
        # A line through three intervals fits almost anything: with few intervals the spread is
        # judged around a constant, and only the reported trend uses the line.
        slope, icpt = np.polyfit(k, iv, 1) if len(iv) >= 3 else (0.0, float(np.mean(iv)))
        fit = icpt + slope * k
        linear = len(iv) >= 4
        spread = float(_spread(iv, linear)[0])
        return cls(
            float(np.median(iv)),
            float(fit[0]),
            float(fit[-1]),
            float(slope),
            spread,
            linear,
            bool((fit > 0).all()),
        )


class PeriodicSpikeDetector:
    """periodic_spikes for the loss and the grad norm."""

    name = "periodic"

    def __init__(self, params: PeriodicParams | None = None) -> None:
        self.params = params or PeriodicParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        metrics = [m for m in (LOSS, GRAD_NORM) if ev.has(m)]
        if not metrics:
            ev.run.note("periodic: not run, the log has neither a loss nor a grad-norm series")
            return []
        periods = ev.revealed_periods
        out = []
        for metric in metrics:
            onsets = np.array(sorted({s.start_step for s in ev.spikes(metric)}), dtype=float)
            if len(onsets) < self.params.min_count:
                continue
            interval = median_interval(ev.series(metric).steps)
            f = self._regular(metric, onsets, periods, interval) or self._phase_locked(
                metric, onsets, periods, interval
            )
            if f is not None:
                out.append(f)
        return out

    # -- pattern 1: intervals on a line ------------------------------------------------------
    def _regular(
        self, metric: str, onsets: np.ndarray, periods: dict[str, Period], interval: float
    ) -> Finding | None:
        if float(np.median(np.diff(onsets))) <= 0:
            return None
        line = _Intervals.of(onsets)
        if line.spread > self.params.max_spread or not line.positive:
            return None
        # Random spikes are sometimes evenly spaced by luck: demand that luck be rare.
        if _regularity_p(onsets, line.spread, line.linear) > self.params.max_p_regular:
            return None
        match = self._match(line.period, periods, onsets, interval)
        grid = periods[match[0]] if match else None
        phase = _phase(onsets, grid) if grid else None
        return self._finding(metric, onsets, line, match, phase, grid, periods)

    # -- pattern 2: phase-locked to a revealed period -------------------------------------------
    def _phase_locked(
        self, metric: str, onsets: np.ndarray, periods: dict[str, Period], interval: float
    ) -> Finding | None:
        """Spikes sitting on the grid of a period the log reveals (an epoch start, an eval, a
        restart). The phase is known in advance, so the chance that k of n spikes land within
        +-w of the grid is a plain binomial tail (times the number of periods tried)."""
        best: tuple[float, str, float, np.ndarray] | None = None
        min_count, tol = self.params.min_count, self.params.match_tol
        for name, period_ in periods.items():
            p = period_.steps
            if p <= 0 or (onsets[-1] - onsets[0]) < (min_count - 1) * p * (1 - tol):
                continue
            w = max(3 * interval, self.params.phase_tol * p)
            off = _offsets(onsets, period_.origin, p)
            members = onsets[np.abs(off) <= w]
            cycles = len(np.unique(np.round((members - period_.origin) / p)))
            if (
                len(members) < self.params.min_count
                or cycles < self.params.min_count
                or len(members) < 0.5 * len(onsets)
            ):
                continue
            pval = _binom_tail(len(members), len(onsets), min(1.0, 2 * w / p)) * len(periods)
            if pval <= self.params.max_p and (best is None or pval < best[0]):
                best = (pval, name, p, members)
        if best is None:
            return None
        _, name, p, members = best
        line = _Intervals.of(members)
        multiple = max(1, int(round(line.period / p)))
        grid = periods[name]
        return self._finding(
            metric, members, line, (name, p, multiple), _phase(members, grid), grid
        )

    # -- helpers ----------------------------------------------------------------------------
    def _match(
        self, period: float, periods: dict[str, Period], onsets: np.ndarray, interval: float
    ) -> tuple[str, float, int] | None:
        """The revealed period the spikes' period matches: within ``match_tol`` of k times it
        for k up to ``max_multiple``, and in phase with its grid (at least three quarters of
        the onsets within the phase window of a grid point). None when no period does."""
        best = None
        for name, period_ in periods.items():
            p = period_.steps
            if p <= 0:
                continue
            m = round(period / p)
            if m < 1 or m > self.params.max_multiple:
                continue
            err = abs(period / (m * p) - 1.0)
            if err > self.params.match_tol:
                continue
            w = max(3 * interval, self.params.phase_tol * p)
            on_grid = np.abs(_offsets(onsets, period_.origin, p)) <= w
            if on_grid.mean() < 0.75:
                continue
            if best is None or err < best[0]:
                best = (err, name, p, int(m))
        return (best[1], best[2], best[3]) if best else None

    def _finding(
        self,
        metric: str,
        onsets: np.ndarray,
        line: _Intervals,
        match: tuple[str, float, int] | None,
        phase: float | None,
        grid: Period | None,
        periods: dict[str, Period] | None = None,
    ) -> Finding:
        period, first_iv, last_iv = line.period, line.first, line.last
        shrinking = last_iv <= self.params.shrink_ratio * first_iv
        measures: dict[str, MeasureValue] = {
            "period_steps": period,
            "count": len(onsets),
            "first_interval": first_iv,
            "last_interval": last_iv,
            "interval_trend": line.slope,
            "shrinking": bool(shrinking),
            "spread": line.spread,
            "matches": match[0] if match else None,
            "matched_period_steps": match[1] if match else None,
            "multiple": match[2] if match else None,
            "phase_steps": phase,
            "spike_steps": ",".join(str(int(s)) for s in onsets[:20]),
        }
        name = "Loss" if metric == LOSS else "Grad-norm"
        trend = (
            f", the interval shrinking from about {first_iv:,.0f} to {last_iv:,.0f} steps"
            if shrinking
            else ""
        )
        label = {
            "epoch": "the epoch length",
            "eval_interval": "the eval interval",
            "checkpoint_interval": "the checkpoint interval",
            "lr_restart": "the LR-restart interval",
        }
        if match:
            m = (
                f"; it matches {label.get(match[0], match[0])} ({match[1]:,.0f} steps"
                f"{'' if match[2] == 1 else f', x{match[2]}'}, in phase)"
            )
        elif periods:
            shown = ", ".join(
                f"{label.get(k, k).removeprefix('the ')} {v.steps:,.0f} steps"
                for k, v in periods.items()
            )
            m = f"; no interval the log shows matches it ({shown})"
        else:
            m = ""
        summary = (
            f"{name} spikes recur every {period:,.0f} steps ({len(onsets):,} from step "
            f"{int(onsets[0]):,} to {int(onsets[-1]):,}){trend}{m}."
        )
        sev = Severity.CRITICAL if shrinking else Severity.WARNING
        end = int(onsets[-1])
        judged = {
            "max_spread": self.params.max_spread,
            "shrink_ratio": self.params.shrink_ratio,
            "match_tol": self.params.match_tol,
            "max_multiple": self.params.max_multiple,
            "grid_period_steps": grid.steps if grid else None,
            "grid_origin_step": grid.origin if grid else None,
        }
        return Finding(
            FindingKind.PERIODIC_SPIKES,
            sev,
            metric,
            int(onsets[0]),
            summary,
            None,
            end,
            measures,
            judged_against=judged,
            # (every onset: the incidents join each of its spikes to it, the chart marks them)
            events_at=tuple(int(x) for x in onsets),
        )
