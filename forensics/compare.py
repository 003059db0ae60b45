"""`forensics compare`: runs side by side (verdicts, vital signs, where the losses part ways).

Each run is analysed as ``forensics analyze`` would (one :class:`~forensics.evidence.Evidence`
per run, with the configured parameters); the cross-run measures read those evidences' series.
The HTML page is rendered by :mod:`forensics.report.compare_page`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from forensics.evidence import Evidence
from forensics.findings import Finding, FindingKind, Severity, look, onset_at, step_range
from forensics.schema import (
    EVAL_PREFIX,
    GRAD_NORM,
    LOSS,
    LOSS_SCALE,
    LR,
    MEMORY,
    PARAM_NORM,
    THROUGHPUT,
    VAL_LOSS,
)

if TYPE_CHECKING:
    from forensics.config import Config
    from forensics.diagnosis import Diagnosis
    from forensics.run import Run

VITALS = (LOSS, VAL_LOSS, GRAD_NORM, PARAM_NORM, LR, LOSS_SCALE, THROUGHPUT, MEMORY)
# The signs the training computes: where runs part. Throughput and memory are the machine's and
# differ between any two runs, so they are overlaid but not judged for parting.
TRAINING_SIGNS = (LOSS, VAL_LOSS, GRAD_NORM, PARAM_NORM, LR, LOSS_SCALE)
ALIGNS = ("step", "tokens", "samples", "time")
# Where a run leaves the reference's band. The band's half-width is estimated from the data:
# BAND_K times the reference's step-to-step noise (a robust sigma of its successive differences,
# local over BAND_WINDOW points) and, when at least RUN_TO_RUN_MIN other runs log the sign,
# RUN_TO_RUN_K times their typical (median) distance from the reference at that point.
BAND_K = 4.0
# The band is never narrower than this share of the value: float32 storage precision (8
# units in the last place), so one value logged by two writers never parts.
FLOAT32_REL = 2.0**-20
RUN_TO_RUN_K = 3.0
RUN_TO_RUN_MIN = 3
BAND_WINDOW = 101
# A point outside the band parts the runs when the excursion holds: PART_HOLD of the
# PART_POINTS points from it are out (a spike both runs take at one step, with different
# heights, is a shared event, not a parting).
PART_POINTS = 5
PART_HOLD = 3
# ... and it stands out from the scatter the difference itself had over the BAND_WINDOW
# points before (a robust sigma, 0 where the runs were identical): the level moved (the
# median difference over the LEVEL_POINTS points from it lies on the same side, beyond half
# the band and beyond LEVEL_K sigmas). The LR, a setting rather than a measurement, also
# parts where all PART_POINTS points are out on one side, each beyond POINT_K sigmas (an LR
# raised 50x for 10 steps). On a long noisy log (two llm.c GPT-2 runs of one config, 19,552
# steps: 2% of the loss points outside the band by noise alone, grad norms that bump or wobble
# for five to ten steps at a time in one run) three outliers in five points, even six in a
# row, happen by chance; a level beyond the difference's own earlier scatter does not.
LEVEL_POINTS = 21
LEVEL_K = 3.0
POINT_K = 3.0
SAME_STEP = 2  # findings of one kind at most this many steps apart are "at the same step"
SHARED_SHOWN = 10  # shared spikes printed in the terminal; the report lists up to MAX_ROWS
SIDE_SHOWN = 5  # findings only in one run printed a side; the report and --json list them all
SPIKE_KINDS = ("loss_spike", "grad_norm_spike")
SEED_KEYS = ("seed", "random_seed", "data_seed", "training.seed", "args.seed")


@dataclass
class Comparison:
    """What `forensics compare` shows: one Diagnosis per run plus cross-run measures."""

    diagnoses: list[Diagnosis]
    labels: list[str]
    vitals: dict[
        str, list[dict[str, float | int | None] | None]
    ]  # metric -> per run: final, best, points
    part_ways: list[dict[str, Any] | None]  # per run (vs the reference): where the loss parts
    reference: int = 0
    align: str = "step"
    partings: dict[str, list[dict[str, Any] | None]] = field(default_factory=dict)
    first_parting: list[dict[str, Any] | None] = field(default_factory=list)
    finding_diff: list[dict[str, Any] | None] = field(default_factory=list)
    shared_spikes: list[dict[str, Any]] = field(default_factory=list)
    config_diff: dict[str, list[Any]] = field(default_factory=dict)
    why: list[str | None] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what to know before reading the steps

    def to_document(self) -> dict[str, Any]:
        return {
            "schema_version": 2,
            "reference": self.labels[self.reference],
            "align": self.align,
            "runs": [
                {"label": lab, **d.to_document()}
                for lab, d in zip(self.labels, self.diagnoses, strict=True)
            ],
            "vitals": self.vitals,
            "partings": self.partings,
            "first_parting": self.first_parting,
            "loss_parts_ways": self.part_ways,
            "finding_diff": self.finding_diff,
            "shared_spikes": self.shared_spikes,
            "config_diff": self.config_diff,
            "why": self.why,
            "notes": self.notes,
        }


def _labels(names: list[str]) -> list[str]:
    out: list[str] = []
    for i, n in enumerate(names):
        out.append(n if names.count(n) == 1 else f"{n} [{i + 1}]")
    return out


def _evidence(run: Run | Evidence) -> Evidence:
    return run if isinstance(run, Evidence) else Evidence(run)


def _end_cell(ev: Evidence, metric: str, v: dict[str, Any] | None) -> str:
    """A run's end level of a vital sign for the table, in the unit its log states for a
    throughput or memory series (each run its own: one may log GB, another bytes)."""
    from forensics.report.render import _num

    if v is None or v["final"] is None:
        return "-"
    if metric in (THROUGHPUT, MEMORY):
        from forensics.evidence.trend_utils import unit_for

        unit = unit_for(ev.run, metric, level=v["final"])
        if unit.stated:
            return unit.show(v["final"])
    return _num(v["final"])


_END_POINTS = 100


def _vital(ev: Evidence, metric: str) -> dict[str, float | int | None] | None:
    logged = ev.logged(metric)
    if len(logged) == 0:
        return None
    fin = ev.series(metric).values
    last_step = int(logged.steps[-1])
    if len(fin) == 0:
        return {"final": None, "best": None, "points": len(logged), "last_step": last_step}
    # The level the run ended at: the median of its last 5% of points, at most 100 of them
    # (on a loss still climbing, 5% of 12,000 points read 6.54 where the log ends near 6.95).
    tail = fin[-max(1, min(len(fin) // 20, _END_POINTS)) :]
    best = float(fin.max()) if metric in (THROUGHPUT,) else float(fin.min())
    return {
        "final": float(np.median(tail)),
        "best": best,
        "points": len(logged),
        "last_step": last_step,
    }


# -- alignment -----------------------------------------------------------------------------
def _axis_metric(ev: Evidence, align: str) -> str | None:
    """The logged series that counts tokens or samples (a raw tag such as ``tokens`` or
    ``train/consumed_samples``), or None."""
    want = {
        "tokens": ("tokens", "num_tokens", "consumed_tokens", "tokens_seen"),
        "samples": ("samples", "consumed_samples", "num_samples", "samples_seen"),
    }[align]
    for name in ev.run.metrics():
        leaf = name.lower().rsplit("/", 1)[-1]
        if leaf in want:
            return name
    return None


def aligned(
    ev: Evidence, metric: str, align: str = "step"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, values, steps) of one vital sign with x in the unit of ``align``: steps, tokens or
    samples seen (the counter the log carries, interpolated at each point's step) or seconds
    since the run's first logged point. Points the counter does not cover are dropped."""
    s = ev.series(metric)
    if align == "step" or len(s) == 0:
        return s.steps.astype(float), s.values, s.steps
    if align == "time":
        if s.wall_time is None:
            return np.array([]), np.array([]), np.array([], dtype=np.int64)
        ok = np.isfinite(s.wall_time)
        t0 = np.nanmin(s.wall_time) if ok.any() else 0.0
        return s.wall_time[ok] - t0, s.values[ok], s.steps[ok]
    counter = _axis_metric(ev, align)
    if counter is None:
        return np.array([]), np.array([]), np.array([], dtype=np.int64)
    c = ev.series(counter)
    ok = (s.steps >= c.steps[0]) & (s.steps <= c.steps[-1])
    return np.interp(s.steps[ok], c.steps, c.values), s.values[ok], s.steps[ok]


def can_align(ev: Evidence, align: str) -> bool:
    if align == "step":
        return True
    if align == "time":
        s = ev.series(LOSS)
        return s.wall_time is not None and bool(np.isfinite(s.wall_time).any())
    return _axis_metric(ev, align) is not None


# -- where the runs part ---------------------------------------------------------------------
def _rolling_median(y: np.ndarray, k: int = BAND_WINDOW) -> np.ndarray:
    if len(y) == 0:
        return y
    from scipy.ndimage import median_filter

    return median_filter(y, size=min(k, len(y)), mode="mirror")


def step_noise(values: np.ndarray) -> np.ndarray:
    """Per point, a robust sigma of the series' step-to-step noise: 1.4826 x the local median
    absolute successive difference, over sqrt(2) (a difference carries two points' noise)."""
    if len(values) < 2:
        return np.zeros(len(values))
    d = np.abs(np.diff(values))
    d = np.concatenate([d[:1], d])
    return 1.4826 * _rolling_median(d) / np.sqrt(2)


def partings(
    ref: Evidence, others: list[Evidence], metric: str, align: str = "step"
) -> list[dict[str, Any] | None]:
    """For each of ``others``: the first point where its ``metric`` leaves the reference's band
    and the excursion holds or is large (None when a run or the reference lacks the sign)."""
    xr, yr, sr = aligned(ref, metric, align)
    if len(xr) < 2:
        return [None for _ in others]
    order = np.argsort(xr, kind="stable")
    xr, yr, sr = xr[order], yr[order], sr[order]
    # Storage noise: event files keep float32 (a value rounded to 1.2e-7 of itself), JSONL
    # and CSV the float64 a trainer printed; the same LR read from both differs by that much
    # and is the same LR (3e-4 in an event file is 0.00030000001).
    tiny = FLOAT32_REL * np.maximum(np.abs(yr), 1e-12)
    width = np.maximum(BAND_K * step_noise(yr), tiny)
    curves: list[tuple[np.ndarray, np.ndarray] | None] = []
    for ev in others:
        xo, yo, _ = aligned(ev, metric, align)
        if len(xo) < 2:
            curves.append(None)
            continue
        o = np.argsort(xo, kind="stable")
        xo, yo = xo[o], yo[o]
        diff = np.full(len(xr), np.nan)
        if align == "step":  # the steps both runs logged, compared as they are
            sel = np.isin(xr, xo)
            diff[sel] = yo[np.searchsorted(xo, xr[sel])] - yr[sel]
        else:  # counters and clocks differ between runs: the other run read at the same x
            sel = (xr >= xo[0]) & (xr <= xo[-1])
            diff[sel] = np.interp(xr[sel], xo, yo) - yr[sel]
        curves.append((sel, diff))
    run_to_run = None
    have = [c for c in curves if c is not None]
    if len(have) >= RUN_TO_RUN_MIN:
        with np.errstate(all="ignore"):
            med = np.nanmedian(np.abs(np.vstack([c[1] for c in have])), axis=0)
        run_to_run = _rolling_median(np.nan_to_num(med))
        width = np.maximum(width, RUN_TO_RUN_K * run_to_run)
    out: list[dict[str, Any] | None] = []
    for c in curves:
        if c is None:
            out.append(None)
            continue
        sel, diff = c
        idx = np.flatnonzero(sel)
        if len(idx) < 2:
            out.append(None)
            continue
        d, w = diff[idx], width[idx]
        outside = np.abs(d) > w
        hit = None
        for j in np.flatnonzero(outside):
            window = outside[j : j + PART_POINTS]
            if window.sum() < min(PART_HOLD, len(window)):
                continue
            scatter = _scatter(d[:j])
            head = d[j : j + PART_POINTS]
            if metric == LR and window.all() and bool(((head > 0) == (head[0] > 0)).all()):
                if float(np.abs(head).min()) > POINT_K * scatter:
                    hit = int(j)
                    break
            level = float(np.median(d[j : j + LEVEL_POINTS]))
            if level * d[j] > 0 and abs(level) > max(0.5 * w[j], LEVEL_K * scatter):
                hit = int(j)
                break
        common = [int(sr[idx[0]]), int(sr[idx[-1]])]
        if hit is None:
            out.append({"step": None, "common_steps": common, "band": "data"})
            continue
        i = int(idx[hit])
        out.append(
            {
                "step": int(sr[i]),
                "x": float(xr[i]),
                "reference_value": float(yr[i]),
                "value": float(yr[i] + d[hit]),
                "diff": float(d[hit]),
                "band_half_width": float(w[hit]),
                "rel_diff_at_step": float(d[hit] / max(abs(yr[i]), 1e-12)),
                "common_steps": common,
                "run_to_run": run_to_run is not None,
            }
        )
    return out


def _scatter(before: np.ndarray) -> float:
    """A robust sigma (1.4826 MAD) of a run's difference from the reference over the last
    BAND_WINDOW points before a candidate parting (0 with fewer than PART_POINTS of them)."""
    tail = before[-BAND_WINDOW:]
    if len(tail) < PART_POINTS:
        return 0.0
    return float(1.4826 * np.median(np.abs(tail - np.median(tail))))


def loss_parts_ways(ref: Run | Evidence, other: Run | Evidence) -> dict[str, Any] | None:
    """The first step where ``other``'s loss leaves ``ref``'s band (see :func:`partings`)."""
    return partings(_evidence(ref), [_evidence(other)], LOSS)[0]


def _first_parting(per_sign: dict[str, list[dict[str, Any] | None]], i: int) -> dict | None:
    """The earliest parting of run ``i``: its step and every sign that parted there (in the
    order of TRAINING_SIGNS; ``metric`` is the first of them). When the LR parts first (a
    different schedule is a cause, not an effect), ``then`` is the first other sign to part."""
    hits = [
        (p["step"], m)
        for m, per_run in per_sign.items()
        if (p := per_run[i]) and p.get("step") is not None
    ]
    if not hits:
        return None
    step = min(h[0] for h in hits)
    signs = [m for st, m in hits if st == step]
    out: dict[str, Any] = {"metric": signs[0], "metrics": signs, "step": step, "then": None}
    # How far apart there, relative to the reference: an LR schedule 0.1% off (a cosine over
    # another number of steps) parts as surely as one 10x off, and is not the same news.
    out["rel_diffs"] = {
        m: p["rel_diff_at_step"]
        for m in signs
        if (p := per_sign[m][i]) is not None and p.get("rel_diff_at_step") is not None
    }
    if signs == [LR]:
        rest = [h for h in hits if h[1] != LR]
        if rest:
            st = min(h[0] for h in rest)
            out["then"] = {"metrics": [m for s_, m in rest if s_ == st], "step": st}
    return out


# -- what they share -------------------------------------------------------------------------
def _range(f: Any) -> list[int] | None:
    return list(f.onset_range) if f.onset_range is not None else None


def _layer(f: Any) -> int | None:
    """The layer a per-layer finding is about (None for a model-wide one): four layers'
    activation outliers share one metric name and one step, and are four findings."""
    layer = f.measures.get("layer")
    return layer if isinstance(layer, int) else None


def _what(f: Any) -> str:
    """The finding named so that two of one kind at one step read apart: ``activation_outlier
    (act_std, layer 2)``, ``gap_acceleration (eval/wiki_loss)``; the kind alone otherwise."""
    layer = _layer(f)
    group = f.measures.get("layers")
    if isinstance(group, str) and group and group != str(layer):
        return f"{f.kind.value} ({f.metric}, layers {group})"  # a group: "0-3"
    if layer is not None:
        return f"{f.kind.value} ({f.metric}, layer {layer})"
    if f.metric and f.metric.startswith(EVAL_PREFIX):
        return f"{f.kind.value} ({f.metric})"
    return str(f.kind.value)


def _key(f: Any) -> dict[str, Any]:
    return {
        "kind": f.kind.value,
        "what": _what(f),
        "severity": f.severity.value,
        "metric": f.metric,
        "layer": _layer(f),
        "step": f.start_step,
        "onset_range": _range(f),
        "summary": f.summary,
    }


def _same_onset(f: Any, g: Any) -> bool:
    """Onsets the logs cannot tell apart: within SAME_STEP steps, or, where either is a bend
    fitted on bins (``onset_range``), ranges that meet. Two findings of many events
    (``events_at``: absorbed outliers, periodic spikes) match wherever their first events
    are."""
    if abs(g.start_step - f.start_step) <= SAME_STEP:
        return True
    if f.events_at is not None and g.events_at is not None:
        return True  # (many events, absorbed outliers or periodic spikes: both runs have them)
    if f.onset_range is None and g.onset_range is None:
        return False
    (a0, a1), (b0, b1) = f.onset_bounds, g.onset_bounds
    return a0 <= b1 and b0 <= a1


def finding_diff(ref: Diagnosis, other: Diagnosis) -> dict[str, Any]:
    """Findings of ``ref`` and ``other`` matched by kind, metric, layer and onset (within SAME_STEP
    steps, or fitted onsets whose ranges meet): in both, only in the reference, only in the
    other run. A match in both keeps the other run's step and range."""
    rest = list(other.findings)
    both, only_ref = [], []
    for f in ref.findings:
        m = next(
            (
                g
                for g in rest
                if g.kind == f.kind
                and g.metric == f.metric
                and _layer(g) == _layer(f)
                and _same_onset(f, g)
            ),
            None,
        )
        if m is None:
            only_ref.append(_key(f))
        else:
            rest.remove(m)
            both.append(
                {
                    **_key(f),
                    "other_step": m.start_step,
                    "other_onset_range": _range(m),
                    # (findings of many events: how many each run had; null for one event)
                    "events": (
                        [len(f.events_at), len(m.events_at)]
                        if f.events_at is not None and m.events_at is not None
                        else None
                    ),
                }
            )
    return {"both": both, "only_reference": only_ref, "only_other": [_key(g) for g in rest]}


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            if set(v) == {"value"}:  # W&B config.yaml style {key: {value: x}}
                out[key] = v["value"]
            else:
                out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def config_diff(configs: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The configuration keys whose values differ across runs (dotted paths; a missing key is
    None), in key order. W&B bookkeeping keys (``_wandb``) are left out."""
    flats = [_flat(c or {}) for c in configs]
    keys = sorted({k for f in flats for k in f if not k.startswith("_wandb")})
    out: dict[str, list[Any]] = {}
    for k in keys:
        vals = [f.get(k) for f in flats]
        if any(repr(v) != repr(vals[0]) for v in vals[1:]):
            out[k] = [_plain(v) for v in vals]
    return out


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return v if np.isfinite(v) else str(v)
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return str(v)


def _seed(cfg: dict[str, Any]) -> Any:
    flat = _flat(cfg or {})
    for k in SEED_KEYS:
        if k in flat:
            return flat[k]
    return next((v for k, v in flat.items() if k.rsplit(".", 1)[-1] == "seed"), None)


def _batch_size(cfg: dict[str, Any]) -> int | None:
    flat = _flat(cfg or {})
    for k, v in flat.items():
        leaf = k.rsplit(".", 1)[-1]
        if leaf in ("global_batch_size", "batch_size", "train_batch_size") and isinstance(v, int):
            return v
    return None


def _spike_steps(findings: list[Finding]) -> list[tuple[str, int]]:
    """(kind, step) of each spike of a run, in step order: a spike finding's onset, and
    each event of an absorbed-outliers note (one batch each, the same kind of evidence for
    a shared data order as a grad-norm spike finding)."""
    out = [(f.kind.value, f.start_step) for f in findings if f.kind.value in SPIKE_KINDS]
    for f in findings:
        if f.kind is FindingKind.GRAD_NORM_OUTLIERS and f.events_at:
            out += [("grad_norm_spike", s) for s in f.events_at]
    return sorted(out, key=lambda t: t[1])


def shared_spikes(diags: list[Diagnosis], labels: list[str]) -> list[dict[str, Any]]:
    """Spikes (loss or grad norm) at the same step in two or more runs. When the runs' seeds
    differ (or are not logged), the common cause is the data order: the batch at that step."""
    groups: list[dict[str, Any]] = []
    # (kind, step) -> positions in ``groups``: a finding joins the earliest group of its kind
    # within SAME_STEP, found by looking up the few steps around it (a 1M-step run has
    # thousands of spikes: a scan of every group per finding took seconds).
    at: dict[tuple[str, int], list[int]] = {}
    for i, d in enumerate(diags):
        for kind, step in _spike_steps(d.findings):
            near = [
                j
                for s in range(step - SAME_STEP, step + SAME_STEP + 1)
                for j in at.get((kind, s), ())
            ]
            if not near:
                at.setdefault((kind, step), []).append(len(groups))
                groups.append({"kind": kind, "step": step, "runs": [i]})
                continue
            g = groups[min(near)]
            if i not in g["runs"]:
                g["runs"].append(i)
    out = []
    for g in groups:
        if len(g["runs"]) < 2:
            continue
        seeds = [_seed(diags[i].run.config) for i in g["runs"]]
        known = [s for s in seeds if s is not None]
        differ = len(known) == len(seeds) and len({repr(s) for s in known}) == len(known)
        bs = {_batch_size(diags[i].run.config) for i in g["runs"]}
        batch: dict[str, Any] | None = None
        if len(bs) == 1 and None not in bs:
            (b,) = bs
            batch = {"batch_size": b, "samples": [g["step"] * b, (g["step"] + 1) * b - 1]}
        who = ", ".join(labels[i] for i in g["runs"])
        what = g["kind"].replace("_", " ")
        if differ:
            note = (
                f"{what} at step {g['step']:,} in {who}, whose seeds differ "
                f"({', '.join(map(str, seeds))}): it points at the data, the batch of step "
                f"{g['step']:,}"
            )
        else:
            note = f"{what} at step {g['step']:,} in {who}" + (
                "; seeds not logged: if they differ, it points at the data"
                if len(known) < len(seeds)
                else "; same seed: the data order and the initialisation are shared"
            )
        if batch is not None:
            note += f" (samples {batch['samples'][0]:,} to {batch['samples'][1]:,})"
        out.append(
            {
                "kind": g["kind"],
                "step": g["step"],
                "runs": [labels[i] for i in g["runs"]],
                "seeds": [_plain(s) for s in seeds],
                "points_at_data": differ,
                "batch": batch,
                "note": note,
            }
        )
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return "-" if v is None else str(v)


def pct(rel: float) -> str:
    """A relative difference as a signed percentage: ``+30%``, ``+4.2%``, ``+0.11%``."""
    v = 100.0 * rel
    return f"{v:+.0f}%" if abs(v) >= 10 else f"{v:+.1f}%" if abs(v) >= 1 else f"{v:+.2g}%"


def by_how_much(first: dict[str, Any]) -> str:
    """`` (+0.11%)`` or `` (lr +0.11%, param norm +3.2%)``: how far each sign of a first
    parting was from the reference there ('' when not known)."""
    rel = first.get("rel_diffs") or {}
    got = [(m, rel[m]) for m in first["metrics"] if m in rel]
    if not got:
        return ""
    if len(got) == 1:
        return f" ({pct(got[0][1])})"
    return " (" + ", ".join(f"{m.replace('_', ' ')} {pct(r)}" for m, r in got) + ")"


def why(
    cdiff: dict[str, list[Any]],
    first: dict[str, Any] | None,
    ref: int,
    i: int,
    shared: Sequence[str] | None = None,
) -> str:
    """ "lr 6e-4 vs 3e-4; the grad norm parted at step 1,200": each value of run ``i`` first,
    then the reference's, in the order of the line that heads it ("<run> vs <reference>: ...";
    the reference's first had read as the run's own). ``shared``: the training signs both
    runs logged (None: not known), named where none parted: "no training sign parted" beside
    a run that logged no step had read as if the two had been lined up."""
    parts = [
        f"{k} {_fmt(v[i])} vs {_fmt(v[ref])}"
        for k, v in cdiff.items()
        if repr(v[ref]) != repr(v[i])
    ]
    head = "; ".join(parts[:6]) + (f" (+{len(parts) - 6} more)" if len(parts) > 6 else "")
    if not parts:
        head = "no config difference logged"
    if first is None:
        # (only the training signs are lined up: a memory or throughput level differs between
        # machines from the first step; their findings are listed below the line)
        lined = TRAINING_SIGNS if shared is None else tuple(shared)
        names = ", ".join(_sign_name(m) for m in lined)
        if not lined:
            tail = "no training sign is logged by both runs, so none could be lined up"
        elif len(lined) == len(TRAINING_SIGNS):
            tail = f"no training sign parted ({names})"
        else:
            tail = f"no training sign parted ({names}: the ones both runs logged)"
    else:
        signs = " and ".join(m.replace("_", " ") for m in first["metrics"])
        tail = f"the {signs} parted at step {first['step']:,}{by_how_much(first)}"
        if first.get("then"):
            then = " and ".join(m.replace("_", " ") for m in first["then"]["metrics"])
            tail += f", the {then} at step {first['then']['step']:,}"
    return f"{head}; {tail}"


def _sign_name(metric: str) -> str:
    return "LR" if metric == LR else metric.replace("_", " ")


def compare(
    paths: list[str | os.PathLike[str]],
    config: Config | None = None,
    *,
    reference: int = 0,
    align: str = "step",
) -> Comparison:
    """Analyze each path and line the runs up against ``paths[reference]``."""
    from forensics.errors import ForensicsError, MultipleJobsError
    from forensics.pipeline import analyze, require_vital_sign

    if align not in ALIGNS:
        raise ForensicsError(f"--align must be one of {', '.join(ALIGNS)}, not {align!r}")
    diags = []
    ref = reference
    for k, p in enumerate(paths):
        try:
            diag = analyze(Path(p), config)
            require_vital_sign(diag.run, os.fspath(p))  # (not a green light beside the others)
            diags.append(diag)
        except MultipleJobsError as exc:
            from forensics.errors import summarize

            if not (Path(p).is_file() or len(paths) == 1):
                raise ForensicsError(
                    f"{p} holds {len(exc.jobs)} separate jobs ({summarize(exc.jobs)}); "
                    "compare takes one job per path"
                ) from None
            # One file of several runs (a W&B export of a panel: there is no other path to
            # point at each by), or the one path given: each of its runs is one to compare.
            if k < reference:
                ref += len(exc.jobs) - 1
            diags.extend(_each_job(Path(p), config))
    if len(diags) < 2:
        raise ForensicsError("compare needs at least two runs")
    return compare_diagnoses(diags, reference=ref, align=align)


def _each_job(path: Path, config: Config | None) -> list[Diagnosis]:
    """Every job of a path that holds several, analysed in name order."""
    from forensics.importers import discover_jobs, read_job
    from forensics.importers.chains import stitch_jobs
    from forensics.pipeline import analyze_run, read_options, require_vital_sign

    options = read_options(config)
    jobs = stitch_jobs(path, discover_jobs(path), options)
    out = []
    for job, srcs in sorted(jobs.items()):
        run = read_job(path, job, srcs, options=options, only_job=False)
        shown = f"{path}/{job}" if path.is_dir() else os.fspath(path)
        require_vital_sign(run, shown, where=f"{path} ({job})")
        if path.is_file():
            run.name = job  # (the file's stem names every run in it; the job names each)
        out.append(analyze_run(run, config))
    return out


def compare_diagnoses(
    diags: list[Diagnosis], *, reference: int = 0, align: str = "step"
) -> Comparison:
    """The cross-run measures of already analysed runs (each read from its own evidence)."""
    from forensics.errors import ForensicsError

    labels = _labels([d.run.name for d in diags])
    missing = [lab for lab, d in zip(labels, diags, strict=True) if not can_align(d.ev, align)]
    if missing:
        raise ForensicsError(
            f"--align {align}: not logged by {', '.join(missing)} (align by step instead)"
        )
    vitals = {m: [_vital(d.ev, m) for d in diags] for m in VITALS}
    vitals = {m: v for m, v in vitals.items() if any(x is not None for x in v)}
    ref = diags[reference]
    others = [i for i in range(len(diags)) if i != reference]
    per_sign: dict[str, list[dict[str, Any] | None]] = {}
    for m in (m for m in TRAINING_SIGNS if m in vitals):
        got = partings(ref.ev, [diags[i].ev for i in others], m, align)
        row: list[dict[str, Any] | None] = [None] * len(diags)
        for i, g in zip(others, got, strict=True):
            row[i] = g
        if any(g is not None for g in got):
            per_sign[m] = row
    first = [None if i == reference else _first_parting(per_sign, i) for i in range(len(diags))]
    part = per_sign.get(LOSS, [None] * len(diags))
    fdiff = [None if i == reference else finding_diff(ref, diags[i]) for i in range(len(diags))]
    cdiff = config_diff([d.run.config for d in diags])
    # (the training signs each run and the reference both logged, in TRAINING_SIGNS' order)
    both = [m for m in TRAINING_SIGNS if m in vitals and vitals[m][reference] is not None]
    shared = [[m for m in both if vitals[m][i] is not None] for i in range(len(diags))]
    whys = [
        None if i == reference else why(cdiff, first[i], reference, i, shared[i])
        for i in range(len(diags))
    ]
    return Comparison(
        diags,
        labels,
        vitals,
        part,
        reference=reference,
        align=align,
        partings=per_sign,
        first_parting=first,
        finding_diff=fdiff,
        shared_spikes=shared_spikes(diags, labels),
        config_diff=cdiff,
        why=whys,
        notes=same_path_notes(diags, labels) + step_numbering_notes(diags, labels),
    )


def same_path_notes(diags: list[Diagnosis], labels: list[str]) -> list[str]:
    """A note for a run given twice (the same path, or the same job of it): nothing can part."""
    first: dict[tuple[str, str], str] = {}
    out = []
    for lab, d in zip(labels, diags, strict=True):
        try:
            where = (str(Path(d.run.path).resolve()), d.run.name)
        except (OSError, RuntimeError):
            continue
        if where in first:
            out.append(
                f"{lab} is {first[where]} given again (the same path): every value is the same"
            )
        else:
            first[where] = lab
    return out


def step_numbering_notes(diags: list[Diagnosis], labels: list[str]) -> list[str]:
    """A note when the runs number their training steps differently, which the comparison
    (by the steps as logged) cannot see: llm.c prints update k as ``step k/N`` on stdout and
    writes it as ``s:k-1`` in main.log (``logger_log_train(&logger, step, ...)`` after
    ``printf0("step %4d/%d ...", step + 1, ...)``)."""
    stdout, main = [], []
    for lab, d in zip(labels, diags, strict=True):
        run = d.run
        tag = run.metrics().get("loss")
        if tag not in ("loss", "trl"):
            continue
        if "llmc_text" not in run.sources():
            continue
        if tag == "loss":
            stdout.append(lab)
        elif tag == "trl":
            main.append(lab)
    if not (stdout and main):
        return []
    return [
        f"{', '.join(stdout)}: llm.c stdout, which numbers each training step one higher than "
        f"llm.c's main.log ({', '.join(main)}); compared as logged, their steps are one apart, "
        "and where a sign changes fast from step to step (the grad norm early on) that alone "
        "can read as a parting"
    ]


def print_comparison(cmp: Comparison, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    from forensics.report.render import severity_counts
    from forensics.terminal import escape

    console = console or Console()
    t = Table(title="forensics compare", show_lines=False)
    t.add_column("")
    for lab in cmp.labels:
        t.add_column(escape(lab), overflow="fold")  # run names come from folder names
    t.add_row("verdict", *[d.verdict.upper() for d in cmp.diagnoses])
    t.add_row("format", *[d.run.format for d in cmp.diagnoses])
    t.add_row("steps", *[step_range(d.run.first_step, d.run.last_step) for d in cmp.diagnoses])
    t.add_row(
        "findings",
        *[
            ", ".join(f"{n:,} {k}" for k, n in severity_counts(d.findings).items() if n) or "none"
            for d in cmp.diagnoses
        ],
    )
    for d_row in [
        (
            "first alarm",
            [
                next(
                    (
                        f"{f.kind.value} @ {onset_at(f.start_step, f.onset_range)}"
                        for f in d.findings
                        if f.severity is not Severity.INFO
                    ),
                    "-",
                )
                for d in cmp.diagnoses
            ],
        ),
    ]:
        t.add_row(d_row[0], *d_row[1])
    for metric, per_run in cmp.vitals.items():
        t.add_row(
            f"{metric} (end)",
            *[_end_cell(d.ev, metric, v) for d, v in zip(cmp.diagnoses, per_run, strict=True)],
        )
    t.add_row(
        "first to part",
        *[
            "reference"
            if i == cmp.reference
            else (
                "-" if f is None else f"{' + '.join(f['metrics'])} @ {f['step']:,}{by_how_much(f)}"
            )
            for i, f in enumerate(cmp.first_parting)
        ],
    )
    t.add_row(
        "loss parts ways",
        *[
            "reference"
            if i == cmp.reference
            else (
                "-"
                if p is None
                else (
                    f"step {p['step']:,} ({p['rel_diff_at_step']:+.0%})"
                    if p.get("step") is not None
                    else "never (within the band)"
                )
            )
            for i, p in enumerate(cmp.part_ways)
        ],
    )
    console.print(t)
    for note in cmp.notes:
        console.print(f"note: {escape(note)}")
    ref = escape(cmp.labels[cmp.reference])
    for lab, w, fd in zip(cmp.labels, cmp.why, cmp.finding_diff, strict=True):
        if w is None or fd is None:
            continue
        console.print(f"[bold]{escape(lab)}[/] vs {ref}: {escape(w)}")
        # Matched by their ranges, not their steps: both steps, so the reader sees the gap.
        by_range = [
            f
            for f in fd["both"]
            if abs(f["other_step"] - f["step"]) > SAME_STEP and f["events"] is None
        ]
        notes = [f for f in fd["both"] if f["events"] is not None]
        # (each way of matching counted on its own: "at the same step" is said of those only)
        same = len(fd["both"]) - len(by_range) - len(notes)
        how = [f"{same:,} at the same step"] if same else []
        how += [f"{len(by_range):,} by their fitted onsets' ranges"] if by_range else []
        how += [f"{len(notes):,} of many events, matched wherever they begin"] if notes else []
        console.print(
            f"  findings: {len(fd['both']):,} in both"
            + (f" ({', '.join(how)})" if by_range or notes else " at the same step" if same else "")
            + f", {len(fd['only_reference']):,} only in {ref}, {len(fd['only_other']):,} only in "
            f"{escape(lab)}"
        )
        for f in by_range[:5]:
            console.print(
                f"    in both: {f['what']} @ {onset_at(f['step'], f['onset_range'])} in {ref}, "
                f"@ {onset_at(f['other_step'], f['other_onset_range'])} in {escape(lab)} (the "
                "fitted onsets' ranges meet: the logs cannot tell them apart)"
            )
        for f in notes:
            a, b = f["events"]
            console.print(
                f"    in both: {f['what']}, {a:,} in {ref} from step {f['step']:,}, {b:,} in "
                f"{escape(lab)} from step {f['other_step']:,}"
            )
        # Both sides: a finding the reference has and this run lacks is as much a difference
        # (before, "2 only in overfitting" was counted and never named).
        for side, name in ((fd["only_reference"], ref), (fd["only_other"], escape(lab))):
            # (the worst first: a divergence before a dozen absorbed grad-norm outliers)
            worst = sorted(side, key=lambda f: (-look(f["severity"]).rank, f["step"]))
            for f in worst[:SIDE_SHOWN]:
                console.print(
                    f"    only in {name}, {f['severity']}: {f['what']} @ "
                    f"{onset_at(f['step'], f['onset_range'])}"
                )
            if len(side) > SIDE_SHOWN:
                console.print(
                    f"    ... and {len(side) - SIDE_SHOWN:,} more only in {name} (the comparison "
                    "report and --json list them all)"
                )
    for sp in cmp.shared_spikes[:SHARED_SHOWN]:
        console.print(f"shared: {escape(sp['note'])}")
    if len(cmp.shared_spikes) > SHARED_SHOWN:
        console.print(
            f"... and {len(cmp.shared_spikes) - SHARED_SHOWN:,} more spikes shared at the same "
            "step (the comparison report and --json list them all)"
        )
