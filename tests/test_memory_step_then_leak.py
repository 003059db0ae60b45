"""Memory that steps up and then leaks, and memory logged in bytes under a name with no unit.

Crafted with tensorboardX. Memory flat at 42 GB to step 1,500, then 25 GB more at once (an
eval's cache, say) and climbing 20 GB per 1k steps. The continuous bend the growth check fits
spread the step over the bins before it: "from 42 GB at step 1,015", onset "anywhere in
880-1,150", hundreds of steps before the memory moved. Now a jump at the knot is fitted too,
and kept where it clearly fits better: the onset is the step.

``memory_allocated`` (what ``torch.cuda.memory_allocated()`` returns: bytes) at 4.2e10 read
"Memory grew 29,698,216,992 over 1,485 steps ... (the log does not state the unit)". A memory
level of 1e10 or more with no unit in its name can only be bytes: it is now shown in GB, and
the sentence says the unit was read from the values' size. The ``unit`` measure stays null:
the log does not state it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from forensics.findings import FindingKind
from forensics.pipeline import analyze


def _run(path: Path, tag: str, level: float, jump: float, per_step: float) -> Path:
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(8)
    w = SummaryWriter(str(path))
    for s in range(3000):
        w.add_scalar("train/loss", 2.0 + 6 / (1 + s / 300) + rng.normal(0, 0.02), s)
        mem = level * (1 + 2e-4 * rng.standard_normal())
        if s > 1500:
            mem += jump + (s - 1500) * per_step
        w.add_scalar(tag, mem, s)
    w.close()
    return path


def _growth(path: Path):  # type: ignore[no-untyped-def]
    (f,) = [f for f in analyze(path).findings if f.kind is FindingKind.MEMORY_GROWTH]
    return f


def test_a_step_then_a_leak_starts_at_the_step(tmp_path: Path) -> None:
    f = _growth(_run(tmp_path / "r", "memory/allocated_gb", 42.0, 25.0, 0.02))
    assert 1490 <= f.start_step <= 1510
    lo, hi = f.onset_bounds
    assert lo <= 1501 <= hi and hi - lo < 100
    assert f.measures["start_level"] > 60  # the level after the step, not the 42 GB before it
    assert "Memory grew 29.7 GB over" in f.summary


def test_bytes_under_a_name_without_a_unit_are_shown_in_gb(tmp_path: Path) -> None:
    f = _growth(_run(tmp_path / "r", "memory_allocated", 4.2e10, 0.0, 2e7))
    assert f.measures["unit"] is None
    assert "Memory grew 29.7 GB over" in f.summary
    assert "from 42 GB at step" in f.summary
    assert f.summary.endswith(
        "(the log does not state the unit; values this large can only be bytes)."
    )
