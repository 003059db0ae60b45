"""Which vital sign moved first: the order in time of the findings.

The article's core diagnostic skill is reading the order of events (section 2.4): a grad
norm that climbs thousands of steps before the loss follows tells a different story from a
loss spike with a loss-scale drop at the same step. The timeline orders the findings that
call for action by onset and says, per vital sign, how many steps after the first mover it
moved.
"""

from __future__ import annotations

from dataclasses import dataclass

from forensics.findings import Finding, Severity, steps_text
from forensics.prescriptions import needs_action

_LABELS = {
    "loss": "training loss",
    "val_loss": "validation loss",
    "grad_norm": "gradient norm",
    "grad_norm_clipped": "clipped gradient norm",
    "param_norm": "parameter norm",
    "lr": "learning rate",
    "loss_scale": "loss scale",
    "throughput": "throughput",
    "step_time": "step time",
    "memory": "memory",
    "grad_norm_layer": "per-layer gradient norms",
    "param_norm_layer": "per-layer parameter norms",
    "act_mean": "activation means",
    "act_std": "activation spread",
    "act_absmax": "activation maxima",
    None: "job",  # run-level findings (crash, stall, restart) have no vital sign
}


def vital_label(metric: str | None) -> str:
    """A readable name for a canonical vital sign (eval metrics keep their own name)."""
    if metric in _LABELS:
        return _LABELS[metric]
    if metric and metric.startswith("eval/"):
        return "eval " + metric[5:]
    return str(metric)


@dataclass(frozen=True)
class Mover:
    """The first onset of trouble in one vital sign."""

    metric: str | None
    label: str
    step: int
    lag: int  # steps after the first mover
    finding: Finding


@dataclass(frozen=True)
class Timeline:
    """Findings that call for action, in onset order, and the order the vital signs moved."""

    events: list[Finding]
    movers: list[Mover]

    @property
    def first(self) -> Mover | None:
        return self.movers[0] if self.movers else None

    def sentence(self, limit: int | None = None) -> str:
        """One sentence for the report and the terminal: who moved first, who followed when.

        ``limit`` caps the followers named (the terminal shows three).
        """
        if not self.movers:
            return "No vital sign left its normal range."
        head = self.movers[0]
        text = (
            f"The {head.label} moved first (onset at step {head.step:,}, {head.finding.kind.value})"
        )
        if len(self.movers) == 1:
            return text + "."
        parts = []
        followers = self.movers[1:] if limit is None else self.movers[1 : 1 + limit]
        for m in followers:
            when = "at the same step" if m.lag == 0 else f"{steps_text(m.lag)} later"
            parts.append(f"the {m.label} {when} (step {m.step:,}, {m.finding.kind.value})")
        rest = len(self.movers) - 1 - len(followers)
        tail = f" and {rest} more" if rest > 0 else ""
        return text + "; then " + ", ".join(parts) + tail + "."


def build_timeline(findings: list[Finding]) -> Timeline:
    """Order actionable findings by onset; fall back to every non-info finding if none."""
    events = [f for f in findings if needs_action(f)]
    if not events:
        events = [f for f in findings if f.severity is not Severity.INFO]
    events = sorted(events, key=Finding.sort_key)
    movers: list[Mover] = []
    seen: set[str | None] = set()
    for f in events:
        if f.metric in seen:
            continue
        seen.add(f.metric)
        lag = f.start_step - events[0].start_step
        movers.append(Mover(f.metric, vital_label(f.metric), f.start_step, lag, f))
    return Timeline(events, movers)
