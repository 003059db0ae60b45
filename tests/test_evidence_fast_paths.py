"""The evidence's shortcuts give what they stand for, on real logs: a series read straight from
the view equals Run.series, the shared despike band equals despike() (issue 17: detection in
linear time with small constants, and identical output)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from forensics.evidence import Evidence, _one_row_per_step
from forensics.evidence.trend_utils import despike
from forensics.pipeline import read_run
from forensics.schema import GRAD_NORM, LOSS, PER_LAYER

ROOT = Path(__file__).resolve().parents[1]
# Formats and shapes: TensorBoard, W&B, JSONL, text logs; a resume (segments replayed), a
# truncated log, NaNs, per-layer series.
SAMPLES = ["resumed", "truncated_log", "nan", "divergence", "loss_scale_collapse", "healthy_wsd"]


@pytest.mark.parametrize("name", SAMPLES)
def test_series_read_from_the_view_equal_run_series(name: str) -> None:
    run = read_run(ROOT / "sample_runs" / name)
    taken = 0
    for metric in run.metrics():
        want = run.series(metric)
        got = _one_row_per_step(run, metric, None)
        if metric in PER_LAYER:
            assert got is None
            continue
        if got is not None:
            taken += 1
            assert got.equals(want), metric
        ev = Evidence(run)
        s = ev.logged(metric)
        assert np.array_equal(s.steps, want.get_column("step").to_numpy())
        assert np.array_equal(s.values, want.get_column("value").to_numpy(), equal_nan=True)
    assert taken > 0  # the shortcut is the usual path, not dead code


def test_a_step_logged_by_two_sources_takes_run_series() -> None:
    """Two sources with the same tag repeat steps: the group-by (last value per step) is
    needed, and the shortcut steps aside."""
    import polars as pl

    run = read_run(ROOT / "sample_runs" / "bad_batch")
    tag = run.metrics()[LOSS]
    twin = run.frame.filter(pl.col("tag") == tag).with_columns(
        pl.lit("twin").cast(run.frame.schema["source"]).alias("source"),
        (pl.col("value") * 2).alias("value"),
    )
    run.frame = pl.concat([run.frame, twin])
    assert _one_row_per_step(run, LOSS, None) is None
    want = run.series(LOSS)
    s = Evidence(run).logged(LOSS)
    assert np.array_equal(s.steps, want.get_column("step").to_numpy())
    assert np.array_equal(s.values, want.get_column("value").to_numpy())


@pytest.mark.parametrize("name", ["bad_batch", "grad_norm_drift", "periodic_spikes"])
@pytest.mark.parametrize("k", [3.0, 5.0, 8.0])
def test_shared_despike_band_equals_despike(name: str, k: float) -> None:
    ev = Evidence(read_run(ROOT / "sample_runs" / name))
    for metric in (LOSS, GRAD_NORM):
        values = ev.series(metric).values
        assert np.array_equal(ev.despiked(metric, k=k), despike(values, k=k))


def test_a_short_run_does_not_load_the_rank_filter() -> None:
    """scipy.ndimage costs 0.2 s to import: a short run's rolling medians stay with polars."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from forensics.pipeline import analyze\n"
        f"analyze({str(ROOT / 'sample_runs' / 'bad_batch')!r})\n"
        "print('scipy.ndimage' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "False"
