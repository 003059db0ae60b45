"""no_learning: a run whose loss never fell (article 6.2: "is the loss falling at the expected
pace?", the first start-up item).

A log that starts at the beginning of training (its first step within two logging intervals of
step 0) and spans at least ``min_steps`` is judged: the loss over its first ``head_frac`` of the
logged points (at most ``head_max_points``: the start is the untrained model's loss, and a long
run's loss falls most of the way within its first few percent) against the loss over its last
``tail_frac``. When it fell by less than
``min_fall`` (relative) and its second half is not clearly falling either (a Theil-Sen slope
whose 90% band lies below zero and a fall of at least ``still_falling_pct`` % over the half
would be a run still learning), the run never learned: a warning, however calm every other
vital sign looks.

Not judged this way: a run whose loss was well below its start somewhere (it learned, then
diverged: the lowest median of ``tail_frac`` consecutive points is ``min_fall`` below the
start), a resumed log (it starts mid-training), and a run that still falls steadily, however
slowly (a large model fine-tuned from a checkpoint falls 2% and keeps falling).

The measures of its finding kind are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

import numpy as np

from forensics.evidence import Evidence
from forensics.evidence.robust import median_interval
from forensics.evidence.trend_utils import num, rolling_median, theil_sen
from forensics.findings import Finding, FindingKind, Severity, step_range
from forensics.params import NoLearningParams
from forensics.schema import LOSS, LR


def _zero_lr_note(ev: Evidence, start: float, end: float) -> None:
    """A loss that fell while the logged LR is exactly 0 at every logged step: the series is
    not the rate the optimizer applied (another parameter group's, or a scheduler's value read
    before its first step). The checks that read the LR judge that series, so say so."""
    if not ev.has(LR):
        return
    lr = ev.series(LR).values
    if len(lr) and not np.any(lr):
        ev.run.note(
            f"no_learning: the loss fell from {num(start)} to {num(end)} while the logged learning "
            f"rate is 0 at all {len(lr):,} of its points: the logged LR is not the rate the "
            "optimizer applied (another parameter group's, or a scheduler read before its "
            "first step), so the checks that read it (LR changes, schedule effects) judge a "
            "series that did not drive this run"
        )


class NoLearningDetector:
    """A loss that stays where it started, from the first step to the last."""

    name = "no_learning"

    def __init__(self, params: NoLearningParams | None = None) -> None:
        self.params = params or NoLearningParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        p = self.params
        if not ev.has(LOSS):
            return []
        s = ev.series(LOSS)
        t, v = s.steps, s.values
        if len(v) < p.min_points or t[-1] - t[0] < p.min_steps:
            return []
        if t[0] > 2 * median_interval(t) + 1:
            ev.run.note(
                f"no_learning: not judged, the log starts at step {int(t[0]):,} (a resumed "
                "run: its starting loss is not the untrained model's)"
            )
            return []
        n = len(v)
        k_head = max(3, min(int(round(n * p.head_frac)), p.head_max_points))
        k_tail = max(3, int(round(n * p.tail_frac)))
        start, end = float(np.median(v[:k_head])), float(np.median(v[-k_tail:]))
        if start <= 0:
            return []
        fall = (start - end) / start
        if fall >= p.min_fall:
            _zero_lr_note(ev, start, end)
            return []
        # Learned, then lost it (a divergence, a blow-up): the loss was well below its start
        # somewhere. The lowest median of k_tail consecutive points says so.
        lowest = float(
            np.min(rolling_median(v, k_tail, center=True)[k_tail // 2 : n - k_tail // 2])
        )
        if lowest < start * (1 - p.min_fall):
            return []
        half = n // 2
        slope = theil_sen(t[half:], v[half:])
        if slope is None:
            return []
        span = float(t[-1] - t[half])
        level = abs(float(np.median(v[half:]))) or 1.0
        trend, low, high = (100.0 * x * span / level for x in (slope.slope, slope.low, slope.high))
        if high < 0.0 and trend <= -p.still_falling_pct:
            return []  # still falling, however slowly: it learns
        h0, h1 = int(t[0]), int(t[k_head - 1])
        e0, e1 = int(t[-k_tail]), int(t[-1])
        moved = f"{abs(fall):.1%} {'lower' if fall >= 0 else 'higher'}"
        summary = (
            f"The loss never fell: {num(start)} over the first {k_head:,} logged points (steps "
            f"{step_range(h0, h1)}), {num(end)} over the last {k_tail:,} (steps "
            f"{step_range(e0, e1)}), {moved} after {int(t[-1] - t[0]):,} steps, and the second "
            f"half is not falling ({trend:+.2f}% over it, 90% band {low:+.2f}% to {high:+.2f}%)."
        )
        return [
            Finding(
                FindingKind.NO_LEARNING,
                Severity.WARNING,
                LOSS,
                int(t[0]),
                summary,
                None,
                int(t[-1]),
                {
                    "loss_start": start,
                    "loss_end": end,
                    "fall_pct": 100.0 * fall,
                    "start_points": k_head,
                    "end_points": k_tail,
                    "span_steps": int(t[-1] - t[0]),
                    "second_half_trend_pct": trend,
                    "second_half_trend_low_pct": low,
                    "second_half_trend_high_pct": high,
                },
                judged_against={
                    "min_fall": p.min_fall,
                    "still_falling_pct": p.still_falling_pct,
                    "min_steps": p.min_steps,
                    "head_frac": p.head_frac,
                    "head_max_points": p.head_max_points,
                    "tail_frac": p.tail_frac,
                },
            )
        ]
