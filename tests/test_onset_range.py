"""An onset fitted as a bend on binned points carries the steps it cannot be told from.

grad_norm_drift, memory_growth, layer_grad_shift and a param-norm surge place their onset at
the step of one bin's median (a two-piece fit whose knot can only sit there). The fit is
almost as good at a neighbouring bin's step, so the finding's ``onset_range`` spans the
neighbours; the true bend of each crafted series lies inside it. An onset the detector reads
at a logged point (a throughput drop, a spike) has none.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import synthetic as syn

from forensics.detectors import load
from forensics.evidence import Evidence
from forensics.evidence.trend_utils import bend_range
from forensics.findings import Finding, FindingKind


def test_bend_range_spans_the_neighbouring_bins() -> None:
    xb = np.array([5.0, 15.0, 25.0, 35.0])
    assert bend_range(xb, 25) == (15, 35)
    assert bend_range(xb, 24) == (15, 35)  # (the bin nearest the onset)
    assert bend_range(xb, 5) == (5, 15)  # at an end: its own step bounds that side
    assert bend_range(xb, 35) == (25, 35)
    assert bend_range(np.array([10.5, 20.5, 30.5]), 20) == (10, 31)  # whole steps, outward


def _found(registry: str, frame: pl.DataFrame, kind: FindingKind) -> Finding:
    found = load(registry)().detect(Evidence(syn.run_from_frame(frame)))
    (f,) = [f for f in found if f.kind is kind]
    return f


def _surging_param_norm() -> pl.DataFrame:
    steps = np.arange(0, 10000, 10)
    rng = np.random.default_rng(3)
    pn = 100.0 * (1 + 0.05 * steps / 10000 + np.where(steps > 6000, (steps - 6000) / 4000, 0))
    return syn.long_frame(
        {
            "loss": syn.healthy_loss(10000, 0, 10)[0:2],
            "param_norm": (steps, pn * (1 + rng.normal(0, 2e-4, len(steps)))),
        }
    )


def _leak_from_3000() -> pl.DataFrame:
    steps = np.arange(0, 8000, 10)
    rng = np.random.default_rng(4)
    mem = 20.0 + np.maximum(steps - 3000, 0) * 0.002 + rng.normal(0, 0.02, len(steps))
    return syn.long_frame({"loss": syn.healthy_loss(8000, 0, 10)[0:2], "memory_gb": (steps, mem)})


@pytest.mark.parametrize(
    ("registry", "frame", "kind", "truth"),
    [
        (
            "grad_norm_drift",
            lambda: syn.trend_grad_norm_drift()[0],
            FindingKind.GRAD_NORM_DRIFT,
            6500,
        ),
        ("memory", _leak_from_3000, FindingKind.MEMORY_GROWTH, 3000),
        ("layers", lambda: syn.trend_layer_shift()[0], FindingKind.LAYER_GRAD_SHIFT, 5000),
        ("param_norm", _surging_param_norm, FindingKind.PARAM_NORM_JUMP, 6000),
    ],
)
def test_a_bend_fitted_on_bins_has_its_range(registry, frame, kind, truth) -> None:
    f = _found(registry, frame(), kind)
    assert f.onset_range is not None, f.summary
    lo, hi = f.onset_range
    assert lo < f.start_step < hi
    if truth is not None:
        assert lo <= truth <= hi, (f.onset_range, f.summary)
    assert f.to_dict()["onset_range"] == [lo, hi]


def test_a_climb_from_the_analysed_start_has_none() -> None:
    """Memory growing from the start of what is analysed: no bend was fitted, and the onset
    is the first analysed step."""
    frame, _ = syn.trend_infra(drop=None, leak=1.0)
    f = _found("memory", frame, FindingKind.MEMORY_GROWTH)
    assert f.onset_range is None


def test_an_onset_read_at_a_logged_point_has_none() -> None:
    frame, _ = syn.trend_infra(leak=0.0)
    found = load("throughput")().detect(Evidence(syn.run_from_frame(frame)))
    assert found and all(f.onset_range is None for f in found)
    assert all(f.to_dict()["onset_range"] is None for f in found)
