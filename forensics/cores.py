"""How many threads a compiled kernel's work is split between."""

from __future__ import annotations

import os
from functools import lru_cache


@lru_cache(maxsize=1)
def cores() -> int:
    """The cores this process may use, at most 2 (the kernels' parts and the Megatron
    reader's pieces run in that many threads)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # (not on every platform)
        n = os.cpu_count() or 1
    return max(1, min(2, n))
