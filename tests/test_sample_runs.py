"""The regression table: every bundled sample run and the findings it must produce.

The runs in sample_runs/ come from real training (sample_runs/README.md says what was
induced where). Each row names a finding kind and the step where the induced event began;
a finding matches when its onset lies within the tolerance. Rows whose capability belongs
to an open issue are xfail(strict) with that issue's title; the lead removes the marker
when the issue lands.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from issues import open_issue

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_runs"
RUNS = [
    "healthy",
    "bad_batch",
    "periodic_spikes",
    "divergence",
    "grad_norm_drift",
    "overfitting",
    "val_shift",
    "loss_scale_collapse",
    "nan",
    "resumed",
    "truncated_log",
    "throughput_drop",
    "memory_growth",
    "layer_grad_shift",
    "activation_outlier",
    "param_norm_jump",
]
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2, "fatal": 3}


@cache
def diagnosis(name: str) -> Any:
    import forensics

    return forensics.analyze(SAMPLES / name)


def row(
    run: str,
    kind: str,
    step: int,
    tol: int,
    *issues: str,
    severity: str | None = None,
    measures: dict[str, Any] | None = None,
) -> Any:
    """One table row; each issue still open adds an xfail(strict) marker."""
    marks = [open_issue(t) for t in issues]
    return pytest.param(
        run, kind, step, tol, severity, measures or {}, marks=marks, id=f"{run}-{kind}-{step}"
    )


# run, finding kind, onset step, tolerance[, issues still open that the capability depends on].
EXPECTED = [
    row("bad_batch", "loss_spike", 300, 2),
    row("bad_batch", "loss_spike", 650, 2),
    row("bad_batch", "loss_spike", 300, 2, measures={"classification": "physiological"}),
    row("bad_batch", "loss_scale_drop", 301, 2),
    row("periodic_spikes", "periodic_spikes", 125, 10),
    row("periodic_spikes", "loss_spike", 625, 2),
    row("divergence", "divergence", 420, 100, severity="fatal"),
    row("grad_norm_drift", "grad_norm_drift", 100, 200),
    row("overfitting", "overfitting", 200, 100),
    row("val_shift", "val_shift", 500, 40),
    row("loss_scale_collapse", "loss_scale_drop", 601, 3, severity="warning"),
    row("loss_scale_collapse", "loss_spike", 603, 3),
    row("nan", "nan_inf", 637, 3, severity="fatal"),
    row("resumed", "restart", 601, 1),
    row("truncated_log", "truncated_log", 800, 1),
    row("throughput_drop", "throughput_drop", 500, 20),
    row("memory_growth", "memory_growth", 300, 60),
    row("layer_grad_shift", "layer_grad_shift", 500, 250, measures={"layer": 1}),
    row("activation_outlier", "activation_outlier", 500, 25, measures={"layer": 2}),
    row("activation_outlier", "param_norm_jump", 500, 10),
    row("param_norm_jump", "param_norm_jump", 500, 10),
    row("param_norm_jump", "loss_spike", 501, 3, measures={"classification": "pathological"}),
]


@pytest.mark.parametrize(("run", "kind", "step", "tol", "severity", "measures"), EXPECTED)
def test_expected_finding(
    run: str, kind: str, step: int, tol: int, severity: str | None, measures: dict
) -> None:
    """The run yields a finding of this kind whose onset is near the induced step."""
    found = [f for f in diagnosis(run).findings if str(f.kind) == kind]
    near = [f for f in found if abs(f.start_step - step) <= tol]
    assert near, (
        f"{run}: no {kind} with onset {step}±{tol}; got {[(str(f.kind), f.start_step) for f in found]}"
    )
    if severity is not None:
        assert any(str(f.severity) == severity for f in near), [str(f.severity) for f in near]
    if measures:
        ok = [f for f in near if all(f.measures.get(k) == v for k, v in measures.items())]
        assert ok, f"{run}: {kind} near {step} lacks {measures}: {[f.measures for f in near]}"


def test_healthy_is_quiet() -> None:
    """The healthy run has no finding above info."""
    loud = [
        (str(f.kind), f.start_step, str(f.severity))
        for f in diagnosis("healthy").findings
        if SEVERITY_RANK[str(f.severity)] > 0
    ]
    assert not loud, loud


@pytest.mark.parametrize("run", RUNS)
def test_every_sample_reads_its_vital_signs(run: str) -> None:
    """Every sample imports with a loss series and at least one other canonical vital sign."""
    import forensics

    metrics = forensics.read_run(SAMPLES / run).metrics()
    assert "loss" in metrics and len(metrics) >= 4, metrics


def test_tensorboard_tags_are_all_canonical() -> None:
    """Every tag the generator writes to TensorBoard maps to a canonical vital sign."""
    import polars as pl

    import forensics

    r = forensics.read_run(SAMPLES / "healthy")
    unknown = r.frame.filter(pl.col("metric").is_null()).get_column("tag").unique().to_list()
    assert unknown == []
    assert set(r.metrics()) >= {
        "loss",
        "val_loss",
        "grad_norm",
        "param_norm",
        "lr",
        "loss_scale",
        "throughput",
        "memory",
        "grad_norm_layer",
        "param_norm_layer",
        "act_mean",
        "act_std",
        "act_absmax",
    }


def test_samples_stay_small() -> None:
    """The committed sample runs stay under 10 MB in all."""
    total = sum(p.stat().st_size for p in SAMPLES.rglob("*") if p.is_file() and not p.is_symlink())
    assert total < 10 * 1024 * 1024, f"{total / 1e6:.1f} MB"


def test_cli_subprocess_json() -> None:
    """The real CLI, run as a subprocess, prints a findings document for bad_batch."""
    exe = shutil.which("forensics")
    cmd = [exe] if exe else [sys.executable, "-m", "forensics"]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [*cmd, "analyze", "sample_runs/bad_batch", "--format", "json", "--no-report"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema_version"] == 1
    assert doc["run"]["name"] == "bad_batch" and doc["run"]["format"] == "tfevents"
    assert doc["run"]["metrics"]["loss"] == "train/loss"
    assert doc["run"]["first_step"] == 1 and doc["run"]["last_step"] == 1000
    spikes = {f["start_step"] for f in doc["findings"] if f["kind"] == "loss_spike"}
    assert {300, 650} <= spikes, doc["findings"]
    assert doc["verdict"] in ("warning", "critical")
