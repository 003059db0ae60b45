"""The one-screen terminal summary: the verdict and its light, the top findings, the report."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from forensics.findings import (
    Finding,
    Severity,
    finding_steps,
    look,
    notes_in_reading_order,
    step_range,
)

if TYPE_CHECKING:
    from rich.console import Console

    from forensics.diagnosis import Diagnosis
    from forensics.incidents import Incident

TOP_N = 5
MAX_INCIDENTS = 3
MAX_READ_NOTES = 3


def print_summary(
    diagnosis: Diagnosis,
    *,
    report_path: Path | None = None,
    console: Console | None = None,
    read_notes: int = 0,
) -> None:
    """Print the verdict, the most severe findings with their steps, and the report's location.

    ``read_notes``: how many of the run's first notes reading the logs made (a skipped line,
    a value not used, a copy of the history left aside); they are printed under the verdict,
    so that data left out is said where the verdict is read, not only in the report."""
    from rich.console import Console
    from rich.table import Table

    from forensics.terminal import escape

    console = console or Console()
    run = diagnosis.run
    lk = look(diagnosis.verdict)  # the article's traffic light (6.3)
    light = f"{lk.light} light"
    # Every string from the log goes through escape(): "[bold]" in a tag must not style text.
    console.print(
        f"[bold]{escape(run.name)}[/bold]  "
        f"{run.x_unit}s {step_range(run.first_step, run.last_step)}  "
        f"[{lk.term} bold]{diagnosis.verdict.upper()}[/] ({light})"
    )
    blind = diagnosis.unjudged()
    if blind:
        console.print(f"[yellow]{escape(blind)}[/yellow]")
    unit = diagnosis.x_unit_note()
    if unit:
        console.print(escape(unit))
    for line in read_note_lines(run.notes[:read_notes]):
        console.print(f"[dim]{escape(line)}[/dim]")
    ranked = [f for f in diagnosis.ranked() if f.severity is not Severity.INFO]
    notes = notes_in_reading_order(diagnosis.findings)
    # Fill the screen's spare rows with notes (a physiological spike, a restart): they tell
    # the user the tool did look at those events.
    shown = ranked[:TOP_N] + notes[: max(0, TOP_N - len(ranked))]
    if not ranked:
        console.print("No warning, critical or fatal finding.")
    if shown:
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        table.add_column("severity")
        table.add_column("kind")
        table.add_column("steps", justify="right")
        table.add_column("what happened", overflow="fold")
        for f in shown:
            table.add_row(
                f"[{f.severity.look.term}]{f.severity.value}[/]",
                f.kind.value,
                finding_steps(f),
                escape(f.summary),
            )
        console.print(table)
        if len(ranked) > TOP_N:
            console.print(f"... and {len(ranked) - TOP_N:,} more finding(s) in the report.")
    # Incidents: the findings of one window and cause, with the cause the log supports.
    for inc in diagnosis.incidents[:MAX_INCIDENTS]:
        console.print(f"[{inc.severity.look.term}]{escape(inc.id)}[/] {escape(incident_line(inc))}")
    if len(diagnosis.incidents) > MAX_INCIDENTS:
        console.print(
            f"... and {len(diagnosis.incidents) - MAX_INCIDENTS:,} more incident(s) in the report."
        )
    if diagnosis.timeline is not None and diagnosis.timeline.movers:
        console.print(escape(diagnosis.order_sentence(limit=2)))
    # The earliest event's advice: going back before it also covers every later one.
    plans = [r for r in diagnosis.rollbacks if r.rollback][:1]
    for rb in plans:
        console.print(escape(rb.sentence()))  # forensics.rollback words the plan
        if rb.commands_text():
            console.print(escape(rb.commands_text() or ""))
    if not plans:
        # No rollback to advise (a drift, a slowdown, a leak): the most severe finding's
        # prescription, so that the screen does not end on a diagnosis without a next step.
        advice = diagnosis.what_to_do(ranked)
        if advice is not None:
            console.print(f"What to do ({escape(advice.where)}): {escape(advice.text)}")
    on_screen = {id(f) for f in shown}
    hidden = [f for f in notes if id(f) not in on_screen]
    if hidden:
        # By kind: "4,810 more" alone does not say whether they are one flood of absorbed
        # grad-norm spikes or a dozen different events worth opening the report for.
        console.print(f"[dim]{escape(hidden_notes_line(hidden))}[/dim]")
    if report_path is not None:
        console.print(f"Report: {escape(str(report_path))}")


def read_note_lines(notes: list[str]) -> list[str]:
    """``Input: <note>`` for the first notes of the reading, then how many more the report
    lists."""
    lines = [f"Input: {n}" for n in notes[:MAX_READ_NOTES]]
    if len(notes) > MAX_READ_NOTES:
        lines.append(
            f"... and {len(notes) - MAX_READ_NOTES:,} more note(s) on the input in the report."
        )
    return lines


def hidden_notes_line(hidden: list[Finding]) -> str:
    """``5 more informational note(s) in the report: 4 loss_spike, 1 grad_norm_outliers.``
    (kinds by count, most first; past three, "and N of K other kinds")."""
    counts = Counter(f.kind.value for f in hidden).most_common()
    parts = [f"{n:,} {kind}" for kind, n in counts[:3]]
    if len(counts) > 3:
        rest = sum(n for _, n in counts[3:])
        parts.append(f"{rest:,} of {len(counts) - 3} other kind(s)")
    return f"{len(hidden):,} more informational note(s) in the report: {', '.join(parts)}."


def incident_line(inc: Incident) -> str:
    """``fatal, steps 501-1,000, 12 findings (signs); cause: ... (supported: evidence)``."""
    signs = ", ".join(s.text().split(":")[0] for s in inc.signs)
    n = len(inc.findings)
    head = (
        f"{inc.severity.value}, steps {inc.steps}, {n:,} finding{'s' if n != 1 else ''} ({signs})"
    )
    roots = inc.supported
    if roots:
        c = roots[0]
        more = f" (+{len(roots) - 1} more supported)" if len(roots) > 1 else ""
        return f"{head}; cause (supported): {c.text}: {c.evidence}{inc.cause_note(c)}{more}."
    if inc.mechanisms:
        c = inc.mechanisms[0]
        return (
            f"{head}; no root cause the log can show is supported; mechanism (supported): "
            f"{c.text}: {c.evidence}."
        )
    return f"{head}; no cause the log can show is supported."
