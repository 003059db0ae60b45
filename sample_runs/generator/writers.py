"""One logger per output format, each writing what that framework's user would have on disk.

All share the tiny interface ``scalar(tag, value, step)`` / ``flush()`` / ``close()``; the
training loop uses TensorBoard-style tags and each writer renames them the way its
framework names them.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path


class TensorBoardLog:
    """torch.utils.tensorboard.SummaryWriter: one event file per process (re)start."""

    def __init__(self, logdir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.w = SummaryWriter(log_dir=str(logdir), flush_secs=30)
        self.path = Path(self.w.file_writer.event_writer._file_name)

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.w.add_scalar(tag, value, step)

    def flush(self) -> None:
        self.w.flush()

    def close(self) -> None:
        self.w.close()
