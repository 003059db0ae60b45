"""The alert book: each finding alerts once, again on escalation, a note at its end; a state
file carries it over a restarted watcher; a stall seen from outside has its own identity.

The findings come from the real detectors on the sample runs where that matters (the onset
of the same event moves between polls as the baseline grows); the book's rules are also
checked on hand-made findings, one rule each.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
from conftest import alerts_poll_by_poll

from forensics.findings import Finding, FindingKind, Severity
from forensics.pipeline import analyze_run, read_run
from forensics.watch.actions import message
from forensics.watch.alerts import AlertBook, Event, worst

ROOT = Path(__file__).resolve().parents[1]


def _f(
    kind: str = "grad_norm_spike",
    severity: str = "warning",
    start: int = 100,
    end: int | None = None,
    metric: str | None = "grad_norm",
    **measures: object,
) -> Finding:
    return Finding(
        kind=FindingKind(kind),
        severity=Severity(severity),
        metric=metric,
        start_step=start,
        end_step=end,
        summary=f"{kind} at {start}",
        measures=measures,  # type: ignore[arg-type]
    )


def test_new_once_then_escalated_then_ended() -> None:
    book = AlertBook()
    a = book.update([_f()], last_step=120)
    assert [(x.event, x.severity) for x in a] == [(Event.NEW, Severity.WARNING)]
    assert book.update([_f(start=110)], last_step=140) == []  # onset moved within tolerance
    a = book.update([_f(severity="critical", start=105)], last_step=160)
    assert [(x.event, x.previous) for x in a] == [(Event.ESCALATED, Severity.WARNING)]
    assert worst(a) is Severity.CRITICAL
    # An end step at the run's last step is the log's end, not a recovery.
    assert book.update([_f(severity="critical", end=180)], last_step=180) == []
    a = book.update([_f(severity="critical", end=180)], last_step=200)
    assert [x.event for x in a] == [Event.ENDED]
    assert worst(a) is None  # an end is no level to act on
    assert book.update([_f(severity="critical", end=180)], last_step=300) == []


def test_a_finding_of_many_events_alerts_again_as_it_counts_more() -> None:
    """Recurring hangs: two alerted one by one, then one stall of three (the detector groups
    them from three on), then four: each new hang is announced again, at its level, and
    claims no second hook."""
    book = AlertBook()
    one = _f("stall", start=737, end=737, metric="throughput")
    two = _f("stall", start=1_874, end=1_874, metric="throughput")
    a = book.update([one, two], last_step=2_000)
    assert [x.event for x in a] == [Event.NEW, Event.NEW]
    assert all(book.claim_action(x) for x in a)

    def grouped(*steps: int) -> Finding:
        return replace(_f("stall", start=737, end=steps[-1], metric="throughput"), events_at=steps)

    a = book.update([grouped(737, 1_874, 1_973)], last_step=2_100)
    assert [(x.event, x.previous) for x in a] == [(Event.RECURRED, Severity.WARNING)]
    assert not book.claim_action(a[0])  # (the event ran its yellow hook at the first hang)
    assert "(yellow light, again, 3 times now)" in message(a[0], "run", None)
    assert book.update([grouped(737, 1_874, 1_973)], last_step=2_200) == []
    a = book.update([grouped(737, 1_874, 1_973, 2_073)], last_step=2_300)
    assert [x.event for x in a] == [Event.RECURRED]


def test_identity_is_kind_metric_layer_and_onset() -> None:
    book = AlertBook()
    book.update([_f()])
    others = [
        _f(start=400),  # a later event of the same kind
        _f(metric="loss", kind="loss_spike", classification="pathological"),
        _f(kind="layer_grad_shift", metric="grad_norm_layer", layer=0),
        _f(kind="layer_grad_shift", metric="grad_norm_layer", layer=3),
    ]
    assert [x.event for x in book.update(others)] == [Event.NEW] * 4
    assert book.update(others) == []
    assert "layer_grad_shift|grad_norm_layer|0|100" in book.tracked  # layer 0 is a layer


def test_info_findings_do_not_alert() -> None:
    assert AlertBook().update([_f(severity="info")]) == []


def test_state_round_trip_and_a_bad_state_file(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    book = AlertBook.load(state)
    book.update([_f(), _f(kind="nan_inf", severity="fatal", metric="loss", start=300)])
    book.stall(_f(kind="stall", metric=None, start=350, source="watch"))
    book.save()
    again = AlertBook.load(state)
    assert again.tracked == book.tracked
    assert (
        again.update([_f(start=90), _f(kind="nan_inf", severity="fatal", metric="loss", start=300)])
        == []
    )
    assert again.stall(_f(kind="stall", metric=None, start=350, source="watch")) == []

    state.write_text("{not json")
    with pytest.raises(ValueError, match="not a forensics watch state file"):
        AlertBook.load(state)
    state.write_text(json.dumps({"version": 99, "alerts": []}))
    with pytest.raises(ValueError, match="state version 99"):
        AlertBook.load(state)


def test_watch_stall_alerts_once_per_silent_step_and_ends_when_steps_resume() -> None:
    book = AlertBook()
    stall = _f(kind="stall", metric=None, start=500, source="watch")
    assert [x.event for x in book.stall(stall)] == [Event.NEW]
    assert book.stall(stall) == []
    assert book.open_stall() is not None
    assert book.steps_resumed(500) == []  # no step after the silence yet
    ended = book.steps_resumed(510)
    assert [(x.event, x.finding.start_step, x.finding.end_step) for x in ended] == [
        (Event.ENDED, 500, 510)
    ]
    assert book.open_stall() is None and book.steps_resumed(520) == []
    # The detector's stall between the same two logged steps is the same event.
    detector = _f(kind="stall", metric=None, start=500, end=510, source="wall_time")
    assert book.update([detector], last_step=600) == []
    # A later silence is a new stall.
    assert [x.event for x in book.stall(_f(kind="stall", metric=None, start=900))] == [Event.NEW]


def test_a_detector_finding_does_not_match_a_watch_stall() -> None:
    book = AlertBook()
    book.stall(_f(kind="stall", metric=None, start=500, source="watch"))
    a = book.update([_f(kind="crash", severity="critical", metric=None, start=500)])
    assert [x.event for x in a] == [Event.NEW]


def test_a_run_read_poll_by_poll_alerts_each_event_once() -> None:
    """The nan sample run cut at growing steps, as a watcher would read it while it is
    written: every event is alerted once, however its onset and extent move between polls;
    the NaN at step 637 is fatal from the first poll that sees it."""
    full = read_run(ROOT / "sample_runs" / "nan")
    book = AlertBook()
    seen: list[tuple[tuple[str, str | None, object, int], Event]] = []
    for last in range(300, 1001, 50):
        cut = read_run(ROOT / "sample_runs" / "nan")
        cut.frame = full.frame.filter(pl.col("step") <= last)
        diag = analyze_run(cut)
        for a in book.update(diag.findings, last_step=cut.last_step):
            f = a.finding
            seen.append(((f.kind.value, f.metric, f.measures.get("layer"), f.start_step), a.event))
    new = [k for k, e in seen if e is Event.NEW]
    assert len(new) >= 5 and len(new) == len(set(new))
    first_nan = next((k, e) for k, e in seen if k[0] == "nan_inf")
    assert first_nan == (("nan_inf", "loss", None, 637), Event.NEW)
    # Every alerting finding of the finished run is one the book already knows.
    final = analyze_run(full)
    again = book.update(final.findings, last_step=final.run.last_step)
    assert [a for a in again if a.event is Event.NEW] == []


def test_a_half_read_step_is_no_end() -> None:
    """The loss of step 99 is in the file, its grad norm not yet: a grad-norm NaN to step 98
    still runs to the end of its series."""
    book = AlertBook()
    nan = _f(kind="nan_inf", severity="fatal", start=20, end=98)
    book.update([nan], last_step=98)
    assert book.update([nan], last_step=99, last_steps={"grad_norm": 98, "loss": 99}) == []
    ended = book.update([nan], last_step=99, last_steps={"grad_norm": 99, "loss": 99})
    assert [a.event for a in ended] == [Event.ENDED]


def test_one_action_per_event_and_level_across_signs_and_polls(tmp_path: Path) -> None:
    """The NaN reaches the loss's record on one poll and the grad norm's on the next: one
    hook. An escalation of the same event to a higher level is a new action; a distant onset
    is another event."""
    book = AlertBook.load(tmp_path / "state.json")
    (loss,) = book.update([_f(kind="nan_inf", severity="fatal", metric="loss", start=40)])
    assert book.claim_action(loss)
    book.save()
    book = AlertBook.load(tmp_path / "state.json")  # the claim survives a restart
    gn = _f(kind="nan_inf", severity="fatal", metric="grad_norm", start=40)
    (grad,) = book.update([gn])
    assert not book.claim_action(grad)
    (warn,) = book.update([_f(start=500)])
    assert book.claim_action(warn)
    (esc,) = book.update([_f(start=500, severity="critical")])
    assert esc.event is Event.ESCALATED and book.claim_action(esc)
    (far,) = book.update([_f(kind="nan_inf", severity="fatal", metric="loss", start=900)])
    assert book.claim_action(far)
    (ended,) = book.update([_f(start=500, severity="critical", end=520)], last_step=600)
    assert ended.event is Event.ENDED and not book.claim_action(ended)


def test_an_event_whose_onset_moves_far_is_still_one_event() -> None:
    """A loss spike cut from a climb the loss never came back from starts where the climb
    did, and that start can move back by more than the onset tolerance as the climb goes on
    (a poll saw it from step 1,300 to 1,400, the next from its low at 1,000). Its steps
    overlap the ones alerted: the same event, no second alert. A later spike whose steps do
    not meet them is a new one."""
    book = AlertBook()
    first = _f("loss_spike", "critical", start=1300, end=1400, metric="loss")
    assert [a.event for a in book.update([first], last_step=1400)] == [Event.NEW]
    moved = _f("loss_spike", "critical", start=1000, end=1500, metric="loss")
    assert book.update([moved], last_step=1500) == []
    later = _f("loss_spike", "critical", start=2000, end=2050, metric="loss")
    got = book.update([moved, later], last_step=2100)  # (the climb ended at 1,500)
    assert [(a.event, a.finding.start_step) for a in got] == [
        (Event.ENDED, 1000),
        (Event.NEW, 2000),
    ]


def test_an_alerted_event_judged_a_note_once_over_ends() -> None:
    """A spike alerted while nothing was logged after it, judged physiological (info) once
    the loss came back: the alert's event ends, once, with the note's words; no hook runs
    for it. A note beside an event still reported at an alerting level does not end it."""
    book = AlertBook()
    held = _f("loss_spike", "warning", start=3000, metric="loss")
    assert [a.event for a in book.update([held], last_step=3000)] == [Event.NEW]
    back = _f("loss_spike", "info", start=3000, end=3028, metric="loss")
    (ended,) = book.update([back], last_step=3500)
    assert (ended.event, ended.previous, ended.finding.end_step) == (
        Event.ENDED,
        Severity.WARNING,
        3028,
    )
    assert not book.claim_action(ended) and worst([ended]) is None
    assert book.update([back], last_step=4000) == []
    # Still a warning on this poll: a physiological spike 30 steps later is another event.
    book.update([_f(start=5000)], last_step=5000)
    beside = _f(start=5030, end=5031, severity="info")
    assert book.update([_f(start=5000), beside], last_step=5100) == []
    # Not over yet (it ends at the log's last step): nothing to say.
    book.update([_f(start=7000)], last_step=7000)
    assert book.update([_f(start=7000, end=7010, severity="info")], last_step=7010) == []


def test_a_spike_alerted_unresolved_then_physiological_ends_poll_by_poll(tmp_path: Path) -> None:
    """The real detectors on a JSONL log read as a watcher reads it: the loss spike at step
    3,000 is a warning while it is the last logged step ("unresolved"), and physiological
    (info) once the loss is back on its trend; the book says it ended."""
    import numpy as np

    rng = np.random.default_rng(5)
    lines = []
    for s in range(1, 4001):
        loss = 2.5 + 5.0 / (1 + s / 300) + rng.normal(0, 0.02)
        if 3000 <= s < 3040:
            loss += 2.0 * np.exp(-(s - 3000) / 10)
        lines.append(json.dumps({"step": s, "loss": loss, "lr": 3e-4 * min(1, s / 200)}))
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines) + "\n")
    events = [
        (last, a.event, a.finding.severity, a.finding.start_step)
        for last, a in alerts_poll_by_poll(path, (2500, 3000, 3500, 4000))
        if a.finding.kind is FindingKind.LOSS_SPIKE
    ]
    assert events == [
        (3000, Event.NEW, Severity.WARNING, 3000),
        (3500, Event.ENDED, Severity.INFO, 3000),
    ]
