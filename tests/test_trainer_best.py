"""The checkpoint a trainer recorded as its best (HF Trainer's ``best_model_checkpoint`` and
``best_metric``) and the eval series it was judged by."""

from __future__ import annotations

import pytest

from forensics.evidence.checkpoints import TrainerBest, trainer_best

VALUES = {("val_loss", 3000): 0.3937, ("eval/wer", 3000): 0.7431560204762965}


def _at(metric: str, step: int) -> float | None:
    return VALUES.get((metric, step))


@pytest.mark.parametrize(
    "path",
    [
        "/storage/x/whisper/checkpoint-3000",
        "out/checkpoint-3000/",
        "C:\\\\runs\\\\out\\\\checkpoint-3000",
        "checkpoint-3000",
    ],
)
def test_the_step_comes_from_the_folder_name(path: str) -> None:
    got = trainer_best(
        {"best_model_checkpoint": path, "best_metric": 0.7431560204762965},
        ["val_loss", "eval/wer"],
        _at,
    )
    assert got == TrainerBest(step=3000, value=0.7431560204762965, metric="eval/wer")


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"best_model_checkpoint": None, "best_metric": 0.5},
        {"best_model_checkpoint": "out/final-model"},
        {"best_model_checkpoint": "out/checkpoint-3000-old"},
    ],
)
def test_no_best_named_is_none(config: dict) -> None:
    assert trainer_best(config, ["val_loss"], _at) is None


def test_a_best_metric_no_series_has_there_names_no_metric() -> None:
    got = trainer_best(
        {"best_model_checkpoint": "o/checkpoint-3000", "best_metric": 0.5}, ["val_loss"], _at
    )
    assert got == TrainerBest(step=3000, value=0.5, metric=None)
    assert (
        got.clause(1000, None)
        == "the trainer recorded checkpoint-3000 as its best (best_metric 0.5)"
    )
    for bad in (True, "0.5", float("nan")):
        got = trainer_best(
            {"best_model_checkpoint": "o/checkpoint-3000", "best_metric": bad}, ["val_loss"], _at
        )
        assert got == TrainerBest(step=3000, value=None, metric=None)


def test_the_clause_per_case() -> None:
    by_loss = TrainerBest(step=3000, value=0.3937, metric="val_loss")
    assert by_loss.clause(3000, 0.3937) == ""
    assert by_loss.clause(2500, 0.39) == (
        "the trainer recorded checkpoint-3000 as its best by the val loss "
        "(among the checkpoints it saved)"
    )
    by_wer = TrainerBest(step=3000, value=0.7431560204762965, metric="eval/wer")
    assert by_wer.clause(1000, 0.78878) == (
        "the trainer recorded checkpoint-3000 as its best, by eval/wer (0.7432 there, "
        "0.7888 at step 1,000)"
    )
    assert by_wer.clause(1000, None) == (
        "the trainer recorded checkpoint-3000 as its best, by eval/wer (0.7432 there)"
    )
