"""A grad-norm drift tests the article's first cause for it: shallow layers learning too fast.

The article's case (3.4): the grad norm climbed while the loss fell, and the first four layers'
share of the gradient had grown from about 8% to nearly 20%. Its causes table had listed
"shallow layers learn too fast" as untested even in logs with per-layer grad norms. JSONL
runs with twelve layers' grad norms: the same drift driven by layers 0-3 alone (supported, by
the layer_grad_shift beside it) and by every layer alike (contradicted, with the shares);
without per-layer grad norms the cause is untested and says why.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from synthetic import drift_cause

from forensics.findings import FindingKind


def _run(folder: Path, shallow_only: bool, layers: bool = True) -> Path:
    rng = np.random.default_rng(8)
    folder.mkdir()
    with (folder / "metrics.jsonl").open("w") as fh:
        for step in range(0, 8001, 10):
            ramp = max(0.0, (step - 4000) / 4000)
            norms = [
                0.3
                * (1 + (2.2 if i < 4 else 0.0) * ramp if shallow_only else 1 + 1.8 * ramp)
                * (1 + 0.03 * rng.standard_normal())
                for i in range(12)
            ]
            row = {
                "step": step,
                "loss": 2 + 3 / (1 + step / 800) + rng.normal(0, 0.01),
                "lr": 3e-4,
                "grad_norm": float(np.sqrt(sum(v * v for v in norms))),
            }
            if layers:
                row.update({f"grad_norm/layers.{i}": v for i, v in enumerate(norms)})
            fh.write(json.dumps(row) + "\n")
    return folder


def _drift_cause(folder: Path):  # noqa: ANN202
    diag, _, c = drift_cause(folder, "shallow_layers", "Shallow layers")
    return diag, c


def test_supported_when_the_shallow_layers_take_the_gradient(tmp_path: Path) -> None:
    diag, c = _drift_cause(_run(tmp_path / "shallow", shallow_only=True))
    shift = next(f for f in diag.findings if f.kind is FindingKind.LAYER_GRAD_SHIFT)
    assert shift.measures["layers"] == "0-3"
    assert c.status == "supported"
    assert c.evidence.startswith("layers 0-3' share of the squared grad norm grew from ")
    assert f"(layer_grad_shift from step {shift.start_step:,})" in c.evidence
    assert "among the shallowest 4 of the 12 logged layers" in c.evidence


def test_contradicted_when_every_layer_climbs_alike(tmp_path: Path) -> None:
    diag, c = _drift_cause(_run(tmp_path / "even", shallow_only=False))
    assert not [f for f in diag.findings if f.kind is FindingKind.LAYER_GRAD_SHIFT]
    assert c.status == "contradicted"
    before, after = (float(v) for v in re.findall(r"(\d+\.\d)% ", c.evidence)[:2])
    assert before == pytest.approx(33.3, abs=1.0) and after == pytest.approx(33.3, abs=1.0)
    assert c.evidence.startswith("layers 0-3 (the shallowest 4 of 12 logged) took ")


def test_untested_without_per_layer_grad_norms(tmp_path: Path) -> None:
    _, c = _drift_cause(_run(tmp_path / "total", shallow_only=True, layers=False))
    assert c.status == "untested"
    assert c.evidence == "no per-layer grad norms in the log (grad_norm_layer)"
