"""Detectors: each turns a Run into findings. An explicit registry, no discovery magic.

A detector is a small class whose ``__init__`` only stores keyword-only parameters (the
article's defaults); ``detect(run)`` returns a list of :class:`~forensics.findings.Finding`.
When a run did not log what a detector needs, it returns nothing and says so with
``run.note(...)``. Parameters are overridden from ``[tool.forensics.detectors.<name>]``.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from forensics.errors import ConfigError
from forensics.findings import Finding, FindingKind, sort_findings
from forensics.run import Run


class Detector(Protocol):
    name: str

    def detect(self, run: Run) -> list[Finding]: ...


# name -> "module:Class" under forensics.detectors. Imported lazily so `--help` stays fast.
REGISTRY: dict[str, str] = {
    # spike forensics (article section 4)
    "spikes": "spikes:SpikeDetector",  # loss_spike, grad_norm_spike
    "periodic": "periodic:PeriodicSpikeDetector",  # periodic_spikes
    "nan_inf": "nan_inf:NanInfDetector",  # nan_inf
    "divergence": "divergence:DivergenceDetector",  # divergence
    "loss_scale": "loss_scale:LossScaleDetector",  # loss_scale_drop
    # trend forensics (article sections 3, 5, 6)
    "grad_norm_drift": "drift:GradNormDriftDetector",  # grad_norm_drift
    "eval_regression": "eval_regression:EvalRegressionDetector",  # eval_regression
    "param_norm": "param_norm:ParamNormDetector",  # param_norm_jump
    "layers": "layers:LayerGradShiftDetector",  # layer_grad_shift
    "activations": "activations:ActivationDetector",  # activation_outlier
    "train_val": "train_val:TrainValDetector",  # gap_acceleration, overfitting, val_shift
    "plateau": "plateau:PlateauDetector",  # plateau
    "throughput": "throughput:ThroughputDetector",  # throughput_drop
    "stall": "stall:StallDetector",  # stall
    "memory": "memory:MemoryGrowthDetector",  # memory_growth
}


def load(name: str) -> type | None:
    """The detector class registered under ``name`` (None while its module is not written)."""
    mod_name, cls_name = REGISTRY[name].split(":")
    try:
        mod = importlib.import_module(f"forensics.detectors.{mod_name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"forensics.detectors.{mod_name}":
            return None
        raise
    return getattr(mod, cls_name)


# Detectors that reuse another detector's analysis get that detector's configured settings,
# so `[tool.forensics.detectors.spikes]` also shapes the spikes periodicity is judged on.
_SHARED = {
    "periodic": ("spike_params", "spikes"),
    "loss_scale": ("spike_params", "spikes"),
    "eval_regression": ("drift_params", "grad_norm_drift"),
}


def _check_types(name: str, cls: type, kwargs: dict[str, Any]) -> None:
    """A configured parameter must have its default's type (an int is fine for a float)."""
    import inspect

    sig = inspect.signature(cls.__init__).parameters
    for key, value in kwargs.items():
        if key not in sig:
            continue  # the constructor's own TypeError names it
        default = sig[key].default
        if default is None or default is inspect.Parameter.empty:
            continue
        want = (int, float) if isinstance(default, float) else type(default)
        if isinstance(value, bool) and not isinstance(default, bool) or not isinstance(value, want):
            raise ConfigError(
                f"detector {name}: {key} = {value!r} should be a {type(default).__name__} (default {default!r})"
            )


def build(params: dict[str, dict[str, Any]] | None = None) -> list[Detector]:
    """Instantiate every registered detector with its configured parameters."""
    params = params or {}
    unknown = set(params) - set(REGISTRY)
    if unknown:
        raise ConfigError(
            f"unknown detector(s) in configuration: {', '.join(sorted(unknown))}; known: {', '.join(REGISTRY)}"
        )
    out: list[Detector] = []
    for name in REGISTRY:
        cls = load(name)
        if cls is None:
            continue
        kwargs = dict(params.get(name, {}))
        _check_types(name, cls, kwargs)
        if name in _SHARED:
            key, source = _SHARED[name]
            kwargs.setdefault(key, dict(params.get(source, {})))
        try:
            out.append(cls(**kwargs))
        except TypeError as exc:
            raise ConfigError(f"detector {name}: {exc}") from None
    return out


def detect(
    run: Run, params: dict[str, dict[str, Any]] | None = None, ignore: set[str] | None = None
) -> list[Finding]:
    """Run every detector over ``run``; return findings in step order (import findings included)."""
    ignore = {FindingKind(k) for k in (ignore or set())}
    findings: list[Finding] = list(run.import_findings)
    for det in build(params):
        findings.extend(det.detect(run))
    return sort_findings([f for f in findings if f.kind not in ignore])
