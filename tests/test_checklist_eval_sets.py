"""The checklists and the coverage table read every held-out loss, as the train/val checks do.

Read against its charts, the multi_eval_sets report (HF Trainer, two eval sets and no plain
``eval_loss``) answered "Has the validation loss started to rise?" with "not measurable:
validation loss not logged in this phase" and its coverage table said "validation loss: not
logged", beside an evaluation chart of eval/idlelib_loss and eval/stdlib_loss every 40 steps
and a gap-acceleration finding judged on the first of them."""

from __future__ import annotations

from pathlib import Path

from forensics.checklists import FAIL, NA, PASS
from forensics.importers import read_run
from forensics.pipeline import analyze_run

SAMPLE = Path(__file__).resolve().parents[1] / "sample_runs" / "multi_eval_sets"


def test_late_phase_and_coverage_read_the_eval_sets() -> None:
    diag = analyze_run(read_run(SAMPLE))
    late = next(p for p in diag.phases if p.key == "late")
    (item,) = [i for i in late.items if i.question.startswith("Has the validation loss started")]
    assert item.status in (PASS, FAIL) and item.status != NA, item
    assert "eval/idlelib_loss" in item.evidence or "eval/stdlib_loss" in item.evidence, item
    (row,) = [c for c in diag.coverage if c.signs == "validation loss"]
    assert row.logged, row
    assert "eval/idlelib_loss: every 40 steps" in row.observed, row.observed
    assert "eval/stdlib_loss: every 40 steps" in row.observed, row.observed
