"""Shared fixtures: real TensorBoard runs written with tensorboardX into tmp_path."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
# The shared folder (real logs, format samples): FORENSICS_SHARED, by default ../shared.
SHARED = Path(os.environ.get("FORENSICS_SHARED", str(ROOT.parent / "shared"))).resolve()
REAL_RUNS = SHARED / "real_runs"
# The run cache goes to a folder of this test session, never the user's cache folder.
if "FORENSICS_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["FORENSICS_CACHE_DIR"] = tempfile.mkdtemp(prefix="forensics-test-cache-")


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or skip the test with a reason when it is absent."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} is absent (../shared is not beside the project)")
    return p


def write_tb_run(
    logdir: Path,
    n: int = 600,
    spike_at: int | None = 300,
    nan_at: int | None = None,
    seed: int = 0,
    tag_prefix: str = "train/",
    suffix: str = "",
) -> Path:
    """A TensorBoard run written by tensorboardX: a falling noisy loss, grad norm, lr; optional
    spike/NaN."""
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(seed)
    w = SummaryWriter(str(logdir), filename_suffix=suffix)
    for s in range(n):
        loss = 2.0 + 6.0 / (1 + s / 30) ** 0.7
        loss *= math.exp(rng.normal(0, 0.02))
        gn = 0.5 + 1.5 * math.exp(-s / 80) + abs(rng.normal(0, 0.03))
        if spike_at is not None and spike_at <= s < spike_at + 3:
            loss *= 3.0
            gn *= 8.0
        if nan_at is not None and s >= nan_at:
            loss = float("nan")
            gn = float("nan")
        w.add_scalar(f"{tag_prefix}loss", loss, s)
        w.add_scalar(f"{tag_prefix}grad_norm", gn, s)
        w.add_scalar(f"{tag_prefix}lr", 3e-4 * min(1.0, (s + 1) / 50), s)
    w.close()
    return logdir


def snapshot(folder: Path) -> dict[str, tuple[int, float]]:
    """Every file under folder with its size and mtime, to prove nothing was written there."""
    out = {}
    for dirpath, _, files in os.walk(folder):
        for f in files:
            p = Path(dirpath) / f
            st = p.stat()
            out[str(p.relative_to(folder))] = (st.st_size, st.st_mtime)
    return out


@pytest.fixture
def spike_run(tmp_path: Path) -> Path:
    return write_tb_run(tmp_path / "runs" / "exp42")


@pytest.fixture
def findings_schema() -> dict:
    return json.loads((ROOT / "forensics" / "schemas" / "findings.schema.json").read_text())
