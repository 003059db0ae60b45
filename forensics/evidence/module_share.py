"""Parts of the model's share of the gradient: the layers' and the embedding's and head's.

* :func:`layer_shares`: each layer's squared grad norm over the sum over the layers, which the
  layer_grad_shift detector and the ``shallow_layers`` cause read.
* :func:`module_shares`: the token embedding's and the output head's squared grad norm over
  the squared total grad norm, at the steps where the total and every logged module have a
  finite value: what the ``embed_head`` cause compares before and after a drift's onset
  (:mod:`forensics.causes`), the middle-phase checklist reads and the report's panel draws
  (:func:`forensics.report.charts.module_share_panel`), so sentence and chart read the same
  numbers.
* :func:`share_doubled`: the line all of them judge a growing share by.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.evidence import Evidence
from forensics.evidence.trend_utils import LayerMatrix
from forensics.schema import GRAD_NORM, GRAD_NORM_EMBED, GRAD_NORM_HEAD

MODULES = (GRAD_NORM_EMBED, GRAD_NORM_HEAD)
NAMES = {GRAD_NORM_EMBED: "the embedding", GRAD_NORM_HEAD: "the output head"}


@dataclass(frozen=True)
class ModuleShares:
    steps: np.ndarray  # int64, where the total and every logged module are finite
    shares: dict[str, np.ndarray]  # module metric -> share of the squared total grad norm

    @property
    def total(self) -> np.ndarray:
        """The logged modules' shares summed."""
        return np.sum(list(self.shares.values()), axis=0)

    @property
    def names(self) -> str:
        """``the embedding``, ``the output head`` or ``the embedding and output head``."""
        if len(self.shares) == 2:
            return "the embedding and output head"
        return NAMES[next(iter(self.shares))]


def module_shares(ev: Evidence) -> ModuleShares | None:
    """The logged modules' shares of the squared grad norm (None when the total grad norm or
    both modules are not logged)."""
    mods = [m for m in MODULES if ev.has(m)]
    if not mods or not ev.has(GRAD_NORM):
        return None
    total = ev.series(GRAD_NORM)
    steps = total.steps
    ok = total.values > 0
    squares = {}
    for m in mods:
        s = ev.series(m)
        if len(s.steps) == 0:
            return None
        i = np.minimum(np.searchsorted(s.steps, steps), len(s.steps) - 1)
        hit = s.steps[i] == steps
        ok &= hit
        squares[m] = np.where(hit, s.values[i], 0.0) ** 2
    den = total.values[ok] ** 2
    return ModuleShares(steps[ok], {m: sq[ok] / den for m, sq in squares.items()})


def layer_shares(lm: LayerMatrix) -> tuple[np.ndarray, np.ndarray]:
    """Each layer's share of the summed squared layer grad norms (a steps x layers array, rows
    adding up to one) at the steps of a complete layer matrix whose sum is positive: those
    steps and the shares."""
    sq = lm.values**2
    tot = sq.sum(axis=1)
    keep = tot > 0
    return lm.steps[keep], sq[keep] / tot[keep, None]


def share_doubled(before: float, after: float) -> bool:
    """A share that at least doubled and gained 10 points of the total (a layer_grad_shift's
    lines, the article's shallow layers went from 8% to nearly 20%)."""
    return after >= 2 * before and after - before >= SHARE_GAIN


SHARE_GAIN = 0.10  # points of the total a growing share must gain
