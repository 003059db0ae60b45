# The compiled rank filter (forensics/evidence/_rolling.c): see rolling._rank.
from collections.abc import Sequence
from typing import Any

def rank(
    v: Any, size: int, ranks: Sequence[int], outs: Sequence[Any], start: int, stop: int
) -> None: ...
