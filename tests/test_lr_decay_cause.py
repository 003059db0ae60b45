"""A grad-norm drift tests the LR decay as its cause, as its own sentence judges it.

With weight decay the grad norm grows about as sqrt(lr_baseline / lr) while the LR decays; the
drift detector judges a climb against that envelope and calls one it explains a note
("Expected, not a drift"). The causes under that card had said nothing of the schedule: the
LR change was contradicted ("the LR follows its schedule") and the only supported cause was a
pathology (shallow layers), beside a prescription of "no action". Now ``lr_decay`` carries the
detector's verdict with the numbers of its sentence: supported on the ``grad_norm_drift``
sample (real training, TensorBoard), contradicted at a constant LR (``multi_eval_sets``, HF
Trainer) and for a climb past the line a decay sets (JSONL), untested without a logged LR.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from forensics.causes import CAUSES, ROOTS, supported_roots
from forensics.evidence.trend_utils import sig
from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"


def _drift(folder: Path):  # noqa: ANN202
    diag = analyze(folder)
    i = next(k for k, f in enumerate(diag.findings) if f.kind is FindingKind.GRAD_NORM_DRIFT)
    (c,) = [c for c in diag.causes[i] if c.cause == "lr_decay"]
    return diag, diag.findings[i], c


def _jsonl(folder: Path, lr: bool = True) -> Path:
    """A climb from step 2,000 to 4x its level while the LR decays only to half (a decay
    that explains about 1.4x)."""
    rng = np.random.default_rng(3)
    folder.mkdir()
    with (folder / "metrics.jsonl").open("w") as fh:
        for step in range(0, 6001, 10):
            ramp = max(0.0, (step - 2000) / 4000)
            row = {
                "step": step,
                "loss": 2 + 3 / (1 + step / 500) + rng.normal(0, 0.01),
                "grad_norm": 0.5 * (1 + 3 * ramp) * (1 + 0.03 * rng.standard_normal()),
            }
            if lr:
                row["lr"] = 3e-4 * (1 - 0.5 * ramp)
            fh.write(json.dumps(row) + "\n")
    return folder


def test_the_cause_is_a_root_with_its_words() -> None:
    assert "lr_decay" in ROOTS
    assert CAUSES["lr_decay"].startswith("The LR decay")


def test_supported_where_the_decay_explains_the_climb() -> None:
    diag, f, c = _drift(SAMPLES / "grad_norm_drift")
    m = f.measures
    assert f.severity is Severity.INFO and m["schedule_explained"] is True
    assert c.status == "supported"
    # The numbers of the finding's own sentence, as it writes them.
    fell = f"the LR fell from {sig(m['lr_baseline'])} to {sig(m['lr_now'])}"
    assert fell in f.summary.replace("decayed", "fell")
    line = f.judged_against["warn_line_now"] / m["baseline"]
    assert c.evidence == (
        f"{fell} over the climb, which explains a rise up to {m['expected_rise']:.1f}x; the grad "
        f"norm stands at {m['ratio']:.1f}x, under the {line:.1f}x warning line that sets"
    )
    assert f"{line:.1f}x warning line" in f.summary
    i = diag.findings.index(f)
    assert [r.cause for r in supported_roots(diag.causes[i])] == ["lr_decay"]
    assert not diag.incidents  # a note: no incident


def test_contradicted_at_a_constant_learning_rate() -> None:
    _, f, c = _drift(SAMPLES / "multi_eval_sets")
    m = f.measures
    assert f.severity is not Severity.INFO and m["lr_phase_at_warning"] == "constant"
    assert c.status == "contradicted"
    assert c.evidence == (
        f"the grad norm passed its 2x line at step {m['warning_step']:,} while the LR held at "
        f"{sig(m['lr_now'])}"
    )
    assert f"({sig(m['lr_now'])})" in f.summary  # the LR the sentence names


def test_contradicted_past_the_line_a_decay_sets(tmp_path: Path) -> None:
    _, f, c = _drift(_jsonl(tmp_path / "half"))
    m = f.measures
    assert m["schedule_explained"] is False and m["lr_phase_at_warning"] == "decay"
    assert m["expected_rise"] == pytest.approx(np.sqrt(2), abs=0.05)
    assert c.status == "contradicted"
    line = f.judged_against["warn_line_now"] / m["baseline"]
    assert c.evidence == (
        f"the LR decay from {sig(m['lr_baseline'])} to {sig(m['lr_now'])} explains a rise up "
        f"to {m['expected_rise']:.1f}x; the grad norm stands at {m['ratio']:.1f}x, above the "
        f"warning line of {line:.1f}x"
    )
    assert m["ratio"] > line


def test_untested_without_a_logged_learning_rate(tmp_path: Path) -> None:
    _, f, c = _drift(_jsonl(tmp_path / "nolr", lr=False))
    assert f.measures["lr_logged"] is False
    assert c.status == "untested"
    assert c.evidence == "no learning rate in the log"
