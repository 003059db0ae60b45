"""resume_drop: a resumed job whose loss runs below its earlier attempt's on the steps both
logged, from the same checkpoint and at the same LR: data it has already trained on.

The logs are written by tensorboardX, one event file per job, as a job resumed from a
checkpoint writes them: the earlier attempt ran on to step 6,000 past its checkpoint at 5,000,
and the resumed job logs steps 5,001 on again."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze


def _base(s: np.ndarray) -> np.ndarray:
    return 2 + 3 * np.exp(-s / 2000)


def _write(
    folder: Path,
    *,
    resumed_factor: float = 1.0,
    resumed_lr: float = 3e-4,
    earlier_rise: float = 0.0,
    resume_at: int = 5_001,
    earlier_to: int = 6_000,
    resumed_warmup: int = 0,
) -> Path:
    """Job 1: steps 1..earlier_to; job 2, resumed from the checkpoint before ``resume_at``:
    steps resume_at..12,000. ``resumed_factor`` scales job 2's loss until step 10,000 (a data
    loader restarted at batch 0 re-reads what the checkpoint saw); ``earlier_rise``: job 1's
    loss rises by that fraction over its last 500 steps (the attempt going wrong);
    ``resumed_warmup``: job 2 warms its LR up again over that many steps (from a 200th of
    ``resumed_lr``: a scheduler state not restored)."""
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(0)
    t0 = 1.7e9
    w = SummaryWriter(str(folder), filename_suffix=".a")
    s1 = np.arange(1, earlier_to + 1)
    loss1 = _base(s1) * (1 + earlier_rise * np.clip((s1 - (earlier_to - 500)) / 500, 0, 1))
    for s, v in zip(s1, loss1 + 0.02 * rng.standard_normal(len(s1)), strict=True):
        w.add_scalar("train/loss", float(v), int(s), walltime=t0 + s)
        w.add_scalar("train/lr", 3e-4, int(s), walltime=t0 + s)
        w.add_scalar("train/grad_norm", abs(0.5 + 0.05 * rng.standard_normal()), int(s), t0 + s)
    w.close()
    time.sleep(1.1)  # (the second file's name carries a later second)
    w = SummaryWriter(str(folder), filename_suffix=".b")
    t1 = t0 + earlier_to + 600
    s2 = np.arange(resume_at, 12_001)
    loss2 = _base(s2) * np.where(s2 < 10_000, resumed_factor, 1.0)
    for s, v in zip(s2, loss2 + 0.02 * rng.standard_normal(len(s2)), strict=True):
        w.add_scalar("train/loss", float(v), int(s), walltime=t1 + s)
        k = s - resume_at
        lr2 = resumed_lr * min(1.0, (k + 1) / resumed_warmup) if resumed_warmup else resumed_lr
        w.add_scalar("train/lr", lr2, int(s), walltime=t1 + s)
        w.add_scalar("train/grad_norm", abs(0.5 + 0.05 * rng.standard_normal()), int(s), t1 + s)
    w.close()
    return folder


def _drops(d):  # noqa: ANN001, ANN202
    return [f for f in d.findings if f.kind is FindingKind.RESUME_DROP]


def test_a_resumed_job_that_rereads_its_data_is_a_warning(tmp_path: Path) -> None:
    """Job 2's loss runs 7% below job 1's on steps 5,001-6,000, which both logged from the
    checkpoint at 5,000 with the same LR. It read HEALTHY, with a restart note."""
    d = analyze(_write(tmp_path / "run", resumed_factor=0.93))
    (f,) = _drops(d)
    assert f.severity is Severity.WARNING and f.metric == "loss"
    assert (f.start_step, f.end_step) == (5_001, 6_000)
    m = f.measures
    assert m["mode"] == "overlap" and m["seam_step"] == 5_001 and m["points"] == 1_000
    assert m["drop_pct"] == pytest.approx(7.0, abs=0.3)
    assert m["lr_earlier"] == m["lr_resumed"] == pytest.approx(3e-4)
    assert f.summary.startswith(
        "After the resume at step 5,001 the loss ran 7.0% below the earlier job's on the "
        "1,000 steps both logged (5,001-6,000): "
    ), f.summary
    assert "same LR (0.0003)" in f.summary
    assert "data it had already trained on" in f.summary and "hypothesis" in f.summary
    assert d.verdict != "healthy"


def test_the_levels_in_the_sentence_are_the_logged_medians(tmp_path: Path) -> None:
    from forensics.evidence.trend_utils import num

    d = analyze(_write(tmp_path / "run", resumed_factor=0.93))
    (f,) = _drops(d)
    frame = d.ev.run.frame
    import polars as pl

    on = frame.filter((pl.col("metric") == "loss") & pl.col("step").is_between(5_001, 6_000)).sort(
        "segment", "step"
    )
    old = on.filter(pl.col("segment") == on["segment"].min())["value"].to_numpy()
    new = on.filter(pl.col("segment") == on["segment"].max())["value"].to_numpy()
    assert f.measures["loss_earlier"] == pytest.approx(float(np.median(old)))
    assert f.measures["loss_resumed"] == pytest.approx(float(np.median(new)))
    assert f"median {num(float(np.median(new)))} against {num(float(np.median(old)))}" in (
        f.summary
    )


def test_a_faithful_resume_is_quiet(tmp_path: Path) -> None:
    """The same loss on the replayed steps (each job its own batch noise): nothing."""
    d = analyze(_write(tmp_path / "run"))
    assert _drops(d) == []
    assert d.verdict == "healthy"


def test_a_resume_after_an_attempt_that_went_wrong_is_not_a_replay(tmp_path: Path) -> None:
    """Job 1's loss climbs 40% over its last 500 steps and job 2 runs on healthy from 5,001:
    lower than the failing attempt, as a resume that fixed it should be."""
    d = analyze(_write(tmp_path / "run", earlier_rise=0.4))
    assert _drops(d) == []


def test_a_resume_at_a_lower_lr_is_explained_by_it(tmp_path: Path) -> None:
    """Job 2 runs a third of the LR and its loss is 7% lower: the LR changed, a note says so."""
    run = _write(tmp_path / "run", resumed_factor=0.93, resumed_lr=1e-4)
    d = analyze(run)
    assert _drops(d) == []
    assert any(
        n.startswith("resume_drop: the loss ran 7.0% below") and "another LR" in n
        for n in d.ev.run.notes
    ), d.ev.run.notes


def test_a_short_replay_is_judged_at_the_seam(tmp_path: Path) -> None:
    """Ten replayed steps are under min_points (20) to compare job with job: the resumed job
    is judged at its seam instead, against the trend of the points before it."""
    d = analyze(_write(tmp_path / "run", resumed_factor=0.93, earlier_to=5_010))
    (f,) = _drops(d)
    assert f.measures["mode"] == "seam" and f.measures["seam_step"] == 5_001


def _write_continuing(folder: Path, *, factor: float = 0.93, lr2: float = 3e-4) -> Path:
    """Job 1 logs steps 1-6,000 and is pre-empted after saving its checkpoint; job 2 resumes
    at 6,001 in a new event file (no step logged twice), its loss ``factor`` x the trend until
    step 11,000."""
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(0)
    t0 = 1.7e9
    for suffix, steps, f, lr, t in (
        (".a", np.arange(1, 6_001), 1.0, 3e-4, t0),
        (".b", np.arange(6_001, 12_001), factor, lr2, t0 + 600),
    ):
        w = SummaryWriter(str(folder), filename_suffix=suffix)
        loss = _base(steps) * np.where(steps < 11_000, f, 1.0)
        for s, v in zip(steps, loss + 0.02 * rng.standard_normal(len(steps)), strict=True):
            w.add_scalar("train/loss", float(v), int(s), walltime=t + s)
            w.add_scalar("train/lr", lr, int(s), walltime=t + s)
        w.close()
        time.sleep(1.1)
    return folder


def test_a_resume_that_logs_no_step_twice_is_judged_at_its_seam(tmp_path: Path) -> None:
    """No replayed steps to compare: the loss stepped down 7% at the first step of the new job
    and stayed down, against the trend of the 50 points before it."""
    d = analyze(_write_continuing(tmp_path / "run"))
    (f,) = _drops(d)
    m = f.measures
    assert m["mode"] == "seam" and m["seam_step"] == 6_001 and m["points"] == 50
    assert f.start_step == 6_001 and f.end_step == 6_100
    assert m["drop_pct"] == pytest.approx(7.0, abs=0.6)
    assert m["drop_first_half_pct"] == pytest.approx(7.0, abs=0.8)
    assert m["drop_second_half_pct"] == pytest.approx(7.0, abs=0.8)
    assert f.summary.startswith(
        "When the job resumed at step 6,001 (a new log file, events.out.tfevents."
    ), f.summary
    assert ".b, begins there) the loss stepped down 7." in f.summary
    assert "predicted by the trend of the 50 points before it" in f.summary


@pytest.mark.parametrize(("factor", "lr2"), [(1.0, 3e-4), (0.93, 1e-4)])
def test_a_resume_that_continues_or_changes_the_lr_is_quiet_at_its_seam(
    tmp_path: Path, factor: float, lr2: float
) -> None:
    d = analyze(_write_continuing(tmp_path / "run", factor=factor, lr2=lr2))
    assert _drops(d) == []
    if lr2 != 3e-4:
        assert any(n.startswith("resume_drop: the loss") for n in d.ev.run.notes)


def test_the_resume_cause_agrees_with_the_finding_at_a_file_seam(tmp_path: Path) -> None:
    """The steps show no restart at a new file that goes on at the next step; the finding
    says the job resumed there, and its resume cause read "contradicted: no restart in the
    log within 100 steps". The cause is supported by the finding's own seam."""
    from forensics.causes import SUPPORTED, find_causes

    d = analyze(_write_continuing(tmp_path / "run"))
    (f,) = _drops(d)
    assert f.measures["new_file"].startswith("events.out.tfevents.")
    (c,) = [c for c in find_causes(d.ev, f, d.findings) if c.cause == "resume"]
    assert c.status == SUPPORTED
    assert c.evidence.startswith("the job resumed at step 6,001 (a new log file, events.out")


def test_the_loss_chart_draws_the_earlier_job_on_the_steps_compared(tmp_path: Path) -> None:
    """The chart showed only the resumed job's values on steps 5,001-6,000 (the view keeps
    them), so the 7% the sentence states could not be seen. The earlier job's loss there is
    drawn dotted beside them, on the loss chart only."""
    from forensics.report.charts import build_panels

    d = analyze(_write(tmp_path / "run", resumed_factor=0.93))
    panels = build_panels(d.ev, d.findings)
    loss = next(p for p in panels if p.key == "loss")
    (line,) = [t for t in loss.figure["data"] if t.get("name") == "earlier job (steps 5,001-6,000)"]
    assert line["line"]["dash"] == "dot"
    ys = [v for v in line["y"] if v is not None]
    assert np.median(ys) == pytest.approx(2.192, abs=0.01)  # the earlier job's, not the view's
    assert "Dotted grey: the earlier job's loss at steps 5,001-6,000" in loss.caption
    others = [p for p in panels if p.key != "loss"]
    assert not any(
        t.get("name", "").startswith("earlier job") for p in others for t in p.figure["data"]
    )
