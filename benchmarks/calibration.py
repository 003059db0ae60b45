"""How close each detector comes to firing on healthy runs: its peak score vs its threshold.

    python benchmarks/calibration.py            # every healthy run (sample_runs + real_runs)
    python benchmarks/calibration.py --markdown # the table for the README

The healthy runs are tests/test_calibration.py's (benchmarks/tools_compare.py names them). For
each run and each detector the score the detector is judged on, at its worst point of the run,
read from the evidence layer (forensics.evidence) with the default parameters:

* grad_norm_drift: the recent grad norm over the level it is judged from (``Evidence.drift``
  ``ratio``: the baseline after the warm-up, or where the grad norm settled when it went on
  falling below 0.8x of it), threshold 2x (params.GRAD_NORM_WARN); where the drift analysis
  reports it, the ratio over the schedule's expected rise (``excess``) beside it.
* loss_spike / grad_norm_spike: the highest robust z (forensics.evidence.robust.score with the
  spike parameters) among points that also pass the height gate (loss 1.15x, grad norm 2x its
  baseline), after the warm-up; threshold z 6.
* gap_acceleration: at each eval, the smaller of (growth over the last window / growth over
  the window before) and (1.5 x growth / noise floor), the weaker of two evals in a row (the
  detector's confirmation): it can fire only when this exceeds 1.5 (``Evidence.gap``'s growths
  and floor; the detector also wants the widening to hold a window later).
* throughput_drop: the largest fall of the smoothed throughput below its rolling baseline held
  for 3 points (the detector's minimum), threshold 30%.
* throughput_decline: the same detector's slow-decline check: how far the median of the log's
  last tenth sits below the median of its early tenth (after the first twentieth), threshold
  30% (the detector also wants a falling trend).

The margin is threshold / peak: above 1 the detector stays quiet with that much room.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from tools_compare import HEALTHY_REAL, HEALTHY_SAMPLES, REAL, SAMPLES, _read  # noqa: E402

CHECKS = [
    "grad_norm_drift",
    "loss_spike",
    "grad_norm_spike",
    "grad_norm_surge",
    "gap_acceleration",
    "throughput_drop",
    "throughput_decline",
]


def drift_score(ev: Any) -> tuple[float | None, float]:
    d = ev.drift
    thr = float(ev.params.grad_norm_drift.warn_ratio)
    if d is None:
        return None, thr
    r = d.measures.get("ratio")
    return (float(r) if r is not None else None), thr


def spike_score(ev: Any, metric: str) -> tuple[float | None, float]:
    from forensics.evidence.robust import score

    p = ev.params.spikes
    thr = float(p.z_threshold)
    s = ev.series(metric)
    if len(s) < 10:
        return None, thr
    sc = score(s.steps, s.values, window=p.window, min_side=p.min_side, sigma_floor=p.sigma_floor)
    gate = p.loss_min_ratio if metric == "loss" else p.grad_norm_min_ratio
    start = ev.warmup_end or 0
    ok = sc.filter((pl.col("step") > start) & (pl.col("ratio") >= gate))
    z = ok.get_column("z").drop_nulls()
    top = z.max()
    return (float(top) if isinstance(top, (int, float)) else 0.0), thr


def surge_score(ev: Any) -> tuple[float | None, float]:
    """The highest peak over the level it left among the grad norm's stretches above the
    band's moving warning line (``forensics.evidence.surges``), 0 without one; threshold
    ``grad_norm_min_ratio`` (a surge also stays clear of the spikes, drift and divergence)."""
    from forensics.evidence.surges import heights

    thr = float(ev.params.spikes.grad_norm_min_ratio)
    if not ev.has("grad_norm") or ev.grad_norm_band is None:
        return None, thr
    hs = [h for h in heights(ev, "grad_norm") if h == h]
    return (max(hs) if hs else 0.0), thr


def gap_score(ev: Any) -> tuple[float | None, float]:
    thr = float(ev.params.train_val.accel_ratio)
    g = ev.gap
    if g is None or len(g) < 3:
        return None, thr
    last, prev, floor = g.growth_last, g.growth_prev, g.growth_floor
    with np.errstate(invalid="ignore", divide="ignore"):
        by_prev = np.where(prev > 0, last / prev, np.where(last > 0, np.inf, 0.0))
        by_floor = thr * last / floor
        s = np.minimum(by_prev, by_floor)
    s = np.where(np.isfinite(last), s, 0.0)
    # the detector needs `confirm` evals in a row (params.train_val.confirm): the weakest of them
    held = pl.Series(s).rolling_min(int(ev.params.train_val.confirm)).to_numpy()
    held = held[~np.isnan(held)]
    return (float(np.max(held)) if len(held) else 0.0), thr


def throughput_score(ev: Any) -> tuple[float | None, float]:
    from forensics.evidence.trend_utils import rolling_median

    p = ev.params.throughput
    thr = float(p.drop)
    y = _rate(ev)
    if len(y) < p.min_history + p.min_points:
        return None, thr
    smooth = rolling_median(y, p.smooth_points)
    base = (
        pl.Series(y)
        .rolling_median(p.baseline_points, min_samples=p.min_history)
        .shift(1)
        .to_numpy()
        .astype(float)
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        drop = 1.0 - smooth / base
    drop = np.nan_to_num(drop, nan=-np.inf)
    held = pl.Series(drop).rolling_min(p.min_points).to_numpy()
    held = held[np.isfinite(held)]
    return (float(max(0.0, held.max())) if len(held) else 0.0), thr


def _rate(ev: Any) -> np.ndarray:
    y = ev.series("throughput").values
    if len(y) == 0:
        st = ev.series("step_time")
        y = 1.0 / st.values[st.values > 0]
    return y


def decline_score(ev: Any) -> tuple[float | None, float]:
    p = ev.params.throughput
    thr = float(p.drop)
    y = _rate(ev)
    n = len(y)
    skip, w = max(p.min_history, n // 20), max(p.decline_points, n // 10)
    if n < skip + 2 * w:
        return None, thr
    early, late = float(np.median(y[skip : skip + w])), float(np.median(y[n - w :]))
    return (max(0.0, 1.0 - late / early) if early > 0 else None), thr


def scores(run: Any) -> dict[str, tuple[float | None, float]]:
    from forensics.evidence import Evidence

    ev = Evidence(run)
    return {
        "grad_norm_drift": drift_score(ev),
        "loss_spike": spike_score(ev, "loss"),
        "grad_norm_spike": spike_score(ev, "grad_norm"),
        "grad_norm_surge": surge_score(ev),
        "gap_acceleration": gap_score(ev),
        "throughput_drop": throughput_score(ev),
        "throughput_decline": decline_score(ev),
    }


def healthy_runs(real: bool = True) -> list[tuple[str, Any]]:
    out = []
    for name in HEALTHY_SAMPLES:
        for _, _, run in _read(SAMPLES / name, None):
            out.append((f"sample_runs/{name}", run))
    if real and REAL.is_dir():
        for folder, job in HEALTHY_REAL:
            for name, _, run in _read(REAL / folder, job):
                out.append((f"{folder}:{name}", run))
    return out


def fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    return "inf" if math.isinf(v) else f"{v:.3g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print only the tables")
    ap.add_argument("--samples-only", action="store_true", help="leave ../shared/real_runs out")
    args = ap.parse_args()
    rows = [(name, scores(run)) for name, run in healthy_runs(real=not args.samples_only)]
    print("| healthy run | " + " | ".join(CHECKS) + " |")
    print("|---|" + "---|" * len(CHECKS))
    for name, sc in rows:
        print(f"| {name} | " + " | ".join(fmt(sc[c][0]) for c in CHECKS) + " |")
    print()
    print(
        "| detector | threshold | peak on healthy runs (run) | margin (threshold / peak) "
        "| runs over |"
    )
    print("|---|---|---|---|---|")
    for c in CHECKS:
        vals = [(v, name) for name, sc in rows if (v := sc[c][0]) is not None]
        thr = rows[0][1][c][1] if rows else float("nan")
        if not vals:
            print(f"| {c} | {thr:g} | n/a | n/a | 0/0 |")
            continue
        peak, where = max(vals, key=lambda t: t[0])
        over = sum(v > thr for v, _ in vals)
        margin = thr / peak if peak > 0 else math.inf
        print(f"| {c} | {thr:g} | {fmt(peak)} ({where}) | {fmt(margin)} | {over}/{len(vals)} |")
    if not args.markdown:
        print("\nmargin > 1: the threshold sits that factor above the worst healthy score.")


if __name__ == "__main__":
    main()
