"""Values no finding reports and the checks passed over without a word.

Crafted with tensorboardX: a learning rate logged as NaN for 100 steps (1,000-1,099) and a
grad norm of -1 every 100 steps (a placeholder: no norm is negative). Both runs came out
green with nothing in the report's data-quality notes: the LR checks read only its finite
points, and the -1s were judged as low grad norms. Now the NaN/Inf check notes both: where,
how many, and what was done with them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from forensics.pipeline import analyze


def _run(path: Path, *, lr_nan: bool = False, gn_placeholder: bool = False) -> Path:
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(4)
    w = SummaryWriter(str(path))
    for s in range(3000):
        w.add_scalar("train/loss", 2.0 + 6 / (1 + s / 300) + rng.normal(0, 0.02), s)
        lr = float("nan") if lr_nan and 1000 <= s < 1100 else 3e-4
        w.add_scalar("train/lr", lr, s)
        gn = -1.0 if gn_placeholder and s % 100 == 0 else 0.5 + 0.03 * rng.normal()
        w.add_scalar("train/grad_norm", gn, s)
    w.close()
    return path


def _notes(path: Path) -> list[str]:
    return [n for n in analyze(path).run.notes if n.startswith("nan_inf:")]


def test_a_nan_learning_rate_is_noted(tmp_path: Path) -> None:
    assert _notes(_run(tmp_path / "r", lr_nan=True)) == [
        "nan_inf: the learning rate is non-finite at 100 of 3,000 logged points (steps 1,000, "
        "1,001, 1,002, 1,003, 1,004, ...), left out of the checks that read it"
    ]


def test_a_negative_grad_norm_is_noted(tmp_path: Path) -> None:
    assert _notes(_run(tmp_path / "r", gn_placeholder=True)) == [
        "nan_inf: the grad norm is negative at 30 of 3,000 logged points (steps 0, 100, 200, "
        "300, 400, ...), which no norm can be: a placeholder or a logging bug; they are kept "
        "as logged, so check what the trainer writes there"
    ]


def test_a_clean_run_has_no_such_note(tmp_path: Path) -> None:
    assert _notes(_run(tmp_path / "r")) == []


def test_the_nan_inf_sentence_counts_in_words(tmp_path: Path) -> None:
    """ "(1 non-finite point(s) in 1 stretch(es))" read like a form; now singular or plural."""
    from tensorboardX import SummaryWriter

    from forensics.findings import FindingKind

    rng = np.random.default_rng(2)
    w = SummaryWriter(str(tmp_path / "r"))
    for s in range(2000):
        w.add_scalar("train/loss", 2.0 + 6 / (1 + s / 300) + rng.normal(0, 0.02), s)
        bad = s == 900 or 1200 <= s < 1202
        w.add_scalar("train/grad_norm", float("nan") if bad else 0.5 + 0.03 * rng.normal(), s)
    w.close()
    (f,) = [f for f in analyze(tmp_path / "r").findings if f.kind is FindingKind.NAN_INF]
    assert "(3 non-finite points in 2 stretches)" in f.summary
