"""The findings contract (issue 2 item 8): coercion, ordering, the JSON Schema."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from forensics.findings import Finding, FindingKind, Severity, sort_findings, worst_severity

KINDS = {
    "loss_spike",
    "grad_norm_spike",
    "periodic_spikes",
    "divergence",
    "nan_inf",
    "loss_scale_drop",
    "grad_norm_drift",
    "param_norm_jump",
    "layer_grad_shift",
    "activation_outlier",
    "overfitting",
    "gap_acceleration",
    "val_shift",
    "eval_regression",
    "plateau",
    "throughput_drop",
    "stall",
    "memory_growth",
    "restart",
    "truncated_log",
    "crash",
}


def test_vocabulary_is_fixed() -> None:
    """The finding kinds are exactly the documented vocabulary."""
    assert {k.value for k in FindingKind} == KINDS


def test_non_finite_measures_become_null() -> None:
    """NaN and Inf never reach the document; numpy scalars become plain numbers."""
    import numpy as np

    f = Finding(
        FindingKind.NAN_INF,
        Severity.CRITICAL,
        "loss",
        np.int64(5),
        "x",
        measures={
            "a": float("nan"),
            "b": math.inf,
            "c": np.float32(1.5),
            "d": np.int64(3),
            "e": "s",
            "f": True,
        },
    )
    d = f.to_dict("p")
    assert d["measures"] == {"a": None, "b": None, "c": 1.5, "d": 3, "e": "s", "f": True}
    assert isinstance(d["start_step"], int)
    json.dumps(d, allow_nan=False)


def test_order_and_worst() -> None:
    """Findings sort by start step, then most severe first; the worst severity is the verdict's basis."""
    a = Finding("plateau", "info", "loss", 10, "a")
    b = Finding("nan_inf", "fatal", "loss", 10, "b")
    c = Finding(
        "loss_spike", "warning", "loss", 5, "c", measures={"classification": "physiological"}
    )
    assert [f.summary for f in sort_findings([a, b, c])] == ["c", "b", "a"]
    assert worst_severity([a, c]) is Severity.WARNING
    assert worst_severity([]) is None


def test_document_key_order(findings_schema: dict) -> None:
    """A finding's dict has the contract's keys in the contract's order and validates."""
    f = Finding(
        "loss_spike",
        "info",
        "loss",
        3,
        "s",
        peak_step=4,
        end_step=9,
        measures={"classification": "physiological"},
    )
    d = f.to_dict("rx")
    assert list(d) == [
        "kind",
        "severity",
        "metric",
        "start_step",
        "peak_step",
        "end_step",
        "measures",
        "judged_against",
        "summary",
        "prescription",
    ]
    doc = {
        "schema_version": 1,
        "run": {
            "name": "r",
            "path": "/r",
            "format": "jsonl",
            "first_step": 0,
            "last_step": 9,
            "metrics": {"loss": "loss"},
        },
        "verdict": "healthy",
        "findings": [d],
    }
    jsonschema.validate(doc, findings_schema)
    bad = json.loads(json.dumps(doc))
    bad["findings"][0]["measures"]["classification"] = "weird"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, findings_schema)
