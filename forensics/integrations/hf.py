"""``ForensicsCallback`` for the Hugging Face ``Trainer``: the watch, inside the trainer.

Each ``on_log`` adds the logged dict (the same row the Trainer appends to
``trainer_state.json``'s ``log_history``) to a live run and, every ``every_n_logs`` logs,
judges it with the detectors and diagnosis of ``forensics analyze``. Orange: the Trainer
saves a checkpoint (``checkpoint-N`` in ``output_dir``) and stops. Red: the rollback plan
is written as ``forensics-rollback.json`` in ``output_dir`` and training stops.

    from forensics.integrations.hf import ForensicsCallback
    trainer = Trainer(..., callbacks=[ForensicsCallback()])

Needs ``transformers`` (``pip install 'forensics[hf]'``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from forensics.config import Config
from forensics.importers.hf_trainer_state import NAME as HF_SOURCE
from forensics.integrations.engine import Decision, LiveJudge
from forensics.integrations.live_run import LiveRun
from forensics.watch.alerts import Alert

_CKPT = re.compile(r"^checkpoint-(\d+)$")
_CONFIG_ARGS = (
    "output_dir",
    "learning_rate",
    "max_steps",
    "num_train_epochs",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "logging_steps",
    "save_steps",
    "eval_steps",
    "max_grad_norm",
    "seed",
)


class ForensicsCallback(TrainerCallback):
    """Watch a Trainer's logs in-process and act on the article's lights.

    Args:
        every_n_logs: judge after every n-th log (1: each log; judging a run of a few
            thousand logs takes a fraction of a second).
        stop_at: the lowest level that stops training: ``"critical"`` (orange, default),
            ``"fatal"`` (red) or None.
        save_on: levels that make the Trainer save a checkpoint (default critical).
        plan_on: levels that write the rollback plan (default fatal).
        on_alert: called with each alert (``forensics.watch.alerts.Alert``).
        config: a :class:`forensics.config.Config` (detector parameters, ignored kinds).
        max_overhead: at most this fraction of the wall time spent judging (None: no limit;
            see :class:`forensics.integrations.engine.LiveJudge`).

    Attributes:
        alerts: every alert so far; ``stopped_by``: the alert that stopped training;
        plan_path: the rollback plan written, if any.
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
        self.live: LiveRun | None = None
        self.plan_path: Path | None = None
        self.last_decision: Decision | None = None

    @property
    def alerts(self) -> list[Alert]:
        return self.judge.alerts

    @property
    def stopped_by(self) -> Alert | None:
        return self.judge.stopped_by

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.judge.disabled:
            return
        try:
            out = _output_dir(args)
            live = LiveRun(out.name, out, HF_SOURCE, aliases=self.judge.config.aliases)
            live.config = {k: getattr(args, k) for k in _CONFIG_ARGS if hasattr(args, k)}
            # A resumed run: its history so far (loaded from the checkpoint) is evidence too.
            for row in state.log_history:
                step = row.get("step") if isinstance(row, dict) else None
                if isinstance(step, int):
                    live.add(step, row)
            self.live = live
        except Exception as exc:
            self.judge.fail(exc)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kw: Any,
    ) -> None:
        if self.judge.disabled or self.live is None or not logs:
            return
        try:
            self.live.add(state.global_step, logs, time.time())
            if "train_runtime" in logs or not self.judge.due():
                # the end-of-training summary: kept as the importer keeps it, nothing to act on
                return
            out = _output_dir(args)
            self.live.checkpoints = list(_checkpoints(out))
            dec = self.judge.judge(self.live)
            self.last_decision = dec
            if dec.save:
                control.should_save = True
            if dec.stop:  # first: a plan that cannot be written must not keep training going
                control.should_training_stop = True
            if dec.plan_for is not None and state.is_world_process_zero:
                position = {
                    "global_step": state.global_step,
                    "epoch": state.epoch,
                    "gradient_accumulation_steps": args.gradient_accumulation_steps,
                }
                self.plan_path = self.judge.write_rollback(dec, out, _checkpoints(out), position)
        except Exception as exc:
            self.judge.fail(exc)


def _output_dir(args: TrainingArguments) -> Path:
    return Path(args.output_dir or "trainer_output")  # the Trainer's own default


def _checkpoints(output_dir: Path) -> dict[int, Path]:
    """``checkpoint-N`` folders in the output folder, by step."""
    out: dict[int, Path] = {}
    try:
        for p in output_dir.iterdir():
            m = _CKPT.match(p.name)
            if m and p.is_dir():
                out[int(m.group(1))] = p
    except OSError:
        pass
    return dict(sorted(out.items()))
