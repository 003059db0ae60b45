"""Causes from evidence: each finding's likely causes, tested against what the log shows.

A cause is a hypothesis. For every finding, :func:`find_causes` lists the causes the article
gives for its symptom (section 7's table, sections 3-5) and the causes a log can show, and marks
each one against the evidence layer (:class:`~forensics.evidence.Evidence`):

``supported``
    the log shows it, at the finding's steps (the evidence says where and how much);
``contradicted``
    the log could have shown it and does not (the series is logged, nothing there);
``untested``
    no series in the log can tell (data shared across seeds needs other runs; an article cause
    such as Adam's second moment needs optimizer state the log does not hold).

The causes a log can show (:data:`CAUSES`): an LR change no schedule explains
(``Evidence.schedule``'s unexplained segments and jumps), an LR schedule effect (a warm-up end,
restart or step drop near the onset), a resume near the onset (the importers' restart
findings), a loss-scale overflow in the same steps (``Evidence.drop_windows``), a bad batch (a
short loss spike that recovers, with the grad norm), activations that blew up (activation
outlier findings), an eval or checkpoint pause (``Evidence.revealed_periods``, stall findings)
and a validation-set change (val_shift findings). A supported mechanism that follows a
supported root (an overflow after an LR change) names that root in ``consequence_of``: the
overflow is then how the LR change hurt, not why.

Nothing here recomputes a baseline, a spike or a schedule: it reads the evidence.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from forensics.evidence.spike_context import (
    NEAR_STEPS,
    Overlaps,
    ScheduleEvent,
    absorbed_reach,
    event_near,
    near_steps,
)
from forensics.evidence.trend_utils import num, ordinal, parse_layers, sig, times
from forensics.findings import (
    DYNAMICS,
    Finding,
    FindingKind,
    Severity,
    scale_text,
    steps_text,
    turned_between,
)
from forensics.prescriptions import TABLE
from forensics.schema import GRAD_NORM, LOSS, LOSS_SCALE, OVERFLOW, VAL_LOSS

if TYPE_CHECKING:
    from forensics.evidence import Evidence
    from forensics.evidence.schedule import Schedule

SUPPORTED, CONTRADICTED, UNTESTED = "supported", "contradicted", "untested"
STATUSES = (SUPPORTED, CONTRADICTED, UNTESTED)

# An overflow counts when the loss scale fell within this many steps of the onset.
OVERFLOW_STEPS = 10
# A bad batch is one or two logged points high, then back (a spike the optimizer absorbed).
BAD_BATCH_POINTS = 2
# A loss scale this many halvings below the log's typical scale (its median) has collapsed:
# the scaler keeps finding overflowing gradients at every scale it tries, so a scale that
# "held" there is no sign that the step's gradients stayed in range.
COLLAPSE_HALVINGS = 8

# Cause ids and how each reads (the README's findings contract lists the same).
CAUSES: dict[str, str] = {
    "lr_change": "An LR change no schedule explains",
    "lr_schedule": "An LR schedule effect (warm-up end, restart, step drop)",
    "resume": "A resume from a checkpoint at or near the onset",
    "loss_scale_overflow": "A loss-scale overflow in the same steps",
    "bad_batch": "A bad batch (a short loss spike that recovers at once)",
    "shared_data": "Data shared across seeds (the same batch hurts every seed)",
    "activations": "A layer's activations blew up",
    "grad_norm_climb": "A grad-norm climb going on since before the onset",
    "eval_pause": "An eval or checkpoint pause",
    "val_set_change": "A validation-set change",
    "repeated_data": "Training examples seen again (a later epoch)",
    "large_gradient": "An abnormal gradient in the updates that moved the weights",
    "lr_zero": "A learning rate of zero",
    "no_update": "Gradients that never reach the weights (zero, or weights that do not move)",
    "lr_decay": ("The LR decay (with weight decay the grad norm grows as the learning rate falls)"),
    "shallow_layers": "Shallow layers learning too fast for the rest of the network",
    "embed_head": (
        "The embedding and output head taking a growing share of the gradient at the trunk's "
        "learning rate"
    ),
    "article": "The article's cause for this symptom",
}
# The causes as a sentence names them ("a consequence of the LR change").
SHORT: dict[str, str] = {
    "lr_change": "the LR change",
    "lr_schedule": "the LR schedule",
    "resume": "the resume",
    "bad_batch": "the bad batch",
    "eval_pause": "the pause",
    "val_set_change": "the validation-set change",
    "repeated_data": "the repeated data",
    "grad_norm_climb": "the grad-norm climb",
    "lr_zero": "the zero LR",
    "lr_decay": "the LR decay",
}
# Root causes: control inputs and outside events. The others are mechanisms (how it hurt).
ROOTS = (
    "lr_change",
    "lr_schedule",
    "resume",
    "bad_batch",
    "eval_pause",
    "val_set_change",
    "grad_norm_climb",
    "lr_zero",
    "lr_decay",
)
# Control inputs: what the trainer (or its operator) changed; a timeline's first movers.
CONTROLS = ("lr_change", "lr_schedule", "resume")

_SPIKY = frozenset(
    {
        FindingKind.LOSS_SPIKE,
        FindingKind.GRAD_NORM_SPIKE,
        FindingKind.LOSS_SCALE_DROP,
        FindingKind.NAN_INF,
        FindingKind.PARAM_NORM_JUMP,
    }
)
_NUMERIC = frozenset(
    {
        FindingKind.LOSS_SCALE_DROP,
        FindingKind.LOSS_SPIKE,
        FindingKind.GRAD_NORM_SPIKE,
        FindingKind.NAN_INF,
        FindingKind.DIVERGENCE,
        FindingKind.ACTIVATION_OUTLIER,
        FindingKind.PARAM_NORM_JUMP,
    }
)
_BLOWUP = frozenset(
    {
        FindingKind.LOSS_SPIKE,
        FindingKind.NAN_INF,
        FindingKind.LOSS_SCALE_DROP,
        FindingKind.DIVERGENCE,
        FindingKind.GRAD_NORM_SPIKE,
    }
)
_PAUSE = frozenset({FindingKind.STALL, FindingKind.THROUGHPUT_DROP, FindingKind.PERIODIC_SPIKES})
_VAL = frozenset(
    {FindingKind.OVERFITTING, FindingKind.GAP_ACCELERATION, FindingKind.EVAL_REGRESSION}
)

_TRENDS = frozenset({FindingKind.GRAD_NORM_DRIFT, FindingKind.LAYER_GRAD_SHIFT})

# Which hypotheses each finding kind is tested for (in this order).
_TESTS: dict[FindingKind, tuple[str, ...]] = {}
for _k in FindingKind:
    _t: list[str] = []
    if _k in DYNAMICS or _k is FindingKind.PLATEAU:
        _t.append("lr_change")
        # A warm-up end or restart explains a sudden event, not a trend that builds for long.
        if _k not in _TRENDS:
            _t.append("lr_schedule")
    if _k in DYNAMICS or _k in _PAUSE or _k is FindingKind.PLATEAU:
        _t.append("resume")
    if _k in _NUMERIC:
        _t.append("loss_scale_overflow")
    if _k in _SPIKY or _k is FindingKind.PERIODIC_SPIKES:
        _t += ["bad_batch", "shared_data"]
    if _k is FindingKind.GRAD_NORM_OUTLIERS:
        # (absorbed batches: the loss did not move and no overflow or schedule event was at
        # them, so only a comparison with other seeds can say more)
        _t.append("shared_data")
    if _k in _BLOWUP:
        _t += ["activations", "grad_norm_climb"]
    if _k is FindingKind.EVAL_REGRESSION:
        # The article's case (section 3): benchmarks slipping under a falling loss while the
        # grad norm had been climbing for thousands of steps.
        _t.append("grad_norm_climb")
    if _k is FindingKind.PARAM_NORM_JUMP:
        _t.append("large_gradient")
    if _k is FindingKind.NO_LEARNING:
        _t += ["lr_zero", "no_update"]
    if _k is FindingKind.GRAD_NORM_DRIFT:
        # The schedule first (a decaying LR raises the grad norm with weight decay: the
        # detector's own envelope), then the article's case (3.4): the first layers' share of
        # the gradient growing under it.
        _t += ["lr_decay", "shallow_layers", "embed_head"]
    if _k in _PAUSE:
        _t.append("eval_pause")
    if _k in _VAL:
        _t.append("val_set_change")
    if _k in (FindingKind.OVERFITTING, FindingKind.GAP_ACCELERATION):
        # The article's cause for both (a model memorising what it sees again), tested against
        # the log's epoch count.
        _t.append("repeated_data")
    if _k in (
        FindingKind.RESUME_REGRESSION,
        FindingKind.RESUME_DROP,
        FindingKind.RESUME_SETBACK,
        FindingKind.REPLACED_ATTEMPT,
        FindingKind.LR_RESTART,
    ):
        _t.append("resume")  # the seam is the context the log supports, not a mechanism
    _TESTS[_k] = tuple(_t)

# Article causes (prescriptions.TABLE[kind].causes, by index) that a tested hypothesis covers;
# the others are listed as untested in the article's words.
_COVERED: dict[FindingKind, dict[int, str]] = {
    FindingKind.LOSS_SPIKE: {0: "lr_change", 1: "bad_batch", 2: "activations"},
    FindingKind.DIVERGENCE: {0: "lr_change"},
    FindingKind.LOSS_CLIMB: {0: "lr_change", 2: "resume"},
    FindingKind.NAN_INF: {0: "loss_scale_overflow", 1: "loss_scale_overflow"},
    FindingKind.LOSS_SCALE_DROP: {0: "loss_scale_overflow", 1: "activations"},
    FindingKind.OVERFITTING: {0: "repeated_data", 1: "val_set_change"},
    FindingKind.GAP_ACCELERATION: {0: "repeated_data"},
    FindingKind.VAL_SHIFT: {},
    FindingKind.GRAD_NORM_SPIKE: {0: "bad_batch"},
    FindingKind.PERIODIC_SPIKES: {1: "lr_schedule"},
    FindingKind.PLATEAU: {0: "lr_schedule"},
    FindingKind.STALL: {},
    FindingKind.RESTART: {0: "resume"},
    FindingKind.RESUME_REGRESSION: {0: "resume"},
    FindingKind.RESUME_DROP: {0: "resume"},
    FindingKind.RESUME_SETBACK: {0: "resume"},
    FindingKind.REPLACED_ATTEMPT: {0: "resume"},
    FindingKind.LR_RESTART: {0: "resume"},
    FindingKind.EVAL_REGRESSION: {0: "grad_norm_climb"},
    FindingKind.PARAM_NORM_JUMP: {0: "large_gradient"},
    FindingKind.NO_LEARNING: {0: "lr_zero", 2: "no_update"},
    FindingKind.GRAD_NORM_DRIFT: {0: "shallow_layers", 1: "embed_head"},
}


@dataclass(frozen=True, init=False)
class Cause:
    """One hypothesis about a finding (or an incident), tested against the log.

    Attributes:
        cause: the id (a key of :data:`CAUSES`; ``article`` for a cause only the article names).
        status: ``supported``, ``contradicted`` or ``untested``.
        evidence: what the log shows, with steps and values.
        steps: the steps the evidence names (the control input's step first).
        text: the cause in words.
        consequence_of: for a supported mechanism after a supported root, the root's id.
    """

    cause: str
    status: str
    evidence: str
    steps: tuple[int, ...] = ()
    text: str = ""
    consequence_of: str | None = None
    # The control input's step and size (for a timeline's first mover); not serialised.
    anchor: int | None = field(default=None, compare=False)

    def __init__(
        self,
        cause: str,
        status: str,
        evidence: str,
        steps: Iterable[Any] = (),
        text: str = "",
        consequence_of: str | None = None,
        anchor: int | None = None,
    ) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown cause status {status!r}")
        # Written into the instance's dict: the frozen class refuses setattr, and the generated
        # __init__'s object.__setattr__ per field costs as much as a cause's test (dozens of
        # thousands of causes on a long run).
        self.__dict__.update(
            cause=cause,
            status=status,
            evidence=evidence,
            steps=tuple(map(int, steps)),
            text=text or CAUSES.get(cause, cause),
            consequence_of=consequence_of,
            anchor=anchor,
        )

    @property
    def is_root(self) -> bool:
        return self.cause in ROOTS

    @property
    def keys(self) -> set[tuple[str, int]]:
        """What two findings must share to have the same supported cause (the same event):
        the anchor step, or each step the evidence names (a recurring bad batch)."""
        if self.anchor is not None:
            return {(self.cause, self.anchor)}
        return {(self.cause, s) for s in self.steps}

    def to_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "text": self.text,
            "status": self.status,
            "evidence": self.evidence,
            "steps": list(self.steps),
            "consequence_of": self.consequence_of,
        }

    @property
    def consequence_text(self) -> str:
        """``a consequence of the LR change`` ('' for a cause that is not one)."""
        if self.consequence_of is None:
            return ""
        return f"a consequence of {SHORT.get(self.consequence_of, self.consequence_of)}"

    def line(self) -> str:
        """``supported: An LR change no schedule explains (the LR left its schedule ...)``."""
        tail = f", {self.consequence_text}" if self.consequence_of else ""
        return f"{self.status}: {self.text}{tail} ({self.evidence})"


def _g(x: float | None) -> str:
    return "n/a" if x is None else num(x)


def _ratio_text(r: float | None) -> str:
    """The ratio as " (2.40x)", or nothing where none is defined (a linear-scale series)."""
    return "" if r is None else f" ({r:.2f}x)"


def _event_text(e: ScheduleEvent) -> str:
    if e.kind == "warmup_end":
        return "the warm-up ended"
    if e.kind == "cooldown":
        return "the cooldown began"
    word = "restarted" if e.kind == "restart" else "dropped a step"
    return f"the LR {word} ({_g(e.lr_before)} -> {_g(e.lr_after)})"


def _near(ev: Evidence, base: int = NEAR_STEPS) -> int:
    """The reach of "near the onset": ``base`` steps, a tenth of the log on shorter logs."""
    return near_steps(ev.run.first_step, ev.run.last_step, base)


def _points(n: int) -> str:
    return f"{n:,} logged point" if n == 1 else f"{n:,} logged points"


def _window(f: Finding) -> tuple[int, int]:
    """The steps a finding's onset covers: its start to its peak (a spike's rise)."""
    hi = f.peak_step if f.peak_step is not None else f.start_step
    return f.start_step, max(f.start_step, hi)


class _Facts:
    """What the tests read from one run, taken once for all its findings (thousands of spikes
    ask the same questions of the same run): the reach of "near", which series are logged,
    the evidence findings by kind, and indexes for the per-finding searches (the LR
    schedule's events and segments, the loss-scale drops, the spikes by start).

    Everything that reads the evidence is computed on first use, as the plain tests did.
    """

    def __init__(self, ev: Evidence, findings: Sequence[Finding]) -> None:
        self.ev = ev
        self.restarts = [g for g in findings if g.kind is FindingKind.RESTART]
        self.outliers = [g for g in findings if g.kind is FindingKind.ACTIVATION_OUTLIER]
        self.drifts = [g for g in findings if g.kind is FindingKind.GRAD_NORM_DRIFT]
        self.stalls = [g for g in findings if g.kind is FindingKind.STALL]
        self.val_shifts = [g for g in findings if g.kind is FindingKind.VAL_SHIFT]
        self.layer_shifts = [g for g in findings if g.kind is FindingKind.LAYER_GRAD_SHIFT]
        self._spikes: dict[str, tuple[list[int], list[Any]]] = {}

    @cached_property
    def near(self) -> int:
        return _near(self.ev)

    @cached_property
    def grad_shares(self) -> tuple[np.ndarray, list[int], np.ndarray] | None:
        """Each logged layer's share of the squared grad norm (the sum over the layers) at the
        steps every layer logged: steps, layers, shares (None: fewer than two layers)."""
        from forensics.evidence.module_share import layer_shares
        from forensics.schema import GRAD_NORM_LAYER

        lm = self.ev.layer_matrix(GRAD_NORM_LAYER).complete()
        if len(lm.layers) < 2:
            return None
        steps, shares = layer_shares(lm)
        return (steps, lm.layers, shares) if len(steps) else None

    @cached_property
    def schedule_near(self) -> int:
        # The spike detector's own reach (its sentence names the kink this table tests).
        return _near(self.ev, self.ev.params.spikes.schedule_lag)

    @cached_property
    def has_loss(self) -> bool:
        return self.ev.has(LOSS)

    @cached_property
    def has_grad_norm(self) -> bool:
        return self.ev.has(GRAD_NORM)

    @cached_property
    def grad_norm_span(self) -> tuple[int, int] | None:
        """The first and last step the grad norm was logged at (None: not logged)."""
        s = self.ev.logged(GRAD_NORM) if self.has_grad_norm else None
        if s is None or len(s.steps) == 0:
            return None
        return int(s.steps[0]), int(s.steps[-1])

    @cached_property
    def outlier_spans(self) -> tuple[list[Finding], list[int], np.ndarray]:
        """The activation outliers by onset, their onsets and their last steps (the onset for
        an open one): the per-onset search looks up a stretch instead of every outlier."""
        by_start = sorted(self.outliers, key=lambda g: g.start_step)
        ends = [g.end_step if g.end_step is not None else g.start_step for g in by_start]
        return by_start, [g.start_step for g in by_start], np.array(ends, dtype=np.float64)

    @cached_property
    def has_activations(self) -> bool:
        return any(self.ev.has(m) for m in ("act_absmax", "act_std", "act_mean"))

    @cached_property
    def activation_span(self) -> tuple[int, int] | None:
        """The first and last step any activation statistic was logged at (None: none)."""
        spans = []
        for m in ("act_absmax", "act_std", "act_mean"):
            if self.ev.has(m):
                steps = self.ev.run.metric_rows(m).get_column("step").drop_nulls()
                if len(steps):
                    spans.append((int(steps.min()), int(steps.max())))  # type: ignore[arg-type]
        if not spans:
            return None
        return min(a for a, _ in spans), max(b for _, b in spans)

    @cached_property
    def unexplained(self) -> list[Any]:
        return self.ev.schedule.unexplained

    @cached_property
    def _segment_ends(self) -> list[int] | None:
        """The schedule's segments' last steps, None if they are not in order."""
        ends = [seg.end_step for seg in self.ev.schedule.segments]
        return ends if all(a <= b for a, b in zip(ends, ends[1:], strict=False)) else None

    def phase_at(self, step: int) -> str | None:
        """``Schedule.phase_at`` by a binary search over the segments' ends."""
        sched, ends = self.ev.schedule, self._segment_ends
        if ends is None:
            return sched.phase_at(step)
        if not ends or step < sched.segments[0].start_step or step > ends[-1]:
            return None
        return sched.segments[bisect_left(ends, step)].kind

    def schedule_event(self, lo: int, hi: int) -> tuple[int, str] | None:
        """The last (step, what) of the schedule's events with ``lo <= step <= hi`` (the
        evidence's list, which the spike detector reads too; None if there is none)."""
        e = event_near(self.ev.schedule_events, self._event_steps, lo, hi)
        return (e.step, _event_text(e)) if e is not None else None

    @cached_property
    def _event_steps(self) -> list[int]:
        return [e.step for e in self.ev.schedule_events]

    @cached_property
    def has_loss_scale(self) -> bool:
        return self.ev.has(LOSS_SCALE)

    @cached_property
    def has_overflow_lines(self) -> bool:
        """Overflow events logged as lines (DeepSpeed's, Megatron-DeepSpeed's): a log that
        prints every overflow shows by their absence that none happened."""
        return len(self.ev.series(OVERFLOW)) > 0

    @cached_property
    def scale_at_reductions(self) -> bool:
        """The scale logged only where it was halved (DeepSpeed): see logged_at_reductions."""
        from forensics.evidence.spike_context import logged_at_reductions

        return logged_at_reductions(self.ev.series(LOSS_SCALE), self.ev.series(OVERFLOW))

    @cached_property
    def scale_typical(self) -> float | None:
        """The loss scale's median over the log (None: no scale logged at every step it
        was, such as DeepSpeed's lines at its reductions only, whose last value can be stale
        after an unlogged regrowth)."""
        s = self.ev.series(LOSS_SCALE)
        if len(s) < 2 or self.scale_at_reductions:
            return None
        return float(np.median(s.values))

    @cached_property
    def drops(self) -> Overlaps:
        """Whether a loss-scale drop window meets a step window (a binary search)."""
        return Overlaps(self.ev.drop_windows)

    @cached_property
    def restarts_listed(self) -> str:
        if not self.restarts:
            return ""
        return " (restarts at " + ", ".join(f"{g.start_step:,}" for g in self.restarts[:5]) + ")"

    def spikes_by_start(self, metric: str) -> tuple[list[int], list[Any]]:
        """The evidence's spikes of ``metric`` sorted by start, and their starts."""
        if metric not in self._spikes:
            spikes = sorted(self.ev.spikes(metric), key=lambda s: s.start_step)
            self._spikes[metric] = ([int(s.start_step) for s in spikes], spikes)
        return self._spikes[metric]


# Causes whose evidence names no step: the same for every finding they are tested for.
_NO_LR = "no learning rate in the log"
_LR_CHANGE_UNTESTED = Cause("lr_change", UNTESTED, _NO_LR)
_LR_SCHEDULE_UNTESTED = Cause("lr_schedule", UNTESTED, _NO_LR)
_OVERFLOW_UNTESTED = Cause(
    "loss_scale_overflow", UNTESTED, "no loss scale in the log (bf16 or fp32?)"
)
_BAD_BATCH_UNTESTED = Cause("bad_batch", UNTESTED, "no training loss in the log")
_SHARED_DATA = Cause(
    "shared_data",
    UNTESTED,
    "one run cannot tell: compare the same steps in runs with other seeds on the same data order",
)
_ACTIVATIONS_UNTESTED = Cause("activations", UNTESTED, "no activation statistics in the log")
_CLIMB_UNTESTED = Cause("grad_norm_climb", UNTESTED, "no grad norm in the log")


# -- the hypotheses -----------------------------------------------------------------------------
def _within_range(f: Finding) -> str:
    """How a control input after a fitted onset, but inside its range, relates to it: the
    log cannot put it after the onset."""
    lo, hi = f.onset_bounds
    if turned_between(f.start_step, f.onset_range):  # (not a bend fitted inside)
        return (
            f"within the steps the onset is known to ({lo:,}-{hi:,}: it turned after step "
            f"{lo:,} and by step {hi:,}, between two logged points), so not after it"
        )
    return (
        f"within the steps the onset is known to ({lo:,}-{hi:,}: a bend fitted at step "
        f"{f.start_step:,} fits about as well anywhere there), so not after it"
    )


def _lr_change(x: _Facts, f: Finding) -> Cause:
    sched = x.ev.schedule
    if sched.empty:
        return _LR_CHANGE_UNTESTED
    onset = f.start_step
    latest = f.onset_bounds[1]  # (an onset fitted on bins may lie up to here)
    for seg in x.unexplained:
        # Going on at the onset, or ended at most NEAR_STEPS before it.
        if seg.start_step <= latest + 1 and seg.end_step >= onset - x.near:
            before = seg.lr_before
            jumps = [
                c
                for c in sched.changes
                if seg.start_step <= c.step <= seg.end_step and c.kind.startswith("jump")
            ]
            if jumps:
                c = jumps[0]
                size = (
                    f"x{times(c.factor)}: {_g(c.lr_before)} -> {_g(c.lr_after)} at step {c.step:,}"
                )
            elif before:
                top = float(
                    np.max(
                        sched.values[
                            (sched.steps >= seg.start_step) & (sched.steps <= seg.end_step)
                        ]
                    )
                )
                size = (  # (inside the sentence's parenthesis: the factor after a comma)
                    f"from {_g(before)} at step {seg.start_step - 1:,} the LR rose to {_g(top)}, "
                    f"x{times(top / before)}"
                )
            else:
                size = f"{_g(seg.lr_start)} -> {_g(seg.lr_end)}"
            where = (
                f"steps {seg.start_step:,}-{seg.end_step:,}"
                if seg.end_step > seg.start_step
                else f"step {seg.start_step:,}"
            )
            rel = (
                "still raised at the onset"
                if seg.end_step >= onset
                else f"back on schedule {steps_text(onset - seg.end_step)} before the onset"
            ) + f" at step {onset:,}"
            if seg.start_step > onset + 1:
                rel = _within_range(f)
            return Cause(
                "lr_change",
                SUPPORTED,
                f"the LR left its schedule over {where} ({size}); {rel}",
                (seg.start_step, seg.end_step),
                anchor=seg.start_step,
            )
    unlogged = _lr_unlogged(x, onset)
    if unlogged is not None:
        return Cause("lr_change", UNTESTED, unlogged, (onset,))
    later = [s for s in x.unexplained if s.start_step > latest + 1]
    phase = x.phase_at(onset)
    text = (
        f"the logged LR follows its schedule ({phase or 'outside the logged LR'}) at step "
        f"{onset:,} (a parameter group's own LR is not in the log)"
    )
    if later:
        text += f"; its unexplained change starts later, at step {later[0].start_step:,}"
    return Cause("lr_change", CONTRADICTED, text, (onset,))


def _lr_unlogged(x: _Facts, onset: int) -> str | None:
    """``the LR is logged only at steps A-B`` when nothing of the LR was logged from before
    ``onset`` to within the reach of "near" of it (an LR logged for the first 2,000 steps
    says nothing of a change at step 8,000); None when it was."""
    steps = x.ev.schedule.steps
    if len(steps) == 0:
        return None
    first, last = int(steps[0]), int(steps[-1])
    if first <= onset <= last + x.near:
        return None
    return f"the LR is logged only at steps {first:,}-{last:,}"


def _lr_schedule(x: _Facts, f: Finding) -> Cause:
    if x.ev.schedule.empty:
        return _LR_SCHEDULE_UNTESTED
    onset = f.start_step
    if f.kind is FindingKind.PERIODIC_SPIKES:
        return _restart_period(x.ev, f)
    reach = x.schedule_near
    if f.kind is FindingKind.GRAD_NORM_SPIKE:
        reach = absorbed_reach(f.measures, reach)
    event = x.schedule_event(onset - reach, onset + 1)
    if event is not None:
        s, t = event
        lag = onset - s
        # (the onset's step named: an incident's sentence spans several findings' onsets)
        when = (
            f"at the onset (step {onset:,})"
            if lag <= 0
            else f"{steps_text(lag)} before the onset at step {onset:,}"
        )
        return Cause("lr_schedule", SUPPORTED, f"{t} at step {s:,}, {when}", (s,), anchor=s)
    if reach < x.schedule_near:  # an absorbed outlier: an event further back is named
        far = x.schedule_event(onset - x.schedule_near, onset + 1)
        if far is not None:
            s, t = far
            rec = f.measures.get("recovery_steps")
            back = (
                f"back within {rec:,} step{'s' if rec != 1 else ''}"
                if isinstance(rec, int)
                else "back at once"
            )
            return Cause(
                "lr_schedule",
                CONTRADICTED,
                f"{t} at step {s:,}, {steps_text(onset - s)} before the onset at step {onset:,}; "
                f"the schedule has set the LR of every step since, and an outlier {back} "
                "with the loss unmoved is not what a schedule change does",
                (s,),
            )
    rewarm = _rewarming(x.ev.schedule, onset)
    if rewarm is not None:
        return rewarm
    unlogged = _lr_unlogged(x, onset)
    if unlogged is not None:
        return Cause("lr_schedule", UNTESTED, unlogged, (onset,))
    phase = x.phase_at(onset)
    return Cause(
        "lr_schedule",
        CONTRADICTED,
        f"no warm-up end, restart or step drop within {steps_text(reach)} before step "
        f"{onset:,} (the LR is in its {phase or 'unlogged'} phase there)",
        (onset,),
    )


def _rewarming(sched: Schedule, onset: int) -> Cause | None:
    """``lr_schedule`` supported when ``onset`` lies in a warm-up that is not the run's
    first: the LR climbing back to its peak after a restart or drop, further back than the
    schedule events' reach (a grad norm surging as a re-warm nears its peak); None else."""
    seg = sched.segment_at(onset)
    if seg is None or not any(seg is r for r in sched.rewarms):
        return None  # (not a warm-up, or the run's first, also in a log begun mid-schedule)
    return Cause(
        "lr_schedule",
        SUPPORTED,
        f"the LR was warming up again at the onset (step {onset:,}): from "
        f"{seg.lr_start:.4g} at step {seg.start_step:,} back to {seg.lr_end:.4g} by step "
        f"{seg.end_step:,}",
        (seg.start_step,),
        anchor=seg.start_step,
    )


def _restart_period(ev: Evidence, f: Finding) -> Cause:
    """Periodic spikes: does the LR restart at the spikes' period?"""
    period = f.measures.get("period_steps")
    p = ev.revealed_periods.get("lr_restart")
    if p is None or not isinstance(period, (int, float)) or period <= 0:
        return Cause(
            "lr_schedule",
            CONTRADICTED,
            "the LR schedule has no restarts to recur with",
            (f.start_step,),
        )
    ratio = float(period) / p.steps
    if round(ratio) >= 1 and abs(ratio - round(ratio)) <= 0.05:
        return Cause(
            "lr_schedule",
            SUPPORTED,
            f"the LR restarts every {p.steps:,.0f} steps; the spikes recur every "
            f"{float(period):,.0f}",
            (int(p.origin),),
            anchor=int(p.origin),
        )
    return Cause(
        "lr_schedule",
        CONTRADICTED,
        f"the LR restarts every {p.steps:,.0f} steps, not at the spikes' period of "
        f"{float(period):,.0f}",
        (f.start_step,),
    )


def _resume(x: _Facts, f: Finding) -> Cause:
    if f.kind is FindingKind.REPLACED_ATTEMPT:
        # The resume itself is the evidence: it replaced the steps the attempt went wrong in.
        r, last = f.measures.get("resumed_from_step"), f.measures.get("attempt_last_step")
        if isinstance(r, int) and isinstance(last, int):
            # (a resumed job still behind the attempt has logged again only up to its own
            # last step)
            again = min(last, x.ev.run.last_step)
            return Cause(
                "resume",
                SUPPORTED,
                f"the job resumed at step {r:,} from an earlier checkpoint and logged steps "
                f"{r:,}-{again:,} again"
                + (f" (the attempt had reached step {last:,})" if again < last else ""),
                (r,),
                anchor=r,
            )
    if f.kind in (FindingKind.RESUME_DROP, FindingKind.RESUME_SETBACK):
        # Its seam is a resume by its own evidence: a restart the importer recorded, or a new
        # log file going on at the next step (which the steps alone do not show).
        seam, name = f.measures.get("seam_step"), f.measures.get("new_file")
        if isinstance(seam, int):
            shown = f" (a new log file, {name}, begins there)" if name else ""
            return Cause(
                "resume",
                SUPPORTED,
                f"the job resumed at step {seam:,}{shown}, at the onset",
                (seam,),
                anchor=seam,
            )
    onset = f.start_step
    reach = x.near
    latest = f.onset_bounds[1]  # (an onset fitted on bins may lie up to here)
    near = [g for g in x.restarts if onset - reach <= g.start_step <= latest + 1]
    if near:
        g = near[-1]
        lag = onset - g.start_step
        if g.start_step > onset + 1:
            when = _within_range(f)
        elif lag <= 0:
            when = f"at the onset (step {onset:,})"
        else:
            when = f"{steps_text(lag)} before the onset at step {onset:,}"
        return Cause(
            "resume",
            SUPPORTED,
            f"the job resumed at step {g.start_step:,}, {when}",
            (g.start_step,),
            anchor=g.start_step,
        )
    text = f"no restart in the log within {steps_text(reach)} before step {onset:,}"
    return Cause("resume", CONTRADICTED, text + x.restarts_listed, (onset,))


def _overflow(x: _Facts, f: Finding) -> Cause:
    ev = x.ev
    if not x.has_loss_scale and len(ev.drop_windows) == 0:
        return _OVERFLOW_UNTESTED
    # In the same steps: from just before the onset to the peak, at most OVERFLOW_STEPS on;
    # a loss-scale drop's own halvings are its evidence, however far apart (604 and 643).
    lo, hi = _window(f)
    if f.kind == FindingKind.LOSS_SCALE_DROP and f.end_step is not None:
        hi = max(hi, f.end_step)
    else:
        hi = min(hi, lo + OVERFLOW_STEPS)
    # The windows meeting (lo - 1, hi + 1): a binary search tells whether there are any.
    w = ev.drop_windows if x.drops(lo - 1, hi + 1) else ev.drop_windows[:0]
    hit = w[(w[:, 0] < hi + 1) & (w[:, 1] > lo - 1)] if len(w) else w
    if len(hit) and (hit[:, 1] <= hi + 1).any():
        hit = hit[hit[:, 1] <= hi + 1]  # a drop seen later between sparse points is not "same"
    if len(hit):
        steps = sorted({int(b) for b in hit[:, 1]})
        s = ev.series(LOSS_SCALE)
        where = f"step {steps[0]:,}" if len(steps) == 1 else f"steps {steps[0]:,}-{steps[-1]:,}"
        vals = ""
        if len(s):
            i = int(np.searchsorted(s.steps, steps[0], side="left"))
            k = int(np.searchsorted(s.steps, steps[-1], side="left"))
            if x.scale_at_reductions and i < len(s) and k < len(s) and s.steps[i] == steps[0]:
                # Each logged point halved the scale: it started from twice the first one (the
                # point logged before was followed by unlogged growth).
                vals = (
                    f" (loss scale {scale_text(2 * s.values[i])} before step {steps[0]:,}, "
                    f"{scale_text(s.values[k])} at step {int(s.steps[k]):,})"
                )
            elif 0 < i and k < len(s):
                vals = (
                    f" (loss scale {scale_text(s.values[i - 1])} at step {int(s.steps[i - 1]):,}, "
                    f"{scale_text(s.values[k])} at step {int(s.steps[k]):,})"
                )
        n = len(steps)
        return Cause(
            "loss_scale_overflow",
            SUPPORTED,
            f"the loss scale overflowed or fell at {n:,} step{'s' if n != 1 else ''}, "
            f"{where}{vals}",
            (steps[0], steps[-1]),
            anchor=steps[0],
        )
    collapsed = _collapsed(x, lo)
    if collapsed is not None:
        return collapsed
    a, b = lo - 1, hi + 1
    s = ev.series(LOSS_SCALE)
    if len(s) and not x.has_overflow_lines:
        # Only the scale's own points can show it held: they must reach over the onset and
        # the rise (a scale logged for the first 1,000 steps says nothing of step 5,000).
        first, last = int(s.steps[0]), int(s.steps[-1])
        if first > lo or last < hi:
            return Cause(
                "loss_scale_overflow",
                UNTESTED,
                f"the loss scale is logged only at steps {first:,}-{last:,}",
                (lo, hi),
            )
        a, b = max(a, first), min(b, last)
    return Cause(
        "loss_scale_overflow",
        CONTRADICTED,
        f"the loss scale held from step {a:,} to {b:,}",
        (lo, hi),
    )


def _collapsed(x: _Facts, onset: int) -> Cause | None:
    """Supported when the loss scale at the onset sits :data:`COLLAPSE_HALVINGS` or more
    halvings below its typical level, after falling there (a NaN loss 100 steps after the
    scale fell from 65,536 to 1 read "contradicted: the loss scale held"); None else."""
    typical = x.scale_typical
    if typical is None or not typical > 0:
        return None
    s = x.ev.series(LOSS_SCALE)
    i = int(np.searchsorted(s.steps, onset, side="right")) - 1  # the scale at the onset
    if i < 1 or not 0 <= s.values[i] <= typical / 2.0**COLLAPSE_HALVINGS:
        return None
    now = float(s.values[i])
    up = np.flatnonzero(s.values[: i + 1] >= typical)
    if len(up) == 0:
        return None  # (low since the log began: no fall to point at)
    j = int(up[-1])  # the last point at its typical level; the fall began after it
    k = j + int(np.argmax(s.values[j : i + 1] <= now))  # where it reached today's level
    top, t0, t1 = float(s.values[j]), int(s.steps[j + 1]), int(s.steps[k])
    halvings = f" ({math.log2(top / now):.0f} halvings)" if now > 0 else ""
    return Cause(
        "loss_scale_overflow",
        SUPPORTED,
        f"the loss scale had fallen from {scale_text(top)} at step {int(s.steps[j]):,} to "
        f"{scale_text(now)} by step {t1:,}{halvings} and was still there at the onset (step "
        f"{onset:,}): overflowing at every scale it tried",
        (t0, t1),
        anchor=t0,
    )


def _spike_at(x: _Facts, metric: str, lo: int, hi: int) -> Any:
    """The first spike of ``metric`` whose rise meets ``[lo - 1, hi + 1]`` (None if none)."""
    starts, spikes = x.spikes_by_start(metric)
    # Spikes are short next to the gaps between them: look back from the last start <= hi + 1.
    i = bisect_right(starts, hi + 1)
    for sp in spikes[max(0, i - 8) : i]:
        if sp.peak_step >= lo - 1:
            return sp
    return None


def _large_gradient(x: _Facts, f: Finding) -> Cause:
    """A parameter-norm jump: did a grad-norm spike peak in the updates that moved the
    weights, from the param norm's point before the jump to the jump's end (the grad norm
    logged at a step is the gradient that step's update applied)? The article's "abnormal
    gradients got through"."""
    if not x.has_grad_norm:
        return Cause("large_gradient", UNTESTED, "no grad norm in the log", (f.start_step,))
    start = f.start_step
    hi = max(start, f.end_step if f.end_step is not None else (f.peak_step or start))
    pn = x.ev.logged(f.metric or "param_norm")
    i = int(np.searchsorted(pn.steps, start, side="left"))
    lo = int(pn.steps[i - 1]) + 1 if i > 0 else start
    where = f"step {hi:,}" if lo == hi else f"steps {lo:,}-{hi:,}"
    sp = _spike_at(x, GRAD_NORM, lo, hi)
    if sp is not None and lo <= sp.peak_step <= hi:
        m = sp.measures
        return Cause(
            "large_gradient",
            SUPPORTED,
            f"grad norm {_g(m['peak_value'])} at step {sp.peak_step:,} against a local baseline "
            f"of {_g(m['baseline'])}{_ratio_text(m.get('height_ratio'))}, in the updates that "
            f"moved the param norm ({where})",
            (sp.peak_step,),
        )
    g = x.ev.logged(GRAD_NORM)
    a, b = np.searchsorted(g.steps, lo, side="left"), np.searchsorted(g.steps, hi, side="right")
    if b <= a:
        return Cause(
            "large_gradient",
            UNTESTED,
            f"the grad norm logged no point at {where}, the update that moved the param norm",
            (hi,),
        )
    top = float(np.nanmax(g.values[a:b]))
    return Cause(
        "large_gradient",
        CONTRADICTED,
        f"the grad norm had no spike at {where} (at most {_g(top)}): the update that moved the "
        "param norm was not driven by an abnormal gradient",
        (lo, hi),
    )


def _span_values(x: _Facts, metric: str, f: Finding) -> tuple[np.ndarray, str]:
    """The finite values ``metric`` logged over a finding's steps, and those steps in words."""
    lo = f.start_step
    hi = max(lo, f.end_step if f.end_step is not None else lo)
    s = x.ev.series(metric)
    a, b = np.searchsorted(s.steps, lo, side="left"), np.searchsorted(s.steps, hi, side="right")
    return s.values[a:b], (f"step {lo:,}" if lo == hi else f"steps {lo:,}-{hi:,}")


# A series "is zero" when at least this share of its points over the finding are exactly 0
# (a few nonzero points, a warm-up's first step, do not make a run learn).
ZERO_SHARE = 0.9
# Weights "do not move" when the param norm's range over the finding is below this fraction of
# its level (float32 rounding of an unchanged norm moves it by about 1e-7).
STILL_PARAM_NORM = 1e-6


def _zero_text(v: np.ndarray, name: str, where: str) -> str | None:
    """``the grad norm is 0 at all 300 logged points of steps 0-2,999`` when at least
    :data:`ZERO_SHARE` of ``v`` is exactly zero (None otherwise)."""
    zeros = int(np.count_nonzero(v == 0))
    if not len(v) or zeros < ZERO_SHARE * len(v):
        return None
    share = f"all {_points(len(v))}" if zeros == len(v) else f"{zeros:,} of {_points(len(v))}"
    return f"the {name} is 0 at {share} of {where}"


def _lr_zero(x: _Facts, f: Finding) -> Cause:
    """No learning: is the logged LR zero over the finding's steps? A nonzero LR contradicts
    only that: a scheduler or parameter-group bug that keeps it from the optimizer, or a rate
    far too low, is the article's next cause, which the log cannot show."""
    from forensics.schema import LR

    if not x.ev.has(LR):
        return Cause("lr_zero", UNTESTED, _NO_LR, (f.start_step,))
    v, where = _span_values(x, LR, f)
    if not len(v):
        return Cause("lr_zero", UNTESTED, f"the LR logged no point at {where}", (f.start_step,))
    zero = _zero_text(v, "logged LR", where)
    if zero is not None:
        return Cause(
            "lr_zero", SUPPORTED, f"{zero}: no update can move the weights", (f.start_step,)
        )
    return Cause(
        "lr_zero",
        CONTRADICTED,
        f"the logged LR is not zero over {where} (median {_g(float(np.median(v)))}, peak "
        f"{_g(float(np.max(v)))})",
        (f.start_step,),
    )


def _no_update(x: _Facts, f: Finding) -> Cause:
    """No learning: do gradients reach the weights? A grad norm of 0 says none is computed
    (frozen parameters, a detached graph); a param norm that does not move says the updates
    never land (an optimizer holding other tensors than the model's). A nonzero grad norm and
    a moving param norm contradict both; a nonzero grad norm alone leaves the second open."""
    from forensics.schema import PARAM_NORM

    g, where = _span_values(x, GRAD_NORM, f) if x.has_grad_norm else (np.empty(0), "")
    zero = _zero_text(g, "grad norm", where)
    if zero is not None:
        return Cause(
            "no_update", SUPPORTED, f"{zero}: no gradient reaches the parameters", (f.start_step,)
        )
    p, pwhere = _span_values(x, PARAM_NORM, f) if x.ev.has(PARAM_NORM) else (np.empty(0), "")
    moved = None
    if len(p) >= 2:
        level = float(np.median(np.abs(p)))
        change = float(np.max(p) - np.min(p))
        if level > 0 and change < STILL_PARAM_NORM * level:
            return Cause(
                "no_update",
                SUPPORTED,
                f"the param norm stays at {_g(level)} over {pwhere} (it moves by less than a "
                "millionth of itself): the weights do not change",
                (f.start_step,),
            )
        moved = f"the param norm moves ({_g(float(p[0]))} -> {_g(float(p[-1]))} over {pwhere})"
    if len(g) and moved is not None:
        return Cause(
            "no_update",
            CONTRADICTED,
            f"the grad norm is not zero (median {_g(float(np.median(g)))} over {where}) and "
            f"{moved}: gradients reach the weights and the weights change",
            (f.start_step,),
        )
    if len(g):
        return Cause(
            "no_update",
            UNTESTED,
            f"the grad norm is not zero (median {_g(float(np.median(g)))} over {where}), so "
            "gradients are computed; whether the optimizer applies them would show in the "
            "param norm, which the log does not hold there",
            (f.start_step,),
        )
    if moved is not None:
        return Cause(
            "no_update",
            CONTRADICTED,
            f"{moved}: the weights change",
            (f.start_step,),
        )
    return Cause(
        "no_update",
        UNTESTED,
        "no grad norm or param norm logged over the finding's steps",
        (f.start_step,),
    )


def _bad_batch_recurring(x: _Facts, f: Finding) -> Cause:
    """Periodic spikes: is each spike a bad batch (short, recovered)?"""
    raw = f.measures.get("spike_steps")
    steps = [int(x) for x in str(raw).split(",") if x.strip()] if raw else []
    if not steps:
        return Cause("bad_batch", UNTESTED, "the finding names no spike steps", (f.start_step,))
    tested = [_bad_batch_at(x, s, s) for s in steps]
    ok = [s for s, c in zip(steps, tested, strict=True) if c.status == SUPPORTED]
    listed = ", ".join(f"{s:,}" for s in ok[:8]) + (" ..." if len(ok) > 8 else "")
    if len(ok) * 2 > len(steps):
        return Cause(
            "bad_batch",
            SUPPORTED,
            f"{len(ok):,} of the {len(steps):,} spikes are one-batch spikes that recover at once "
            f"(steps {listed}): a batch that comes round",
            tuple(ok),
        )
    return Cause(
        "bad_batch",
        CONTRADICTED,
        f"only {len(ok):,} of the {len(steps):,} spikes are short and recover at once",
        tuple(steps),
    )


def _bad_batch(x: _Facts, f: Finding) -> Cause:
    if not x.has_loss:
        return _BAD_BATCH_UNTESTED
    if f.kind is FindingKind.PERIODIC_SPIKES:
        return _bad_batch_recurring(x, f)
    lo, hi = _window(f)
    return _bad_batch_at(x, lo, hi, f)


def _bad_batch_at(x: _Facts, lo: int, hi: int, f: Finding | None = None) -> Cause:
    """Is the loss spike at ``lo``-``hi`` one batch: short and back at once? ``f``: the
    finding the cause is tested for (a loss spike's own finding knows whether the loss went
    on rising after it, which the evidence's spike does not)."""
    ev = x.ev
    sp = _spike_at(x, LOSS, lo, hi)
    if sp is None:
        return Cause(
            "bad_batch",
            CONTRADICTED,
            f"the loss has no spike at steps {lo:,}-{hi + 1:,}",
            (lo, hi),
        )
    m = sp.measures
    if not m.get("recovered") and int(m.get("steps_logged_after_peak") or 0) == 0:
        return Cause(
            "bad_batch",
            UNTESTED,
            f"loss {_g(m['peak_value'])} at step {sp.peak_step:,}, the last logged step: nothing "
            "after it shows whether it came back",
            (sp.peak_step,),
        )
    short = int(m.get("points", 99)) <= BAD_BATCH_POINTS and bool(m.get("recovered"))
    head = (
        f"loss {_g(m['peak_value'])} at step {sp.peak_step:,} against {_g(m['baseline'])}"
        f"{_ratio_text(m.get('height_ratio'))}"
    )
    if not short:
        own = (
            f.measures
            if f is not None and f.kind is FindingKind.LOSS_SPIKE and f.peak_step == sp.peak_step
            else {}
        )
        rose, rose_at = own.get("rose_after_to"), own.get("rose_after_step")
        if isinstance(rose, float) and isinstance(rose_at, int):
            # (the spike's own sentence says the same)
            rec = f"never back (the loss went on rising, to {_g(rose)} at step {rose_at:,})"
        elif m.get("recovered"):
            rec = f"back after {steps_text(m['recovery_steps'])}"
        else:
            rec = "not back on its trend"
        return Cause(
            "bad_batch",
            CONTRADICTED,
            f"{head}, high for {_points(int(m.get('points', 0)))}, {rec}: longer than one batch",
            (sp.start_step, sp.end_step),
        )
    gtext = ""
    if x.has_grad_norm:
        gs = _spike_at(x, GRAD_NORM, sp.start_step, sp.peak_step)
        logged = ev.logged(GRAD_NORM)
        at = logged.values[logged.steps == sp.peak_step]
        if gs is not None:
            gtext = f"; grad norm {_g(gs.measures['peak_value'])} at step {gs.peak_step:,}"
        elif len(at) == 0:
            gtext = f"; no grad norm logged at step {sp.peak_step:,} (a skipped step logs none)"
        elif not np.all(np.isfinite(at)):
            gtext = f"; the grad norm is {_g(float(at[0]))} at step {sp.peak_step:,}"
        else:
            return Cause(
                "bad_batch",
                CONTRADICTED,
                f"{head}, but the grad norm did not spike ({_g(float(at[0]))} at step "
                f"{sp.peak_step:,}): a batch that hurts moves both",
                (sp.start_step, sp.peak_step),
            )
    return Cause(
        "bad_batch",
        SUPPORTED,
        f"{head}, back on its trend at step {int(m['recovered_step']):,}{gtext}",
        (sp.start_step, int(m["recovered_step"])),
        anchor=sp.start_step,
    )


def _outlier_start_and_layers(outs: Sequence[Finding]) -> tuple[int, str]:
    """The first onset of activation outliers and " in layer(s) ..." (empty without layers)."""
    layers = sorted({int(v) for g in outs if isinstance(v := g.measures.get("layer"), int)})
    lay = f" in layer{'s' if len(layers) > 1 else ''} " + ", ".join(map(str, layers))
    return min(g.start_step for g in outs), lay if layers else ""


def _activations(x: _Facts, f: Finding) -> Cause:
    # The outliers covering the onset: begun by one step after it, lasting up to ``near``
    # steps before it. Only one that began near this onset can be what changed here; one out
    # of range since long before is a standing condition (a start-up outlier stays open).
    # Those begun near it are a stretch of the outliers by onset; the others are looked for
    # only when there is none (thousands of spikes against hundreds of outliers at 10M steps).
    by_start, starts, ends = x.outlier_spans
    if not by_start:  # (no outlier in the run: most runs, and every spike of a long one)
        return _no_outliers(x, f)
    since = f.start_step - x.near
    lo, hi = bisect_left(starts, since), bisect_right(starts, f.start_step + 1)
    outs = [g for g, end in zip(by_start[lo:hi], ends[lo:hi], strict=True) if end >= since]
    covering = outs or [by_start[i] for i in np.flatnonzero(ends[:lo] >= since)]
    if covering:
        first, lay = _outlier_start_and_layers(outs or covering)
        if outs:
            return Cause(
                "activations",
                SUPPORTED,
                f"activations left their range{lay} from step {first:,}",
                (first,),
                anchor=first,
            )
        return Cause(
            "activations",
            UNTESTED,
            f"activations{lay} have been out of their range since step {first:,}, "
            f"{steps_text(f.start_step - first)} before this onset: a standing condition, not a "
            "change at it",
            (first,),
        )
    return _no_outliers(x, f)


def _no_outliers(x: _Facts, f: Finding) -> Cause:
    span = x.activation_span
    if x.has_activations and span is not None and not span[0] <= f.start_step <= span[1]:
        # Only logged points on both sides of the onset can show the activations stayed in
        # their range there (statistics logged for the first 1,000 steps say nothing of step
        # 5,000), as the loss scale's own points must reach over an onset.
        return Cause(
            "activations",
            UNTESTED,
            f"the activation statistics are logged only at steps {span[0]:,}-{span[1]:,}",
            (f.start_step,),
        )
    if x.has_activations:
        return Cause(
            "activations",
            CONTRADICTED,
            f"the logged activations stay in their range up to step {f.start_step:,}",
            (f.start_step,),
        )
    return _ACTIVATIONS_UNTESTED


def _climb(x: _Facts, f: Finding) -> Cause:
    """A grad-norm drift still going on at the onset (the article's 2.4: the climb comes first)."""
    drifts = [g for g in x.drifts if g is not f]
    going = [
        g
        for g in drifts
        if g.start_step < f.start_step
        and x.ev.ran_into(
            GRAD_NORM, g.end_step if g.end_step is not None else g.start_step, f.start_step
        )
        and g.severity is not Severity.INFO
    ]
    if going:
        g = going[0]
        return Cause(
            "grad_norm_climb",
            SUPPORTED,
            f"the grad norm has been climbing since step {g.start_step:,} "
            f"({steps_text(f.start_step - g.start_step)} before the onset at step "
            f"{f.start_step:,})",
            (g.start_step,),
            anchor=g.start_step,
        )
    # A climb fitted at or after an onset that is itself known only to a range (a score
    # turning between two evals), whose own range reaches into it: the log cannot put the
    # climb after the onset (the article's case: a benchmark fine at 6,000 and down by
    # 8,000, the grad norm climbing from 6,500).
    lo, hi = f.onset_bounds
    level = [
        g
        for g in drifts
        if g.start_step >= f.start_step
        and g.onset_bounds[0] <= hi
        and hi > lo
        and g.severity is not Severity.INFO
    ]
    if level:
        g = level[0]
        g_lo, g_hi = g.onset_bounds
        own = f" (anywhere in {g_lo:,}-{g_hi:,})" if g_hi > g_lo else ""
        return Cause(
            "grad_norm_climb",
            SUPPORTED,
            f"the grad norm has been climbing since step {g.start_step:,}{own}; this onset is "
            f"known only to steps {lo:,}-{hi:,}, so the log cannot put it after this onset",
            (g.start_step,),
            anchor=g.start_step,
        )
    if drifts:
        return Cause(
            "grad_norm_climb",
            CONTRADICTED,
            f"the grad-norm drift the log shows is not going on at step {f.start_step:,}",
            (f.start_step,),
        )
    if not x.has_grad_norm:
        return _CLIMB_UNTESTED
    span = x.grad_norm_span
    if span is not None and not span[0] < f.start_step <= span[1] + x.near:
        # No climb can be seen where nothing was logged: a grad norm logged for the first
        # 2,000 steps says nothing of a climb before step 8,000.
        where = (
            f"nothing of the grad norm is logged before step {f.start_step:,} (it begins at "
            f"step {span[0]:,})"
            if f.start_step <= span[0]
            else f"the grad norm is logged only at steps {span[0]:,}-{span[1]:,}"
        )
        return Cause("grad_norm_climb", UNTESTED, where, (f.start_step,))
    return Cause(
        "grad_norm_climb",
        CONTRADICTED,
        f"no grad-norm drift before step {f.start_step:,}",
        (f.start_step,),
    )


def _pause_spacing(g: Finding) -> float | None:
    """The mean steps between the slow steps a stall note gathers (None: a single pause)."""
    n = g.measures.get("slow_steps")
    if isinstance(n, int) and n >= 2 and g.end_step is not None and g.end_step > g.start_step:
        return (g.end_step - g.start_step) / (n - 1)
    return None


def _eval_pause(x: _Facts, f: Finding) -> Cause:
    ev = x.ev
    lo, hi = f.start_step, f.end_step if f.end_step is not None else f.start_step
    stalls = [
        g
        for g in x.stalls
        if g is not f and g.start_step <= hi and (g.end_step or g.start_step) >= lo - 1
    ]
    outlasted: list[tuple[Finding, float]] = []
    after_one: Finding | None = None
    for g in stalls:
        # A stall note may gather slow steps spread over the run (a save every 5,000 steps):
        # its span overlapping the finding is no evidence. A pause slows a step or two; a
        # slowdown that outlasts the steps between the pauses is not one of them.
        every = _pause_spacing(g)
        if every is not None and hi - lo >= every:
            outlasted.append((g, every))
            continue
        # Nor does one pause (a hang, a pre-emption) explain a run slower for thousands of
        # steps after it; the near reach allows for a pause's own aftermath.
        between = g.measures.get("steps_between")
        reach = max(x.near, between if isinstance(between, int) else 0)
        if every is None and hi - max(lo, g.end_step or g.start_step) > reach:
            after_one = after_one or g
            continue
        return Cause(
            "eval_pause",
            SUPPORTED,
            f"the job stalled at step {g.start_step:,}",
            (g.start_step,),
            anchor=g.start_step,
        )
    if after_one is not None:
        return Cause(
            "eval_pause",
            CONTRADICTED,
            f"the job stalled at step {after_one.start_step:,}, but the slowdown lasts "
            f"{steps_text(hi - lo)} after it: a pause slows a step or two",
            (lo,),
        )
    if outlasted:
        g, every = outlasted[0]
        return Cause(
            "eval_pause",
            CONTRADICTED,
            f"the slowdown lasts {steps_text(hi - lo)}, longer than the {every:,.0f} steps between "
            f"the job's pauses ({g.measures.get('slow_steps')} slow steps from step "
            f"{g.start_step:,} to {g.end_step:,}): a pause slows a step or two",
            (lo,),
        )
    periods = {k: p for k, p in ev.revealed_periods.items() if k not in ("epoch", "lr_restart")}
    if not periods:
        return Cause("eval_pause", UNTESTED, "the log shows no eval or checkpoint interval")
    names = {"eval_interval": "eval", "checkpoint_interval": "checkpoint"}
    said: list[str] = []
    long_on_grid: list[str] = []  # grids the onset is on, outlasted by the finding
    period = f.measures.get("period_steps") if f.kind is FindingKind.PERIODIC_SPIKES else None
    for k, p in periods.items():
        every = int(round(p.steps))
        if every <= 0:
            continue
        if isinstance(period, (int, float)) and period > 0:
            ratio = float(period) / p.steps
            if abs(ratio - round(ratio)) <= 0.05 and round(ratio) >= 1:
                return Cause(
                    "eval_pause",
                    SUPPORTED,
                    f"the period ({_g(float(period))} steps) is {round(ratio)}x the "
                    f"{names.get(k, k)} interval ({every:,} steps)",
                    (f.start_step,),
                    anchor=every,
                )
            said.append(f"{names.get(k, k)} every {every:,} steps")
            continue
        off = (lo - p.origin) % p.steps
        # A pause slows a step or two on its grid; a slowdown that outlasts the interval
        # itself (600 steps against evals every 500) is not one, whatever step it began at.
        on_grid = min(off, p.steps - off) <= 1
        if on_grid and hi - lo >= p.steps:
            long_on_grid.append(f"{names.get(k, k)} every {every:,} steps")
            continue
        if on_grid:
            # (how long it lasted, so a reader can weigh a pause against a longer slowdown)
            lasted = f"; the slowdown lasts {steps_text(hi - lo)}" if hi > lo else ""
            return Cause(
                "eval_pause",
                SUPPORTED,
                f"step {lo:,} is on the {names.get(k, k)} grid (every {every:,} steps){lasted}",
                (lo,),
                anchor=lo,
            )
        said.append(f"{names.get(k, k)} every {every:,} steps")
    what = f"the period of {_g(float(period))} steps" if period else f"step {lo:,}"
    if long_on_grid:
        return Cause(
            "eval_pause",
            CONTRADICTED,
            f"step {lo:,} is on the grid ({', '.join(long_on_grid)}), but the slowdown lasts "
            f"{steps_text(hi - lo)}, longer than the interval: a pause slows a step or two; no "
            "stall",
            (lo,),
        )
    return Cause(
        "eval_pause",
        CONTRADICTED,
        f"{what} does not match the log's intervals ({', '.join(said)}); no stall",
        (lo,),
    )


def _val_change(x: _Facts, f: Finding) -> Cause:
    # The held-out loss the finding is about (an eval set's, eval/<set>_loss), else the
    # validation loss, else the first eval set's: a run logging only eval sets had read "no
    # validation loss in the log" beside a gap finding on one of them.
    from forensics.schema import held_out_set

    if f.metric is not None and held_out_set(f.metric) is not None:
        held: str | None = f.metric
    else:
        losses = [VAL_LOSS] + sorted(m for m in x.ev.run.metrics() if held_out_set(m))
        held = next((m for m in losses if x.ev.has(m)), None)
    if held is None or not x.ev.has(held):
        return Cause("val_set_change", UNTESTED, "no validation loss in the log")
    named = "the validation loss" if held == VAL_LOSS else held
    lo = f.start_step
    shifts = [
        g
        for g in x.val_shifts
        if g is not f and g.start_step <= lo + NEAR_STEPS and g.metric in (held, None)
    ]
    if shifts:
        g = shifts[-1]
        return Cause(
            "val_set_change",
            SUPPORTED,
            f"{named} stepped to a new level at step {g.start_step:,} while the training "
            "loss was flat",
            (g.start_step,),
            anchor=g.start_step,
        )
    val = x.ev.series(held)
    upto = lo + NEAR_STEPS  # as far as the search looked, or where the val loss ends
    if len(val):
        upto = min(upto, int(val.steps[-1]))
    return Cause(
        "val_set_change",
        CONTRADICTED,
        f"no step in {named} up to step {upto:,} that the training loss does not share",
        (lo,),
    )


def _repeated_data(x: _Facts, f: Finding) -> Cause:
    """An overfitting or a widening gap: had the training examples come around again by then?
    Supported from the second epoch on: the epoch series says which epoch ran at the onset,
    or where the second pass began within the finding's steps. Never contradicted: in the
    first epoch the examples may still repeat (duplicates, an oversampled source: the
    multi_eval_sets sample memorises 2 KB that fill 12 of every 16 rows), which no epoch
    count shows; untested then, and without an epoch count in the log."""
    from forensics.evidence.spike_context import epoch_at
    from forensics.schema import EPOCH

    epochs = x.ev.series(EPOCH)
    lo, hi = f.onset_bounds
    end = max(hi, f.end_step if f.end_step is not None else f.start_step)
    at_onset = epoch_at(epochs, lo)
    if at_onset is None:
        return Cause("repeated_data", UNTESTED, "no epoch count in the log", (f.start_step,))
    began = x.ev.epoch_boundaries  # (the evidence's, computed once)
    if at_onset >= 2:
        since = max((b for b in began if b <= lo), default=None)
        frm = f" (begun {_epoch_start(epochs, since)})" if since is not None else ""
        return Cause(
            "repeated_data",
            SUPPORTED,
            f"at step {lo:,} the run was in its {ordinal(at_onset)} epoch{frm}: each training "
            f"example had been seen at least {at_onset - 1:,} time{'s' if at_onset > 2 else ''}",
            (lo,),
            anchor=since,
        )
    again = next((b for b in began if lo < b <= end), None)
    if again is not None:
        # (the epoch that began there: its count's whole part there, plus one, in either
        # convention, as Evidence.epoch_boundaries finds the step)
        number = int(np.floor(np.interp(again, epochs.steps, epochs.values) + 1e-6)) + 1
        return Cause(
            "repeated_data",
            SUPPORTED,
            f"epoch {number} began {_epoch_start(epochs, again)}, within the finding's steps "
            f"({lo:,}-{end:,}): the training examples came around again",
            (again,),
            anchor=again,
        )
    return Cause(
        "repeated_data",
        UNTESTED,
        f"the run was in its first epoch up to step {end:,}; examples repeated within it "
        "(duplicates, an oversampled source) no epoch count shows",
        (f.start_step,),
    )


def _epoch_start(epochs: Any, b: int) -> str:
    """When the epoch whose count first shows at logged step ``b`` began: "after step b"
    where the count there is whole epochs done (the HF Trainer's 1.0 with the first epoch's
    last step), "at step b" where the point before is the step before, else "between steps
    p and b" (the count logged every few steps)."""
    steps, v = epochs.steps, epochs.values
    i = int(np.searchsorted(steps, b))
    fractional = bool(np.any(np.abs(v - np.round(v)) > 1e-6))
    if fractional and abs(float(v[i]) - round(float(v[i]))) <= 1e-6:
        return f"after step {b:,}"
    if i == 0 or int(steps[i - 1]) >= b - 1:
        return f"at step {b:,}"
    return f"between steps {int(steps[i - 1]):,} and {b:,}"


def _lr_decay(x: _Facts, f: Finding) -> Cause:
    """A grad-norm drift: does the LR decay explain it? With weight decay the grad norm grows
    about as sqrt(lr_baseline / lr) while the LR falls (the detector's envelope), so the
    status is the detector's own verdict (``schedule_explained``, which makes the finding a
    note); the evidence names the numbers and, where the decay does not explain the climb,
    the reason, checked in the detector's order. Untested without a logged LR."""
    m = f.measures
    at = (f.start_step,)
    if not m.get("lr_logged"):
        return Cause("lr_decay", UNTESTED, _NO_LR, at)
    lr0, lr1 = m.get("lr_baseline"), m.get("lr_now")
    ratio, expected = m.get("ratio"), m.get("expected_rise")
    base, line = m.get("baseline"), f.judged_against.get("warn_line_now")
    line_x = line / base if isinstance(line, float) and isinstance(base, float) and base else None
    # (the LRs as the finding's sentence writes them)
    span = (
        f"from {sig(lr0)} to {sig(lr1)}"
        if isinstance(lr0, float) and isinstance(lr1, float) and lr1 < lr0
        else None
    )
    fell = f"the LR fell {span}" if span else None
    if m.get("schedule_explained"):
        under = f", under the {line_x:.1f}x warning line that sets" if line_x else ""
        return Cause(
            "lr_decay",
            SUPPORTED,
            f"{fell or 'the LR decayed'} over the climb, which explains a rise up to "
            f"{_x(expected)}; the grad norm stands at {_x(ratio)}{under}",
            at,
        )
    ws, phase = m.get("warning_step"), m.get("lr_phase_at_warning")
    if m.get("loss_rises"):
        why = "the loss rose with it: a decaying LR explains a growing grad norm, not a rising loss"
    elif isinstance(ws, int) and phase not in ("decay", "cooldown"):
        lr = x.ev.schedule.lr_at(ws)
        how = {
            "constant": f"held at {sig(lr)}" if lr is not None else "held",
            "warmup": "was still warming up",
        }.get(str(phase), "was not decaying")
        why = f"the grad norm passed its 2x line at step {ws:,} while the LR {how}"
    elif line_x is not None and isinstance(ratio, float) and ratio > line_x:
        decay = f"the LR decay {span}" if span else "the LR decay"
        why = (
            f"{decay} explains a rise up to {_x(expected)}; the grad norm "
            f"stands at {_x(ratio)}, above the warning line of {line_x:.1f}x"
        )
    else:
        where = f" at step {ws:,}" if isinstance(ws, int) else ""
        why = f"the LR had barely decayed when the grad norm passed its 2x line{where}"
    return Cause("lr_decay", CONTRADICTED, why, at)


def _x(r: Any) -> str:
    return f"{r:.1f}x" if isinstance(r, (int, float)) else "n/a"


def _shallow_layers(x: _Facts, f: Finding) -> Cause:
    """The article's first cause of a grad-norm drift (3.4): the shallow layers (the first
    third of the logged ones) taking a growing share of the gradient, 8% to nearly 20% in
    its case. Supported by a layer_grad_shift of layers in that third overlapping the drift;
    else read from their share of the summed squared layer norms (:func:`_share_change`).
    Untested without per-layer grad norms."""
    got = x.grad_shares
    if got is None:
        return Cause(
            "shallow_layers", UNTESTED, "no per-layer grad norms in the log (grad_norm_layer)"
        )
    steps, layers, shares = got
    n = len(layers)
    shallow = layers[: max(1, n // 3)]
    end = f.end_step if f.end_step is not None else int(steps[-1])
    for g in x.layer_shifts:
        group = parse_layers(str(g.measures.get("layers") or ""))
        g_end = g.end_step if g.end_step is not None else g.start_step
        if (
            group
            and max(group) <= shallow[-1]
            and g.start_step <= end
            and g_end >= f.start_step
            and g.severity is not Severity.INFO
        ):
            before, after = g.measures.get("share_before"), g.measures.get("share_after")
            grew = (
                f" from {before:.0%} to {after:.0%}"
                if isinstance(before, float) and isinstance(after, float)
                else ""
            )
            return Cause(
                "shallow_layers",
                SUPPORTED,
                f"layers {g.measures.get('layers')}' share of the squared grad norm grew{grew} "
                f"(layer_grad_shift from step {g.start_step:,}), among the shallowest "
                f"{len(shallow):,} of the {n:,} logged layers",
                (g.start_step,),
            )
    cols = [layers.index(v) for v in shallow]
    names = f"layer {shallow[0]}" if len(shallow) == 1 else f"layers {shallow[0]}-{shallow[-1]}"
    return _share_change(
        "shallow_layers",
        f,
        end,
        steps,
        shares[:, cols].sum(axis=1),
        f"{names} (the shallowest {len(shallow):,} of {n:,} logged)",
        f"too few per-layer grad norms before step {f.start_step:,} or near step {end:,} to "
        f"compare {names}' share",
    )


def _share_change(
    cause: str,
    f: Finding,
    end: int,
    steps: np.ndarray,
    share: np.ndarray,
    who: str,
    too_few: str,
) -> Cause:
    """A part of the model's share of the squared grad norm before a drift's onset against
    the drift's last fifth (medians, three points at least on each side): supported when it at
    least doubled and gained 10 points of the total (a layer_grad_shift's lines), contradicted
    when it grew less than :data:`_SHARE_HELD` times, untested in between."""
    from forensics.evidence.module_share import share_doubled

    late_from = end - max(1, (end - f.start_step) // 5)
    early = share[steps < f.start_step]
    late = share[(steps >= late_from) & (steps <= end)]
    if len(early) < 3 or len(late) < 3:
        return Cause(cause, UNTESTED, too_few)
    a, b = float(np.median(early)), float(np.median(late))
    told = (
        f"{who} took {a:.1%} of the squared grad norm before step {f.start_step:,} and "
        f"{b:.1%} over steps {late_from:,}-{end:,} (medians)"
    )
    if share_doubled(a, b):
        return Cause(cause, SUPPORTED, told, (f.start_step, end))
    if b < _SHARE_HELD * a:
        return Cause(cause, CONTRADICTED, told, (f.start_step, end))
    return Cause(
        cause,
        UNTESTED,
        told + ": a rise short of doubling with 10 points gained",
        (f.start_step, end),
    )


_SHARE_HELD = 1.25  # a share under this many times its earlier one has held


def _embed_head(x: _Facts, f: Finding) -> Cause:
    """The article's second cause of a grad-norm drift (3.4, its table): the embedding and
    the output head, at the trunk's learning rate, taking a growing share of the gradient:
    their squared grad norms over the squared total grad norm (:func:`_share_change`).
    Untested where neither module's grad norm is logged."""
    from forensics.evidence.module_share import module_shares

    got = module_shares(x.ev)
    if got is None:
        return Cause(
            "embed_head",
            UNTESTED,
            "no embedding or output-head grad norm in the log (grad_norm_embed, grad_norm_head)",
        )
    end = f.end_step if f.end_step is not None else int(x.ev.series(GRAD_NORM).steps[-1])
    return _share_change(
        "embed_head",
        f,
        end,
        got.steps,
        got.total,
        got.names,
        f"too few points with both {got.names}'s and the total grad norm before step "
        f"{f.start_step:,} or near step {end:,}",
    )


_TESTERS: dict[str, Callable[[_Facts, Finding], Cause]] = {
    "lr_change": _lr_change,
    "lr_schedule": _lr_schedule,
    "resume": _resume,
    "loss_scale_overflow": _overflow,
    "bad_batch": _bad_batch,
    "shared_data": lambda x, f: _SHARED_DATA,
    "activations": _activations,
    "grad_norm_climb": _climb,
    "large_gradient": _large_gradient,
    "lr_zero": _lr_zero,
    "no_update": _no_update,
    "eval_pause": _eval_pause,
    "val_set_change": _val_change,
    "repeated_data": _repeated_data,
    "lr_decay": _lr_decay,
    "shallow_layers": _shallow_layers,
    "embed_head": _embed_head,
}


def _article_causes(kind: FindingKind) -> list[tuple[str | None, Cause]]:
    """The article's causes for a kind: each with the tested hypothesis that covers it (it is
    then left out when that hypothesis was tested), as untested causes in its words."""
    if kind not in _ARTICLE:
        entry = TABLE.get(kind)
        covered = _COVERED.get(kind, {})
        why = _UNTESTED_WHY.get(kind, "no series in the log shows this")
        _ARTICLE[kind] = [
            (covered.get(i), Cause("article", UNTESTED, why, (), text.rstrip(".")))
            for i, text in enumerate(entry.causes if entry else ())
        ]
    return _ARTICLE[kind]


_ARTICLE: dict[FindingKind, list[tuple[str | None, Cause]]] = {}
# Why an article cause stays untested, where "no series in the log shows this" would read as
# doubting the finding itself: a restart is in the log; what stopped the job is not.
_UNTESTED_WHY: dict[FindingKind, str] = {
    FindingKind.GRAD_NORM_OUTLIERS: (
        "the log holds no batch contents: match the highest outliers' steps to the data"
    ),
    FindingKind.RESTART: (
        "the log shows that the job started again, not what stopped it: a crash, a preemption "
        "and a manual restart leave the same records"
    ),
}
_ORDER = {SUPPORTED: 0, CONTRADICTED: 1, UNTESTED: 2}


def find_causes(ev: Evidence, f: Finding, findings: Sequence[Finding]) -> list[Cause]:
    """The causes of one finding, each tested against the evidence (supported ones first).

    Args:
        ev: the evidence the findings were judged against.
        f: the finding.
        findings: the run's findings (restarts, stalls, activation outliers, grad-norm
            drifts and val_shifts are evidence for the others; other kinds are ignored).
    """
    return _find_causes(_Facts(ev, findings), f)


def _find_causes(x: _Facts, f: Finding) -> list[Cause]:
    out = _chain([_TESTERS[name](x, f) for name in _TESTS.get(f.kind, ())])
    tested = {c.cause for c in out}
    out += [c for by, c in _article_causes(f.kind) if by is None or by not in tested]
    return sorted(out, key=lambda c: (_ORDER[c.status], c.consequence_of is not None))


def _chain(causes: list[Cause]) -> list[Cause]:
    """Mark supported mechanisms that follow a supported root as its consequence."""
    roots = [c for c in causes if c.status == SUPPORTED and c.cause in ("lr_change", "bad_batch")]
    if not roots:
        return causes
    root = min(roots, key=lambda c: c.steps[0] if c.steps else 0)
    out = []
    for c in causes:
        if (
            c.status == SUPPORTED
            and c.cause in ("loss_scale_overflow", "activations", "large_gradient")
            and c.steps
            and root.steps
            and c.steps[0] >= root.steps[0]
        ):
            c = Cause(c.cause, c.status, c.evidence, c.steps, c.text, root.cause, c.anchor)
        out.append(c)
    return out


def causes_of(ev: Evidence, findings: Sequence[Finding]) -> list[list[Cause]]:
    """:func:`find_causes` for every finding, in the findings' order."""
    x = _Facts(ev, findings)  # (what every finding's tests read, once)
    return [_find_causes(x, f) for f in findings]


def supported_roots(causes: Iterable[Cause]) -> list[Cause]:
    """The supported root causes (control inputs and outside events): the causes to act on."""
    return [c for c in causes if c.status == SUPPORTED and c.cause in ROOTS]


def supported_mechanisms(causes: Iterable[Cause]) -> list[Cause]:
    """Supported mechanisms (an overflow, activations) that no supported root explains: how
    the trouble happened when the log shows no why."""
    return [
        c
        for c in causes
        if c.status == SUPPORTED and c.cause not in ROOTS and c.consequence_of is None
    ]


__all__ = [
    "CAUSES",
    "CONTROLS",
    "ROOTS",
    "Cause",
    "causes_of",
    "supported_mechanisms",
    "supported_roots",
    "find_causes",
]
