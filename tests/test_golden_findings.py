"""Golden findings: every sample run and every real log gives the findings captured in
tests/golden/findings.json (kind, severity, metric, steps, measures).

A refactor must not move a finding. A deliberate change (a number that was inconsistent, a
judgement an issue corrects) regenerates the file with ``python scripts/golden_findings.py >
tests/golden/findings.json`` in the same commit, and the commit message names the change.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import golden_findings  # noqa: E402

GOLDEN = json.loads((ROOT / "tests" / "golden" / "findings.json").read_text())


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_findings_unchanged(name: str) -> None:
    """The findings of one sample run or real log equal the captured ones."""
    targets = dict(golden_findings.targets())
    if name not in targets:
        pytest.skip(f"{name} is absent (../shared is not beside the project)")
    got = json.loads(json.dumps(golden_findings.job_findings(targets[name])))
    assert got == GOLDEN[name]
