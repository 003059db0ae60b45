"""The validation-set-change cause reads the eval set a finding is about.

sample_runs/multi_eval_sets logs two eval sets (eval_idlelib_loss, eval_stdlib_loss) and no
plain validation loss. Its gap_acceleration on eval/idlelib_loss had its val_set_change cause
"untested: no validation loss in the log", beside the very series the finding judged."""

from __future__ import annotations

from pathlib import Path

from forensics.findings import FindingKind
from forensics.pipeline import analyze

SAMPLES = Path(__file__).resolve().parent.parent / "sample_runs"


def test_the_gap_on_an_eval_set_tests_that_set() -> None:
    diag = analyze(SAMPLES / "multi_eval_sets")
    i = next(k for k, f in enumerate(diag.findings) if f.kind is FindingKind.GAP_ACCELERATION)
    assert diag.findings[i].metric == "eval/idlelib_loss"
    (c,) = [c for c in diag.causes[i] if c.cause == "val_set_change"]
    assert c.status == "contradicted"
    assert c.evidence.startswith("no step in eval/idlelib_loss up to step ")


def test_a_plain_validation_loss_is_still_named_so() -> None:
    diag = analyze(SAMPLES / "overfitting")
    i = next(k for k, f in enumerate(diag.findings) if f.kind is FindingKind.OVERFITTING)
    (c,) = [c for c in diag.causes[i] if c.cause == "val_set_change"]
    assert "the validation loss" in c.evidence, c.evidence
