"""Calibration: on healthy runs no detector gives a finding of warning or worse.

The healthy runs: the sample runs made without a fault (``healthy``, ``healthy_cosine_wd``,
``healthy_wsd``, and ``slow_eval_steps``, whose only oddity is the eval pass timed inside its
step) and the real logs that MANIFEST.md and the golden findings call healthy (llm.c 11685414
and main.log, modded-nanogpt, TinyLlama SFT, luojiu QLoRA, Alpaca, Baize, MetaMath, Lightning
version_0). One test per job. A job where a detector still fires is a strict xfail with issue
13's title and the reason; the lead removes the marker when the detector is corrected.

benchmarks/calibration.py records how close each detector comes to its threshold on the same
runs (README: "Calibration").
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from issues import JUDGEMENT, open_issue

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from tools_compare import HEALTHY_REAL, HEALTHY_SAMPLES, REAL, SAMPLES, _read  # noqa: E402

# job -> why a detector still fires there (removed when issue 13's capability lands)
STILL_FIRES: dict[str, str] = {}


@cache
def _findings(target: str, job: str | None) -> dict[str, list[tuple[str, str, int]]]:
    """(kind, severity, onset) of every finding per job (only ``job`` when given)."""
    from forensics.config import Config
    from forensics.pipeline import analyze_run

    path = (
        SAMPLES / target.removeprefix("sample_runs/")
        if target.startswith("sample_runs/")
        else (REAL / target)
    )
    out = {}
    for name, _, run in _read(path, job):
        diag = analyze_run(run, Config())
        out[name] = [(f.kind.value, f.severity.value, f.start_step) for f in diag.findings]
    return out


def _cases() -> list[Any]:
    out = []
    for name in HEALTHY_SAMPLES:
        out.append((f"sample_runs/{name}", None))
    for folder, job in HEALTHY_REAL:
        out.append((folder, job))
    params = []
    for target, job in out:
        key = f"{target}:{job or '*'}"
        marks = [open_issue(JUDGEMENT)] if key in STILL_FIRES else []
        params.append(pytest.param(target, job, id=key, marks=marks))
    return params


@pytest.mark.parametrize(("target", "job"), _cases())
def test_healthy_run_is_quiet(target: str, job: str | None) -> None:
    """Every finding on a healthy run is info: no detector cries wolf."""
    if not target.startswith("sample_runs/") and not (REAL / target).is_dir():
        pytest.skip(f"{REAL / target} is absent (../shared is not beside the project)")
    jobs = _findings(target, job)
    assert jobs, f"{target}: no job {job or ''} read"
    loud = [(j, *f) for j, fs in jobs.items() for f in fs if f[1] != "info"]
    assert not loud, f"{target}: {loud}"


def test_calibration_lists_agree() -> None:
    """The healthy runs named here are quiet in sample_runs/events.toml."""
    import tomllib

    events = tomllib.loads((SAMPLES / "events.toml").read_text())
    for name in HEALTHY_SAMPLES:
        assert name in events, name
        spec = events[name]
        louder = [e for e in spec["expect"] if e.get("severity", "info") != "info"]
        assert spec.get("quiet", False) or not louder, name
