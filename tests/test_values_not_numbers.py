"""A metric's value that is not a number is left out and counted, not dropped unseen.

A JSONL log whose loss reads "N/A" on one line of 5,000 (a logger's placeholder) had that
line's loss left out with no word in the notes; a list value the same. A key that logs
numbers on other lines and something else here is now counted in the run's notes, with its
line numbers. A key that never logs a number (a run name) is no metric and is not counted;
a null is a value not logged, not counted either.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from forensics.importers import read_run
from forensics.importers.jsonl import finish, parse_lines


def _rows() -> list[dict]:
    rows = [{"step": i, "loss": 2.0 - i * 1e-4, "lr": 3e-4, "run": "exp42"} for i in range(5000)]
    rows[2500]["loss"] = "N/A"
    rows[2600]["loss"] = None
    rows[2700]["loss"] = "nan"  # (a number: NaN, kept)
    rows[3000]["lr"] = [1, 2]
    return rows


NOTE = (
    "metrics.jsonl: left out 2 value(s) that are not numbers, of keys that log numbers on "
    "other lines (loss at line 2,501; lr at line 3,001)"
)


def test_the_run_notes_count_them(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in _rows()) + "\n")
    run = read_run(tmp_path)
    assert NOTE in run.notes, run.notes
    loss = run.frame.filter(pl.col("tag") == "loss")
    assert loss.height == 4998  # (N/A and null left out, nan kept)
    assert not any("run" in n for n in run.notes if n != NOTE)


@pytest.mark.parametrize("fast", [True, False])
def test_both_readers_count_them(fast: bool) -> None:
    raw = ("\n".join(json.dumps(r) for r in _rows()) + "\n").encode()
    result = finish(parse_lines(raw, "metrics.jsonl", fast=fast), "metrics.jsonl")
    assert NOTE in result.notes, result.notes


def test_a_lightning_csv_counts_them_too(tmp_path: Path) -> None:
    """The same in a Lightning metrics.csv: an "N/A" cell of train_loss (line 1,002) is left
    out and counted; the empty cells of the sparse val_loss column are values not logged."""
    lines = ["step,epoch,train_loss,val_loss"]
    for i in range(2000):
        val = "" if i % 100 else f"{2.1 - i * 1e-4:.4f}"
        train = "N/A" if i == 1000 else f"{2.0 - i * 1e-4:.4f}"
        lines.append(f"{i},0,{train},{val}")
    folder = tmp_path / "lightning_logs" / "version_0"
    folder.mkdir(parents=True)
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    run = read_run(folder)
    assert run.format == "lightning_csv"
    assert (
        "metrics.csv: left out 1 value(s) that are not numbers, of columns that hold numbers "
        "in other rows (train_loss at line 1,002)"
    ) in run.notes, run.notes
    assert run.frame.filter(pl.col("tag") == "train_loss").height == 1999
