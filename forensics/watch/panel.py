"""What the watcher prints: a live panel on a terminal, plain lines elsewhere, alerts only
with ``--quiet``.

The live panel has one line per vital sign (its light and last value), the stall clock and
the last alert. Off a terminal (a pipe, a log file, a service's journal) the same facts are
plain lines: an alert per line, and a status line whenever the run's last step moves. Messages
about the watcher itself (waiting for a log, a failed hook) go to stderr.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Protocol

from forensics.findings import Severity, look
from forensics.schema import PER_LAYER
from forensics.terminal import escape, safe
from forensics.watch.alerts import Alert, Event

if TYPE_CHECKING:
    from rich.console import Console
    from rich.live import Live

    from forensics.diagnosis import Diagnosis
    from forensics.run import Run
    from forensics.watch.engine import Status


class Panel(Protocol):
    def say(self, text: str) -> None: ...

    def alert(self, alert: Alert) -> None: ...

    def action(self, result: Any) -> None: ...

    def show(self, status: Status) -> None: ...

    def close(self) -> None: ...


def _clock() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def alert_line(alert: Alert) -> str:
    """``FATAL new nan_inf (loss) at step 37: The loss is nan from step 37 ...``."""
    f = alert.finding
    what = f.kind.value + (f" ({f.metric})" if f.metric else "")
    group, layer = f.measures.get("layers"), f.measures.get("layer")
    if isinstance(group, str) and not group.isdigit():
        what += f" layers {group}"  # a layer group ("0-3")
    elif layer is not None:
        what += f" layer {layer}"
    if alert.event is Event.ENDED:
        span = f"steps {f.start_step:,}-{f.end_step:,}" if f.end_step else f"step {f.start_step:,}"
        return safe(f"ENDED {what} {span}: {f.summary}")
    head = f"{f.severity.value.upper()} {alert.event.value}"
    if alert.event is Event.ESCALATED and alert.previous is not None:
        head += f" from {alert.previous.value}"
    return safe(f"{head} {what} at step {f.start_step:,}: {f.summary}{alert.cause_text()}")


def action_line(result: Any) -> str | None:
    """A line for a hook or webhook that failed (None when it went well)."""
    if getattr(result, "ok", True):
        return None
    return safe(f"action failed: {getattr(result, 'detail', result)}")


def _number(v: float) -> str:
    from forensics.evidence.trend_utils import num

    return num(v) if v == v and abs(v) != float("inf") else str(v)


def vitals(run: Run, diag: Diagnosis | None) -> list[tuple[str, str, str]]:
    """(sign, severity or ``healthy``, last value) per logged vital sign, in the run's order."""
    worst: dict[str, Severity] = {}
    for f in diag.findings if diag is not None else []:
        key = f.metric or "run"
        if f.severity is not Severity.INFO and (
            key not in worst or f.severity.rank > worst[key].rank
        ):
            worst[key] = f.severity
    rows = []
    for sign in run.metrics():
        if sign in PER_LAYER:
            value = f"{len(run.layers(sign))} layers"
        else:
            s = run.series(sign)
            value = _number(float(s.get_column("value")[-1])) if s.height else "-"
            if s.height and (unit := run.unit(sign)):
                value += f" {unit}"
            value += f" at step {int(s.get_column('step')[-1]):,}" if s.height else ""
        rows.append((sign, worst[sign].value if sign in worst else "healthy", value))
    if "run" in worst:
        rows.append(("run", worst["run"].value, "job-level findings"))
    return rows


def _blind(run: Run) -> str | None:
    """What a run with series but no vital sign shows in place of a verdict (a green light
    there would judge nothing): the series it has and how to map one. None otherwise."""
    from forensics.pipeline import blind_tags, listed

    tags = blind_tags(run)
    if not tags:
        return None
    return f"no vital sign recognised yet ({listed(tags)}): map one with --alias RAW=CANONICAL"


def status_line(status: Status) -> str:
    run, diag = status.run, status.diagnosis
    if run is None:
        return "no log yet"
    blind = _blind(run)
    if blind is not None:
        return safe(f"step {run.last_step:,}  {blind}")
    verdict = diag.verdict if diag is not None else "?"
    signs = "  ".join(
        f"{sign} {value.split(' at step')[0]}"
        for sign, _, value in vitals(run, diag)
        if sign not in PER_LAYER and sign != "run"
    )
    return safe(f"step {run.last_step:,}  {verdict}  {signs}")


class LinePanel:
    """Plain lines (not a terminal), or alerts only (``quiet``)."""

    def __init__(self, *, quiet: bool = False) -> None:
        self.quiet = quiet
        self._last_step: int | None = None

    def _out(self, text: str) -> None:
        sys.stdout.write(f"{_clock()} {text}\n")
        sys.stdout.flush()

    def say(self, text: str) -> None:
        sys.stderr.write(f"forensics watch: {safe(text)}\n")
        sys.stderr.flush()

    def alert(self, alert: Alert) -> None:
        self._out(alert_line(alert))

    def action(self, result: Any) -> None:
        line = action_line(result)
        if line is not None:
            self.say(line)

    def show(self, status: Status) -> None:
        if self.quiet or status.run is None:
            return
        step = status.run.last_step
        if step != self._last_step:
            self._last_step = step
            self._out(status_line(status))

    def close(self) -> None:
        sys.stdout.flush()


class LivePanel:
    """The terminal panel: redrawn after every poll, alerts printed above it."""

    def __init__(self, path: str, console: Console | None = None) -> None:
        from rich.console import Console
        from rich.live import Live

        self.path = path
        self.console = console or Console()
        self.live: Live = Live(console=self.console, auto_refresh=False, transient=False)
        self.live.start()
        self.note = ""

    def say(self, text: str) -> None:
        self.note = text
        self.live.console.print(f"[dim]{escape(text)}[/dim]", highlight=False)

    def alert(self, alert: Alert) -> None:
        term = look(alert.severity.value).term if alert.event is not Event.ENDED else "green"
        self.live.console.print(
            f"[{term}]{escape(_clock())} {escape(alert_line(alert))}[/]", highlight=False
        )

    def action(self, result: Any) -> None:
        line = action_line(result)
        if line is not None:
            self.live.console.print(f"[red]{escape(line)}[/red]", highlight=False)

    def show(self, status: Status) -> None:
        self.live.update(self._render(status), refresh=True)

    def _render(self, status: Status) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        run, diag = status.run, status.diagnosis
        if run is None:
            return Text(f"watching {self.path}: no log yet", style="dim")
        blind = _blind(run)
        if blind is not None:
            return Text(
                f"{run.name}  step {run.last_step:,}  NO VITAL SIGN: {blind}", overflow="fold"
            )
        verdict = diag.verdict if diag is not None else "healthy"
        lk = look(verdict)
        head = Text.from_markup(
            f"[bold]{escape(run.name)}[/bold]  step {run.last_step:,}  "
            f"[{lk.term} bold]{verdict.upper()}[/] ({lk.light} light)  "
            f"[dim]poll {status.polls}, last new step {status.silence:.0f} s ago"
            + (f", stall at {status.stall_limit:.0f} s" if status.stall_limit else "")
            + "[/dim]"
        )
        table = Table(box=None, show_header=False, pad_edge=False)
        table.add_column("light")
        table.add_column("sign")
        table.add_column("last value", justify="right")
        for sign, severity, value in vitals(run, diag):
            lk = look(severity)
            table.add_row(f"[{lk.term}]\u25cf {lk.light}[/]", escape(sign), escape(value))
        parts: list[Any] = [head, table]
        unjudged = diag.unjudged() if diag is not None else None
        if unjudged:  # what the light does not cover (a clipped grad norm, no training loss)
            parts.insert(1, Text(unjudged, style="yellow", overflow="fold"))
        if status.last_alert is not None:
            parts.append(Text(f"last alert: {alert_line(status.last_alert)}", overflow="fold"))
        if status.report is not None:
            parts.append(Text(f"report: {status.report}", style="dim"))
        return Group(*parts)

    def close(self) -> None:
        self.live.stop()


def make_panel(path: str, *, quiet: bool) -> Panel:
    """The live panel on a terminal, plain lines elsewhere, alerts only when ``quiet``."""
    if quiet or not sys.stdout.isatty():
        return LinePanel(quiet=quiet)
    return LivePanel(path)
