"""The fast indented JSON writer gives json.dumps(indent=2, allow_nan=False)'s exact text (a
non-finite number written as null where the standard encoder raises)."""

from __future__ import annotations

import enum
import json
from pathlib import Path

import numpy as np
import pytest

from forensics.outputs.json_text import _LONG, _Pieces, dumps_indented, write_indented
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
    {_Name.A: "a str enum as a key", "t": (1.5, "x", (None, {"y": ()}))},
]


def _nested(depth: int) -> object:
    """Dicts and lists alternating ``depth`` levels deep (deeper than the writer's table of
    indents), a few values on each level."""
    doc: object = [0.5, "end"]
    for i in range(depth):
        doc = {"k": doc, "n": i} if i % 2 else [doc, i, None]
    return doc


EDGE_CASES += [_nested(40), _nested(70)]
# Floats orjson writes otherwise than repr (a decimal below 1e-4, a one-digit negative
# exponent), where they may stand: a value, a list item, a top-level scalar, a long list
# split into parts; and strings that look like them (never rewritten).
_rng = np.random.default_rng(3)
EDGE_CASES += [
    1e-05,
    -2.5e-06,
    {"lr": 3e-05, "x": 1.2e-06, "y": -7.5e-09, "z": 1e-10, "w": 0.0001, "v": 9.99e-05},
    [1e-05, -2.5e-06, [3e-07, {"k": 4e-08}], 1e16, 1.5e-300],
    {"s": "0.00001", "t": 'a": 1e-6', "u": "  3e-7", "list": ["1e-5", 'x": 2e-6,']},
    {"rows": [i * 1e-7 for i in range(3 * _LONG)]},
    [float(v) for v in 10.0 ** _rng.uniform(-12, 20, 2000) * _rng.choice([-1, 1], 2000)],
    {"del": "\x7f", "after": 2e-06},
]


@pytest.mark.parametrize("doc", EDGE_CASES, ids=range(len(EDGE_CASES)))
def test_edge_cases_match_the_standard_text(doc: object) -> None:
    assert dumps_indented(doc) == _reference(doc)


@pytest.mark.parametrize(
    ("bad", "want"),
    [
        (float("nan"), None),
        (float("inf"), None),
        ([1.0, {"x": float("-inf")}], [1.0, {"x": None}]),
        ({"rows": [{"v": float("nan")}] * (3 * _LONG)}, {"rows": [{"v": None}] * (3 * _LONG)}),
    ],
    ids=["nan", "inf", "nested", "in-a-long-list"],
)
def test_non_finite_numbers_are_written_as_null(bad: object, want: object) -> None:
    """Where the standard encoder raises (allow_nan=False), orjson writes null: the text stays
    strict JSON (a findings document never holds one: the sample runs' test above encodes
    them with the standard encoder too)."""
    text = dumps_indented(bad)
    assert json.loads(text) == want
    assert text == _reference(want)


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


class _Sink:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)


def _long_rows(n: int) -> list[dict]:
    return [{"i": i, "v": i / 7, "s": f"n{i}", "l": [i, {"k": None}]} for i in range(n)]


@pytest.mark.parametrize(
    "tail",
    [
        {1: "int key"},  # a key the walk leaves to the standard encoder (which converts it)
        [{"deeper": {2.5: [True]}}],
        {"a": {"b": {False: 0}}},
    ],
    ids=["int-key", "float-key-in-list", "bool-key-deep"],
)
def test_the_standard_encoder_takes_over_after_parts_were_written(tail: object) -> None:
    """The walk gives parts as it goes; a value it leaves to the standard encoder late in a
    long document is met after parts were written, and the text is still the standard's."""
    doc = {"rows": _long_rows(_Pieces._EVERY // 4), "tail": tail, "after": [1, 2]}
    sink = _Sink()
    write_indented(doc, sink)  # type: ignore[arg-type]
    assert len(sink.parts) > 1
    assert "".join(sink.parts) == _reference(doc)
    assert dumps_indented(doc) == _reference(doc)


def test_the_text_is_written_while_the_walk_goes_on() -> None:
    """Not held whole until the end (a 1M-step run's 22 MB was the command's peak memory):
    a value that cannot be encoded, at the end of a long document, is met after text was
    written, and raises as json.dump raises it; the text written is the start of the text."""
    rows = _long_rows(_Pieces._EVERY // 4)
    sink = _Sink()
    with pytest.raises(TypeError, match="not JSON serializable"):
        write_indented({"rows": rows, "bad": {1, 2}}, sink)  # type: ignore[arg-type]
    written = "".join(sink.parts)
    assert len(sink.parts) > 1 and len(written) > 100_000
    assert _reference({"rows": rows, "bad": None}).startswith(written)
