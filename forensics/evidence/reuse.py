"""Work a watcher reuses between polls: spike trend fits and the prefixes of local filters.

``forensics watch`` re-analyses the whole run on each poll. Most spikes lie before the new
data, and the costly part of measuring one (:func:`~forensics.evidence.spike_shape.fit_trend`,
two Theil-Sen fits over up to a few hundred points) reads only the points before its onset.
A :class:`TrendMemo` remembers each fit under its exact inputs (the points' bytes, the onset,
the fallbacks, the parameters): a later poll whose spike has the very same inputs gets the very
same :class:`~forensics.evidence.spike_shape.Trend`, and any change (a moved onset, another
sigma, a rewritten point) is a miss that fits again. Nothing is inferred about causality, so
no finding can differ from an analysis without the memo (``tests/test_watch_reuse.py``).

Local filters (rolling medians, the robust score's noise scale) are reused the other way: a
filter whose output at point i reads only the points within ``reach`` of i gives, on a series
that *begins with* the first L points of the series it was computed on last poll (checked
byte for byte), the same output at every point more than ``reach`` before L. Only the tail is
computed again, on the points it reads, and spliced after the kept prefix
(:func:`local_reusing`). Series with
a non-finite value are always computed whole (a NaN could make a sliding median depend on
more than its window).

The sorted distinct values of a series (the robust score's printing resolution) grow the same
way: on a series that begins with the last poll's whole input (checked byte for byte), the
distinct values of the appended points are merged into the last answer
(:func:`distinct_reusing`).

The memo is active only inside :meth:`TrendMemo.active` (the watcher wraps its
``analyze_run`` in it); ``analyze`` never uses one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from forensics.evidence.spike_shape import ShapeParams, Trend

_Key = tuple[str, bytes, str, bytes, int, bytes, "ShapeParams"]
# (filter name, its parameters, the input's dtype, its first points' bytes)
_LocalKey = tuple[str, tuple[object, ...], str, bytes]
_HEAD = 16  # points of the input that index the memo (the full prefix is compared on a hit)
_SeriesId = tuple[str, str, bytes, bytes]  # the dtypes and first points of steps and values

_ACTIVE: ContextVar[TrendMemo | None] = ContextVar("forensics_trend_memo", default=None)


class TrendMemo:
    """Trend fits by their exact inputs. Kept across polls; after each poll only the fits that
    poll used are kept (a spike that vanished or moved does not pile up)."""

    def __init__(self) -> None:
        self._fits: dict[_Key, Trend] = {}
        self._used: dict[_Key, Trend] = {}
        self.hits = 0
        self.misses = 0
        # Local filters: the inputs and outputs of the last poll (and of this one so far).
        self._local: dict[_LocalKey, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._local_used: dict[_LocalKey, list[tuple[np.ndarray, np.ndarray]]] = {}
        self.local_hits = 0  # filters computed on their tail only
        self.local_misses = 0  # filters computed whole
        # Spike measures: per series (its arrays as last measured), the results by inputs.
        self._measured: dict[_SeriesId, _Measured] = {}
        self._measured_used: dict[_SeriesId, _Measured] = {}
        self._grown: dict[tuple[int, int], tuple[object, ...]] = {}
        self.measure_hits = 0
        self.measure_misses = 0
        # Distinct values: the last poll's inputs and their sorted distinct values.
        self._distinct: dict[_LocalKey, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._distinct_used: dict[_LocalKey, list[tuple[np.ndarray, np.ndarray]]] = {}
        self.distinct_hits = 0  # the distinct values of an appended tail merged in
        self.distinct_misses = 0  # computed whole

    def __len__(self) -> int:
        return len(self._fits)

    @contextmanager
    def active(self) -> Iterator[TrendMemo]:
        """Use this memo for the fits made inside the block (one analysis)."""
        self._used, self._local_used, self._measured_used, self._grown = {}, {}, {}, {}
        self._distinct_used = {}
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)
            self._fits, self._used = self._used, {}
            self._local, self._local_used = self._local_used, {}
            self._measured, self._measured_used, self._grown = self._measured_used, {}, {}
            self._distinct, self._distinct_used = self._distinct_used, {}

    def measure(self, steps: np.ndarray, values: np.ndarray, **kw: Any) -> dict[str, Any]:
        """:func:`~forensics.evidence.spike_shape.measure` of one spike, reused from the last
        poll when provably the same (see :func:`measure_reusing`)."""
        from forensics.evidence.spike_shape import measure

        sid, old = self._series_of(steps, values)
        key = _measure_key(kw)
        got = old.results.get(key) if old is not None else None
        if got is not None and old is not None and _settled(got, old.steps, steps, kw):
            self.measure_hits += 1
            result = dict(got)
            # The one measure that reads the end of the log.
            result["steps_logged_after_peak"] = int(steps[-1] - steps[kw["peak"]])
        else:
            self.measure_misses += 1
            result = measure(steps, values, **kw)
        used = self._measured_used.get(sid)
        if used is None:
            used = _Measured(steps.copy(), {}, values.copy(), (id(steps), id(values)))
            self._measured_used[sid] = used
        if used.mark == (id(steps), id(values)):
            used.results[key] = result
        else:  # two series begin alike: neither is kept for the next poll
            used.results, used.mark = {}, None
        return result

    def _series_of(
        self, steps: np.ndarray, values: np.ndarray
    ) -> tuple[_SeriesId, _Measured | None]:
        """The series' identity and what the last poll measured on a prefix of it (checked
        once per poll and pair of arrays: every spike of a series shares them)."""
        mark = (id(steps), id(values))
        if mark in self._grown:
            return self._grown[mark][:2]  # type: ignore[return-value]
        sid: _SeriesId = (
            steps.dtype.str,
            values.dtype.str,
            steps[:_HEAD].tobytes(),
            values[:_HEAD].tobytes(),
        )
        old = self._measured.get(sid)
        if old is not None:
            m = len(old.steps)
            if not (
                m <= len(steps)
                and _common_prefix(old.steps, steps) == m
                and _common_prefix(old.values, values) == m
            ):
                old = None
        # The arrays are kept with their ids: no other array takes their id during the poll.
        self._grown[mark] = (sid, old, steps, values)
        return sid, old

    def local(
        self,
        name: str,
        params: tuple[object, ...],
        reach: int,
        values: np.ndarray,
        compute: Callable[[np.ndarray], np.ndarray],
    ) -> np.ndarray:
        """``compute(values)``, computed on the tail only when a previous input shares a
        long enough prefix with ``values`` (see :func:`local_reusing`)."""
        values = np.ascontiguousarray(values)
        n, reach = len(values), int(reach)
        finite = values.dtype.kind != "f" or bool(np.isfinite(values).all())
        key: _LocalKey = (name, params, values.dtype.str, values[:_HEAD].tobytes())
        out: np.ndarray | None = None
        if finite and n > _HEAD:
            out = self._extend(key, reach, values, compute)
        if out is None:
            self.local_misses += 1
            out = compute(values)
        if finite and n > _HEAD:
            # Copies: the caller may change its arrays after the call.
            self._local_used.setdefault(key, []).append((values.copy(), np.array(out)))
        return out

    def _extend(
        self,
        key: _LocalKey,
        reach: int,
        values: np.ndarray,
        compute: Callable[[np.ndarray], np.ndarray],
    ) -> np.ndarray | None:
        n = len(values)
        best: tuple[int, np.ndarray, np.ndarray] | None = None
        for old, out in [*self._local.get(key, []), *self._local_used.get(key, [])]:
            same = _common_prefix(old, values)
            if len(out) == len(old) and (best is None or same > best[0]):
                best = (same, old, out)
        if best is None:
            return None
        same, old, out = best
        if same == len(old) == n:
            self.local_hits += 1
            return out.copy()
        keep = same - reach  # outputs before here read only points both inputs share
        start = keep - reach  # the tail's outputs read points from here on
        if start < 0:
            return None
        self.local_hits += 1
        tail = compute(values[start:])
        return np.concatenate([out[:keep], tail[keep - start :]])

    def distinct(self, values: np.ndarray) -> np.ndarray:
        """The sorted distinct values of finite ``values`` (see :func:`distinct_reusing`)."""
        values = np.ascontiguousarray(values)
        n = len(values)
        key: _LocalKey = ("distinct", (), values.dtype.str, values[:_HEAD].tobytes())
        out: np.ndarray | None = None
        if n > _HEAD:
            best: tuple[np.ndarray, np.ndarray] | None = None
            for old, got in [*self._distinct.get(key, []), *self._distinct_used.get(key, [])]:
                m = len(old)
                longer = best is None or m > len(best[0])
                if m <= n and longer and _common_prefix(old, values) == m:
                    best = (old, got)
            if best is not None:
                self.distinct_hits += 1
                out = _merge_distinct(best[1], np.unique(values[len(best[0]) :]))
        if out is None:
            self.distinct_misses += 1
            out = np.unique(values)
        if n > _HEAD:
            self._distinct_used.setdefault(key, []).append((values.copy(), out))
        return out

    def fit(
        self,
        steps: np.ndarray,
        y: np.ndarray,
        onset: int,
        fallback_level: float,
        fallback_sigma: float,
        p: ShapeParams,
    ) -> Trend:
        from forensics.evidence.spike_shape import fit_trend

        key: _Key = (
            steps.dtype.str,
            np.ascontiguousarray(steps).tobytes(),
            y.dtype.str,
            np.ascontiguousarray(y).tobytes(),
            int(onset),
            # bytes, not floats: a NaN fallback equals itself here.
            np.array([fallback_level, fallback_sigma], dtype=np.float64).tobytes(),
            p,
        )
        trend = self._fits.get(key)
        if trend is None:
            trend = self._used.get(key)
        if trend is None:
            self.misses += 1
            trend = fit_trend(steps, y, onset, fallback_level, fallback_sigma, p)
        else:
            self.hits += 1
        self._used[key] = trend
        return trend


def fit_trend_reusing(
    steps: np.ndarray,
    y: np.ndarray,
    onset: int,
    fallback_level: float,
    fallback_sigma: float,
    p: ShapeParams,
) -> Trend:
    """:func:`~forensics.evidence.spike_shape.fit_trend`, through the active memo if any."""
    memo = _ACTIVE.get()
    if memo is None:
        from forensics.evidence.spike_shape import fit_trend

        return fit_trend(steps, y, onset, fallback_level, fallback_sigma, p)
    return memo.fit(steps, y, onset, fallback_level, fallback_sigma, p)


@dataclass
class _Measured:
    """A series' arrays as the last poll measured its spikes, and the results by inputs."""

    steps: np.ndarray
    results: dict[tuple[object, ...], dict[str, Any]]
    values: np.ndarray = field(default_factory=lambda: np.empty(0))
    mark: tuple[int, int] | None = None  # ids of the arrays measured this poll


def _measure_key(kw: dict[str, Any]) -> tuple[object, ...]:
    """Every input of a spike's measure but the arrays, floats as bytes (NaN equals NaN)."""
    floats = [kw["sigma"], kw["baseline_at_peak"], kw["alarm"], kw.get("interval")]
    return (
        int(kw["onset"]),
        int(kw["peak"]),
        bool(kw["log_scale"]),
        np.array([np.nan if f is None else f for f in floats], dtype=np.float64).tobytes(),
        kw.get("interval") is None,
        kw["p"],
        tuple(int(b) for b in kw.get("barriers") or ()),
    )


def _settled(
    got: dict[str, Any], old_steps: np.ndarray, steps: np.ndarray, kw: dict[str, Any]
) -> bool:
    """Whether a spike measured on ``old_steps`` (a prefix of ``steps``, values equal) has
    the same measures on the grown series, but the steps logged after its peak.

    By what the measures are (spike_shape.measure): the recovery is the first point after the
    peak back in the band whose window of ``smooth_points`` points is too; the width ends at the
    first point after the peak back under the alarm line; the plateau is read on the steps
    from the recovery to ``plateau_window`` after it (or the next barrier); only
    ``steps_logged_after_peak`` reads the log's end. So when the spike recovered with its
    window, its width's end and its plateau's last step all before the old end, none of
    them can move with appended points. An unrecovered spike is measured again.
    """
    p = kw["p"]
    if not got.get("recovered") or got.get("recovered_step") is None:
        return False
    m = len(old_steps)
    last_old = int(old_steps[-1])
    rec = int(np.searchsorted(old_steps, got["recovered_step"]))
    if rec >= m or int(old_steps[rec]) != got["recovered_step"]:
        return False
    if rec + max(1, p.smooth_points) - 1 >= m:
        return False  # the recovery's window reached the old end
    peak = int(kw["peak"])
    interval = kw.get("interval")
    if interval is None:
        return False
    # The width's last step is at most width - interval after the peak.
    if int(old_steps[peak]) + got["width_steps"] - interval >= last_old:
        return False
    if got.get("trend") == "trend":
        stop = int(old_steps[rec]) + p.plateau_window
        later = [b for b in (kw.get("barriers") or []) if b > old_steps[peak]]
        if later:
            stop = min(stop, min(later) - 1)
        if stop >= last_old:
            return False  # the plateau's window reaches the old end
    return True


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading elements ``a`` and ``b`` (one dtype) share, byte for byte (a NaN
    equals itself, -0.0 does not equal 0.0)."""
    k = min(len(a), len(b))
    differ = a[:k].view(np.uint8) != b[:k].view(np.uint8)
    first = int(np.argmax(differ)) if differ.any() else k * a.itemsize
    return first // a.itemsize


def local_reusing(
    name: str,
    params: tuple[object, ...],
    reach: int,
    values: np.ndarray,
    compute: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray:
    """``compute(values)`` for a *local* filter, through the active memo if any.

    ``compute`` must return one output per input point, each output reading only the inputs
    within ``reach`` points of its own (windows cut short only at the ends of the array), and
    nothing else (``params`` name everything else it depends on). Then, when the last poll
    computed it on an input that shares its first L points with ``values`` (byte for byte;
    usually all of them: the series grew), every output more than ``reach`` points before L
    is the same, and the rest is computed from ``2 * reach`` points before it: equal to the
    whole computation, element for element (``tests/test_watch_reuse.py``).
    """
    memo = _ACTIVE.get()
    if memo is None:
        return compute(values)
    return memo.local(name, params, reach, values, compute)


def _merge_distinct(u: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The sorted distinct values of two sorted distinct arrays together (``u`` long, ``t``
    short): ``t``'s values not in ``u`` inserted at their places, in O(len(u))."""
    if len(t) == 0:
        return u
    pos = np.searchsorted(u, t)
    present = np.zeros(len(t), dtype=bool)
    inside = pos < len(u)
    present[inside] = u[pos[inside]] == t[inside]
    return np.insert(u, pos[~present], t[~present])


def distinct_reusing(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of ``values`` (finite, every one), through the active memo
    if any: when the last poll asked for those of a prefix of ``values`` (checked byte for
    byte), the distinct values of the rest are merged into its answer.

    The values are ``np.unique(values)``'s, but where a zero is logged as both 0.0 and -0.0
    either sign may stand for it (as in ``np.unique`` itself, whose sort decides): use it only
    where a zero's sign cannot matter (``robust.resolution`` reads differences).
    """
    memo = _ACTIVE.get()
    if memo is None or values.dtype.kind not in "iuf":
        return np.unique(values)
    return memo.distinct(values)


def measure_reusing(steps: np.ndarray, values: np.ndarray, **kw: Any) -> dict[str, Any]:
    """:func:`~forensics.evidence.spike_shape.measure` (same arguments), through the active
    memo if any: a spike the last poll measured on a prefix of this series (checked byte for
    byte, once per series) with the very same inputs, that had settled before the old end
    (:func:`_settled`), keeps its measures; only the steps logged after its peak move."""
    memo = _ACTIVE.get()
    if memo is None:
        from forensics.evidence.spike_shape import measure

        return measure(steps, values, **kw)
    return memo.measure(steps, values, **kw)


__all__ = [
    "TrendMemo",
    "distinct_reusing",
    "fit_trend_reusing",
    "local_reusing",
    "measure_reusing",
]
