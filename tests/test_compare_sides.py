"""The terminal comparison names the findings on both sides, worst first: "2 only in
overfitting" had been counted and never named (only the other run's were listed, in step
order, a dozen absorbed grad-norm outliers before a divergence)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from forensics.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _lines(a: str, b: str) -> list[str]:
    res = runner.invoke(
        app,
        ["compare", str(ROOT / "sample_runs" / a), str(ROOT / "sample_runs" / b), "--no-report"],
    )
    assert res.exit_code == 0, res.output
    return [
        ln.strip() for ln in res.stdout.splitlines() if ln.strip().startswith(("only in", "..."))
    ]


def test_both_sides_are_named() -> None:
    lines = _lines("overfitting", "late_overfit")
    assert "only in overfitting, warning: overfitting @ 240 (turned after it, by 280)" in lines
    assert "only in late_overfit, warning: overfitting @ 360 (turned after it, by 400)" in lines


def test_worst_first_and_the_rest_counted() -> None:
    lines = _lines("healthy", "divergence")
    assert lines[0] == "only in healthy, info: grad_norm_outliers @ 71"
    assert lines[1] == "only in divergence, fatal: divergence @ 446"
    assert lines[-1].startswith("... and 20 more only in divergence")
