"""Contract checks shared by every trend detector (issue 7): quiet, robust, and honest about skips."""

from __future__ import annotations

import inspect

import numpy as np
import polars as pl
import pytest

from forensics.detectors import load
from forensics.findings import Finding, Severity
from synthetic import long_frame, run_from_frame, trend_healthy

TREND_DETECTORS = [
    "grad_norm_drift", "eval_regression", "param_norm", "layers", "activations",
    "train_val", "plateau", "throughput", "stall", "memory",
]


def _all_metrics(n: int, fill: str, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    steps = np.arange(0, n)
    tags = ["loss", "val_loss", "grad_norm", "param_norm", "lr", "tokens_per_sec", "memory", "epoch",
            "eval/accuracy", "grad_norm/layers.0", "grad_norm/layers.1", "param_norm/layers.0",
            "act/absmax/layers.0", "act/std/layers.0"]
    out = {}
    for t in tags:
        if fill == "constant":
            v = np.full(n, 1.0)
        elif fill == "nan":
            v = rng.uniform(0.5, 1.5, n)
            v[::3] = np.nan
            v[1::7] = np.inf
        else:
            v = rng.uniform(0.5, 1.5, n)
        out[t] = (steps, v)
    return out


@pytest.mark.parametrize("name", TREND_DETECTORS)
def test_registered_and_keyword_only(name: str) -> None:
    """Each trend detector loads from the registry and takes keyword-only parameters only."""
    cls = load(name)
    assert cls is not None
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert params and all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    cls()  # defaults are enough


@pytest.mark.parametrize("name", TREND_DETECTORS)
def test_empty_run_notes_the_skip(name: str) -> None:
    """A run without the needed series (nor wall times) yields no finding and a 'not run' note."""
    frame = long_frame({"something_else": (np.arange(50), np.ones(50))})
    run = run_from_frame(frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("wall_time")))
    assert load(name)().detect(run) == []
    assert any("not run" in n for n in run.notes), run.notes


@pytest.mark.parametrize("fill", ["constant", "nan", "noise"])
@pytest.mark.parametrize("n", [1, 3, 40, 600])
@pytest.mark.parametrize("name", TREND_DETECTORS)
def test_degenerate_series_do_not_crash(name: str, fill: str, n: int) -> None:
    """Constant, NaN/Inf-laden, tiny and pure-noise series never raise and give only warnings at most."""
    run = run_from_frame(long_frame(_all_metrics(n, fill)))
    out = load(name)().detect(run)
    assert all(isinstance(f, Finding) for f in out)
    if fill == "constant":
        assert [f for f in out if f.severity is not Severity.INFO] == []


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", TREND_DETECTORS)
def test_quiet_on_healthy_synthetic_run(name: str, seed: int) -> None:
    """A healthy synthetic pre-training run draws no finding from any trend detector."""
    frame, _ = trend_healthy(seed=seed)
    assert load(name)().detect(run_from_frame(frame)) == []
