"""The article's phase checklists (section 6.2) evaluated on a run, and a coverage note (6.1).

Each item is answered ``pass``, ``fail`` or ``not measurable`` with the evidence behind the
answer. Items read the findings first (a detector already judged the event) and fall back to
plain measurements of the series. Phases (:func:`phase_bounds`): start-up is steps 0-1000, the
middle runs from 1001 to the run's half-way point, the late phase is the second half; a run
shorter than 2,000 steps is split in proportion (quarter, quarter, half). The phases never
overlap; a finding counts in every phase its steps cross.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from forensics.evidence import Evidence
from forensics.evidence.order_stats import median_value
from forensics.evidence.robust import median_interval
from forensics.evidence.trend_utils import steps_within, unit_for
from forensics.findings import Finding, FindingKind, Severity, step_range, steps_text
from forensics.schema import (
    ACT_ABSMAX,
    ACT_MEAN,
    ACT_STD,
    GRAD_NORM,
    GRAD_NORM_LAYER,
    LOSS,
    LOSS_SCALE,
    LR,
    MEMORY,
    NAN_ITERS,
    PARAM_NORM,
    STEP_TIME,
    THROUGHPUT,
    VAL_LOSS,
)

PASS, FAIL, NA = "pass", "fail", "not measurable"
STARTUP_END = 1000  # the article's start-up phase: steps 0-1000
# The checklists' own plain measurements (where no detector judged the phase):
SETTLED_RATIO = 1.5  # start-up: the grad norm's last third at most 1.5x its first third
CLIMB_RATIO = 1.2  # middle: a grad norm 20% up while the loss falls is not falling with it
VAL_RISE = 0.01  # late: a last val loss 1% above the phase's best has started to rise


@dataclass(frozen=True)
class Item:
    question: str
    status: str  # pass | fail | not measurable
    evidence: str


@dataclass(frozen=True)
class Phase:
    key: str  # startup | middle | late
    title: str
    start: int
    end: int
    items: list[Item]


@dataclass(frozen=True)
class Coverage:
    """One row of the article's monitoring-cadence table against what the run logged."""

    signs: str
    metrics: tuple[str, ...]
    cadence: str  # the article's recommendation
    logged: bool
    observed: str  # what the run did ("every 10 steps", "not logged")
    sparse: bool  # logged less often than the article recommends


def _window(
    ev: Evidence, metric: str, lo: int, hi: int, layer: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Steps and finite values of one series within ``[lo, hi]`` (the evidence's arrays: the
    measurements below need no NaN handling)."""
    s = ev.series(metric, layer)
    # Steps are sorted: the window is a slice (read-only views, no copies of a long series).
    at = steps_within(s.steps, lo, hi)
    steps, values = s.steps[at], s.values[at]
    steps.flags.writeable = values.flags.writeable = False
    return steps, values


def _in(
    findings: list[Finding], kinds: set[FindingKind], lo: int, hi: int, *, notes: bool = False
) -> list[Finding]:
    """Findings of ``kinds`` (above info, or of any severity with ``notes``) whose steps cross
    the phase: a divergence that began in the middle phase is still there in the late one."""
    return [
        f
        for f in findings
        if f.kind in kinds
        and f.start_step <= hi
        and (f.start_step if f.end_step is None else f.end_step) >= lo
        and (notes or f.severity is not Severity.INFO)
    ]


def _steps(fs: list[Finding]) -> str:
    return ", ".join(f"{f.start_step:,}" for f in fs[:5]) + (" ..." if len(fs) > 5 else "")


def _thirds(v: np.ndarray) -> tuple[float, float]:
    """Median of the first and last third of the finite values."""
    v = v[np.isfinite(v)]
    k = max(1, len(v) // 3)
    return median_value(v[:k]), median_value(v[-k:])


class _Answers(list[Item]):
    """One phase's answers: a finding in the phase answers first, a measurement second."""

    def __init__(self, findings: list[Finding], lo: int, hi: int) -> None:
        super().__init__()
        self.findings, self.lo, self.hi = findings, lo, hi

    def ask(
        self,
        question: str,
        kinds: set[FindingKind],
        what: str,
        measure: Callable[[], Item | None],
        missing: str,
    ) -> None:
        """Fail on a finding of ``kinds`` in the phase; else measure; else not measurable."""
        hits = _in(self.findings, kinds, self.lo, self.hi)
        if hits:
            self.append(Item(question, FAIL, f"{what} at step {_steps(hits)}: {hits[0].summary}"))
            return
        got = measure()
        self.append(got if got is not None else Item(question, NA, missing))


def _g(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1e4 and abs(x) < 1e12 else f"{x:.4g}"


def _startup(ev: Evidence, fs: list[Finding], lo: int, hi: int) -> list[Item]:
    items = _Answers(fs, lo, hi)

    q = "Does the gradient norm settle into a stable range (not keep diverging)?"

    def gn() -> Item | None:
        # Judged after the LR warm-up (the evidence's warm-up end) when enough points follow it:
        # the grad norm settles once the LR stops rising.
        start, after = lo, ""
        wu = ev.warmup_end
        if wu is not None and lo < wu < hi and len(_window(ev, GRAD_NORM, wu, hi)[1]) >= 6:
            start, after = wu, f" (after the LR warm-up, which ends at step {wu:,})"
        _, v = _window(ev, GRAD_NORM, start, hi)
        if len(v) < 6:
            return None
        a, b = _thirds(v)
        ok = b <= SETTLED_RATIO * a
        return Item(
            q,
            PASS if ok else FAIL,
            f"median {_g(a)} in the first third of steps {step_range(start, hi)}{after},"
            f" {_g(b)} in the last third",
        )

    items.ask(
        q,
        {FindingKind.GRAD_NORM_DRIFT, FindingKind.DIVERGENCE},
        "trouble",
        gn,
        "grad norm not logged in this phase",
    )

    q = "Is the loss falling at the expected pace?"

    def lo_() -> Item | None:
        st, v = _window(ev, LOSS, lo, hi)
        if len(v) < 6:
            return None
        a, b = _thirds(v)
        return Item(
            q,
            PASS if b < a else FAIL,
            f"median loss {_g(a)} early in the phase, {_g(b)} late"
            " (no target pace in the log: judged on direction)",
        )

    items.ask(
        q,
        {FindingKind.PLATEAU, FindingKind.DIVERGENCE},
        "loss stalled or diverged",
        lo_,
        "loss not logged in this phase",
    )

    q = "Any NaN or Inf at some step?"

    def nan() -> Item | None:
        bad, checked = [], []
        bad_by: dict[str, list[int]] = {}
        for m in (LOSS, GRAD_NORM, VAL_LOSS):
            if m == VAL_LOSS and not ev.has(VAL_LOSS):
                continue
            got = ev.logged(m)  # every logged point: the non-finite ones are what we look for
            sel = (got.steps >= lo) & (got.steps <= hi)
            st, v = got.steps[sel], got.values[sel]
            if len(v):
                name = m.replace("_", " ")
                checked.append(name)
                here = [int(s) for s in st[~np.isfinite(v)]]
                bad += here
                if here:
                    bad_by[name] = here
        if not checked:
            return None
        # No nan_inf finding above info crosses the phase (``ask`` failed on one before asking
        # this): non-finite points here were set aside by that check, for the reasons its
        # notes and informational findings give (fp16 overflow steps the scaler skipped, the
        # scaler finding its scale, padding after the run stopped). Without such a reason (no
        # check ran) they fail the item.
        reasons = [n.removeprefix("nan_inf: ") for n in ev.run.notes if n.startswith("nan_inf: ")]
        reasons = [r for r in reasons if not r.startswith("not run")]
        reasons += [
            f.summary for f in _in(items.findings, {FindingKind.NAN_INF}, lo, hi, notes=True)
        ]
        if bad and not reasons:
            return Item(
                q,
                FAIL,
                f"non-finite values at step {', '.join(f'{s:,}' for s in sorted(set(bad))[:5])}",
            )
        fine = [name for name in checked if name not in bad_by]
        text = f"{' and '.join(fine)} finite throughout the phase" if fine else ""
        if bad:
            aside = "; ".join(
                f"{name} non-finite at {len(st):,} step{'s' if len(st) != 1 else ''} "
                f"({', '.join(f'{s:,}' for s in st[:5])}{', ...' if len(st) > 5 else ''})"
                for name, st in bad_by.items()
            )
            told = f"{aside}, set aside by the NaN/Inf check: {'; '.join(reasons)}"
            text = f"{text}; {told}" if text else told
        if ev.has(NAN_ITERS):
            # Megatron's count of the NaN-loss iterations it skipped, which its logged loss
            # leaves out (a count above zero is a nan_inf finding, failed above).
            got = ev.logged(NAN_ITERS)
            counts = got.values[(got.steps >= lo) & (got.steps <= hi)]
            if len(counts) and not (counts > 0).any():
                text += "; the trainer counted no iteration with a NaN loss (nan_iters)"
        if "hf_trainer_state" in ev.run.format:
            # HF Trainer's logging_nan_inf_filter (on by default) logs the running average in
            # place of a NaN/Inf step loss, so only the grad norm can show one.
            text += (
                "; the HF Trainer leaves NaN/Inf losses out of the logged loss by default "
                "(logging_nan_inf_filter), so "
                + (
                    "the grad norm is the check here"
                    if "grad norm" in checked
                    else "the loss alone cannot show one"
                )
            )
        return Item(q, PASS, text)

    items.ask(q, {FindingKind.NAN_INF}, "NaN/Inf", nan, "neither loss nor grad norm logged")

    q = "Are per-layer activation ranges reasonable?"

    def act() -> Item | None:
        run = ev.run
        layers = run.layers(ACT_ABSMAX) or run.layers(ACT_STD) or run.layers(ACT_MEAN)
        # Without a layer index: the model-wide series (act_absmax logged on its own), which
        # the activation check judges then (forensics.detectors.activations).
        whole = not layers and any(run.has(m) for m in (ACT_ABSMAX, ACT_STD, ACT_MEAN))
        if not layers and not whole:
            return None
        biggest = 0.0
        judged: list[int | None] = list(run.layers(ACT_ABSMAX))
        if whole and run.has(ACT_ABSMAX):
            judged = [None]
        for layer in judged:
            _, v = _window(ev, ACT_ABSMAX, lo, hi, layer)
            if len(v):
                biggest = max(biggest, float(np.max(np.abs(v))))
        limit = ev.activation_limit
        if biggest >= limit:
            return Item(
                q,
                FAIL,
                f"largest absolute activation {_g(biggest)} (past the limit of {_g(limit)};"
                " the article flags values past 1e4)",
            )
        logged = "model-wide values logged (no layer)" if whole else f"{len(layers)} layers logged"
        return Item(
            q,
            PASS,
            f"{logged}; largest absolute activation {_g(biggest)}"
            if biggest
            else f"{logged}, no outlier finding",
        )

    items.ask(
        q,
        {FindingKind.ACTIVATION_OUTLIER},
        "activation outlier",
        act,
        "activation statistics not logged",
    )

    q = "Does data-loading throughput reach the expected level?"

    def tp() -> Item | None:
        st, v = _window(ev, THROUGHPUT, lo, hi)
        if len(v) < 3:
            return None
        level = float(np.median(v))
        if not level > 0:  # a job that trained did not do so at 0 tokens a second
            return Item(q, NA, f"throughput logged as {_g(level)} (a placeholder, not a rate)")
        unit = unit_for(ev.run, THROUGHPUT)
        assumed = f" ({unit.assumed})" if unit.assumed else ""
        return Item(
            q,
            PASS,
            f"median {unit.show(level)}{assumed}, no drop or stall"
            " (no target in the log to compare with)",
        )

    items.ask(
        q,
        {FindingKind.THROUGHPUT_DROP, FindingKind.STALL},
        "throughput problem",
        tp,
        "throughput not logged",
    )
    return items


def _middle(ev: Evidence, fs: list[Finding], lo: int, hi: int) -> list[Item]:
    items = _Answers(fs, lo, hi)

    q = "Does the gradient norm fall along with the loss?"

    def gn() -> Item | None:
        _, g = _window(ev, GRAD_NORM, lo, hi)
        _, loss = _window(ev, LOSS, lo, hi)
        if len(g) < 6 or len(loss) < 6:
            return None
        g0, g1 = _thirds(g)
        l0, l1 = _thirds(loss)
        ok = not (l1 < l0 and g1 > CLIMB_RATIO * g0)
        return Item(
            q,
            PASS if ok else FAIL,
            f"grad norm median {_g(g0)} -> {_g(g1)} while loss {_g(l0)} -> {_g(l1)}",
        )

    items.ask(
        q,
        {FindingKind.GRAD_NORM_DRIFT, FindingKind.DIVERGENCE},
        "grad-norm climb",
        gn,
        "grad norm or loss not logged in this phase",
    )

    q = "Is the per-layer gradient-norm distribution stable?"

    def layers() -> Item | None:
        n = len(ev.run.layers(GRAD_NORM_LAYER))
        mod = _module_share(ev, lo, hi)
        if mod is not None and mod[0]:
            return Item(q, FAIL, mod[1])
        said = [f"{n} layers logged, no layer-share shift found"] if n else []
        said += [mod[1]] if mod is not None else []
        return Item(q, PASS, "; ".join(said)) if said else None

    items.ask(
        q, {FindingKind.LAYER_GRAD_SHIFT}, "layer shift", layers, "per-layer grad norms not logged"
    )

    q = "Is the train/val gap within a reasonable range?"

    def gap() -> Item | None:
        n = sum(len(_window(ev, m, lo, hi)[1]) for m in _held_out(ev))
        if n < 2:
            return None
        return Item(
            q,
            PASS,
            f"{n:,} validation points, no gap acceleration or overfitting found"
            + _gap_text(ev, lo, hi),
        )

    items.ask(
        q,
        {FindingKind.GAP_ACCELERATION, FindingKind.OVERFITTING, FindingKind.VAL_SHIFT},
        "gap problem",
        gap,
        "validation loss not logged in this phase",
    )

    q = "Do loss spikes recover at a normal pace?"
    spikes = [f for f in fs if f.kind == FindingKind.LOSS_SPIKE and lo <= f.start_step <= hi]
    bad = [f for f in spikes if f.measures.get("classification") in ("pathological", "unresolved")]
    if bad:
        items.append(
            Item(
                q,
                FAIL,
                f"{len(bad):,} of {len(spikes):,} spikes did not recover (step {_steps(bad)})",
            )
        )
    elif spikes:
        rec = [
            float(r)
            for f in spikes
            if isinstance(r := f.measures.get("recovery_steps"), (int, float))
        ]
        tail = f"; slowest recovery {steps_text(max(rec))}" if rec else ""
        items.append(Item(q, PASS, f"{len(spikes):,} spike(s), all recovered{tail}"))
    elif _window(ev, LOSS, lo, hi)[0].size:
        items.append(Item(q, PASS, "no loss spike in this phase"))
    else:
        items.append(Item(q, NA, "loss not logged in this phase"))

    q = "Does the parameter norm grow slowly rather than jump?"

    def pn() -> Item | None:
        _, v = _window(ev, PARAM_NORM, lo, hi)
        if len(v) < 3:
            return None
        a, b = _thirds(v)
        return Item(q, PASS, f"median {_g(a)} -> {_g(b)}, no jump found")

    items.ask(q, {FindingKind.PARAM_NORM_JUMP}, "param-norm jump", pn, "parameter norm not logged")

    q = "Were checkpoints saved as planned?"
    cp = ev.checkpoints
    plan = (
        f"; the config saves every {cp.interval:,} steps ({cp.interval_key})" if cp.interval else ""
    )
    if cp.saved:
        items.append(
            Item(
                q,
                PASS,
                f"{len(cp.saved)} {cp.where()}, the last at step {cp.saved[-1]:,}{plan}",
            )
        )
    else:
        items.append(Item(q, NA, "no checkpoints beside the log" + plan))
    return items


def _module_share(ev: Evidence, lo: int, hi: int) -> tuple[bool, str] | None:
    """The embedding's and output head's share of the squared grad norm over a phase: the
    medians of its first and last thirds, and whether it at least doubled and gained 10
    points (the ``embed_head`` cause's lines). None when not logged or under six points."""
    from forensics.evidence.module_share import module_shares, share_doubled

    got = module_shares(ev)
    if got is None:
        return None
    sel = (got.steps >= lo) & (got.steps <= hi)
    share = got.total[sel]
    if len(share) < 6:
        return None
    third = len(share) // 3
    a, b = float(np.median(share[:third])), float(np.median(share[-third:]))
    return share_doubled(a, b), (
        f"{got.names} took {a:.1%} -> {b:.1%} of the squared grad norm (medians of the "
        "phase's first and last thirds)"
    )


def _gap_text(ev: Evidence, lo: int, hi: int) -> str:
    """The evidence's train/val gap at the phase's first and last evaluation."""
    gap = ev.gap
    if gap is None:
        return ""
    sel = (gap.steps >= lo) & (gap.steps <= hi)
    if not sel.any():
        return ""
    st, g = gap.steps[sel], gap.gap[sel]
    return (
        f"; gap (val - train) {_g(float(g[0]))} at step {int(st[0]):,},"
        f" {_g(float(g[-1]))} at step {int(st[-1]):,}"
    )


def _late(ev: Evidence, fs: list[Finding], lo: int, hi: int) -> list[Item]:
    items = _Answers(fs, lo, hi)

    q = "Has the validation loss started to rise? (if so, consider stopping early)"

    def val() -> Item | None:
        # Every held-out loss (val_loss, each eval set's): one that rose fails the question.
        rose, held = [], []
        for metric in _held_out(ev):
            st, v = _window(ev, metric, lo, hi)
            if len(v) < 2:
                continue
            name = "" if metric == VAL_LOSS else f"{metric}: "
            best = int(np.argmin(v))
            if best < len(v) - 1 and v[-1] > v[best] * (1 + VAL_RISE):
                rose.append(
                    f"{name}lowest {_g(v[best])} at step {int(st[best]):,},"
                    f" {_g(v[-1])} at the last evaluation"
                )
            else:
                what = "last validation loss" if not name else f"{name}last"
                held.append(
                    f"{what} {_g(v[-1])} at step {int(st[-1]):,} is the lowest of the phase"
                    f" (within {VAL_RISE:.0%})"
                )
        if rose:
            return Item(q, FAIL, "; ".join(rose))
        return Item(q, PASS, "; ".join(held)) if held else None

    items.ask(
        q,
        {FindingKind.OVERFITTING, FindingKind.VAL_SHIFT},
        "validation loss rising",
        val,
        "validation loss not logged in this phase",
    )

    q = "Does the loss decline match the learning-rate schedule?"
    # A plateau is a note (info), which ask() leaves out; but a flat loss at an LR the
    # schedule does not explain is this question's failure, and the pass must not say "no
    # plateau found" beside one ("the run stopped learning" read next to a pass).
    flat = _in(fs, {FindingKind.PLATEAU}, lo, hi, notes=True)
    unexplained = [
        f
        for f in flat
        if not f.measures.get("expected") and f.measures.get("lr_context") != "unknown"
    ]  # (without a logged LR the question cannot be answered: not measurable, below)

    def sched() -> Item | None:
        _, loss = _window(ev, LOSS, lo, hi)
        _, r = _window(ev, LR, lo, hi)
        if len(loss) < 6 or len(r) < 2:
            return None
        l0, l1 = _thirds(loss)
        r0, r1 = float(r[0]), float(r[-1])
        rose = l1 > l0 * (1 + VAL_RISE)
        if rose:
            tail = " the loss rose"
        elif flat:
            tail = f" the plateau from step {_steps(flat)} is one the schedule explains"
        else:
            tail = " no plateau found"
        return Item(
            q,
            FAIL if rose else PASS,
            f"loss {_g(l0)} -> {_g(l1)} while the learning rate went {_g(r0)} -> {_g(r1)};" + tail,
        )

    if unexplained and not _in(fs, {FindingKind.PLATEAU, FindingKind.DIVERGENCE}, lo, hi):
        items.append(
            Item(q, FAIL, f"plateau at step {_steps(unexplained)}: {unexplained[0].summary}")
        )
    else:
        items.ask(
            q,
            # (a restarted schedule that set the loss back is a decline off its schedule)
            {FindingKind.PLATEAU, FindingKind.DIVERGENCE, FindingKind.LR_RESTART},
            "plateau, divergence or LR restart",
            sched,
            "loss or learning rate not logged in this phase",
        )

    q = "Is the loss scale stable?"

    def ls() -> Item | None:
        _, v = _window(ev, LOSS_SCALE, lo, hi)
        if len(v) < 2:
            return None
        return Item(
            q,
            PASS,
            f"loss scale between {_g(float(np.min(v)))} and {_g(float(np.max(v)))}, no sharp drop",
        )

    items.ask(
        q,
        {FindingKind.LOSS_SCALE_DROP, FindingKind.NAN_INF},
        "loss-scale trouble",
        ls,
        "loss scale not logged (bf16 or fp32 runs have none)",
    )

    q = "Was the final checkpoint fully evaluated?"
    run = ev.run
    evals = [m for m in run.metrics() if m.startswith("eval/")]
    ends = [int(ev.logged(m).steps[-1]) for m in evals if len(ev.logged(m).steps)]
    if not ends:
        items.append(Item(q, NA, "no evaluation metric in the log"))
    else:
        last_eval = max(ends)
        near = last_eval >= run.last_step - max(1, (run.last_step - run.first_step) // 20)
        items.append(
            Item(
                q,
                PASS if near else FAIL,
                f"last evaluation ({len(evals)} metric(s)) at step {last_eval:,};"
                f" the run ends at step {run.last_step:,}",
            )
        )
    return items


def phase_bounds(first: int, last: int) -> list[tuple[str, str, int, int]]:
    """The three phases as ``(key, title, lo, hi)``: ordered, non-overlapping, inclusive.

    The article's start-up is steps 0-1,000, the middle runs to the half-way point and the late
    phase is the second half. A run shorter than 2,000 steps has no room for that: its phases
    are proportional (the first quarter, the second quarter, the second half). A log that
    starts after step 1,000 has no start-up phase (``hi < lo``).
    """
    half = (first + last) // 2
    if first > STARTUP_END:
        return [
            ("startup", f"Start-up (steps {step_range(0, STARTUP_END)})", first, first - 1),
            ("middle", f"Middle (steps {step_range(first, half)})", first, half),
            ("late", f"Late (second half, steps {step_range(half + 1, last)})", half + 1, last),
        ]
    if half > STARTUP_END:
        return [
            ("startup", f"Start-up (steps {step_range(first, STARTUP_END)})", first, STARTUP_END),
            (
                "middle",
                f"Middle (steps {step_range(STARTUP_END + 1, half)})",
                STARTUP_END + 1,
                half,
            ),
            ("late", f"Late (second half, steps {step_range(half + 1, last)})", half + 1, last),
        ]
    quarter = first + (last - first) // 4
    short = "the run is shorter than 2,000 steps"
    return [
        (
            "startup",
            f"Start-up (steps {step_range(first, quarter)}: the first quarter, {short})",
            first,
            quarter,
        ),
        (
            "middle",
            f"Middle (steps {step_range(quarter + 1, half)}: the second quarter)",
            quarter + 1,
            half,
        ),
        ("late", f"Late (second half, steps {step_range(half + 1, last)})", half + 1, last),
    ]


def evaluate_checklists(ev: Evidence, findings: list[Finding]) -> list[Phase]:
    """Answer the article's start-up, middle and late checklists from the evidence and findings."""
    run = ev.run
    fns = {"startup": _startup, "middle": _middle, "late": _late}
    out = []
    for key, title, lo, hi in phase_bounds(run.first_step, run.last_step):
        fn = fns[key]
        if hi < lo:
            reason = (
                "the log starts after step 1,000"
                if key == "startup"
                else "the run is too short for this phase"
            )
            probe = fn(ev, [], 1, 0)  # questions only; every answer becomes not measurable
            out.append(Phase(key, title, lo, hi, [Item(i.question, NA, reason) for i in probe]))
            continue
        out.append(Phase(key, title, lo, hi, list(fn(ev, findings, lo, hi))))
    return out


# -- coverage against the article's cadence table (6.1) --------------------------------------

_CADENCE = [
    ("loss, grad norm, param norm", (LOSS, GRAD_NORM, PARAM_NORM), "every 50 steps", 50, "steps"),
    ("per-layer grad norm", (GRAD_NORM_LAYER,), "every 500 steps", 500, "steps"),
    ("activation statistics", (ACT_MEAN, ACT_STD, ACT_ABSMAX), "every 1,000 steps", 1000, "steps"),
    ("validation loss", (VAL_LOSS,), "every 2,000 steps", 2000, "steps"),
    ("throughput, memory", (THROUGHPUT, MEMORY), "every 10 minutes", 600, "seconds"),
]


def _interval(ev: Evidence, metric: str, unit: str) -> float | None:
    layers = ev.run.layers(metric)
    layer = layers[0] if layers else None
    if unit == "steps":
        steps = ev.logged(metric, layer).steps
        if len(steps) > 1 and bool(np.all(steps[1:] >= steps[:-1])):
            # Sorted (as logged steps come): the shared count of the step differences, the
            # same median without a float copy and a partition of every difference.
            return median_interval(steps) if steps[-1] > steps[0] else None
        x = steps.astype(float)
    else:
        wall = ev.logged(metric, layer).wall_time
        if wall is None:
            x = np.array([], dtype=float)
        else:  # (the finite times; no copy when all are)
            ok = np.isfinite(wall)
            x = wall if ok.all() else wall[ok]
    if len(x) < 2:
        return None
    # Logged steps come sorted: sort only what is not (the same array either way).
    d = np.diff(x if len(x) < 2 or bool(np.all(x[1:] >= x[:-1])) else np.sort(x))
    d = d[d > 0]
    # (d is this call's own: partitioned in place, the same median as on a copy)
    return median_value(d) if len(d) else None


def _every(iv: float, unit: str) -> str:
    """A logging interval as text; never "every 0 s" (sub-second intervals in ms)."""
    if unit == "steps":
        return "every step" if iv <= 1 else f"every {iv:,.0f} steps"
    if iv >= 60:
        return f"every {iv / 60:,.1f} min"
    if iv >= 1:
        return f"every {iv:,.3g} s"
    if iv >= 0.001:
        return f"every {iv * 1000:,.3g} ms"
    return "several times per millisecond"


def _held_out(ev: Evidence) -> list[str]:
    """The held-out losses the train/val checks judge (val_loss first, then each eval set's),
    or val_loss alone when the run has none (its questions then read "not logged")."""
    from forensics.evidence.gap import held_out_losses

    return held_out_losses(ev) or [VAL_LOSS]


def coverage(ev: Evidence) -> list[Coverage]:
    """Which vital signs the run logged, and how often, against the article's table."""
    have = ev.run.metrics()
    rows = []
    for signs, metrics, cadence, every, unit in _CADENCE:
        if metrics == (VAL_LOSS,):
            metrics = tuple(_held_out(ev))  # (each eval set's loss is a validation loss too)
        if THROUGHPUT in metrics and THROUGHPUT not in have and STEP_TIME in have:
            # (a step time is the throughput's measure where tokens/s is not logged: the
            # throughput checks read it then)
            metrics = tuple(STEP_TIME if m == THROUGHPUT else m for m in metrics)
        present = [m for m in metrics if m in have]
        missing = [m for m in metrics if m not in have]
        if not present:
            rows.append(Coverage(signs, metrics, cadence, False, "not logged", False))
            continue
        parts, sparse = [], False
        for m in present:
            iv = _interval(ev, m, unit)
            if iv is None and unit == "seconds" and len(ev.logged(m).steps) > 1:
                # No wall clock: how often in steps, the minutes unknown (not "one point").
                by_step = _interval(ev, m, "steps")
                if by_step is not None:
                    parts.append(
                        f"{m}: {_every(by_step, 'steps')} (no wall clock: minutes unknown)"
                    )
                    continue
            if iv is None:
                parts.append(f"{m}: one point")
                continue
            shown = _every(iv, unit)
            parts.append(f"{m}: {shown}")
            sparse = sparse or iv > every * 1.5
        if missing:
            parts.append("missing: " + ", ".join(missing))
        rows.append(Coverage(signs, metrics, cadence, True, "; ".join(parts), sparse))
    return rows
