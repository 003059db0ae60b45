"""Hugging Face Trainer ``trainer_state.json``: the ``log_history`` of train and eval entries.

The Trainer saves a copy of its state in every ``checkpoint-N/`` folder (and the resume
helpers in ``last-checkpoint/``), plus one at the top of the output folder when training
ends. They are snapshots of one growing history, so the copy with the highest
``global_step`` is read and the others are only mentioned. The checkpoint folders present
are recorded as ``run.metadata["checkpoints"]`` (sorted step numbers): the diagnosis uses
them to say where to roll back to.

Entries carry ``step`` and the logged keys: ``loss``, ``grad_norm``, ``learning_rate``,
``epoch`` (float) for training; ``eval_loss``, ``eval_<metric>`` for evaluation (mapped to
``val_loss`` and ``eval/<metric>`` by the alias table); the end-of-training summary
(``train_runtime``, ``train_loss`` as a whole-run mean) stays unmapped.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from forensics.errors import UnreadableInputError
from forensics.importers.base import (
    ImportResult,
    ReadOptions,
    Source,
    read_text,
    rel,
    rows_frame,
    text_bytes,
)
from forensics.importers.restarts import assign_segments, restart_findings
from forensics.schema import conform

NAME = "hf_trainer_state"
FILENAME = "trainer_state.json"
_CKPT = re.compile(r"^checkpoint-(\d+)$")
_CONFIG_KEYS = (
    "global_step",
    "max_steps",
    "num_train_epochs",
    "train_batch_size",
    "logging_steps",
    "eval_steps",
    "save_steps",
    "best_metric",
    "best_global_step",
    "best_model_checkpoint",
    "total_flos",
)


def _job_dir(path: Path) -> Path:
    """The output folder a copy belongs to: checkpoint copies belong to the folder above."""
    parent = path.parent
    if parent.name == "last-checkpoint" or _CKPT.match(parent.name):
        return parent.parent
    return parent


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(read_text(path))
    except (ValueError, EOFError) as exc:
        raise UnreadableInputError(
            f"{path}: not valid JSON ({exc}); expected a Trainer state"
        ) from None
    except RecursionError:
        raise UnreadableInputError(
            f"{path}: JSON nested too deeply to read; expected a Trainer state"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("log_history"), list):
        raise UnreadableInputError(
            f"{path}: no log_history list; expected a Hugging Face trainer_state.json"
        )
    return data


def _looks_like_state(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            head = text_bytes(fh.read(4096))  # a BOM or UTF-16 still reads as a state
    except OSError:
        return True  # let read() report it
    return b"log_history" in head or b"global_step" in head or head.lstrip().startswith(b"{")


class HfTrainerStateImporter:
    NAME = NAME

    def discover(self, root: Path, files: list[Path]) -> list[Source]:
        by_job: dict[Path, list[Path]] = {}
        # checkpoint-N folders per output folder, in one pass (linear in the number of files)
        ckpts_of: dict[Path, set[int]] = {}
        for f in files:
            if m := _CKPT.match(f.parent.name):
                ckpts_of.setdefault(f.parent.parent, set()).add(int(m.group(1)))
            if f.name == FILENAME and _looks_like_state(f):
                by_job.setdefault(_job_dir(f), []).append(f)
        out = []
        for job, copies in by_job.items():
            ckpts = sorted(ckpts_of.get(job, ()))
            copies.sort(key=lambda p: (p.parent != job, str(p)))  # the top-level copy first
            out.append(Source(NAME, copies, rel(job, root), root, options={"checkpoints": ckpts}))
        return out

    def read(self, source: Source, options: ReadOptions) -> ImportResult:
        copies: list[tuple[Path, dict[str, Any]]] = []
        broken: list[str] = []
        for p in source.files:
            try:
                copies.append((p, _load(p)))
            except UnreadableInputError as exc:
                # A copy cut short by a job killed while saving: the other copies still hold
                # the run.
                if len(source.files) == 1:
                    raise
                broken.append(f"{rel(p, source.root)} ({str(exc).split(': ', 1)[-1]})")
        if not copies:
            raise UnreadableInputError(
                f"{source.root}: no readable trainer_state.json among {len(source.files)} copies"
            )

        def step_of(e: Any) -> float:
            st = e.get("step") if isinstance(e, dict) else None
            return _number(st) or 0.0

        def rank(item: tuple[Path, dict[str, Any]]) -> tuple[float, int, int]:
            p, d = item
            gs = d.get("global_step")
            gs = (
                gs
                if isinstance(gs, (int, float)) and not isinstance(gs, bool)
                else max((step_of(e) for e in d["log_history"]), default=0)
            )
            where = (
                2
                if p.parent.name != "last-checkpoint" and not _CKPT.match(p.parent.name)
                else 1
                if p.parent.name == "last-checkpoint"
                else 0
            )
            return (_number(gs) or 0.0, where, len(d["log_history"]))

        best_path, state = max(copies, key=rank)
        name = rel(best_path, source.root)
        steps: list[int | None] = []
        tags: list[str] = []
        values: list[float] = []
        recs: list[int] = []
        no_step = 0
        for i, entry in enumerate(state["log_history"]):
            if not isinstance(entry, dict):
                no_step += 1
                continue
            st = entry.get("step")
            if (
                not isinstance(st, (int, float))
                or isinstance(st, bool)
                or not -(2**62) < st < 2**62  # NaN, inf and steps no trainer reaches
            ):
                no_step += 1
                continue
            for key, v in entry.items():
                if key == "step":
                    continue
                x = _number(v)
                if x is None:
                    continue
                steps.append(int(st))
                tags.append(key)
                values.append(x)
                recs.append(i)
        frame = rows_frame(
            {"step": steps, "tag": tags, "value": values, "record_idx": recs},
            source=NAME,
            file=name,
        )
        frame = assign_segments(conform(frame))
        notes = [f"{b}: unreadable copy skipped" for b in broken]
        others = [
            f"{rel(p, source.root)} (step {_step(d.get('global_step'))})"
            for p, d in copies
            if p != best_path
        ]
        if others:
            notes.append(
                f"{name} (step {_step(state.get('global_step'))}) has the longest history; other "
                f"copies not used: {', '.join(others)}"
            )
        if no_step:
            notes.append(f"{name}: {no_step} log_history entries without a step were skipped")
        config = {k: state[k] for k in _CONFIG_KEYS if k in state and state[k] is not None}
        meta = {"checkpoints": list(source.options.get("checkpoints", [])), "trainer_state": name}
        return ImportResult(
            frame=conform(frame),
            notes=notes,
            findings=restart_findings(frame),
            config=config,
            metadata=meta,
        )


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        try:
            return float(v)
        except OverflowError:  # an integer beyond float range
            return math.inf if v > 0 else -math.inf
    if isinstance(v, str):
        try:
            return float(v.strip())
        except (ValueError, OverflowError):
            return None
    return None


IMPORTER = HfTrainerStateImporter()


def _step(value: object) -> str:
    """A global_step as the report prints steps (1,000), or as written when not a count."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
