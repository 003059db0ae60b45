"""The regression table: every bundled sample run and the findings it must produce.

The runs in sample_runs/ come from real training; sample_runs/events.toml records what was
injected where and which findings the tool must report, and drives the table below: one test
per expected finding, which matches when its onset lies within the tolerance. Expectations
whose capability belongs to an open issue are xfail(strict) with that issue's title; the
lead removes the title when the issue lands.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from issues import open_issue

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_runs"
EVENTS: dict[str, dict[str, Any]] = tomllib.loads((SAMPLES / "events.toml").read_text())
RUNS = list(EVENTS)
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2, "fatal": 3}


@cache
def diagnosis(name: str) -> Any:
    import forensics

    return forensics.analyze(SAMPLES / name)


def _expected() -> list[Any]:
    """One pytest.param per (run, kind, onset) of events.toml; open issues add xfail."""
    out = []
    for run, spec in EVENTS.items():
        for e in spec["expect"]:
            onsets = e["onset"] if isinstance(e["onset"], list) else [e["onset"]]
            measures = e.get("measures", {})
            for onset in onsets:
                tag = "-".join(f"{k}={v}" for k, v in measures.items())
                out.append(
                    pytest.param(
                        run,
                        e["kind"],
                        onset,
                        e["tol"],
                        e.get("severity"),
                        measures,
                        marks=[open_issue(t) for t in e.get("issues", [])],
                        id="-".join(filter(None, [run, e["kind"], str(onset), tag])),
                    )
                )
    return out


EXPECTED = _expected()


@pytest.mark.parametrize(("run", "kind", "step", "tol", "severity", "measures"), EXPECTED)
def test_expected_finding(
    run: str, kind: str, step: int, tol: int, severity: str | None, measures: dict
) -> None:
    """The run yields a finding of this kind whose onset is near the injected event."""
    found = [f for f in diagnosis(run).findings if str(f.kind) == kind]
    near = [f for f in found if abs(f.start_step - step) <= tol]
    assert near, (
        f"{run}: no {kind} with onset {step}±{tol}; "
        f"got {[(str(f.kind), f.start_step) for f in found]}"
    )
    if severity is not None:
        assert any(str(f.severity) == severity for f in near), [str(f.severity) for f in near]
    if measures:
        ok = [f for f in near if all(f.measures.get(k) == v for k, v in measures.items())]
        assert ok, f"{run}: {kind} near {step} lacks {measures}: {[f.measures for f in near]}"


def test_events_file_is_complete() -> None:
    """Every sample run folder has its entry, every entry says what was injected and expected."""
    folders = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir() and p.name != "generator")
    assert sorted(EVENTS) == folders
    from forensics.findings import FindingKind

    kinds = {k.value for k in FindingKind}
    for run, spec in EVENTS.items():
        assert set(spec) <= {"format", "quiet", "injected", "expect"}, run
        assert spec.get("quiet", False) == (not spec["injected"]), run
        assert spec.get("quiet", False) or spec["expect"], f"{run}: nothing expected"
        for ev in spec["injected"]:
            assert set(ev) <= {"start", "end", "every", "what"} and ev["what"], (run, ev)
            assert ev.get("end", ev["start"]) >= ev["start"], (run, ev)
        for e in spec["expect"]:
            assert e["kind"] in kinds and e["tol"] >= 0, (run, e)
            assert set(e) <= {"kind", "onset", "tol", "severity", "measures", "issues"}, (run, e)


def test_readme_describes_the_same_runs() -> None:
    """sample_runs/README.md's table has a row per run naming every kind the file expects."""
    readme = (SAMPLES / "README.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([a-z_]+)` \|(.*)$", readme, re.M))
    assert sorted(rows) == sorted(EVENTS)
    for run, spec in EVENTS.items():
        for e in spec["expect"]:
            assert f"`{e['kind']}`" in rows[run], f"README row of {run} does not name {e['kind']}"


@pytest.mark.parametrize("run", RUNS)
def test_format_and_findings_document(run: str, findings_schema: dict) -> None:
    """The run reads as the recorded format; its findings document follows the schema (the
    measures of every kind, typed as forensics/measures.py declares them)."""
    import jsonschema

    from forensics.measures import problems

    diag = diagnosis(run)
    assert diag.run.format == EVENTS[run]["format"]
    assert not [p for f in diag.findings for p in problems(f.kind, f.measures)]
    jsonschema.validate(diag.to_document(), findings_schema)


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
    assert doc["schema_version"] == 2
    assert doc["run"]["name"] == "bad_batch" and doc["run"]["format"] == "tfevents"
    assert doc["run"]["metrics"]["loss"] == "train/loss"
    assert doc["run"]["first_step"] == 1 and doc["run"]["last_step"] == 1000
    spikes = {f["start_step"] for f in doc["findings"] if f["kind"] == "loss_spike"}
    assert {300, 650} <= spikes, doc["findings"]
    assert doc["verdict"] in ("warning", "critical")
