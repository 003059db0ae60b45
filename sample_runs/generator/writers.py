"""One logger per output format, each writing what that framework's user would have on disk.

All share the interface ``scalar(tag, value, step)`` / ``flush()`` / ``close()``. The training
loop speaks TensorBoard-style tags (``train/loss``, ``val/loss``, ``grad_norm/layers.0``...);
each writer renames them as its framework does. Tags starting with ``_`` are private
bookkeeping (skipped step, step time) that only some formats print.
"""

from __future__ import annotations

import json
import math
import time
from datetime import datetime, timezone
from pathlib import Path


class TensorBoardLog:
    """torch.utils.tensorboard.SummaryWriter: one event file per process (re)start."""

    def __init__(self, logdir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.w = SummaryWriter(log_dir=str(logdir), flush_secs=30)
        self.path = Path(self.w.file_writer.event_writer._file_name)

    def scalar(self, tag: str, value: float, step: int) -> None:
        if not tag.startswith("_"):
            self.w.add_scalar(tag, value, step)

    def flush(self) -> None:
        self.w.flush()

    def close(self) -> None:
        self.w.close()


class TensorBoardHistogramLog(TensorBoardLog):
    """A torch SummaryWriter whose per-layer vital signs are only ``add_histogram``s: the
    training loop's per-layer and activation scalars (and the total param norm) are dropped,
    and :meth:`histograms` logs the model's weights, gradients and block outputs as many
    codebases do (``for name, p in model.named_parameters(): add_histogram(name, p)``)."""

    DROP = ("grad_norm/", "param_norm/", "act/", "train/param_norm")

    def scalar(self, tag: str, value: float, step: int) -> None:
        if not tag.startswith(self.DROP):
            super().scalar(tag, value, step)

    def histograms(self, named: dict[str, object], step: int, bins: int = 16) -> None:
        # 16 equal-width buckets instead of the default 'tensorflow' ones (hundreds of
        # exponential buckets): the sample stays under a megabyte.
        for tag, t in named.items():
            self.w.add_histogram(tag, t, step, bins=bins)


class _PerStep:
    """Collects one step's scalars and hands them over as a dict when the step changes."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.row: dict[str, float] = {}

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self.step is not None and step != self.step:
            self._emit(self.step, self.row)
            self.row = {}
        self.step = step
        self.row[tag] = float(value)

    def flush(self) -> None:
        if self.step is not None and self.row:
            self._emit(self.step, self.row)
            self.row = {}

    def close(self) -> None:
        self.flush()

    def _emit(self, step: int, row: dict[str, float]) -> None:
        raise NotImplementedError


JSONL_NAMES = {
    "train/loss": "loss", "val/loss": "val_loss", "train/grad_norm": "grad_norm",
    "train/param_norm": "param_norm", "train/lr": "lr", "train/loss_scale": "loss_scale",
    "train/tokens_per_sec": "tokens_per_sec", "train/step_time": "step_time", "memory/rss_mb": "mem_mb",
}


class JsonlLog(_PerStep):
    """A hand-rolled metrics.jsonl: one JSON object per step, as many training scripts write."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = path.open("w")

    def _emit(self, step: int, row: dict[str, float]) -> None:
        out: dict[str, float | int] = {"step": step}
        for tag, v in row.items():
            if not tag.startswith("_"):
                out[JSONL_NAMES.get(tag, tag)] = v  # NaN is written as NaN, as json.dumps does
        out["timestamp"] = round(time.time(), 3)
        self.f.write(json.dumps(out) + "\n")

    def flush(self) -> None:
        super().flush()
        self.f.flush()

    def close(self) -> None:
        super().close()
        self.f.close()


class HFTrainerLog(_PerStep):
    """The Hugging Face Trainer's output_dir: trainer_state.json and checkpoint-N/ copies.

    Like ``Trainer.log``: every ``logging_steps`` the mean training loss since the last log,
    the current grad norm and learning rate, a float epoch; an eval entry every
    ``eval_steps``; a checkpoint folder every ``save_steps`` (only its trainer_state.json is
    kept here: weights and optimizer state would be megabytes).
    """

    def __init__(self, out: Path, *, max_steps: int, batch: int, train_tokens: int, tokens_per_step: int,
                 logging_steps: int = 10, eval_steps: int = 40, save_steps: int = 200) -> None:
        super().__init__()
        self.out, self.max_steps, self.batch = out, max_steps, batch
        self.logging_steps, self.eval_steps, self.save_steps = logging_steps, eval_steps, save_steps
        self.steps_per_epoch = train_tokens / tokens_per_step
        self.history: list[dict] = []
        self.losses: list[float] = []
        self.t0 = time.time()
        self.best: tuple[float, int] | None = None

    def _epoch(self, step: int) -> float:
        return round(step / self.steps_per_epoch, 4)

    def _emit(self, step: int, row: dict[str, float]) -> None:
        self.losses.append(row["train/loss"])
        if step % self.logging_steps == 0:
            entry = {"epoch": self._epoch(step), "grad_norm": row.get("train/grad_norm", float("nan")),
                     "learning_rate": row["train/lr"], "loss": round(sum(self.losses) / len(self.losses), 4),
                     "step": step}
            self.history.append(entry)
            self.losses = []
        if "val/loss" in row and step % self.eval_steps == 0:
            runtime = 0.05
            self.history.append({"epoch": self._epoch(step), "eval_loss": row["val/loss"],
                                 "eval_runtime": runtime, "eval_samples_per_second": round(128 / runtime, 3),
                                 "eval_steps_per_second": round(8 / runtime, 3), "step": step})
            if self.best is None or row["val/loss"] < self.best[0]:
                self.best = (row["val/loss"], step)
        # eval_dataset given as a dict: one entry per set, its keys prefixed eval_<set>_
        sets = sorted(t.split("/")[1] for t in row if t.startswith("val/") and t.count("/") == 2)
        if sets and step % self.eval_steps == 0:
            runtime = 0.05
            for name in sets:
                self.history.append({"epoch": self._epoch(step), f"eval_{name}_loss": row[f"val/{name}/loss"],
                                     f"eval_{name}_runtime": runtime,
                                     f"eval_{name}_samples_per_second": round(128 / runtime, 3),
                                     f"eval_{name}_steps_per_second": round(8 / runtime, 3), "step": step})
        if step % self.save_steps == 0:
            ck = self.out / f"checkpoint-{step}"
            ck.mkdir(parents=True, exist_ok=True)
            self._write(ck / "trainer_state.json", step)

    def _state(self, step: int) -> dict:
        return {
            "best_global_step": self.best[1] if self.best else None,
            "best_metric": self.best[0] if self.best else None,
            "best_model_checkpoint": None,
            "epoch": self._epoch(step),
            "eval_steps": self.eval_steps,
            "global_step": step,
            "is_hyper_param_search": False,
            "is_local_process_zero": True,
            "is_world_process_zero": True,
            "log_history": list(self.history),
            "logging_steps": self.logging_steps,
            "max_steps": self.max_steps,
            "num_input_tokens_seen": 0,
            "num_train_epochs": math.ceil(self.max_steps / self.steps_per_epoch),
            "save_steps": self.save_steps,
            "stateful_callbacks": {"TrainerControl": {"args": {
                "should_epoch_stop": False, "should_evaluate": False, "should_log": False,
                "should_save": True, "should_training_stop": step >= self.max_steps}, "attributes": {}}},
            "total_flos": 0.0,
            "train_batch_size": self.batch,
            "trial_name": None,
            "trial_params": None,
        }

    def _write(self, path: Path, step: int) -> None:
        path.write_text(json.dumps(self._state(step), indent=2) + "\n")

    def close(self) -> None:
        super().close()
        step = self.step or 0
        runtime = time.time() - self.t0
        self.history.append({"epoch": self._epoch(step), "step": step, "total_flos": 0.0,
                             "train_loss": self.history[-1].get("loss", float("nan")) if self.history else float("nan"),
                             "train_runtime": round(runtime, 4),
                             "train_samples_per_second": round(step * self.batch / runtime, 3),
                             "train_steps_per_second": round(step / runtime, 3)})
        self.out.mkdir(parents=True, exist_ok=True)
        self._write(self.out / "trainer_state.json", step)  # Trainer.save_state() at the end


class WandbLog:
    """The real wandb client in offline mode: <dir>/wandb/offline-run-*/run-<id>.wandb."""

    def __init__(self, out: Path, name: str, config: dict) -> None:
        import wandb

        out.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(mode="offline", dir=str(out), project="tinygpt-samples", name=name, config=config,
                              settings=wandb.Settings(silent=True, x_disable_stats=True))
        self.step: int | None = None
        self.row: dict[str, float] = {}

    def scalar(self, tag: str, value: float, step: int) -> None:
        if tag.startswith("_"):
            return
        if self.step is not None and step != self.step:
            self.run.log(self.row, step=self.step)
            self.row = {}
        self.step = step
        self.row[tag] = float(value)

    def flush(self) -> None:
        if self.row:
            self.run.log(self.row, step=self.step)
            self.row = {}

    def close(self) -> None:
        self.flush()
        self.run.finish()


class MegatronLog(_PerStep):
    """Megatron-LM's stdout: one ``training_log`` line per log interval, validation blocks."""

    def __init__(self, path: Path, *, max_steps: int, batch: int, init_scale: float, log_interval: int = 1) -> None:
        super().__init__()
        self.f = path.open("w")
        self.max_steps, self.batch, self.interval = max_steps, batch, log_interval
        self.acc = {"loss": 0.0, "ms": 0.0, "advanced": 0, "skipped": 0, "nan": 0}
        self.f.write(_MEGATRON_HEADER.format(batch=batch, steps=max_steps, scale=int(init_scale)))

    def _emit(self, step: int, row: dict[str, float]) -> None:
        a = self.acc
        skipped = row.get("_skipped", 0.0) > 0
        loss = row["train/loss"]
        a["ms"] += row.get("_step_ms", 0.0)
        if skipped:
            a["skipped"] += 1
            a["nan"] += int(not math.isfinite(loss))
        else:
            a["advanced"] += 1
            a["loss"] += loss
        if step % self.interval == 0:
            now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
            line = (f" [{now}] iteration {step:8d}/{self.max_steps:8d} |"
                    f" consumed samples: {step * self.batch:12d} |"
                    f" elapsed time per iteration (ms): {a['ms'] / self.interval:.1f} |"
                    f" learning rate: {row['train/lr']:.6E} |"
                    f" global batch size: {self.batch:5d} |")
            avg = a["loss"] / max(1, a["advanced"])
            if avg > 0.0 or not math.isfinite(avg):  # Megatron drops the key when nothing advanced
                line += f" lm loss: {avg:.6E} |"
            if "train/loss_scale" in row:
                line += f" loss scale: {row['train/loss_scale']:.1f} |"
            if "train/grad_norm" in row:
                line += f" grad norm: {row['train/grad_norm']:.3f} |"
            if "train/param_norm" in row:
                line += f" params norm: {row['train/param_norm']:.3f} |"
            line += f" number of skipped iterations: {a['skipped']:3d} |"
            line += f" number of nan iterations: {a['nan']:3d} |"
            self.f.write(line + "\n")
            self.acc = {"loss": 0.0, "ms": 0.0, "advanced": 0, "skipped": 0, "nan": 0}
        if "val/loss" in row:
            v = row["val/loss"]
            ppl = math.exp(min(v, 20.0))
            line = f" validation loss at iteration {step} | lm loss value: {v:.6E} | lm loss PPL: {ppl:.6E} | "
            bar = "-" * (len(line) + 1)
            self.f.write(f"{bar}\n{line}\n{bar}\n")

    def flush(self) -> None:
        super().flush()
        self.f.flush()

    def close(self) -> None:
        super().close()
        self.f.close()


_MEGATRON_HEADER = """using world size: 1, data-parallel size: 1, context-parallel size: 1, tensor-model-parallel size: 1, pipeline-model-parallel size: 1
using torch.float16 for parameters ...
------------------------ arguments ------------------------
  fp16 ............................................ True
  global_batch_size ............................... {batch}
  initial_loss_scale .............................. {scale}
  log_interval .................................... 1
  loss_scale_window ............................... 200
  num_layers ...................................... 4
  hidden_size ..................................... 64
  seq_length ...................................... 64
  train_iters ..................................... {steps}
-------------------- end of arguments ---------------------
> building GPT model ...
 > number of parameters on (tensor, pipeline) model parallel rank (0, 0): 235904
[after model, optimizer, and learning rate scheduler are built] datetime: 2025-01-01 00:00:00
> building train, validation, and test datasets ...
training ...
"""
