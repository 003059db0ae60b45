"""The judge both trainer callbacks share: analyze the live run, turn findings into alerts,
and decide the article's response per level (6.3).

yellow (warning): a log line and the user's ``on_alert``; orange (critical): save a
checkpoint and stop; red (fatal): write the rollback plan beside the checkpoints and stop.
Which level does what is configurable. The trainer-specific parts (how to save, how to
stop, where the checkpoints are) stay in :mod:`forensics.integrations.hf` and
:mod:`forensics.integrations.lightning`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forensics.atomic import write_atomic
from forensics.config import Config
from forensics.findings import Finding, Severity
from forensics.integrations.live_run import LiveRun
from forensics.watch.alerts import Alert, AlertBook, Event, last_steps

log = logging.getLogger("forensics.watch")

PLAN_FILE = "forensics-rollback.json"
PLAN_VERSION = 1
LEVELS = ("warning", "critical", "fatal")


def _levels(value: str | Iterable[str] | None, what: str) -> frozenset[Severity]:
    if value is None:
        return frozenset()
    items = [value] if isinstance(value, str) else list(value)
    bad = [v for v in items if v not in LEVELS]
    if bad:
        raise ValueError(f"{what}: {', '.join(map(repr, bad))} is not one of {', '.join(LEVELS)}")
    return frozenset(Severity(v) for v in items)


def _at_or_above(level: str | None, what: str) -> frozenset[Severity]:
    if level is None:
        return frozenset()
    floor = next(iter(_levels(level, what)))
    return frozenset(s for s in map(Severity, LEVELS) if s.rank >= floor.rank)


@dataclass
class Decision:
    """What one judgement asks the trainer to do."""

    alerts: list[Alert] = field(default_factory=list)
    save: bool = False  # save a checkpoint now
    stop: bool = False  # stop training
    plan_for: Alert | None = None  # write the rollback plan for this alert
    diagnosis: Any = None


class LiveJudge:
    """Judges a :class:`LiveRun` every ``every_n_logs`` logs with the same detectors and
    diagnosis as ``forensics analyze``, and says what to do about the alerts.

    Args:
        every_n_logs: judge after every n-th log (1: on each log).
        stop_at: the lowest level that stops training (``"critical"``, ``"fatal"``, or None
            to never stop).
        save_on: levels that save a checkpoint (default: critical, the orange light).
        plan_on: levels that write the rollback plan (default: fatal, the red light).
        on_alert: called with each :class:`~forensics.watch.alerts.Alert` (new, escalated,
            recurred or ended); an exception in it is logged and the callback goes on.
        config: detector parameters, ignored kinds, aliases (as ``forensics.toml``).
        max_overhead: at most this fraction of the wall time spent judging (e.g. 0.05): a
            judgement due sooner after the last one than its cost allows is put off to a
            later log. A judgement reads the whole run (about 2 s for 100,000 logged steps
            of loss, grad norm and LR), so on long runs of fast steps this keeps the watch
            cheap. None: no limit.
    """

    def __init__(
        self,
        *,
        every_n_logs: int = 1,
        stop_at: str | None = "critical",
        save_on: str | Iterable[str] | None = ("critical",),
        plan_on: str | Iterable[str] | None = ("fatal",),
        on_alert: Callable[[Alert], Any] | None = None,
        config: Config | None = None,
        max_overhead: float | None = None,
    ) -> None:
        if int(every_n_logs) < 1:
            raise ValueError(f"every_n_logs: {every_n_logs!r}, must be at least 1")
        self.every_n_logs = int(every_n_logs)
        self.stop_on = _at_or_above(stop_at, "stop_at")
        self.save_on = _levels(save_on, "save_on")
        self.plan_on = _levels(plan_on, "plan_on")
        self.on_alert = on_alert
        self.config = config or Config()
        self.config.params  # noqa: B018 - a bad parameter is the user's error now, not mid-run
        self.book = AlertBook()
        self.alerts: list[Alert] = []  # every alert so far, in order
        if max_overhead is not None and not 0 < max_overhead <= 1:
            raise ValueError(f"max_overhead: {max_overhead!r}, must be in (0, 1]")
        self.max_overhead = max_overhead
        self.judged = 0
        self.judging_seconds = 0.0  # time spent in judgements so far
        self._last_cost = 0.0
        self._last_end: float | None = None
        self.stopped_by: Alert | None = None
        self.disabled = False
        self._since = 0
        # Each judgement reuses the last one's work where provably exact (the watcher's).
        self._analysis: Any = None

    def due(self) -> bool:
        """Count one log; True when this one is to be judged."""
        self._since += 1
        if self._since < self.every_n_logs:
            return False
        if self.max_overhead is not None and self._last_end is not None:
            idle = time.monotonic() - self._last_end
            if self._last_cost > self.max_overhead * (idle + self._last_cost):
                return False  # judged again at a later log
        self._since = 0
        return True

    def judge(self, live: LiveRun) -> Decision:
        from forensics.watch.incremental import IncrementalAnalysis

        t0 = time.monotonic()
        run = live.run()
        if self._analysis is None:
            self._analysis = IncrementalAnalysis()
        # analyze_run's findings, reusing the last judgement's view, series and spike
        # measures where the log only grew (forensics.watch.incremental).
        diag = self._analysis.analyze(run, self.config)
        self.judged += 1
        # An end step at the log's last step is the log's end, not a recovery.
        if run.frame.height:
            alerts = self.book.update(
                diag.findings, last_step=run.last_step, last_steps=last_steps(run)
            )
        else:
            alerts = self.book.update(diag.findings)
        dec = Decision(alerts=alerts, diagnosis=diag)
        for a in dec.alerts:
            self.alerts.append(a)
            self._announce(a)
            if a.event is Event.ENDED:
                continue
            if a.severity in self.save_on:
                dec.save = True
            if a.severity in self.plan_on and (
                dec.plan_for is None or a.severity.rank > dec.plan_for.severity.rank
            ):
                dec.plan_for = a
            if a.severity in self.stop_on:
                dec.stop = True
                if self.stopped_by is None or a.severity.rank > self.stopped_by.severity.rank:
                    self.stopped_by = a
        self._last_end = time.monotonic()
        self._last_cost = self._last_end - t0
        self.judging_seconds += self._last_cost
        return dec

    def _announce(self, a: Alert) -> None:
        f = a.finding
        if a.event is Event.ENDED:
            log.info("forensics: ended: %s", f.summary)
        else:
            what = {Event.ESCALATED: "escalated to ", Event.RECURRED: "again: "}.get(a.event, "")
            level = logging.WARNING if a.severity is Severity.WARNING else logging.ERROR
            log.log(
                level,
                "forensics: %s%s (%s light) %s at step %s: %s",
                what,
                a.severity.value,
                a.severity.light,
                f.kind.value,
                f.start_step,
                f.summary,
            )
        if self.on_alert is not None:
            try:
                self.on_alert(a)
            except Exception as exc:  # the user's function must not stop training either
                log.warning("forensics: on_alert raised %s: %s", type(exc).__name__, exc)

    def action_failed(self, what: str, exc: BaseException) -> None:
        """A response that could not be carried out (a full disk): said, and the watch goes on."""
        log.error("forensics: %s failed (%s: %s)", what, type(exc).__name__, exc)

    def write_rollback(
        self,
        dec: Decision,
        folder: Path,
        saved: dict[int, Path],
        position: dict[str, Any],
    ) -> Path | None:
        """The rollback plan of ``dec``'s fatal incident written into ``folder`` (beside the
        checkpoints; ``saved``: step -> checkpoint path); None when it could not be written
        (said once in the log: training still stops)."""
        from forensics.errors import ForensicsError

        assert dec.plan_for is not None and dec.diagnosis is not None
        doc = rollback_document(
            dec.diagnosis, dec.plan_for.finding, saved.get, position, self.config
        )
        try:
            return write_plan(folder, doc)
        except (OSError, ForensicsError) as exc:
            self.action_failed(f"writing the rollback plan into {folder}", exc)
            return None

    def fail(self, exc: BaseException) -> None:
        """An internal error: logged once, then the callback stays out of the way."""
        if not self.disabled:
            self.disabled = True
            log.error(
                "forensics: the training watch is disabled after an internal error "
                "(%s: %s); training goes on unwatched",
                type(exc).__name__,
                exc,
                exc_info=exc,
            )


def rollback_document(
    diag: Any,
    finding: Finding,
    checkpoint_path: Callable[[int], Path | None],
    position: dict[str, Any],
    config: Config,
) -> dict[str, Any]:
    """The rollback plan for ``finding`` as a JSON-ready dict: the diagnosis's own plan for
    the incident the finding belongs to (:mod:`forensics.rollback`), with the checkpoint's
    path and the data position at the stop."""
    from forensics.rollback import DATA_POSITION, rollback_plan

    plans = [
        p
        for p in diag.rollbacks
        if p.rollback and (p.finding is finding or any(g is finding for g in p.findings))
    ]
    plan = plans[0] if plans else None
    if plan is None:
        plan = rollback_plan(
            diag.ev, diag.findings, checkpoint_every=config.checkpoint_every, lead=finding
        )
    doc: dict[str, Any] = {
        "version": PLAN_VERSION,
        "reason": {
            "kind": finding.kind.value,
            "severity": finding.severity.value,
            "metric": finding.metric,
            "start_step": finding.start_step,
            "summary": finding.summary,
        },
        "stopped_at": position,
        "data_position": DATA_POSITION,
    }
    if plan is None:
        doc["plan"] = None
        return doc
    ckpt = plan.checkpoint_step
    path = checkpoint_path(ckpt) if ckpt is not None else None
    doc.update(
        {
            "plan": plan.sentence(),
            "onset_step": plan.onset_step,
            "last_healthy_step": plan.last_healthy_step,
            "checkpoint": {
                "step": ckpt,
                "path": str(path) if path is not None else None,
                "known": plan.checkpoint_known,
                "source": plan.checkpoint_source,
            },
            "learning_rate": {
                "before": plan.lr_before,
                "cut_from": plan.lr_cut_from,
                # the smallest cut of the rule's range (10% for the red light)
                "resume": plan.lr_resume[1] if plan.lr_resume else None,
                "resume_range": list(plan.lr_resume) if plan.lr_resume else None,
                "rule": plan.lr_cut_text,
            },
            "skip_steps": list(plan.skip_steps) if plan.skip_steps else None,
            # The checkpoint's path where the trainer's command has a placeholder for it.
            "commands": [_with_path(c, path) for c in plan.commands],
        }
    )
    return doc


def _with_path(command: str, path: Path | None) -> str:
    if path is None:
        return command
    for placeholder in ("<checkpoint .ckpt>", "<checkpoint dir>"):
        command = command.replace(placeholder, str(path))
    return command


def write_plan(folder: Path, doc: dict[str, Any]) -> Path:
    path = folder / PLAN_FILE
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=1, default=str) + "\n")
    return path
