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


# -- end to end, on trainer states written by transformers' own TrainerState.save_to_json ------


def _state_folder(tmp_path, best: str | None, epoch_end_evals: bool = False):
    """A fine-tune of 1,000 steps (100 a "epoch"), evals every 100 steps: the val loss is lowest
    at step 300 and rises after it, the eval accuracy improves to step 700 and slips after.
    ``best``: what the trainer recorded as its best ("accuracy": checkpoint-700 by
    eval_accuracy; "loss": checkpoint-300 by eval_loss; None: nothing)."""
    import math

    transformers = pytest.importorskip("transformers")
    hist: list[dict] = []
    for s in range(10, 1001, 10):
        if not epoch_end_evals or s % 100:
            hist.append(
                {
                    "epoch": s / 100,
                    "grad_norm": 1.0,
                    "learning_rate": 1e-4,
                    "step": s,
                    "loss": round(3.0 * math.exp(-s / 300) + 0.2, 4),
                }
            )
        if s % 100 == 0:
            val = 2.0 - 0.3 * min(s, 300) / 300 + 0.08 * max(0, s - 300) / 100
            acc = 0.5 + 0.1 * min(s, 700) / 700 - 0.01 * max(0, s - 700) / 100
            hist.append({"epoch": s / 100, "eval_loss": val, "eval_accuracy": acc, "step": s})
    state = transformers.TrainerState(
        epoch=10.0,
        global_step=1000,
        max_steps=1000,
        logging_steps=10,
        eval_steps=100,
        save_steps=100,
        log_history=hist,
    )
    if best is not None:
        step, key = (700, "eval_accuracy") if best == "accuracy" else (300, "eval_loss")
        state.best_metric = next(h[key] for h in hist if h["step"] == step and key in h)
        state.best_global_step = step
        state.best_model_checkpoint = f"out/checkpoint-{step}"
    state.save_to_json(str(tmp_path / "trainer_state.json"))
    return tmp_path


def _findings(folder):
    from forensics import analyze

    d = analyze(folder)
    return d, {f.kind.value: f for f in d.findings}


def test_a_trainer_best_by_another_metric_is_named_beside_the_lowest_val_loss(tmp_path) -> None:
    d, fs = _findings(_state_folder(tmp_path, "accuracy"))
    o = fs["overfitting"]
    assert o.start_step == 300 and o.measures["trainer_best_step"] == 700
    assert o.measures["trainer_best_metric"] == "eval/accuracy"
    assert (
        "the best checkpoint is step 300 (lowest val loss; saved); the trainer recorded "
        "checkpoint-700 as its best, by eval/accuracy (0.6 there, 0.5429 at step 300)." in o.summary
    )
    (plan,) = [i.rollback for i in d.incidents if i.rollback and i.rollback.finding is o]
    assert "keep that one if eval/accuracy is what the model is for" in plan.sentence()


def test_a_trainer_best_at_the_lowest_val_loss_says_so_once(tmp_path) -> None:
    d, fs = _findings(_state_folder(tmp_path, "loss"))
    o = fs["overfitting"]
    assert o.measures["trainer_best_step"] == 300
    assert o.measures["trainer_best_metric"] == "val_loss"
    assert "(lowest val loss; saved; the trainer's recorded best too)." in o.summary
    assert "the trainer recorded" not in o.summary
    assert all(
        "the trainer recorded" not in i.rollback.sentence() for i in d.incidents if i.rollback
    )


def test_no_trainer_best_adds_nothing(tmp_path) -> None:
    _, fs = _findings(_state_folder(tmp_path, None))
    o = fs["overfitting"]
    assert o.measures["trainer_best_step"] is None and o.measures["trainer_best_metric"] is None
    assert "trainer" not in o.summary


def test_the_epoch_of_an_eval_at_an_epochs_end_is_that_epoch(tmp_path) -> None:
    """The HF Trainer logs the epochs done: the eval at step 300 is logged at epoch 3.0, the end
    of the third (not the start of a fourth); 3.5 would be in the fourth."""
    _, fs = _findings(_state_folder(tmp_path, None, epoch_end_evals=True))
    o = fs["overfitting"]
    assert "turned up at step 300 (in the 3rd epoch)," in o.summary
    assert o.measures["epoch"] == 3 and o.measures["epoch_now"] == 10


def test_an_eval_score_that_slipped_gives_the_logged_values_beside_its_medians(tmp_path) -> None:
    """eval/accuracy: 0.6 logged at step 700, its best; the median of the three evals there is
    0.59; the last three (0.59, 0.58, 0.57) have the median 0.58. Each median is named as one,
    with the value logged at its step."""
    _, fs = _findings(_state_folder(tmp_path, None))
    r = fs["eval_regression"]
    assert r.measures["best_logged"] == pytest.approx(0.6) and r.measures["best"] == pytest.approx(
        0.59
    )
    assert r.measures["last_value"] == pytest.approx(0.57) and r.measures["current_evals"] == 3
    assert r.summary.startswith(
        "eval/accuracy slipped from 0.59 around step 700 (the median of 3 evals; 0.6 logged "
        "there) to 0.58 (the median of the last 3; 0.57 at step 1,000), 1.7% worse, while"
    )
