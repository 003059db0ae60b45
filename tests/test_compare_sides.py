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
    lines = _lines("healthy", "overfitting")
    assert lines[0] == "only in healthy, info: grad_norm_outliers @ 71"
    lines = _lines("healthy", "divergence")
    assert lines[0] == "only in divergence, fatal: divergence @ 446"
    assert lines[-1].startswith("... and 19 more only in divergence")


def _healthy_against_divergence(*options: str):
    runs = [str(ROOT / "sample_runs" / name) for name in ("healthy", "divergence")]
    return runner.invoke(app, ["compare", *runs, *options])


def test_both_runs_absorbed_outliers_are_in_both(tmp_path: Path) -> None:
    """Each run's absorbed grad-norm outliers are one note, first at step 71 in one and 59 in
    the other: in both, with how many each had (not "only in" either side)."""
    res = _healthy_against_divergence("--no-report")
    text = res.stdout
    said = "1 in both (1 of many events, matched wherever they begin)"
    assert said in text, text
    assert "in both: grad_norm_outliers, 1 in healthy from step 71, 1 in divergence from" in text
    assert "grad_norm_outliers @" not in text
    page = tmp_path / "c.html"
    res = _healthy_against_divergence("--out", str(page))
    assert res.exit_code == 0, res.output
    html = page.read_text()
    want = "in both: <b>grad_norm_outliers</b>, 1 in <code>healthy</code> from step 71, 1 in"
    assert want in html
    assert "(fitted onsets whose ranges meet" not in html
