# The compiled reading of Megatron iteration lines (forensics/importers/text/_megatron.c):
# see megatron._kernel_read.
from typing import Any

def lines(buf: Any) -> tuple[int, int]: ...
def read(
    buf: Any,
    prefixes: tuple[bytes | None, ...],
    consts: tuple[bytes | None, ...],
    commas: bool,
    dated: bool,
    ln: Any,
    step: Any,
    wall: Any,
    values: Any,
    val: Any,
    first: int,
    first_val: int,
) -> tuple[int, int, bool, tuple[bool, ...], int, int]: ...
