"""The `repeated_data` cause: an overfitting or a widening val-train gap tested against the
log's epoch count (the article's cause for both: a model memorising what it sees again).

Supported from the second epoch on, untested in the first (examples may repeat within it:
duplicates, an oversampled source) and without an epoch count. A mechanism, not a root: the
held-out stages of one overfitting stay one incident across epoch boundaries."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from forensics.findings import FindingKind
from forensics.pipeline import analyze

SAMPLES = Path(__file__).resolve().parent.parent / "sample_runs"


def _cause(diag, kind: FindingKind):  # type: ignore[no-untyped-def]
    i = next(k for k, f in enumerate(diag.findings) if f.kind is kind)
    (c,) = [c for c in diag.causes[i] if c.cause == "repeated_data"]
    return diag.findings[i], c


def test_the_overfitting_sample_is_many_epochs_in() -> None:
    """sample_runs/overfitting: 8 KB of text, about 8 steps an epoch. The epoch at the onset
    is read from the trainer's own log (epochs done, the HF convention)."""
    diag = analyze(SAMPLES / "overfitting")
    f, c = _cause(diag, FindingKind.OVERFITTING)
    history = json.loads((SAMPLES / "overfitting" / "trainer_state.json").read_text())
    done = {int(h["step"]): float(h["epoch"]) for h in history["log_history"] if "epoch" in h}
    at = done[f.start_step]
    running = int(np.ceil(at - 1e-9)) if at != int(at) else int(at) + 1  # (at a boundary)
    assert c.status == "supported"
    # (the count is logged every 10 steps: the epoch began between two of its points)
    before = max(s for s in done if s < f.start_step and np.floor(done[s]) < np.floor(at))
    assert c.evidence == (
        f"at step {f.start_step:,} the run was in its {running}st epoch (begun between steps "
        f"{before:,} and {f.start_step:,}): each training example had been seen at least "
        f"{running - 1} times"
    ), c.evidence
    # A mechanism: the overfitting and the grad-norm climb beside it stay one incident.
    (inc,) = [
        i for i in diag.incidents if any(x.kind is FindingKind.OVERFITTING for x in i.findings)
    ]
    assert {x.kind for x in inc.findings} == {FindingKind.OVERFITTING, FindingKind.GRAD_NORM_DRIFT}


def test_a_gap_in_the_first_epoch_is_untested_not_contradicted() -> None:
    """sample_runs/multi_eval_sets memorises 2 KB that fill 12 of every 16 rows within its
    first epoch: an epoch count cannot rule repeated examples out."""
    diag = analyze(SAMPLES / "multi_eval_sets")
    _, c = _cause(diag, FindingKind.GAP_ACCELERATION)
    assert c.status == "untested"
    assert c.evidence.startswith("the run was in its first epoch up to step "), c.evidence


def _epochs_run(folder: Path, epoch: str | None) -> Path:
    """3,000 steps of 1,000 an epoch: the training loss falls 15% at each new epoch (it
    memorises what it sees again), the validation loss 3%: the gap widens from the second.
    ``epoch``: "done" (HF: epochs done, fractions), "index" (Lightning: the 0-based index
    of the epoch running), or None (no epoch logged)."""
    rng = np.random.default_rng(2)
    n, length = 3000, 1000
    s = np.arange(n)  # (the 0-based step count: the log's steps are 1 to 3,000)
    loss = (2.0 * np.exp(-s / 800) + 1.2) * (0.85 ** (s // length)) * np.exp(rng.normal(0, 0.02, n))
    lr = 2e-5 * np.where(s < 100, s / 100, 0.5 * (1 + np.cos(np.pi * (s - 100) / (n - 100))))
    gn = (0.8 + 0.2 * np.exp(-s / 500)) * np.exp(rng.normal(0, 0.08, n))
    folder.mkdir()
    with open(folder / "metrics.jsonl", "w") as fh:
        for i in range(n):
            row = {"step": i + 1, "loss": loss[i], "lr": lr[i], "grad_norm": gn[i]}
            if epoch == "done":  # (after step 1,000 one epoch is done: 1.0)
                row["epoch"] = (i + 1) / length
            elif epoch == "index":  # (step 1,001 is the first of epoch index 1)
                row["epoch"] = i // length
            fh.write(json.dumps(row) + "\n")
            if i % 250 == 249:
                k = i // length
                val = (2.0 * np.exp(-i / 800) + 1.35) * 0.97**k + 0.02 * k
                fh.write(json.dumps({"step": i + 1, "val_loss": val}) + "\n")
    return folder


@pytest.mark.parametrize(
    ("epoch", "boundary", "began"),
    [("done", 1_000, "after step 1,000"), ("index", 1_001, "at step 1,001")],
)
def test_the_second_pass_inside_the_widening_is_named(
    tmp_path: Path, epoch: str, boundary: int, began: str
) -> None:
    """Either convention names where the second epoch began: the HF count 1.0 at step 1,000
    is the first epoch done with that step; Lightning's index 1 first shows at step 1,001."""
    diag = analyze(_epochs_run(tmp_path / "run", epoch))
    f, c = _cause(diag, FindingKind.GAP_ACCELERATION)
    lo, _ = f.onset_bounds
    assert lo < boundary <= (f.end_step or f.start_step), f
    assert c.status == "supported"
    assert c.evidence.startswith(f"epoch 2 began {began}, within the finding's steps"), c.evidence
    assert c.steps == (boundary,)


def test_no_epoch_count_leaves_it_untested(tmp_path: Path) -> None:
    diag = analyze(_epochs_run(tmp_path / "run", None))
    _, c = _cause(diag, FindingKind.GAP_ACCELERATION)
    assert (c.status, c.evidence) == ("untested", "no epoch count in the log")
