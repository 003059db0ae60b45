"""Contract checks run over every registered detector (ruptures / scikit-learn's check_estimator
idea)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from synthetic import healthy_grad_norm, healthy_loss, long_frame, run_from_frame

from forensics.detectors import REGISTRY, load
from forensics.evidence import Evidence
from forensics.findings import Finding, Severity

NAMES = sorted(REGISTRY)


def _cls(name: str) -> type:
    cls = load(name)
    if cls is None:
        pytest.fail(f"detector {name!r} is registered but its module is missing")
    return cls


def _healthy_run():
    n = 4000
    steps = np.arange(n)
    rng = np.random.default_rng(7)
    return run_from_frame(
        long_frame(
            {
                "train/loss": healthy_loss(n),
                "train/grad_norm": healthy_grad_norm(n),
                "train/lr": (steps, 3e-4 * np.minimum(1.0, (steps + 1) / 200)),
                "train/param_norm": (steps, 50 + 0.002 * steps + rng.normal(0, 0.01, n)),
                "val/loss": (steps[::200], healthy_loss(n, seed=5)[1][::200] + 0.05),
                "tokens_per_second": (steps, 5000 * np.exp(rng.normal(0, 0.03, n))),
                "memory": (steps, 2000 + rng.normal(0, 5, n)),
            }
        )
    )


@pytest.mark.parametrize("name", NAMES)
def test_init_only_stores_parameters(name: str) -> None:
    """Parameters are declared once, as a frozen keyword-only dataclass; `__init__` stores it."""
    import dataclasses

    from forensics.params import PARAMS

    cls = _cls(name)
    pcls = PARAMS[name]
    assert dataclasses.is_dataclass(pcls) and pcls.__dataclass_params__.frozen
    for f in dataclasses.fields(pcls):
        assert f.kw_only, f"{name}.{f.name} must be keyword-only"
        assert f.default is not dataclasses.MISSING, f"{name}.{f.name} needs a default"
    assert list(inspect.signature(cls.__init__).parameters)[1:] == ["params"]
    assert cls().params == pcls()
    custom = pcls()
    assert cls(custom).params is custom


@pytest.mark.parametrize("name", NAMES)
def test_quiet_on_a_healthy_run(name: str) -> None:
    """A clean synthetic run gives no finding above info."""
    findings = _cls(name)().detect(Evidence(_healthy_run()))
    assert all(isinstance(f, Finding) for f in findings)
    loud = [f for f in findings if f.severity is not Severity.INFO]
    assert not loud, [f.summary for f in loud]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "series",
    [
        {},
        {"train/loss": (np.arange(1), np.array([2.0]))},
        {
            "train/loss": (np.arange(50), np.full(50, 3.0)),
            "train/grad_norm": (np.arange(50), np.full(50, 1.0)),
        },
        {
            "train/loss": (np.arange(50), np.where(np.arange(50) % 7 == 0, np.nan, 2.0)),
            "val/loss": (np.arange(0, 50, 10), np.full(5, np.inf)),
        },
    ],
    ids=["nothing", "one-point", "constant", "nan-inf"],
)
def test_degenerate_input_does_not_crash(name: str, series: dict) -> None:
    """Empty, one-point, constant and NaN/Inf series never raise."""
    if series:
        run = run_from_frame(long_frame(series))
    else:
        from forensics.schema import empty_frame

        run = run_from_frame(empty_frame())
    findings = _cls(name)().detect(Evidence(run))
    assert isinstance(findings, list)
