"""The findings contract: coercion, ordering, the measures each kind declares, the JSON Schema."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from forensics.findings import Finding, FindingKind, Severity, sort_findings, worst_severity
from forensics.measures import MEASURES, problems

ROOT = Path(__file__).resolve().parents[1]

KINDS = {
    "loss_spike",
    "grad_norm_spike",
    "grad_norm_outliers",
    "periodic_spikes",
    "divergence",
    "loss_climb",
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
    "resume_regression",
    "resume_drop",
    "resume_setback",
    "lr_restart",
    "plateau",
    "no_learning",
    "throughput_drop",
    "stall",
    "memory_growth",
    "restart",
    "replaced_attempt",
    "truncated_log",
    "crash",
}


def test_vocabulary_is_fixed() -> None:
    """The finding kinds are exactly the documented vocabulary."""
    assert {k.value for k in FindingKind} == KINDS


def test_non_finite_measures_become_null() -> None:
    """NaN and Inf never reach the document; numpy scalars become plain numbers."""
    f = Finding(
        FindingKind.NAN_INF,
        Severity.CRITICAL,
        "loss",
        np.int64(5),
        "x",
        measures={
            "last_finite_value": float("nan"),
            "bad_fraction": math.inf,
            "first_run_points": np.float32(1.5),
            "bad_points": np.int64(3),
            "first_bad_value": "nan",
            "persistent": True,
        },
    )
    d = f.to_dict("p")
    assert d["measures"] == {
        "last_finite_value": None,
        "bad_fraction": None,
        "first_run_points": 1.5,
        "bad_points": 3,
        "first_bad_value": "nan",
        "persistent": True,
    }
    assert isinstance(d["start_step"], int)
    json.dumps(d, allow_nan=False)


def test_order_and_worst() -> None:
    """Findings sort by start step, then most severe first; the worst severity is the verdict's
    basis."""
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
        "onset_range",
        "events_at",
        "measures",
        "judged_against",
        "summary",
        "prescription",
    ]
    doc = _doc(f)
    jsonschema.validate(doc, findings_schema)
    bad = json.loads(json.dumps(doc))
    bad["findings"][0]["measures"]["classification"] = "weird"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, findings_schema)


def _doc(finding: Finding) -> dict:
    return {
        "schema_version": 2,
        "run": {
            "name": "r",
            "path": "/r",
            "format": "jsonl",
            "first_step": 0,
            "last_step": 9,
            "metrics": {"loss": "loss"},
        },
        "verdict": "healthy",
        "findings": [{**finding.to_dict("rx"), "causes": []}],
        "incidents": [],
    }


def test_every_kind_declares_its_measures() -> None:
    """measures.py declares every kind, each key once, fixed values only for strings."""
    assert list(MEASURES) == [k.value for k in FindingKind]
    for kind, ms in MEASURES.items():
        keys = [m.key for m in ms]
        assert len(keys) == len(set(keys)), kind
        assert all(m.meaning and (not m.values or m.type is str) for m in ms), kind


def test_undeclared_measure_key_is_rejected() -> None:
    """A renamed or misspelt key fails when the finding is made, naming the key and the kind."""
    with pytest.raises(ValueError, match=r"loss_spike finding: measure\(s\) 'heigth'"):
        Finding("loss_spike", "info", "loss", 3, "s", measures={"heigth": 1.0})
    with pytest.raises(ValueError, match="'layer'"):
        Finding("plateau", "info", "loss", 3, "s", measures={"level": 2.0, "layer": 1})
    Finding("plateau", "info", "loss", 3, "s", measures={"level": 2.0, "lr_start": None})


def test_measure_types_are_checked() -> None:
    """problems() reports a wrong type, a null where none is allowed, and an unknown value."""
    ok = {"classification": "physiological", "height": 2, "recovery_steps": None, "z": 1.5}
    assert problems("loss_spike", ok) == []
    bad = {
        "height": "2",
        "points": 1.5,
        "z": None,
        "recovered": 1,
        "trend": "curvy",
    }
    assert [p.split(":")[0] for p in problems("loss_spike", bad)] == [
        "loss_spike.height",
        "loss_spike.points",
        "loss_spike.z",
        "loss_spike.recovered",
        "loss_spike.trend",
        "loss_spike.classification",  # required for a loss spike
    ]


def _schema_gen():
    spec = importlib.util.spec_from_file_location("schema_gen", ROOT / "scripts" / "schema_gen.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_schema_file_is_generated_from_measures() -> None:
    """The schema file's per-kind measures are exactly what measures.py declares."""
    path = ROOT / "forensics" / "schemas" / "findings.schema.json"
    text = path.read_text(encoding="utf-8")
    assert text == _schema_gen().render(text), "run: python scripts/schema_gen.py --write"


def test_schema_accepts_every_kind_and_cause_the_tool_emits(findings_schema: dict) -> None:
    """The schema's kind and cause enums had been written by hand and lagged the code: seven
    kinds the tool emits (no_learning, loss_climb, lr_restart, the resume kinds,
    replaced_attempt) failed validation against the published schema. A finding of each kind
    with a cause of each id validates now; the generator keeps both lists from the code."""
    from forensics.causes import CAUSES

    for kind in FindingKind:
        f = Finding(kind, "info", None, 1, "s")
        doc = _doc(f)
        doc["findings"][0]["measures"] = {}
        doc["findings"][0]["causes"] = [
            {
                "cause": c,
                "text": "t",
                "status": "untested",
                "evidence": "e",
                "steps": [],
                "consequence_of": None,
            }
            for c in CAUSES
        ]
        # (measures are checked per kind by the clause below; only the enums here)
        schema = json.loads(json.dumps(findings_schema))
        schema["properties"]["findings"]["items"].pop("allOf")
        jsonschema.validate(doc, schema)


def test_schema_checks_each_kinds_measures(findings_schema: dict) -> None:
    """The schema rejects an undeclared key, a wrong type and a null where none is allowed."""
    good = Finding(
        "grad_norm_drift",
        "warning",
        "grad_norm",
        10,
        "s",
        measures={"baseline": 1.0, "critical_step": None, "warning_step": 40},
    )
    doc = _doc(good)
    jsonschema.validate(doc, findings_schema)
    for key, value in [("warning_step", 4.5), ("baseline", None), ("warn_step", 40)]:
        bad = json.loads(json.dumps(doc))
        bad["findings"][0]["measures"][key] = value
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, findings_schema)


def test_golden_findings_follow_the_declaration() -> None:
    """Every finding on every sample and real run (tests/golden) has measures of the declared
    types (tests/test_golden_findings.py keeps the emitted findings equal to these)."""
    golden = json.loads((ROOT / "tests" / "golden" / "findings.json").read_text())
    seen, bad = set(), []
    for target, jobs in golden.items():
        for job, findings in jobs.items():
            for f in findings:
                if "error" in f:
                    continue
                seen.add(f["kind"])
                bad += [f"{target}/{job}: {p}" for p in problems(f["kind"], f["measures"])]
    assert not bad, bad
    assert len(seen) >= 15, seen


def test_synthetic_spikes_follow_the_declaration(findings_schema: dict) -> None:
    """A loss spike led by a grad-norm spike (keys the sample runs do not exercise) is typed
    as declared."""
    from synthetic import long_frame, run_from_frame

    import forensics

    steps = np.arange(3000)
    loss = 2 + 5 / (1 + steps / 100)
    loss[1500:1503] *= 3
    grad_norm = np.where((steps > 1497) & (steps < 1503), 9.0, 1.0)
    run = run_from_frame(long_frame({"loss": (steps, loss), "grad_norm": (steps, grad_norm)}))
    findings = forensics.detect(run)
    assert {"loss_spike", "grad_norm_spike"} <= {f.kind.value for f in findings}
    assert not [p for f in findings for p in problems(f.kind, f.measures)]
    lead = [f.measures["grad_norm_lead_steps"] for f in findings if f.kind == "loss_spike"]
    assert lead and all(isinstance(v, int) for v in lead), lead
    for f in findings:
        jsonschema.validate(_doc(f), findings_schema)


def test_clean_measures_is_clean_measure_per_value() -> None:
    """The fast coercion of a finding's measures gives what clean_measure gives value by value
    (type and value, NaN/Inf to None, -0.0 kept), keys made strings."""
    from enum import StrEnum

    from forensics.findings import clean_measure, clean_measures

    class Word(StrEnum):
        A = "a"

    class Text(str):
        pass

    values = [
        None, True, False, 0, -3, 2**70, 1.5, -0.0, math.nan, math.inf, -math.inf,
        np.float64(2.5), np.float64(math.nan), np.float32(0.1), np.int64(7), np.bool_(True),
        np.int16(-2), "x", Text("t"), Word.A, [1, 2], np.array(3.0), (1,),
    ]  # fmt: skip
    src = {(i if i % 3 else Text(f"k{i}")): v for i, v in enumerate(values)}
    src[Word.A] = 1.0
    got = clean_measures(src)
    want = {str(k): clean_measure(v) for k, v in src.items()}
    assert list(got) == list(want)
    for k in want:
        assert type(got[k]) is type(want[k]) and type(k) is str, k
        assert repr(got[k]) == repr(want[k]), k
    assert clean_measures([("a", math.nan)]) == {"a": None}  # pairs, as dict() takes them
