"""The watch command's option values: durations and where the state file goes by default."""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|min|h)?\s*", re.I)
_UNIT = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """``30s``, ``5m``, ``1h``, ``250ms`` or a plain number of seconds (``0.5``) -> seconds.

    Raises:
        ValueError: one line saying what is accepted.
    """
    m = _DURATION.fullmatch(text)
    seconds = float(m.group(1)) * _UNIT[m.group(2) and m.group(2).lower()] if m else math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(
            f"{text!r} is not a duration; write a positive number of seconds or one like "
            "30s, 5m, 1h, 250ms"
        )
    return seconds


def state_name(run_path: Path) -> str:
    """The default state file's name: the run's folder name and a hash of its full path, so
    two runs named alike keep separate states."""
    full = str(run_path.expanduser().resolve())
    digest = hashlib.sha256(full.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    name = re.sub(r"[^\w.-]+", "_", run_path.name).strip("._")[:80] or "run"
    return f"{name}-{digest}.json"
