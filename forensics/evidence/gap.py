"""The train/val gap (article section 5), computed once per run: ``Evidence.gap``.

Every held-out loss has its own gap (``Evidence.gap_of(metric)``; :func:`held_out_losses` lists
them: ``val_loss`` and each eval set's ``eval/<set>_loss``). The gap is val minus train at each
validation step, with the train loss smoothed around the
eval (spikes dropped, then the median over ``[s - half_width, s + half_width]``). It may be
negative (dropout makes train look worse than val). Detectors, checklists and charts read the
same :class:`Gap`, so a gap a chart draws is the gap a finding states.

Fields of :class:`Gap` (arrays are aligned with the validation points):

| field | meaning |
|---|---|
| `steps` | validation steps (int64, sorted) |
| `val` | validation loss at those steps |
| `train` | train loss smoothed around each val step (median over +-`half_width` steps) |
| `gap` | `val - train` |
| `train_steps`, `train_values` | the train series with its upward spikes dropped (read from |
| | `train_all_steps`, `train_all_values` and the mask `train_keep`) |
| `interval` | median steps between validation points |
| `half_width` | half width of the train window: max(interval / 2, 2 x train log interval) |
| `window` | the acceleration window: 1000 steps (a sixth of a short log), >= 2 intervals |
| `val_noise` | the eval noise: the val series' own step-to-step noise (robust sigma) |
| `noise` | noise of the gap: max(val_noise, robust sigma of the gap, 1e-9) |
| `accel_ratio` | the article's 1.5x: growth over the last window vs the window before |
| `noise_k` | growth must also beat noise_k x sqrt(2) x the noise (the noise floor) |
| `metric` | the held-out loss: `val_loss`, or an eval set's `eval/<set>_loss` |

Derived (computed on first use): `smooth` (3-point rolling median of the gap), `growth_last`
and `growth_prev` (growth of `smooth` over the window ending at each val step and over the
window before it; NaN until two windows of log exist), `local_noise` (noise of val and gap
around each point: a loss's noise shrinks with its level), `growth_floor` (what a growth must
exceed: noise_k x sqrt(2) x max(noise, local_noise)), `widening` (growth_last above the floor)
and `accelerating` (the 1.5x rule and the floor both met at that val step).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from forensics.evidence.order_stats import median_of_ints
from forensics.evidence.trend_utils import (
    MAD_SCALE,
    align,
    bin_median,
    robust_sigma,
    rolling_median,
)
from forensics.schema import LOSS, VAL_LOSS, held_out_set

if TYPE_CHECKING:
    from forensics.evidence import Evidence


@dataclass(frozen=True, eq=False)
class Gap:
    """The train/val gap at each validation point, with its noise (see the module docstring)."""

    steps: np.ndarray
    val: np.ndarray
    train: np.ndarray
    gap: np.ndarray
    # The train series (the evidence's own arrays) and which of its points are kept (None:
    # all): the despiked series is made when read (see train_steps), not held (16 bytes a
    # train point for as long as the evidence lives).
    train_all_steps: np.ndarray
    train_all_values: np.ndarray
    train_keep: np.ndarray | None
    interval: float
    half_width: float
    window: float
    val_noise: float
    noise: float
    accel_ratio: float
    noise_k: float
    metric: str = VAL_LOSS  # the held-out loss: val_loss or one eval set's eval/<set>_loss

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def train_steps(self) -> np.ndarray:
        """The train steps with the loss's upward spikes dropped (a new array when some are)."""
        k = self.train_keep
        return self.train_all_steps if k is None else self.train_all_steps[k]

    @property
    def train_values(self) -> np.ndarray:
        """The train loss at :attr:`train_steps`."""
        k = self.train_keep
        return self.train_all_values if k is None else self.train_all_values[k]

    def train_after(self, step: float) -> tuple[np.ndarray, np.ndarray]:
        """``(train_steps[sel], train_values[sel])`` with ``sel = train_steps >= step``: the
        steps are sorted, so the points from ``step`` on are a slice of the logged ones, taken
        before the spikes are dropped (copies of the slice only)."""
        i = int(np.searchsorted(self.train_all_steps, step, side="left"))
        s, v, k = self.train_all_steps[i:], self.train_all_values[i:], self.train_keep
        return (s, v) if k is None else (s[k[i:]], v[k[i:]])

    def train_steps_float(self) -> np.ndarray:
        """``train_steps.astype(float)``, converted a block at a time (no integer copy of the
        kept steps beside the floats)."""
        s, k = self.train_all_steps, self.train_keep
        if k is None:
            return s.astype(float)
        out = np.empty(int(np.count_nonzero(k)))
        at = 0
        for lo in range(0, len(s), _BLOCK):
            part = s[lo : lo + _BLOCK][k[lo : lo + _BLOCK]]
            out[at : at + len(part)] = part
            at += len(part)
        return out

    @cached_property
    def smooth(self) -> np.ndarray:
        """The gap through a 3-point rolling median (what growths are measured on)."""
        return rolling_median(self.gap, 3)

    def smooth_at(self, steps: np.ndarray | float) -> np.ndarray:
        """The smoothed gap interpolated at any steps (flat beyond the ends)."""
        return np.interp(steps, self.steps.astype(float), self.smooth)

    @cached_property
    def growth_last(self) -> np.ndarray:
        """Growth of the smoothed gap over the window ending at each val step (NaN until two
        windows of log precede)."""
        t = self.steps.astype(float)
        last = self.smooth_at(t) - self.smooth_at(t - self.window)
        return np.where(self._two_windows, last, np.nan)

    @cached_property
    def growth_prev(self) -> np.ndarray:
        """Growth over the window before that (NaN until two windows of log precede)."""
        t = self.steps.astype(float)
        prev = self.smooth_at(t - self.window) - self.smooth_at(t - 2 * self.window)
        return np.where(self._two_windows, prev, np.nan)

    @property
    def _two_windows(self) -> np.ndarray:
        t = self.steps.astype(float)
        return t - 2 * self.window >= t[0]

    @cached_property
    def local_noise(self) -> np.ndarray:
        """Robust noise of val and gap around each val point (12 points each side)."""
        return local_noise(self.val, self.gap)

    @cached_property
    def growth_floor(self) -> np.ndarray:
        """What a window's growth must exceed at each val step. A growth is the difference of
        two gap readings, so its noise is sqrt(2) x the gap noise; the noise is also taken
        locally (the run-wide one, dominated by a quiet late stretch, is too strict early)."""
        return self.noise_k * np.sqrt(2.0) * np.maximum(self.noise, self.local_noise)

    @cached_property
    def widening(self) -> np.ndarray:
        """The gap grew by more than the noise floor over the window ending here."""
        return np.nan_to_num(self.growth_last, nan=-np.inf) > self.growth_floor

    @cached_property
    def accelerating(self) -> np.ndarray:
        """The article's yellow light at each val step: growth over the last window above
        accel_ratio x the growth over the window before (a shrinking one counts as 0) and
        above the noise floor."""
        last, prev = self.growth_last, self.growth_prev
        with np.errstate(invalid="ignore"):
            hit = (last > self.accel_ratio * np.maximum(prev, 0.0)) & (last > self.growth_floor)
        return np.asarray(hit, dtype=bool)

    def binned(self, max_bins: int) -> Gap:
        """The same gap on at most ``max_bins`` val bin medians, the train loss re-aligned to
        the bin steps over +-``interval``; noise, window and interval are the full series'."""
        if len(self.val) <= max_bins:
            return self
        vx, vy = bin_median(self.steps.astype(float), self.val, max_bins=max_bins)
        train = align(self.train_steps, self.train_values, vx, self.interval)
        return replace(self, steps=vx, val=vy, train=train, gap=vy - train)

    def judged(self) -> dict[str, float]:
        """The numbers a gap finding records as what it was judged against."""
        return {
            "accel_ratio": self.accel_ratio,
            "window_steps": self.window,
            "noise": self.noise,
            "val_noise": self.val_noise,
            "noise_k": self.noise_k,
        }


_BLOCK = 1 << 16  # points converted at a time


def held_out_losses(ev: Evidence) -> list[str]:
    """Every held-out loss the run logged: ``val_loss`` first, then each eval set's
    ``eval/<set>_loss`` (:func:`forensics.schema.held_out_set`), each with its own gap."""
    found = [m for m in ev.run.metrics() if held_out_set(m) is not None]
    return sorted(found, key=lambda m: (m != VAL_LOSS, m))


def train_val_gap(ev: Evidence, metric: str = VAL_LOSS) -> Gap | None:
    """The train/val gap of a run (``Evidence.gap``; ``Evidence.gap_of(metric)`` for one eval
    set's held-out loss), or None without at least two val points and one train point.

    Built with the evidence's ``train_val`` parameters (window, acceleration rule). The detector
    asks for more points (``min_val_points``, 5 train points) before judging it.
    """
    p = ev.params.train_val
    t, v = ev.series(LOSS), ev.series(metric)
    if len(v) < 2 or t.empty:
        return None
    vx, vy = v.steps, v.values
    keep = ev.despiked(LOSS)  # despike(t.values), its band shared
    n_kept = int(np.count_nonzero(keep))
    if n_kept == 0:
        return None
    interval = median_of_ints(np.diff(vx))
    # (through a sort: numpy's partition of a million ones with a few twos takes 0.14 s; the
    # kept steps gathered again below, not held beside their differences and their sort)
    t_int = median_of_ints(np.diff(t.steps[keep])) if n_kept > 1 else interval
    tx, ty = t.steps[keep], t.values[keep]
    half = max(interval / 2, 2 * t_int)
    train = align(tx, ty, vx.astype(float), half)
    # The article's 1000 steps assume a long run; a short log (under six windows) gets a sixth
    # of its length instead, never less than two val intervals.
    span = float(vx[-1] - vx[0])
    window = max(min(float(p.min_window), span / 6.0), p.window_intervals * interval)
    gap = vy - train
    val_noise = robust_sigma(vy)
    # The gap carries the val noise plus what is left of the train noise after smoothing.
    noise = max(val_noise, robust_sigma(gap), 1e-9)
    return Gap(
        steps=vx,
        val=vy,
        train=train,
        gap=gap,
        train_all_steps=t.steps,
        train_all_values=t.values,
        train_keep=None if keep.all() else keep,
        interval=interval,
        half_width=half,
        window=window,
        val_noise=val_noise,
        noise=noise,
        accel_ratio=float(p.accel_ratio),
        noise_k=float(p.noise_k),
        metric=metric,
    )


def local_noise(val: np.ndarray, gap: np.ndarray, half: int = 12) -> np.ndarray:
    """Robust noise of the val loss and the gap around each point (``half`` points each side)."""
    n = len(val)
    out = np.zeros(n)
    w = 2 * half + 1
    # Full windows of finite values at once (thousands of val points on a 1M-step log): the
    # same operations as robust_sigma, row by row; the ends and anything else in the loop.
    full = n >= 4 * w and w >= 4 and bool(np.isfinite(val).all() and np.isfinite(gap).all())
    if full:
        out[half : n - half] = np.maximum(_window_sigma(val, w), _window_sigma(gap, w))
    for i in range(n):
        if full and half <= i < n - half:
            continue
        lo, hi = max(0, i - half), min(n, i + half + 1)
        out[i] = max(robust_sigma(val[lo:hi]), robust_sigma(gap[lo:hi]))
    return out


def _window_sigma(v: np.ndarray, w: int) -> np.ndarray:
    """:func:`robust_sigma` of every full window of ``w`` finite values."""
    d2 = np.diff(np.lib.stride_tricks.sliding_window_view(np.asarray(v, dtype=float), w), 2)
    dev = np.abs(d2 - np.median(d2, axis=1, keepdims=True))
    return MAD_SCALE * np.median(dev, axis=1) / np.sqrt(6.0)


__all__ = ["Gap", "held_out_losses", "local_noise", "train_val_gap"]
