"""A log too short for the loss's checks says so beside its green light.

A JSONL log of one step ({"step": 1, "loss": 2.3}) read "HEALTHY (green light) / No warning,
critical or fatal finding." and nothing else: every check that judges the loss against its own
baseline needs at least 20 points, so nothing but NaN / Inf was judged. The verdict line is
now followed by a sentence that says how many points there are and what that leaves out (the
terminal, the report and the findings document's ``run.unjudged``).
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


@pytest.mark.parametrize(
    ("n", "where"),
    [
        (1, "1 finite loss point in the log (step 1)"),
        (5, "5 finite loss points in the log (steps 1-5)"),
    ],
)
def test_a_short_log_says_what_its_light_covers(tmp_path: Path, n: int, where: str) -> None:
    d = analyze(_log(tmp_path / "r", n))
    assert d.verdict == "healthy"
    assert d.unjudged() == (
        f"Only {where}: the loss's checks need at least 20 to judge a point against its own "
        "baseline (spikes, plateau, divergence, no learning), so the light covers little more "
        "than NaN / Inf."
    )
    assert d.to_document()["run"]["unjudged"] == d.unjudged()


def test_a_log_long_enough_has_no_such_sentence(tmp_path: Path) -> None:
    assert analyze(_log(tmp_path / "r", 20)).unjudged() is None
