"""A validation loss that is NaN at one eval is said, not left out unseen.

The eval at step 2,999 of a healthy run logged a NaN validation loss. The train/val checks
left that eval out and nothing in the report said so. The NaN/Inf check now notes it, with
the steps, and the start-up checklist's NaN question reads the validation loss too.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from synthetic import jsonl_row

from forensics.checklists import evaluate_checklists
from forensics.pipeline import analyze


def _write(folder: Path, nan_at: int) -> Path:
    rng = np.random.default_rng(90)
    rows = []
    for i in range(6000):
        r = jsonl_row(i, rng)
        if i % 500 == 499:
            r["val/loss"] = float("nan") if i == nan_at else 2.05 + 3 / (1 + i / 500)
        rows.append(json.dumps(r))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def test_the_nan_eval_is_noted(tmp_path: Path) -> None:
    d = analyze(_write(tmp_path / "run", 2999))
    assert d.verdict == "healthy"
    assert (
        "nan_inf: the validation loss is non-finite at 1 of 12 evals (step 2,999), left out "
        "of the train/val checks" in " ".join(d.run.notes)
    ), d.run.notes


def test_the_start_up_checklist_reads_the_validation_loss(tmp_path: Path) -> None:
    d = analyze(_write(tmp_path / "run", 499))
    assert d.evidence is not None
    items = [
        i
        for phase in evaluate_checklists(d.evidence, d.findings)
        for i in phase.items
        if i.question == "Any NaN or Inf at some step?"
    ]
    assert items and "val loss non-finite at 1 step (499)" in items[0].evidence, items[0]
