# The compiled record walk, length checks and decoding (forensics/importers/_tfscan.c): see
# forensics.importers.tfevents_scan.
from typing import Any

def walk(buf: Any, n: int, max_record: int, offs: Any, lens: Any) -> tuple[int, int, int]: ...
def crc_lengths(buf: Any, offs: Any, out: Any) -> None: ...
def decode(
    buf: Any,
    offs: Any,
    lens: Any,
    flags: Any,
    step: Any,
    wall: Any,
    value: Any,
    tag_at: Any,
    tag_len: Any,
) -> None: ...
