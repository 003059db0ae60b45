# The compiled kernel (forensics/evidence/_slopes.c): see order_stats.slope_stats_rows_compiled.
from collections.abc import Sequence
from typing import Any

def stats_rows(
    x: Any,
    y: Any,
    k: int,
    n: int,
    ks: Sequence[int],
    ks_h: Sequence[int],
    got: Any,
    got_h: Any,
    row0: int,
    row1: int,
) -> None: ...
def simd(flag: bool | None = None) -> bool: ...
