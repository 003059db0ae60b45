"""The one-screen terminal summary: verdict with its light, the top findings, where the report is."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from forensics.diagnosis import Diagnosis

# The article's traffic lights (6.3) and the colours the terminal shows them in.
LIGHTS = {
    "healthy": ("green light", "green"),
    "info": ("note", "blue"),
    "warning": ("yellow light", "yellow"),
    "critical": ("orange light", "dark_orange"),
    "fatal": ("red light", "red"),
}
TOP_N = 5
_NOTES_FIRST = {"loss_spike", "restart", "truncated_log", "crash", "plateau", "loss_scale_drop"}


def print_summary(
    diagnosis: Diagnosis, *, report_path: Path | None = None, console: Console | None = None
) -> None:
    """Print the verdict, the most severe findings with their steps, and the report's location."""
    from rich.console import Console
    from forensics.terminal import escape
    from rich.table import Table

    console = console or Console()
    run = diagnosis.run
    light, colour = LIGHTS[diagnosis.verdict]
    # Every string from the log goes through escape(): "[bold]" in a tag must not style text.
    console.print(
        f"[bold]{escape(run.name)}[/bold]  steps {run.first_step:,}-{run.last_step:,}  "
        f"[{colour} bold]{diagnosis.verdict.upper()}[/] ({light})"
    )
    ranked = [f for f in diagnosis.ranked() if f.severity.value != "info"]
    # Notes about the loss and the job itself first, then the rest in step order.
    notes = sorted(
        (f for f in diagnosis.findings if f.severity.value == "info"),
        key=lambda f: (f.kind.value not in _NOTES_FIRST, f.start_step),
    )
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
            steps = f"{f.start_step:,}" + (
                f"-{f.end_step:,}" if f.end_step is not None and f.end_step != f.start_step else ""
            )
            table.add_row(
                f"[{LIGHTS[f.severity.value][1]}]{f.severity.value}[/]",
                f.kind.value,
                steps,
                escape(f.summary),
            )
        console.print(table)
        if len(ranked) > TOP_N:
            console.print(f"... and {len(ranked) - TOP_N} more finding(s) in the report.")
    if diagnosis.timeline is not None and diagnosis.timeline.movers:
        console.print(escape(diagnosis.timeline.sentence(limit=2)))
    # The earliest event's advice: going back before it also covers every later one.
    for rb in [r for r in diagnosis.rollbacks if r.rollback and r.checkpoint_step is not None][:1]:
        console.print(
            f"Roll back to the checkpoint at step {rb.checkpoint_step:,} "
            f"(last healthy step {rb.last_healthy_step:,}, before the {rb.finding.kind.value} "
            f"at step {rb.finding.start_step:,}); learning rate {rb.lr_cut_text}."
        )
    hidden = len(notes) - len([f for f in shown if f.severity.value == "info"])
    if hidden:
        console.print(f"[dim]{hidden} more informational note(s) in the report.[/dim]")
    if report_path is not None:
        console.print(f"Report: {escape(str(report_path))}")
