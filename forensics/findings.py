"""Findings: what a detector reports. Plain data, no HTML, no prescriptions (see diagnosis).

Run-level findings (restart, truncated_log, crash) come from the importers (``metric`` is null).
The measures of every finding kind are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from forensics.measures import check_keys, declared


class Severity(StrEnum):
    """The article's traffic lights: yellow = warning, orange = critical, red = fatal.

    Order, light, colour and wording come from one table, :data:`LOOKS`, which the report, the
    charts, the terminal summary and compare all read.
    """

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"
    FATAL = "fatal"

    @property
    def look(self) -> Look:
        return LOOKS[self.value]

    @property
    def rank(self) -> int:
        """0 (info) to 3 (fatal): sort by this, never by the name."""
        return self.look.rank

    @property
    def light(self) -> str:
        """The article's traffic light: blue (a note), yellow, orange or red."""
        return self.look.light

    @property
    def colour(self) -> str:
        """The light's colour in the report and the charts (hex)."""
        return self.look.colour

    @property
    def label(self) -> str:
        """What the light means, in a few words (the report's banner)."""
        return self.look.label


@dataclass(frozen=True)
class Look:
    """How a severity (or the ``healthy`` verdict) is shown: the one table of lights."""

    rank: int  # order: info < warning < critical < fatal (healthy sorts with info)
    light: str  # the article's traffic light (6.3)
    colour: str  # hex, for HTML and charts
    term: str  # rich colour name, for the terminal
    label: str  # what the light asks of the reader


LOOKS: dict[str, Look] = {
    "healthy": Look(0, "green", "#2ca02c", "green", "Healthy: no warning sign"),
    "info": Look(0, "blue", "#4c78a8", "blue", "Note"),
    "warning": Look(1, "yellow", "#e0b000", "yellow", "Yellow light: keep an eye on it"),
    "critical": Look(
        2, "orange", "#f07f0e", "dark_orange", "Orange light: pause and look before going on"
    ),
    "fatal": Look(3, "red", "#d62728", "red", "Red light: the run needs a rollback"),
}


def look(verdict_or_severity: str) -> Look:
    """The look of a verdict (``healthy`` or a severity's name) or a severity."""
    return LOOKS[str(verdict_or_severity)]


class FindingKind(StrEnum):
    """The fixed vocabulary of finding kinds (findings document schema_version 1)."""

    LOSS_SPIKE = "loss_spike"
    GRAD_NORM_SPIKE = "grad_norm_spike"
    GRAD_NORM_OUTLIERS = "grad_norm_outliers"
    PERIODIC_SPIKES = "periodic_spikes"
    DIVERGENCE = "divergence"
    LOSS_CLIMB = "loss_climb"
    NAN_INF = "nan_inf"
    LOSS_SCALE_DROP = "loss_scale_drop"
    GRAD_NORM_DRIFT = "grad_norm_drift"
    PARAM_NORM_JUMP = "param_norm_jump"
    LAYER_GRAD_SHIFT = "layer_grad_shift"
    ACTIVATION_OUTLIER = "activation_outlier"
    OVERFITTING = "overfitting"
    GAP_ACCELERATION = "gap_acceleration"
    VAL_SHIFT = "val_shift"
    EVAL_REGRESSION = "eval_regression"
    RESUME_REGRESSION = "resume_regression"
    RESUME_DROP = "resume_drop"
    RESUME_SETBACK = "resume_setback"
    LR_RESTART = "lr_restart"
    PLATEAU = "plateau"
    NO_LEARNING = "no_learning"
    THROUGHPUT_DROP = "throughput_drop"
    STALL = "stall"
    MEMORY_GROWTH = "memory_growth"
    RESTART = "restart"
    REPLACED_ATTEMPT = "replaced_attempt"
    TRUNCATED_LOG = "truncated_log"
    CRASH = "crash"


# Kinds that describe the training dynamics going wrong; an ongoing one makes the eve of a later
# event unhealthy too. Infrastructure and evaluation findings do not move the rollback point.
DYNAMICS: frozenset[FindingKind] = frozenset(
    {
        FindingKind.LOSS_SPIKE,
        FindingKind.GRAD_NORM_SPIKE,
        FindingKind.DIVERGENCE,
        FindingKind.LOSS_CLIMB,
        FindingKind.NAN_INF,
        FindingKind.LOSS_SCALE_DROP,
        FindingKind.GRAD_NORM_DRIFT,
        FindingKind.PARAM_NORM_JUMP,
        FindingKind.LAYER_GRAD_SHIFT,
        FindingKind.ACTIVATION_OUTLIER,
        FindingKind.PERIODIC_SPIKES,
    }
)


MeasureValue = float | int | str | bool | None


def clean_measure(value: Any) -> MeasureValue:
    """Make a measure JSON-safe: numpy scalars become Python numbers, NaN/Inf become None."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if hasattr(value, "item"):  # numpy scalar
        value = value.item()
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return str(value)


_AS_IS = frozenset({str, bool, int, type(None)})  # clean_measure returns these unchanged


def clean_measures(measures: Mapping[Any, Any]) -> dict[str, MeasureValue]:
    """``{str(k): clean_measure(v)}``: the plain Python values (most of them) decided by their
    exact type without the call (thousands of findings per run, dozens of measures each). The
    copy is made at once and only the values that change are written back."""
    out = dict(measures)
    other_keys = False
    for k, v in out.items():
        t = type(v)
        if t is float:
            if not math.isfinite(v):
                out[k] = None
        elif t not in _AS_IS:
            out[k] = clean_measure(v)
        if type(k) is not str:
            other_keys = True
    if other_keys:
        out = {k if type(k) is str else str(k): v for k, v in out.items()}
    return out


@dataclass(frozen=True)
class Finding:
    """One thing a detector saw in the run.

    Steps are optimizer steps as the log gives them. ``start_step`` is the onset of the
    event, not the step where it was first noticed.
    """

    kind: FindingKind
    severity: Severity
    metric: str | None
    start_step: int
    summary: str
    peak_step: int | None = None
    end_step: int | None = None
    measures: Mapping[str, MeasureValue] = field(default_factory=dict)
    # What the detector judged against (baseline, alarm lines, thresholds), from the evidence
    # layer: charts draw exactly these numbers.
    judged_against: Mapping[str, MeasureValue] = field(default_factory=dict)
    # The steps the onset estimate cannot tell apart, when it is a bend fitted on bins of
    # points or between evaluations (trend_utils.Hinge.range: the knots that fit about as
    # well, at least a bin either side); None when start_step is the logged step where the
    # change shows.
    onset_range: tuple[int, int] | None = None
    # A finding that stands for many like events (grad_norm_outliers: every absorbed
    # single-batch outlier of a run, one note instead of thousands; periodic_spikes: the
    # onset of each spike that recurs; stall: each of three or more hangs inside single
    # steps): the step of each, in order. None for a finding of
    # one event, whose steps are start_step .. end_step.
    events_at: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        # Coerce here so every producer gets JSON-safe measures and plain ints for free.
        if type(self.kind) is not FindingKind:
            object.__setattr__(self, "kind", FindingKind(self.kind))
        if type(self.severity) is not Severity:
            object.__setattr__(self, "severity", Severity(self.severity))
        for name in ("start_step", "peak_step", "end_step"):
            v = getattr(self, name)
            if type(v) is not int and (v is not None or name == "start_step"):
                object.__setattr__(self, name, int(v))
        object.__setattr__(self, "measures", clean_measures(self.measures))
        if not declared(self.kind).keys() >= self.measures.keys():
            check_keys(self.kind, self.measures)  # a renamed measure key fails loudly
        object.__setattr__(self, "judged_against", clean_measures(self.judged_against))
        if self.onset_range is not None:
            lo, hi = (int(v) for v in self.onset_range)
            lo, hi = min(lo, self.start_step), max(hi, self.start_step)
            # A range of the onset step alone is an exact onset (a bend fitted at the first
            # point after the warm-up read "anywhere in 32-32").
            object.__setattr__(self, "onset_range", None if lo == hi else (lo, hi))
        if self.events_at is not None:
            object.__setattr__(self, "events_at", tuple(int(v) for v in self.events_at))

    @property
    def onset_bounds(self) -> tuple[int, int]:
        """The earliest and latest step the onset may be at (both start_step when exact)."""
        return self.onset_range if self.onset_range is not None else (self.start_step,) * 2

    def sort_key(self) -> tuple[int, int, str]:
        return (self.start_step, -self.severity.rank, self.kind.value)

    def to_dict(self, prescription: str = "") -> dict[str, Any]:
        """The finding as it appears in the findings document (stable key order)."""
        return {
            "kind": self.kind.value,
            "severity": self.severity.value,
            "metric": self.metric,
            "start_step": self.start_step,
            "peak_step": self.peak_step,
            "end_step": self.end_step,
            "onset_range": list(self.onset_range) if self.onset_range is not None else None,
            "events_at": list(self.events_at) if self.events_at is not None else None,
            "measures": dict(self.measures),
            "judged_against": dict(self.judged_against),
            "summary": self.summary,
            "prescription": prescription,
        }


def step_range(start: int, end: int | None = None) -> str:
    """ "501-652" for a span, "501" for a single step (or an end equal to the start)."""
    if end is None or int(end) == int(start):
        return f"{int(start):,}"
    return f"{int(start):,}-{int(end):,}"


def turned_between(step: int, onset_range: tuple[int, int] | list[int] | None) -> bool:
    """Whether an onset's range is the stretch between two logged points it turned in (a
    score at its best at one eval and lower at the next: the range starts at the onset),
    not the steps a bend fitted inside it cannot be told from."""
    return onset_range is not None and int(step) == int(onset_range[0]) < int(onset_range[1])


def onset_at(step: int, onset_range: tuple[int, int] | list[int] | None = None) -> str:
    """``2,995``; for a fitted onset ``2,995 (anywhere in 2,940-3,050)``; for a turn between
    two logged points ``2,995 (turned after it, by 3,050)``."""
    if onset_range is None:
        return f"{int(step):,}"
    if turned_between(step, onset_range):
        return f"{int(step):,} (turned after it, by {int(onset_range[1]):,})"
    return f"{int(step):,} (anywhere in {step_range(*onset_range)})"


def finding_steps(f: Finding) -> str:
    """A finding's steps as text: its start, or start-end when it spans several steps."""
    return step_range(f.start_step, f.end_step)


# What a finding's peak step is, where it is not the series' highest point: a throughput
# drop's lowest rate, a stall's slowest step, an eval regression's worst score (the report's
# card had called a drop's lowest point its "peak").
_PEAK_WORDS = {
    FindingKind.THROUGHPUT_DROP: "lowest",
    FindingKind.STALL: "slowest",
    FindingKind.EVAL_REGRESSION: "worst",
}


def peak_word(f: Finding) -> str:
    """The word for a finding's ``peak_step`` ("peak", "lowest", "slowest", "worst")."""
    return _PEAK_WORDS.get(f.kind, "peak")


def steps_text(n: int | float | None) -> str:
    """ "1 step", "12 steps": counts of steps in summaries."""
    if n is None:
        return "? steps"
    n = int(n)
    return f"{n:,} step" if n == 1 else f"{n:,} steps"


def scale_text(x: float | None) -> str:
    """A loss scale as a reader compares it: "131,072" for a whole number (scales are powers
    of two), "0.5" or "1.5e+20" otherwise, "n/a" for none; one form in every sentence."""
    if x is None or not math.isfinite(x):
        return "n/a" if x is None else str(x)
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:.4g}"


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Step order, then the most severe first at equal steps."""
    return sorted(findings, key=Finding.sort_key)


# Notes a reader looks for first: what the loss and the job itself did.
NOTES_FIRST = frozenset(
    {"loss_spike", "restart", "truncated_log", "crash", "plateau", "loss_scale_drop"}
)


def notes_in_reading_order(findings: list[Finding]) -> list[Finding]:
    """The informational findings as a reader should meet them: notes about the loss and the
    job first, then rarer kinds before frequent ones, each in step order. A long run's flood
    of one kind (thousands of absorbed grad-norm spikes) then cannot push a rarer note, or the
    loss's own spikes, past what a report or a terminal shows."""
    notes = [f for f in findings if f.severity is Severity.INFO]
    count: dict[str, int] = {}
    for f in notes:
        count[f.kind.value] = count.get(f.kind.value, 0) + 1
    return sorted(
        notes,
        key=lambda f: (f.kind.value not in NOTES_FIRST, count[f.kind.value], f.start_step),
    )


def worst_severity(findings: list[Finding]) -> Severity | None:
    if not findings:
        return None
    return max((f.severity for f in findings), key=lambda s: s.rank)
