"""A step logged twice with different values is said, not silently replaced.

Two ranks writing one JSONL log (each step's line twice, each rank's own loss), or a writer
that logs a step again: the analysis keeps one value per step (the last, as TensorBoard does)
and had dropped the other 3,000 values of each series with no word. A note now counts the
values left out per series and says which was kept. A step logged again with the same value
loses nothing and draws no note.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from forensics.pipeline import analyze


def _jsonl(path: Path, *, same: bool) -> Path:
    rng = np.random.default_rng(0)
    path.mkdir()
    lines = []
    for s in range(3000):
        loss = 2 + 6 / (1 + s / 300)
        for _rank in (0, 1):
            v = loss if same else loss + rng.normal(0, 0.02)
            lines.append(json.dumps({"step": s, "loss": v}))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def _relogged(notes: list[str]) -> list[str]:
    return [n for n in notes if "were logged again at a step" in n]


def test_two_ranks_in_one_log_are_noted(tmp_path: Path) -> None:
    d = analyze(_jsonl(tmp_path / "r", same=False))
    assert _relogged(d.run.notes) == [
        "3,000 value(s) were logged again at a step their series had already logged, with "
        "another value (loss: 3,000 (first at step 0)): the last value logged for each step "
        "is used, as TensorBoard does; two ranks writing one log do this"
    ]
    assert d.run.series("loss").height == 3000


def test_a_step_logged_again_with_the_same_value_is_quiet(tmp_path: Path) -> None:
    assert _relogged(analyze(_jsonl(tmp_path / "r", same=True)).run.notes) == []


def test_tensorboard_steps_written_twice(tmp_path: Path) -> None:
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(tmp_path / "tb"))
    for s in range(100):
        w.add_scalar("train/loss", 3.0 - s / 100, s)
        if s in (10, 20):
            w.add_scalar("train/loss", 9.0, s)  # logged again: this one is kept
    w.close()
    d = analyze(tmp_path / "tb")
    (note,) = _relogged(d.run.notes)
    assert (
        note.startswith("2 value(s) were logged again")
        and "train/loss: 2 (first at step 10)" in note
    )
    loss = dict(d.run.series("loss").select("step", "value").rows())
    assert loss[10] == 9.0 and loss[20] == 9.0
