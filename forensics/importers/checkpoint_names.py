"""Checkpoints saved beside a log, found by the names the trainers give them.

Rollback advice goes back to a checkpoint the run has. HF Trainer's ``checkpoint-N``
folders come with copies of ``trainer_state.json`` (:mod:`forensics.importers.hf_trainer_state`
reads them); the other trainers' checkpoints hold no log, only their names say which step
they saved:

- Megatron-LM ``iter_0000500/``, DeepSpeed ``global_step500/``, torchtitan ``step-500/``,
  HF ``checkpoint-500/`` (weights only);
- Lightning ``epoch=3-step=400.ckpt``, Composer ``ep1-ba400-rank0.pt``.

Only names are read (no file is opened), a few folder levels down from the run folder, and
a matched checkpoint folder is not entered.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_DIRS = re.compile(r"^(?:iter_(\d{7})|global_step(\d+)|step[-_](\d+)|checkpoint-(\d+))$")
_FILES = re.compile(r"(?:^|[-_])step=(\d+)(?:[-_.].*)?\.ckpt$|^ep\d+-ba(\d+)(?:-rank\d+)?\.pt$")
_DEPTH = 3  # run folder / checkpoints / <run name> / iter_0000500
_MOST_ENTRIES = 20_000  # names looked at, at most (a run folder is not a file system)
_SKIP = {"__pycache__", ".git", "node_modules", "wandb"}


def checkpoint_steps(folder: Path) -> list[int]:
    """The steps of the checkpoints saved under ``folder`` (sorted, each once)."""
    steps: set[int] = set()
    seen = 0
    todo = [(folder, 0)]
    while todo and seen < _MOST_ENTRIES:
        here, depth = todo.pop()
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue
        for e in entries:
            seen += 1
            name = e.name
            try:
                is_dir = e.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                m = _DIRS.match(name)
                if m:
                    steps.add(int(next(g for g in m.groups() if g is not None)))
                elif depth + 1 < _DEPTH and not name.startswith(".") and name not in _SKIP:
                    todo.append((Path(e.path), depth + 1))
            else:
                m = _FILES.search(name)
                if m:
                    steps.add(int(next(g for g in m.groups() if g is not None)))
    return sorted(steps)


def run_folder(path: Path, job: str, only_job: bool) -> Path | None:
    """The folder that is the job's own, where its checkpoints would sit: the folder given
    (its only job), or the job's subfolder. None for a log file given alone or one of several
    log files in a folder: the checkpoints beside it may be another run's."""
    if not path.is_dir():
        return None
    if job == ".":
        return path
    where = path / job
    if where.is_dir():
        return where
    return path if only_job else None
