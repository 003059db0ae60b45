"""forensics.allocator.trim: glibc's free heap pages given back, nothing done elsewhere."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import forensics.allocator as allocator


def test_trim_gives_back_what_numpy_freed_and_is_safe_to_repeat() -> None:
    blocks = [np.ones(1 << 18) for _ in range(32)]  # 2 MiB each: from the heap, not mmap
    del blocks
    got = allocator.trim()
    assert isinstance(got, bool)
    if sys.platform.startswith("linux") and allocator._libc is not False:
        assert allocator.trim() in (True, False)  # a second call finds little or nothing
    else:
        assert got is False


def test_without_glibc_trim_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "_libc", False)
    assert allocator.trim() is False


_ARENAS = """
import ctypes, os, sys, tempfile, threading
import numpy as np
from forensics import allocator
if sys.argv[1] == "limit":
    assert allocator.limit_arenas(1)
ready = threading.Barrier(5)
def work():
    ready.wait()  # all four alive at once: each allocates while the others hold arenas
    blocks = [np.ones(1 << 12) for _ in range(200)]
    ready.wait()
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
ready.wait()
ready.wait()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
path = os.path.join(tempfile.mkdtemp(), "info.xml")
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, fp)
libc.fclose(fp)
print(open(path).read().count("<heap nr="))
for t in threads:
    t.join()
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or allocator._glibc() is False, reason="glibc only"
)
def test_limit_arenas_keeps_threads_in_the_arenas_allowed() -> None:
    import subprocess

    def heaps(mode: str) -> int:
        env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
        out = subprocess.run(
            [sys.executable, "-c", _ARENAS, mode], capture_output=True, text=True, env=env
        )
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip())

    assert heaps("plain") > 1  # (threads allocating at once: arenas of their own)
    assert heaps("limit") == 1


def test_without_glibc_limit_arenas_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "_libc", False)
    assert allocator.limit_arenas(2) is False


_REUSE = """
import resource, sys
import numpy as np
from forensics import allocator

def faults_of_a_fresh_block():
    a = np.empty(1 << 23)  # 64 MiB: glibc maps a block this large on its own
    a.fill(1.0)
    del a
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    b = np.empty(1 << 23)
    b.fill(2.0)  # every page touched
    del b
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

def rss_kib():
    return int(open("/proc/self/statm").read().split()[1]) * 4

plain = faults_of_a_fresh_block()
with allocator.reusing_freed_pages():
    kept = faults_of_a_fresh_block()
    trimmed_inside = allocator.trim()
    held = rss_kib()
after = rss_kib()
print(plain, kept, trimmed_inside, held - after)
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or allocator._glibc() is False, reason="glibc only"
)
def test_reusing_freed_pages_reuses_a_freed_block_and_gives_it_back_after() -> None:
    import subprocess

    # Small pages, as the command line asks numpy for (forensics.cli_quick): one fault a page.
    env = {**os.environ, "NUMPY_MADVISE_HUGEPAGE": "0"}
    out = subprocess.run([sys.executable, "-c", _REUSE], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    plain, kept, trimmed_inside, given_back_kib = out.stdout.split()
    # 64 MiB is 16,384 pages: mapped afresh, every one faulted in; reused, next to none.
    assert int(plain) >= 16_000
    assert int(kept) < 1_000
    assert trimmed_inside == "False"  # (trim() gives nothing back inside)
    assert int(given_back_kib) >= 60 * 1024  # the kept block given back on the way out


def test_without_glibc_reusing_freed_pages_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "_libc", False)
    with allocator.reusing_freed_pages():
        assert allocator.trim() is False
    assert allocator._reusing is False


def test_reusing_freed_pages_changes_nothing_for_a_short_run() -> None:
    with allocator.reusing_freed_pages(allocator.REUSE_FROM_POINTS - 1):
        assert allocator._reusing is False
    if allocator._glibc() is not False:
        with allocator.reusing_freed_pages(allocator.REUSE_FROM_POINTS):
            assert allocator._reusing is True
        assert allocator._reusing is False


_ANALYZE_REUSING = """
import sys
import forensics.allocator as allocator
allocator.REUSE_FROM_POINTS = 0  # every run's analysis reuses freed pages, however short
from forensics.cli_quick import entry
sys.argv = ["forensics", *sys.argv[1:]]
entry()
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or allocator._glibc() is False, reason="glibc only"
)
@pytest.mark.parametrize("sample", ["bad_batch", "loss_scale_collapse"])
def test_an_analysis_reusing_freed_pages_states_the_same_findings(sample: str) -> None:
    """Reused blocks hold old values where fresh pages hold zeros: an array read before it
    is written would show here. The same findings document, byte for byte."""
    import subprocess
    from pathlib import Path

    run = str(Path(__file__).resolve().parents[1] / "sample_runs" / sample)
    args = ["analyze", run, "--no-report", "--format", "json"]
    env = {**os.environ, "FORENSICS_NO_CACHE": "1"}
    plain = subprocess.run(
        [sys.executable, "-m", "forensics", *args], capture_output=True, text=True, env=env
    )
    reusing = subprocess.run(
        [sys.executable, "-c", _ANALYZE_REUSING, *args], capture_output=True, text=True, env=env
    )
    assert plain.returncode == reusing.returncode, reusing.stderr
    assert '"findings"' in plain.stdout
    assert reusing.stdout == plain.stdout
