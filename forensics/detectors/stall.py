"""stall: a wall-clock gap between logged steps far beyond the usual step time.

A hang (a stuck collective, a dead data worker) or a pre-emption shows up as a long silence
between two consecutive logged steps. The usual time per step is the median of wall-time
increments divided by step increments along the main training series. A gap is a stall when
it is both ``factor`` times longer than that expectation and at least ``min_seconds`` long.
Regular pauses (evaluations, checkpoints) are not stalls: when candidate gaps line up with
val/eval steps, their typical length sets the bar, and only gaps several times longer than a
normal pause are reported. Gaps across a restart are left to the ``restart`` finding.

Measures (kind ``stall``, run-level: ``metric`` is null):

| key | meaning |
|---|---|
| `gap_seconds` | wall time between the two logged steps |
| `expected_seconds` | what those steps should have taken at the usual pace |
| `usual_step_seconds` | median seconds per step |
| `ratio` | gap_seconds / expected_seconds |
| `steps_between` | step difference between the two logged points |
| `usual_pause_seconds` | typical eval/checkpoint pause (null when none was seen) |

Judged against: `factor` and `expected_seconds` (factor x the usual interval), `min_seconds`,
`pause_factor` and `usual_pause_seconds`, and `stall_line_seconds`: the silence a gap had to
exceed, the largest of factor x expected_seconds, min_seconds and pause_factor x the usual
pause. The clock is the run's wall times (not a vital sign: no ``Evidence.series``).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from forensics.evidence import Evidence
from forensics.findings import Finding, FindingKind, Severity
from forensics.params import StallParams
from forensics.run import Run
from forensics.schema import EVAL_PREFIX, LOSS, VAL_LOSS

CHECK = "stall"


class StallDetector:
    """Flags long silences in wall time between consecutive logged steps."""

    name = CHECK

    def __init__(self, params: StallParams | None = None) -> None:
        self.params = params or StallParams()

    def _clock(self, run: Run) -> pl.DataFrame | None:
        """step, wall_time, segment of the densest series with wall times (train loss first)."""
        v = run.view().filter(
            pl.col("wall_time").is_not_null()
            & pl.col("wall_time").is_finite()
            & pl.col("layer").is_null()
        )
        if v.is_empty():
            return None
        tag = run.metrics().get(LOSS)
        if tag is None or v.filter(pl.col("tag") == tag).height < self.params.min_points:
            counts = v.group_by("tag").len().sort(["len", "tag"], descending=[True, False])
            tag = counts.get_column("tag")[0]
        return (
            v.filter(pl.col("tag") == tag)
            .group_by("step")
            .agg(pl.col("wall_time").min(), pl.col("segment").max())
            .sort("step")
        )

    def detect(self, ev: Evidence) -> list[Finding]:
        run = ev.run
        c = self._clock(run)
        if c is None or c.height < self.params.min_points:
            run.note(
                f"{CHECK}: not run, the log has no wall-clock times "
                f"(or fewer than {self.params.min_points})"
            )
            return []
        steps = c.get_column("step").to_numpy().astype(np.int64)
        wall = c.get_column("wall_time").to_numpy().astype(float)
        seg = c.get_column("segment").to_numpy()
        dt, ds = np.diff(wall), np.diff(steps).astype(float)
        same_seg = seg[1:] == seg[:-1]
        ok = same_seg & (ds > 0) & (dt >= 0)
        if ok.sum() < self.params.min_points - 1:
            run.note(f"{CHECK}: not run, too few ordered wall-clock points")
            return []
        per_step = float(np.median(dt[ok] / ds[ok]))
        if not per_step > 0:
            run.note(f"{CHECK}: not run, wall times do not advance")
            return []
        expected = ds * per_step
        cand = ok & (dt > self.params.factor * expected) & (dt >= self.params.min_seconds)
        if not cand.any():
            return []
        # Pauses at val/eval steps are expected; their typical length raises the bar.
        eval_steps = self._eval_steps(run)
        at = np.fromiter(eval_steps, dtype=np.int64) if eval_steps else np.array([], np.int64)
        at_eval = np.isin(steps[:-1], at) | np.isin(steps[1:], at)
        pauses = dt[ok & at_eval & (dt > self.params.factor * expected)]
        usual_pause = float(np.median(pauses)) if len(pauses) else None
        if usual_pause is not None:
            cand &= dt > self.params.pause_factor * usual_pause
        out = []
        for k in np.flatnonzero(cand):
            out.append(
                Finding(
                    kind=FindingKind.STALL,
                    severity=Severity.WARNING,
                    metric=None,
                    start_step=int(steps[k]),
                    peak_step=int(steps[k]),
                    end_step=int(steps[k + 1]),
                    measures={
                        "gap_seconds": float(dt[k]),
                        "expected_seconds": float(expected[k]),
                        "usual_step_seconds": per_step,
                        "ratio": float(dt[k] / expected[k]),
                        "steps_between": int(ds[k]),
                        "usual_pause_seconds": usual_pause,
                    },
                    judged_against={
                        "factor": self.params.factor,
                        "expected_seconds": float(expected[k]),
                        "min_seconds": self.params.min_seconds,
                        "pause_factor": self.params.pause_factor,
                        "usual_pause_seconds": usual_pause,
                        "stall_line_seconds": max(
                            self.params.factor * float(expected[k]),
                            self.params.min_seconds,
                            self.params.pause_factor * usual_pause if usual_pause else 0.0,
                        ),
                    },
                    summary=(
                        f"Nothing was logged for {_human(float(dt[k]))} between steps "
                        f"{int(steps[k])} and {int(steps[k + 1])}, about "
                        f"{dt[k] / expected[k]:.0f}x the usual pace: a hang or a pre-emption."
                    ),
                )
            )
        return out

    @staticmethod
    def _eval_steps(run: Run) -> set[int]:
        v = run.view().filter(
            (pl.col("metric") == VAL_LOSS) | pl.col("metric").str.starts_with(EVAL_PREFIX)
        )
        return set(v.get_column("step").unique().to_list()) if not v.is_empty() else set()


def _human(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"
