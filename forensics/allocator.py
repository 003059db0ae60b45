"""Memory freed by a stage given back to the system before the next stage allocates its own.

numpy allocates through glibc's malloc, whose mmap threshold grows to 32 MiB once a large
block has been freed: arrays below it (a 1M-row block of keys is 1-8 MiB) then come from the
heap and, once freed, stay resident in holes of the heap that the next stage's allocations do
not always fit. :func:`trim` returns those free pages (glibc's ``malloc_trim``); it is called
where a large temporary ends: after the import, after the analysis view is built, after the
spike search, before the diagnosis. A few milliseconds each, but every page given back is
faulted in again by the next allocation that needs it: not after every detector (that cost
30,000 page faults of a 1M-step analysis for the same peak). Without glibc (macOS, musl) it
does nothing.

polars allocates through jemalloc, which by polars' default returns freed pages only after
half a second to a second (``dirty_decay_ms:500,muzzy_decay_ms:1000``). The commands that
detect (analyze, compare, sweep, watch) ask it to return them at once (``forensics.cli``,
before polars loads); export does not, where it cost more system time than it saved.
"""

from __future__ import annotations

from typing import Any

from forensics.clib import c_library

_libc: Any = None  # glibc, once looked up; False when there is none
_M_ARENA_MAX = -8  # mallopt's parameter number (glibc's malloc.h)


def _glibc() -> Any:
    """glibc's malloc_trim and mallopt, looked up once; False without glibc."""
    global _libc
    if _libc is None:
        import ctypes

        int_: Any = ctypes.c_int
        both = {"malloc_trim": (int_, [ctypes.c_size_t]), "mallopt": (int_, [int_, int_])}
        _libc = c_library(both)
    return _libc


def trim() -> bool:
    """Give the heap's free pages back to the system (glibc); True when some were."""
    lib = _glibc()
    if lib is False:
        return False
    return bool(lib.malloc_trim(0))


def limit_arenas(most: int) -> bool:
    """At most ``most`` malloc arenas from now on (glibc's M_ARENA_MAX; True when set).

    glibc gives a thread that allocates while another holds the main arena an arena of its
    own, up to eight a core; each keeps and trims its own pages. The detecting commands
    split work between threads (:func:`forensics.evidence.order_stats.in_parts`) whose
    numpy arrays then came from further arenas, faulted in anew after each trim: a 1M-step
    JSONL analysis took about 350,000 page faults, 280,000 with two arenas, 3% less wall
    time for the same peak. Called by the command line before the work starts."""
    lib = _glibc()
    if lib is False:
        return False
    return bool(lib.mallopt(_M_ARENA_MAX, int(most)))
