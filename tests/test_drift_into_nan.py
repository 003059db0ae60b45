"""A grad norm that climbs for 3,000 steps while the loss keeps falling, then the loss and the
grad norm turn NaN (the article's case: the climb comes first, nobody looked). The drift's
last point is the last finite grad norm, step 8,999; the NaN starts at step 9,000.

A drift "still going on at the onset" had to end at the onset or later, so the NaN read "no
cause the log can show is supported", was an incident of its own, and the rollback went to
the checkpoint at step 8,500: in the middle of the climb, with the grad norm already 5x its
baseline. A finding that ran into non-finite numbers lasts up to them: the climb is the NaN's
supported cause, one incident, and the rollback goes to the checkpoint before the climb.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from forensics.findings import FindingKind
from forensics.pipeline import analyze_run, read_run


def _write(path: Path, *, nan_logged: bool = True, gap_before_nan: int = 0) -> Path:
    rng = np.random.default_rng(5)
    rows = []
    for s in range(1, 10001):
        lr = 6e-4 * min(1, s / 1000) * (0.1 + 0.45 * (1 + np.cos(np.pi * s / 10000)))
        row: dict[str, float] = {"step": s, "train/lr": lr}
        loss = 2.2 + 6 / (1 + s / 300) + rng.normal(0, 0.02)
        gn = 0.4 + rng.gamma(2, 0.02)
        if s > 6000:
            gn *= 1 + (s - 6000) / 600
        if s >= 9000:
            loss = gn = float("nan")
        row["train/loss"] = loss
        if not (s >= 9000 and not nan_logged) and not (9000 - gap_before_nan <= s < 9000):
            row["train/grad_norm"] = gn
        rows.append(json.dumps(row))
    path.write_text("\n".join(rows) + "\n")
    return path


def _incident_of(diag, kind: FindingKind):
    (f,) = [f for f in diag.findings if f.kind is kind and f.metric == "loss"] or [
        f for f in diag.findings if f.kind is kind
    ]
    (inc,) = [i for i in diag.incidents if any(g is f for g in i.findings)]
    return f, inc


def test_a_climb_that_ran_into_a_nan_is_its_cause(tmp_path: Path) -> None:
    diag = analyze_run(read_run(_write(tmp_path / "metrics.jsonl")))
    (drift,) = [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_DRIFT]
    assert drift.end_step == 8999
    nan, inc = _incident_of(diag, FindingKind.NAN_INF)
    assert nan.start_step == 9000
    (climb,) = [c for c in diag.causes_for(nan) if c.cause == "grad_norm_climb"]
    assert climb.status == "supported"
    assert "climbing since step" in climb.evidence
    assert any(g is drift for g in inc.findings)  # one incident
    plan = inc.rollback
    assert plan is not None and plan.onset_step == drift.start_step
    assert plan.last_healthy_step == drift.start_step - 1
    assert plan.checkpoint_step is not None and plan.checkpoint_step < drift.start_step


def test_a_grad_norm_no_longer_logged_after_the_climb_still_ran_into_it(tmp_path: Path) -> None:
    """Trainers often stop logging the grad norm once it is NaN: the climb still reached the
    NaN's onset, one logging interval after its last point."""
    diag = analyze_run(read_run(_write(tmp_path / "metrics.jsonl", nan_logged=False)))
    (drift,) = [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_DRIFT]
    nan, inc = _incident_of(diag, FindingKind.NAN_INF)
    (climb,) = [c for c in diag.causes_for(nan) if c.cause == "grad_norm_climb"]
    assert climb.status == "supported"
    assert inc.rollback is not None and inc.rollback.onset_step == drift.start_step


def test_a_climb_that_stopped_being_logged_long_before_is_not_carried_on(tmp_path: Path) -> None:
    """A grad norm last logged 500 steps before the NaN says nothing about those steps."""
    diag = analyze_run(
        read_run(_write(tmp_path / "metrics.jsonl", nan_logged=False, gap_before_nan=500))
    )
    (drift,) = [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_DRIFT]
    assert drift.end_step == 8499
    nan, _ = _incident_of(diag, FindingKind.NAN_INF)
    (climb,) = [c for c in diag.causes_for(nan) if c.cause == "grad_norm_climb"]
    assert climb.status == "contradicted"


def test_watch_does_not_call_a_climb_that_ran_into_a_nan_ended(tmp_path: Path) -> None:
    """The same log read poll by poll as ``forensics watch`` reads it: the drift is alerted
    and escalates; at the poll that brings the NaN its last finite point (8,999) lies before
    the grad norm's last logged step (9,000, NaN), which read as a recovery: "ENDED
    grad_norm_drift" one line above the red alert. Only finite points end a finding."""
    from conftest import alerts_poll_by_poll

    from forensics.watch.alerts import Event

    polls = alerts_poll_by_poll(_write(tmp_path / "metrics.jsonl"), (7000, 8500, 9000, 10000))
    events = [(last, a.event, a.finding.kind) for last, a in polls]
    drift = [(at, e) for at, e, k in events if k is FindingKind.GRAD_NORM_DRIFT]
    assert drift[0] == (7000, Event.NEW) and (8500, Event.ESCALATED) in drift
    assert all(e is not Event.ENDED for _, e in drift)
    assert (9000, Event.NEW, FindingKind.NAN_INF) in events


def test_the_nan_after_a_climb_is_treated_as_the_climbs_end(tmp_path: Path) -> None:
    """Its prescription read "Check the loss scale around the step, consider training in
    bf16" for a run with no loss scale, whose NaN ended a 3,000-step grad-norm climb. With the
    climb its supported cause, the advice is to go back before the climb and treat it (the
    article's layer-wise decay for a grad norm that keeps rising). A NaN without one keeps
    the loss-scale advice."""
    diag = analyze_run(read_run(_write(tmp_path / "metrics.jsonl")))
    nan, _ = _incident_of(diag, FindingKind.NAN_INF)
    rx = diag.prescription_for(nan)
    assert rx.startswith("Red light: the non-finite values ended a grad-norm climb")
    assert "roll back to before the climb" in rx and "layer-wise decay" in rx
    assert "bf16" not in rx

    flat = tmp_path / "flat.jsonl"
    rows = [
        json.dumps({"step": s, "loss": 2 + 1 / s if s < 900 else float("nan")})
        for s in range(1, 1001)
    ]
    flat.write_text("\n".join(rows) + "\n")
    d2 = analyze_run(read_run(flat))
    (n2,) = [f for f in d2.findings if f.kind is FindingKind.NAN_INF]
    assert "loss scale" in d2.prescription_for(n2)
