"""HF Trainer trainer_state.json: train and eval entries, the highest-step copy, checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest

from forensics.errors import MultipleJobsError, UnreadableInputError
from forensics.importers import read_run


def _state(n_steps: int, every: int = 10, eval_every: int = 50, nan_at: int | None = None) -> dict:
    """A trainer state shaped like TrainerState.save_to_json writes it (log_history + top-level
    fields)."""
    hist: list[dict] = []
    for s in range(every, n_steps + 1, every):
        loss = 3.0 / (1 + s / 100)
        hist.append(
            {
                "epoch": s / 200,
                "grad_norm": 1.0 + s / 1000,
                "learning_rate": 5e-5 * (1 - s / 1000),
                "loss": float("nan") if s == nan_at else round(loss, 4),
                "step": s,
            }
        )
        if s % eval_every == 0:
            hist.append(
                {
                    "epoch": s / 200,
                    "eval_loss": loss + 0.1,
                    "eval_wer": 30.0 - s / 100,
                    "eval_runtime": 9.9,
                    "eval_samples_per_second": 3.1,
                    "eval_steps_per_second": 0.8,
                    "step": s,
                }
            )
    return {
        "best_metric": None,
        "best_model_checkpoint": None,
        "epoch": n_steps / 200,
        "eval_steps": eval_every,
        "global_step": n_steps,
        "is_hyper_param_search": False,
        "is_local_process_zero": True,
        "is_world_process_zero": True,
        "log_history": hist,
        "logging_steps": every,
        "max_steps": 1000,
        "num_train_epochs": 5,
        "save_steps": 100,
        "total_flos": 1.0e15,
        "train_batch_size": 8,
        "trial_name": None,
    }


def _save(path: Path, state: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")  # the Trainer's own format
    return path


def test_train_and_eval_entries(tmp_path: Path) -> None:
    """Train keys map to loss/grad_norm/lr/epoch, eval_loss to val_loss, eval_wer to eval/wer."""
    st = _state(300, nan_at=120)
    st["log_history"].append(
        {
            "epoch": 1.5,
            "step": 300,
            "total_flos": 1e15,
            "train_loss": 1.23,
            "train_runtime": 100.0,
            "train_samples_per_second": 9.0,
            "train_steps_per_second": 3.0,
        }
    )
    _save(tmp_path / "trainer_state.json", st)
    run = read_run(tmp_path)
    assert run.format == "hf_trainer_state"
    m = run.metrics()
    assert m["loss"] == "loss" and m["val_loss"] == "eval_loss" and m["grad_norm"] == "grad_norm"
    assert m["lr"] == "learning_rate" and m["eval/wer"] == "eval_wer" and m["epoch"] == "epoch"
    loss = run.series("loss")
    assert loss.height == 30 and loss.get_column("step").to_list()[:3] == [10, 20, 30]
    assert math.isnan(
        loss.filter(pl.col("step") == 120).get_column("value")[0]
    )  # NaN kept as evidence
    assert run.series("val_loss").get_column("step").to_list() == [50, 100, 150, 200, 250, 300]
    summary = run.frame.filter(pl.col("tag") == "train_loss")
    assert (
        summary.height == 1 and summary.get_column("metric")[0] is None
    )  # whole-run mean, not a point
    assert run.config["max_steps"] == 1000 and run.config["train_batch_size"] == 8
    assert run.metadata["checkpoints"] == []


def test_highest_global_step_copy_wins_and_checkpoints_are_listed(tmp_path: Path) -> None:
    """Among top level, last-checkpoint/ and checkpoint-*/ the copy with the highest global_step is
    read."""
    out = tmp_path / "output"
    _save(out / "checkpoint-100" / "trainer_state.json", _state(100))
    _save(out / "checkpoint-300" / "trainer_state.json", _state(300))
    _save(out / "checkpoint-200" / "trainer_state.json", _state(200))
    (out / "checkpoint-200" / "model.safetensors").write_bytes(b"\0" * 16)
    (out / "checkpoint-400").mkdir()
    (out / "checkpoint-400" / "optimizer.pt").write_bytes(b"\0" * 16)
    _save(out / "last-checkpoint" / "trainer_state.json", _state(250))
    run = read_run(out)
    assert run.series("loss").get_column("step").max() == 300
    assert run.metadata["checkpoints"] == [100, 200, 300, 400]
    assert run.metadata["trainer_state"] == "checkpoint-300/trainer_state.json"
    assert any("other copies not used" in n for n in run.notes)
    # a finished run: the top-level copy has the full history
    _save(out / "trainer_state.json", _state(500))
    assert read_run(out).series("loss").get_column("step").max() == 500


def test_two_output_folders_are_two_jobs(tmp_path: Path) -> None:
    """Two trainer states in sibling folders are two jobs, not one."""
    _save(tmp_path / "a" / "trainer_state.json", _state(100))
    _save(tmp_path / "b" / "trainer_state.json", _state(100))
    with pytest.raises(MultipleJobsError) as err:
        read_run(tmp_path)
    assert err.value.jobs == ["a", "b"]


@pytest.mark.parametrize(
    "content, words",
    [('{"log_history": [', "not valid JSON"), ('{"global_step": 3}', "no log_history")],
    ids=["cut-json", "no-history"],
)
def test_broken_trainer_state_is_a_one_line_error(tmp_path: Path, content: str, words: str) -> None:
    """A broken trainer_state.json: one-line UnreadableInputError naming the file and what was
    expected."""
    (tmp_path / "trainer_state.json").write_text(content)
    with pytest.raises(UnreadableInputError) as err:
        read_run(tmp_path)
    assert (
        words in str(err.value)
        and "trainer_state.json" in str(err.value)
        and "\n" not in str(err.value)
    )
