"""The HF Trainer callback on a real tiny GPT-2 trained from scratch on the CPU.

No downloaded weights, no network: the model is built from a config and the data are token
sequences made here. The induced incidents are real ones of the training itself: an LR
schedule that jumps 100x (the loss diverges), and one that turns the LR infinite (the weights
and then the loss turn NaN).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from forensics.config import Config  # noqa: E402
from forensics.errors import ConfigError  # noqa: E402
from forensics.findings import Severity  # noqa: E402
from forensics.integrations.engine import PLAN_FILE  # noqa: E402
from forensics.integrations.hf import ForensicsCallback  # noqa: E402
from forensics.pipeline import read_run  # noqa: E402
from forensics.watch.alerts import Event  # noqa: E402

VOCAB, SEQ = 64, 32


class Sequences(torch.utils.data.Dataset):  # type: ignore[misc]
    """Counting sequences (start and stride drawn per item): learnable, so the loss falls."""

    def __init__(self, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        stride = torch.randint(1, 4, (n, 1), generator=g)
        self.ids = (start + stride * torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, object]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train(out: Path, schedule, callback: ForensicsCallback, max_steps: int = 90, save_steps=10):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=SEQ,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(cfg)
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        logging_steps=1,
        save_steps=save_steps,
        save_only_model=True,
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
        data_seed=0,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=Sequences(max_steps * 8),
        optimizers=(opt, sched),
        callbacks=[callback],
    )
    trainer.train()
    return trainer


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def test_healthy_run_goes_to_the_end_without_alert(tmp_path: Path) -> None:
    cb = ForensicsCallback()
    out = tmp_path / "out"
    trainer = train(out, lambda s: 1.0, cb, max_steps=60)
    assert trainer.state.global_step == 60
    assert cb.judge.judged == 60  # every log judged; the end-of-training summary is not
    assert cb.alerts == [], [a.finding.summary for a in cb.alerts]
    assert not (out / PLAN_FILE).exists()
    # The live run is the run `forensics analyze` reads from the Trainer's own state file.
    live, saved = cb.live.run(), read_run(out)
    assert live.metrics() == saved.metrics()
    for metric in ("loss", "grad_norm", "lr"):
        assert (
            live.series(metric)
            .select("step", "value")
            .equals(saved.series(metric).select("step", "value"))
        ), metric
    assert live.metadata["checkpoints"] == [10, 20, 30, 40, 50]  # as of the last judgement
    assert saved.metadata["checkpoints"] == [10, 20, 30, 40, 50, 60]


def test_an_internal_error_is_logged_once_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import forensics.pipeline

    def broken(*a: object, **k: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(forensics.pipeline, "analyze_run", broken)
    cb = ForensicsCallback()
    with caplog.at_level(logging.ERROR, logger="forensics.watch"):
        trainer = train(tmp_path / "out", lambda s: 1.0, cb, max_steps=12)
    assert trainer.state.global_step == 12
    assert cb.judge.disabled
    lines = [r for r in caplog.records if r.name == "forensics.watch"]
    assert len(lines) == 1 and "RuntimeError: boom" in lines[0].getMessage()


def test_bad_options_are_refused_before_training() -> None:
    with pytest.raises(ValueError, match="stop_at"):
        ForensicsCallback(stop_at="orange")
    with pytest.raises(ValueError, match="every_n_logs"):
        ForensicsCallback(every_n_logs=0)
    with pytest.raises(ConfigError):
        ForensicsCallback(config=Config(detectors={"spikes": {"no_such_param": 1}}))


def test_lr_jump_stops_at_orange_with_a_checkpoint(tmp_path: Path) -> None:
    onset = 40
    cb = ForensicsCallback()
    before = files_under(tmp_path)
    trainer = train(tmp_path / "out", lambda s: 1.0 if s < onset else 100.0, cb)
    stop = trainer.state.global_step
    assert cb.stopped_by is not None, "no alert stopped the run"
    f = cb.stopped_by.finding
    print(f.kind, f.severity, f.start_step, f.summary)
    assert cb.stopped_by.severity is Severity.CRITICAL
    assert onset <= f.start_step <= stop < 90
    assert (tmp_path / "out" / f"checkpoint-{stop}").is_dir()
    assert not (tmp_path / "out" / PLAN_FILE).exists()
    new = files_under(tmp_path) - before
    assert all(p.is_relative_to(tmp_path / "out") for p in new)


def test_nan_writes_the_rollback_plan(tmp_path: Path) -> None:
    bad = 45
    cb = ForensicsCallback()
    out = tmp_path / "out"
    before = files_under(tmp_path)
    trainer = train(out, lambda s: 1.0 if s < bad else float("inf"), cb)
    stop = trainer.state.global_step
    assert cb.stopped_by is not None and cb.stopped_by.severity is Severity.FATAL
    assert cb.stopped_by.event is Event.NEW
    plan = json.loads((out / PLAN_FILE).read_text())
    print(json.dumps(plan, indent=1))
    assert cb.plan_path == out / PLAN_FILE
    assert stop < 90
    ckpt = plan["checkpoint"]
    assert ckpt["step"] is not None and ckpt["step"] < bad
    assert Path(ckpt["path"]).is_dir() and Path(ckpt["path"]).name == f"checkpoint-{ckpt['step']}"
    lr = plan["learning_rate"]
    assert lr["resume"] == pytest.approx(0.9 * lr["before"])
    assert plan["stopped_at"]["global_step"] == stop
    assert all(p.is_relative_to(out) for p in files_under(tmp_path) - before)
