"""The watcher's poll loop: read what is new, judge it as ``analyze`` would, alert and act.

Each poll reads the run's new records (:class:`~forensics.watch.tail.RunTail`); when the run
changed, the same detectors and diagnosis as ``analyze`` run on it
(:func:`forensics.pipeline.analyze_run` with the loaded config), the
:class:`~forensics.watch.alerts.AlertBook` turns the findings into alerts (saved to the state
file at once), the report is rewritten, and each alert's level runs its hook and the webhook.
Between changes, a log that stopped is a stall: no new step for longer than a multiple of the
usual time between logged steps (or ``stall_after``), alerted once as a warning and ended when
steps resume.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from forensics.errors import ForensicsError, MultipleJobsError, summarize
from forensics.findings import Finding, FindingKind, Severity
from forensics.watch.alerts import WATCH, Alert, AlertBook, Event, last_steps
from forensics.watch.tail import RunTail

if TYPE_CHECKING:
    from forensics.config import Config
    from forensics.diagnosis import Diagnosis
    from forensics.evidence.reuse import TrendMemo
    from forensics.run import Run
    from forensics.watch.panel import Panel

# Logged steps whose spacing sets the usual pace (the recent ones: a run speeds up and slows).
PACE_WINDOW = 100
# Observed advances needed before the watcher trusts its own clock for the pace.
MIN_OBSERVED = 3


class MetricSink(Protocol):
    """Where the vital signs go on each change (forensics.watch.prometheus)."""

    def update(self, run: str, diagnosis: Diagnosis | None) -> None: ...


@dataclass(frozen=True)
class WatchSettings:
    """What the command line asked for (``forensics watch --help`` names each)."""

    interval: float = 30.0
    stall_after: float | None = None  # seconds; None: a multiple of the usual pace
    until: Severity | None = None  # stop when the verdict reaches this
    hooks: dict[Severity, str] = field(default_factory=dict)  # level -> shell command
    webhook: str | None = None
    hook_timeout: float = 60.0
    webhook_timeout: float = 10.0
    exit_code: int = 1  # --until reached: the code --fail-on uses


@dataclass
class Status:
    """What the panel shows after a poll."""

    run: Run | None = None
    diagnosis: Diagnosis | None = None
    last_alert: Alert | None = None
    silence: float = 0.0  # seconds since the last new step
    stall_limit: float | None = None  # silence that counts as a stall (None: not known yet)
    polls: int = 0
    report: Path | None = None


def usual_logged_gap(run: Run) -> float | None:
    """Median wall seconds between consecutive logged steps, over the last ones (None when the
    log has no usable wall times)."""
    import polars as pl

    frame = run.frame
    if frame.is_empty():
        return None
    steps = (
        frame.lazy()
        .filter(pl.col("wall_time").is_not_null() & pl.col("step").is_not_null())
        .group_by("step")
        .agg(pl.col("wall_time").max())
        .sort("step")
        .tail(PACE_WINDOW + 1)
        .collect()
    )
    walls = steps.get_column("wall_time").to_list()
    gaps = [b - a for a, b in zip(walls, walls[1:], strict=False) if b > a]
    return statistics.median(gaps) if len(gaps) >= MIN_OBSERVED else None


class Watcher:
    """Watches one run (a folder or a file) until stopped or ``settings.until`` is reached.

    ``report_place`` gives the report's path for the run (the command line's rule: never
    inside the run folder); None writes no report. ``clock`` is ``time.monotonic`` but for
    tests.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        config: Config | None = None,
        settings: WatchSettings | None = None,
        state_path: Path | None = None,
        report_place: Callable[[Run], Path] | None = None,
        panel: Panel | None = None,
        sinks: list[MetricSink] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from forensics.config import Config
        from forensics.pipeline import read_options
        from forensics.watch.incremental import IncrementalAnalysis

        self.path = Path(path)
        self.config = config or Config()
        self.settings = settings or WatchSettings()
        self.tail = RunTail(self.path, read_options(self.config))
        self.book = AlertBook.load(state_path)
        self.report_place = report_place
        self.panel = panel
        self.sinks = list(sinks or [])
        self.clock = clock
        self.status = Status()
        self.stopping = False
        self._said: set[str] = set()
        self._waiting = False
        self._last_step: int | None = None
        self._advanced_at: float | None = None
        self._advances: deque[float] = deque(maxlen=PACE_WINDOW)
        self._report_of: int | None = None  # id() of the diagnosis the report shows
        self._pace_of: int | None = None  # id() of the frame the logged pace was read from
        self._logged_gap: float | None = None
        self.incremental = IncrementalAnalysis()

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> int:
        """Poll every ``interval`` seconds until :meth:`stop` or ``until``; the exit code."""
        try:
            while not self.stopping:
                code = self.poll()
                if code is not None:
                    return code
                self._sleep(self.settings.interval)
            return 0
        finally:
            self.close()

    def stop(self) -> None:
        """Ask the loop to end after the current poll (a signal handler calls this)."""
        self.stopping = True

    def close(self) -> None:
        self.book.save()
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if close is not None:
                close()
        if self.panel is not None:
            self.panel.close()

    def _sleep(self, seconds: float) -> None:
        # Short naps: a signal's stop() takes effect within a tenth of a second.
        end = self.clock() + seconds
        while not self.stopping:
            left = end - self.clock()
            if left <= 0:
                return
            time.sleep(min(0.1, left))

    # -- one poll ------------------------------------------------------------------------
    def poll(self) -> int | None:
        """Read, judge, alert and act once; the exit code when ``until`` was reached."""
        self.status.polls += 1
        changed = self._read()
        run = self.tail.run
        if run is None:
            where = "does not exist yet" if not self.path.exists() else "holds no training log yet"
            self._wait_said(f"{self.path} {where}")
            return None
        now = self.clock()
        alerts: list[Alert] = []
        if changed or self.status.diagnosis is None:
            diag = self._analyze(run)
            if diag is not None:
                self.status.run, self.status.diagnosis = run, diag
                alerts += _with_causes(
                    self.book.update(
                        diag.findings, last_step=run.last_step, last_steps=last_steps(run)
                    ),
                    diag,
                )
                for sink in self.sinks:
                    sink.update(run.name, diag)
        step = run.last_step if not run.frame.is_empty() else None
        if step is not None and (self._last_step is None or step > self._last_step):
            if self._last_step is not None and self._advanced_at is not None:
                self._advances.append(now - self._advanced_at)
                # An open stall ends at the first step after the silence.
                alerts += self.book.steps_resumed(_first_after(run, self._last_step))
            else:
                alerts += self.book.steps_resumed(step)  # a restarted watcher: resumed since
            self._last_step, self._advanced_at = step, now
        alerts += self._stall(run, now)
        if alerts:
            hooks = self._hooks_to_run(alerts)
            self.book.save()  # before acting: a watcher killed in a hook repeats nothing
            report = self._write_report()
            # The panel's "last alert": the worst of this poll's (an end only when alone).
            self.status.last_alert = min(
                alerts,
                key=lambda a: (a.event is Event.ENDED, -a.severity.rank, a.finding.sort_key()),
            )
            if self.panel is not None:
                for alert in alerts:
                    self.panel.alert(alert)
            self._act(alerts, hooks, run, report)
        if self.panel is not None:
            self.panel.show(self.status)
        return self._until()

    def _say_once(self, text: str) -> None:
        if text not in self._said:
            self._said.add(text)
            if self.panel is not None:
                self.panel.say(text)

    def _wait_said(self, reason: str) -> None:
        if not self._waiting:  # said once, however the reason changes meanwhile
            self._waiting = True
            self._say_once(f"waiting for a training log: {reason}")

    def _read(self) -> bool:
        """Poll the tail; a missing folder or no log yet is waited for (said once)."""
        try:
            return self.tail.poll()
        except MultipleJobsError as exc:  # waiting would not help: one watcher, one job
            raise ForensicsError(
                f"{self.path} holds {len(exc.jobs)} separate training jobs "
                f"({summarize(exc.jobs)}); point watch at one of them"
            ) from None
        except ForensicsError as exc:
            if self.tail.run is None:
                self._wait_said(str(exc))
            else:
                self._say_once(f"could not read the new records: {exc}; trying again")
            return False
        except Exception as exc:
            if os.environ.get("FORENSICS_DEBUG"):
                raise
            # The next poll reads again from where the tail stands: said once, not fatal.
            self._say_once(
                f"internal error reading the run: {type(exc).__name__}: {exc}; trying again "
                "(set FORENSICS_DEBUG=1 for the traceback)"
            )
            return False

    @property
    def trend_memo(self) -> TrendMemo:
        return self.incremental.memo

    def _analyze(self, run: Run) -> Diagnosis | None:
        try:
            # analyze_run, reusing the last poll's work where that gives the same numbers
            # (forensics.watch.incremental): the poll's cost.
            return self.incremental.analyze(run, self.config)
        except ForensicsError as exc:
            self._say_once(f"analysis skipped on this poll: {exc}")
        except Exception as exc:
            if os.environ.get("FORENSICS_DEBUG"):
                raise
            # A watcher on call stays up: one poll's failure is said, the next poll retries.
            self._say_once(
                f"internal error on this poll: {type(exc).__name__}: {exc} "
                "(set FORENSICS_DEBUG=1 for the traceback)"
            )
        return None

    # -- stall ---------------------------------------------------------------------------
    def stall_limit(self, run: Run) -> float | None:
        """Seconds without a new step that make a stall (None: the pace is not known yet)."""
        if self.settings.stall_after is not None:
            return self.settings.stall_after
        params = self.config.params["stall"]
        if self._pace_of != id(run.frame):  # once per change of the run, not per poll
            self._pace_of, self._logged_gap = id(run.frame), usual_logged_gap(run)
        usual = self._logged_gap
        if usual is None and len(self._advances) >= MIN_OBSERVED:
            usual = statistics.median(self._advances)
        if usual is None:
            return None
        return max(params.factor * usual, params.min_seconds)

    def _stall(self, run: Run, now: float) -> list[Alert]:
        if self._advanced_at is None or self._last_step is None:
            return []
        silence = now - self._advanced_at
        limit = self.stall_limit(run)
        self.status.silence, self.status.stall_limit = silence, limit
        if limit is None or silence <= limit:
            return []
        step = self._last_step
        source = "--stall-after" if self.settings.stall_after is not None else "usual pace"
        finding = Finding(
            kind=FindingKind.STALL,
            severity=Severity.WARNING,
            metric=None,
            start_step=step,
            peak_step=step,
            summary=(
                f"No new step for {_seconds(silence)} after step {step:,} (a stall is "
                f"{_seconds(limit)} by the {source}): the log stopped; the job may hang."
            ),
            measures={
                "source": WATCH,
                "gap_seconds": silence,
                "expected_seconds": limit,
                "ratio": silence / limit if limit > 0 else None,
            },
            judged_against={"stall_after_seconds": limit},
        )
        return self.book.stall(finding)

    # -- outputs and actions -------------------------------------------------------------
    def _write_report(self) -> Path | None:
        diag = self.status.diagnosis
        if self.report_place is None or diag is None:
            return self.status.report
        if self._report_of == id(diag) and self.status.report is not None:
            return self.status.report
        from forensics.atomic import write_atomic
        from forensics.report import render_html

        try:
            target = self.report_place(diag.run)
            write_atomic(target, render_html(diag))
        except ForensicsError as exc:  # a full disk or a refused place: said, watching goes on
            self._say_once(f"report not written: {exc}")
            return None
        self._report_of, self.status.report = id(diag), target
        self._say_once(f"report: {target} (rewritten on each alert)")
        return target

    def _hooks_to_run(self, alerts: list[Alert]) -> list[tuple[str, Alert]]:
        """(command, alert) for each event's first alert at a level that has a hook."""
        out = []
        for alert in sorted(alerts, key=lambda a: a.finding.sort_key()):
            cmd = self.settings.hooks.get(alert.severity)
            if cmd is not None and self.book.claim_action(alert):
                out.append((cmd, alert))
        return out

    def _act(
        self, alerts: list[Alert], hooks: list[tuple[str, Alert]], run: Run, report: Path | None
    ) -> None:
        """The hooks (once per event and level, see AlertBook.claim_action) and the webhook
        for every alert."""
        s = self.settings
        results = []
        if hooks:
            from forensics.watch.actions import run_hook

            for cmd, alert in hooks:
                results.append(
                    run_hook(cmd, alert, run_name=run.name, report=report, timeout=s.hook_timeout)
                )
        if s.webhook is not None:
            from forensics.watch.actions import post_webhook

            for alert in alerts:
                results.append(
                    post_webhook(
                        s.webhook,
                        alert,
                        run_name=run.name,
                        report=report,
                        timeout=s.webhook_timeout,
                    )
                )
        if self.panel is not None:
            for result in results:
                self.panel.action(result)

    def _until(self) -> int | None:
        until, diag = self.settings.until, self.status.diagnosis
        if until is None or diag is None:
            return None
        from forensics.findings import look

        if look(diag.verdict).rank >= until.rank:
            if self.panel is not None:
                self.panel.say(f"the verdict reached {diag.verdict} (--until {until.value})")
            return self.settings.exit_code
        return None


def _with_causes(alerts: list[Alert], diag: Diagnosis) -> list[Alert]:
    """The alerts with their findings' tested causes from this poll's diagnosis (an alert
    for a finding the diagnosis does not hold, an ended one, keeps none)."""
    from dataclasses import replace

    at = {id(f): i for i, f in enumerate(diag.findings)}
    return [
        replace(a, causes=tuple(diag.causes[at[id(a.finding)]])) if id(a.finding) in at else a
        for a in alerts
    ]


def _first_after(run: Run, step: int) -> int:
    """The first logged step after ``step``."""
    steps = run.frame.get_column("step")
    return int(steps.filter(steps > step).min())  # type: ignore[arg-type]


def _seconds(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"
