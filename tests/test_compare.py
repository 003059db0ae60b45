"""`forensics compare`: runs side by side and where their losses part ways."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from conftest import snapshot, write_tb_run
from synthetic import long_frame, run_from_frame
from typer.testing import CliRunner

from forensics.cli import app
from forensics.compare import loss_parts_ways

runner = CliRunner()


def test_parts_ways_at_injected_step() -> None:
    """Two loss curves equal until step 700, then one stays 20% higher: found at 700."""
    steps = np.arange(0, 2000, 10)
    base = 2 + 5 / (1 + steps / 100)
    other = np.where(steps >= 700, base * 1.2, base)
    a = run_from_frame(long_frame({"loss": (steps, base)}))
    b = run_from_frame(long_frame({"loss": (steps, other)}))
    got = loss_parts_ways(a, b)
    assert got is not None and got["step"] is not None
    assert abs(got["step"] - 700) <= 60
    assert got["final_rel_diff"] == pytest.approx(0.2, rel=0.05)
    assert loss_parts_ways(a, a)["step"] is None


def test_compare_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two real TensorBoard runs: a table on stdout, JSON with both runs, a page with a chart per
    vital sign."""
    a = write_tb_run(tmp_path / "run_a", n=400, spike_at=None)
    b = write_tb_run(tmp_path / "run_b", n=400, spike_at=200, seed=4)
    monkeypatch.chdir(tmp_path)
    before = snapshot(a), snapshot(b)
    res = runner.invoke(app, ["compare", str(a), str(b)])
    assert res.exit_code == 0, res.output
    assert "run_a" in res.stdout and "run_b" in res.stdout
    page = next((tmp_path / "reports").glob("compare-*.html")).read_text()

    class Charts(HTMLParser):
        ids: list[str] = []

        def handle_starttag(self, tag, attrs):  # noqa: ANN001
            d = dict(attrs)
            if tag == "div" and "chart" in (d.get("class") or ""):
                self.ids.append(d["id"])

    p = Charts()
    p.feed(page)
    assert {"chart-loss", "chart-grad_norm", "chart-lr"} <= set(p.ids)
    res = runner.invoke(app, ["compare", str(a), str(b), "--format", "json", "--no-report"])
    doc = json.loads(res.stdout)
    assert [r["label"] for r in doc["runs"]] == ["run_a", "run_b"]
    assert doc["runs"][1]["verdict"] != "healthy"
    assert (snapshot(a), snapshot(b)) == before
    assert runner.invoke(app, ["compare", str(a)]).exit_code == 2
