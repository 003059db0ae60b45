"""Loss-scale drops of fp16 mixed precision (article 2.4 and 4.2).

A dynamic loss scaler halves its scale at every overflowing step and doubles it after a quiet
stretch, so single halvings are ordinary. What this reports: each *cascade* of halvings (no
growth in between, each within ``cascade_gap`` steps of the previous), and each *sustained
decline* (the level the scale held, its median over the trailing ``decline_steps``, staying
``decline_halvings`` or more below its earlier highest for ``decline_steps``, reached through
several separate drops). Read from the ``loss_scale``
series when logged, else from ``overflow`` (1 at each skipped step: DeepSpeed / Megatron lines).

Severity: calibration = info; a later cascade of ``warn_halvings`` (3) or more halvings, one that
coincides with a loss spike, or a sustained decline = warning; a later cascade of two halvings =
info. A calibration cascade beside a loss spike is a warning too, unless the scaler was still
descending from its initial scale (no level held for ``cascade_gap`` steps) and the spike came
back: a scaler that has not found its level overflows at ordinary gradients.
Single later halvings are normal scaler behaviour: counted in a run note, not reported.

The measures of its finding kinds are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from forensics.evidence import Evidence, Series
from forensics.evidence.robust import median_interval
from forensics.evidence.spike_context import ScaleCascade
from forensics.evidence.spike_shape import SpikeClass
from forensics.evidence.trend_utils import rolling_median
from forensics.findings import (
    Finding,
    FindingKind,
    MeasureValue,
    Severity,
    scale_text,
    steps_text,
)
from forensics.params import LossScaleParams
from forensics.schema import LOSS, LOSS_SCALE, OVERFLOW, SKIPPED_ITERS


def _first_growth(scale: Series, cascades: list[ScaleCascade]) -> int | None:
    """The first step known to follow a growth of the loss scale: a logged scale above the one
    logged before it, or a cascade that starts from a scale above where the one before it
    ended (DeepSpeed logs the scale at its overflows only: "Attempted loss scale: 128,
    reducing to 64" after a cascade that had ended at 64)."""
    up = np.flatnonzero(scale.values[1:] > scale.values[:-1])
    found = [int(scale.steps[up[0] + 1])] if len(up) else []
    for a, b in zip(cascades, cascades[1:], strict=False):
        if a.to_scale is not None and b.from_scale is not None and b.from_scale > a.to_scale:
            found.append(b.start_step)
            break
    return min(found) if found else None


def _first_logged(ev: Evidence, default: int) -> int:
    """The first step the loss scale (else the overflow series) is logged at."""
    for metric in (LOSS_SCALE, OVERFLOW):
        if ev.run.has(metric):
            steps = ev.logged(metric).steps
            if len(steps):
                return int(steps[0])
    return default


def _underflow_after(ev: Evidence, f: Finding) -> Finding:
    """``f`` with its summary saying so when the scale logged right after the cascade is 0
    (halved until it underflowed; the cascade's halvings are counted on positive points)."""
    if f.end_step is None or f.measures.get("source") != "loss_scale":
        return f
    s = ev.series(LOSS_SCALE)
    i = int(np.searchsorted(s.steps, f.end_step, side="right"))
    if i >= len(s) or s.values[i] != 0:
        return f
    zero = s.values[i:] == 0
    n = int(np.argmin(zero)) if not zero.all() else len(zero)  # points at 0 from there on
    until = int(s.steps[i + n - 1])
    span = f"at step {int(s.steps[i]):,}" if n == 1 else f"from step {int(s.steps[i]):,}"
    span += "" if n == 1 else f" to {until:,}"
    text = f"{f.summary[:-1]}; then the scale was 0 {span} (it underflowed)."
    return replace(f, summary=text)


def _skipped_after(ev: Evidence, f: Finding) -> Finding:
    """``f`` with the iterations the trainer counted as skipped after the cascade ended, to
    the end of the log (Megatron's "number of skipped iterations": an overflowing step's
    update is skipped). A scale that reached its floor goes on overflowing there; each skipped
    iteration is an update that never reached the weights. Unchanged (the measures null)
    without that count in the log or without a line after the cascade."""
    measures = dict(f.measures, skipped_after=None, iterations_after=None)
    end = f.end_step if f.end_step is not None else f.start_step
    s = ev.logged(SKIPPED_ITERS) if ev.has(SKIPPED_ITERS) else None
    i = int(np.searchsorted(s.steps, end, side="right")) if s is not None else 0
    if s is None or i >= len(s.steps) or i == 0:
        return replace(f, measures=measures)
    counted = s.values[i:]
    skipped = int(counted[np.isfinite(counted)].sum())
    last = int(s.steps[-1])
    covered = last - int(s.steps[i - 1])  # the iterations of the lines after the cascade
    measures.update(skipped_after=skipped, iterations_after=covered)
    if skipped == 0:
        return replace(f, measures=measures)
    share = skipped / covered if covered > 0 else float("nan")
    text = (
        f"{f.summary[:-1]}; after it the trainer skipped {skipped:,} of the {covered:,} "
        f"iterations to step {last:,} ({_share_text(share)}, its own count): updates that "
        "never reached the weights."
    )
    return replace(f, summary=text, measures=measures)


def _share_text(share: float) -> str:
    """A share of iterations as a percentage that never reads 0% for a count above zero (3
    of 952 had read "0%")."""
    if share >= 0.01 or share != share:
        return f"{share:.0%}"
    return f"{share:.1%}" if share >= 0.001 else "under 0.1%"


class LossScaleDetector:
    """loss_scale_drop: cascades of halvings and sustained declines."""

    name = "loss_scale"

    def __init__(self, params: LossScaleParams | None = None) -> None:
        self.params = params or LossScaleParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        run = ev.run
        if not (run.has(LOSS_SCALE) or run.has(OVERFLOW)):
            run.note(
                "loss_scale: not run, the log has no loss-scale or overflow series "
                "(bf16 or fp32 training?)"
            )
            return []
        cascades = ev.scale_cascades
        spikes = _SpikeWindows(_spike_windows(ev) if cascades else [])
        first = run.first_step
        calib_end = (
            first + self.params.calibration_steps
            if first <= self.params.calibration_steps
            else None
        )
        # The calibration is the scaler's first descent: once the scale has grown back, it
        # has found its level, and a later halving is ordinary dynamic scaling even within the
        # first 200 steps (DeepSpeed-Chat's reward model fell from 65,536 to 64 by step 9,
        # grew to 128, and halved once at step 145).
        grew = _first_growth(ev.series(LOSS_SCALE), cascades) if calib_end is not None else None
        if grew is not None and calib_end is not None and grew <= calib_end:
            calib_end = grew - 1
        out: list[Finding] = []
        singles = 0
        scale_from = _first_logged(ev, first)
        for c in cascades:
            calibration = calib_end is not None and c.start_step <= calib_end
            hit = spikes.first_overlap(float(c.start_step - 1), float(c.end_step))
            # A scaler descending from its initial scale overflows at ordinary gradients until
            # it finds its level: a loss spike in those steps that came back is not shown to be
            # numeric trouble by the drop (bigscience's Megatron runs: 2^23 to 2^14 in the first
            # 30 iterations, an early spike back within 10). One that did not come back is; so
            # is a first halving after the scale had held for a while (periodic_spikes: 65,536
            # for 125 steps, then halved at a bad batch's spike).
            searching = calibration and c.start_step - scale_from <= self.params.cascade_gap
            came_back = hit is not None and searching and spikes.came_back[hit]
            if (hit is not None and not came_back) or (
                not calibration and c.halvings >= self.params.warn_halvings - 1e-9
            ):
                sev = Severity.WARNING
            elif calibration or c.halvings >= 2 - 1e-9:
                sev = Severity.INFO
            else:
                singles += 1
                continue
            f = self._cascade_finding(c, sev, calibration, hit, calib_end, came_back)
            out.append(_skipped_after(ev, _underflow_after(ev, f)))
        if singles:
            run.note(
                f"loss_scale: {singles} single loss-scale halving(s) after calibration "
                "(ordinary dynamic scaling)"
            )
        out += self._declines(ev, calib_end)
        return out

    def _cascade_finding(
        self,
        c: ScaleCascade,
        sev: Severity,
        calibration: bool,
        spike: int | None,
        calib_end: int | None,
        came_back: bool = False,
    ) -> Finding:
        measures: dict[str, MeasureValue] = {
            "pattern": "cascade",
            "from_scale": c.from_scale,
            "from_step": c.from_step,
            "to_scale": c.to_scale,
            "to_step": None,
            "last_scale": None,
            "halvings": c.halvings,
            "steps": c.end_step - c.start_step,
            "overflow_steps": c.overflow_steps,
            "drops": 1,
            "calibration": calibration,
            "coincides_with_spike": spike is not None,
            "spike_step": spike,
            "source": c.source,
        }
        known = c.from_scale is not None and c.to_scale is not None
        # Logged sparsely: the halvings came after the last point at the old scale, not at the
        # step the lower scale was first seen.
        sparse = known and c.from_step is not None and c.from_step < c.start_step - 1
        at = f" at step {c.from_step:,}" if sparse else ""
        fromto = (
            f" from {scale_text(c.from_scale)}{at} to {scale_text(c.to_scale)}" if known else ""
        )
        if calibration and spike is not None and came_back:
            what = (
                "the scaler calibrating at the start of training (it overflows at ordinary "
                "gradients until it finds its level); the loss spike that began at step "
                f"{spike:,} in the same steps came back, and is judged on its own"
            )
        elif calibration and spike is None:
            what = "the scaler calibrating at the start of training"
        elif spike is not None:
            what = f"numeric overflow, beside the loss spike that began at step {spike:,}"
        else:
            what = "gradients overflowing fp16 repeatedly"

        if c.start_step == c.end_step:
            where = f"at step {c.start_step:,}"
        elif sparse:
            where = f"by step {c.end_step:,} (first seen lower at step {c.start_step:,})"
        else:
            where = f"between steps {c.start_step:,} and {c.end_step:,}"
        times = "once" if c.halvings == 1 else f"{c.halvings:g} times"
        # A scaler halves at most once a step: more halvings than logged steps (2^24 to 2^16
        # from one step to the next, the article's case) is a fall, not a count of events.
        span = c.end_step - (c.from_step if c.from_step is not None else c.start_step - 1)
        if c.from_scale is not None and c.to_scale and not sparse and c.halvings > max(span, 1):
            fell = f"fell {c.from_scale / c.to_scale:,.4g}x ({c.halvings:g} halvings' worth)"
            summary = f"Loss scale {fell}{fromto} {where}: {what}."
        else:
            summary = f"Loss scale halved {times}{fromto} {where}: {what}."
        return Finding(
            FindingKind.LOSS_SCALE_DROP,
            sev,
            LOSS_SCALE,
            c.start_step,
            summary,
            c.end_step,
            c.end_step,
            measures,
            judged_against={
                "cascade_gap_steps": self.params.cascade_gap,
                "warn_halvings": self.params.warn_halvings,
                "calibration_end_step": calib_end,
            },
        )

    def _declines(self, ev: Evidence, calib_end: int | None) -> list[Finding]:
        scale = ev.series(LOSS_SCALE)
        t, v = scale.steps, scale.values
        keep = v > 0
        if not keep.all():  # (no copies of an all-positive scale)
            t, v = t[keep], v[keep]
        del keep
        if calib_end is not None:  # (steps sorted: the points after it are a slice)
            after = int(np.searchsorted(t, calib_end, side="right"))  # t[after:] > calib_end
            t, v = t[after:], v[after:]
        if len(t) < 3:
            return []
        lvl = np.log2(v)
        if float(lvl.max() - lvl.min()) < self.params.decline_halvings - 1e-9:
            return []  # (no level it held can lie that far below another)
        # The level the scaler held: the median of its trailing decline_steps. A healthy
        # scaler's sawtooth (up after a quiet growth interval, down at the next overflow, an
        # outlier batch's extra halving) moves it by a halving at most; a decline moves it.
        # Against the all-time highest point, a sawtooth between 2^15 and 2^17 sat "two
        # halvings below its peak" most of the time: warnings on healthy fp16 runs.
        held = _held_level(t, lvl, self.params.decline_steps)
        peak = np.maximum.accumulate(held)
        low = _at_least(peak, held, self.params.decline_halvings - 1e-9)
        out = []
        idx = np.flatnonzero(low)
        if len(idx) == 0:
            return []
        for g in np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1):
            a, b = int(g[0]), int(g[-1])
            span = int(t[b] - t[a])
            if span < self.params.decline_steps:
                continue
            # Where the scale left the held peak, where it first fell to the lowest level it
            # then held, and its separate drops on the way (the drops after that are the
            # sawtooth it grew back through). Steps of the scale itself: the held level lags
            # it by up to half its window.
            start = a
            while start > 0 and lvl[start - 1] < peak[a]:
                start -= 1
            floor = float(held[a : b + 1].min())
            bottom = start + int(np.argmax(lvl[start : b + 1] <= floor + 1e-9))
            seg = lvl[start - 1 if start > 0 else 0 : bottom + 1]
            drop_steps = t[start : bottom + 1][np.diff(seg) < 0] if len(seg) > 1 else np.array([])
            events = (
                1 + int(np.sum(np.diff(drop_steps) > self.params.cascade_gap))
                if len(drop_steps)
                else 0
            )
            if events < 2:
                continue  # one cascade that stayed down: already reported as that cascade
            # A burst of overflows the scaler then grew back from (three outlier batches
            # within 200 steps, a halving regained every growth interval, perhaps one more
            # outlier on the way) is no decline: the fall must itself take decline_steps, or
            # the scale must have overflowed again and again down there (it could not hold
            # even the lower level).
            again = int(np.count_nonzero(np.diff(lvl[bottom : b + 1]) < 0))
            if int(t[bottom] - t[start]) < self.params.decline_steps and again < 2:
                continue
            from_scale, to_scale = float(2 ** peak[a]), float(2**floor)
            last_scale = float(v[b])
            n_steps = int(t[bottom] - t[start])
            measures: dict[str, MeasureValue] = {
                "pattern": "sustained_decline",
                "from_scale": from_scale,
                "from_step": int(t[start - 1]) if start > 0 else None,
                "to_scale": to_scale,
                "to_step": int(t[bottom]),
                "last_scale": last_scale,
                "halvings": float(peak[a] - floor),
                "steps": n_steps,
                "overflow_steps": None,
                "skipped_after": None,
                "iterations_after": None,
                "drops": events,
                "calibration": False,
                "coincides_with_spike": False,
                "spike_step": None,
                "source": "loss_scale",
            }
            held_text = f"the level it held over {steps_text(self.params.decline_steps)}"
            if last_scale > to_scale:
                regrew = (
                    f"; it was back at {scale_text(last_scale)} by step {int(t[b]):,}, its held "
                    "level still "
                    f"{from_scale / float(2 ** held[b]):,.4g}x below the earlier one"
                )
            else:
                regrew = f"; still at {scale_text(to_scale)} at step {int(t[b]):,}"
            summary = (
                f"Loss scale declined from {scale_text(from_scale)} to {scale_text(to_scale)} "
                f"({held_text}) over {steps_text(n_steps)} (steps {int(t[start]):,}-"
                f"{int(t[bottom]):,}) in {events:,} separate drops: gradients overflowed fp16 "
                f"faster than the scaler grew it back{regrew}."
            )
            out.append(
                Finding(
                    FindingKind.LOSS_SCALE_DROP,
                    Severity.WARNING,
                    LOSS_SCALE,
                    int(t[start]),
                    summary,
                    int(t[b]),
                    int(t[b]),
                    measures,
                    judged_against={
                        "decline_halvings": self.params.decline_halvings,
                        "decline_steps": self.params.decline_steps,
                        "calibration_end_step": calib_end,
                    },
                )
            )
        return out


_CHUNK = 1 << 18


def _held_level(t: np.ndarray, lvl: np.ndarray, steps: int) -> np.ndarray:
    """The median of ``lvl`` over the points of the trailing ``steps`` steps (a window of that
    many steps' worth of points at the median logging interval), rounded down to a whole
    halving: a level the scale held for at least half of it."""
    window = max(1, int(round(steps / max(median_interval(t), 1.0))))
    held = rolling_median(lvl, window, center=False)
    return np.floor(held + 1e-9)


def _at_least(peak: np.ndarray, lvl: np.ndarray, halvings: float) -> np.ndarray:
    """``(peak - lvl) >= halvings``, the differences made a piece at a time (no whole-length
    float temporary)."""
    out = np.empty(len(lvl), dtype=bool)
    for lo in range(0, len(lvl), _CHUNK):
        hi = lo + _CHUNK
        np.greater_equal(peak[lo:hi] - lvl[lo:hi], halvings, out=out[lo:hi])
    return out


class _SpikeWindows:
    """The spike windows (sorted by onset) and, for a cascade, the first whose window meets
    it. A window holds its onset (``lo <= onset <= hi``), so one meeting ``(a, b]`` has its
    onset within ``(a - back, b + ahead)`` (the widest reach of a window behind and ahead of
    its onset): only that stretch is looked through. Looking through every window for every
    cascade cost cascades x spikes, 0.8 s of a 10M-step run (50 cascades, 50,000 spikes)."""

    def __init__(self, windows: list[tuple[int, float, float, bool]]) -> None:
        self.windows = [(s, lo, hi) for s, lo, hi, _ in windows]
        # Whether the loss spike with each onset came back (physiological or beneficial).
        self.came_back = {s: back for s, _, _, back in windows}
        self.onsets = np.array([s for s, _, _ in self.windows], dtype=np.float64)
        self.ahead = max((s - lo for s, lo, _ in self.windows), default=0.0)  # onset - lo
        self.back = max((hi - s for s, _, hi in self.windows), default=0.0)  # hi - onset

    def first_overlap(self, a: float, b: float) -> int | None:
        """The onset of the first window (in onset order) overlapping ``(a, b]`` (``lo < b``
        and ``hi > a``, in float64 as overlaps() compares), None when none does."""
        # (one step wider on each side: the reach is a float difference, rounded)
        i = int(np.searchsorted(self.onsets, a - self.back - 1, side="left"))
        j = int(np.searchsorted(self.onsets, b + self.ahead + 1, side="right"))
        return next((s for s, lo, hi in self.windows[i:j] if float(lo) < b and float(hi) > a), None)


def _spike_windows(ev: Evidence) -> list[tuple[int, float, float, bool]]:
    """(onset, lo, hi] windows of the loss spikes (the evidence's, found once with the
    configured spike parameters), and whether each came back. A loss spike with the scale
    falling in the same steps is the article's numeric-stability sign (4.2). A grad-norm spike
    alone is not: a gradient large enough to overflow fp16 is what the scaler halves for, and
    the same event seen twice (truncated_log: two halvings at steps 41-43, the scaler's first
    descent, beside a grad-norm spike the loss never felt, had made a healthy run yellow)."""
    out = []
    for s in ev.spikes(LOSS):
        iv = s.log_interval
        back = s.classification in (SpikeClass.PHYSIOLOGICAL, SpikeClass.BENEFICIAL)
        out.append((s.start_step, s.start_step - iv, float(s.peak_step + iv), back))
    return sorted(out)
