"""layer_grad_shift: a group of layers taking a growing share of the gradient (article 3.4).

In the article's incident the first four layers went from about 8% to nearly 20% of the
total gradient while the deeper layers stayed steady, and their param norms grew faster
than the rest: the shallow layers were compensating for something. Here a layer's share is
its squared grad norm over the sum of squared per-layer grad norms, so the shares add up to
one (the total grad norm squared is the sum over disjoint parameter groups). Shares are
compared between an early window (after the LR warm-up and the first tenth of the log, while
the shares still reorganise) and the last stretch of the run;
contiguous layers whose share grew by half or more form a candidate group, flagged when the
group's share at least doubled and rose by at least 10 points of the total (the article's case
gained 12; in small healthy models the last block's share often creeps from ~9% to ~18% as
training goes on, which is not this pattern: a group of the deepest layer alone is an ``info``
note unless its share grew ``LAST_ONLY_RATIO`` (3x) or more). A group whose every logged grad
norm in the early window is 0 was frozen then and trained since (a staged fine-tune): a note
(``frozen_before``). Per-layer param-norm growth rates are attached when logged.

The measures of its finding kinds are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from forensics.evidence import Evidence
from forensics.evidence.module_share import layer_shares
from forensics.evidence.trend_utils import (
    bend_range,
    bin_median,
    fmt_layers,
    hinge_onset,
    num,
    robust_sigma,
    rolling_median,
    theil_sen,
)
from forensics.findings import Finding, FindingKind, Severity
from forensics.params import LayersParams
from forensics.schema import GRAD_NORM_LAYER, PARAM_NORM_LAYER

CHECK = "layer_grad_shift"
LAST_ONLY_RATIO = 3.0  # the deepest block alone is a warning only past this share ratio


class LayerGradShiftDetector:
    """Flags layer groups whose share of the total grad norm at least doubles."""

    name = CHECK

    def __init__(self, params: LayersParams | None = None) -> None:
        self.params = params or LayersParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        run = ev.run
        lm = ev.layer_matrix(GRAD_NORM_LAYER).complete()
        steps, layers = lm.steps, lm.layers
        if len(layers) < 2:
            run.note(f"{CHECK}: not run, the run has no per-layer grad norms (grad_norm_layer)")
            return []
        if len(steps) < self.params.min_points:
            run.note(f"{CHECK}: not run, only {len(steps)} steps with every layer's grad norm")
            return []
        steps, share = layer_shares(lm)
        if len(steps) < self.params.min_points:
            run.note(f"{CHECK}: not run, the per-layer grad norms are all zero")
            return []
        # The shares reorganise in the first steps (the first tenth of the log, or the LR
        # warm-up when longer): the early window starts after that.
        first = int(steps[0])
        start = max(ev.warmup_end or first, first + int(0.1 * (int(steps[-1]) - first)))
        span = max(1, int(steps[-1]) - start)
        # Windows of min_window steps, or window_frac of the run when that is longer; short runs
        # (a few hundred steps) get windows of 30% so early and late never overlap.
        width = max(self.params.window_frac * span, min(float(self.params.min_window), 0.3 * span))
        early = (steps >= start) & (steps <= start + width)
        late = steps >= steps[-1] - width
        if early.sum() < 3 or late.sum() < 3 or (early & late).any():
            run.note(
                f"{CHECK}: not run, the per-layer log is too short to compare early and late shares"
            )
            return []
        before = np.median(share[early], axis=0)
        after = np.median(share[late], axis=0)
        grew = after >= self.params.layer_ratio * np.maximum(before, 1e-12)
        p = self.params
        windows = {
            "early_start_step": int(steps[early][0]),
            "early_end_step": int(steps[early][-1]),
            "late_start_step": int(steps[late][0]),
            "late_end_step": int(steps[late][-1]),
        }
        out = []
        for grp in _runs(np.flatnonzero(grew)):
            series = share[:, grp].sum(axis=1)
            b, a = float(before[grp].sum()), float(after[grp].sum())
            if grp[-1] < len(layers) - 1:  # (see _level_now: shallow groups only)
                a = _level_now(steps, series, late, a)
            noise = robust_sigma(series)
            small = (a - b) < p.min_increase or (a - b) <= p.noise_k * noise
            if a < p.min_share or a < p.group_ratio * b or small:
                continue
            judged = {
                "share_before": b,
                # the group's share must reach all of these
                "flag_at_share": max(
                    p.group_ratio * b, b + p.min_increase, b + p.noise_k * noise, p.min_share
                ),
                "group_ratio": p.group_ratio,
                "min_increase": p.min_increase,
                "min_share": p.min_share,
                "noise": noise,
                "noise_k": p.noise_k,
                **windows,
            }
            # Every logged grad norm of the group 0 in the early window: layers frozen then,
            # trained since (a staged fine-tune), not the article's shift.
            frozen = bool(np.all(share[early][:, grp] == 0))  # (a share is 0 where its norm is)
            out.append(self._finding(ev, steps, series, grp, layers, b, a, start, judged, frozen))
        return out

    def _finding(
        self,
        ev: Evidence,
        steps: np.ndarray,
        series: np.ndarray,
        grp: np.ndarray,
        layers: list[int],
        b: float,
        a: float,
        start: int,
        judged: dict[str, Any],
        frozen: bool = False,
    ) -> Finding:
        names = [layers[i] for i in grp]
        xb, yb = bin_median(steps.astype(float), series, max_bins=200)
        smooth = rolling_median(yb, 5)
        sel = xb >= start
        h = hinge_onset(xb[sel], smooth[sel])
        onset_range: tuple[int, int] | None
        if h is not None and h[2] > 0 and h[2] > h[1]:
            onset, onset_range = h.onset, h.range
        else:
            # No upward bend (a rise that slows down, a step): where the share first left its
            # early level, by more than its noise and a tenth of the rise, and at the latest
            # where it crossed half-way. (The half-way crossing alone put a rise that began at
            # step 4,000 at its middle, 6,000.)
            p = self.params
            rise = a - b
            level = b + min(0.5 * rise, max(p.noise_k * float(judged["noise"]), 0.1 * rise))
            left = sel & (smooth >= level)
            onset = int(round(xb[int(np.argmax(left))])) if left.any() else start
            # (on the bins' steps: known to about a bin either side)
            onset_range = bend_range(xb[sel], onset) if onset != start else None
        growth = _param_growth(ev, layers, onset)
        in_grp = set(names)
        known = {layer: g for layer, g in growth.items() if g is not None}
        g_rates = [known[layer].rate for layer in names if layer in known]
        r_rates = [known[layer].rate for layer in layers if layer not in in_grp and layer in known]
        label = fmt_layers(names)
        by_layer = ",".join(
            f"{layer}:{known[layer].rate:+.2f}" for layer in layers if layer in known
        )
        pg = float(np.mean(g_rates)) if g_rates else None
        pr = float(np.mean(r_rates)) if r_rates else None
        param_txt = ""
        if pg is not None and pr is not None:
            rest = _rest_text(known, names, layers, since=onset)
            mine = [known[layer] for layer in names if layer in known]
            if not any(g.to_nothing for g in mine):
                whose = "their param norms grow" if len(names) > 1 else "its param norm grows"
                param_txt = f"; {whose} {_rate(pg)}%/1k steps vs {rest}"
            elif len(mine) == 1:
                g = mine[0]
                param_txt = (
                    f"; its param norm fell from {num(g.first)} to {num(g.last)} "
                    f"({g.change_pct:+.1f}%), vs {rest}"
                )
            else:
                param_txt = f"; their param norms: {_rest_text(known, [], names)}, vs {rest}"
        after = xb >= onset
        k_peak = int(np.flatnonzero(after)[np.argmax(smooth[after])]) if after.any() else 0
        # The deepest block alone creeping up is common in healthy runs (see above); the
        # article's pattern is shallow layers. A note unless its share grew past LAST_ONLY_RATIO.
        last_only = names == [max(layers)] and a < LAST_ONLY_RATIO * b
        note = (
            "; the last block alone, whose share often creeps up in healthy runs (the article's "
            "pattern is shallow layers): a note"
            if last_only
            else ""
        )
        if frozen:
            w0, w1 = judged["early_start_step"], judged["early_end_step"]
            note = (
                f"; every grad norm {'they' if len(names) > 1 else 'it'} logged over steps "
                f"{w0:,}-{w1:,} was 0, as a frozen layer's: an unfreezing (a staged "
                "fine-tune), not a shift of the gradient, a note"
            )
        return Finding(
            kind=FindingKind.LAYER_GRAD_SHIFT,
            severity=Severity.INFO if last_only or frozen else Severity.WARNING,
            metric=GRAD_NORM_LAYER,
            start_step=onset,
            peak_step=int(round(xb[k_peak])),
            end_step=int(steps[-1]),
            onset_range=onset_range,
            measures={
                "layer": names[0],
                "layers": label,
                "n_layers": len(names),
                "n_layers_logged": len(layers),
                "share_definition": "squared",
                "share_before": b,
                "share_after": a,
                "share_ratio": a / b if b > 0 else None,
                "peak_share": float(smooth[k_peak]),
                "param_growth_group_pct_per_1k": pg,
                "param_growth_rest_pct_per_1k": pr,
                "param_growth_by_layer": by_layer or None,
                "frozen_before": frozen,
            },
            summary=(
                f"{'Layers' if len(names) > 1 else 'Layer'} {label} went from {100 * b:.0f}% "
                f"to {100 * a:.0f}% of the squared grad norm since step {onset:,}{param_txt}{note}."
            ),
            judged_against=judged,
        )


def _level_now(steps: np.ndarray, series: np.ndarray, late: np.ndarray, median: float) -> float:
    """The group's share at the end of the log: the late window's median or, where the share
    is still rising through that window (its Theil-Sen slope's 90% band above zero), the
    median of the window's second half. The median of a ramp is its middle: the article's
    8% -> 20% climb, still rising at the end, read as 8% -> 18% and missed the 10-point line.
    Only for groups without the deepest logged layer: deep blocks' shares creep up in healthy
    small models (truncated_log: blocks 1-3 of 4, 16% -> 29%, pass 2x near the end of their
    window), and the article's pattern is shallow layers."""
    fit = theil_sen(steps[late], series[late])
    if fit is None or not fit.rising:
        return median
    tail = series[late]
    return max(median, float(np.median(tail[len(tail) // 2 :])))


def _runs(idx: np.ndarray) -> list[np.ndarray]:
    """Split sorted indices into runs of neighbours."""
    if len(idx) == 0:
        return []
    return np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1)


class _Growth(NamedTuple):
    """A layer's param norm since the onset: its fitted growth rate (% of ``first`` per 1000
    steps), its level at the start and at the end (medians of three points) and the steps
    between them."""

    rate: float
    first: float
    last: float
    steps: int

    @property
    def to_nothing(self) -> bool:
        """The fitted line falls below zero before the end: a norm cannot, so the fall is
        no steady rate (weights decayed to nothing) and is told by its levels instead."""
        return self.rate * self.steps / 1000.0 < -100.0

    @property
    def change_pct(self) -> float:
        return 100.0 * (self.last - self.first) / self.first


def _param_growth(ev: Evidence, layers: list[int], since: int) -> dict[int, _Growth | None]:
    """Per-layer param-norm growth since ``since``, in % of the layer's level per 1000 steps."""
    out: dict[int, _Growth | None] = {}
    if not ev.run.layers(PARAM_NORM_LAYER):
        return out
    for layer in layers:
        s = ev.series(PARAM_NORM_LAYER, layer)
        x, y = s.steps[s.steps >= since], s.values[s.steps >= since]
        ts = theil_sen(x, y) if len(x) >= 3 else None
        lvl = float(np.median(y[:3])) if len(x) else 0.0
        out[layer] = (
            _Growth(100.0 * ts.per_1k() / lvl, lvl, float(np.median(y[-3:])), int(x[-1] - x[0]))
            if ts is not None and lvl
            else None
        )
    return out


def _rest_text(
    known: dict[int, _Growth], group: list[int], layers: list[int], since: int | None = None
) -> str:
    """The other layers' param-norm growth: each of up to three, else their median and range.
    Their mean alone ("-91.2% for the rest") hid one layer growing +34% beside two whose
    weights were being decayed to nothing. A layer whose norm fell to nothing is told by its
    levels ("layer 2's fell from 17.96 to 0.01361 (-99.9%)"), not by a rate (-138% per 1k
    steps over 890 steps: below zero)."""
    rest = [layer for layer in layers if layer not in set(group) and layer in known]
    steady = [layer for layer in rest if not known[layer].to_nothing]
    fell = [layer for layer in rest if known[layer].to_nothing]
    text = ""
    if len(steady) <= 3:
        text = _and([f"{_rate(known[layer].rate)}% for layer {layer}" for layer in steady])
    else:
        rates = [known[layer].rate for layer in steady]
        text = (
            f"{_rate(float(np.median(rates)))}% for the median other layer (from "
            f"{_rate(min(rates))}% to {_rate(max(rates))}%)"
        )
    if fell:
        when = f" since step {since:,}" if since is not None else ""
        if len(fell) <= 3:
            falls = [
                f"from {num(known[layer].first)} to {num(known[layer].last)} "
                f"({known[layer].change_pct:+.1f}%)"
                for layer in fell
            ]
            told = [f"layer {fell[0]}'s fell {falls[0]}"] + [
                f"layer {layer}'s {fall}" for layer, fall in zip(fell[1:], falls[1:], strict=True)
            ]
            fell_text = _and(told) + when
        else:
            pcts = sorted(-known[layer].change_pct for layer in fell)
            fell_text = f"layers {fmt_layers(fell)}'s fell by {pcts[0]:.1f}-{pcts[-1]:.1f}%{when}"
        text = f"{text}, while {fell_text}" if text else fell_text
    return text


def _and(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _rate(pct: float) -> str:
    """A growth rate in percent, with the digits that matter: "+2.30" (the article's scale),
    "+48.6", "+4,677" (a diverging run's param norms: "+4677.05" had read as noise)."""
    if abs(pct) >= 100:
        return f"{pct:+,.0f}"
    if abs(pct) >= 10:
        return f"{pct:+.1f}"
    return f"{pct:+.2f}"
