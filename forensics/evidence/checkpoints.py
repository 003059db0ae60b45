"""Checkpoints a run shows or states: the folders saved beside the log, the configured interval.

Rollback advice (where to go back to), the middle-phase checklist (were checkpoints saved as
planned?) and the periodicity analysis (is a spike period the checkpoint interval?) read the
same :class:`Checkpoints`, built once per run by :attr:`forensics.evidence.Evidence.checkpoints`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from forensics.evidence.trend_utils import num
from forensics.schema import VAL_LOSS

if TYPE_CHECKING:
    from forensics.run import Run

DEFAULT_CHECKPOINT_EVERY = 500  # the article keeps a rollback checkpoint every 500 steps (4.3)

# Config keys that carry the checkpoint interval in common trainers (HF Trainer, Megatron,
# torchtitan, Lightning, accelerate, Keras...). One list: every reader of the interval uses it.
CHECKPOINT_INTERVAL_KEYS = (
    "save_steps",
    "save_interval",
    "checkpoint_interval",
    "ckpt_interval",
    "checkpointing_steps",
    "save_every",
    "checkpoint_every",
    "save_every_n_steps",
    "every_n_train_steps",
    "save_freq",
)
# A bare "interval" is about checkpoints only inside a checkpoint (or save) section, e.g.
# torchtitan's [checkpoint] interval = 500.
SECTION_INTERVAL_KEY = "interval"


@dataclass(frozen=True)
class Checkpoints:
    """What the run says about its checkpoints.

    Attributes:
        saved: steps of the checkpoints found beside the log, sorted (may be empty).
        interval: the save interval the run's config states, if any.
        interval_key: the (dotted) config key the interval came from.
    """

    saved: tuple[int, ...] = ()
    interval: int | None = None
    interval_key: str | None = None
    said: bool = False  # ``saved`` are the saves the log printed, not what lies beside it

    def listing(self, limit: int = 8) -> str:
        """The saved steps as text: "500, 1,000, 1,500 ..." (at most ``limit`` shown)."""
        shown = ", ".join(f"{s:,}" for s in self.saved[:limit])
        return shown + (" ..." if len(self.saved) > limit else "")

    def where(self) -> str:
        """Where ``saved`` comes from, in words."""
        return (
            "checkpoints the log says it saved" if self.said else "checkpoints found beside the log"
        )

    def before(self, step: int, assume_every: int | None = None) -> tuple[int | None, str]:
        """The latest checkpoint at or before ``step`` and where that knowledge comes from.

        Saved folders win; then the configured interval; then ``assume_every``
        (``--checkpoint-every``); then the article's habit of one every 500 steps.
        """
        if self.saved:
            ok = [s for s in self.saved if s <= step]
            if ok:
                return ok[-1], f"{self.where()} ({self.listing()})"
            return None, f"no saved checkpoint precedes the onset (saved: {self.listing()})"
        if self.interval is not None:
            n = self.interval
            return (step // n) * n, f"the run's checkpoint interval ({self.interval_key} = {n})"
        if assume_every:
            return (step // assume_every) * assume_every, f"--checkpoint-every {assume_every}"
        n = DEFAULT_CHECKPOINT_EVERY
        return (
            (step // n) * n,
            f"assuming a checkpoint every {n} steps (the article's habit; set --checkpoint-every)",
        )


@dataclass(frozen=True)
class MeasuredBest:
    """The checkpoint with the lowest validation loss among those with an eval at their own
    step, beside the checkpoint the rollback would otherwise keep (the last at or before the
    lowest validation loss)."""

    step: int
    value: float
    before_step: int  # the last checkpoint at or before the lowest val loss's step
    before_value: float  # its val loss

    def clause(self, best_val_step: int) -> str:
        """``the lowest validation loss of the checkpoints with an eval at their step (2.751;
        2.839 at step 200, the last one at or before step 360)``."""
        return (
            "the lowest validation loss of the checkpoints with an eval at their step "
            f"({num(self.value)}; {num(self.before_value)} at step {self.before_step:,}, the last "
            f"one at or before step {best_val_step:,})"
        )


def measured_best(
    cps: Checkpoints, steps: Any, values: Any, best_val_step: int
) -> MeasuredBest | None:
    """A checkpoint with a lower validation loss than the last one before the lowest val
    loss, when the log measures both at their own steps; None otherwise.

    Stopping early keeps the best model the run saved. The last checkpoint before the lowest
    validation loss is not it when the loss turned up slowly: checkpoints 200 and 400 around
    a lowest loss at step 360 read 2.839 and 2.751, and the later one is the better model
    (HF's ``load_best_model_at_end`` picks it the same way). Only checkpoints the run shows
    or states (folders beside the log, its save interval) count, never an assumed interval;
    and only when the checkpoint before the lowest loss has an eval at its step too, so that
    the two are compared on what the log measured."""
    if not cps.saved and cps.interval is None:
        return None
    at = {int(s): float(v) for s, v in zip(steps, values, strict=True) if math.isfinite(v)}
    if cps.saved:
        candidates = [s for s in cps.saved if s in at]
    else:
        n = cps.interval or 1
        candidates = [s for s in sorted(at) if s > 0 and s % n == 0]
    before = cps.before(best_val_step)[0]
    if not candidates or before is None or before not in at:
        return None
    best = min(candidates, key=lambda s: (at[s], s))
    if at[best] >= at[before]:
        return None
    return MeasuredBest(best, at[best], before, at[before])


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def checkpoint_interval(config: Mapping[str, Any] | None) -> tuple[int, str] | None:
    """The checkpoint interval a run's config states, with the (dotted) key it came from."""
    for key, value in _flatten(config or {}).items():
        leaf = key.rsplit(".", 1)[-1].lower()
        if leaf == SECTION_INTERVAL_KEY:
            if "checkpoint" not in key.lower() and "save" not in key.lower():
                continue
        elif leaf not in CHECKPOINT_INTERVAL_KEYS:
            continue
        if isinstance(value, bool):
            continue
        try:
            n = int(value)
        except (TypeError, ValueError):
            continue
        if n > 0:
            return n, key
    return None


def _saved_steps(saved: Iterable[Any] | None) -> tuple[int, ...]:
    out: set[int] = set()
    for s in saved or ():
        try:
            out.add(int(s))
        except (TypeError, ValueError):
            continue
    return tuple(sorted(out))


def known_checkpoints(run: Run) -> Checkpoints:
    """The checkpoints ``run`` shows (folders beside the log) or states (its save interval)."""
    got = checkpoint_interval(run.config)
    return Checkpoints(
        saved=_saved_steps(run.metadata.get("checkpoints")),
        interval=got[0] if got else None,
        interval_key=got[1] if got else None,
        said=bool(run.metadata.get("checkpoints_said")),
    )


_BEST_FOLDER = re.compile(r"(?:^|[/\\])checkpoint-(\d+)[/\\]?$")


@dataclass(frozen=True)
class TrainerBest:
    """The checkpoint the trainer itself recorded as its best: HF Trainer's
    ``best_model_checkpoint`` (``.../checkpoint-3000``) with its ``best_metric``.

    Attributes:
        step: the step in the checkpoint's folder name.
        value: ``best_metric``, when the state gives it.
        metric: the logged eval series (canonical name) whose value at ``step`` is ``value``:
            the metric the trainer picked its best by; None when no series matches.
    """

    step: int
    value: float | None
    metric: str | None

    def clause(self, best: int, metric_at_best: float | None) -> str:
        """How a finding whose own best is step ``best`` (the lowest val loss) names the
        trainer's choice: "the trainer recorded checkpoint-3000 as its best, by eval/wer
        (0.7432 there, 0.7888 at step 1,000)"; "" when it is the same step.
        ``metric_at_best``: the trainer's metric at ``best``, if logged there."""
        if self.step == best:
            return ""
        head = f"the trainer recorded checkpoint-{self.step} as its best"  # (the folder's name)
        if self.metric is None:
            return head + (f" (best_metric {self.value:.4g})" if self.value is not None else "")
        if self.metric == VAL_LOSS:
            return head + " by the val loss (among the checkpoints it saved)"
        there = f"{self.value:.4g} there" if self.value is not None else "its best"
        then = f", {metric_at_best:.4g} at step {best:,}" if metric_at_best is not None else ""
        return f"{head}, by {self.metric} ({there}{then})"


def trainer_best(
    config: Mapping[str, Any] | None,
    eval_metrics: Iterable[str],
    value_at: Callable[[str, int], float | None],
) -> TrainerBest | None:
    """The trainer's recorded best checkpoint, and the eval series it was judged by (the one
    whose logged value at that step equals ``best_metric``; ``value_at(metric, step)`` is that
    series' value logged at exactly ``step``, None when it has none there)."""
    path = (config or {}).get("best_model_checkpoint")
    got = _BEST_FOLDER.search(str(path)) if path else None
    if got is None:
        return None
    step = int(got.group(1))
    # (transformers >= 4.48 also writes the step itself; the folder's name says the same)
    at = (config or {}).get("best_global_step")
    if isinstance(at, int) and not isinstance(at, bool) and at > 0:
        step = at
    raw = (config or {}).get("best_metric")
    value = float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else None
    if value is not None and not math.isfinite(value):
        value = None
    metric = None
    if value is not None:
        for m in eval_metrics:
            v = value_at(m, step)
            if v is not None and math.isclose(v, value, rel_tol=1e-9, abs_tol=0.0):
                metric = m
                break
    return TrainerBest(step=step, value=value, metric=metric)


__all__ = [
    "CHECKPOINT_INTERVAL_KEYS",
    "DEFAULT_CHECKPOINT_EVERY",
    "Checkpoints",
    "TrainerBest",
    "checkpoint_interval",
    "known_checkpoints",
    "trainer_best",
]
