"""A W&B chart export holds the chart's sampled points: a spike inside a bucket shows only in
the bucket's __MAX (or __MIN) column.

Found in a review pass: a chart export whose grad-norm bucket maxima reached 4.0 at one step,
4.7x the sampled point there, came out "HEALTHY (green light)" with nothing on screen or in
the findings document to say the verdict was judged on the sampled points; the report's
data-quality notes said only that the export was down-sampled.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from forensics.cli import app

runner = CliRunner()

HEADER = [
    "Step",
    "brisk-pond-1 - train/loss",
    "brisk-pond-1 - train/loss__MIN",
    "brisk-pond-1 - train/loss__MAX",
    "brisk-pond-1 - train/grad_norm",
    "brisk-pond-1 - train/grad_norm__MIN",
    "brisk-pond-1 - train/grad_norm__MAX",
]


def _export(folder: Path, *, spread: float, hidden: float | None) -> Path:
    """1,000 sampled points, one every 10 steps; each bucket ``spread`` either side of its
    point; with ``hidden``, the grad norm's bucket at step 6,000 reaches it."""
    rng = np.random.default_rng(5)
    folder.mkdir()
    with open(folder / "export.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for k in range(1000):
            step = 10 * k
            loss = 2 + 3 / (1 + step / 500) + rng.normal(0, 0.01)
            g = 1 + 0.05 * rng.standard_normal()
            top = hidden if hidden is not None and step == 6000 else g + spread
            w.writerow([step, loss, loss - spread, loss + spread, g, g - spread, top])
    return folder


def _doc(folder: Path) -> dict:
    result = runner.invoke(app, ["analyze", str(folder), "--no-report", "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_spike_inside_a_bucket_is_named_beside_the_verdict(tmp_path: Path) -> None:
    folder = _export(tmp_path / "run", spread=0.01, hidden=4.0)
    doc = _doc(folder)
    assert doc["verdict"] == "healthy"  # (judged on the points: the bucket's shape is unknown)
    said = doc["run"]["unjudged"]
    assert said.startswith("Judged on the sampled points of a down-sampled W&B chart export")
    assert (
        "They go further here: train/grad_norm: the chart's bucket maxima reach 4 at step 6,000"
        in said
    )
    # Only the spike vitals' extremes past a spike's least height are named: not the loss's.
    assert "train/loss:" not in said
    screen = runner.invoke(app, ["analyze", str(folder), "--no-report"])
    assert screen.exit_code == 0, screen.output
    assert "bucket maxima reach 4 at step 6,000" in " ".join(screen.output.split())
    out = tmp_path / "report.html"
    page = runner.invoke(app, ["analyze", str(folder), "--out", str(out)])
    assert page.exit_code == 0, page.output
    assert "bucket maxima reach 4 at step 6,000" in out.read_text()


def test_the_ratio_stated_is_the_bucket_over_its_point(tmp_path: Path) -> None:
    folder = _export(tmp_path / "run", spread=0.01, hidden=4.0)
    said = _doc(folder)["run"]["unjudged"]
    with open(folder / "export.csv") as f:
        row = next(r for r in csv.DictReader(f) if r["Step"] == "6000")
    point = float(row["brisk-pond-1 - train/grad_norm"])
    assert f"({4.0 / point:.1f}x the sampled {point:.4g} there)" in said


def test_down_sampled_without_a_hidden_spike_still_says_what_was_judged(tmp_path: Path) -> None:
    said = _doc(_export(tmp_path / "run", spread=0.01, hidden=None))["run"]["unjudged"]
    assert said.startswith("Judged on the sampled points")
    assert "They go further here" not in said


def test_an_export_that_was_not_down_sampled_is_judged_whole(tmp_path: Path) -> None:
    assert _doc(_export(tmp_path / "run", spread=0.0, hidden=None))["run"]["unjudged"] is None


def test_bucket_noise_is_not_noted_as_left_out(tmp_path: Path) -> None:
    """A bucket extreme within 5% of its point is the bucket's noise: no "the sampled 1.241
    there is 1.0x that" note; the hidden grad-norm spike still is one. The sampling itself is
    said once."""
    from forensics.importers import read_run

    notes = read_run(_export(tmp_path / "run", spread=0.01, hidden=4.0)).notes
    left_out = [n for n in notes if n.endswith("which the sampled points leave out")]
    assert left_out == [
        "train/grad_norm: the chart's bucket maxima reach 4 at step 6,000 (4.7x the sampled "
        "0.8587 there), which the sampled points leave out"
    ]
    assert sum("sampled points, not the full history" in n for n in notes) == 1
    assert any("down-sampled here" in n for n in notes)
