"""Checkpoints a run shows or states: the folders saved beside the log, the configured interval.

Rollback advice (where to go back to), the middle-phase checklist (were checkpoints saved as
planned?) and the periodicity analysis (is a spike period the checkpoint interval?) read the
same :class:`Checkpoints`, built once per run by :attr:`forensics.evidence.Evidence.checkpoints`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
        saved: steps of the checkpoint folders found beside the log, sorted (may be empty).
        interval: the save interval the run's config states, if any.
        interval_key: the (dotted) config key the interval came from.
    """

    saved: tuple[int, ...] = ()
    interval: int | None = None
    interval_key: str | None = None

    def listing(self, limit: int = 8) -> str:
        """The saved steps as text: "500, 1,000, 1,500 ..." (at most ``limit`` shown)."""
        shown = ", ".join(f"{s:,}" for s in self.saved[:limit])
        return shown + (" ..." if len(self.saved) > limit else "")

    def before(self, step: int, assume_every: int | None = None) -> tuple[int | None, str]:
        """The latest checkpoint at or before ``step`` and where that knowledge comes from.

        Saved folders win; then the configured interval; then ``assume_every``
        (``--checkpoint-every``); then the article's habit of one every 500 steps.
        """
        if self.saved:
            ok = [s for s in self.saved if s <= step]
            if ok:
                return ok[-1], f"checkpoint folders found beside the log ({self.listing()})"
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
    )


__all__ = [
    "CHECKPOINT_INTERVAL_KEYS",
    "DEFAULT_CHECKPOINT_EVERY",
    "Checkpoints",
    "checkpoint_interval",
    "known_checkpoints",
]
