"""A :class:`~forensics.run.Run` grown from what a trainer logs, one dict at a time.

The rows are named exactly as the trainer's own files would name them, and they go through
the same mapping as when those files are read: the value parsing of the HF importer and
:func:`forensics.schema.add_canonical` with the importer's name as the source (its
source-scoped aliases), so a live run and the same run read back from ``trainer_state.json``
or ``metrics.csv`` have the same vital signs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from forensics.importers.base import rows_frame
from forensics.importers.hf_trainer_state import _number as number
from forensics.importers.restarts import assign_segments
from forensics.run import Run
from forensics.schema import add_canonical, conform, tag_units


class LiveRun:
    """The rows logged so far and the facts around them (checkpoints saved, config).

    Args:
        name: the run's name (the output folder's name).
        path: the folder the trainer writes to (never written by this class).
        source: the importer whose naming the rows follow: ``hf_trainer_state`` or
            ``lightning_csv``; it is the run's format, so the rollback plan's commands are
            written for that trainer.
        aliases: extra ``{raw tag: canonical}`` names, as ``--alias`` on the command line.
    """

    def __init__(
        self,
        name: str,
        path: Path,
        source: str,
        aliases: Mapping[str, str] | None = None,
    ) -> None:
        self.name, self.path, self.source = name, path, source
        self.aliases = dict(aliases or {})
        self.config: dict[str, Any] = {}
        self.checkpoints: list[int] = []
        self.skipped = 0  # values that are not numbers (strings, lists): counted, not read
        self._steps: list[int] = []
        self._tags: list[str] = []
        self._values: list[float] = []
        self._walls: list[float | None] = []
        self._records = 0
        self._frame: pl.DataFrame | None = None  # canonical rows up to the last build
        self._built = 0  # how many of the lists' rows the frame holds

    def __len__(self) -> int:
        return self._records

    def add(self, step: int, logs: Mapping[str, Any], wall_time: float | None = None) -> int:
        """Append one logged dict at ``step``; returns how many values it added.

        Keys that are not numbers (a run name, a list) are counted in :attr:`skipped`.
        """
        n = 0
        for key, v in logs.items():
            if key == "step":
                continue
            x = number(_scalar(v))
            if x is None:
                self.skipped += 1
                continue
            self._steps.append(int(step))
            self._tags.append(str(key))
            self._values.append(x)
            self._walls.append(wall_time)
            n += 1
        self._records += 1
        return n

    def run(self) -> Run:
        """The run as logged so far (only the new rows are mapped again)."""
        if self._built < len(self._steps):
            lo = self._built
            new = rows_frame(
                {
                    "step": self._steps[lo:],
                    "tag": self._tags[lo:],
                    "value": self._values[lo:],
                    "wall_time": self._walls[lo:],
                    "record_idx": list(range(lo, len(self._steps))),
                },
                source=self.source,
                file="(logged in-process)",
            )
            new = add_canonical(conform(new), self.source, self.aliases)
            self._frame = new if self._frame is None else pl.concat([self._frame, new])
            self._built = len(self._steps)
        frame = assign_segments(self._frame) if self._frame is not None else None
        run = Run(name=self.name, path=self.path, format=self.source)
        if frame is not None:
            run.frame = conform(frame)
            units = tag_units(run.frame)
            if units:
                run.metadata["units"] = units
        run.config = dict(self.config)
        run.metadata["checkpoints"] = sorted(set(self.checkpoints))
        run.metadata["live"] = True
        if self.skipped:
            run.note(f"{self.skipped} logged values that are not numbers were not read")
        return run


def _scalar(v: Any) -> Any:
    """A 0-d tensor or numpy value as a Python number; anything else unchanged."""
    item = getattr(v, "item", None)
    if item is not None and getattr(v, "ndim", 1) == 0:
        try:
            return item()
        except (TypeError, ValueError, RuntimeError):
            return v
    return v
