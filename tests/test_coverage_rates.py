"""The coverage row of throughput and memory reads what a log without tokens/s or without a
wall clock has.

A log with a step time and no tokens/s read "throughput, memory: not logged", though the
throughput checks read its step time; a tokens/s series without wall times read "one point"
for 3,000 points (the article's cadence is in minutes, which such a log cannot tell).
"""

from __future__ import annotations

import json
from pathlib import Path

from forensics.pipeline import analyze


def _write(folder: Path, key: str, wall: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "metrics.jsonl", "w") as fh:
        for i in range(3000):
            row = {"step": i, "loss": 4.0 / (1 + i / 500), key: 0.5 if key == "step_time" else 3e4}
            if wall:
                row["wall_time"] = 1.7e9 + 0.5 * i
            fh.write(json.dumps(row) + "\n")
    return folder


def _row(folder: Path) -> str:
    (row,) = [c for c in analyze(folder).coverage if c.signs == "throughput, memory"]
    assert row.logged
    return row.observed


def test_a_step_time_stands_in_for_the_throughput(tmp_path: Path) -> None:
    assert _row(_write(tmp_path / "a", "step_time", wall=True)) == (
        "step_time: every 500 ms; missing: memory"
    )


def test_a_series_without_a_wall_clock_is_counted_in_steps(tmp_path: Path) -> None:
    assert _row(_write(tmp_path / "b", "tokens_per_sec", wall=False)) == (
        "throughput: every step (no wall clock: minutes unknown); missing: memory"
    )
    assert _row(_write(tmp_path / "c", "step_time", wall=False)) == (
        "step_time: every step (no wall clock: minutes unknown); missing: memory"
    )
