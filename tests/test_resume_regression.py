"""resume_regression: the training loss trends up after a resume seam.

The real Lightning run (version_5 resumes version_0 at step 140,749) and a real tiny torch
training that checkpoints and resumes in a second job: a resume that drops the optimizer state
and resets the LR schedule (warm-up again, to a far higher LR) degrades the loss after the seam;
a clean resume does not.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_path

from forensics.findings import FindingKind, Severity
from forensics.importers import ReadOptions, discover_jobs, read_job, read_run
from forensics.importers.chains import stitch_jobs
from forensics.pipeline import analyze_run
from forensics.report import render_html

torch = pytest.importorskip("torch")

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


def test_lightning_resume_regresses() -> None:
    diag = analyze_run(_lightning_chain())
    found = [f for f in diag.findings if f.kind is FindingKind.RESUME_REGRESSION]
    assert len(found) == 1, [f.summary for f in diag.findings]
    f = found[0]
    m = f.measures
    assert f.start_step == m["seam_step"] == SEAM
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
    # The resume is the supported context, not a claimed mechanism.
    causes = {c.cause: c.status for c in diag.causes_for(f)}
    assert causes == {"resume": "supported", "article": "untested"}
    assert "healthy" not in diag.verdict.lower()  # it was HEALTHY before this finding
    # The report renders it.
    page = render_html(diag, plotlyjs="cdn")
    assert "resume_regression" in page and "Regression after a resume" in page


def test_lightning_versions_apart_have_no_seam() -> None:
    """version_5 alone has no restart: nothing to judge (the seam is what the finding needs)."""
    root = shared_path("real_runs", LIGHTNING, "lightning_logs", "version_5")
    diag = analyze_run(read_run(root))
    assert not [f for f in diag.findings if f.kind is FindingKind.RESUME_REGRESSION]


# ------------------------------------------------------------------ a real tiny torch chain
def _job(
    log: Path, ckpt: Path, *, start: int, stop: int, total: int, bad_resume: bool = False
) -> None:
    """Noisy linear regression with SGD+momentum and a cosine LR decay over ``total`` steps;
    checkpoint at ``stop``. A bad resume loads only the weights and restarts the schedule as a
    warm-up to 10x the peak LR (a schedule reset): SGD's noise floor rises with the LR."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1024, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.5 * torch.randn(1024, 1, generator=g)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    peak = 0.02
    if start:
        ck = torch.load(ckpt, weights_only=True)
        model.load_state_dict(ck["model"])
        if not bad_resume:
            opt.load_state_dict(ck["opt"])

    def lr_at(step: int) -> float:
        if bad_resume and start:
            return 10 * peak * (step - start + 1) / (stop - start)
        return float(peak * (0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * step / total))))

    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as fh:
        for step in range(start, stop):
            for grp in opt.param_groups:
                grp["lr"] = lr_at(step)
            idx = torch.randperm(1024, generator=torch.Generator().manual_seed(step))[:16]
            loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            fh.write(json.dumps({"step": step, "loss": loss.item(), "lr": lr_at(step)}) + "\n")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, ckpt)


def _chain(tmp_path: Path, bad_resume: bool):  # noqa: ANN202
    root, ck = tmp_path / "run", tmp_path / "ck.pt"
    _job(root / "job_0" / "metrics.jsonl", ck, start=0, stop=400, total=800)
    _job(
        root / "job_1" / "metrics.jsonl", ck, start=400, stop=800, total=800, bad_resume=bad_resume
    )
    return analyze_run(read_run(root))


def test_torch_resume_that_resets_the_schedule_regresses(tmp_path: Path) -> None:
    diag = _chain(tmp_path, bad_resume=True)
    assert [f for f in diag.findings if f.kind is FindingKind.RESTART]
    found = [f for f in diag.findings if f.kind is FindingKind.RESUME_REGRESSION]
    assert len(found) == 1, [f.summary for f in diag.findings]
    f = found[0]
    assert f.start_step == 400 and f.measures["rise"] > 0
    assert f.severity is Severity.INFO  # no val loss logged: only the training loss moved
    assert {c.cause: c.status for c in diag.causes_for(f)}["resume"] == "supported"


def test_torch_clean_resume_has_no_regression(tmp_path: Path) -> None:
    diag = _chain(tmp_path, bad_resume=False)
    assert [f for f in diag.findings if f.kind is FindingKind.RESTART]
    assert not [f for f in diag.findings if f.kind is FindingKind.RESUME_REGRESSION]
