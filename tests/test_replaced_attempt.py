"""replaced_attempt: the findings of an attempt whose steps a resume from an earlier checkpoint
logged again (the analysis view keeps the resumed job's values there)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from forensics import analyze
from forensics.config import Config
from forensics.findings import FindingKind, Severity


def _rewound_run(
    root: Path, *, blow_up: bool, resumed_until: int = 3000, lr_jump_at: int | None = None
) -> Path:
    """Two real TensorBoard writers in one folder: the first attempt logs steps 1-950 (its
    loss and grad norm blowing up from step 900 when ``blow_up``), the second resumes from
    a checkpoint at step 500 with a lower LR and logs steps 501-3,000, healthy."""
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(3)

    def loss_at(s: int) -> float:
        return float(2 + 2 * np.exp(-s / 1500))

    w = SummaryWriter(str(root), filename_suffix=".a")
    for s in range(1, 951):
        loss, gn = loss_at(s) + 0.02 * rng.standard_normal(), 0.8 + 0.05 * rng.standard_normal()
        if blow_up and s >= 900:
            loss += (s - 900) * 0.05
            gn *= 1 + (s - 900) * 0.2
        w.add_scalar("train/loss", loss, s)
        w.add_scalar("train/grad_norm", gn, s)
        w.add_scalar("train/lr", 3e-3 if lr_jump_at and s >= lr_jump_at else 3e-4, s)
    w.close()
    time.sleep(1.1)  # the second file's name (its creation second) sorts after the first's
    w = SummaryWriter(str(root), filename_suffix=".b")
    for s in range(501, resumed_until + 1):
        w.add_scalar("train/loss", loss_at(s) + 0.02 * rng.standard_normal(), s)
        w.add_scalar("train/grad_norm", 0.8 + 0.05 * rng.standard_normal(), s)
        w.add_scalar("train/lr", 2e-4, s)
    w.close()
    return root


def test_the_attempt_a_resume_replaced_is_judged(tmp_path: Path) -> None:
    """The first attempt diverged over steps 900-950 and the job was resumed from step 500:
    the view keeps the resumed job's healthy values, and the run had read "HEALTHY" with a
    restart note. The divergence of the replaced attempt is now reported, as a warning at
    the resume, with its own numbers."""
    d = analyze(_rewound_run(tmp_path / "tb", blow_up=True))
    (f,) = [f for f in d.findings if f.kind is FindingKind.REPLACED_ATTEMPT]
    assert f.severity is Severity.WARNING and d.verdict == "warning"
    m = f.measures
    assert (m["resumed_from_step"], m["attempt_last_step"]) == (501, 950)
    assert (m["worst_kind"], m["worst_severity"], m["worst_metric"]) == (
        "divergence",
        "critical",
        "loss",
    )
    assert 900 <= m["worst_step"] <= 910 and f.start_step == m["first_step"]
    assert f.end_step == 950
    # The resumed job went on past the attempt's last step, with no divergence there.
    assert m["resumed_passed"] is True
    assert (
        f"The resumed job went through steps {m['worst_step']:,}-950 without it (it has logged "
        "up to step 3,000)." in f.summary
    )
    # What the resumed job changed, as the log shows it: the LR at the worst finding's onset.
    assert m["lr_attempt"] == pytest.approx(3e-4) and m["lr_resumed"] == pytest.approx(2e-4)
    assert m["lr_step"] == m["worst_step"]
    assert m["attempt_causes"] is None  # nothing in that attempt's log says why
    assert "In that attempt the log supports no cause of it." in f.summary
    assert (
        f"At step {m['worst_step']:,} the attempt ran an LR of 0.0003; the resumed job runs "
        "0.0002 there (0.67x)." in f.summary
    )
    assert f.summary.startswith(
        "The attempt that the resume at step 501 replaced (it had logged up to step 950) went "
        "wrong before it stopped: Divergence from step"
    )
    # Nothing of the run as it stands changed: the resumed job is healthy.
    assert all(
        g.severity is Severity.INFO
        for g in d.findings
        if g.kind is not FindingKind.REPLACED_ATTEMPT
    )
    doc = d.to_document()
    assert any(x["kind"] == "replaced_attempt" for x in doc["findings"])
    # The resume is the supported cause, and the restart and the trouble are one incident.
    (c,) = [c for c in d.causes_for(f) if c.cause == "resume"]
    assert c.status == "supported"
    assert c.evidence == (
        "the job resumed at step 501 from an earlier checkpoint and logged steps 501-950 again"
    )
    (inc,) = d.incidents
    assert {g.kind for g in inc.findings} == {FindingKind.RESTART, FindingKind.REPLACED_ATTEMPT}


def test_a_healthy_replaced_attempt_adds_nothing(tmp_path: Path) -> None:
    """The same rewind without the blow-up: the replaced steps were healthy, the run stays
    green."""
    d = analyze(_rewound_run(tmp_path / "tb", blow_up=False))
    assert not [f for f in d.findings if f.kind is FindingKind.REPLACED_ATTEMPT]
    assert d.verdict == "healthy"


def test_replaced_attempt_can_be_ignored(tmp_path: Path) -> None:
    cfg = Config(ignore={"replaced_attempt"})
    d = analyze(_rewound_run(tmp_path / "tb", blow_up=True), cfg)
    assert not [f for f in d.findings if f.kind is FindingKind.REPLACED_ATTEMPT]


def test_a_chain_that_goes_on_replaces_nothing(tmp_path: Path) -> None:
    """A resume that goes on from where the job stopped (a real torch chain, steps 0-399
    then 400-799) replays no step: nothing is judged twice."""
    pytest.importorskip("torch")
    from resume_chain import torch_chain

    from forensics.importers import read_run
    from forensics.pipeline import analyze_run

    d = analyze_run(read_run(torch_chain(tmp_path, bad_resume=True, val_every=40)))
    assert any(f.kind is FindingKind.RESTART for f in d.findings)
    assert not [f for f in d.findings if f.kind is FindingKind.REPLACED_ATTEMPT]


def test_the_report_draws_the_replaced_attempt(tmp_path: Path) -> None:
    """The charts show the resumed job's values at the replaced steps: the replaced attempt's
    own values are drawn beside them (dotted), with the finding's marker on them."""
    from forensics.report.render import render_html

    d = analyze(_rewound_run(tmp_path / "tb", blow_up=True))
    page = render_html(d, plotlyjs="cdn")
    assert page.count("replaced attempt (steps 501-950)") >= 3  # loss, grad norm, LR
    assert "Dotted grey: what the attempt that a resume replaced logged at steps 501-950" in page
    assert "replaced-attempt findings" in page
    assert "Trouble in a replaced attempt" in page


def test_only_the_largest_rewinds_are_judged_and_the_rest_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job preempted over and over resumes hundreds of times; each replaced attempt judged
    is a small analysis of its own. Past MAX_ATTEMPTS the largest rewinds are judged and the
    others are counted in the run's notes, never dropped unsaid."""
    import json

    from forensics import replaced

    monkeypatch.setattr(replaced, "MAX_ATTEMPTS", 2)
    rng = np.random.default_rng(0)
    lines, step = [], 1
    for back in (100, 300, 50, 200):  # four preemptions, each rewinding this many steps
        stop = step + 1000
        for t in range(step, stop):
            loss = 2 + 2 * np.exp(-t / 3000) + 0.02 * rng.standard_normal()
            lines.append(json.dumps({"step": t, "loss": loss}))
        step = stop - back
    for t in range(step, step + 1000):
        lines.append(json.dumps({"step": t, "loss": 2 + 2 * np.exp(-t / 3000)}))
    log = tmp_path / "metrics.jsonl"
    log.write_text("\n".join(lines) + "\n")
    d = analyze(log)
    assert sum(f.kind is FindingKind.RESTART for f in d.findings) == 4
    note = [n for n in d.run.notes if n.startswith("replaced_attempt:")]
    assert note == [
        "replaced_attempt: 2 of 4 resumes that logged steps again were not judged (the 2 that "
        "replaced the most points were)"
    ]


def test_a_resumed_job_not_yet_past_the_trouble_says_so(tmp_path: Path) -> None:
    """The resumed job's log ends at step 930, before the step where the replaced attempt
    stopped (950): whether it gets through is not known yet. Its own last step is 930 (the
    run's last step had read 950, from the attempt's rows the resume replaced)."""
    d = analyze(_rewound_run(tmp_path / "tb", blow_up=True, resumed_until=930))
    (f,) = [f for f in d.findings if f.kind is FindingKind.REPLACED_ATTEMPT]
    assert f.measures["resumed_passed"] is None
    assert (
        "The resumed job has logged up to step 930 without it so far, but not yet past step "
        "950." in f.summary
    )
    assert f.summary.endswith("The charts show the resumed job at steps 501-930.")


def test_a_resumed_job_not_yet_at_the_trouble_says_so(tmp_path: Path) -> None:
    """The resumed job's log ends at step 880, before the attempt went wrong (about 900): the
    LR it runs is read at its own last step, and the resume's cause names the steps it
    logged again (501-880), not the attempt's (501-950)."""
    d = analyze(_rewound_run(tmp_path / "tb", blow_up=True, resumed_until=880))
    (f,) = [f for f in d.findings if f.kind is FindingKind.REPLACED_ATTEMPT]
    m = f.measures
    assert m["resumed_passed"] is None and d.run.last_step == 880
    assert (
        f"The resumed job has not yet reached step {m['worst_step']:,}, where the attempt went "
        "wrong (it has logged up to step 880)." in f.summary
    )
    assert (
        f"At step {m['worst_step']:,} the attempt ran an LR of 0.0003; the resumed job runs "
        "0.0002 at step 880, its last logged (0.67x)." in f.summary
    )
    (c,) = [c for c in d.causes_for(f) if c.cause == "resume"]
    assert c.evidence == (
        "the job resumed at step 501 from an earlier checkpoint and logged steps 501-880 again "
        "(the attempt had reached step 950)"
    )


def test_the_cause_the_attempts_own_log_supports_is_named(tmp_path: Path) -> None:
    """The first attempt's LR was raised tenfold at step 880 (no schedule does that) before it
    diverged; the resumed job runs the old LR. The finding names the cause the attempt's own
    log supports, with the attempt's numbers, and the LR the resumed job runs instead."""
    d = analyze(_rewound_run(tmp_path / "tb", blow_up=True, lr_jump_at=880))
    (f,) = [f for f in d.findings if f.kind is FindingKind.REPLACED_ATTEMPT]
    assert f.measures["attempt_causes"] == "lr_change"
    assert (
        "In that attempt the log supports: An LR change no schedule explains (the LR left its "
        "schedule over steps 880-950 (x10: 0.0003 -> 0.003 at step 880)" in f.summary
    )
    assert f.measures["lr_attempt"] == pytest.approx(3e-3)
    assert f.measures["lr_resumed"] == pytest.approx(2e-4)
