"""The LR schedule as the log shows it: warm-up, constant, decay, cooldown, and the changes no
schedule explains.

``lr_schedule(lr, warmup_end)`` cuts the logged learning rate into consecutive segments of
logged points (``Evidence.schedule`` builds it once per run, with ``Evidence.warmup_end``):

- ``warmup``: the rise from the first point to the warm-up end (or a rise back to at most the
  schedule's peak after a restart);
- ``constant``: a level within a few percent;
- ``decay``: a fall, with its ``shape`` (``cosine``, ``linear``, ``exponential``, ``step`` for
  a staircase of drops, ``smooth`` for any other smooth fall);
- ``cooldown``: the late fast decay after a long constant phase (WSD: warm-up, stable, decay);
- ``unexplained``: an LR no smooth schedule gives, for as long as it lasts: a jump up or down
  that comes back (x50 for ten steps), an LR raised past the schedule's peak (by a jump or a
  climb) and the stretch where it stays above that peak.

How: a jump is one logged interval where the LR changes by ``jump_ratio`` or more and by far
more (``jump_k`` x) than the neighbouring intervals do; a smooth schedule moves a little at
every step. Between jumps the LR is simplified to a polyline in log space (Ramer-Douglas-Peucker,
``tolerance`` in log units, so 5% by default whatever the LR's magnitude) and the polyline's
edges are read as rising, flat or falling. The jumps themselves are listed as
:class:`Change` (``restart``, ``step_drop``, ``jump_up``, ``jump_down``).

A rise from the first logged point is a warm-up even when it ends too late in the log to be
``Evidence.warmup_end`` (which the baselines start from, and which comes in the first quarter
of the log): a log that is mostly warm-up still shows a warm-up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from forensics.evidence.order_stats import median_value
from forensics.evidence.robust import resolution

if TYPE_CHECKING:
    from forensics.evidence import Series

KINDS = ("warmup", "constant", "decay", "cooldown", "unexplained")


@dataclass(frozen=True)
class Segment:
    """Consecutive logged points of one schedule phase."""

    kind: str  # one of KINDS
    start_step: int
    end_step: int
    lr_start: float
    lr_end: float
    shape: str | None = None  # decay/cooldown: cosine | linear | exponential | step | smooth
    lr_before: float | None = None  # LR at the logged point before the segment

    def covers(self, step: float) -> bool:
        return self.start_step <= step <= self.end_step

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "start_step": self.start_step,
            "end_step": self.end_step,
            "lr_start": self.lr_start,
            "lr_end": self.lr_end,
            "shape": self.shape,
            "lr_before": self.lr_before,
        }


@dataclass(frozen=True)
class Change:
    """An abrupt LR change between two logged points (``step`` is the first point after it)."""

    step: int
    kind: str  # restart | step_drop | jump_up | jump_down (the last two: unexplained)
    lr_before: float
    lr_after: float

    @property
    def factor(self) -> float:
        return self.lr_after / self.lr_before if self.lr_before else float("inf")


@dataclass(frozen=True)
class Schedule:
    """The LR schedule's segments, in step order, covering every logged LR point."""

    segments: tuple[Segment, ...]
    changes: tuple[Change, ...]
    steps: np.ndarray
    values: np.ndarray
    warmup_end: int | None = None
    peak: float | None = None  # the highest LR of the explained segments

    @property
    def empty(self) -> bool:
        return not self.segments

    @property
    def unexplained(self) -> list[Segment]:
        """The stretches no smooth schedule explains."""
        return [s for s in self.segments if s.kind == "unexplained"]

    @property
    def rewarms(self) -> list[Segment]:
        """The warm-ups after the first one: the LR climbing back to its peak after a
        restart or a drop."""
        return [seg for seg in self.segments if seg.kind == "warmup"][1:]

    def segment_at(self, step: float) -> Segment | None:
        """The segment holding ``step``; between two segments' logged points, the later one
        (the LR changed somewhere in between); None outside the log."""
        if not self.segments or step < self.segments[0].start_step:
            return None
        if step > self.segments[-1].end_step:
            return None
        for seg in self.segments:
            if step <= seg.end_step:
                return seg
        return None

    def phase_at(self, step: float) -> str | None:
        """The kind of segment at ``step`` (``warmup``, ``decay``...), None outside the log."""
        seg = self.segment_at(step)
        return seg.kind if seg is not None else None

    def lr_at(self, step: float) -> float | None:
        """The logged LR at ``step``, linearly interpolated (held beyond the ends); None when
        no LR was logged."""
        if len(self.steps) == 0:
            return None
        from forensics.evidence.trend_utils import interp

        return float(interp(step, self.steps, self.values))

    def phases_between(self, a: float, b: float) -> list[str]:
        """The kinds of the segments overlapping ``[a, b]``, in order, without repeats."""
        out: list[str] = []
        for seg in self.segments:
            if seg.end_step >= a and seg.start_step <= b and (not out or out[-1] != seg.kind):
                out.append(seg.kind)
        return out

    def summary(self) -> list[dict[str, Any]]:
        return [s.as_dict() for s in self.segments]


def lr_schedule(
    lr: Series,
    warmup_end: int | None = None,
    *,
    jump_ratio: float = 1.25,
    jump_k: float = 10.0,
    tolerance: float = 0.05,
    flat: float = 0.05,
    peak_margin: float = 1.1,
) -> Schedule:
    """Cut a logged LR series (finite, sorted) into schedule segments; see the module text.

    Args:
        lr: the LR series (``Evidence.series(LR)``).
        warmup_end: the warm-up end (``Evidence.warmup_end``); the points up to it are the
            warm-up segment.
        jump_ratio: the least factor between two logged points that can be a jump.
        jump_k: a jump also moves ``jump_k`` x more than the median of its neighbours.
        tolerance: the polyline's tolerance, in log units.
        flat: a polyline edge changing less than this (log units) is flat.
        peak_margin: an LR above ``peak_margin`` x the explained peak is not the schedule's.
    """
    x = np.asarray(lr.steps, dtype=np.int64)
    v = np.asarray(lr.values, dtype=float)
    n = len(x)
    if n == 0:
        return Schedule((), (), x, v, warmup_end, None)
    pos = v[v > 0]  # (this call's own copy: partitioned in place, the same median)
    floor = 1e-3 * median_value(pos) if len(pos) else 1.0
    del pos

    w = -1  # last index of the warm-up
    if warmup_end is not None:
        w = int(np.searchsorted(x, warmup_end, side="right")) - 1
    jumps = _jumps(v, jump_ratio, jump_k)
    jumps = [i for i in jumps if i >= max(w, 0)]
    # (made after the jumps are found: the two are not held at once)
    y = np.maximum(v, floor)
    np.log(y, out=y)  # log(max(v, floor))

    # Pieces: (first index, last index, kind, shape) before the jumps are read.
    pieces: list[list[Any]] = []
    if w >= 0:
        pieces.append([0, w, "warmup", None])
    bounds = [w + 1] + [i + 1 for i in jumps] + [n]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        if b > a:
            pieces.extend(_smooth_pieces(x, y, a, b - 1, tolerance, flat))

    peak = float(np.max(v[: w + 1])) if w >= 0 else None
    changes: list[Change] = []
    span = float(x[-1] - x[0]) or 1.0
    # Walk the pieces in order, reading each jump at the start of a piece.
    jump_at = {i + 1: i for i in jumps}
    raised = False  # inside an unexplained stretch (LR above the explained peak)
    handled: set[int] = set()  # the jumps back of excursions
    seen_unexplained = False  # the explained peak is read before the first unexplained change
    i = 0
    while i < len(pieces):
        a, b, kind, shape = pieces[i]
        if a in jump_at and a not in handled:
            j = jump_at[a]
            up = v[a] > v[j]
            ret = _return_of(pieces, i, v, jump_at, x, span)
            if ret is not None:
                # an excursion: the LR jumps and comes back, no schedule does that
                changes.append(Change(int(x[a]), "jump_up" if up else "jump_down", v[j], v[a]))
                last = pieces[ret - 1][1]
                pieces[i:ret] = [[a, last, "unexplained", "excursion"]]
                r = pieces[i + 1][0]
                handled.add(r)
                changes.append(Change(int(x[r]), "jump_down" if up else "jump_up", v[r - 1], v[r]))
                i += 1
                raised = False
                continue
            if up:
                ref = peak if peak is not None else float(np.max(v[:a]))
                if v[a] <= peak_margin * ref and v[j] < 0.9 * ref and not raised:
                    changes.append(Change(int(x[a]), "restart", v[j], v[a]))
                else:
                    changes.append(Change(int(x[a]), "jump_up", v[j], v[a]))
                    raised = True
            else:
                changes.append(Change(int(x[a]), "step_drop", v[j], v[a]))
                if kind == "constant" and not raised:
                    pieces[i][2], pieces[i][3] = "decay", "step"
        if kind == "warmup" and peak is None:
            peak = float(np.max(v[a : b + 1]))
        ref = peak if peak is not None else float(v[a])
        if kind == "rising":
            if a == 0 or (i == 1 and _held_low_from_start(pieces[0], v, a, jump_at)):
                pieces[i][2] = "warmup"
                pieces[0][2] = "warmup"  # (the LR held at 0 before the ramp: one warm-up)
            elif v[b] <= peak_margin * ref and not raised:
                pieces[i][2] = "warmup"
            else:
                pieces[i][2] = "unexplained"
                pieces[i][3] = "rise"
                raised = True
        elif raised:
            # still above the schedule's peak: unexplained until the LR is back under it
            above = np.flatnonzero(v[a : b + 1] <= peak_margin * ref)
            if len(above) == 0:
                pieces[i][2], pieces[i][3] = "unexplained", "raised"
            else:
                raised = False
                cut = a + int(above[0])
                if cut > a:
                    pieces[i : i + 1] = [
                        [a, cut - 1, "unexplained", "raised"],
                        [cut, b, pieces[i][2], pieces[i][3]],
                    ]
                    i += 1
        if pieces[i][2] == "unexplained":
            seen_unexplained = True
        elif not raised and not seen_unexplained:
            top = float(np.max(v[pieces[i][0] : pieces[i][1] + 1]))
            peak = top if peak is None else max(peak, top)
        i += 1

    pieces = _merge(pieces)
    _cooldown(pieces, x)
    _shapes(pieces, x, v)
    segments = tuple(
        Segment(
            kind=str(k),
            start_step=int(x[a]),
            end_step=int(x[b]),
            lr_start=float(v[a]),
            lr_end=float(v[b]),
            shape=s,
            lr_before=float(v[a - 1]) if a > 0 else None,
        )
        for a, b, k, s in pieces
    )
    return Schedule(segments, tuple(changes), x, v, warmup_end, peak)


def _held_low_from_start(first: list[Any], v: np.ndarray, a: int, jump_at: dict) -> bool:
    """Whether the log's first piece holds the LR flat at no more than where the rise from
    index ``a`` starts (a warm-up from 0: 0 and 3e-7 are both under the log floor, a flat
    piece before the ramp), with no jump between: the rise is then the warm-up."""
    return (
        first[0] == 0
        and first[2] == "constant"
        and a not in jump_at
        and float(np.max(v[: first[1] + 1])) <= float(v[a])
    )


def _distinct_at_least(v: np.ndarray, k: int) -> bool:
    """``len(np.unique(v)) >= k``, from the first points when they already hold k values (a
    part has no more distinct values than the whole): no sort of a million LRs."""
    return len(np.unique(v[:4096])) >= k or len(np.unique(v)) >= k


# Points per piece where a whole-series computation is made a piece at a time (its
# temporaries a few MiB instead of several whole-length arrays).
_CHUNK = 1 << 18
_JUMP_WINDOW = 11  # the local median a jump is compared with


def _jumps(v: np.ndarray, jump_ratio: float, jump_k: float) -> list[int]:
    """Intervals ``i`` (between points i and i+1) where the LR jumps.

    Made a piece of intervals at a time: every test reads the interval's two points, the
    series' resolution (computed once) and the median of the intervals' changes within 5 of
    it, which a piece extended by the window each side (cut only at the ends) gives as the
    whole series does."""
    if len(v) < 2:
        return []
    from forensics.evidence.rolling import centered_median, pieces

    # An LR printed with few decimals moves by one last digit at a time near zero: a change
    # of one printed unit is the printing, not a jump (only for LRs with many distinct values;
    # a step schedule has a handful).
    res = 1.5 * resolution(v) if _distinct_at_least(v, 20) else None
    m = len(v) - 1  # intervals
    out: list[int] = []
    for lo, hi, a, b in pieces(m, _CHUNK, _JUMP_WINDOW, _JUMP_WINDOW):
        d = np.diff(v[a : b + 1])  # intervals a..b-1
        np.abs(d, out=d)
        local = centered_median(d, _JUMP_WINDOW)[lo - a : hi - a]
        d = d[lo - a : hi - a]
        av = np.abs(v[lo : hi + 1])
        up = np.maximum(av[:-1], av[1:])
        low = np.minimum(av[:-1], av[1:])
        del av
        np.multiply(jump_ratio, low, out=low)
        big = up >= low  # up >= jump_ratio * low
        big &= up > 0
        del up, low
        if res is not None:
            big &= d > res
        np.multiply(jump_k, local, out=local)
        big &= d > local  # d > jump_k * local
        out.extend(int(i) for i in lo + np.flatnonzero(big))
    return out


def _smooth_pieces(
    x: np.ndarray, y: np.ndarray, a: int, b: int, tolerance: float, flat: float
) -> list[list[Any]]:
    """Rising / flat / falling pieces of the smooth stretch ``a..b`` (indices, inclusive)."""
    if b == a:
        return [[a, b, "constant", None]]
    keep = _rdp(x[a : b + 1], y[a : b + 1], tolerance)
    idx = [a + k for k in keep]
    out: list[list[Any]] = []
    for p, q in zip(idx[:-1], idx[1:], strict=True):
        dy = y[q] - y[p]
        kind = "constant" if abs(dy) <= flat else ("rising" if dy > 0 else "decay")
        if out and out[-1][2] == kind:
            out[-1][1] = q
        else:
            out.append([p if not out else p + 1, q, kind, None])
    # A short flat edge inside a fall or a rise is the polyline's, not the schedule's.
    span = float(x[b] - x[a]) or 1.0
    merged: list[list[Any]] = []
    for piece in out:
        short = (x[piece[1]] - x[piece[0]]) < 0.05 * span
        if merged and piece[2] == "constant" and short and merged[-1][2] != "constant":
            merged[-1][1] = piece[1]
        elif merged and merged[-1][2] == piece[2]:
            merged[-1][1] = piece[1]
        else:
            merged.append(piece)
    return merged


def _rdp(x: np.ndarray, y: np.ndarray, tolerance: float) -> list[int]:
    """Indices kept by Ramer-Douglas-Peucker with vertical distances (first and last always).

    ``x`` as logged (integers): taken as floats a piece at a time, the farthest point of a
    stretch found piece by piece (the first of equal distances, as one ``argmax``)."""
    n = len(x)
    keep = np.zeros(n, dtype=bool)
    keep[0] = keep[-1] = True
    stack = [(0, n - 1)]
    while stack:  # one iteration per kept point: a few dozen at most for a schedule
        i, j = stack.pop()
        if j - i < 2:
            continue
        xi, xj = np.float64(x[i]), np.float64(x[j])
        best, k = -np.inf, -1
        for lo in range(i + 1, j, _CHUNK):
            hi = min(j, lo + _CHUNK)
            xs = x[lo:hi].astype(float)
            chord = y[i] + (y[j] - y[i]) * (xs - xi) / (xj - xi)
            dev = np.abs(y[lo:hi] - chord)
            c = int(np.argmax(dev))
            if k < 0 or dev[c] > best:
                best, k = dev[c], lo - (i + 1) + c
        if best > tolerance:
            m = i + 1 + k
            keep[m] = True
            stack.append((i, m))
            stack.append((m, j))
    return [int(i) for i in np.flatnonzero(keep)]


def _return_of(
    pieces: list[list[Any]],
    i: int,
    v: np.ndarray,
    jump_at: dict[int, int],
    x: np.ndarray,
    span: float,
) -> int | None:
    """Index of the piece where the LR jumps back after the jump that opens piece ``i`` (an
    excursion: back to within a factor 1.5 of the LR before, within a quarter of the log)."""
    a = pieces[i][0]
    before = v[jump_at[a]]
    for k in range(i + 1, len(pieces)):
        r = pieces[k][0]
        if r not in jump_at:
            continue
        if x[r - 1] - x[a] > 0.25 * span:
            return None
        back = v[r]
        if before > 0 and back > 0 and 1 / 1.5 <= back / before <= 1.5:
            return k
        return None
    return None


def _merge(pieces: list[list[Any]]) -> list[list[Any]]:
    """Join neighbours of one kind (a staircase of drops is one step decay)."""
    out: list[list[Any]] = []
    for p in pieces:
        if out and out[-1][2] == p[2] and out[-1][3] == p[3] and p[2] != "unexplained":
            out[-1][1] = p[1]
        elif out and out[-1][2] == p[2] == "unexplained" and p[3] == "raised":
            out[-1][1] = p[1]  # a rise (or jump) and the stretch it stays above the peak
        elif out and out[-1][3] == "step" and p[2] == "constant":
            out[-1][1] = p[1]  # the level after a drop belongs to the staircase
        else:
            out.append(list(p))
    return out


def _cooldown(pieces: list[list[Any]], x: np.ndarray) -> None:
    """A decay after a constant phase at least 1.5x as long, starting in the second half of
    the log, is a cooldown (WSD's late fast decay)."""
    half = x[0] + 0.5 * (x[-1] - x[0])
    for k in range(1, len(pieces)):
        a, b, kind, shape = pieces[k]
        pa, pb, pkind, _ = pieces[k - 1]
        if kind != "decay" or shape == "step" or pkind != "constant" or x[a] < half:
            continue
        if x[pb] - x[pa] >= 1.5 * (x[b] - x[a]):
            pieces[k][2] = "cooldown"


def _shapes(pieces: list[list[Any]], x: np.ndarray, v: np.ndarray) -> None:
    """Fill in the shape of each decay. Decays split by an excursion are one fall: their shape
    is fitted over both, without the excursion's points."""
    k = 0
    while k < len(pieces):
        if pieces[k][2] not in ("decay", "cooldown") or pieces[k][3] is not None:
            k += 1
            continue
        group = [k]
        while (
            group[-1] + 2 < len(pieces)
            and pieces[group[-1] + 1][3] == "excursion"
            and pieces[group[-1] + 2][2] == pieces[k][2]
            and pieces[group[-1] + 2][3] is None
        ):
            group.append(group[-1] + 2)
        a = pieces[group[0]][0]
        if len(group) == 1:  # one stretch of points: views, no gather
            lo, hi = max(a - 1, 0), pieces[k][1] + 1
            shape = _decay_shape(x[lo:hi], v[lo:hi])
        else:
            idx = np.concatenate(
                [np.arange(pieces[g][0], pieces[g][1] + 1) for g in group]
                if a == 0
                else [[a - 1]] + [np.arange(pieces[g][0], pieces[g][1] + 1) for g in group]
            ).astype(int)
            shape = _decay_shape(x[idx], v[idx])
            del idx
        for g in group:
            pieces[g][3] = shape
        k = group[-1] + 1


def _decay_shape(xs: np.ndarray, vs: np.ndarray) -> str:
    """``cosine``, ``linear`` or ``exponential`` when one fits the fall within 3% of its
    height, else ``smooth``. The fall runs from the point before the piece when there is one
    (a decay starts where the level it leaves ends).

    The fits are made and scored one at a time, in place (a million-point decay held eleven
    whole-length arrays at once); the same operations in the same order as
    ``sqrt(mean((u - fit) ** 2))`` of each fit."""
    if len(xs) < 4 or vs[0] <= vs[-1]:
        return "smooth"
    t0, t1 = np.float64(xs[0]), np.float64(xs[-1])
    if t1 == t0:
        return "smooth"
    n = len(xs)
    f = np.empty(n)  # the squared errors of one fit; the mean over the whole (same summation)

    def score(fit: Callable[[np.ndarray], np.ndarray]) -> float:
        for lo in range(0, n, _CHUNK):  # t, u and the fit a piece at a time
            hi = min(n, lo + _CHUNK)
            t = xs[lo:hi].astype(float)
            t -= t0
            t /= t1 - t0  # (xs - xs[0]) / (xs[-1] - xs[0])
            u = vs[lo:hi] - vs[-1]
            u /= vs[0] - vs[-1]  # (vs - vs[-1]) / (vs[0] - vs[-1])
            out = f[lo:hi]
            np.subtract(u, fit(t), out=out)
            np.square(out, out=out)
        return float(np.sqrt(np.mean(f)))

    def cosine(t: np.ndarray) -> np.ndarray:
        np.multiply(np.pi, t, out=t)
        np.cos(t, out=t)
        np.add(1.0, t, out=t)
        np.multiply(0.5, t, out=t)  # 0.5 * (1.0 + cos(pi * t))
        return t

    def exponential(t: np.ndarray) -> np.ndarray:
        np.multiply(t, np.log(vs[-1]) - np.log(vs[0]), out=t)
        np.add(np.log(vs[0]), t, out=t)
        np.exp(t, out=t)
        t -= vs[-1]
        t /= vs[0] - vs[-1]  # (e - vs[-1]) / (vs[0] - vs[-1])
        return t

    err: dict[str, float] = {}
    err["linear"] = score(lambda t: np.subtract(1.0, t, out=t))
    err["cosine"] = score(cosine)
    if vs[-1] > 0:
        err["exponential"] = score(exponential)
    best = min(err, key=lambda k: err[k])
    return best if err[best] <= 0.03 else "smooth"
