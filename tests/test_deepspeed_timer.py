"""DeepSpeed's timer line gives the memory and the speed.

``[timer.py:199:stop] epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=265.3,
CurrSamplesPerSec=265.4, MemAllocated=4.34GB, MaxMemAllocated=12.81GB`` (the format of the
real DeepSpeed-Chat logs in ../shared). The importer read the four numbers but none was a
vital sign: a leak in MemAllocated and a 40% drop of CurrSamplesPerSec passed without a word.
They are read as memory (GB) and throughput (samples/s); the running maximum and the
running average are left as they are."""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np

from forensics.findings import FindingKind
from forensics.pipeline import analyze


def _log(folder: Path) -> Path:
    rng = np.random.default_rng(1)
    t0 = datetime.datetime(2023, 4, 18, 3, 36, 0)
    lines = []
    for i, s in enumerate(range(10, 3001, 10)):
        ts = (t0 + datetime.timedelta(seconds=3 * i)).strftime("%Y-%m-%d %H:%M:%S") + ",000"
        sps = 260 * (1 + 0.02 * rng.standard_normal()) * (0.6 if s >= 2000 else 1.0)
        mem = 4.34 + (0.002 * (s - 1000) if s > 1000 else 0.0)
        lines += [
            f"[{ts}] [INFO] [logging.py:96:log_dist] [Rank 0] step={s}, skipped=0, "
            "lr=[5e-05, 5e-05], mom=[(0.9, 0.95), (0.9, 0.95)]",
            f"[{ts}] [INFO] [timer.py:199:stop] epoch=0/micro_step={s}/global_step={s}, "
            f"RunningAvgSamplesPerSec={sps:.3f}, CurrSamplesPerSec={sps:.3f}, "
            f"MemAllocated={mem:.2f}GB, MaxMemAllocated=12.81GB",
        ]
    folder.mkdir()
    (folder / "train.log").write_text("\n".join(lines) + "\n")
    return folder


def test_memory_and_speed_from_the_timer_line(tmp_path: Path) -> None:
    diag = analyze(_log(tmp_path / "run"))
    run = diag.run
    assert run.metrics()["memory"] == "MemAllocated"
    assert run.metrics()["throughput"] == "CurrSamplesPerSec"
    assert run.unit("memory") == "GB" and run.unit("throughput") == "samples/s"
    kinds = {f.kind: f for f in diag.findings}
    leak = kinds[FindingKind.MEMORY_GROWTH]
    assert abs(leak.start_step - 1000) <= 50
    assert "from 4.34 GB at step" in leak.summary
    drop = kinds[FindingKind.THROUGHPUT_DROP]
    assert drop.start_step == 2000
    assert "samples/s" in drop.summary
