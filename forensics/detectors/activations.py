"""activation_outlier: a layer whose activations blow up (article sections 2.3 and 4.2).

Two signs, per layer: the activation absolute maximum above 1e4 (the article locates the
overflowing layer this way, usually an attention block), and the activation std jumping
against its own recent history (a middle layer whose std suddenly grows is the early sign
of a NaN); std growth during the LR warm-up is start-up: neither counted nor used as the
level later points are judged against. One finding per
layer and sign, naming the layer and the first step.

The measures of its finding kinds are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from forensics.evidence import Evidence
from forensics.evidence.trend_utils import num, sig, times
from forensics.findings import Finding, FindingKind, Severity, step_range
from forensics.params import ActivationsParams
from forensics.schema import ACT_ABSMAX, ACT_STD

if TYPE_CHECKING:
    from forensics.run import Run

CHECK = "activation_outlier"
ABSMAX_JUMP_NOTE = 100.0  # an absmax this many times its recent median, under the limit: a note


class ActivationDetector:
    """Flags per-layer activation absmax above a limit and sudden activation std jumps."""

    name = CHECK

    def __init__(self, params: ActivationsParams | None = None) -> None:
        self.params = params or ActivationsParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        ev = ev.using("activations", self.params)
        run = ev.run
        amax_layers, std_layers = _judged_layers(run, ACT_ABSMAX), _judged_layers(run, ACT_STD)
        if not amax_layers and not std_layers:
            run.note(f"{CHECK}: not run, the run logged no activation absmax or std")
            return []
        out: list[Finding] = []
        for layer in amax_layers:
            out += self._absmax(ev, layer)
        for layer in std_layers:
            out += self._std(ev, layer)
        return out

    def _absmax(self, ev: Evidence, layer: int | None) -> list[Finding]:
        s = ev.logged(ACT_ABSMAX, layer)  # NaN and Inf included: they count as over the limit
        x, y = s.steps, np.abs(s.values)
        limit = ev.activation_limit
        over = np.nan_to_num(y, nan=np.inf) > limit
        if not over.any():
            return self._absmax_jump(ev, layer, x, y, limit)
        i0 = int(np.argmax(over))
        peak = int(np.argmax(np.nan_to_num(y, nan=np.inf)))
        prior = y[max(0, i0 - self.params.history) : i0]
        prior = prior[np.isfinite(prior)]
        before = float(np.median(prior)) if len(prior) else None
        finite = bool(np.isfinite(y[peak]))
        val_txt = num(float(y[peak]), 3) if finite else "a non-finite value"
        return [
            Finding(
                kind=FindingKind.ACTIVATION_OUTLIER,
                severity=Severity.WARNING,
                metric=ACT_ABSMAX,
                start_step=int(x[i0]),
                peak_step=int(x[peak]),
                end_step=int(x[np.flatnonzero(over)[-1]]),
                measures={
                    "layer": layer,
                    "trigger": "absmax",
                    "value": float(y[peak]),
                    "limit": limit,
                    "before": before,
                    "ratio": float(y[peak]) / before if before else None,
                    "points_over": int(over.sum()),
                },
                summary=(
                    f"{_whose(layer)} activation absmax passed {limit:,g} at step {int(x[i0]):,} "
                    + (
                        f"with {val_txt}, its peak"
                        if peak == i0
                        else f"and reached {val_txt} at step {int(x[peak]):,}"
                    )
                    + (f" (typical before: {sig(before)})." if before is not None else ".")
                ),
                judged_against={"limit": limit, "before": before},
            )
        ]

    def _against_typical(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each point's typical level, the median of the ``history`` points before it
        (trailing, without the point; NaN with fewer than ``min_history``), and the point's
        ratio to it (NaN where that level is not positive)."""
        prev = (
            pl.Series(y)
            .rolling_median(self.params.history, min_samples=self.params.min_history)
            .shift(1)
            .to_numpy()
            .astype(float)
        )
        return prev, np.where(prev > 0, y / np.where(prev > 0, prev, 1.0), np.nan)

    def _absmax_jump(
        self, ev: Evidence, layer: int | None, x: np.ndarray, y: np.ndarray, limit: float
    ) -> list[Finding]:
        """A note for an absmax that jumps two orders of magnitude above its own recent level
        but stays under the limit (12.6 -> 9,900: nothing was said). The article's line is
        absolute, so this is no warning; but a reader of the chart sees the jump."""
        if len(y) <= self.params.min_history:
            return []
        prev, ratio = self._against_typical(y)
        jump = np.nan_to_num(ratio, nan=0.0) >= ABSMAX_JUMP_NOTE
        if not jump.any():
            return []
        i0 = int(np.argmax(jump))
        peak = i0 + int(np.argmax(y[i0:] * jump[i0:]))
        before = float(prev[i0])
        return [
            Finding(
                kind=FindingKind.ACTIVATION_OUTLIER,
                severity=Severity.INFO,
                metric=ACT_ABSMAX,
                start_step=int(x[i0]),
                peak_step=int(x[peak]),
                end_step=int(x[np.flatnonzero(jump)[-1]]),
                measures={
                    "layer": layer,
                    "trigger": "absmax_jump",
                    "value": float(y[peak]),
                    "limit": limit,
                    "before": before,
                    "ratio": float(y[peak]) / before,
                    "points_over": int(jump.sum()),
                },
                summary=(
                    f"{_whose(layer)} activation absmax jumped to {num(float(y[i0]), 3)} at step "
                    f"{int(x[i0]):,}, {float(y[i0]) / before:,.0f}x its typical {sig(before)} "
                    f"before, but stayed under the {limit:,g} line"
                    + (
                        ""
                        if peak == i0
                        else f" (peak {num(float(y[peak]), 3)} at step {int(x[peak]):,})"
                    )
                    + ": a note, since the article's line is absolute."
                ),
                judged_against={"limit": limit, "before": before, "jump_note": ABSMAX_JUMP_NOTE},
            )
        ]

    def _std(self, ev: Evidence, layer: int | None) -> list[Finding]:
        s = ev.series(ACT_STD, layer)
        x, y = s.steps, s.values
        if len(y) <= self.params.min_history:
            return []
        # Activations grow from their initial values during the LR warm-up: that is start-up,
        # neither a jump nor a level to judge later points against (histogram_layers' block 0:
        # 0.10, 0.27, 0.41 over the warm-up to step 30, then 1.17 at step 40 and on up to about
        # 2, the model leaving its initialisation, was "4.3x the median of its 3 points before").
        settled = ev.warmup_end
        j0 = 0 if settled is None else int(np.searchsorted(x, settled, side="right"))
        prev, ratio = np.full(len(y), np.nan), np.full(len(y), np.nan)
        prev[j0:], ratio[j0:] = self._against_typical(y[j0:])
        jump = np.nan_to_num(ratio, nan=0.0) >= self.params.std_jump_ratio
        if not jump.any():
            return []
        i0 = int(np.argmax(jump))
        before = float(prev[i0])
        peak = i0 + int(np.argmax(y[i0:]))
        k = min(self.params.history, i0)  # the trailing points the median was taken over
        # A point far above the one before it jumped; one the series was already climbing to
        # (the point before is already half-way up) climbed.
        verb = "jumped" if y[i0 - 1] < 0.5 * (before + float(y[i0])) else "climbed"
        return [
            Finding(
                kind=FindingKind.ACTIVATION_OUTLIER,
                severity=Severity.WARNING,
                metric=ACT_STD,
                start_step=int(x[i0]),
                peak_step=int(x[peak]),
                end_step=int(x[-1]),
                measures={
                    "layer": layer,
                    "trigger": "std_jump",
                    "value": float(y[peak]),
                    "limit": self.params.std_jump_ratio,
                    "before": before,
                    "ratio": float(y[peak]) / before,
                    "points_over": int(jump.sum()),
                },
                summary=(
                    f"{_whose(layer)} activation std {verb} to {num(float(y[i0]), 3)} at step "
                    f"{int(x[i0]):,}, {times(float(y[i0]) / before)}x the median of its {k} "
                    f"points before ({sig(before)}, steps "
                    f"{step_range(int(x[i0 - k]), int(x[i0 - 1]))})"
                    + (
                        ", its highest"  # (the jump's point is the peak: not said twice)
                        if peak == i0
                        else f", and peaked at {num(float(y[peak]), 3)} at step {int(x[peak]):,}"
                    )
                    + "."
                ),
                judged_against={
                    "before": before,
                    "jump_ratio": self.params.std_jump_ratio,
                    "jump_at": self.params.std_jump_ratio * before,
                    "warmup_end": settled,
                },
            )
        ]


def _judged_layers(run: Run, metric: str) -> list[int | None]:
    """The layers whose ``metric`` is judged: each logged layer; a series logged without a
    layer index (a model-wide maximum or std, ``act_absmax`` on its own or mapped by
    ``--alias``) as the one ``None`` when no layer is logged. The article's 1e4 line holds
    for the whole model's largest activation too: a run that logged only that was judged on
    nothing, and the causes read its silence as activations "in their range" (a model-wide
    absmax of 20,000 at a loss spike's onset). Beside per-layer series a model-wide one
    adds nothing (it is their maximum) and is not judged twice."""
    layers: list[int | None] = list(run.layers(metric))
    if not layers and run.has(metric):
        layers = [None]
    return layers


def _whose(layer: int | None) -> str:
    """``Layer 3`` or ``Model-wide`` (a series logged without a layer index)."""
    return f"Layer {layer}" if layer is not None else "Model-wide (no layer index logged)"
