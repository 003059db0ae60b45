"""resume_setback: a resumed job whose loss runs above its earlier attempt's on the steps both
logged (or steps up at its seam and stays up), from the same checkpoint and at the same LR:
the resume did not restore the state the earlier job had.

Found in a review pass: a resumed job 6.7% above the earlier one on the 1,000 steps both
logged read HEALTHY with a restart note (resume_drop judges only the other way, and
resume_regression wants a rising trend after the seam; this loss went on falling, from higher).
The logs are written by tensorboardX, one event file per job (tests/test_resume_drop.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze
from tests.test_resume_drop import _write, _write_continuing


def _setbacks(d):  # noqa: ANN001, ANN202
    return [f for f in d.findings if f.kind is FindingKind.RESUME_SETBACK]


def test_a_resumed_job_that_lost_training_is_a_warning(tmp_path: Path) -> None:
    d = analyze(_write(tmp_path / "run", resumed_factor=1.07))
    (f,) = _setbacks(d)
    assert not [g for g in d.findings if g.kind is FindingKind.RESUME_DROP]
    assert f.severity is Severity.WARNING and f.metric == "loss"
    assert (f.start_step, f.end_step) == (5_001, 6_000)
    m = f.measures
    assert m["mode"] == "overlap" and m["seam_step"] == 5_001 and m["points"] == 1_000
    assert m["rise_pct"] == pytest.approx(7.0, abs=0.3)
    assert m["rise_first_half_pct"] == pytest.approx(7.0, abs=0.5)
    assert m["rise_second_half_pct"] == pytest.approx(7.0, abs=0.5)
    assert m["loss_resumed"] > m["loss_earlier"]
    assert f.summary.startswith(
        "After the resume at step 5,001 the loss ran 7.0% above the earlier job's on the "
        "1,000 steps both logged (5,001-6,000): "
    ), f.summary
    assert "higher in each half" in f.summary and "same LR (0.0003)" in f.summary
    assert "optimizer's moments" in f.summary and "hypothesis" in f.summary
    assert d.verdict == "warning"
    # The resume is the supported cause, by the finding's own seam.
    i = d.findings.index(f)
    (c,) = [c for c in d.causes[i] if c.cause == "resume"]
    assert c.status == "supported" and c.steps == (5_001,)
    assert "resume with the whole state restored" in d.prescriptions[i]


def test_a_faithful_resume_is_quiet(tmp_path: Path) -> None:
    d = analyze(_write(tmp_path / "run"))
    assert _setbacks(d) == []


def test_a_resume_at_a_higher_lr_is_explained_by_it(tmp_path: Path) -> None:
    d = analyze(_write(tmp_path / "run", resumed_factor=1.07, resumed_lr=1e-3))
    assert _setbacks(d) == []
    assert any(
        n.startswith("resume_drop: the loss ran 7.0% above") and "another LR" in n
        for n in d.ev.run.notes
    ), d.ev.run.notes


def test_a_warm_up_run_again_after_the_resume_is_another_lr(tmp_path: Path) -> None:
    """Found in a review pass: a resumed job that warmed its LR up again over 200 of the
    1,000 steps both logged had both medians at 0.0003, and its setback read "though both
    jobs ... ran the same LR (0.0003)" beside a restart finding saying the LR was up to 200x
    apart. Step by step the LRs differ: no comparison, a note. A warm-up over 20 steps (2% of
    them) still leaves the same LR and the setback."""
    d = analyze(_write(tmp_path / "run", resumed_factor=1.07, resumed_warmup=200))
    assert _setbacks(d) == []
    (n,) = [n for n in d.ev.run.notes if n.startswith("resume_drop: the loss ran")]
    # (the steps whose warmed-up LR is more than 1% under the earlier job's 0.0003)
    k = sum(min(1.0, (i + 1) / 200) < 0.99 for i in range(1_000))
    assert f"another LR on {k} of the 1,000 steps both logged the LR (1.5e-06 to " in n, n
    assert n.endswith("there, the earlier job 0.0003): the loss cannot be compared"), n
    short = analyze(_write(tmp_path / "short", resumed_factor=1.07, resumed_warmup=20))
    (f,) = _setbacks(short)
    assert "same LR (0.0003)" in f.summary


def test_a_step_up_at_a_seam_with_no_step_logged_twice(tmp_path: Path) -> None:
    d = analyze(_write_continuing(tmp_path / "run", factor=1.07))
    (f,) = _setbacks(d)
    m = f.measures
    assert m["mode"] == "seam" and m["seam_step"] == 6_001 and m["points"] == 50
    assert m["rise_pct"] == pytest.approx(7.0, abs=0.6)
    assert f".b, begins there) the loss stepped up {m['rise_pct']:.1f}% at once" in f.summary
    assert "stayed up" in f.summary and "predicted by the trend of the 50 points" in f.summary


def test_the_loss_chart_draws_the_earlier_job_beside_a_setback(tmp_path: Path) -> None:
    from forensics.report.charts import build_panels

    d = analyze(_write(tmp_path / "run", resumed_factor=1.07))
    loss = next(p for p in build_panels(d.ev, d.findings) if p.key == "loss")
    names = [t.get("name") for t in loss.figure["data"]]
    assert "earlier job (steps 5,001-6,000)" in names
    assert "resume_setback" in loss.caption


def test_the_report_has_a_card_for_it(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from forensics.cli import app

    out = tmp_path / "r.html"
    result = CliRunner().invoke(
        app, ["analyze", str(_write(tmp_path / "run", resumed_factor=1.07)), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "Higher loss after a resume" in html
