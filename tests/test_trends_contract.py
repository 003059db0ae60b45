"""Contract checks shared by every trend detector (issue 7): quiet, robust, and honest about
skips."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import numpy as np
import polars as pl
import pytest
from synthetic import long_frame, run_from_frame, trend_healthy

from forensics.detectors import load, params_for
from forensics.evidence import Evidence
from forensics.findings import Finding, Severity
from forensics.params import PARAMS

TREND_DETECTORS = [
    "grad_norm_drift",
    "eval_regression",
    "param_norm",
    "layers",
    "activations",
    "train_val",
    "plateau",
    "throughput",
    "stall",
    "memory",
]


def _all_metrics(n: int, fill: str, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    steps = np.arange(0, n)
    tags = [
        "loss",
        "val_loss",
        "grad_norm",
        "param_norm",
        "lr",
        "tokens_per_sec",
        "memory",
        "epoch",
        "eval/accuracy",
        "grad_norm/layers.0",
        "grad_norm/layers.1",
        "param_norm/layers.0",
        "act/absmax/layers.0",
        "act/std/layers.0",
    ]
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
    """Each trend detector loads from the registry; its parameters are declared once (a frozen
    keyword-only dataclass in forensics.params), configurable, and read by the detector."""
    cls = load(name)
    assert cls is not None
    declared = PARAMS[name]
    assert dataclasses.is_dataclass(declared)
    assert declared.__dataclass_params__.frozen  # type: ignore[attr-defined]
    sig = list(inspect.signature(declared).parameters.values())
    assert sig and all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in sig)
    assert cls().params == declared()  # defaults are enough
    # configurable: every field can be changed through the configuration and reaches the detector
    fields = dataclasses.fields(declared)
    changed = {f.name: _other_value(f.default) for f in fields}
    configured = params_for(cls, changed)
    assert cls(configured).params == configured
    assert all(getattr(configured, k) == v for k, v in changed.items())
    # used: every field is read by the detector or by the evidence built with it
    import forensics.evidence as evidence_pkg

    module = inspect.getsource(inspect.getmodule(cls))  # type: ignore[arg-type]
    evidence_src = "".join(
        inspect.getsource(importlib.import_module(f"forensics.evidence.{m.name}"))
        for m in pkgutil.iter_modules(evidence_pkg.__path__)
        if m.name not in ("_slopes", "_rolling")  # (the compiled kernels: C, no parameter read)
    ) + inspect.getsource(evidence_pkg)
    unread = [f.name for f in fields if f".{f.name}" not in module + evidence_src]
    assert not unread, f"{name}: declared but never read: {unread}"


def _other_value(default: object) -> object:
    """A value of the default's type that differs from it."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, float) and 0 < default < 1:
        return default / 2  # (a fraction stays one: throughput's drop must lie in 0-1)
    if isinstance(default, (int, float)):
        return default * 2 + 1
    if isinstance(default, tuple):
        return list(default[:1])
    if isinstance(default, str):
        return default + "x"
    raise AssertionError(f"no other value for {default!r}")


@pytest.mark.parametrize("name", TREND_DETECTORS)
def test_empty_run_notes_the_skip(name: str) -> None:
    """A run without the needed series (nor wall times) yields no finding and a 'not run' note."""
    frame = long_frame({"something_else": (np.arange(50), np.ones(50))})
    run = run_from_frame(frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("wall_time")))
    assert load(name)().detect(Evidence(run)) == []
    assert any("not run" in n for n in run.notes), run.notes


@pytest.mark.parametrize("fill", ["constant", "nan", "noise"])
@pytest.mark.parametrize("n", [1, 3, 40, 600])
@pytest.mark.parametrize("name", TREND_DETECTORS)
def test_degenerate_series_do_not_crash(name: str, fill: str, n: int) -> None:
    """Constant, NaN/Inf-laden, tiny and pure-noise series never raise and give only warnings at
    most."""
    run = run_from_frame(long_frame(_all_metrics(n, fill)))
    out = load(name)().detect(Evidence(run))
    assert all(isinstance(f, Finding) for f in out)
    if fill == "constant":
        assert [f for f in out if f.severity is not Severity.INFO] == []


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", TREND_DETECTORS)
def test_quiet_on_healthy_synthetic_run(name: str, seed: int) -> None:
    """A healthy synthetic pre-training run draws no finding from any trend detector."""
    frame, _ = trend_healthy(seed=seed)
    assert load(name)().detect(Evidence(run_from_frame(frame))) == []


def _documented_keys(module_name: str) -> dict[str, set[str]]:
    """Measures keys per kind as declared in forensics.measures (the detectors' docstrings
    point there since commit 1f0bccf; ``module_name`` only names the case)."""
    from forensics.measures import MEASURES

    return {kind: {m.key for m in ms} for kind, ms in MEASURES.items()}


def _triggering_frame(case: str) -> pl.DataFrame:
    import synthetic as syn

    return {
        "drift": lambda: syn.trend_grad_norm_drift(),
        "eval": lambda: syn.trend_eval_regression(with_drift=True),
        "param_jump": lambda: syn.trend_param_norm(),
        "param_growth": lambda: syn.trend_param_norm(jump_at=None, growth=0.8),
        "layers": lambda: syn.trend_layer_shift(),
        "activations": lambda: syn.trend_activations(std_layer=1),
        "overfit": lambda: syn.trend_train_val("overfit", steps_per_epoch=1500),
        "val_shift": lambda: syn.trend_train_val("val_shift"),
        "plateau": lambda: syn.trend_plateau(case="stuck"),
        "throughput": lambda: syn.trend_infra(),
        "stall": lambda: syn.trend_infra(drop=None, stall_at=3000),
        "memory": lambda: syn.trend_infra(drop=None, leak=1.0),
    }[case]()[0]


@pytest.mark.parametrize(
    ("module_name", "registry_name", "case"),
    [
        ("drift", "grad_norm_drift", "drift"),
        ("eval_regression", "eval_regression", "eval"),
        ("param_norm", "param_norm", "param_jump"),
        ("param_norm", "param_norm", "param_growth"),
        ("layers", "layers", "layers"),
        ("activations", "activations", "activations"),
        ("train_val", "train_val", "overfit"),
        ("train_val", "train_val", "val_shift"),
        ("plateau", "plateau", "plateau"),
        ("throughput", "throughput", "throughput"),
        ("stall", "stall", "stall"),
        ("memory", "memory", "memory"),
    ],
)
def test_measures_match_the_documented_table(
    module_name: str, registry_name: str, case: str
) -> None:
    """Every finding's measures keys are exactly the keys documented for its kind (the README
    table)."""
    documented = _documented_keys(module_name)
    found = load(registry_name)().detect(Evidence(run_from_frame(_triggering_frame(case))))
    assert found
    for f in found:
        assert set(f.measures) == documented[f.kind.value], f.kind
