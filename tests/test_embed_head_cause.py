"""A grad-norm drift tests the article's second cause for it: the embedding and output head.

The article (section 3 and its table): under a falling loss the grad norm climbs when the
embedding and the output head, whose gradients run an order of magnitude larger than the
trunk's, share the trunk's learning rate. JSONL runs logging the total grad norm, twelve
layers' and the two modules' (grad_norm/model.embed_tokens, grad_norm/lm_head, read as
grad_norm_embed and grad_norm_head): the head alone driving the climb (supported), every part
climbing alike (contradicted), and the modules not logged (untested, saying so).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from synthetic import drift_cause

from forensics.pipeline import analyze


def _run(folder: Path, head_only: bool, modules: bool = True, start: int = 3000) -> Path:
    rng = np.random.default_rng(5)
    folder.mkdir()
    with (folder / "metrics.jsonl").open("w") as fh:
        for step in range(0, 6001, 10):
            ramp = max(0.0, (step - start) / 300)  # 11x by step 6,000 (from 3,000)
            grow = 1.0 if head_only else 1 + ramp / 4
            norms = {"grad_norm/model.embed_tokens": 0.2 * grow}
            norms.update({f"grad_norm/model.layers.{i}": 0.3 * grow for i in range(12)})
            norms["grad_norm/lm_head"] = 0.25 * (1 + ramp if head_only else grow)
            norms = {k: v * (1 + 0.05 * rng.standard_normal()) for k, v in norms.items()}
            row = {
                "step": step,
                "loss": 2 + 3 / (1 + step / 500) + rng.normal(0, 0.01),
                "lr": 3e-4,
                "grad_norm": float(np.sqrt(sum(v * v for v in norms.values()))),
            }
            if not modules:
                del norms["grad_norm/model.embed_tokens"], norms["grad_norm/lm_head"]
            row.update(norms)
            fh.write(json.dumps(row) + "\n")
    return folder


def _cause(folder: Path):  # noqa: ANN202
    diag, i, c = drift_cause(folder, "embed_head", "Embedding")
    return diag.findings[i], c


def test_supported_when_the_head_takes_the_gradient(tmp_path: Path) -> None:
    drift, c = _cause(_run(tmp_path / "head", head_only=True))
    assert c.status == "supported"
    assert c.evidence.startswith("the embedding and output head took ")
    before, after = (float(v) for v in re.findall(r"(\d+\.\d)% ", c.evidence))
    assert 5 < before < 15 and after > 50
    assert f"before step {drift.start_step:,}" in c.evidence


def test_contradicted_when_every_part_climbs_alike(tmp_path: Path) -> None:
    _, c = _cause(_run(tmp_path / "even", head_only=False))
    assert c.status == "contradicted", c.evidence


def test_untested_without_the_modules(tmp_path: Path) -> None:
    _, c = _cause(_run(tmp_path / "none", head_only=True, modules=False))
    assert c.status == "untested"
    assert c.evidence == (
        "no embedding or output-head grad norm in the log (grad_norm_embed, grad_norm_head)"
    )


def test_the_report_draws_the_share_the_cause_reads(tmp_path: Path) -> None:
    """The report's panel draws each module's share of the squared grad norm (in %), the
    numbers the cause's sentence gives as medians."""
    from forensics.evidence.module_share import module_shares
    from forensics.report.charts import build_panels

    diag = analyze(_run(tmp_path / "head", head_only=True))
    (panel,) = [
        p
        for p in build_panels(diag.evidence, list(diag.findings))
        if p.title == "Embedding and output head: share of the gradient"
    ]
    names = [t["name"] for t in panel.figure["data"]]
    assert names == ["the embedding", "the output head", "both"]
    got = module_shares(diag.evidence)
    assert got is not None
    head = panel.figure["data"][1]
    at = dict(zip(head["x"], head["y"], strict=True))
    for step, share in zip(got.steps[:50], got.shares["grad_norm_head"][:50], strict=True):
        assert at[int(step)] == pytest.approx(100 * share, rel=1e-5)  # (6 digits drawn)


def test_the_middle_phase_checklist_reads_the_share(tmp_path: Path) -> None:
    """The article's middle-phase question "is the per-layer gradient-norm distribution
    stable?" fails when the head takes the gradient in that phase (it had passed on the
    numbered layers alone), and states the share when it held."""
    diag = analyze(_run(tmp_path / "mid", head_only=True, start=1000))

    def answer(d) -> tuple[str, str]:  # noqa: ANN001
        (middle,) = [p for p in d.phases if p.key == "middle"]
        (item,) = [i for i in middle.items if "per-layer gradient-norm" in i.question]
        return item.status, item.evidence

    status, evidence = answer(diag)
    assert status == "fail"
    assert evidence.startswith("the embedding and output head took ")
    assert "of the squared grad norm (medians of the phase's first and last thirds)" in evidence
    status, evidence = answer(analyze(_run(tmp_path / "even", head_only=False)))
    assert status == "pass" and "12 layers logged, no layer-share shift found; the " in evidence
