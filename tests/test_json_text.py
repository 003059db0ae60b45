"""The fast indented JSON writer gives json.dumps(indent=2, allow_nan=False)'s exact text."""

from __future__ import annotations

import enum
import json
from pathlib import Path

import numpy as np
import pytest

from forensics.outputs.json_text import _Pieces, dumps_indented
from forensics.pipeline import analyze

SAMPLES = Path(__file__).resolve().parent.parent / "sample_runs"


def _reference(doc: object) -> str:
    return json.dumps(doc, indent=2, allow_nan=False)


@pytest.mark.parametrize("name", ["bad_batch", "divergence", "healthy", "nan", "resumed"])
def test_findings_documents_of_sample_runs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same text, by the fast walk itself: a findings document holds nothing it hands to
    the standard encoder (a spike's classification is a str Enum; a fallback once cost a
    1M-step run 120 MB more at its peak)."""
    doc = analyze(SAMPLES / name).to_document()
    want = _reference(doc)

    def no_fallback(*a: object, **k: object) -> None:
        raise AssertionError("the standard encoder was used")

    monkeypatch.setattr(json, "JSONEncoder", no_fallback)
    assert dumps_indented(doc) == want


class _Color(enum.IntEnum):
    RED = 3


class _Name(enum.StrEnum):
    A = "a"


EDGE_CASES: list[object] = [
    {},
    [],
    (),
    "",
    0,
    -0.0,
    1e300,
    5e-324,
    2**80,
    True,
    None,
    {"a": {}, "b": [], "c": [[]], "d": [{}], "e": ({},)},
    {"ü": 'snow ☃ \u2028 \x00 " \\ \n\t', "emoji": "\U0001f600"},
    [1, 2.5, "x", None, False, [3, [4, {"k": (5, 6)}]]],
    {1: "int key", 2.5: "float key", False: "bool key", None: "none key"},
    {"enum": _Color.RED, "str enum": _Name.A},
    {"np": np.float64(0.1), "list": [np.float64(2.0)]},
    {"deep": [[[[[[[[[[1]]]]]]]]]]},
]


@pytest.mark.parametrize("doc", EDGE_CASES, ids=range(len(EDGE_CASES)))
def test_edge_cases_match_the_standard_text(doc: object) -> None:
    assert dumps_indented(doc) == _reference(doc)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), [1.0, {"x": float("-inf")}]])
def test_non_finite_numbers_raise_as_the_standard_encoder(bad: object) -> None:
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        dumps_indented(bad)


def test_circular_and_unknown_objects_raise_as_the_standard_encoder() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        dumps_indented(loop)
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps_indented({"x": {1, 2}})


def test_a_long_document_is_joined_in_parts() -> None:
    """More pieces than one flush holds: the buffered parts join to the same text."""
    doc = {"rows": [{"i": i, "v": i / 7, "s": f"n{i}"} for i in range(3 * _Pieces._EVERY)]}
    assert dumps_indented(doc) == _reference(doc)
