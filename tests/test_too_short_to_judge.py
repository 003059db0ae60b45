"""A log too short for the loss's checks says so beside its green light.

A JSONL log of one step ({"step": 1, "loss": 2.3}) read "HEALTHY (green light) / No warning,
critical or fatal finding." and nothing else. A spike is scored against the 3 points before
it, and the plateau and no-learning checks need 20 points, so under 4 points nothing but NaN /
Inf is judged, and under 20 the trend checks did not run. The verdict line is now followed by
a sentence that says how many points there are and what that leaves out (the terminal, the
report and the findings document's ``run.unjudged``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forensics.pipeline import analyze


def _log(path: Path, n: int) -> Path:
    path.mkdir()
    rows = [{"step": s, "loss": 2.3 - 0.01 * s} for s in range(1, n + 1)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


_NONE = (
    "too few for any check that compares the loss with its own level (a spike needs 3 points "
    "before it, a plateau or a run that never learned 20), so the light covers little more "
    "than NaN / Inf."
)
_FEW = (
    "the plateau and no-learning checks need 20 and did not run, and a spike is judged "
    "against the few points beside it."
)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (1, f"Only 1 finite loss point in the log (step 1): {_NONE}"),
        (3, f"Only 3 finite loss points in the log (steps 1-3): {_NONE}"),
        (5, f"Only 5 finite loss points in the log (steps 1-5): {_FEW}"),
        (19, f"Only 19 finite loss points in the log (steps 1-19): {_FEW}"),
    ],
)
def test_a_short_log_says_what_its_light_covers(tmp_path: Path, n: int, text: str) -> None:
    d = analyze(_log(tmp_path / "r", n))
    assert d.verdict == "healthy"
    assert d.unjudged() == text
    assert d.to_document()["run"]["unjudged"] == text


def test_what_the_sentence_says_of_spikes_holds(tmp_path: Path) -> None:
    """A spike after 3 points is found (the sentence's "3 points before it"); after 2 it is not."""
    for n, found in ((3, 0), (4, 1)):
        path = _log(tmp_path / f"r{n}", n)
        rows = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
        rows[-1]["loss"] = 5.0
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        spikes = [f for f in analyze(path).findings if f.kind.value == "loss_spike"]
        assert len(spikes) == found


def test_a_log_long_enough_has_no_such_sentence(tmp_path: Path) -> None:
    assert analyze(_log(tmp_path / "r", 20)).unjudged() is None
