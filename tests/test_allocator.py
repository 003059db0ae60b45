"""forensics.allocator.trim: glibc's free heap pages given back, nothing done elsewhere."""

from __future__ import annotations

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
