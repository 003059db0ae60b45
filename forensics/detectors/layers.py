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
training goes on, which is not this pattern). Per-layer param-norm growth rates are attached when logged.

Measures (kind ``layer_grad_shift``):

| key | meaning |
|---|---|
| `layer` | first layer index of the group |
| `layers` | the group, compact (``"0-3"``) |
| `n_layers` | layers in the group |
| `n_layers_logged` | layers with a grad-norm series |
| `share_definition` | ``"squared"``: norm^2 / sum of norm^2 over layers |
| `share_before` | group share in the early window (0..1) |
| `share_after` | group share over the last stretch (0..1) |
| `share_ratio` | share_after / share_before |
| `peak_share` | highest smoothed group share |
| `param_growth_group_pct_per_1k` | mean param-norm growth of the group, % per 1000 steps |
| `param_growth_rest_pct_per_1k` | same for the other layers |
| `param_growth_by_layer` | ``"layer:pct"`` list for every layer (null: not logged) |
"""

from __future__ import annotations

import numpy as np
import polars as pl

from forensics.evidence.trend_utils import (
    arrays,
    bin_median,
    fmt_layers,
    hinge_onset,
    robust_sigma,
    rolling_median,
    theil_sen,
    warmup_start,
)
from forensics.evidence import Evidence
from forensics.params import LayersParams
from forensics.findings import Finding, FindingKind, Severity
from forensics.run import Run
from forensics.schema import GRAD_NORM_LAYER, PARAM_NORM_LAYER

CHECK = "layer_grad_shift"


def layer_matrix(run: Run, metric: str) -> tuple[np.ndarray, list[int], np.ndarray]:
    """Steps x layers matrix of a per-layer series, keeping steps where every layer is finite."""
    layers = run.layers(metric)
    v = run.view().filter(pl.col("metric") == metric)
    if not layers or v.is_empty():
        return np.array([], dtype=np.int64), [], np.empty((0, 0))
    wide = (
        v.select("step", "layer", "value")
        .pivot(on="layer", index="step", values="value", aggregate_function="last")
        .sort("step")
    )
    cols = [str(l) for l in layers]
    mat = wide.select(cols).to_numpy().astype(float)
    ok = np.isfinite(mat).all(axis=1)
    return wide.get_column("step").to_numpy()[ok].astype(np.int64), layers, mat[ok]


class LayerGradShiftDetector:
    """Flags layer groups whose share of the total grad norm at least doubles."""

    name = CHECK

    def __init__(self, params: LayersParams | None = None) -> None:
        self.params = params or LayersParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        run = ev.run
        steps, layers, mat = layer_matrix(run, GRAD_NORM_LAYER)
        if len(layers) < 2:
            run.note(f"{CHECK}: not run, the run has no per-layer grad norms (grad_norm_layer)")
            return []
        if len(steps) < self.params.min_points:
            run.note(f"{CHECK}: not run, only {len(steps)} steps with every layer's grad norm")
            return []
        sq = mat**2
        tot = sq.sum(axis=1)
        keep = tot > 0
        steps, share = steps[keep], sq[keep] / tot[keep, None]
        if len(steps) < self.params.min_points:
            run.note(f"{CHECK}: not run, the per-layer grad norms are all zero")
            return []
        # The shares reorganise in the first steps (the first tenth of the log, or the LR
        # warm-up when longer): the early window starts after that.
        first = int(steps[0])
        start = max(warmup_start(run, steps) or first, first + int(0.1 * (int(steps[-1]) - first)))
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
        out = []
        for grp in _runs(np.flatnonzero(grew)):
            b, a = float(before[grp].sum()), float(after[grp].sum())
            series = share[:, grp].sum(axis=1)
            small = (a - b) < self.params.min_increase or (a - b) <= self.params.noise_k * robust_sigma(series)
            if a < self.params.min_share or a < self.params.group_ratio * b or small:
                continue
            out.append(self._finding(run, steps, series, grp, layers, b, a, start))
        return out

    def _finding(
        self,
        run: Run,
        steps: np.ndarray,
        series: np.ndarray,
        grp: np.ndarray,
        layers: list[int],
        b: float,
        a: float,
        start: int,
    ) -> Finding:
        names = [layers[i] for i in grp]
        xb, yb = bin_median(steps.astype(float), series, max_bins=200)
        smooth = rolling_median(yb, 5)
        sel = xb >= start
        h = hinge_onset(xb[sel], smooth[sel])
        if h is not None and h[2] > 0 and h[2] > h[1]:
            onset = h[0]
        else:  # fall back to the half-way crossing after the start-up
            half = sel & (smooth >= b + 0.5 * (a - b))
            onset = int(round(xb[int(np.argmax(half))])) if half.any() else start
        growth = _param_growth(run, layers, onset)
        in_grp = set(names)
        g_rates = [growth[l] for l in names if growth.get(l) is not None]
        r_rates = [growth[l] for l in layers if l not in in_grp and growth.get(l) is not None]
        label = fmt_layers(names)
        by_layer = ",".join(f"{l}:{growth[l]:+.2f}" for l in layers if growth.get(l) is not None)
        pg = float(np.mean(g_rates)) if g_rates else None
        pr = float(np.mean(r_rates)) if r_rates else None
        param_txt = ""
        if pg is not None and pr is not None:
            whose = "their param norms grow" if len(names) > 1 else "its param norm grows"
            param_txt = f"; {whose} {pg:+.2f}%/1k steps vs {pr:+.2f}% for the rest"
        return Finding(
            kind=FindingKind.LAYER_GRAD_SHIFT,
            severity=Severity.WARNING,
            metric=GRAD_NORM_LAYER,
            start_step=onset,
            peak_step=int(round(xb[int(np.argmax(smooth))])),
            end_step=int(steps[-1]),
            measures={
                "layer": names[0],
                "layers": label,
                "n_layers": len(names),
                "n_layers_logged": len(layers),
                "share_definition": "squared",
                "share_before": b,
                "share_after": a,
                "share_ratio": a / b if b > 0 else None,
                "peak_share": float(smooth.max()),
                "param_growth_group_pct_per_1k": pg,
                "param_growth_rest_pct_per_1k": pr,
                "param_growth_by_layer": by_layer or None,
            },
            summary=(
                f"{'Layers' if len(names) > 1 else 'Layer'} {label} went from {100 * b:.0f}% to {100 * a:.0f}% of the squared grad norm "
                f"since step {onset}{param_txt}."
            ),
        )


def _runs(idx: np.ndarray) -> list[np.ndarray]:
    """Split sorted indices into runs of neighbours."""
    if len(idx) == 0:
        return []
    return np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1)


def _param_growth(run: Run, layers: list[int], since: int) -> dict[int, float | None]:
    """Per-layer param-norm growth since ``since``, in % of the layer's level per 1000 steps."""
    out: dict[int, float | None] = {}
    if not run.layers(PARAM_NORM_LAYER):
        return out
    for l in layers:
        x, y = arrays(run, PARAM_NORM_LAYER, l)
        sel = x >= since
        ts = theil_sen(x[sel], y[sel]) if sel.sum() >= 3 else None
        lvl = float(np.median(y[sel][:3])) if sel.sum() else 0.0
        out[l] = 100.0 * ts.per_1k() / lvl if ts is not None and lvl else None
    return out
