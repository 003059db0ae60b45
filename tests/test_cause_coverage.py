"""A cause test says "contradicted" only where its series was logged around the onset.

Found in a review pass: a grad norm logged for the first 2,000 steps only (the logging turned
off) had a loss spike at step 8,000 read "contradicted: no grad-norm drift before step 8,000";
nothing could show a climb there. The activations' and the loss scale's tests already asked
for points around the onset (tests/test_model_wide_activations.py, test_causes.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from forensics.pipeline import analyze


def _write(folder: Path, grad_norm_steps: range, lr_steps: range = range(10_000)) -> Path:
    """A falling loss with a spike at step 8,000; the grad norm and the LR logged at the
    steps given."""
    rng = np.random.default_rng(11)
    folder.mkdir()
    with open(folder / "metrics.jsonl", "w") as f:
        for i in range(10_000):
            loss = 2 + 3 / (1 + i / 500) + rng.normal(0, 0.02)
            if 8000 <= i < 8400:
                loss += 1.5 * (1 - (i - 8000) / 400)
            row: dict[str, float] = {"step": i, "loss": loss}
            if i in lr_steps:
                row["lr"] = 3e-4
            if i in grad_norm_steps:
                row["grad_norm"] = 1 + 0.05 * rng.standard_normal()
            f.write(json.dumps(row) + "\n")
    return folder


def _climb(folder: Path):  # noqa: ANN202
    d = analyze(folder)
    spike = next(f for f in d.findings if f.kind.value == "loss_spike")
    return next(c for c in d.causes[d.findings.index(spike)] if c.cause == "grad_norm_climb")


def test_a_grad_norm_logged_long_before_the_onset_cannot_contradict_a_climb(
    tmp_path: Path,
) -> None:
    c = _climb(_write(tmp_path / "run", range(2000)))
    assert (c.status, c.evidence) == ("untested", "the grad norm is logged only at steps 0-1,999")


def test_a_grad_norm_that_begins_after_the_onset(tmp_path: Path) -> None:
    c = _climb(_write(tmp_path / "run", range(9000, 10_000)))
    assert (c.status, c.evidence) == (
        "untested",
        "nothing of the grad norm is logged before step 8,000 (it begins at step 9,000)",
    )


def test_a_grad_norm_logged_through_the_onset_still_contradicts(tmp_path: Path) -> None:
    c = _climb(_write(tmp_path / "run", range(10_000)))
    assert (c.status, c.evidence) == ("contradicted", "no grad-norm drift before step 8,000")


def test_an_lr_logged_long_before_the_onset_cannot_contradict_a_change(tmp_path: Path) -> None:
    """The LR logged for the first 2,000 steps only: the spike at step 8,000 read
    "contradicted: the logged LR follows its schedule (outside the logged LR)" and "no warm-up
    end, restart or step drop ... (the LR is in its unlogged phase there)"."""
    d = analyze(_write(tmp_path / "run", range(10_000), lr_steps=range(2000)))
    spike = next(f for f in d.findings if f.kind.value == "loss_spike")
    got = {c.cause: (c.status, c.evidence) for c in d.causes[d.findings.index(spike)]}
    for cause in ("lr_change", "lr_schedule"):
        assert got[cause] == ("untested", "the LR is logged only at steps 0-1,999")


def test_an_lr_logged_through_the_onset_still_contradicts(tmp_path: Path) -> None:
    d = analyze(_write(tmp_path / "run", range(10_000)))
    spike = next(f for f in d.findings if f.kind.value == "loss_spike")
    got = {c.cause: c.status for c in d.causes[d.findings.index(spike)]}
    assert (got["lr_change"], got["lr_schedule"]) == ("contradicted", "contradicted")
