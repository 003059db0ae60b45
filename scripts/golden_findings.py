"""Capture every finding on every sample run and every job in ../shared/real_runs as JSON.

Used by tests/test_golden_findings.py: a refactor must leave these findings unchanged, except
where a number was inconsistent (each such change is listed in the test's ALLOWED table).

    python scripts/golden_findings.py > tests/golden/findings.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FORENSICS_SHARED", ROOT.parent / "shared"))


def _round(v: Any) -> Any:
    if isinstance(v, float):
        return float(f"{v:.6g}")
    return v


def job_findings(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Findings per job under path (every job, as --all reads them)."""
    from forensics.config import Config
    from forensics.errors import ForensicsError
    from forensics.importers import discover_jobs, read_job
    from forensics.importers.chains import stitch_jobs
    from forensics.pipeline import analyze_run, read_options

    out: dict[str, list[dict[str, Any]]] = {}
    try:
        jobs = stitch_jobs(path, discover_jobs(path), read_options(Config()))
    except ForensicsError as exc:
        return {".": [{"error": str(exc).replace(str(path), "<path>")}]}
    for job, sources in sorted(jobs.items()):
        try:
            run = read_job(
                path, job, sources, options=read_options(Config()), only_job=len(jobs) == 1
            )
            diag = analyze_run(run, Config())
        except ForensicsError as exc:
            out[job] = [{"error": str(exc).replace(str(path), "<path>")}]
            continue
        out[job] = [
            {
                "kind": f.kind.value,
                "severity": f.severity.value,
                "metric": f.metric,
                "steps": [f.start_step, f.peak_step, f.end_step],
                "measures": {k: _round(v) for k, v in sorted(f.measures.items())},
            }
            for f in diag.findings
        ]
    return out


def targets() -> list[tuple[str, Path]]:
    out = [
        (f"sample_runs/{p.name}", p)
        for p in sorted((ROOT / "sample_runs").iterdir())
        if p.is_dir() and p.name != "generator"
    ]
    real = SHARED / "real_runs"
    if real.is_dir():
        out += [(f"real_runs/{p.name}", p) for p in sorted(real.iterdir()) if p.is_dir()]
    return out


def main() -> None:
    result = {name: job_findings(path) for name, path in targets()}
    json.dump(result, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
