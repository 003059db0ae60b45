"""Memory freed by a stage given back to the system before the next stage allocates its own.

numpy allocates through glibc's malloc, whose mmap threshold grows to 32 MiB once a large
block has been freed: arrays below it (a 1M-row block of keys is 1-8 MiB) then come from the
heap and, once freed, stay resident in holes of the heap that the next stage's allocations do
not always fit. :func:`trim` returns those free pages (glibc's ``malloc_trim``); it is called
where a large temporary ends: after the import, after the analysis view is built, after the
spike search, before the diagnosis. A few milliseconds each, but every page given back is
faulted in again by the next allocation that needs it: not after every detector (that cost
30,000 page faults of a 1M-step analysis for the same peak). Without glibc (macOS, musl) it
does nothing. The ``analyze`` command runs the analysis of a long run (read already) under
:func:`reusing_freed_pages` instead: freed blocks are kept for the next allocation, and
:func:`trim` does nothing until the analysis ends.

polars allocates through jemalloc, which by polars' default returns freed pages only after
half a second to a second (``dirty_decay_ms:500,muzzy_decay_ms:1000``). The commands that
detect (analyze, compare, sweep, watch) ask it to return them at once (``forensics.cli``,
before polars loads); export does not, where it cost more system time than it saved.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from forensics.clib import c_library

_libc: Any = None  # glibc, once looked up; False when there is none
# mallopt's parameter numbers (glibc's malloc.h) and the two defaults put back
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_DEFAULT_TRIM_THRESHOLD, _DEFAULT_MMAP_MAX = 128 * 1024, 65536
_KEPT_AT_THE_TOP = 1 << 30  # free bytes the heap's top may keep while freed pages are reused
REUSE_FROM_POINTS = 1 << 24  # points of a run from which its analysis reuses freed pages
_reusing = False  # inside reusing_freed_pages(): trim() gives nothing back


def _glibc() -> Any:
    """glibc's malloc_trim and mallopt, looked up once; False without glibc."""
    global _libc
    if _libc is None:
        import ctypes

        int_: Any = ctypes.c_int
        both = {"malloc_trim": (int_, [ctypes.c_size_t]), "mallopt": (int_, [int_, int_])}
        _libc = c_library(both)
    return _libc


def reusing() -> bool:
    """Inside :func:`reusing_freed_pages` (freed memory is being kept for the next array)."""
    return _reusing


def trim() -> bool:
    """Give the heap's free pages back to the system (glibc); True when some were."""
    lib = _glibc()
    if lib is False or _reusing:
        return False
    return bool(lib.malloc_trim(0))


@contextlib.contextmanager
def reusing_freed_pages(points: int | None = None) -> Iterator[None]:
    """While the block runs, memory freed is kept for the next allocation instead of being
    given back to the system: every block from glibc's heap (M_MMAP_MAX 0: no array of its
    own mapped, and unmapped when freed), the heap's top not trimmed below 1 GiB free, and
    :func:`trim` doing nothing. Afterwards glibc's default values are put back (its mmap
    threshold no longer adapts, as after any mallopt of these) and the free pages given back
    at once.

    For the analysis of a run already read. Its arrays come and go by the dozen per series
    (scores, rolling medians, masks), each as large as the series: given back and mapped
    afresh, each of their pages was zeroed by the kernel on its first touch. `analyze
    --no-report` of the 10M-step event files took 5.7% less wall time (28.7 s against 30.3,
    1.8 s less system time) for a peak 4% higher (3,309 MiB against 3,170); at 1M steps,
    7% less for a peak 6 MiB higher (farm-bench, 3 and 9 pairs). Not for the import,
    whose peak rose 17% so. Without glibc it does nothing.

    ``points``: the run's logged points. Below :data:`REUSE_FROM_POINTS` nothing is changed:
    there the time saved is a fraction of a second, and a 1M-step JSONL run's peak (its
    import's, 61-63 bytes a point) has no room for the memory kept."""
    global _reusing
    lib = _glibc()
    if lib is False or _reusing or (points is not None and points < REUSE_FROM_POINTS):
        yield
        return
    lib.mallopt(_M_MMAP_MAX, 0)
    lib.mallopt(_M_TRIM_THRESHOLD, _KEPT_AT_THE_TOP)
    _reusing = True
    try:
        yield
    finally:
        _reusing = False
        lib.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
        lib.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
        lib.malloc_trim(0)


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
