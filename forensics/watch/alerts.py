"""Alert once per finding, again when it escalates or recurs, and note when it ends.

A finding seen on one poll is seen again on the next, often with a slightly different onset
(the adaptive baseline grows with the run). Its identity is therefore its kind, metric and
layer plus an onset that matches within a tolerance of an earlier one of the same kind:
the same event, not a new one. The book's state is a small JSON file, so a restarted
watcher carries on without repeating an alert.

A stall the watcher sees from outside (no new step for too long) is tracked here too, under
its own identity (``watch_stall`` and the last step before the silence): alerted once while
the log is silent, ended when steps resume.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forensics.atomic import write_atomic
from forensics.findings import Finding, FindingKind, Severity

if TYPE_CHECKING:
    from forensics.causes import Cause
    from forensics.run import Run

STATE_VERSION = 1
# Info findings are notes for the report, not alerts: the lights start at yellow.
ALERTING = (Severity.WARNING, Severity.CRITICAL, Severity.FATAL)
WATCH = "watch"


class Event(StrEnum):
    NEW = "new"
    ESCALATED = "escalated"
    # A finding that stands for many like events (``events_at``: recurring stalls, periodic
    # spikes) counts more of them than when last alerted: the same event, at its level, again.
    RECURRED = "recurred"
    ENDED = "ended"


@dataclass
class Tracked:
    """What the book remembers of one alerted finding."""

    key: str
    kind: str
    metric: str | None
    layer: int | None
    start_step: int
    severity: str
    end_step: int | None = None
    ended: bool = False
    origin: str = "detector"  # or "watch": a stall the watcher saw from outside
    summary: str = ""
    acted: str | None = None  # the level whose hook ran for this event (see claim_action)
    # The furthest step the finding covered when last seen (its end, or its peak while it
    # goes on): a later report of the event whose onset moved overlaps it.
    reach: int | None = None
    # How many like events the finding stood for when last alerted (len(events_at)); None
    # for a finding of one event (a state file from before it reads as None too).
    events: int | None = None


@dataclass(frozen=True)
class Alert:
    """One thing to act on: a finding that is new, escalated, recurred, or ended."""

    event: Event
    finding: Finding
    key: str
    previous: Severity | None = None
    # The finding's causes as the diagnosis tested them (empty when not known): the
    # supported ones go into the alert's line, all of them into the hook's JSON.
    causes: tuple[Cause, ...] = field(default=(), compare=False)

    @property
    def severity(self) -> Severity:
        return self.finding.severity

    def cause_text(self) -> str:
        """`` Cause (supported): An LR change no schedule explains: ....`` for the first
        supported root cause (else the first supported mechanism, so named), and which others
        are supported; '' when none is (an ended finding says none)."""
        if self.event is Event.ENDED:
            return ""
        from forensics.causes import supported_mechanisms, supported_roots

        for label, found in (
            ("Cause", supported_roots(self.causes)),
            ("Mechanism", supported_mechanisms(self.causes)),
        ):
            if found:
                others = ", ".join(o.cause.replace("_", " ") for o in found[1:])
                more = f" (also supported: {others})" if others else ""
                c = found[0]
                return f" {label} (supported): {c.text}: {c.evidence}{more}."
        return ""


def _layer(f: Finding) -> int | None:
    v = f.measures.get("layer")
    return int(v) if isinstance(v, int | float) else None


def _reach(f: Finding) -> int:
    return max(f.start_step, f.peak_step or f.start_step, f.end_step or f.start_step)


def onset_tolerance(f: Finding) -> int:
    """How far the onset of the same event may move between polls, in steps."""
    span = (f.end_step or f.peak_step or f.start_step) - f.start_step
    return max(50, span // 2)


@dataclass
class AlertBook:
    """The alerts sent so far. ``update`` turns this poll's findings into alerts."""

    state_path: Path | None = None
    tracked: dict[str, Tracked] = field(default_factory=dict)

    @classmethod
    def load(cls, state_path: Path | None) -> AlertBook:
        """The book saved at ``state_path`` (an empty one when there is none yet).

        A state file that cannot be read or parsed is a :class:`ValueError` with one line:
        alerting again from scratch would repeat every alert, so it is not ignored.
        """
        book = cls(state_path=state_path)
        if state_path is None or not state_path.exists():
            return book
        try:
            doc = json.loads(state_path.read_text(encoding="utf-8"))
            if doc.get("version") != STATE_VERSION:
                raise ValueError(f"state version {doc.get('version')!r}, not {STATE_VERSION}")
            for item in doc["alerts"]:
                t = Tracked(**item)
                book.tracked[t.key] = t
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{state_path}: not a forensics watch state file ({exc})") from exc
        return book

    def save(self) -> None:
        if self.state_path is None:
            return
        doc: dict[str, Any] = {
            "version": STATE_VERSION,
            "alerts": [asdict(t) for t in self.tracked.values()],
        }
        write_atomic(self.state_path, json.dumps(doc, indent=1) + "\n")

    def _match(self, f: Finding) -> Tracked | None:
        layer, tol = _layer(f), onset_tolerance(f)
        best: Tracked | None = None
        for t in self.tracked.values():
            if t.origin == WATCH and f.kind is not FindingKind.STALL:
                continue
            if (t.kind, t.metric, t.layer) != (f.kind.value, f.metric, layer):
                continue
            # The same event: its onset moved little, or its steps overlap the ones seen
            # before (a loss climb's onset goes back to its low as the climb goes on).
            overlap = t.reach is not None and f.start_step <= t.reach and t.start_step <= _reach(f)
            if abs(t.start_step - f.start_step) > tol and not overlap:
                continue
            if best is None or abs(t.start_step - f.start_step) < abs(
                best.start_step - f.start_step
            ):
                best = t
        return best

    def update(
        self,
        findings: Iterable[Finding],
        *,
        last_step: int | None = None,
        last_steps: Mapping[str, int] | None = None,
    ) -> list[Alert]:
        """Alerts for this poll: new findings, escalations, and findings that ended.

        A finding has ended when it has an end step before ``last_step``, the run's last step
        (the sign recovered while the run went on); an end step at the last step is the log's
        end, not a recovery (a NaN to the end of the log). :func:`last_steps` counts finite
        points only: a sign that turned non-finite after a finding did not recover.
        ``last_steps`` gives the last step per metric, which is the one that counts for a
        finding on that metric (a step half read: its loss is in the file, its grad norm not
        yet). Without either any end step counts.
        A finding that was alerted and is now a note (``info``) that has ended ends its event
        too: a spike alerted while unresolved, back on its trend since. A finding that was
        alerted and is no longer reported is left as it was: with more data a baseline can
        absorb an old event, which is no news for the person on call.
        A ``stall`` the detectors find between two logged steps is the same event as a stall
        the watcher saw from outside at the same step.
        """

        def over(f: Finding) -> bool:
            last = (last_steps or {}).get(f.metric or "", last_step)
            return f.end_step is not None and (last is None or f.end_step < last)

        alerts: list[Alert] = []
        matched: set[str] = set()  # the events this poll still reports at an alerting level
        notes: list[Finding] = []
        for f in sorted(findings, key=Finding.sort_key):
            if f.severity not in ALERTING:
                notes.append(f)
                continue
            t = self._match(f)
            if t is not None:
                matched.add(t.key)
            if t is None:
                layer = _layer(f)
                where = "" if layer is None else str(layer)
                key = f"{f.kind.value}|{f.metric or ''}|{where}|{f.start_step}"
                t = Tracked(
                    key=key,
                    kind=f.kind.value,
                    metric=f.metric,
                    layer=layer,
                    start_step=f.start_step,
                    severity=f.severity.value,
                    end_step=f.end_step if over(f) else None,
                    ended=over(f),
                    summary=f.summary,
                    reach=_reach(f),
                    events=len(f.events_at) if f.events_at is not None else None,
                )
                self.tracked[key] = t
                matched.add(key)
                alerts.append(Alert(Event.NEW, f, key))
                continue
            t.reach = max(t.reach if t.reach is not None else t.start_step, _reach(f))
            before = Severity(t.severity)
            if f.severity.rank > before.rank:
                t.severity = f.severity.value
                t.ended = False
                t.summary = f.summary
                alerts.append(Alert(Event.ESCALATED, f, t.key, previous=before))
            elif f.events_at is not None and len(f.events_at) > (t.events or 1):
                # (a third hang: the two alerted one by one are now one finding of three)
                t.summary = f.summary
                alerts.append(Alert(Event.RECURRED, f, t.key, previous=before))
            if f.events_at is not None:
                t.events = max(t.events or 1, len(f.events_at))
            if over(f) and not t.ended:
                t.end_step, t.ended = f.end_step, True
                alerts.append(Alert(Event.ENDED, f, t.key, previous=before))
        # An alerted event now judged a note and over: the news its alert was waiting for (a
        # spike held at warning while nothing was logged after it, back on its trend since:
        # physiological). Only an event no alerting finding of this poll still reports: a
        # note beside it is another event of the same kind.
        for f in notes:
            t = self._match(f) if over(f) else None
            if t is None or t.ended or t.origin == WATCH or t.key in matched:
                continue
            t.end_step, t.ended = f.end_step, True
            matched.add(t.key)
            alerts.append(Alert(Event.ENDED, f, t.key, previous=Severity(t.severity)))
        return alerts

    def claim_action(self, alert: Alert) -> bool:
        """Whether ``alert`` is the first of its event at its level to run the level's hook.

        One event shows in several signs, and not always on the same poll (a NaN reaches the
        loss's record before the grad norm's): an alert whose onset lies within the identity
        tolerance of one that already ran the hook at the same level is that event again.
        An end runs no hook. The claim is kept in the state file.
        """
        if alert.event is Event.ENDED:
            return False
        f, level = alert.finding, alert.severity.value
        tol = onset_tolerance(f)
        for t in self.tracked.values():
            if t.acted == level and abs(t.start_step - f.start_step) <= tol:
                return False
        self.tracked[alert.key].acted = level
        return True

    # -- stalls seen from outside ------------------------------------------------------
    def stall(self, finding: Finding) -> list[Alert]:
        """Alert a stall (a ``stall`` finding the watcher made) once per silent step."""
        key = f"{WATCH}_stall|{finding.start_step}"
        if key in self.tracked:
            return []
        self.tracked[key] = Tracked(
            key=key,
            kind=finding.kind.value,
            metric=None,
            layer=None,
            start_step=finding.start_step,
            severity=finding.severity.value,
            origin=WATCH,
            summary=finding.summary,
        )
        return [Alert(Event.NEW, finding, key)]

    def open_stall(self) -> Tracked | None:
        """The stall alerted and not ended yet, if any."""
        return next((t for t in self.tracked.values() if t.origin == WATCH and not t.ended), None)

    def steps_resumed(self, step: int) -> list[Alert]:
        """End every open stall: the log has a step (``step``) after it again."""
        alerts = []
        for t in self.tracked.values():
            if t.origin != WATCH or t.ended or step <= t.start_step:
                continue
            t.ended, t.end_step = True, step
            f = Finding(
                kind=FindingKind.STALL,
                severity=Severity(t.severity),
                metric=None,
                start_step=t.start_step,
                end_step=step,
                summary=f"Steps resumed: step {step:,} came after the silence from step "
                f"{t.start_step:,}.",
                measures={"source": WATCH},
            )
            alerts.append(Alert(Event.ENDED, f, t.key, previous=Severity(t.severity)))
        return alerts


def worst(alerts: Iterable[Alert]) -> Severity | None:
    """The highest severity among alerts that are not endings."""
    levels = [a.severity for a in alerts if a.event is not Event.ENDED]
    return max(levels, key=lambda s: s.rank) if levels else None


def last_steps(run: Run) -> dict[str, int]:
    """The last step each vital sign was logged with a finite value (what ``AlertBook.update``
    judges an end by). Non-finite points after a finding do not end it: a grad-norm climb
    that ran into a NaN (the drift to step 8,999, NaN from 9,000) did not recover, and its
    "ENDED" came one line before the NaN's red alert."""
    import polars as pl

    finite = pl.col("step").filter(pl.col("value").is_finite())
    last = run.frame.group_by("metric").agg(finite.max()).drop_nulls()
    return {str(m): int(s) for m, s in last.iter_rows()}
