"""forensics against the published training-run watchdogs, on the same logs.

    python benchmarks/tools_compare.py                 # sample_runs + ../shared/real_runs
    python benchmarks/tools_compare.py --no-trainproof # without the trainproof subprocess
    python benchmarks/tools_compare.py --markdown      # the table for the README

Ground truth: every expectation of sample_runs/events.toml (run, kind, onset +- tol), one
labelled incident of ../shared/real_runs (the llm.c job whose loss is NaN from step 1), and
the healthy runs (tests/test_calibration.py's list: quiet sample runs and the real logs
MANIFEST.md and the golden findings call healthy), where every alarm is a false one.

The tools, re-implemented from their public source where they are training callbacks (each
reads the logged series the way the callback reads the live values, step by step):

* llm-foundry ``KillLossSpike`` (mosaicml/llm-foundry,
  llmfoundry/callbacks/kill_loss_spike_callback.py): a loss >= 2x the mean of the last 100
  losses is an outlier; more than 4 outliers in a row is a loss spike; after 200 steps, half
  of the window above loss_cap 10 is "high losses". Alarms count against loss_spike and
  divergence.
* OLMo-core ``StabilityMonitorCallback`` (allenai/OLMo-core,
  src/olmo_core/train/callbacks/stability_monitor.py): a loss or grad norm above mean + 6 std
  of its last 128 values is a spike (the SpikeScore counts them). Alarms count against
  loss_spike and grad_norm_spike.
* ZClip (bluorion-com/ZClip, zclip/zclip.py): z-score mode, EMA alpha 0.97 over the grad norm
  after 25 warm-up steps, z > 2.5 is a spike (clipped; the EMA then takes the clipped value).
  Alarms count against grad_norm_spike and loss_spike.
* SageMaker Debugger ``Overfit`` rule (its built-in rules' code is not public; the rule as
  documented in awsdocs/amazon-sagemaker-developer-guide,
  doc_source/debugger-built-in-rules.md, section "Overfit"): (mean val loss - mean train
  loss) / mean train loss > ratio_threshold 0.1 for patience 1 evaluation, from start_step 0.
  The train mean is taken over the steps since the previous evaluation. Alarms count against
  overfitting.
* trainproof (PyPI; ``trainproof doctor --json`` run as a subprocess on the same path, its
  WARN and FAIL findings mapped to our kinds by their id; it reports no step, so a finding of
  the right kind counts as a detection wherever it is).

forensics: every finding of the kind with its onset within the tolerance counts for recall
(as tests/test_sample_runs.py matches), warning-or-worse findings count as alarms on the
healthy runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tomllib
from collections import defaultdict, deque
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from forensics.run import Run

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_runs"
SHARED = Path(os.environ.get("FORENSICS_SHARED", ROOT.parent / "shared"))
REAL = SHARED / "real_runs"

# Healthy runs: (target folder, job or None for every job in it). Shared with
# tests/test_calibration.py and benchmarks/calibration.py.
HEALTHY_SAMPLES = ["healthy", "healthy_cosine_wd", "healthy_wsd", "slow_eval_steps"]
HEALTHY_REAL: list[tuple[str, str | None]] = [
    ("llmc-gpt2-124M-hectorfcardenas", "gpt2_train.11685414.log"),
    ("llmc-gpt2-124M-siddanthemani", "main.log"),
    ("modded-nanogpt", None),
    ("hf-trainer-tinyllama-sft", None),
    ("llamafactory-luojiu-7b-qlora-cpt", None),
    ("hf-trainer-alpaca-repro", None),
    ("hf-trainer-baize-tcm-lora", None),
    ("hf-trainer-metamath-sft", None),
    ("lightning-csv-slm-wikitext103", "lightning_logs/version_0"),
]
# Labelled incidents of real logs (MANIFEST.md: "self-documenting failures").
REAL_EVENTS: list[tuple[str, str, str, int, int]] = [
    ("llmc-gpt2-124M-hectorfcardenas", "gpt2_train.11679010.log", "nan_inf", 1, 2),
]

TOOLS = ["forensics", "KillLossSpike", "OLMo 6-sigma", "ZClip", "SageMaker Overfit", "trainproof"]
# The finding kinds each tool's alarm can stand for.
COVERS: dict[str, set[str]] = {
    "KillLossSpike": {"loss_spike", "divergence"},
    "OLMo 6-sigma": {"loss_spike", "grad_norm_spike"},
    "ZClip": {"grad_norm_spike", "loss_spike"},
    "SageMaker Overfit": {"overfitting"},
}
# trainproof finding id -> our kinds (ids as trainproof 0.22 prints them).
TRAINPROOF_KINDS: dict[str, set[str]] = {
    "TP-OVERFIT": {"overfitting"},
    "TP-DIVERGE": {"divergence"},
    "TP-DIVERGENCE": {"divergence"},
    "TP-GRAD-SPIKE": {"grad_norm_spike", "loss_spike"},
    "TP-GRAD-FINITE": {"nan_inf"},
    "TP-NAN": {"nan_inf"},
    "TP-ZERO-LOSS": {"nan_inf"},
    "TP-FLAT-LOSS": {"plateau"},
    "TP-DEAD-RUN": {"plateau"},
    "TP-STEP-TIME": {"throughput_drop", "stall"},
    "TP-LOADER": {"throughput_drop"},
    "TP-LR": {"divergence"},
}


# trainproof read nothing (no loss column, or no log it can parse): a reading failure, not a
# judgement; counted apart
UNREAD = ("TP-NO-LOSS", "TP-UNREADABLE")


@dataclass
class Alarm:
    kinds: set[str]
    step: int | None  # None: the tool does not say where
    label: str


@dataclass
class Job:
    name: str  # sample_runs/<run> or real_runs/<folder>[:<job>]
    path: Path  # what trainproof is given
    run: Any  # forensics Run
    healthy: bool
    events: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, onset, tol)


# ----------------------------------------------------------------------------- the tools


def kill_loss_spike(steps: np.ndarray, loss: np.ndarray) -> list[Alarm]:
    """llm-foundry KillLossSpike with its defaults (patience 4, outlier_multiplier 2,
    window_size 100, loss_cap 10), fed the logged losses one by one."""
    window: deque[float] = deque(maxlen=100)
    counter, out = 0, []
    for i, (s, v) in enumerate(zip(steps, loss, strict=True)):
        if len(window) == window.maxlen:
            mean = float(np.mean(window))
            if v >= mean * 2:
                counter += 1
                if counter > 4:
                    out.append(Alarm({"loss_spike", "divergence"}, int(s), "loss spike"))
            else:
                counter = 0
                if i >= 200 and sum(1 for x in window if x > 10) >= 50:
                    out.append(Alarm({"divergence"}, int(s), "high losses"))
        window.append(float(v))
    return out


def olmo_spikes(steps: np.ndarray, values: np.ndarray, kind: str) -> list[Alarm]:
    """OLMo-core StabilityMonitorCallback._is_spike: value > mean + 6 std of the last 128."""
    hist: deque[float] = deque(maxlen=128)
    out = []
    for s, v in zip(steps, values, strict=True):
        if len(hist) == hist.maxlen:
            a = np.fromiter(hist, float)
            mean, std = float(a.mean()), float(a.std())
            if std >= 1e-10 and v > mean + 6.0 * std:
                out.append(Alarm({kind}, int(s), f"{kind} > mean + 6 std"))
        hist.append(float(v))
    return out


def zclip(steps: np.ndarray, grad_norm: np.ndarray) -> list[Alarm]:
    """ZClip z-score mode (alpha 0.97, z_thresh 2.5, warmup 25, adaptive_scaling, clip_factor
    1): a clipped step is an alarm; the EMA is updated with the clip value."""
    buf: list[float] = []
    mean = var = 0.0
    out = []
    for s, g in zip(steps, grad_norm, strict=True):
        g = float(g)
        if len(buf) < 25:
            buf.append(g)
            if len(buf) == 25:
                mean = sum(buf) / 25
                var = sum((x - mean) ** 2 for x in buf) / 25
            continue
        std = var**0.5
        z = (g - mean) / (std + 1e-6)
        eff = g
        if z > 2.5:
            out.append(Alarm({"grad_norm_spike", "loss_spike"}, int(s), f"z {z:.1f} > 2.5"))
            eff = mean + 2.5 * std / (z / 2.5)
        mean = 0.97 * mean + 0.03 * eff
        var = 0.97 * var + 0.03 * (eff - mean) ** 2
    return out


def sagemaker_overfit(
    tr: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray]
) -> list[Alarm]:
    """SageMaker Debugger Overfit (ratio_threshold 0.1, patience 1, start_step 0)."""
    ts, tv = tr
    vs, vv = val
    out, prev, over = [], -math.inf, 0
    for s, v in zip(vs, vv, strict=True):
        sel = (ts > prev) & (ts <= s)
        if not sel.any():  # no train loss since the last eval: the nearest one before
            before = ts <= s
            sel = np.zeros_like(before)
            if before.any():
                sel[np.flatnonzero(before)[-1]] = True
        prev = s
        if not sel.any():
            continue
        t = float(np.mean(tv[sel]))
        if t > 0 and (float(v) - t) / t > 0.1:
            over += 1
            if over >= 1:
                out.append(Alarm({"overfitting"}, int(s), "(val - train) / train > 0.1"))
        else:
            over = 0
    return out


def trainproof(path: Path) -> tuple[list[Alarm], str | None]:
    """`trainproof doctor --json` on the path; WARN/FAIL findings become alarms."""
    exe = shutil.which("trainproof") or str(Path(sys.executable).with_name("trainproof"))
    if not Path(exe).exists():
        return [], "trainproof is not installed (pip install trainproof)"
    try:
        proc = subprocess.run(
            [exe, "doctor", str(path), "--json"], capture_output=True, text=True, timeout=600
        )
        doc = json.loads(proc.stdout)
    except (subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        return [], f"trainproof failed on {path}: {exc}"
    if not doc.get("reports"):  # "no readable training logs", or every file not_judged
        return [Alarm({"other"}, None, "TP-UNREADABLE: no log it could parse")], None
    out = []
    for rep in doc.get("reports", []):
        for f in rep.get("findings", []):
            if f.get("level") not in ("WARN", "FAIL", "ERROR", "CRITICAL"):
                continue
            kinds = TRAINPROOF_KINDS.get(f.get("id", ""), {"other"})
            out.append(Alarm(kinds, None, f"{f.get('id')}: {f.get('message', '')[:60]}"))
    return out, None


def forensics_alarms(run: Any) -> tuple[list[Alarm], list[Alarm]]:
    """(every finding, warning-or-worse findings) of forensics on the run."""
    from forensics.config import Config
    from forensics.pipeline import analyze_run

    diag = analyze_run(run, Config())
    every = [Alarm({f.kind.value}, f.start_step, f.severity.value) for f in diag.findings]
    # (the absorbed outliers' note: each outlier is a grad-norm spike found at its step)
    every += [
        Alarm({"grad_norm_spike"}, s, f.severity.value)
        for f in diag.findings
        for s in f.events_at or ()
    ]
    loud = [a for a in every if a.label != "info"]
    return every, loud


def series(run: Any, metric: str) -> tuple[np.ndarray, np.ndarray]:
    from forensics.evidence import Evidence

    s = Evidence(run).series(metric)
    return s.steps, s.values


def raw_loss(run: Any) -> tuple[np.ndarray, np.ndarray]:
    """The loss as logged, NaN included (the callbacks see NaN steps too)."""
    from forensics.evidence import Evidence

    s = Evidence(run).logged("loss")
    return s.steps, s.values


# ----------------------------------------------------------------------------- the jobs


def _read(path: Path, job: str | None) -> list[tuple[str, Path, Any]]:
    from forensics.config import Config
    from forensics.errors import ForensicsError
    from forensics.importers import discover_jobs, read_job
    from forensics.pipeline import read_options

    out: list[tuple[str, Path, Run]] = []
    try:
        jobs = discover_jobs(path)
    except ForensicsError:
        return out
    for name, sources in sorted(jobs.items()):
        if job is not None and name != job:
            continue
        try:
            run = read_job(
                path, name, sources, options=read_options(Config()), only_job=len(jobs) == 1
            )
        except ForensicsError:
            continue
        target = path / name if (path / name).exists() else path
        out.append((name, target, run))
    return out


def jobs() -> list[Job]:
    events = tomllib.loads((SAMPLES / "events.toml").read_text())
    out: list[Job] = []
    for run_name, spec in events.items():
        for _, target, run in _read(SAMPLES / run_name, None):
            ev = []
            for e in spec["expect"]:
                onsets = e["onset"] if isinstance(e["onset"], list) else [e["onset"]]
                ev += [(e["kind"], int(o), int(e["tol"])) for o in onsets]
            out.append(
                Job(
                    f"sample_runs/{run_name}",
                    target,
                    run,
                    healthy=run_name in HEALTHY_SAMPLES,
                    events=ev,
                )
            )
    if REAL.is_dir():
        for folder, job in HEALTHY_REAL:
            for name, target, run in _read(REAL / folder, job):
                out.append(Job(f"real_runs/{folder}:{name}", target, run, healthy=True))
        for folder, job, kind, onset, tol in REAL_EVENTS:
            for name, target, run in _read(REAL / folder, job):
                out.append(
                    Job(
                        f"real_runs/{folder}:{name}",
                        target,
                        run,
                        healthy=False,
                        events=[(kind, onset, tol)],
                    )
                )
    return out


def alarms_of(tool: str, job: Job, notes: list[str]) -> tuple[list[Alarm], list[Alarm]]:
    """(alarms that count for recall, alarms that count as false on a healthy run)."""
    run = job.run
    metrics = set(run.metrics())
    if tool == "forensics":
        return forensics_alarms(run)
    if tool == "trainproof":
        got, err = trainproof(job.path)
        if err and err not in notes:
            notes.append(err)
        return got, got
    a: list[Alarm] = []
    if tool == "KillLossSpike" and "loss" in metrics:
        a = kill_loss_spike(*raw_loss(run))
    elif tool == "OLMo 6-sigma":
        if "loss" in metrics:
            a += olmo_spikes(*series(run, "loss"), "loss_spike")
        if "grad_norm" in metrics:
            a += olmo_spikes(*series(run, "grad_norm"), "grad_norm_spike")
    elif tool == "ZClip" and "grad_norm" in metrics:
        a = zclip(*series(run, "grad_norm"))
    elif tool == "SageMaker Overfit" and "loss" in metrics:
        held = [
            m
            for m in sorted(metrics)
            if m == "val_loss" or (m.startswith("eval/") and m.endswith("_loss"))
        ]
        for m in held:
            a += sagemaker_overfit(series(run, "loss"), series(run, m))
    return a, a


# ----------------------------------------------------------------------------- scoring


def hit(alarms: list[Alarm], kind: str, onset: int, tol: int) -> bool:
    return any(kind in a.kinds and (a.step is None or abs(a.step - onset) <= tol) for a in alarms)


CACHE = Path(os.environ.get("TOOLS_COMPARE_CACHE", "/tmp/forensics-tools-compare.json"))


def _signature(path: Path) -> str:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    mtime = max((p.stat().st_mtime_ns for p in files), default=0)
    return f"{len(files)}:{size}:{mtime}"


@cache
def _code_hash() -> str:
    h = hashlib.sha256()
    for f in sorted((ROOT / "forensics").rglob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _cached_alarms(
    tool: str, job: Job, notes: list[str], cache: dict[str, Any]
) -> tuple[list[Alarm], list[Alarm]]:
    """alarms_of, remembered per (job, tool, files' size and mtime) across invocations; for
    forensics also per the hash of its source files (a change to a detector recomputes)."""
    key = f"{job.name}|{tool}|{_signature(job.path)}"
    if tool == "trainproof":
        key += "|2"  # unreadable logs recorded since version 2 of this script
    if tool == "forensics":
        key += f"|{_code_hash()}"
    if key not in cache:
        every, loud = alarms_of(tool, job, notes)
        enc = lambda xs: [[sorted(a.kinds), a.step, a.label] for a in xs]  # noqa: E731
        cache[key] = [enc(every), enc(loud)]
    dec = lambda xs: [Alarm(set(k), s, lab) for k, s, lab in xs]  # noqa: E731
    every, loud = dec(cache[key][0]), dec(cache[key][1])
    if tool == "trainproof":  # kinds from the id, so that the mapping below can change
        for a in every + loud:
            a.kinds = TRAINPROOF_KINDS.get(a.label.split(":")[0], {"other"})
        unread = [a.label.split(":")[0] for a in every if a.label.startswith(UNREAD)]
        if unread:
            notes.append(f"trainproof could not read {job.name} ({unread[0]})")
        every = [a for a in every if not a.label.startswith(UNREAD)]
        loud = [a for a in loud if not a.label.startswith(UNREAD)]
    return every, loud


def evaluate(tools: list[str]) -> tuple[dict, dict, dict, list[str]]:
    """recall[tool][kind] = (hits, total); false[tool] = (healthy runs alarmed, alarms, total);
    false_kind[tool][kind] = alarms of that kind on healthy runs."""
    recall: dict[str, dict[str, list[int]]] = {t: defaultdict(lambda: [0, 0]) for t in tools}
    false: dict[str, list[int]] = {t: [0, 0, 0] for t in tools}
    false_kind: dict[str, dict[str, int]] = {t: defaultdict(int) for t in tools}
    notes: list[str] = []
    cache: dict[str, Any] = json.loads(CACHE.read_text()) if CACHE.is_file() else {}
    for job in jobs():
        for tool in tools:
            every, loud = _cached_alarms(tool, job, notes, cache)
            for kind, onset, tol in job.events:
                r = recall[tool][kind]
                r[1] += 1
                r[0] += hit(every, kind, onset, tol)
            if job.healthy:
                f = false[tool]
                f[2] += 1
                f[0] += bool(loud)
                f[1] += len(loud)
                for a in loud:
                    for k in sorted(a.kinds)[:1]:
                        false_kind[tool][k] += 1
        CACHE.write_text(json.dumps(cache))
    return recall, false, false_kind, notes


def coverage(tool: str, kind: str) -> bool:
    if tool in ("forensics", "trainproof"):
        return True
    return kind in COVERS[tool]


def table(tools: list[str], recall: dict, false: dict, false_kind: dict) -> str:
    kinds = sorted({k for t in tools for k in recall[t]})
    head = "| kind (expected events) | " + " | ".join(tools) + " |"
    lines = [head, "|---|" + "---|" * len(tools)]
    for k in kinds:
        n = max(recall[t][k][1] for t in tools)
        cells = []
        for t in tools:
            h, tot = recall[t][k]
            cells.append(f"{h}/{tot}" if coverage(t, k) else "-")
        lines.append(f"| {k} ({n}) | " + " | ".join(cells) + " |")
    tot_cells = []
    for t in tools:
        h = sum(v[0] for v in recall[t].values())
        n = sum(v[1] for v in recall[t].values())
        tot_cells.append(f"**{h}/{n}**")
    lines.append("| **all events** | " + " | ".join(tot_cells) + " |")
    cells = [f"{false[t][0]}/{false[t][2]} ({false[t][1]} alarms)" for t in tools]
    lines.append("| **healthy runs alarmed** | " + " | ".join(cells) + " |")
    kcells = []
    for t in tools:
        fk = false_kind[t]
        kcells.append(
            ", ".join(f"{k} {v}" for k, v in sorted(fk.items(), key=lambda kv: -kv[1])) or "none"
        )
    lines.append("| false alarms by kind | " + " | ".join(kcells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-trainproof", action="store_true", help="leave trainproof out")
    ap.add_argument("--markdown", action="store_true", help="print only the table")
    args = ap.parse_args()
    tools = [t for t in TOOLS if not (args.no_trainproof and t == "trainproof")]
    recall, false, false_kind, notes = evaluate(tools)
    if not args.markdown:
        print("Recall: detected / expected events per kind ('-': the tool cannot see that kind);")
        print(
            "false alarms: healthy runs with at least one alarm (warning or worse for forensics).\n"
        )
    print(table(tools, recall, false, false_kind))
    unread = [n for n in notes if n.startswith("trainproof could not read")]
    if unread:
        print(f"\ntrainproof read nothing in {len(unread)} of the jobs (not counted as alarms):")
        for n in unread:
            print(f"  {n.removeprefix('trainproof could not read ')}")
    for n in notes:
        if n not in unread:
            print(f"\nnote: {n}")


if __name__ == "__main__":
    main()
