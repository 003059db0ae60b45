"""Work a watcher reuses between polls: the spikes' pre-spike trend fits.

``forensics watch`` re-analyses the whole run on each poll. Most spikes lie before the new
data, and the costly part of measuring one (:func:`~forensics.evidence.spike_shape.fit_trend`,
two Theil-Sen fits over up to a few hundred points) reads only the points before its onset.
A :class:`TrendMemo` remembers each fit under its exact inputs (the points' bytes, the onset,
the fallbacks, the parameters): a later poll whose spike has the very same inputs gets the very
same :class:`~forensics.evidence.spike_shape.Trend`, and any change (a moved onset, another
sigma, a rewritten point) is a miss that fits again. Nothing is inferred about causality, so
no finding can differ from an analysis without the memo (``tests/test_watch_reuse.py``).

The memo is active only inside :meth:`TrendMemo.active` (the watcher wraps its
``analyze_run`` in it); ``analyze`` never uses one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from forensics.evidence.spike_shape import ShapeParams, Trend

_Key = tuple[str, bytes, str, bytes, int, bytes, "ShapeParams"]

_ACTIVE: ContextVar[TrendMemo | None] = ContextVar("forensics_trend_memo", default=None)


class TrendMemo:
    """Trend fits by their exact inputs. Kept across polls; after each poll only the fits that
    poll used are kept (a spike that vanished or moved does not pile up)."""

    def __init__(self) -> None:
        self._fits: dict[_Key, Trend] = {}
        self._used: dict[_Key, Trend] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._fits)

    @contextmanager
    def active(self) -> Iterator[TrendMemo]:
        """Use this memo for the fits made inside the block (one analysis)."""
        self._used = {}
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)
            self._fits, self._used = self._used, {}

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


__all__ = ["TrendMemo", "fit_trend_reusing"]
