"""A JSONL log whose step is not a whole number (0.5, 1.0, 1.5 ...: an epoch or a fraction
logged under "step").

Steps are whole numbers in the analysis. The reader cast each such step down (0.5 to 0) with
no word, so every other line landed on the step of the line before and was replaced by it:
half of the log gone silently. A note now counts those lines and says what became of them
(the re-logged values' note counts what was replaced), for a whole read and for a watched log
read as it grows. Whole numbers written as floats (1.0, 2.0) are no fraction.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forensics.importers import ReadOptions, read_run
from forensics.watch.tail import RunTail


def _lines(steps: list[float]) -> bytes:
    rows = [json.dumps({"step": s, "loss": 3.0 - i / 1000}) for i, s in enumerate(steps)]
    return ("\n".join(rows) + "\n").encode()


def _fraction_notes(notes: list[str]) -> list[str]:
    return [n for n in notes if "not a whole number" in n]


@pytest.mark.parametrize("n", [40, 4000])  # (a block the kernel reads, and several)
def test_fractional_steps_are_counted(tmp_path: Path, n: int) -> None:
    (tmp_path / "metrics.jsonl").write_bytes(_lines([i / 2 for i in range(n)]))
    run = read_run(tmp_path)
    assert _fraction_notes(run.notes) == [
        f"metrics.jsonl: {n // 2:,} line(s) have a step that is not a whole number (0.5, say: "
        "an epoch or a fraction logged as the step); steps are read as whole numbers, so each "
        "such line falls on the whole step below it"
    ]
    assert run.series("loss").height == n // 2
    assert any("were logged again at a step" in x for x in run.notes)


def test_whole_numbers_written_as_floats_are_quiet(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_bytes(_lines([float(i) for i in range(100)]))
    assert _fraction_notes(read_run(tmp_path).notes) == []


def test_a_watched_log_counts_them_as_it_grows(tmp_path: Path) -> None:
    data = _lines([i / 2 for i in range(200)])
    path = tmp_path / "metrics.jsonl"
    tail = RunTail(tmp_path, ReadOptions(cache=False))
    half = data.index(b"\n", len(data) // 2) + 1
    path.write_bytes(data[:half])
    tail.poll()
    with path.open("ab") as fh:
        fh.write(data[half:])
    tail.poll()
    assert tail.run is not None
    (note,) = _fraction_notes(tail.run.notes)
    assert note.startswith("metrics.jsonl: 100 line(s) have a step that is not a whole number")


@pytest.mark.parametrize("fast", [True, False])
def test_both_readers_count_them(fast: bool) -> None:
    """The block reader and the per-line reader (odd lines; ``fast=False`` sends every line
    through it) count the same lines."""
    from forensics.importers.jsonl import parse_lines

    got = parse_lines(_lines([i / 2 for i in range(40)]), "m.jsonl", fast=fast)
    assert got.fractional == 20
