"""The Lightning callback on a real tiny MLP trained from scratch on the CPU, no logger.

The induced incidents are real ones of the training itself: an LR schedule that jumps 100x
(the loss diverges), and one that turns the LR infinite (the weights and the loss turn NaN).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning.pytorch")

from forensics.findings import Severity  # noqa: E402
from forensics.integrations.engine import PLAN_FILE  # noqa: E402
from forensics.integrations.lightning import ForensicsCallback  # noqa: E402
from forensics.pipeline import read_run  # noqa: E402


class Mlp(L.LightningModule):  # type: ignore[misc]
    def __init__(self, schedule, lr: float = 1e-3) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 64),
            torch.nn.GELU(),
            torch.nn.Linear(64, 64),
            torch.nn.GELU(),
            torch.nn.Linear(64, 4),
        )
        self.schedule, self.lr = schedule, lr
        self.log_grad_norm = False

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=False)
        return loss

    def on_before_optimizer_step(self, optimizer):
        if self.log_grad_norm:  # Lightning's own measure, to check the callback's against
            self.log_dict(L.utilities.grad_norm(self, norm_type=2))

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self.schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def data(n: int) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(4, 16, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    x = centers[y] + torch.randn(n, 16, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)


def fit(
    root: Path,
    schedule,
    cb: ForensicsCallback,
    steps: int = 90,
    every: int | None = None,
    logger: object = False,
    validate_every: int | None = None,
):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    callbacks: list = [cb]
    if every:
        callbacks.append(L.callbacks.ModelCheckpoint(every_n_train_steps=every, save_top_k=-1))
    trainer = L.Trainer(
        default_root_dir=str(root),
        max_steps=steps,
        max_epochs=-1,
        logger=logger,
        log_every_n_steps=1,
        val_check_interval=validate_every,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    val = data(64) if validate_every else None
    model = Mlp(schedule)
    model.log_grad_norm = logger is not False
    trainer.fit(model, data(16 * steps), val)
    return trainer


def test_healthy_run_goes_to_the_end_without_alert(tmp_path: Path) -> None:
    cb = ForensicsCallback()
    root = tmp_path / "root"
    csv = L.loggers.CSVLogger(root)
    trainer = fit(root, lambda s: 1.0, cb, steps=60, logger=csv, validate_every=20)
    assert trainer.global_step == 60
    assert cb.judge.judged == 60
    live = cb.live.run()
    assert {"loss", "grad_norm", "lr"} <= set(live.metrics())
    assert cb.alerts == [], [a.finding.summary for a in cb.alerts]
    # What the module logged is named and valued as Lightning's CSV logger writes it, and the
    # importer of that file maps it to the same vital sign. (The CSV logger's step is the
    # number of batches before the step, the callback's the optimizer steps after it: 1 apart.)
    saved = read_run(Path(csv.log_dir))
    assert live.metrics()["loss"] == saved.metrics()["loss"] == "train_loss"
    a, b = live.series("loss"), saved.series("loss")
    assert a["value"].to_list() == b["value"].to_list()
    assert (a["step"] - b["step"]).unique().to_list() == [1]
    # The callback's grad norm is the one Lightning's grad_norm utility measures.
    ours = live.frame.filter(live.frame["tag"] == "grad_norm")["value"]
    lightning_own = live.frame.filter(live.frame["tag"] == "grad_2.0_norm_total")["value"]
    assert len(ours) == 60 and ours.to_list() == pytest.approx(lightning_own.to_list(), rel=1e-4)
    # The val loss is read once per validation, at the step it ran after.
    assert live.series("val_loss")["step"].to_list() == [20, 40, 60]
    assert live.series("val_loss")["value"].to_list() == saved.series("val_loss")["value"].to_list()


def test_lr_jump_stops_at_orange_with_a_checkpoint(tmp_path: Path) -> None:
    onset = 40
    cb = ForensicsCallback()
    trainer = fit(tmp_path / "root", lambda s: 1.0 if s < onset else 100.0, cb)
    stop = trainer.global_step
    assert cb.stopped_by is not None, "no alert stopped the run"
    f = cb.stopped_by.finding
    print(f.kind, f.severity, f.start_step, f.summary)
    assert cb.stopped_by.severity is Severity.CRITICAL
    assert onset <= f.start_step <= stop < 90
    assert [p.name for p in cb.saved] == [f"forensics-epoch=0-step={stop}.ckpt"]
    assert cb.saved[0].is_file()
    assert cb.saved[0].parent == tmp_path / "root" / "checkpoints"
    assert all(p.is_relative_to(tmp_path / "root") for p in tmp_path.rglob("*"))


def test_nan_writes_the_rollback_plan(tmp_path: Path) -> None:
    bad = 45
    cb = ForensicsCallback()
    root = tmp_path / "root"
    trainer = fit(root, lambda s: 1.0 if s < bad else float("inf"), cb, every=10)
    stop = trainer.global_step
    assert cb.stopped_by is not None and cb.stopped_by.severity is Severity.FATAL
    plan = json.loads((root / "checkpoints" / PLAN_FILE).read_text())
    print(json.dumps(plan, indent=1))
    assert stop < 90
    ckpt = plan["checkpoint"]
    assert ckpt["step"] is not None and ckpt["step"] < bad
    assert Path(ckpt["path"]).is_file() and f"step={ckpt['step']}" in Path(ckpt["path"]).name
    lr = plan["learning_rate"]
    assert lr["resume"] == pytest.approx(0.9 * lr["before"])
    assert plan["stopped_at"]["global_step"] == stop
    assert all(p.is_relative_to(root) for p in tmp_path.rglob("*"))


def test_levels_can_be_told_to_only_warn(tmp_path: Path) -> None:
    """stop_at=None and no saving: the same LR jump alerts (each alert once, through
    on_alert) but training runs to the end; judging every 5th step is every 5th step."""
    seen = []
    cb = ForensicsCallback(stop_at=None, save_on=None, on_alert=seen.append, every_n_logs=5)
    root = tmp_path / "root"
    trainer = fit(root, lambda s: 1.0 if s < 40 else 100.0, cb, steps=70)
    assert trainer.global_step == 70
    assert cb.judge.judged == 14
    assert seen == cb.alerts and cb.stopped_by is None and cb.saved == []
    levels = {(a.finding.kind.value, a.severity.value) for a in seen}
    assert ("divergence", "critical") in levels, levels
    keys = [(a.key, a.event, a.severity) for a in seen]
    assert len(keys) == len(set(keys))  # no alert repeated
    assert not list(root.rglob("forensics-*"))


def test_a_failing_on_alert_does_not_stop_the_watch(tmp_path: Path) -> None:
    def boom(alert: object) -> None:
        raise OSError("the pager is down")

    cb = ForensicsCallback(on_alert=boom)
    trainer = fit(tmp_path / "root", lambda s: 1.0 if s < 40 else 100.0, cb)
    assert not cb.judge.disabled
    assert cb.stopped_by is not None and cb.saved and trainer.global_step < 90


def test_a_plan_that_cannot_be_written_still_stops_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "root"
    (root / "checkpoints" / PLAN_FILE).mkdir(parents=True)  # a folder where the file goes
    cb = ForensicsCallback()
    with caplog.at_level(logging.ERROR, logger="forensics.watch"):
        trainer = fit(root, lambda s: 1.0 if s < 45 else float("inf"), cb, every=10)
    assert cb.stopped_by is not None and cb.stopped_by.severity is Severity.FATAL
    assert trainer.global_step < 90 and cb.plan_path is None and not cb.judge.disabled
    assert any("writing the rollback plan" in r.getMessage() for r in caplog.records)
