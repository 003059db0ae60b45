"""A gap acceleration whose previous window was flat: no ratio of noise to noise.

Crafted with tensorboardX: train loss every step, val every 250 steps, a val-train gap flat at
0.05 to step 4,000 and widening 0.4 per 1k steps after it. The warning read "+0.11 over the
1,000 steps to step 4,250, 190.8x the previous window's": the previous window's growth was
+0.0006, under the 0.065 a growth must pass to count at all, so the 190.8x was noise over
noise. The sentence now says the previous window was flat within the noise and gives both
numbers; a previous growth above that floor keeps its ratio (the multi_eval_sets sample's
"1.7x the previous window's").
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from forensics.findings import FindingKind
from forensics.pipeline import analyze


def test_a_flat_previous_window_reads_as_flat(tmp_path: Path) -> None:
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(1)
    w = SummaryWriter(str(tmp_path / "r"))
    for s in range(8000):
        loss = 2.0 + 6 / (1 + s / 300) + rng.normal(0, 0.02)
        w.add_scalar("train/loss", loss, s)
        if s % 250 == 0 and s > 0:
            # (a slight creep before step 4,000: a previous growth above 0, under the noise)
            gap = 0.05 + 0.000002 * s + (0.0004 * (s - 4000) if s > 4000 else 0.0)
            w.add_scalar("val/loss", loss + gap + rng.normal(0, 0.002), s)
    w.close()
    d = analyze(tmp_path / "r")
    (f,) = [f for f in d.findings if f.kind is FindingKind.GAP_ACCELERATION]
    floor = f.judged_against["noise_floor"]
    prev = f.measures["growth_prev"]
    assert isinstance(floor, float) and isinstance(prev, float) and abs(prev) < floor
    assert "x the previous window's" not in f.summary
    assert (
        f"up from a previous window that was flat within the noise ({prev:+.2g}, under the "
        f"{floor:.2g} a growth must pass)"
    ) in f.summary
    assert not math.isnan(f.measures["growth_last"])  # type: ignore[arg-type]


def test_a_real_previous_growth_keeps_its_ratio() -> None:
    d = analyze(Path(__file__).resolve().parents[1] / "sample_runs" / "multi_eval_sets")
    (f,) = [f for f in d.findings if f.kind is FindingKind.GAP_ACCELERATION]
    assert f.measures["growth_prev"] >= f.judged_against["noise_floor"]  # type: ignore[operator]
    assert "1.7x the previous window's" in f.summary
