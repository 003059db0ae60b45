"""resume_regression: the training loss trends up after a resume seam.

The real Lightning run (version_5 resumes version_0 at step 140,749) and a real tiny torch
training that checkpoints and resumes in a second job: a resume that drops the optimizer state
and resets the LR schedule (warm-up again, to a far higher LR) degrades the loss after the seam;
a clean resume does not.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_path
from resume_chain import torch_chain

from forensics.findings import FindingKind, Severity
from forensics.importers import ReadOptions, discover_jobs, read_job, read_run
from forensics.importers.chains import stitch_jobs
from forensics.pipeline import analyze_run
from forensics.report import render_html

pytest.importorskip("torch")

LIGHTNING = "lightning-csv-slm-wikitext103"
SEAM = 140_749


def _lightning_chain():  # noqa: ANN202
    root = shared_path("real_runs", LIGHTNING)
    units = stitch_jobs(root, discover_jobs(root), ReadOptions())
    unit = next(u for u in units if "+" in u)
    return read_job(root, unit, units[unit], only_job=False)


def _val_from_csv() -> list[tuple[int, float]]:
    """(step, val_loss) of version_5 (the resumed job), straight from Lightning's CSV."""
    path = shared_path("real_runs", LIGHTNING, "lightning_logs", "version_5", "metrics.csv")
    with open(path, newline="") as fh:
        return [(int(r["step"]), float(r["val_loss"])) for r in csv.DictReader(fh) if r["val_loss"]]


def _train_from_csv() -> tuple[np.ndarray, np.ndarray]:
    """(steps, train_loss_step) of version_0 and version_5, straight from Lightning's CSVs."""
    rows = []
    for v in ("version_0", "version_5"):
        path = shared_path("real_runs", LIGHTNING, "lightning_logs", v, "metrics.csv")
        with open(path, newline="") as fh:
            rows += [
                (int(r["step"]), float(r["train_loss_step"]))
                for r in csv.DictReader(fh)
                if r["train_loss_step"]
            ]
    a = np.array(rows)
    return a[:, 0].astype(np.int64), a[:, 1]


def test_lightning_resume_regresses() -> None:
    diag = analyze_run(_lightning_chain())
    found = [f for f in diag.findings if f.kind is FindingKind.RESUME_REGRESSION]
    assert len(found) == 1, [f.summary for f in diag.findings]
    f = found[0]
    m = f.measures
    assert m["seam_step"] == SEAM
    # The loss did not turn up at the seam: it went on down for about 6,250 steps, below its
    # level before the seam (the lowest centred median of 101 points after it, from the CSV),
    # and the rise began there; the val loss kept improving after the seam too.
    steps, loss = _train_from_csv()
    after = steps >= SEAM
    xa, ya = steps[after], loss[after]
    level = np.array([np.median(ya[max(0, i - 50) : i + 51]) for i in range(len(ya))])
    low = 50 + int(np.argmin(level[50 : len(ya) - 50]))
    assert (f.start_step, m["rise_from_step"]) == (int(xa[low]), int(xa[low])) == (146_999,) * 2
    assert m["low_after"] == pytest.approx(level[low]) and round(level[low], 3) == 3.648
    assert m["low_after"] < m["level_before"] == pytest.approx(np.median(loss[~after][-100:]))
    assert "first went on down, to 3.648 around step 146,999" in f.summary
    # The val loss after the resume: its best and its last value, read from the CSV.
    val = _val_from_csv()
    best_step, best = min(val, key=lambda sv: sv[1])
    end_step, end = val[-1]
    assert (m["val_best_step"], m["val_end_step"]) == (best_step, end_step) == (154_813, 197_035)
    assert m["val_best"] == pytest.approx(best) and m["val_end"] == pytest.approx(end)
    assert round(best, 3) == 3.563 and round(end, 3) == 3.604
    assert end - best > 3 * m["val_noise"] and m["val_worse"] is True
    assert f.severity is Severity.WARNING
    # The train loss after the seam trends up (the band excludes zero) and ends above its level.
    assert m["slope_low_per_1k"] > 0 and m["rise"] > 3 * m["level_noise"]
    assert m["level_end"] > m["level_before"]
    assert "140,749" in f.summary and "3.563" in f.summary and "3.604" in f.summary
    assert m["val_best_step"] > SEAM  # (the val loss's best came after the resume)
    # The resume is not near the onset: no cause is supported, and the rollback does not say
    # the checkpoint the job resumed from is the one to load (the loss improved after it).
    causes = {c.cause: c.status for c in diag.causes_for(f)}
    assert causes == {"resume": "contradicted", "article": "untested"}
    plan = diag.incidents[0].rollback
    assert plan is not None and plan.checkpoint_step is not None
    assert SEAM < plan.checkpoint_step <= f.start_step
    assert "turned up only after the resume" not in plan.sentence()
    assert "the resume, not the LR, is the suspect" not in plan.sentence()
    assert "healthy" not in diag.verdict.lower()  # it was HEALTHY before this finding
    # The report renders it.
    page = render_html(diag, plotlyjs="cdn")
    assert "resume_regression" in page and "Regression after a resume" in page


def test_lightning_versions_apart_have_no_seam() -> None:
    """version_5 alone has no restart: nothing to judge (the seam is what the finding needs)."""
    root = shared_path("real_runs", LIGHTNING, "lightning_logs", "version_5")
    diag = analyze_run(read_run(root))
    assert not [f for f in diag.findings if f.kind is FindingKind.RESUME_REGRESSION]


def test_torch_resume_that_resets_the_schedule_regresses(tmp_path: Path) -> None:
    diag = analyze_run(read_run(torch_chain(tmp_path, bad_resume=True)))
    assert [f for f in diag.findings if f.kind is FindingKind.RESTART]
    found = [f for f in diag.findings if f.kind is FindingKind.RESUME_REGRESSION]
    assert len(found) == 1, [f.summary for f in diag.findings]
    f = found[0]
    assert f.start_step == 400 and f.measures["rise"] > 0
    # No val loss logged, but the training loss's level went from 0.24 to about 1.7: a rise
    # past 10% of its level is a warning evals or not (it had been a note).
    assert f.measures["rise_rel"] > 0.1
    assert f.severity is Severity.WARNING
    assert {c.cause: c.status for c in diag.causes_for(f)}["resume"] == "supported"


def test_torch_clean_resume_has_no_regression(tmp_path: Path) -> None:
    diag = analyze_run(read_run(torch_chain(tmp_path, bad_resume=False)))
    assert [f for f in diag.findings if f.kind is FindingKind.RESTART]
    assert not [f for f in diag.findings if f.kind is FindingKind.RESUME_REGRESSION]
