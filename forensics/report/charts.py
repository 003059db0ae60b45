"""One plotly figure per vital sign, as plain JSON-ready dicts, with the findings marked.

Figures are built as dicts (not plotly.graph_objects) so that size and escaping stay under
our control: every series is min/max-decimated (keeping each finding's peak), numbers are
written with 6 significant digits, and every string that came from a log is HTML-escaped
before it reaches plotly (whose labels accept a little HTML).
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forensics.checklists import run_layers, run_metrics, run_series
from forensics.findings import Finding, FindingKind
from forensics.report.downsample import DEFAULT_BUCKETS, bucket_mean, downsample
from forensics.run import Run
from forensics.schema import (
    ACT_ABSMAX,
    GRAD_NORM,
    GRAD_NORM_LAYER,
    LOSS,
    LOSS_SCALE,
    LR,
    MEMORY,
    PARAM_NORM,
    STEP_TIME,
    THROUGHPUT,
    VAL_LOSS,
    lower_is_better,
)

SEVERITY_COLOURS = {
    "info": "#4c78a8",
    "warning": "#e0b000",
    "critical": "#f07f0e",
    "fatal": "#d62728",
}
TB_SMOOTHING = 0.6  # TensorBoard's default smoothing weight
HEATMAP_COLUMNS = 300
MAX_EVAL_TRACES = 12
MAX_MARKS = 200  # findings marked per panel


@dataclass
class Panel:
    key: str
    title: str
    caption: str
    figure: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)

    def json(self) -> str:
        return figure_json(self.figure)


def figure_json(fig: dict[str, Any]) -> str:
    """JSON safe to put inside a <script> element: no "<", ">" or "&" survive literally."""
    text = json.dumps(fig, allow_nan=False, separators=(",", ":"))
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def esc(text: object) -> str:
    """Escape untrusted text for plotly labels (plotly turns the entities back into plain text)."""
    return html.escape(str(text), quote=True)


def _nums(a: np.ndarray) -> list[float | None]:
    return [
        float(f"{v:.6g}") if math.isfinite(v) else None for v in np.asarray(a, dtype=float).tolist()
    ]


def _ints(a: np.ndarray) -> list[int]:
    return [int(v) for v in np.asarray(a).tolist()]


def tb_smooth(y: np.ndarray, weight: float = TB_SMOOTHING) -> np.ndarray:
    """TensorBoard's debiased exponential moving average (non-finite points pass through)."""
    from scipy.signal import lfilter

    y = np.asarray(y, dtype=float)
    out = y.copy()
    ok = np.isfinite(y)
    v = y[ok]
    if len(v) == 0 or weight <= 0 or np.all(v == v[0]):
        return out
    last = lfilter([1.0 - weight], [1.0, -weight], v)
    debias = 1.0 - weight ** np.arange(1, len(v) + 1)
    out[ok] = last / debias
    return out


def smoothing_weight(n: int, buckets: int) -> float:
    """TensorBoard's 0.6, raised for long series so the smoothed line spans about a bucket."""
    per_bucket = n / max(1, buckets)
    if n <= 4 * buckets:  # not decimated: the curve TensorBoard users know
        return TB_SMOOTHING
    return float(min(0.999, max(TB_SMOOTHING, 1.0 - 1.0 / per_bucket)))


def _arrays(run: Run, metric: str, layer: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    s = run_series(run, metric, layer=layer)
    return s.get_column("step").to_numpy().astype(np.int64), s.get_column(
        "value"
    ).to_numpy().astype(float)


def _layout(title: str, ytitle: str, **extra: Any) -> dict[str, Any]:
    lay: dict[str, Any] = {
        "title": {"text": esc(title), "x": 0.01, "font": {"size": 14}},
        "height": 320,
        "margin": {"l": 60, "r": 20, "t": 36, "b": 40},
        "xaxis": {"title": {"text": "step"}, "zeroline": False},
        "yaxis": {"title": {"text": esc(ytitle)}, "zeroline": False},
        "legend": {"orientation": "h", "y": -0.25},
        "hovermode": "closest",
        "plot_bgcolor": "#fff",
        "paper_bgcolor": "#fff",
        "shapes": [],
    }
    lay.update(extra)
    return lay


def _line(x: np.ndarray, y: np.ndarray, name: str, **kw: Any) -> dict[str, Any]:
    return {
        "type": "scatter",
        "mode": "lines",
        "x": _ints(x),
        "y": _nums(y),
        "name": esc(name),
        **kw,
    }


def _keep_steps(findings: list[Finding]) -> np.ndarray:
    steps = [s for f in findings for s in (f.start_step, f.peak_step, f.end_step) if s is not None]
    return np.array(sorted(set(steps)), dtype=np.int64)


def _value_at(x: np.ndarray, y: np.ndarray, step: int) -> float | None:
    if len(x) == 0:
        return None
    i = int(np.clip(np.searchsorted(x, step), 0, len(x) - 1))
    if i > 0 and abs(x[i - 1] - step) < abs(x[i] - step):
        i -= 1
    v = float(y[i])
    return v if math.isfinite(v) else None


def mark_findings(
    fig: dict[str, Any],
    findings: list[Finding],
    x: np.ndarray | None = None,
    y: np.ndarray | None = None,
    name: str = "findings",
) -> None:
    """Shade each finding's span, and put a hoverable marker at its peak on the panel's series.

    At most :data:`MAX_MARKS` findings per panel, the most severe first, so that a run with
    thousands of small findings still gives a readable chart and a small file.
    """
    if len(findings) > MAX_MARKS:
        findings = sorted(findings, key=lambda f: (-f.severity.rank, f.start_step))[:MAX_MARKS]
        fig["layout"].setdefault("annotations", []).append(
            {
                "xref": "paper",
                "yref": "paper",
                "x": 1,
                "y": 1.08,
                "showarrow": False,
                "font": {"size": 11, "color": "#666"},
                "text": f"{MAX_MARKS} most severe findings marked",
            }
        )
    shapes = fig["layout"].setdefault("shapes", [])
    mx: list[int] = []
    my: list[float | None] = []
    texts: list[str] = []
    colours: list[str] = []
    for f in findings:
        colour = SEVERITY_COLOURS[f.severity.value]
        end = f.end_step if f.end_step is not None else f.start_step
        if end > f.start_step:
            shapes.append(
                {
                    "type": "rect",
                    "xref": "x",
                    "yref": "paper",
                    "x0": f.start_step,
                    "x1": end,
                    "y0": 0,
                    "y1": 1,
                    "fillcolor": colour,
                    "opacity": 0.15,
                    "line": {"width": 0},
                    "layer": "below",
                }
            )
        else:
            shapes.append(
                {
                    "type": "line",
                    "xref": "x",
                    "yref": "paper",
                    "x0": f.start_step,
                    "x1": f.start_step,
                    "y0": 0,
                    "y1": 1,
                    "line": {"color": colour, "width": 1.5, "dash": "dot"},
                }
            )
        at = f.peak_step if f.peak_step is not None else f.start_step
        val = _value_at(x, y, at) if x is not None and y is not None else None
        if val is None:
            continue
        mx.append(at)
        my.append(float(f"{val:.6g}"))
        texts.append(
            esc(f"{f.kind.value} ({f.severity.value}), step {f.start_step:,}: {f.summary}")
        )
        colours.append(colour)
    if mx:
        fig["data"].append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": mx,
                "y": my,
                "name": name,
                "hovertext": texts,
                "hoverinfo": "text",
                "marker": {
                    "color": colours,
                    "size": 11,
                    "symbol": "diamond",
                    "line": {"color": "#000", "width": 1},
                },
            }
        )


def _series_panel(
    run: Run,
    metric: str,
    title: str,
    ytitle: str,
    fs: list[Finding],
    buckets: int,
    caption: str = "",
    log_y: bool = False,
    colour: str = "#1f77b4",
) -> Panel | None:
    x, y = _arrays(run, metric)
    if len(x) == 0:
        return None
    dx, dy = downsample(x, y, buckets, _keep_steps(fs))
    fig = {
        "data": [
            _line(
                dx, dy, run_metrics(run).get(metric, metric), line={"color": colour, "width": 1.2}
            )
        ],
        "layout": _layout(title, ytitle),
    }
    if log_y:
        fig["layout"]["yaxis"]["type"] = "log"
    mark_findings(fig, fs, x, y)
    return Panel(metric, title, caption, fig, fs)


def loss_panel(run: Run, fs: list[Finding], buckets: int) -> Panel | None:
    x, y = _arrays(run, LOSS)
    if len(x) == 0:
        return None
    w = smoothing_weight(len(x), buckets)
    sm = tb_smooth(y, w)
    keep = _keep_steps(fs)
    rx, ry = downsample(x, y, buckets, keep)
    sx, sy = downsample(x, sm, buckets, keep)
    fig = {
        "data": [
            _line(rx, ry, "raw", line={"color": "#9ecae1", "width": 1}),
            _line(sx, sy, "smoothed", line={"color": "#08519c", "width": 1.8}),
        ],
        "layout": _layout("Training loss", "loss"),
    }
    mark_findings(fig, fs, x, y)
    cap = f"Raw values (light) and TensorBoard's debiased exponential moving average with weight {w:.3g}"
    cap += (
        " (TensorBoard's default)."
        if w == TB_SMOOTHING
        else f" (raised from TensorBoard's 0.6 because the run has {len(x):,} points)."
    )
    return Panel(LOSS, "Training loss", cap, fig, fs)


def grad_norm_panel(run: Run, fs: list[Finding], buckets: int) -> Panel | None:
    from forensics.evidence.baseline import grad_norm_baseline

    x, y = _arrays(run, GRAD_NORM)
    if len(x) == 0:
        return None
    dx, dy = downsample(x, y, buckets, _keep_steps(fs))
    fig = {
        "data": [_line(dx, dy, "grad norm", line={"color": "#2ca02c", "width": 1.2})],
        "layout": _layout("Gradient norm", "grad norm"),
    }
    cap = "No baseline: too few finite points."
    base = grad_norm_baseline(run)
    if base is not None and math.isfinite(base.value):
        ends = np.array([x[0], x[-1]])
        for mult, colour, name in (
            (1, "#666", "baseline"),
            (2, SEVERITY_COLOURS["warning"], "2x baseline (yellow)"),
            (3, SEVERITY_COLOURS["critical"], "3x baseline (orange)"),
        ):
            fig["data"].append(
                _line(
                    ends,
                    np.full(2, mult * base.value),
                    name,
                    line={"color": colour, "width": 1, "dash": "dash"},
                )
            )
        cap = f"Baseline {base.value:.4g} ({base.how}); the article warns at 2x and calls 3x critical."
    mark_findings(fig, fs, x, y)
    return Panel(GRAD_NORM, "Gradient norm", cap, fig, fs)


def train_val_panel(run: Run, fs: list[Finding], buckets: int) -> Panel | None:
    vx, vy = _arrays(run, VAL_LOSS)
    if len(vx) == 0:
        return None
    fig: dict[str, Any] = {
        "data": [],
        "layout": _layout(
            "Training vs validation loss",
            "loss",
            yaxis2={
                "title": {"text": "gap (val - train)"},
                "overlaying": "y",
                "side": "right",
                "showgrid": False,
                "zeroline": False,
            },
        ),
    }
    fig["layout"]["margin"]["r"] = 70
    tx, ty = _arrays(run, LOSS)
    cap = "Validation loss only: the run has no training loss to compare with."
    if len(tx):
        sm = tb_smooth(ty, smoothing_weight(len(tx), buckets))
        sx, sy = downsample(tx, sm, buckets)
        fig["data"].append(
            _line(sx, sy, "train (smoothed)", line={"color": "#08519c", "width": 1.5})
        )
        ok = np.isfinite(sm)
        if ok.sum() >= 2:
            gap = vy - np.interp(vx, tx[ok], sm[ok])
            fig["data"].append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "x": _ints(vx),
                    "y": _nums(gap),
                    "name": "gap",
                    "yaxis": "y2",
                    "line": {"color": "#9467bd", "dash": "dot"},
                }
            )
            cap = "Validation loss against the smoothed training loss; the dotted line (right axis) is the gap."
    dvx, dvy = downsample(vx, vy, buckets, _keep_steps(fs))
    fig["data"].append(
        {
            "type": "scatter",
            "mode": "lines+markers",
            "x": _ints(dvx),
            "y": _nums(dvy),
            "name": "validation",
            "line": {"color": "#d62728"},
            "marker": {"size": 5},
        }
    )
    mark_findings(fig, fs, vx, vy)
    return Panel(VAL_LOSS, "Training vs validation loss", cap, fig, fs)


def eval_panel(run: Run, fs: list[Finding], buckets: int) -> Panel | None:
    evals = sorted(m for m in run_metrics(run) if m.startswith("eval/"))
    if not evals:
        return None
    fig: dict[str, Any] = {"data": [], "layout": _layout("Evaluation metrics", "score")}
    for m in evals[:MAX_EVAL_TRACES]:
        x, y = _arrays(run, m)
        dx, dy = downsample(x, y, buckets, _keep_steps([f for f in fs if f.metric == m]))
        label = m[5:] + (" (lower is better)" if lower_is_better(m) else "")
        fig["data"].append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "x": _ints(dx),
                "y": _nums(dy),
                "name": esc(label),
                "marker": {"size": 4},
            }
        )
    fig["layout"]["showlegend"] = True
    for f in fs:
        x, y = _arrays(run, f.metric) if f.metric else (None, None)
        mark_findings(fig, [f], x, y)
    cap = f"{len(evals)} evaluation metric(s)" + (
        f"; the first {MAX_EVAL_TRACES} are drawn." if len(evals) > MAX_EVAL_TRACES else "."
    )
    return Panel("eval", "Evaluation metrics", cap, fig, fs)


def _layer_matrix(run: Run, metric: str) -> tuple[np.ndarray, list[int], np.ndarray] | None:
    import polars as pl

    layers = run_layers(run, metric)
    if not layers:
        return None
    v = run.view().filter(pl.col("metric") == metric).select("step", "layer", "value")
    wide = (
        v.group_by("step", "layer")
        .agg(pl.col("value").last())
        .pivot(on="layer", index="step", values="value")
        .sort("step")
    )
    steps = wide.get_column("step").to_numpy().astype(np.int64)
    z = np.stack([wide.get_column(str(layer)).to_numpy().astype(float) for layer in layers])
    return steps, layers, z


def layer_share_panel(run: Run, fs: list[Finding]) -> Panel | None:
    got = _layer_matrix(run, GRAD_NORM_LAYER)
    if got is None:
        return None
    steps, layers, z = got
    sq = np.where(np.isfinite(z), z, np.nan) ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        share = sq / np.nansum(sq, axis=0, keepdims=True)
    xs, zs = bucket_mean(steps, share, HEATMAP_COLUMNS)
    fig = {
        "data": [
            {
                "type": "heatmap",
                "x": _ints(xs),
                "y": [str(layer) for layer in layers],
                "z": [_nums(row * 100) for row in zs],
                "colorscale": "Viridis",
                "colorbar": {"title": {"text": "% of grad norm^2"}},
                "hovertemplate": "step %{x}<br>layer %{y}<br>%{z:.1f}%<extra></extra>",
            }
        ],
        "layout": _layout(
            "Per-layer share of the gradient", "layer", height=max(260, 60 + 14 * len(layers))
        ),
    }
    fig["layout"]["yaxis"]["type"] = "category"
    mark_findings(fig, fs)
    return Panel(
        GRAD_NORM_LAYER,
        "Per-layer share of the gradient",
        "Each layer's squared gradient norm as a share of the sum over layers (shares add up to 100% per step).",
        fig,
        fs,
    )


def activation_panel(run: Run, fs: list[Finding]) -> Panel | None:
    got = _layer_matrix(run, ACT_ABSMAX)
    if got is None:
        return None
    steps, layers, z = got
    with np.errstate(divide="ignore", invalid="ignore"):
        lz = np.log10(np.abs(z))
    lz[~np.isfinite(lz)] = np.nan
    xs, zs = bucket_mean(steps, lz, HEATMAP_COLUMNS)
    fig = {
        "data": [
            {
                "type": "heatmap",
                "x": _ints(xs),
                "y": [str(layer) for layer in layers],
                "z": [_nums(row) for row in zs],
                "colorscale": "Magma",
                "colorbar": {"title": {"text": "log10 |act| max"}},
            }
        ],
        "layout": _layout(
            "Activation maxima per layer", "layer", height=max(260, 60 + 14 * len(layers))
        ),
    }
    fig["layout"]["yaxis"]["type"] = "category"
    mark_findings(fig, fs)
    return Panel(
        ACT_ABSMAX,
        "Activation maxima per layer",
        "log10 of each layer's largest absolute activation; the article treats values past 1e4 (4 here) as a problem layer.",
        fig,
        fs,
    )


# Which findings a panel shows, by the metric they are about.
_PANEL_METRICS: dict[str, set[str | None]] = {
    LOSS: {LOSS},
    GRAD_NORM: {GRAD_NORM, "grad_norm_clipped"},
    PARAM_NORM: {PARAM_NORM, "param_norm_layer"},
    LR: {LR},
    LOSS_SCALE: {LOSS_SCALE, "overflow"},
    VAL_LOSS: {VAL_LOSS},
    THROUGHPUT: {THROUGHPUT},
    STEP_TIME: {STEP_TIME},
    MEMORY: {MEMORY},
    GRAD_NORM_LAYER: {GRAD_NORM_LAYER},
    ACT_ABSMAX: {ACT_ABSMAX, "act_std", "act_mean"},
}


def build_panels(
    run: Run, findings: list[Finding], *, buckets: int = DEFAULT_BUCKETS
) -> list[Panel]:
    """Every vital-sign panel the run has data for, each with its findings marked."""

    def about(*metrics: str | None) -> list[Finding]:
        return [f for f in findings if f.metric in metrics]

    evals = [f for f in findings if f.metric and f.metric.startswith("eval/")]
    builders = [
        lambda: loss_panel(run, about(LOSS), buckets),
        lambda: grad_norm_panel(run, about(*_PANEL_METRICS[GRAD_NORM]), buckets),
        lambda: _series_panel(
            run,
            PARAM_NORM,
            "Parameter norm",
            "param norm",
            about(*_PANEL_METRICS[PARAM_NORM]),
            buckets,
            "Should grow slowly under AdamW; a jump means oversized updates.",
            colour="#8c564b",
        ),
        lambda: _series_panel(run, LR, "Learning rate", "lr", about(LR), buckets, colour="#7f7f7f"),
        lambda: _series_panel(
            run,
            LOSS_SCALE,
            "Loss scale",
            "loss scale",
            about(*_PANEL_METRICS[LOSS_SCALE]),
            buckets,
            "Mixed-precision loss scale (log axis); a sharp drop marks overflowing gradients.",
            log_y=True,
            colour="#17becf",
        ),
        lambda: train_val_panel(run, about(VAL_LOSS), buckets),
        lambda: eval_panel(run, evals, buckets),
        lambda: _series_panel(
            run, THROUGHPUT, "Throughput", "tokens/s", about(THROUGHPUT), buckets, colour="#bcbd22"
        ),
        lambda: _series_panel(
            run,
            STEP_TIME,
            "Step time",
            "time per step",
            about(STEP_TIME),
            buckets,
            colour="#bcbd22",
        ),
        lambda: _series_panel(
            run, MEMORY, "Memory", "memory", about(MEMORY), buckets, colour="#e377c2"
        ),
        lambda: layer_share_panel(run, about(GRAD_NORM_LAYER)),
        lambda: activation_panel(run, about(*_PANEL_METRICS[ACT_ABSMAX])),
    ]
    panels = [p for p in (b() for b in builders) if p is not None]
    # Findings with no panel of their own (run-level ones, unplotted metrics) go on the first panel.
    placed = {id(f) for p in panels for f in p.findings}
    rest = [f for f in findings if id(f) not in placed]
    if rest and panels:
        first = panels[0]
        main = first.figure["data"][0]
        if main.get("type") != "heatmap":
            x = np.array(main["x"], dtype=np.int64)
            y = np.array([np.nan if v is None else v for v in main["y"]], dtype=float)
            mark_findings(first.figure, rest, x, y, name="run-level findings")
        else:
            mark_findings(first.figure, rest)
        first.findings = first.findings + rest
    return panels


SPIKE_KINDS = (FindingKind.LOSS_SPIKE, FindingKind.GRAD_NORM_SPIKE)
