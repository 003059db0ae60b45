"""HF Trainer's stdout (the log dicts printed between its progress bars), read from the
console output of a real 200-step Trainer run (tests/data/hf_stdout, transformers 5) and
checked against the trainer_state.json the same run saved. Before, such a log was "no
training log format recognised"."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from forensics.importers import read_run
from forensics.pipeline import analyze

DATA = Path(__file__).resolve().parent / "data" / "hf_stdout"
KEYS = {"loss": "loss", "grad_norm": "grad_norm", "learning_rate": "lr", "eval_loss": "val_loss"}


def _state() -> list[dict]:
    return json.loads((DATA / "trainer_state.json").read_text())["log_history"]


def _series(run, metric: str) -> dict[int, float]:  # noqa: ANN001
    f = run.frame.filter(pl.col("metric").cast(pl.Utf8) == metric)
    return dict(zip(f["step"].to_list(), f["value"].to_list(), strict=True))


def test_the_progress_bar_gives_each_dict_its_step() -> None:
    run = read_run(DATA / "bars.log")
    assert run.x_unit == "step"
    for key, metric in KEYS.items():
        want = {e["step"]: e[key] for e in _state() if key in e}
        got = _series(run, metric)
        assert sorted(got) == sorted(want), metric  # every step, none more
        for step, value in want.items():
            # (transformers 5 prints four significant digits)
            assert got[step] == pytest.approx(value, rel=1e-3), (metric, step)
    # The end-of-training summary is no point of the curves (train_loss: the run's mean).
    tags = run.frame["tag"].cast(pl.Utf8).to_list()
    assert "train_loss" not in tags and "train_runtime" not in tags
    assert "bars.log: HF Trainer's stdout gives its values to 4 significant digits" in " ".join(
        run.notes
    )


def test_without_progress_bars_the_dicts_are_numbered_in_order() -> None:
    run = read_run(DATA / "plain.log")
    assert run.x_unit == "point"
    state = _state()
    train = [e for e in state if "loss" in e]
    loss = _series(run, "loss")
    assert sorted(loss) == list(range(1, len(train) + 1))
    assert [loss[k] for k in sorted(loss)] == pytest.approx([e["loss"] for e in train], rel=1e-3)
    # An evaluation takes the point of the training dict printed before it (step 50: the 5th).
    val = _series(run, "val_loss")
    assert sorted(val) == [5, 10, 15, 20]
    diag = analyze(DATA / "plain.log")
    assert diag.x_unit_note() is not None and "prints no step" in diag.x_unit_note()
    from forensics.report.charts import build_panels

    panels = build_panels(diag.evidence, diag.findings)
    assert {p.figure["layout"]["xaxis"]["title"]["text"] for p in panels} == {"point"}


def test_transformers_4_prints_numbers(tmp_path: Path) -> None:
    """transformers 4 prints the values as numbers, not strings."""
    lines = []
    for s in range(1, 31):
        lines.append(
            f"{{'loss': {3.0 - s / 20:.4f}, 'grad_norm': 1.2345678, 'learning_rate': 4.9e-05, "
            f"'epoch': {s / 30:.2f}}}"
        )
        lines.append(f" {100 * s // 30}%|#####     | {10 * s}/300 [00:01<00:10, 10.0it/s]")
    log = tmp_path / "out.log"
    log.write_text("\n".join(lines) + "\n")
    run = read_run(log)
    loss = _series(run, "loss")
    assert sorted(loss) == list(range(10, 301, 10))
    assert loss[300] == pytest.approx(1.5)
    assert _series(run, "lr")[10] == pytest.approx(4.9e-05)


def test_a_dict_after_the_last_bar_is_counted_not_guessed(tmp_path: Path) -> None:
    """A job that ended as it logged: no bar after the dict gives its step (the count shown
    last is an earlier step's), so it is left out and counted in the notes."""
    text = (DATA / "bars.log").read_bytes()
    log = tmp_path / "cut.log"
    log.write_bytes(
        text + b"{'loss': '9.876', 'grad_norm': '0.5', 'learning_rate': '1e-05', 'epoch': '3.2'}\n"
    )
    run = read_run(log)
    assert _series(run, "loss")[200] == pytest.approx(0.8286)  # (the step's own dict)
    assert 9.876 not in _series(run, "loss").values()
    assert "cut.log: 1 log line(s) printed after the last progress bar left out" in " ".join(
        run.notes
    )


def test_at_info_verbosity_the_saves_are_read() -> None:
    """With TRANSFORMERS_VERBOSITY=info the Trainer says where it saved: the rollback's
    checkpoints, from the log."""
    from forensics.evidence import Evidence

    run = read_run(DATA / "info.log")
    assert run.metadata["checkpoints"] == [50, 100, 150, 200]
    assert Evidence(run).checkpoints.where() == "checkpoints the log says it saved"
    assert sorted(_series(run, "loss")) == list(range(10, 201, 10))


def test_dicts_with_their_own_step_keep_it(tmp_path: Path) -> None:
    """A script printing the same shape with a step key: that step is the x, not a series."""
    log = tmp_path / "own.log"
    log.write_text(
        "".join(f"{{'loss': {3.0 - s / 1000:.4f}, 'step': {s}}}\n" for s in range(5, 505, 5))
    )
    run = read_run(log)
    assert run.x_unit == "step"
    assert sorted(_series(run, "loss")) == list(range(5, 505, 5))
    assert "step" not in run.frame["tag"].cast(pl.Utf8).to_list()
