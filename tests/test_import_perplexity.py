"""A log that writes only perplexities: its loss is read as ln(perplexity) (article 2.1)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from forensics.findings import FindingKind
from forensics.importers import read_run


def _write(folder: Path, with_loss: bool) -> None:
    rng = np.random.default_rng(9)
    rows = []
    for s in range(1, 4001):
        loss = 2.0 + 1.5 * np.exp(-s / 1000) + 0.02 * rng.standard_normal()
        if 3000 <= s < 3005:
            loss += 3.0
        r: dict = {"step": s, "train/ppl": float(np.exp(loss)), "lr": 3e-4}
        if with_loss:
            r["train/loss"] = loss
        if s % 200 == 0:
            r["val/ppl"] = float(np.exp(loss + 0.05))
        rows.append(r)
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_a_log_of_perplexities_only_gets_its_losses_as_their_logs(tmp_path: Path) -> None:
    """train/ppl and val/ppl, no loss: the run was HEALTHY with no loss to judge (a 20x
    perplexity spike at step 3,000 unseen). The loss and val loss are now ln(ppl), under tags
    that say so, with a note; the spike is found."""
    import forensics

    _write(tmp_path, with_loss=False)
    run = read_run(tmp_path)
    assert run.metrics()["loss"] == "ln(train/ppl)" and run.metrics()["val_loss"] == "ln(val/ppl)"
    loss = run.series("loss")["value"].to_numpy()
    ppl = run.frame.filter(run.frame["tag"] == "train/ppl")["value"].to_numpy()
    assert np.allclose(loss, np.log(ppl))
    assert any("read as ln(train/ppl)" in n for n in run.notes)
    diag = forensics.analyze(tmp_path)
    assert any(
        f.kind is FindingKind.LOSS_SPIKE and abs(f.start_step - 3000) <= 2 for f in diag.findings
    )


def test_a_log_with_a_loss_keeps_it_and_derives_nothing(tmp_path: Path) -> None:
    """Not even the val loss from val/ppl: beside a logged loss its unit could differ
    (fairseq's loss is in bits, its perplexity 2^loss)."""
    _write(tmp_path, with_loss=True)
    run = read_run(tmp_path)
    assert run.metrics()["loss"] == "train/loss"
    assert not any("ln(" in str(t) for t in run.frame["tag"].unique().to_list())
    assert not any("natural log of its perplexity" in n for n in run.notes)
    assert "val_loss" not in run.metrics()


@pytest.mark.parametrize("tags", [("train/ppl", "train/perplexity"), ("a_ppl", "b_ppl")])
def test_two_candidate_perplexities_derive_nothing(tmp_path: Path, tags: tuple) -> None:
    """Which of two training perplexities is the loss's is a guess: none is made."""
    rows = [{"step": s, tags[0]: 10.0, tags[1]: 11.0} for s in range(1, 50)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    run = read_run(tmp_path)
    assert "loss" not in run.metrics()
