"""throughput_drop: tokens/s well below its recent normal (article sections 2.4 and 7.1).

The article's rule of thumb: throughput suddenly down by 30% usually means a data-loading
bottleneck or a GPU clocking down; persistently low throughput points at the input pipeline,
throttling or communication. The series is smoothed with a short centered median and
compared with a trailing rolling median (the baseline); a drop is a stretch of at least a
few points below (1 - 30%) of the baseline frozen at the drop's start. When only the step
time is logged, its inverse is used: 30% fewer tokens/s is a step time 1/0.7 = 1.43x longer.

Measures (kind ``throughput_drop``):

| key | meaning |
|---|---|
| `source` | ``throughput`` (tokens/s) or ``step_time`` (inverted) |
| `baseline` | rolling-median level before the drop (in the source's units) |
| `level` | median level during the drop (same units) |
| `drop_pct` | how far throughput fell below the baseline, in % |
| `window_steps` | steps from the drop's start to its end |
| `n_points` | logged points in the drop |
| `recovered` | true when throughput came back above the limit before the log ended |

Judged against: `baseline` (the frozen rolling median, source units), `drop_ratio` (0.3),
`drop_line` (the level the smoothed series fell below: (1 - 0.3) x baseline in tokens/s, or
baseline / 0.7 in s/step), `baseline_points` (the rolling window).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from forensics.evidence import Evidence
from forensics.evidence.trend_utils import rolling_median
from forensics.findings import Finding, FindingKind, Severity
from forensics.params import ThroughputParams
from forensics.schema import STEP_TIME, THROUGHPUT

CHECK = "throughput_drop"


class ThroughputDetector:
    """Flags stretches where tokens/s falls more than 30% below its rolling baseline."""

    name = CHECK

    def __init__(self, params: ThroughputParams | None = None) -> None:
        self.params = params or ThroughputParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        run = ev.run
        metric = THROUGHPUT
        tp = ev.series(THROUGHPUT)
        x, y = tp.steps, tp.values
        if len(x) == 0:
            metric = STEP_TIME
            st = ev.series(STEP_TIME)
            ok = st.values > 0
            x, y = st.steps[ok], 1.0 / st.values[ok]  # work in "work per second", whatever the unit
        if len(x) == 0:
            run.note(
                f"{CHECK}: not run, the run logged neither throughput (tokens/s) nor step time"
            )
            return []
        if len(x) < self.params.min_history + self.params.min_points:
            run.note(f"{CHECK}: not run, only {len(x)} throughput points")
            return []
        smooth = rolling_median(y, self.params.smooth_points)
        base = (
            pl.Series(y)
            .rolling_median(self.params.baseline_points, min_samples=self.params.min_history)
            .shift(1)
            .to_numpy()
            .astype(float)
        )
        limit = 1.0 - self.params.drop
        below = np.nan_to_num(smooth < limit * base, nan=False).astype(bool)
        out: list[Finding] = []
        i, n = 0, len(y)
        while i < n:  # one iteration per drop episode, plus a vectorised search for the next
            nxt = np.flatnonzero(below[i:])
            if len(nxt) == 0:
                break
            i += int(nxt[0])
            frozen = base[i]  # the baseline before the drop, not one the drop drags down
            ends = np.flatnonzero(smooth[i:] >= limit * frozen)
            j = i + int(ends[0]) if len(ends) else n
            if j - i >= self.params.min_points:
                out.append(self._finding(metric, x, y, i, j, frozen))
            i = max(j, i + 1)
        return out

    def _finding(
        self, metric: str, x: np.ndarray, y: np.ndarray, i: int, j: int, frozen: float
    ) -> Finding:
        lvl = float(np.median(y[i:j]))
        drop_pct = 100.0 * (1.0 - lvl / frozen)
        recovered = j < len(y)
        end = int(x[j - 1])
        as_units = (lambda v: 1.0 / v) if metric == STEP_TIME else (lambda v: v)
        unit_txt = "tokens/s" if metric == THROUGHPUT else "s/step"
        peak = i + int(np.argmin(y[i:j]))
        limit = 1.0 - self.params.drop
        return Finding(
            kind=FindingKind.THROUGHPUT_DROP,
            severity=Severity.WARNING,
            metric=metric,
            start_step=int(x[i]),
            peak_step=int(x[peak]),
            end_step=end,
            measures={
                "source": metric,
                "baseline": as_units(frozen),
                "level": as_units(lvl),
                "drop_pct": drop_pct,
                "window_steps": end - int(x[i]),
                "n_points": j - i,
                "recovered": recovered,
            },
            judged_against={
                "baseline": as_units(frozen),
                "drop_ratio": self.params.drop,
                "drop_line": as_units(limit * frozen),
                "baseline_points": self.params.baseline_points,
            },
            summary=(
                f"Throughput fell {drop_pct:.0f}% below its recent level "
                f"({as_units(frozen):.4g} -> {as_units(lvl):.4g} {unit_txt}) "
                f"from step {int(x[i])} to {end}"
                + (
                    ", then recovered."
                    if recovered
                    else ", and had not recovered when the log ends."
                )
            ),
        )
