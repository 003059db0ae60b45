"""Searches of a big mapped log through the C library, without the GIL.

CPython's ``mmap.find`` holds the GIL and searches a phrase at about 1.5 GB/s: Megatron's
"saved checkpoint " took 210 ms over a 1M-step log of 329 MB that holds none, a fifth of the
log's read (other phrases alike: "checkpoint" 217 ms). glibc's ``memmem`` finds the same
first occurrence in about 50 ms, and through ``ctypes`` the GIL is released, so the three
one-byte checks a log gets before it is mapped (NUL, ESC, CR) run on two threads. Where the C
library has no ``memmem`` (or ``ctypes`` cannot load it) the callers keep Python's own search.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from forensics.clib import c_library

_lib: Any = None  # the C library, once looked up; False where it has no memmem/memchr


def _libc() -> Any:
    global _lib
    if _lib is None:
        ptr, size = ctypes.c_void_p, ctypes.c_size_t
        _lib = c_library(
            {
                "memmem": (ptr, [ptr, size, ctypes.c_char_p, size]),
                "memchr": (ptr, [ptr, ctypes.c_int, size]),
            }
        )
    return _lib


def available() -> bool:
    return _libc() is not False


def find(buffer: Any, sub: bytes, start: int, end: int) -> int:
    """``buffer.find(sub, start, end)`` for a non-empty ``sub`` by ``memmem`` (the first
    occurrence wholly inside ``[start, end)``, its offset; -1 when there is none). ``buffer``:
    any object with the buffer protocol (a read-only map too). Needs :func:`available`."""
    lib = _libc()
    if end - start < len(sub):
        return -1
    view = np.frombuffer(buffer, dtype=np.uint8)  # (no copy; released before returning)
    try:
        base = view.ctypes.data
        at = lib.memmem(base + start, end - start, sub, len(sub))
        return -1 if at is None else int(at - base)
    finally:
        del view


def has_any_byte(buffer: Any, values: bytes) -> bool:
    """Whether ``buffer`` holds any of the byte ``values``: ``memchr`` for each over each half
    of it, the halves on two threads (each is a pass over memory, so two cores take half the
    time); ``buffer.find`` for each where the C library has no ``memchr``."""
    lib = _libc()
    if lib is False:
        return any(buffer.find(bytes([v])) >= 0 for v in values)
    from forensics.evidence.order_stats import in_parts

    view = np.frombuffer(buffer, dtype=np.uint8)
    try:
        base = view.ctypes.data
        found: list[bool] = []

        def scan(a: int, b: int) -> None:  # (a part of at least a MiB, one a core)
            if any(lib.memchr(base + a, v, b - a) is not None for v in values):
                found.append(True)

        in_parts(len(view), 1 << 20, scan)
        return bool(found)
    finally:
        del view
