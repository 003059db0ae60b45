"""Which vital sign moved first: the order in time of the findings.

The article's core diagnostic skill is reading the order of events (section 2.4): a grad
norm that climbs thousands of steps before the loss follows tells a different story from a
loss spike with a loss-scale drop at the same step. The timeline orders findings by onset
and says, per vital sign, how many steps after the first mover it moved.

An incident's timeline (:mod:`forensics.incidents`) holds every finding of the incident, notes
included, and the control inputs its supported causes name (an LR change, an LR schedule
effect, a resume): the first mover is then often the LR, not the vital sign that reacted.
At equal onsets the causal order decides: a control input, then the loss scale, the gradient
norm, the parameter norm, the loss, then the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from forensics.findings import Finding, FindingKind, Severity, steps_text, turned_between
from forensics.prescriptions import needs_action

_LABELS = {
    "loss": "training loss",
    "val_loss": "validation loss",
    "grad_norm": "gradient norm",
    "grad_norm_clipped": "clipped gradient norm",
    "param_norm": "parameter norm",
    "lr": "learning rate",
    "loss_scale": "loss scale",
    "nan_iters": "iterations with a NaN loss",
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


# Causal order at equal onsets: what the trainer changed, then the loss scale (an overflow is
# seen on the scale first), the gradient, the weights, the loss, everything else.
_CAUSAL = {
    "loss_scale": 1,
    "grad_norm": 2,
    "grad_norm_clipped": 2,
    "grad_norm_layer": 2,
    "param_norm": 3,
    "param_norm_layer": 3,
    "loss": 4,
}


def causal_rank(metric: str | None, control: bool = False) -> int:
    """0 for a control input, then loss scale, grad norm, param norm, loss, the rest (5)."""
    return 0 if control else _CAUSAL.get(metric or "", 5)


def _finding_rank(f: Finding) -> int:
    # A restart (a resume) or a restarted LR schedule is what the trainer did: a control
    # input, first at its step.
    return causal_rank(f.metric, control=f.kind in (FindingKind.RESTART, FindingKind.LR_RESTART))


@dataclass(frozen=True)
class Control:
    """A control input near an incident: what the trainer changed (from a supported cause)."""

    cause: str  # lr_change | lr_schedule | resume (forensics.causes.CONTROLS)
    metric: str | None  # "lr" for the LR, None for a resume (the job)
    step: int
    text: str  # the cause's evidence


@dataclass(frozen=True)
class Mover:
    """The first onset of trouble in one vital sign (or a control input)."""

    metric: str | None
    label: str
    step: int
    lag: int  # steps after the first mover
    finding: Finding | None  # None for a control input
    kind: str = ""  # the finding's kind, or the control input's cause id
    text: str = ""  # a control input's evidence
    # Why the log cannot order this later onset after the first mover's (empty: it can): an
    # onset estimated from binned points may lie on the other side of the other (``"range"``:
    # the two onsets' ranges meet), and/or its series logged no point between the two
    # (``"no_point"``)
    unordered_by: tuple[str, ...] = ()
    onset_range: tuple[int, int] | None = None  # the finding's (Finding.onset_range)

    @property
    def unordered(self) -> bool:
        return bool(self.unordered_by)

    @property
    def control(self) -> bool:
        return self.finding is None

    def to_dict(self, index: dict[int, int] | None = None) -> dict[str, object]:
        """The mover in the findings document (``finding``: its index, None for a control)."""
        idx = None
        if self.finding is not None and index is not None:
            idx = index.get(id(self.finding))
        return {
            "kind": self.kind,
            "metric": self.metric,
            "label": self.label,
            "step": self.step,
            "control": self.control,
            "finding": idx,
        }


@dataclass(frozen=True)
class Timeline:
    """Findings that call for action, in onset order, and the order the vital signs moved."""

    events: list[Finding]
    movers: list[Mover]

    @property
    def first(self) -> Mover | None:
        return self.movers[0] if self.movers else None

    @property
    def order_resolved(self) -> bool:
        """False when the log cannot tell the first mover's onset from the next one's (their
        ranges meet, the next logged nothing in between, or both moved at the same step)."""
        return len(self.movers) < 2 or not (self.movers[1].unordered or self.tied)

    @property
    def tied(self) -> list[Mover]:
        """The signs that moved at the first mover's own step, where that is a sign, not what
        the trainer did: the log cannot order them (the first is first by the causal
        convention only, so the sentence does not call it first)."""
        if not self.movers or _is_control(self.movers[0]):
            return []
        out = []
        for m in self.movers[1:]:
            if m.lag != 0 or m.unordered:
                break
            out.append(m)
        return out

    def sentence(self, limit: int | None = None) -> str:
        """One sentence for the report and the terminal: who moved first, who followed when.

        ``limit`` caps the followers named (the terminal shows three).
        """
        if not self.movers:
            return "No vital sign left its normal range."
        head = self.movers[0]
        tied = self.tied
        if tied:
            return self._tied_sentence(head, tied, limit)
        text = f"The {head.label} moved first (onset at step {head.step:,}, {_what(head)})"
        if len(self.movers) > 1 and self.movers[1].unordered:
            text = f"The {head.label}'s onset is the earliest (step {head.step:,}, {_what(head)})"
        if len(self.movers) == 1:
            # (nothing followed: "moved first" would promise a second sign, and "moved" misreads
            # a loss that never fell)
            # (a fitted bend's range too: no follower's sentence will name it)
            rng = head.onset_range
            where = (
                ","
                if rng is None
                else f", turned after it and by step {rng[1]:,};"
                if turned_between(head.step, rng)
                else f", anywhere in {rng[0]:,}-{rng[1]:,};"
            )
            onset = f"onset at step {head.step:,}{where} {_what(head)}"
            return f"Only one sign: the {head.label} ({onset})."
        return text + _then(head, self.movers[1:], limit)

    def _tied_sentence(self, head: Mover, tied: list[Mover], limit: int | None) -> str:
        """The sentence of signs tied at the first step ("The gradient norm (...) and the
        training loss (...) moved at the same step, 1,500: the log cannot tell which moved
        first"), then the later signs as :meth:`sentence` names them."""
        signs = [f"the {m.label} ({_what(m)})" for m in (head, *tied)]
        both = ", ".join(signs[:-1]) + " and " + signs[-1]
        text = f"{both[0].upper()}{both[1:]} moved at the same step, {head.step:,}: the log "
        text += "cannot tell which moved first"
        return text + _then(head, self.movers[1 + len(tied) :], limit)


def _then(head: Mover, later: list[Mover], limit: int | None) -> str:
    """The end of a timeline's sentence: the signs after ``head`` ("; then the loss scale 1
    step later (step 301, ...) and 2 more"), at most ``limit`` of them named, with why the
    log cannot order those it cannot; "." alone when none came later."""
    shown = later if limit is None else later[:limit]
    rest = len(later) - len(shown)
    if not shown:
        return f"; and {rest} more." if rest else "."
    parts = []
    for m in shown:
        when = "at the same step" if m.lag == 0 else f"{steps_text(m.lag)} later"
        parts.append(f"the {m.label} {when} (step {m.step:,}, {_what(m)})")
    tail = f" and {rest} more" if rest > 0 else ""
    why = _unordered_clauses(head, shown)
    if why:
        tail += "; " + "; ".join(why) + ": the log cannot tell which moved first"
    return "; then " + ", ".join(parts) + tail + "."


def _is_control(m: Mover) -> bool:
    """What the trainer did (a control input, a resume, a restarted LR schedule): first at its
    step by definition."""
    return m.control or m.kind in (FindingKind.RESTART.value, FindingKind.LR_RESTART.value)


def _unordered_clauses(head: Mover, followers: list[Mover]) -> list[str]:
    """Why the followers marked unordered cannot be ordered after the head: the binned
    onsets whose ranges meet (the head's, when it reaches a follower's onset; a follower's,
    when it reaches back to the head's), then the series that logged nothing in between."""
    ranged = [m for m in followers if "range" in m.unordered_by]
    # Ranges that overlap with neither onset inside the other's range: both are named.
    both = [
        m
        for m in ranged
        if head.onset_range is not None
        and m.onset_range is not None
        and m.step > head.onset_range[1]
        and m.onset_range[0] > head.step
    ]
    wide: list[Mover] = []
    if head.onset_range is not None and any(
        m.step <= head.onset_range[1] or m in both for m in ranged
    ):
        wide.append(head)
    wide += [
        m
        for m in ranged
        if m.onset_range is not None and (m.onset_range[0] <= head.step or m in both)
    ]
    out = [
        f"the {m.label}'s onset lies anywhere in steps {m.onset_range[0]:,}-"
        f"{m.onset_range[1]:,} ({_range_kind(m.step, m.onset_range)})"
        for m in wide
        if m.onset_range is not None
    ]
    silent = [f"the {m.label}" for m in followers if "no_point" in m.unordered_by]
    if silent:
        whose = "its own" if len(silent) == 1 else "theirs"
        out.append(f"{' and '.join(silent)} logged no point between the first onset and {whose}")
    return out


_CONTROL_WORDS = {
    "lr_change": "an LR change no schedule explains",
    "lr_schedule": "an LR schedule effect",
    "resume": "a resume",
}


def _what(m: Mover) -> str:
    if m.control:
        return _CONTROL_WORDS.get(m.kind, m.kind)
    if m.finding is not None and m.finding.metric != m.metric:  # (the loss after a restart)
        return f"its rise after the {m.kind}"
    return m.kind


def build_timeline(
    findings: list[Finding],
    controls: Iterable[Control] = (),
    *,
    include_info: bool = False,
    previous_point: Callable[[Finding], int | None] | None = None,
) -> Timeline:
    """Order findings by onset, with the control inputs; one mover per vital sign.

    Args:
        findings: the findings to order.
        controls: control inputs (an incident's supported LR change, schedule effect, resume).
        include_info: keep notes (an incident's physiological spike is part of the story);
            otherwise the findings that call for action, or every non-info finding if none.
        previous_point: a finding's series' last logged step before its onset
            (:func:`forensics.incidents.previous_points`): a later onset whose series logged
            nothing since the first mover's is marked ``unordered``.

    A later onset is also unordered when its range and the first mover's meet (an onset
    fitted on binned points, :attr:`Finding.onset_range`, may lie either side of the other).
    """
    if include_info:
        events = list(findings)
    else:
        events = [f for f in findings if needs_action(f)]
        if not events:
            events = [f for f in findings if f.severity is not Severity.INFO]
    events = sorted(
        events, key=lambda f: (f.start_step, _finding_rank(f), -f.severity.rank, f.kind.value)
    )
    # (step, causal rank, order, metric, finding, kind, text)
    onsets: list[tuple[int, int, int, str | None, Finding | None, str, str]] = []
    for c in controls:
        onsets.append((c.step, 0, -1, c.metric if c.metric else "resume", None, c.cause, c.text))
    for i, f in enumerate(events):
        # A job that resumed comes before the LR its new config or restarted schedule set at
        # that very step: the resume is what changed it.
        order = -2 if f.kind is FindingKind.RESTART else i
        onsets.append((f.start_step, _finding_rank(f), order, f.metric, f, f.kind.value, ""))
        if f.kind is FindingKind.LR_RESTART and f.measures.get("rise_visible"):
            # The restart's own finding measured the loss rising beyond its noise right after
            # it (a rise that may stay under the loss-spike line): the loss moved there, not
            # at the first loss finding, which may be a later restart's spike.
            onsets.append((f.start_step, causal_rank("loss"), i, "loss", f, f.kind.value, ""))
    onsets.sort(key=lambda o: (o[0], o[1], o[2]))
    movers: list[Mover] = []
    seen: set[str | None] = set()
    if not onsets:
        return Timeline(events, movers)
    head_found = onsets[0][4]
    head_latest = head_found.onset_bounds[1] if head_found is not None else onsets[0][0]
    for step, _rank, _i, metric, found, kind, text in onsets:
        if metric in seen:
            continue
        seen.add(metric)
        label = "job (resume)" if metric == "resume" else vital_label(metric)
        lag = step - onsets[0][0]
        why: tuple[str, ...] = ()
        if lag > 0:
            earliest = found.onset_bounds[0] if found is not None else step
            # (the two ranges meet: one onset in the other's range, or the ranges overlap)
            if earliest <= head_latest:
                why += ("range",)
            if found is not None and previous_point is not None:
                before = previous_point(found)
                if before is not None and before < onsets[0][0]:
                    why += ("no_point",)
        rng = found.onset_range if found is not None else None
        movers.append(Mover(metric, label, step, lag, found, kind, text, why, rng))
    return Timeline(events, movers)


def _range_kind(step: int, onset_range: tuple[int, int]) -> str:
    """Why an onset is known only to a range: a bend fitted inside it, or a turn after the
    logged point it starts at (a score at its best at one eval and lower at the next)."""
    if turned_between(step, onset_range):
        return (
            f"it turned after step {onset_range[0]:,} and by step {onset_range[1]:,}, between "
            "two logged points"
        )
    return "a fitted bend: it fits about as well anywhere there"
