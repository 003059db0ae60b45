"""Detectors: each turns a Run into findings. An explicit registry, no discovery magic.

A detector is a small class whose ``__init__`` only stores keyword-only parameters (the
article's defaults); ``detect(run)`` returns a list of :class:`~forensics.findings.Finding`.
When a run did not log what a detector needs, it returns nothing and says so with
``run.note(...)``. Parameters are overridden from ``[tool.forensics.detectors.<name>]``.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from forensics.evidence import Evidence
from forensics.findings import Finding, FindingKind, sort_findings
from forensics.params import Params, resolve
from forensics.run import Run


class Detector(Protocol):
    """``__init__(params)`` stores its parameters (:mod:`forensics.params`) and nothing else;
    ``detect(evidence)`` returns findings, each with what it was judged against."""

    name: str

    def detect(self, ev: Evidence) -> list[Finding]: ...


# name -> "module:Class" under forensics.detectors. Imported lazily so `--help` stays fast.
REGISTRY: dict[str, str] = {
    # spike forensics (article section 4)
    "spikes": "spikes:SpikeDetector",  # loss_spike, grad_norm_spike, grad_norm_outliers
    "periodic": "periodic:PeriodicSpikeDetector",  # periodic_spikes
    "nan_inf": "nan_inf:NanInfDetector",  # nan_inf
    "divergence": "divergence:DivergenceDetector",  # divergence
    "loss_scale": "loss_scale:LossScaleDetector",  # loss_scale_drop
    # trend forensics (article sections 3, 5, 6)
    "grad_norm_drift": "drift:GradNormDriftDetector",  # grad_norm_drift
    "eval_regression": "eval_regression:EvalRegressionDetector",  # eval_regression
    "resume_regression": "resume_regression:ResumeRegressionDetector",  # + resume_drop
    "lr_restart": "lr_restart:LrRestartDetector",  # lr_restart
    "param_norm": "param_norm:ParamNormDetector",  # param_norm_jump
    "layers": "layers:LayerGradShiftDetector",  # layer_grad_shift
    "activations": "activations:ActivationDetector",  # activation_outlier
    "train_val": "train_val:TrainValDetector",  # gap_acceleration, overfitting, val_shift
    "plateau": "plateau:PlateauDetector",  # plateau
    "no_learning": "no_learning:NoLearningDetector",  # no_learning
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


def build(params: Params | None = None) -> list[Detector]:
    """Instantiate every registered detector with its configured parameters."""
    params = params or Params()
    out: list[Detector] = []
    for name in REGISTRY:
        cls = load(name)
        if cls is None:
            continue
        out.append(cls(params[name]))
    return out


def detect(
    run: Run,
    params: Params | dict[str, dict[str, Any]] | None = None,
    ignore: set[str] | None = None,
    *,
    evidence: Evidence | None = None,
) -> list[Finding]:
    """Run every detector over ``run``; return findings in step order (import findings included).

    ``params`` is a :class:`~forensics.params.Params` or the raw ``detectors`` table of the
    configuration (checked here). Pass ``evidence`` to reuse one already built for the run.
    """
    if not isinstance(params, Params):
        params = resolve(params)
    ev = evidence if evidence is not None else Evidence(run, params)
    dropped = {FindingKind(k) for k in (ignore or set())}
    findings: list[Finding] = list(run.import_findings)
    for det in build(ev.params):
        findings.extend(det.detect(ev))
    # What the steps a resume logged again had shown in the attempt it replaced.
    from forensics.replaced import replaced_attempts

    findings.extend(replaced_attempts(run, ev.params, dropped, findings))
    # (No trim between detectors: the spike search and the analysis view give their large
    # temporaries back where they end. A trim after every detector made later ones fault the
    # same pages in again, 30,000 page faults of a 1M-step analysis, 50,000 at 10M, with the
    # same peak; see forensics.allocator.)
    return sort_findings([f for f in findings if f.kind not in dropped])


def params_for(cls: type, overrides: dict[str, Any] | None = None) -> Any:
    """The parameter object for a detector class with some values overridden (checked)."""
    name = next(n for n in REGISTRY if load(n) is cls)
    return resolve({name: dict(overrides or {})})[name]
