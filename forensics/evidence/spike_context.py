"""What else happened around a spike: LR-schedule kinks, loss-scale drops, periods the log reveals.

Shared by the spike, periodicity and loss-scale detectors (article 4.2 and 4.4: a spike in the
step of a loss-scale drop is numeric overflow; a spike at a non-smooth point of the LR schedule
is schedule-induced; spikes that recur with the epoch, the eval or the checkpoint interval point
at the data pipeline or the job's own housekeeping).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from forensics.evidence.robust import median_interval
from forensics.schema import EPOCH, EVAL_PREFIX, VAL_LOSS

if TYPE_CHECKING:
    from forensics.evidence import Evidence, Series
    from forensics.evidence.schedule import Schedule


# How far before an onset a control input (an LR change, a resume, a schedule kink) still counts
# as near it: the article's 100 steps, the short end of a normal recovery (4.4).
NEAR_STEPS = 100


def near_steps(first_step: int, last_step: int, base: int) -> int:
    """How far before an onset an event still counts as near it: ``base`` steps, or a tenth
    of a shorter log (at least 5): in a 60-step log a warm-up end 30 steps before a spike is
    near it only as everything is. The spike detector and the causes table both read it, so
    a spike's sentence and its causes name the same schedule events."""
    steps = last_step - first_step + 1
    return int(min(base, max(5, steps // 10)))


# -- LR schedule ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ScheduleEvent:
    """A point of the LR schedule a spike may follow: the warm-up's end, a restart, a step
    drop or the start of a cooldown (an LR that left its schedule is not one: the causes
    table calls that an LR change)."""

    step: int
    kind: str  # warmup_end | restart | drop | cooldown (measures.LR_KINK_KINDS)
    lr_before: float | None = None  # restart / drop: the LR on either side
    lr_after: float | None = None


def schedule_events(schedule: Schedule, warmup_end: int | None) -> list[ScheduleEvent]:
    """The schedule's events, sorted by step (the spike detector's sentence and the causes
    table read this one list)."""
    out: list[ScheduleEvent] = []
    if warmup_end is not None:
        out.append(ScheduleEvent(int(warmup_end), "warmup_end"))
    # A warm-up after the first (the LR warmed up again after a restart or a drop to zero):
    # its end is where the LR is back at its peak. A grad-norm surge as it got there was
    # read as "no warm-up end, restart or step drop" before it (the restart 100 steps back).
    for seg in schedule.rewarms:
        if warmup_end is None or seg.end_step > warmup_end:
            out.append(ScheduleEvent(seg.end_step, "warmup_end"))
    for c in schedule.changes:
        if c.kind in ("restart", "step_drop"):
            kind = "restart" if c.kind == "restart" else "drop"
            out.append(ScheduleEvent(c.step, kind, c.lr_before, c.lr_after))
    for seg in schedule.segments:
        if seg.kind == "cooldown":
            out.append(ScheduleEvent(seg.start_step, "cooldown"))
    # Events at one step: the one named is the last, so the warm-up end, then a cooldown's
    # start, then a restart, then a drop.
    out.sort(key=lambda e: (e.step, _TIE_ORDER.index(e.kind)))
    return out


_TIE_ORDER = ("drop", "restart", "cooldown", "warmup_end")


def absorbed_reach(measures: Mapping[str, object], reach: int) -> int:
    """How far before a grad-norm spike's onset a schedule event may lie to be its cause.

    ``reach`` (:func:`near_steps`), but one logging interval for an outlier the optimizer
    absorbed (``transient`` and no ``loss_response``): a schedule change sets the LR of
    every step after it, so it explains what starts with it or builds up after it, not a
    single batch's outlier tens of steps later (the healthy runs' step-71 outlier, 41 steps
    after the warm-up's end). The spike detector's sentence and the causes table both read it."""
    if measures.get("transient") is True and measures.get("loss_response") is False:
        iv = measures.get("log_interval")
        one = int(iv) if isinstance(iv, int | float) and math.isfinite(iv) and iv >= 1 else 1
        return min(reach, one)
    return reach


def event_near(
    events: list[ScheduleEvent], steps: list[int], lo: int, hi: int
) -> ScheduleEvent | None:
    """The last of ``events`` (sorted by step; ``steps`` their steps, made once by the
    caller) with ``lo <= step <= hi`` (None if none), by binary searches."""
    last = bisect_right(steps, hi)
    return events[last - 1] if last > bisect_left(steps, lo) else None


@dataclass(frozen=True)
class Kink:
    step: int
    kind: str  # warmup_end | restart | drop | slope_change
    strength: float  # slope change x run length / peak LR (dimensionless)


def lr_kinks(lr: Series, *, min_strength: float = 3.0, span_frac: float = 0.01) -> list[Kink]:
    """Non-smooth points of the LR schedule (``lr``: the finite LR series).

    Slopes before and after each point are taken over a span of about ``span_frac`` of the
    run (at least 3 points) so that an LR printed with three digits does not look like a kink
    at every step. The strength is the slope change times the run length over the peak LR:
    a whole cosine schedule changes slope by at most pi/2 on that scale, a warm-up of 5% of
    the run ending gives 20.
    """
    t, v = lr.steps, lr.values
    if len(t) < 5:
        return []
    peak = max(abs(float(v.max())), abs(float(v.min())))  # (np.max(np.abs(v)), no copy)
    length = float(t[-1] - t[0])
    if peak <= 0 or length <= 0:
        return []
    interval = median_interval(t)
    k = max(3, int(round(span_frac * length / interval)))
    k = min(k, max(1, (len(t) - 1) // 2))
    n = len(t) - 2 * k  # the points with k neighbours on each side: k .. len(t) - k - 1
    if n <= 0:
        return []
    # Block by block (the same element-wise arithmetic as on the whole arrays, whose eight
    # whole-length temporaries took most of the 0.1 s of a 1M-step LR: new pages, not sums):
    # each block's candidates with their strengths and slopes either side.
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    for a in range(0, n, _KINK_BLOCK):
        b = min(n, a + _KINK_BLOCK)
        mid, lo, hi = slice(k + a, k + b), slice(a, b), slice(2 * k + a, 2 * k + b)
        before = (v[mid] - v[lo]) / (t[mid] - t[lo])
        after = (v[hi] - v[mid]) / (t[hi] - t[mid])
        strength = np.abs(after - before) * length / peak
        c = np.flatnonzero(strength >= min_strength)
        found.append((c + (a + k), strength[c], before[c], after[c]))
    cand, cand_strength, cand_before, cand_after = (
        np.concatenate(x) for x in zip(*found, strict=True)
    )
    # A restart jumps up within one interval after the LR had come down from a higher value
    # (a coarse-logged warm-up also jumps up, but always from its running maximum).
    jumps: list[np.ndarray] = []
    top = -np.inf  # the running maximum before the block
    for a in range(0, len(v) - 1, _KINK_BLOCK):
        b = min(len(v) - 1, a + _KINK_BLOCK)
        running = np.maximum(np.maximum.accumulate(v[a:b]), top)
        top = float(running[-1])
        up = (v[a + 1 : b + 1] - v[a:b]) > 0.2 * peak
        jumps.append(np.flatnonzero(up & (v[a:b] < 0.9 * running)) + a)
    out: list[Kink] = []
    for j in np.concatenate(jumps):
        out.append(Kink(int(t[j + 1]), "restart", float("inf")))
    # Keep the strongest point of each run of candidates (non-maximum suppression).
    taken: list[int] = []  # sorted: is one within k of a candidate? (a binary search)
    # The steps of the kinks kept so far, sorted, searched the same way (a scan of them all for
    # each candidate took 239 s for an LR restarted every 300 steps over 1M).
    kept = sorted(kk.step for kk in out)
    reach = k * interval
    for c in np.argsort(-cand_strength):
        i = int(cand[c])
        at = bisect_left(taken, i - k)
        if at < len(taken) and taken[at] <= i + k:
            continue
        step = int(t[i])
        at = bisect_left(kept, step - reach)
        if at < len(kept) and kept[at] <= step + reach:
            continue
        insort(taken, i)
        insort(kept, step)
        b, a = cand_before[c], cand_after[c]
        if b > 0 and a <= b * 0.5:
            kind = "warmup_end"
        elif a < b and b <= 0:
            kind = "drop"
        else:
            kind = "slope_change"
        out.append(Kink(int(t[i]), kind, float(cand_strength[c])))
    return sorted(out, key=lambda kk: kk.step)


_KINK_BLOCK = 1 << 16  # points of the LR read at a time by lr_kinks


# -- loss scale ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ScaleCascade:
    start_step: int
    end_step: int
    halvings: float
    from_scale: float | None
    to_scale: float | None
    overflow_steps: int
    source: str  # loss_scale | overflow
    # The step from_scale was logged at (None: not logged, as with overflow lines or the
    # scale logged only where it was reduced). Sparse logging puts it well before start_step.
    from_step: int | None = None


def logged_at_reductions(scale: Series, overflow: Series) -> bool:
    """Is the scale logged only where the scaler reduced it (DeepSpeed's "reducing to Y"
    lines): each point the scale after one halving, from twice its value? Its growth in
    between is not logged, so the point before a drop is not the scale the drop started from."""
    t, v = scale.steps, scale.values
    over_steps = overflow.steps[overflow.values > 0]
    return bool(len(t) and len(over_steps) and np.all(v > 0) and np.isin(t, over_steps).all())


def scale_cascades(scale: Series, overflow: Series, *, cascade_gap: int) -> list[ScaleCascade]:
    """Groups of loss-scale halvings with no growth in between, each within ``cascade_gap`` steps.

    From the ``loss_scale`` series when logged (from/to known; a drop between two logged
    points counts log2(from/to) halvings), else from ``overflow`` steps (one halving each).
    A scale series logged only at overflow steps (DeepSpeed's "reducing to" lines) counts one
    halving per logged point. ``scale`` and ``overflow`` are the finite series (may be empty).
    """
    t, v = scale.steps, scale.values
    over_steps = overflow.steps[overflow.values > 0]
    out: list[ScaleCascade] = []
    if logged_at_reductions(scale, overflow):
        # DeepSpeed logs the scale only when it reduces it ("reducing to Y"): each logged point
        # is one halving, from 2Y to Y; a cascade is a chain where each point halves the last.
        cuts = (np.diff(t) > cascade_gap) | ~np.isclose(v[1:], v[:-1] / 2)
        for g in np.split(np.arange(len(t)), np.flatnonzero(cuts) + 1):
            s0, s1 = int(t[g[0]]), int(t[g[-1]])
            n_over = int(np.sum((over_steps >= s0) & (over_steps <= s1)))
            out.append(
                ScaleCascade(
                    s0,
                    s1,
                    float(len(g)),
                    2.0 * float(v[g[0]]),
                    float(v[g[-1]]),
                    n_over,
                    "loss_scale",
                )
            )
        return out
    if len(t) >= 2 and not np.all(v > 0) and np.count_nonzero(v > 0) >= 2:
        # A scale halved until it underflowed to 0 (the nan sample: 16,384 at step 632, 0
        # from step 801): the halvings are counted on its positive points, where log2 of a
        # ratio is defined (a scale of 0 or below halves nothing more). All of them were
        # left out before, and with them the whole collapse.
        pos = v > 0
        t, v = t[pos], v[pos]
    if len(t) >= 2 and np.all(v > 0):
        drops = np.flatnonzero(v[1:] < v[:-1]) + 1
        # grown[i]: how many times the scale grew up to point i (growth between a and b
        # means grown[b] > grown[a]).
        grown = np.concatenate([[0], np.cumsum(v[1:] > v[:-1])])
        group: list[int] = []

        def flush() -> None:
            if not group:
                return
            i0, i1 = group[0], group[-1]
            s0, s1 = int(t[i0 - 1]) if i0 > 0 else int(t[i0]), int(t[i1])
            n_over = int(np.sum((over_steps >= s0) & (over_steps <= s1)))
            out.append(
                ScaleCascade(
                    int(t[i0]),
                    s1,
                    math.log2(v[i0 - 1] / v[i1]),
                    float(v[i0 - 1]),
                    float(v[i1]),
                    n_over,
                    "loss_scale",
                    int(t[i0 - 1]),
                )
            )

        for i in drops:
            if group and (int(t[i] - t[group[-1]]) > cascade_gap or grown[i] > grown[group[-1]]):
                flush()
                group = []
            group.append(int(i))
        flush()
        return out
    if len(over_steps):
        groups = np.split(over_steps, np.flatnonzero(np.diff(over_steps) > cascade_gap) + 1)
        for g in groups:
            out.append(
                ScaleCascade(int(g[0]), int(g[-1]), float(len(g)), None, None, len(g), "overflow")
            )
    return out


def drop_windows(scale: Series, overflow: Series) -> np.ndarray:
    """Where the loss scale fell, as step windows ``(lo, hi]`` (shape (n, 2)).

    A drop seen between two logged points happened somewhere after the first and at or before
    the second; an overflow line names its step exactly.
    """
    t, v = scale.steps, scale.values
    exact = overflow.steps[overflow.values > 0]
    parts = [np.column_stack([exact - 1, exact])]
    if len(t) >= 2:
        fell = np.flatnonzero(v[1:] < v[:-1]) + 1
        parts.append(np.column_stack([t[fell - 1], t[fell]]))
    return np.concatenate(parts).astype(float)


def overlaps(windows: np.ndarray, lo: float, hi: float) -> bool:
    """Does any ``(a, b]`` window intersect ``(lo, hi]``?"""
    if len(windows) == 0:
        return False
    return bool(np.any((windows[:, 0] < hi) & (windows[:, 1] > lo)))


class Overlaps:
    """:func:`overlaps` for many queries of the same windows (a test per spike): the windows
    sorted by start with the largest end so far, so a query is a binary search (some window
    starts before ``hi``, and the furthest-reaching of those ends after ``lo``). The same
    float64 comparisons; windows with a NaN are asked through :func:`overlaps` itself."""

    def __init__(self, windows: np.ndarray) -> None:
        self.windows = windows
        self.plain = len(windows) == 0 or not np.isfinite(windows).all()
        if self.plain:
            return
        order = np.argsort(windows[:, 0], kind="stable")
        self.starts: list[float] = windows[order, 0].tolist()
        self.reach: list[float] = np.maximum.accumulate(windows[order, 1]).tolist()

    def __call__(self, lo: float, hi: float) -> bool:
        if self.plain:
            return overlaps(self.windows, lo, hi)
        j = bisect_left(self.starts, float(hi))  # the windows starting before hi
        return j > 0 and self.reach[j - 1] > float(lo)


def epoch_boundaries(epoch: Series) -> list[int]:
    """Steps at which a new epoch began, from the (finite) ``epoch`` series."""
    t, e = epoch.steps, epoch.values
    if len(t) < 2:
        return []
    whole = np.floor(e + 1e-6)
    return [int(x) for x in t[1:][whole[1:] > whole[:-1]]]


def epoch_at(epoch: Series, step: int) -> int | None:
    """1-based epoch running at a step, from the run's (finite) epoch series (None without
    one). Two conventions: the HF Trainer logs the epochs done so far (7.63 is in the 8th;
    3.0, where an eval at each epoch's end is logged, is the end of the 3rd), Lightning the
    0-based index of the epoch running (2 is the 3rd). A series with fractions is the first
    kind."""
    if epoch.empty:
        return None
    v = epoch.values
    e = float(np.interp(step, epoch.steps, v))
    if bool(np.any(np.abs(v - np.round(v)) > 1e-6)):  # epochs done: the one running is the ceiling
        return max(1, int(np.ceil(e - 1e-9)))
    return int(np.floor(e + 1e-9)) + 1


# -- periods the log reveals ------------------------------------------------------------------
@dataclass(frozen=True)
class Period:
    """A period (in steps) the log itself shows, and where its grid starts."""

    steps: float
    origin: float  # the first epoch start, the first eval, the first LR restart; 0 for saves


def revealed_periods(ev: Evidence) -> dict[str, Period]:
    """Periods the log itself shows: epoch length, eval interval, checkpoint interval (as the
    run's config states it, :attr:`Evidence.checkpoints`), LR-restart interval. Only those the
    run reveals are returned."""
    out: dict[str, Period] = {}
    epoch = ev.series(EPOCH)
    t, e = epoch.steps, epoch.values
    if len(t) >= 2:
        de, dt = np.diff(e), np.diff(t)
        ok = de > 0
        if ok.any():
            length = float(np.median(dt[ok] / de[ok]))
            # An epoch length the log has actually lived through.
            if length > 0 and (e[-1] - e[0]) >= 1.0:
                starts = ev.epoch_boundaries
                out["epoch"] = Period(length, float(starts[0]) if starts else 0.0)
    evals = [m for m in ev.run.metrics() if m == VAL_LOSS or m.startswith(EVAL_PREFIX)]
    for m in evals:
        et = ev.series(m).steps
        if len(et) >= 3:
            out["eval_interval"] = Period(median_interval(et), float(et[0]))
            break
    every = ev.checkpoints.interval
    if every is not None and every > 1:
        out["checkpoint_interval"] = Period(float(every), 0.0)  # saved at multiples of it
    restarts = [k.step for k in ev.lr_kinks if k.kind == "restart"]
    if len(restarts) >= 2:
        out["lr_restart"] = Period(float(np.median(np.diff(restarts))), float(restarts[0]))
    return out
