"""W&B exports with a cell that is not a number ("N/A") in a metric column.

The chart export (UI CSV) and the API history saved as CSV, JSON lines or Parquet read every
cell as a float, turned "N/A" into a missing value and dropped it as if nothing had been
logged at that step, with no word. An empty cell is a value not logged (W&B's sparse rows); a
cell with text in a column of numbers is data the tool could not read. Those are left out
now with a note that counts them and says where (a line of the CSV or JSON lines file, a row
of the Parquet file), as the JSONL and Lightning CSV readers do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forensics.importers import read_run


def _rows() -> list[dict]:
    rows = []
    for s in range(40):
        rows.append(
            {
                "_step": s,
                "_runtime": float(s),
                "_timestamp": 1.7e9 + s,
                "train/loss": f"{3.0 - s / 100:.3f}",
                "train/grad_norm": "0.5" if s % 2 else "",  # sparse: every other row
            }
        )
    rows[7]["train/loss"] = "N/A"
    rows[9]["train/grad_norm"] = "n/a"
    return rows


@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
def test_api_history_counts_cells_that_are_not_numbers(tmp_path: Path, kind: str) -> None:
    import pandas as pd

    rows = _rows()
    path = tmp_path / f"history.{kind}"
    if kind == "csv":
        pd.DataFrame(rows).to_csv(path, index=False)
    elif kind == "jsonl":
        path.write_text(
            "".join(json.dumps({k: v for k, v in r.items() if v != ""}) + "\n" for r in rows)
        )
    else:
        pd.DataFrame(rows).to_parquet(path)
    run = read_run(path)
    assert run.format == "wandb_csv"
    where = {"csv": ("line", 9, 11), "jsonl": ("line", 8, 10), "parquet": ("row", 8, 10)}[kind]
    assert (
        f"history.{kind}: left out 2 value(s) that are not numbers, of columns that hold "
        f"numbers in other rows (train/loss at {where[0]} {where[1]}; train/grad_norm at "
        f"{where[0]} {where[2]})"
    ) in run.notes
    assert run.series("loss").height == 39  # the 40 rows less the "N/A"


def test_ui_chart_export_counts_cells_that_are_not_numbers(tmp_path: Path) -> None:
    lines = [
        '"Step","brisk-pond-1 - train/loss","brisk-pond-1 - train/loss__MIN",'
        '"brisk-pond-1 - train/loss__MAX"'
    ]
    for s in range(0, 200, 5):
        v = "N/A" if s == 50 else "" if s == 55 else f"{3.0 - s / 1000:.4f}"
        lines.append(f"{s},{v},{v},{v}")
    (tmp_path / "loss.csv").write_text("\n".join(lines) + "\n")
    run = read_run(tmp_path)
    assert run.format == "wandb_csv"
    assert (
        "loss.csv: left out 1 value(s) that are not numbers, of columns that hold numbers in "
        "other rows (brisk-pond-1 - train/loss at line 12)"
    ) in run.notes
    # The empty cell (step 55) is a point not logged: no note names it.
    assert run.series("loss").height == 38
