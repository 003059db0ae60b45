"""lr_restart: an LR schedule that starts over mid-run, judged by what the loss did.

The case: a JSONL log written every step, warm-up to 3e-4 and cosine decay, until at step
6,000 the LR falls to 0 and warms up again to 3e-4 (a scheduler rebuilt from its first step).
The loss gave back about 7% and took thousands of steps to return; the grad norm rose 1.7x
(under its 2x line). Every detector was quiet and the run read HEALTHY. It now reads a
warning: a single restart, the loss not back within 500 steps. Schedules with warm restarts
(cosine with hard restarts, and with a short warm-up at each) are notes, and the run stays
green; a restart the loss shrugs off is a note; a run without a restart has no such finding.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze


def _lr(s: int, kind: str) -> float:
    if s <= 500:
        return 3e-4 * s / 500
    if kind == "rewarm" and s >= 6000:  # the schedule from its first step again
        t = s - 6000
        if t <= 500:
            return 3e-4 * t / 500
        return 3e-4 * 0.5 * (1 + math.cos(math.pi * (t - 500) / 20000))
    if kind in ("sgdr", "sgdr_warm"):
        t = (s - 500) % 3000
        if kind == "sgdr_warm" and s >= 3500 and t < 200:
            return 3e-4 * t / 200
        return 1e-5 + (3e-4 - 1e-5) * 0.5 * (1 + math.cos(math.pi * t / 3000))
    return 3e-4 * 0.5 * (1 + math.cos(math.pi * (s - 500) / 20000))


def _clean(s: int, kind: str, bump: float) -> float:
    """The loss without its noise."""
    loss = 2.4 + 3.5 * math.exp(-s / 2000)
    if kind == "rewarm" and s >= 6000:  # up over 500 steps, then a slow way back
        t = s - 6000
        loss += bump * min(1.0, t / 500) * math.exp(-max(0, t - 500) / 2500)
    if kind in ("sgdr", "sgdr_warm") and s > 3500:
        loss += 0.06 * math.exp(-((s - 500) % 3000) / 100)
    return loss


def _write(folder: Path, kind: str, bump: float = 0.18, last: int = 10000) -> Path:
    rng = np.random.default_rng(11)
    rows = []
    for s in range(1, last + 1):
        loss = _clean(s, kind, bump) + rng.normal(0, 0.02)
        lr = _lr(s, kind)
        rows.append({"step": s, "train/loss": loss, "train/lr": lr, "train/grad_norm": 0.5})
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return folder


def test_a_single_restart_the_loss_took_long_to_get_over_is_a_warning(tmp_path: Path) -> None:
    diag = analyze(_write(tmp_path / "run", "rewarm"))
    assert diag.verdict == "warning"
    (f,) = [f for f in diag.findings if f.kind is FindingKind.LR_RESTART]
    assert f.severity is Severity.WARNING and f.metric == "lr"
    m = f.measures
    assert f.start_step == m["restart_step"] == 6000
    assert m["rewarm_end_step"] == 6500 and m["restarts"] == 1 and m["at_resume"] is False
    assert m["lr_from"] == 0.0 and m["lr_to"] == 3e-4
    assert abs(m["lr_before"] - _lr(5999, "base")) < 1e-12
    assert m["rise_visible"] is True
    # The noise-free curve: its level over the 100 steps before, and its highest point after.
    clean = [_clean(s, "rewarm", 0.18) for s in range(1, 10001)]
    before = float(np.median(clean[5899:5999]))
    top = int(np.argmax(clean[5999:])) + 6000
    expected = 100 * (clean[top - 1] - before) / before
    assert abs(m["rise_pct"] - expected) < 0.5, (m["rise_pct"], expected)
    assert abs(m["peak_level_step"] - top) <= 150, (m["peak_level_step"], top)
    # Back late: the clean curve returns to its level before at step 7,790.
    clean_back = next(s for s in range(top, 10001) if clean[s - 1] <= before)
    assert m["recovery_steps"] > 500 and m["recovered_step"] == f.end_step
    assert abs(m["recovered_step"] - clean_back) < 300, (m["recovered_step"], clean_back)
    assert f.summary.startswith("The LR schedule started over at step 6,000: the LR fell from ")
    assert "the only restart in the log, and the job did not resume there" in f.summary
    # The levels are the loss's, not drawn on the LR's chart.
    assert not any(k.endswith("_at") for k in f.judged_against)
    (inc,) = diag.incidents
    assert inc.timeline.first is not None and inc.timeline.first.metric == "lr"


def test_a_restart_the_loss_shrugs_off_is_a_note(tmp_path: Path) -> None:
    diag = analyze(_write(tmp_path / "run", "rewarm", bump=0.0))
    assert diag.verdict == "healthy"
    (f,) = [f for f in diag.findings if f.kind is FindingKind.LR_RESTART]
    assert f.severity is Severity.INFO and f.measures["rise_visible"] is False


def test_too_soon_to_tell_is_a_note(tmp_path: Path) -> None:
    """The log ends 300 steps after the restart (a live job read mid-way): the loss is up and
    not back yet, but 500 steps have not passed."""
    diag = analyze(_write(tmp_path / "run", "rewarm", last=6300))
    (f,) = [f for f in diag.findings if f.kind is FindingKind.LR_RESTART]
    assert f.measures["rise_visible"] is True and f.measures["recovered_step"] is None
    assert f.severity is Severity.INFO
    assert "was not back at its level before the restart by step 6,300" in f.summary


def test_warm_restart_schedules_stay_green(tmp_path: Path) -> None:
    for kind in ("sgdr", "sgdr_warm"):
        diag = analyze(_write(tmp_path / kind, kind))
        found = [f for f in diag.findings if f.kind is FindingKind.LR_RESTART]
        assert len(found) == 3, (kind, [f.summary for f in found])
        assert all(f.severity is Severity.INFO for f in found)
        assert all(f.measures["restarts"] == 3 for f in found)
        assert all("(a schedule with warm restarts)" in f.summary for f in found)
        assert not [f for f in diag.findings if f.severity is not Severity.INFO], kind


def test_no_restart_no_finding(tmp_path: Path) -> None:
    diag = analyze(_write(tmp_path / "run", "base"))
    assert not [f for f in diag.findings if f.kind is FindingKind.LR_RESTART]


def test_a_restart_at_a_resume_names_it(tmp_path: Path) -> None:
    """The job logged up to step 6,100, then resumed from its step-6,000 checkpoint with a
    scheduler rebuilt from its first step: the restart is at the resume, whose cause the
    log supports."""
    folder = _write(tmp_path / "run", "rewarm")
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    first_job = [
        {**r, "train/lr": _lr(r["step"], "base"), "train/loss": _clean(r["step"], "base", 0)}
        for r in rows[5999:6100]
    ]  # (steps 6,000-6,100 on the old schedule, later replaced by the resumed job's)
    text = "\n".join(json.dumps(r) for r in rows[:5999] + first_job + rows[6000:]) + "\n"
    (folder / "metrics.jsonl").write_text(text)
    diag = analyze(folder)
    assert any(f.kind is FindingKind.RESTART for f in diag.findings)
    (f,) = [f for f in diag.findings if f.kind is FindingKind.LR_RESTART]
    assert f.measures["at_resume"] is True
    assert "the only restart in the log, at a resume of the job" in f.summary
    (i,) = [i for i, g in enumerate(diag.findings) if g is f]
    resume = {c.cause: c for c in diag.causes[i]}["resume"]
    assert resume.status == "supported", resume.evidence


def test_the_late_checklist_fails_on_the_restart(tmp_path: Path) -> None:
    """ "Does the loss decline match the learning-rate schedule?" passed ("loss 2.516 -> 2.53
    ...; no plateau found") on the run whose restart set the loss back."""
    diag = analyze(_write(tmp_path / "run", "rewarm"))
    q = "Does the loss decline match the learning-rate schedule?"
    (item,) = [i for phase in diag.phases for i in phase.items if i.question == q]
    assert item.status == "fail"
    assert item.evidence.startswith("plateau, divergence or LR restart at step 6,000: The LR")


def _write_lr(folder: Path, lr_of, every: int = 1, bump_at: int | None = None) -> Path:
    rng = np.random.default_rng(5)
    rows = []
    for s in range(every, 12001, every):
        loss = 2.5 + 3.5 * math.exp(-s / 3000) + rng.normal(0, 0.02)
        if bump_at is not None and s >= bump_at:
            t = s - bump_at
            loss += 0.2 * min(1.0, t / 500) * math.exp(-max(0, t - 500) / 3000)
        rows.append({"step": s, "train/loss": loss, "train/lr": lr_of(s), "train/grad_norm": 0.5})
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return folder


def test_a_rise_with_no_fall_before_it_is_no_restart(tmp_path: Path) -> None:
    """A triangular cyclic LR rises from its low every cycle, and an LR held at zero for 200
    steps then warms up: neither fell to start over (the first version read "the LR fell
    from 0.0001 to 0.0001" eleven times)."""

    def clr(s: int) -> float:
        c = (s % 1000) / 1000
        return 1e-4 + 2e-4 * (2 * c if c < 0.5 else 2 - 2 * c)

    def zero_then_warm(s: int) -> float:
        return 0.0 if s < 200 else 3e-4 * min(1, (s - 200) / 500)

    for name, lr_of in (("clr", clr), ("zeros", zero_then_warm)):
        diag = analyze(_write_lr(tmp_path / name, lr_of))
        assert not [f for f in diag.findings if f.kind is FindingKind.LR_RESTART], name


def test_a_sparse_log_reads_the_level_near_the_restart(tmp_path: Path) -> None:
    """Logged every 100 steps, the level before the restart is the median of the points in
    the 500 steps before it (the first version took 59 points, the whole first half: 3.81,
    and read "the loss did not rise")."""

    def lr_of(s: int) -> float:
        if s < 6000:
            return 3e-4 * min(1, s / 500) * (1 - 0.5 * s / 12000)
        return 3e-4 * min(1, (s - 6000) / 500)

    diag = analyze(_write_lr(tmp_path / "run", lr_of, every=100, bump_at=6000))
    (f,) = [f for f in diag.findings if f.kind is FindingKind.LR_RESTART]
    clean_before = float(
        np.median([2.5 + 3.5 * math.exp(-s / 3000) for s in range(5500, 6000, 100)])
    )
    assert abs(f.measures["level_before"] - clean_before) < 0.05
    assert f.judged_against["window"] == 5
    assert f.measures["rise_visible"] is True


def test_a_restart_too_near_the_end_is_a_counted_skip(tmp_path: Path) -> None:
    """Ten loss points after the restart: not judged, and the run's notes say so."""
    diag = analyze(_write(tmp_path / "run", "rewarm", last=6009))
    assert not [f for f in diag.findings if f.kind is FindingKind.LR_RESTART]
    assert any(
        n.startswith("lr_restart: the LR schedule restarts at step 6,000, but the loss has fewer")
        for n in diag.run.notes
    ), diag.run.notes


def test_the_loss_chart_shows_what_the_restart_did_to_the_loss(tmp_path: Path) -> None:
    """The restart's finding said "the loss rose from 2.475 to 2.685 ... and was back ... at
    step 7,9xx", but only the LR chart marked it: the loss chart, where that rise and return
    are, showed nothing. It now marks the restart on the loss too, with the loss's level
    before drawn over the steps it was above it and the line a rise had to pass."""
    from forensics.report.charts import build_panels

    diag = analyze(_write(tmp_path / "run", "rewarm"))
    (f,) = [f for f in diag.findings if f.kind is FindingKind.LR_RESTART]
    assert diag.evidence is not None
    panels = {p.key: p for p in build_panels(diag.evidence, diag.findings)}
    loss = panels["loss"]
    assert any(g is f for g in loss.findings)
    # The span shaded, and the marker on the loss curve at the restart step.
    shades = [s for s in loss.figure["layout"]["shapes"] if s.get("type") == "rect"]
    assert any((s["x0"], s["x1"]) == (6000, f.end_step) for s in shades)
    (marks,) = [t for t in loss.figure["data"] if t.get("name") == "findings"]
    assert 6000 in marks["x"]
    levels = {
        t["meta"]["judged"]: t["meta"]["segments"]
        for t in loss.figure["data"]
        if isinstance(t.get("meta"), dict) and t["meta"].get("source") == "lr_restart"
    }
    ja = f.judged_against
    assert levels == {
        "loss_level_before": [[6000, f.end_step, ja["loss_level_before"]]],
        "loss_rise_line": [[6000, f.end_step, ja["loss_rise_line"]]],
    }
    # The LR chart still marks it, without the loss's levels.
    lr = panels["lr"]
    assert any(g is f for g in lr.findings)
    assert not any(
        isinstance(t.get("meta"), dict) and t["meta"].get("source") == "lr_restart"
        for t in lr.figure["data"]
    )


def test_a_log_every_10_steps_reads_levels_over_about_100_steps(tmp_path: Path) -> None:
    """An HF Trainer log (every 10 steps) resumed at step 1,500 with a fresh scheduler: the
    loss jumped from about 1.235 to 1.35 at step 1,600. A level was 50 points, 500 steps:
    the level before took in the still-falling loss of steps 1,010-1,500 (1.265) and the
    rolling median after flattened the bump, so the finding read "rose from 1.265 to 1.308
    (+3.4%) by step 1,800", neither number on the chart. A level now spans about `window`
    steps (100; at least 5 points), as on a log written every step."""
    rng = np.random.default_rng(3)

    def clean(s: int) -> float:
        loss = 1.2 + 1.5 * math.exp(-s / 400)
        if s >= 1500:
            loss += 0.12 * min(1.0, (s - 1500) / 100) * math.exp(-max(0, s - 1600) / 900)
        return loss

    def lr(s: int) -> float:
        t = s if s < 1500 else s - 1500
        return 5e-5 * t / 100 if t < 100 else 5e-5 * max(0.0, (3000 - t) / 2900)

    rows = [
        {"step": s, "loss": clean(s) + rng.normal(0, 0.005), "learning_rate": lr(s)}
        for s in range(10, 3001, 10)
    ]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    diag = analyze(tmp_path / "run")
    (f,) = [f for f in diag.findings if f.kind is FindingKind.LR_RESTART]
    m = f.measures
    assert f.judged_against["window"] == 10  # points: 100 steps
    before = float(np.median([clean(s) for s in range(1410, 1500, 10)]))
    assert abs(m["level_before"] - before) < 0.01, (m["level_before"], before)
    assert abs(m["peak_level"] - clean(1600)) < 0.02, (m["peak_level"], clean(1600))
    assert abs(m["peak_level_step"] - 1600) <= 60, m["peak_level_step"]
    # Back where the clean curve is back at its level before the restart.
    back = next(s for s in range(1600, 3001, 10) if clean(s) <= before)
    assert abs(m["recovered_step"] - back) <= 100, (m["recovered_step"], back)


def _sgdr_without_warmup(path: Path) -> Path:
    """Cosine restarts every 2,000 steps straight back to the peak LR (no warm-up): the loss
    jumps about 15% at each restart (the first just under the loss-spike line, the later
    ones over it, as the loss level falls) and the grad norm nearly triples."""
    rng = np.random.default_rng(3)
    rows = []
    for s in range(1, 10001):
        ph = (s - 1) % 2000
        lr = 3e-4 * 0.5 * (1 + math.cos(math.pi * ph / 2000))
        bump = 0.6 * math.exp(-ph / 40) if s > 2000 and ph < 150 else 0.0
        loss = 4.0 * math.exp(-s / 3000) + 2.0 + bump + rng.normal(0, 0.02)
        g = 0.8 + (1.5 * math.exp(-ph / 30) if s > 2000 and ph < 100 else 0.0)
        rows.append({"step": s, "loss": loss, "lr": lr, "grad_norm": g + abs(rng.normal(0, 0.05))})
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_timeline_has_the_loss_move_at_the_restart_its_finding_measured(
    tmp_path: Path,
) -> None:
    """The loss rose 13% at the first restart (step 2,001), under the loss-spike line: the
    restart's own finding measured it. The incident's timeline read "the training loss 2,000
    steps later (step 4,001, loss_spike)", the next restart's spike; the loss moved at the
    first restart, with the LR and the grad norm."""
    d = analyze(_sgdr_without_warmup(tmp_path / "sgdr"))
    first = next(f for f in d.findings if f.kind is FindingKind.LR_RESTART)
    assert first.start_step == 2001 and first.measures["rise_visible"]
    assert not [f for f in d.findings if f.kind is FindingKind.LOSS_SPIKE and f.start_step < 4000]
    (inc,) = d.incidents
    sentence = inc.timeline.sentence()
    assert "the training loss at the same step (step 2,001, its rise after the lr_restart)" in (
        sentence
    ), sentence
    loss = next(m for m in inc.timeline.movers if m.metric == "loss")
    assert (loss.step, loss.kind, loss.finding) == (2001, "lr_restart", first)
