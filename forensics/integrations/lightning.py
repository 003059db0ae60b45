"""``ForensicsCallback`` for Lightning: the watch, inside the trainer.

After each optimizer step the callback adds what the module logged (``self.log`` values as
``trainer.callback_metrics`` holds them, under the names Lightning's CSV logger would
write), the step's loss when the module logged none, the learning rate and the total
gradient norm (measured before clipping, as Lightning's own ``grad_norm`` utility does) to a
live run, and judges it with the detectors and diagnosis of ``forensics analyze``. No logger
is needed. Orange: ``trainer.save_checkpoint`` into the trainer's checkpoint folder, then
``trainer.should_stop``. Red: the rollback plan is written as ``forensics-rollback.json``
beside the checkpoints and training stops.

    from forensics.integrations.lightning import ForensicsCallback
    trainer = lightning.Trainer(..., callbacks=[ForensicsCallback()])

Needs ``lightning`` (``pip install 'forensics[lightning]'``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from forensics.config import Config
from forensics.importers.lightning_csv import NAME as LIGHTNING_SOURCE
from forensics.integrations.engine import Decision, LiveJudge
from forensics.integrations.live_run import LiveRun
from forensics.schema import LOSS, canonicalize
from forensics.watch.alerts import Alert

_STEP = re.compile(r"(?:^|[-_])step=(\d+)")


class ForensicsCallback(pl.Callback):
    """Watch a Lightning run in-process and act on the article's lights.

    Args:
        every_n_logs: judge after every n-th optimizer step (1: each step).
        stop_at: the lowest level that stops training: ``"critical"`` (orange, default),
            ``"fatal"`` (red) or None.
        save_on: levels that save a checkpoint (default critical).
        plan_on: levels that write the rollback plan (default fatal).
        on_alert: called with each alert (``forensics.watch.alerts.Alert``).
        config: a :class:`forensics.config.Config` (detector parameters, ignored kinds).
        max_overhead: at most this fraction of the wall time spent judging (None: no limit;
            see :class:`forensics.integrations.engine.LiveJudge`).
        grad_norm: measure the total gradient norm at each step (off: only what the module
            logs is judged).

    Attributes:
        alerts, stopped_by, plan_path, saved (the checkpoints this callback saved).
    """

    def __init__(
        self,
        *,
        every_n_logs: int = 1,
        stop_at: str | None = "critical",
        save_on: str | Iterable[str] | None = ("critical",),
        plan_on: str | Iterable[str] | None = ("fatal",),
        on_alert: Callable[[Alert], Any] | None = None,
        config: Config | None = None,
        max_overhead: float | None = None,
        grad_norm: bool = True,
    ) -> None:
        self.judge = LiveJudge(
            every_n_logs=every_n_logs,
            stop_at=stop_at,
            save_on=save_on,
            plan_on=plan_on,
            on_alert=on_alert,
            config=config,
            max_overhead=max_overhead,
        )
        self.measure_grad_norm = grad_norm
        self.live: LiveRun | None = None
        self.plan_path: Path | None = None
        self.saved: list[Path] = []
        self.last_decision: Decision | None = None
        self._grad_norm: float | None = None
        self._last_step = -1
        self._seen: dict[str, float] = {}

    @property
    def alerts(self) -> list[Alert]:
        return self.judge.alerts

    @property
    def stopped_by(self) -> Alert | None:
        return self.judge.stopped_by

    # -- hooks -------------------------------------------------------------------------
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.judge.disabled:
            return
        try:
            root = Path(trainer.default_root_dir)
            self.live = LiveRun(
                root.name, root, LIGHTNING_SOURCE, aliases=self.judge.config.aliases
            )
            self.live.config = dict(getattr(pl_module, "hparams", {}) or {})
            self._last_step = trainer.global_step
        except Exception as exc:
            self.judge.fail(exc)

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        if self.judge.disabled or not self.measure_grad_norm:
            return
        try:
            grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
            if grads:
                norms = torch._foreach_norm(grads)
                on_one = [n.to(norms[0].device) for n in norms]  # a model split over devices
                self._grad_norm = float(torch.linalg.vector_norm(torch.stack(on_one)))
        except Exception as exc:
            self.judge.fail(exc)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.judge.disabled or self.live is None:
            return
        try:
            step = trainer.global_step
            if step == self._last_step:
                return  # gradient accumulation: no optimizer step yet
            self._last_step = step
            logs = self._changed(trainer.callback_metrics)
            if not any(canonicalize(k, LIGHTNING_SOURCE)[0] == LOSS for k in logs):
                loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
                if loss is not None:
                    logs["train_loss_step"] = loss
            if self._grad_norm is not None:
                logs["grad_norm"] = self._grad_norm
                self._grad_norm = None
            if trainer.optimizers:
                logs["lr"] = trainer.optimizers[0].param_groups[0]["lr"]
            logs["epoch"] = trainer.current_epoch
            self.live.add(step, logs, time.time())
            if self.judge.due():
                self._act(
                    trainer,
                    {
                        "global_step": step,
                        "epoch": trainer.current_epoch,
                        "batch_in_epoch": batch_idx + 1,
                    },
                )
        except Exception as exc:
            self.judge.fail(exc)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.judge.disabled or self.live is None or trainer.sanity_checking:
            return
        try:
            logs = self._changed(trainer.callback_metrics)
            if logs:
                self.live.add(trainer.global_step, logs, time.time())
        except Exception as exc:
            self.judge.fail(exc)

    # -- helpers -----------------------------------------------------------------------
    def _changed(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """The metrics whose value changed since they were last read: ``callback_metrics``
        keeps every metric's latest value, so an epoch's val loss is read once, not at every
        later step."""
        out: dict[str, Any] = {}
        for k, v in metrics.items():
            try:
                x = float(v)
            except (TypeError, ValueError, RuntimeError):
                continue
            old = self._seen.get(k)
            if old is not None and old == x:  # NaN != NaN: a NaN is read every time
                continue
            self._seen[k] = x
            out[k] = x
        return out

    def _act(self, trainer: pl.Trainer, position: dict[str, Any]) -> None:
        assert self.live is not None
        folder = checkpoint_dir(trainer)
        saved = _checkpoints(folder)
        self.live.checkpoints = list(saved)
        dec = self.judge.judge(self.live)
        self.last_decision = dec
        if dec.stop:  # first: a failing save or plan below must not keep training going
            trainer.should_stop = True
        if dec.save:
            path = folder / (
                f"forensics-epoch={trainer.current_epoch}-step={trainer.global_step}.ckpt"
            )
            try:
                trainer.save_checkpoint(path)
            except Exception as exc:
                self.judge.action_failed(f"saving {path}", exc)
            else:
                self.saved.append(path)
                self.live.checkpoints.append(trainer.global_step)
                saved[trainer.global_step] = path
        if dec.plan_for is not None and trainer.is_global_zero:
            self.plan_path = self.judge.write_rollback(dec, folder, saved, position)


def checkpoint_dir(trainer: pl.Trainer) -> Path:
    """Where the trainer's checkpoints go: its ModelCheckpoint's folder, else
    ``default_root_dir/checkpoints`` (Lightning's own default without a logger)."""
    cb = trainer.checkpoint_callback
    dirpath = getattr(cb, "dirpath", None) if cb is not None else None
    return Path(dirpath) if dirpath else Path(trainer.default_root_dir) / "checkpoints"


def _checkpoints(folder: Path) -> dict[int, Path]:
    """``*.ckpt`` files whose name carries ``step=N`` (Lightning's default file name)."""
    out: dict[int, Path] = {}
    try:
        for p in folder.glob("*.ckpt"):
            m = _STEP.search(p.stem)
            if m:
                out.setdefault(int(m.group(1)), p)
    except OSError:
        pass
    return dict(sorted(out.items()))
