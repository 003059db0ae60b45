"""The loss-scale chart's axis names the scaler's values: a scaler halves and doubles, so its
values are powers of two, and plotly's decade ticks on a log axis (10k, 1M, 100M) named none
of them. The ticks are powers of two, at most eight, one at the median's power."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from forensics.pipeline import analyze_run, read_run
from forensics.report.charts import build_panels
from forensics.schema import LOSS_SCALE

ROOT = Path(__file__).resolve().parents[1]


def _axis(run_dir: Path) -> tuple[dict, np.ndarray]:
    diag = analyze_run(read_run(run_dir))
    (panel,) = [p for p in build_panels(diag.ev, diag.findings) if p.key == LOSS_SCALE]
    ys = np.array([v for v in panel.figure["data"][0]["y"] if v is not None], dtype=float)
    return panel.figure["layout"]["yaxis"], ys


def test_the_loss_scale_axis_is_labelled_in_powers_of_two() -> None:
    axis, ys = _axis(ROOT / "sample_runs" / "loss_scale_collapse")
    assert axis["type"] == "log"
    ticks = np.array(axis["tickvals"])
    powers = np.log2(ticks)
    assert np.array_equal(powers, np.round(powers)) and 2 <= len(ticks) <= 8
    assert ticks.min() <= 2 * ys.min() and ticks.max() >= ys.max() / 16  # they span the data
    assert np.round(np.log2(np.median(ys))) in powers
    # Large powers as exponents, small ones in full: each label names its tick.
    for t, text in zip(ticks, axis["ticktext"], strict=True):
        k = int(np.log2(t))
        assert text == (f"2<sup>{k}</sup>" if k > 10 or k < 0 else f"{2**k:,}")
