"""Incidents: findings that share a time window and a cause, read as one event.

A reviewer reads incidents, not detector outputs: four activation-outlier findings for layers
0-3 at the same step, the loss spike and the NaN that follow them, all while the LR is raised
past its schedule, are one blow-up with one cause. :func:`build_incidents` groups the findings:

- two findings with the same supported root cause (the same LR change, the same bad batch,
  resume, pause or validation-set change: :attr:`forensics.causes.Cause.key`) are one incident;
  an LR change that starts at the step a job resumed is that resume's;
- a finding whose supported mechanism is a loss-scale overflow joins the loss_scale_drop
  finding (above info) of that overflow: the collapse and what it drove are one event;
- findings with no supported root that start within :data:`TOUCH_STEPS` of each other are one
  incident (a NaN in the loss and in the grad norm at the same step); so are two onsets up to
  :data:`SPARSE_TOUCH_STEPS` apart when the later sign's series logged no point in between
  (a histogram every 10 steps first shows a change at its next point: the log cannot tell
  the two apart), and two findings above info whose onset ranges meet (a bend fitted on
  bins or between evals is known to about one either side:
  :attr:`forensics.findings.Finding.onset_range`);
- the held-out stages of one overfitting (gap_acceleration, overfitting, eval_regression)
  are one incident when their step spans overlap, unless the log supports different causes
  for them: the gap bends first, often many evals before the held-out loss turns up;
- a group becomes an incident when at least one of its findings is above info; notes (a
  physiological spike) join the incident they belong to and may be its first mover.

Each incident has its signs (vital signs, with layers and finding kinds), its causes (merged
from its findings: supported if any finding's evidence supports it), a timeline whose first
mover includes the control inputs (the LR change, the schedule effect, the resume), and a
``rollback`` slot that :mod:`forensics.rollback` fills (None when the incident needs none).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from forensics.causes import (
    CONTRADICTED,
    CONTROLS,
    ROOTS,
    SUPPORTED,
    UNTESTED,
    Cause,
    supported_mechanisms,
    supported_roots,
)
from forensics.evidence import Evidence
from forensics.evidence.trend_utils import parse_layers, step_before
from forensics.findings import Finding, FindingKind, Severity, step_range
from forensics.schema import LR
from forensics.timeline import Control, Timeline, build_timeline, vital_label

_SPIKES = frozenset(
    {FindingKind.LOSS_SPIKE, FindingKind.GRAD_NORM_SPIKE, FindingKind.LOSS_SCALE_DROP}
)
# What the held-out losses and scores show as a model overfits (joined when they overlap).
_HELD_OUT = frozenset(
    {FindingKind.GAP_ACCELERATION, FindingKind.OVERFITTING, FindingKind.EVAL_REGRESSION}
)
# Findings with no supported root cause are one incident when their onsets are this close.
TOUCH_STEPS = 5
# ... or up to this far apart when the later sign had no logged point between the two onsets.
SPARSE_TOUCH_STEPS = 50


@dataclass(frozen=True)
class Sign:
    """One vital sign in an incident: the kinds it showed, its layers, its first onset."""

    metric: str | None
    label: str
    kinds: tuple[str, ...]
    layers: tuple[int, ...]
    first_step: int
    findings: tuple[int, ...]  # indexes into the diagnosis' findings

    def text(self) -> str:
        """``activation spread (layers 0-3): activation_outlier``."""
        lay = ""
        if self.layers:
            ls = list(self.layers)
            if len(ls) > 2 and ls == list(range(ls[0], ls[-1] + 1)):
                lay = f" (layers {ls[0]}-{ls[-1]})"
            else:
                lay = f" (layer{'s' if len(ls) > 1 else ''} {', '.join(map(str, ls))})"
        return f"{self.label}{lay}: {', '.join(self.kinds)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "label": self.label,
            "kinds": list(self.kinds),
            "layers": list(self.layers),
            "first_step": self.first_step,
            "findings": list(self.findings),
        }


@dataclass
class Incident:
    """Findings that share a time window and a cause.

    Attributes:
        id: ``incident-1``, ``incident-2``... in onset order.
        findings: the member findings, in onset order.
        indexes: their positions in the diagnosis' (and the document's) findings list.
        causes: the incident's causes, merged from its findings' (supported ones first).
        timeline: the members and the control inputs in causal order.
        rollback: filled by the rollback advice (None when the incident needs none).
    """

    id: str
    findings: list[Finding]
    indexes: list[int]
    causes: list[Cause]
    timeline: Timeline
    signs: list[Sign] = field(default_factory=list)
    controls: list[Control] = field(default_factory=list)
    rollback: Any = None
    # Supported control inputs that came after the first sign, by cause id: their clause.
    late: dict[str, str] = field(default_factory=dict)

    @property
    def start_step(self) -> int:
        starts = [f.start_step for f in self.findings]
        first = self.timeline.first
        if first is not None and first.control:
            starts.append(first.step)
        return min(starts)

    @property
    def end_step(self) -> int:
        return max(
            (f.end_step if f.end_step is not None else (f.peak_step or f.start_step))
            for f in self.findings
        )

    @property
    def severity(self) -> Severity:
        return max((f.severity for f in self.findings), key=lambda s: s.rank)

    @property
    def steps(self) -> str:
        return step_range(self.start_step, self.end_step)

    @property
    def supported(self) -> list[Cause]:
        """Supported root causes (control inputs, outside events): what to act on; those that
        came no later than the first sign first (see :meth:`cause_note`)."""
        return sorted(supported_roots(self.causes), key=lambda c: bool(self.cause_note(c)))

    def cause_note(self, c: Cause) -> str:
        """``""``, or a clause for a supported control input (an LR change, a schedule effect,
        a resume) the log shows only after the incident's first sign began: it is supported
        for a later finding (a loss spike at the warm-up's end) and cannot explain what moved
        before it (a loss-scale drop 10 steps earlier). See :func:`build_incidents`."""
        return self.late.get(c.cause, "") if c.status == SUPPORTED else ""

    @property
    def mechanisms(self) -> list[Cause]:
        """Supported mechanisms no supported root explains (an overflow with no known why)."""
        return supported_mechanisms(self.causes)

    def headline(self) -> str:
        """One line: severity, steps, signs, supported cause (the terminal's and the card's)."""
        signs = "; ".join(s.text() for s in self.signs)
        n = len(self.findings)
        if self.supported:
            cause = "cause: " + "; ".join(
                f"{c.text} ({c.evidence}{self.cause_note(c)})" for c in self.supported[:2]
            )
        elif self.mechanisms:
            c = self.mechanisms[0]
            cause = (
                f"no root cause the log can show is supported; mechanism: {c.text} ({c.evidence})"
            )
        else:
            cause = "no cause the log can show is supported"
        return (
            f"{self.severity.value} incident, steps {self.steps}, {n:,} finding"
            f"{'s' if n != 1 else ''}: {signs}. {cause[0].upper() + cause[1:]}."
        )

    def to_dict(self) -> dict[str, Any]:
        index = {id(f): i for f, i in zip(self.findings, self.indexes, strict=True)}
        first = self.timeline.first
        rb = self.rollback
        if rb is not None and hasattr(rb, "to_dict"):
            rb = rb.to_dict()
        return {
            "id": self.id,
            "start_step": self.start_step,
            "end_step": self.end_step,
            "severity": self.severity.value,
            "first_mover": first.to_dict(index) if first is not None else None,
            "order_resolved": self.timeline.order_resolved,
            "signs": [s.to_dict() for s in self.signs],
            "findings": list(self.indexes),
            "causes": [c.to_dict() for c in self.causes],
            "after_first_sign": list(self.late),
            "rollback": rb,
        }


def _keys(f: Finding, causes: Sequence[Cause]) -> set[tuple[str, int]]:
    out: set[tuple[str, int]] = set()
    # A restart and an ongoing grad-norm climb are themselves the causes others are tested for.
    if f.kind is FindingKind.RESTART:
        out.add(("resume", f.start_step))
    if f.kind is FindingKind.GRAD_NORM_DRIFT and f.severity is not Severity.INFO:
        out.add(("grad_norm_climb", f.start_step))
    for c in causes:
        if c.status == SUPPORTED and c.cause in ROOTS:
            out |= c.keys
    return out


def _rooted(keys: set[tuple[str, int]]) -> bool:
    """Does a finding have a supported root cause besides a grad-norm climb?"""
    return any(cause != "grad_norm_climb" for cause, _ in keys)


def _overlap(a: Finding, b: Finding) -> bool:
    """Do two findings' step spans share a step?"""
    a1 = a.start_step if a.end_step is None else a.end_step
    b1 = b.start_step if b.end_step is None else b.end_step
    return a.start_step <= b1 and b.start_step <= a1


def _calibrating(f: Finding) -> bool:
    """The fp16 scaler's first descent at the start of training, judged a note (info): it
    overflows at ordinary gradients until it finds its level, so it is no sign of what
    followed. Joined to an incident it headed it as the first mover (bigscience n16: "the
    loss scale moved first (onset at step 20)" before a warm-up spike and a grad-norm spike,
    and the warm-up's end "came after the first sign, which it does not explain")."""
    return (
        f.kind is FindingKind.LOSS_SCALE_DROP
        and f.severity is Severity.INFO
        and f.measures.get("calibration") is True
    )


def lr_points(ev: Evidence) -> Callable[[int], int | None] | None:
    """The LR's last logged step before a step (None without an LR in the log)."""
    if not ev.has(LR):
        return None

    def before(step: int) -> int | None:
        return step_before(ev.logged(LR).steps, step)

    return before


def _layers_of(f: Finding) -> list[int]:
    """The layers a finding is about: its group ("layers": "0-3") or its one "layer"."""
    group = f.measures.get("layers")
    if isinstance(group, str) and (got := parse_layers(group)):
        return got
    layer = f.measures.get("layer")
    return [int(layer)] if isinstance(layer, int) else []


def previous_points(ev: Evidence) -> Callable[[Finding], int | None]:
    """For a finding, the last step its own series logged before the finding's onset (from
    the evidence's cached series: nothing is read from the run again)."""

    def previous(f: Finding) -> int | None:
        if f.metric is None or not ev.has(f.metric):
            return None
        layer = f.measures.get("layer")
        steps = ev.logged(f.metric, layer if isinstance(layer, int) else None).steps
        return step_before(steps, f.start_step)

    return previous


def build_incidents(
    findings: Sequence[Finding],
    causes: Sequence[Sequence[Cause]],
    previous_point: Callable[[Finding], int | None] | None = None,
    lr_before: Callable[[int], int | None] | None = None,
) -> list[Incident]:
    """Group findings into incidents (see the module's docstring).

    Args:
        findings: the diagnosis' findings (their order gives the indexes).
        causes: each finding's tested causes (:func:`forensics.causes.causes_of`).
        previous_point: a finding's series' last logged step before its onset
            (:func:`previous_points`); without it only :data:`TOUCH_STEPS` joins onsets.
        lr_before: the LR's last logged step before a step (:func:`lr_points`): an LR
            change seen at a step is only known to come after the first sign when the LR was
            also logged, unchanged, at or after that sign's onset.
    """
    n = len(findings)
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        a, b = find(i), find(j)
        if a != b:
            parent[max(a, b)] = min(a, b)

    keys = [_keys(f, c) for f, c in zip(findings, causes, strict=True)]
    # An LR that left its schedule at the very step a job resumed was changed by the resume
    # (a schedule restarted, a new LR in the resumed job's config): one event, not two.
    resumed = {int(f.start_step) for f in findings if f.kind is FindingKind.RESTART}
    for found in keys:
        found |= {("resume", s) for c, s in list(found) if c == "lr_change" and s in resumed}
    owner: dict[tuple[str, int], int] = {}
    for i in range(n):
        for k in keys[i]:
            if k in owner:
                union(owner[k], i)
            else:
                owner[k] = i
    # A loss-scale collapse is one event with what it drove: a finding whose supported
    # mechanism is that collapse (the scale fell to 1 and was still there at its onset) joins
    # the loss_scale_drop finding of that fall, unless the log supports other roots for them.
    # A divergence 200 steps after the scale hit 1 had been an incident of its own, rolled
    # back to the middle of the overflows.
    drops = {
        f.start_step: i
        for i, f in enumerate(findings)
        if f.kind is FindingKind.LOSS_SCALE_DROP
        and f.severity is not Severity.INFO
        and not _calibrating(f)
    }
    for i, c in ((i, c) for i, cs in enumerate(causes if drops else ()) for c in cs):
        j = drops.get(c.anchor) if c.anchor is not None else None
        if (
            j is not None
            and c.cause == "loss_scale_overflow"
            and c.status == SUPPORTED
            and not (_rooted(keys[i]) and _rooted(keys[j]) and not keys[i] & keys[j])
        ):
            union(i, j)
    # Periodic spikes are one recurring event: each spike they list belongs to them.
    for i, f in enumerate(findings):
        if f.kind is not FindingKind.PERIODIC_SPIKES:
            continue
        raw = f.measures.get("spike_steps")  # (the first 20 only: events_at holds them all)
        steps = (
            set(f.events_at)
            if f.events_at is not None
            else {int(x) for x in str(raw).split(",") if x.strip()}
            if raw
            else set()
        )
        near = {s + d for s in steps for d in (-1, 0, 1)}
        for j, g in enumerate(findings):
            if g.kind in _SPIKES and ({g.start_step, g.peak_step or g.start_step} & near):
                union(i, j)
    # The held-out stages of one overfitting: the gap widens faster, then the held-out loss
    # turns up and the eval scores slip, often many evals apart (a Keras run's gap bent ten
    # epochs before its val loss rose). Overlapping in time, they are one incident, unless
    # the log supports different causes for them.
    held_out = [i for i, f in enumerate(findings) if f.kind in _HELD_OUT]
    for a, i in enumerate(held_out):
        for j in held_out[a + 1 :]:
            if keys[i] and keys[j] and not keys[i] & keys[j]:
                continue
            if _overlap(findings[i], findings[j]):
                union(i, j)
    order = sorted(range(n), key=lambda i: findings[i].start_step)
    before_onset: dict[int, int | None] = {}
    for a, i in enumerate(order):
        for b in range(a + 1, n):  # (indexes: a slice per finding would copy the rest of it)
            j = order[b]
            apart = findings[j].start_step - findings[i].start_step
            if apart > (SPARSE_TOUCH_STEPS if previous_point else TOUCH_STEPS):
                break
            if apart > TOUCH_STEPS:
                assert previous_point is not None
                if j not in before_onset:
                    before_onset[j] = previous_point(findings[j])
                before = before_onset[j]
                if before is None or before > findings[i].start_step:
                    continue  # the later sign was logged in between: two moments
            if keys[i] and keys[j] and not keys[i] & keys[j]:
                continue  # two events with different causes at nearly the same step
            if findings[i].kind is FindingKind.TRUNCATED_LOG or (
                findings[j].kind is FindingKind.TRUNCATED_LOG
            ):
                continue  # how the log ends is not part of what happened in training
            if _calibrating(findings[i]) or _calibrating(findings[j]):
                continue  # nor is the scaler finding its level at the start (see _calibrating)
            if findings[i].events_at is not None or findings[j].events_at is not None:
                continue  # many events (absorbed outliers, periodic spikes): its first is no onset
            union(i, j)
    # Two signs that call for action and whose onsets cannot be ordered (one of them a fitted
    # bend whose range holds the other's onset) are one moment too: a
    # memory climb fitted to start at step 11,990 and a throughput drop at 12,000 in a log
    # written every step were two incidents, "the memory moved first".
    # Not into an incident whose root the log supports (an LR change, a bad batch, a resume):
    # a throughput dip inside a fitted range is not thereby part of an LR blow-up. A
    # grad-norm climb's own key is no such root: it is the sign others may follow.
    acting = [i for i in order if findings[i].severity is not Severity.INFO]
    bounds = [findings[i].onset_bounds for i in acting]
    # (in onset order, a later sign's range reaches back over an earlier one's latest step only
    # from its own onset at or before that step, or from a fitted range that starts before its
    # onset: those few are checked apart, and the rest of the pairs never looked at; every pair
    # took 5.2 s of 6,665 warnings)
    reaching = [b for b, (lo, _) in enumerate(bounds) if lo < findings[acting[b]].start_step]
    for a, i in enumerate(acting):
        hi = bounds[a][1]
        later = []
        for b in range(a + 1, len(acting)):
            if findings[acting[b]].start_step > hi:
                break
            later.append(b)
        later += [b for b in reaching if b > a and findings[acting[b]].start_step > hi]
        for b in later:
            j = acting[b]
            if bounds[b][0] > hi:
                continue
            if (_rooted(keys[i]) or _rooted(keys[j])) and not keys[i] & keys[j]:
                continue
            if FindingKind.TRUNCATED_LOG in (findings[i].kind, findings[j].kind):
                continue
            union(i, j)
    groups: dict[int, list[int]] = {}
    for i in order:
        groups.setdefault(find(i), []).append(i)
    out: list[Incident] = []
    for members in sorted(groups.values(), key=lambda m: findings[m[0]].start_step):
        if all(findings[i].severity is Severity.INFO for i in members):
            continue
        fs = [findings[i] for i in members]
        merged = merge_causes([causes[i] for i in members])
        has_restart = any(f.kind is FindingKind.RESTART for f in fs)
        controls = [
            Control(
                c.cause,
                "lr" if c.cause.startswith("lr") else None,
                c.steps[0],
                c.evidence.split("; ")[0],  # the change itself, not how it relates to one onset
            )
            for c in merged
            if c.status == SUPPORTED
            and c.cause in CONTROLS
            and c.steps
            and not (c.cause == "resume" and has_restart)
        ]
        timeline = build_timeline(fs, controls, include_info=True, previous_point=previous_point)
        out.append(
            Incident(
                f"incident-{len(out) + 1}",
                fs,
                list(members),
                merged,
                timeline,
                _signs(fs, members),
                controls,
                late=_late_controls(fs, merged, lr_before),
            )
        )
    return out


def _late_controls(
    fs: Sequence[Finding], merged: Sequence[Cause], lr_before: Callable[[int], int | None] | None
) -> dict[str, str]:
    """The supported control inputs the log shows only after the first finding's onset, and
    the clause that says so. A resume at a later step is later; an LR change seen at step s
    is later when the LR was logged at or after the onset before s (in a log written every 10
    steps, a warm-up end seen at step 30 after a point at step 20 came after a drop seen at
    step 20). Other roots (a bad batch) start with the findings they explain: never."""
    first = min(fs, key=lambda f: f.start_step)
    out: dict[str, str] = {}
    for c in merged:
        if c.status != SUPPORTED or c.cause not in CONTROLS or not c.steps:
            continue
        at = c.steps[0]
        latest = first.onset_bounds[1]  # (a first onset fitted on bins may lie up to here)
        if at <= latest:
            continue
        if c.cause != "resume":
            before = lr_before(at) if lr_before is not None else None
            if before is None or before < latest:
                continue  # the change may have come at or before the first sign
        sign = vital_label(first.metric) if first.metric else first.kind.value
        out[c.cause] = (
            f"; it came after the first sign ({sign}, from step {first.start_step:,}), which it "
            "does not explain"
        )
    return out


def run_timeline(
    incidents: Sequence[Incident],
    findings: Sequence[Finding],
    previous_point: Callable[[Finding], int | None] | None = None,
) -> Timeline:
    """The run's timeline: every incident's findings and control inputs in causal order
    (the findings that call for action when the run has no incident). ``previous_point``:
    as :func:`build_incidents` takes it (a later onset the log cannot order is said so)."""
    if not incidents:
        return build_timeline(list(findings), previous_point=previous_point)
    members = [f for inc in incidents for f in inc.findings]
    controls = [c for inc in incidents for c in inc.controls]
    return build_timeline(members, controls, include_info=True, previous_point=previous_point)


def merge_causes(per_finding: Sequence[Sequence[Cause]]) -> list[Cause]:
    """One list for several findings: a cause is supported when any finding's evidence
    supports it (the earliest such evidence is kept), contradicted when tested and never
    supported, untested otherwise."""
    best: dict[tuple[str, str], Cause] = {}
    rank = {SUPPORTED: 0, CONTRADICTED: 1, UNTESTED: 2}
    for cs in per_finding:
        for c in cs:
            k = (c.cause, c.text)
            old = best.get(k)
            if old is None or rank[c.status] < rank[old.status]:
                best[k] = c
            elif c.status == old.status == SUPPORTED and c.consequence_of is None:
                if old.consequence_of is not None:
                    best[k] = c
    out = list(best.values())
    # A mechanism is a consequence in the incident when it is one for any finding.
    conseq = {
        c.cause: c.consequence_of
        for cs in per_finding
        for c in cs
        if c.status == SUPPORTED and c.consequence_of is not None
    }
    out = [
        Cause(c.cause, c.status, c.evidence, c.steps, c.text, conseq[c.cause], c.anchor)
        if c.status == SUPPORTED and c.consequence_of is None and c.cause in conseq
        else c
        for c in out
    ]
    order = {SUPPORTED: 0, CONTRADICTED: 1, UNTESTED: 2}
    return sorted(
        out, key=lambda c: (order[c.status], c.consequence_of is not None, c.cause == "article")
    )


def _signs(fs: Sequence[Finding], members: Sequence[int]) -> list[Sign]:
    by: dict[str | None, list[tuple[Finding, int]]] = {}
    for f, i in zip(fs, members, strict=True):
        by.setdefault(f.metric, []).append((f, i))
    out = []
    for metric, items in by.items():
        kinds: list[str] = []
        for f, _ in items:
            if f.kind.value not in kinds:
                kinds.append(f.kind.value)
        layers = sorted({n for f, _ in items for n in _layers_of(f)})
        out.append(
            Sign(
                metric,
                vital_label(metric),
                tuple(kinds),
                tuple(layers),
                min(f.start_step for f, _ in items),
                tuple(i for _, i in items),
            )
        )
    return sorted(out, key=lambda s: s.first_step)


__all__ = ["Incident", "Sign", "build_incidents", "merge_causes", "run_timeline"]
