"""Layers frozen at first and trained later are an unfreezing, not the article's shift.

A fine-tune that unfreezes its embedding layers at step 3,000 logs their grad norms as 0
until then. Their share of the squared grad norm goes from 0% to about 24%: it had read as a
layer_grad_shift warning with the advice to slow those layers down. When every grad norm the
group logged in the early window is 0 the finding is a note that says so (``frozen_before``),
with its own treatment; layers that carried a gradient before keep the warning.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from synthetic import jsonl_row

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze


def _write(folder: Path, frozen: bool) -> Path:
    rng = np.random.default_rng(80)
    n = 6000
    rows = []
    for i in range(n):
        r = jsonl_row(i, rng)
        if i % 50 == 0:
            for layer in range(8):
                v = 0.1 * (1 + 0.05 * rng.standard_normal())
                if layer < 2 and i < 3000:
                    v = 0.0 if frozen else 0.02 * (1 + 0.05 * rng.standard_normal())
                r[f"grad_norm/layer_{layer}"] = v
        rows.append(json.dumps(r))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def test_layers_unfrozen_midway_are_a_note(tmp_path: Path) -> None:
    d = analyze(_write(tmp_path / "run", frozen=True))
    (f,) = [f for f in d.findings if f.kind is FindingKind.LAYER_GRAD_SHIFT]
    assert f.severity is Severity.INFO and f.measures["frozen_before"] is True
    assert f.measures["layers"] == "0-1" and f.start_step == 3000
    assert "was 0, as a frozen layer's: an unfreezing (a staged fine-tune)" in f.summary
    assert "unfrozen on purpose" in d.prescription_for(f)
    assert d.verdict == "healthy"


def test_layers_with_a_small_gradient_before_keep_the_warning(tmp_path: Path) -> None:
    d = analyze(_write(tmp_path / "run", frozen=False))
    (f,) = [f for f in d.findings if f.kind is FindingKind.LAYER_GRAD_SHIFT]
    assert f.severity is Severity.WARNING and f.measures["frozen_before"] is False
    assert "slow the affected layers down" in d.prescription_for(f)
