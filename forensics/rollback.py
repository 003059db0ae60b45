"""A rollback plan that can be run: where to go back to, with which LR, what to skip, how.

For each incident that calls for it (a red light, a NaN, a spike that does not recover,
overfitting, a resume after which the loss regressed; first aid without rollback for a
grad-norm drift) the plan names:

- the checkpoint to resume from, known from the run (folders beside the log, the config's save
  interval) or stated as assumed (``--checkpoint-every``, the article's one every 500 steps);
  a step-0 "checkpoint" is never advised unless a checkpoint at step 0 was saved;
- the last healthy step: the last logged step before the incident's onset, or before an LR
  change no schedule explains when that came first (the usual cause of the incident);
- the LR to resume with, computed from the LR before the incident (not the raised one): 20-50%
  lower for a spike that does not recover, 10% lower for the red light (article 7.1, 6.3);
- the data position kept: the model and optimizer go back, the data loader does not;
- the batches to skip around the onset when the cause is a batch;
- the lines to run for the trainer that wrote the log (Megatron, HF Trainer, Lightning).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forensics.evidence import Evidence
from forensics.evidence.checkpoints import measured_best
from forensics.evidence.trend_utils import step_before, times
from forensics.findings import DYNAMICS, Finding, FindingKind, Severity
from forensics.prescriptions import needs_action
from forensics.run import Run
from forensics.schema import LOSS_SCALE, LR, VAL_LOSS

# Learning-rate cuts by situation (the article's numbers): (low, high) fraction removed.
LR_CUT_SPIKE = (0.2, 0.5)  # a spike that does not recover (7.1)
LR_CUT_RED_LIGHT = (0.1, 0.1)  # automatic rollback after a fatal divergence (6.3)
LR_CUT_DRIFT = (2 / 3, 2 / 3)  # grad-norm drift first aid: down to a third (3.5)

# An LR change no schedule explains this many steps before the onset still counts as its cause:
# the article's window for a spike to recover (a damaged model can take that long to blow up).
CAUSE_LOOKBACK = 500
# Batches skipped on each side of a bad batch's onset (the spike's own steps are skipped).
SKIP_MARGIN = 2
SKIP_CLUSTER = 10  # steps named by the bad-batch evidence this close together are one range

DATA_POSITION = (
    "restore the model and optimizer state only and keep the data loader's position "
    "(do not replay the data from the checkpoint)"
)


@dataclass(frozen=True)
class RollbackPlan:
    """Where to go back to after an incident, with which LR, and how to run it."""

    finding: Finding  # the incident's lead finding (the one whose rule sets the LR cut)
    rollback: bool  # False for first aid that keeps training (grad-norm drift)
    onset_step: int  # the incident's onset (an unexplained LR change before it included)
    last_healthy_step: int | None
    checkpoint_step: int | None
    checkpoint_known: bool  # saved folders or the run's own config, not an assumption
    checkpoint_source: str
    lr_cut: tuple[float, float]
    lr_cut_text: str
    lr_before: float | None  # the LR that was stable before the incident
    lr_resume: tuple[float, float] | None  # (low, high) LR to resume with
    why: str
    skip_steps: tuple[int, int] | None = None  # inclusive range of batches to skip
    # Overfitting: the trainer's own best checkpoint when it is another step (HF's
    # best_model_checkpoint, judged by an eval metric the val loss may disagree with).
    trainer_best: str | None = None
    commands: tuple[str, ...] = ()
    trainer: str | None = None
    lr_change: str | None = None  # the unexplained LR change that preceded the onset
    # An unresolved spike (the log ends before it could recover): roll back only if it is
    # still up at this step (its peak + the spikes detector's recover_steps).
    decide_by: int | None = None
    onset_kind: str | None = None  # the finding the onset is (the lead's, or an ongoing one's)
    findings: tuple[Finding, ...] = field(default=(), compare=False)
    # A spike that began at a resume (the incident's supported cause): the resume's step.
    resumed_at: int | None = None
    # The LR at the checkpoint's step when the schedule had moved it by the incident (the
    # cut applies to it: the resumed job runs from there); None: the cut is of lr_before.
    lr_at_checkpoint: float | None = None

    @property
    def nothing_healthy(self) -> bool:
        """Non-finite from the first logged step: no state of this run is known healthy, and
        no learning rate explains it (what the run started from is the suspect)."""
        return _nothing_healthy(self.finding, self.last_healthy_step)

    @property
    def lr_cut_from(self) -> float | None:
        """The LR the cut is taken from: the one at the checkpoint where the schedule moved it
        between there and the incident, else the one before the incident."""
        return self.lr_at_checkpoint if self.lr_at_checkpoint is not None else self.lr_before

    # Names the report's templates and older callers read.
    @property
    def lr_at_onset(self) -> float | None:
        return self.lr_before

    @property
    def new_lr(self) -> tuple[float, float] | None:
        return self.lr_resume

    def lr_text(self) -> str:
        """ "0.001416 (10% lower than 0.001573, the LR before the incident; the red-light
        rule)"; the cut's wording alone when no LR was logged."""
        if self.lr_resume is None or self.lr_before is None:
            return self.lr_cut_text
        lo, hi = self.lr_resume
        new = _num(lo) if lo == hi else f"{_num(lo)}-{_num(hi)}"
        cut, _, rule = self.lr_cut_text.partition(" (")
        rule = f"; {rule.rstrip(')')}" if rule else ""
        than = "of" if cut.startswith("down to") else "than"  # ("down to a third of 0.0003")
        if self.lr_at_checkpoint is not None and self.checkpoint_step is not None:
            base = (
                f"{_num(self.lr_at_checkpoint)}, the LR at the checkpoint's step "
                f"{self.checkpoint_step:,}; {_num(self.lr_before)} by the incident"
            )
        else:
            base = f"{_num(self.lr_before)}, the LR before the incident"
        return f"{new} ({cut} {than} {base}{rule})"

    @property
    def at_resume(self) -> bool:
        """The plan of a resume regression that began at the seam (see :func:`at_resume`), or
        of a spike that began at a resume (``resumed_at``)."""
        return at_resume(self.finding) or self.resumed_at is not None

    def checkpoint_text(self) -> str:
        if not self.rollback:
            return "no rollback (first aid)"
        if self.checkpoint_step is None:
            return (
                f"no checkpoint before step {self.onset_step:,} is known ({self.checkpoint_source})"
            )
        src = self.checkpoint_source
        sep = ", " if src.startswith("assuming") else ", from "
        return f"the checkpoint at step {self.checkpoint_step:,}{sep}{src}"

    def sentence(self) -> str:
        """The plan in a few sentences for the terminal: where to go back to and why, the LR,
        the data position, the batches to skip."""
        kind, start = self.finding.kind.value, self.finding.start_step
        if not self.rollback:
            return f"First aid for the {kind} at step {start:,}: learning rate {self.lr_text()}."
        if self.finding.kind == FindingKind.OVERFITTING:
            best = self.last_healthy_step
            if self.checkpoint_step is None:
                head = f"Stop early: {self.checkpoint_text()}."
            else:
                head = f"Stop early: keep {self.checkpoint_text()}."
            why = (
                f" The best validation loss is at step {best:,}; it rises after it."
                if best is not None
                else " No validation loss to pick the best step."
            )
            if self.trainer_best:
                why += f" {self.trainer_best[0].upper()}{self.trainer_best[1:]}."
            return f"{head}{why} Learning rate {self.lr_cut_text}."
        if self.nothing_healthy:
            return (
                f"Nothing to roll back to: the {kind} starts at the first logged step (step "
                f"{start:,}), so no step of this run is known healthy. Check what it started "
                "from (the initial or loaded weights, the data, the precision, the kernels) "
                "before starting again."
            )
        if self.checkpoint_step is None:
            head = (
                f"Roll back: {self.checkpoint_text()}; use the last one you kept before step "
                f"{self.onset_step:,}."
            )
        else:
            head = f"Roll back to {self.checkpoint_text()}."
        if self.decide_by is not None:
            head = (
                f"The {kind} at step {start:,} is unresolved (the log ends before it could "
                f"recover): if it is not back on its trend by step {self.decide_by:,}, "
                + head[0].lower()
                + head[1:]
            )
        if at_resume(self.finding):
            why = (
                f" The weights it holds were healthy: the loss turned up only after the resume "
                f"at step {start:,}."
            )
        elif self.resumed_at is not None and self.lr_change is not None:
            why = (
                f" The weights it holds were healthy: the resume at step {self.resumed_at:,} "
                f"changed the LR ({self.lr_change})."
            )
        elif self.resumed_at is not None:
            why = (
                f" The weights it holds were healthy: the {kind} began at the resume at step "
                f"{self.resumed_at:,}."
            )
        elif self.last_healthy_step is None:
            why = f" The {kind} starts at the first logged step."
        elif self.lr_change is not None:
            why = f" Last healthy step {self.last_healthy_step:,}: {self.lr_change}."
        else:
            first = self.onset_kind or kind
            why = f" Last healthy step {self.last_healthy_step:,}, before the {first} at step "
            why += f"{self.onset_step:,}"
            if self.onset_step != start:
                why += f" (still going on at the {kind} at step {start:,})"
            why += "."
        lr = self.lr_text()
        resume = f" Resume with learning rate {lr}" if self.lr_resume else f" Learning rate {lr}"
        tail = "; restore the model and optimizer, keep the data position"
        if self.at_resume:
            # The resume that dropped part of the state is the suspect: restore all of it.
            tail = (
                "; this time restore the optimizer moments, the LR schedule's step and the "
                "data loader's position with the model"
            )
        if self.skip_steps is not None:
            a, b = self.skip_steps
            tail += f"; skip the batches of steps {a:,}-{b:,}"
        return head + why + resume + tail + "."

    def commands_text(self) -> str | None:
        """ "With Megatron-LM: --load ... | --lr ..." (None when the trainer is not known)."""
        if not self.commands or self.trainer is None:
            return None
        return f"With {TRAINER_NAMES.get(self.trainer, self.trainer)}: " + " | ".join(self.commands)

    def to_dict(self) -> dict[str, Any]:
        """The findings document's ``rollback`` object (one per incident that needs one)."""
        return {
            "checkpoint_step": self.checkpoint_step,
            "checkpoint_known": self.checkpoint_known,
            "last_healthy_step": self.last_healthy_step,
            "lr_before": self.lr_before,
            "lr_cut_from": self.lr_cut_from,
            "lr_resume": list(self.lr_resume) if self.lr_resume else None,
            "skip_steps": list(self.skip_steps) if self.skip_steps else None,
            "commands": list(self.commands),
        }


Rollback = RollbackPlan  # the name diagnosis and the report used before the plan grew


def _num(x: float) -> str:
    from forensics.evidence.trend_utils import num

    return num(x)


# -- the rule per finding --------------------------------------------------------------------


def lr_cut_for(f: Finding) -> tuple[bool, tuple[float, float], str] | None:
    """(roll back?, cut range, wording) for findings that call for a rollback or first aid.

    A note (severity info) calls for neither: it is below every warning line, and a drift
    the LR schedule explains says "no action" in its own prescription."""
    if f.severity == Severity.INFO:
        return None
    if f.severity == Severity.FATAL or f.kind == FindingKind.DIVERGENCE:
        return True, LR_CUT_RED_LIGHT, "10% lower (the red-light rule)"
    if (
        f.kind == FindingKind.LOSS_SPIKE
        and f.measures.get("classification") in ("pathological", "unresolved")
    ) or f.kind == FindingKind.LOSS_CLIMB:
        return True, LR_CUT_SPIKE, "20-50% lower"
    if f.kind == FindingKind.NAN_INF and f.measures.get("loss_back") is True:
        return None  # isolated steps after which the loss came back: nothing to roll back
    if f.kind == FindingKind.NAN_INF:
        return True, LR_CUT_RED_LIGHT, "10% lower once the cause is fixed"
    if f.kind == FindingKind.GRAD_NORM_DRIFT:
        return False, LR_CUT_DRIFT, "down to a third (first aid)"
    if f.kind == FindingKind.OVERFITTING:
        return (
            True,
            (0.0, 0.0),
            "unchanged: stop early from the best checkpoint (or lower it for any further epochs)",
        )
    if at_resume(f):
        return True, (0.0, 0.0), "unchanged (the resume, not the LR, is the suspect)"
    if f.kind == FindingKind.RESUME_REGRESSION:  # (the loss turned up well after the seam)
        return True, (0.0, 0.0), "unchanged (nothing in the log points at the LR)"
    return None


def at_resume(f: Finding) -> bool:
    """A resume regression whose rise began at the seam (the resume is the suspect), not
    after the loss went on down past it (see :mod:`forensics.detectors.resume_regression`)."""
    return f.kind == FindingKind.RESUME_REGRESSION and f.start_step == f.measures.get("seam_step")


_RULE_ORDER = (  # the lead of an incident: the finding whose rule is the strictest
    lambda f: f.severity == Severity.FATAL or f.kind == FindingKind.DIVERGENCE,
    lambda f: f.kind == FindingKind.NAN_INF,
    lambda f: f.kind == FindingKind.LOSS_SPIKE,
    lambda f: f.kind == FindingKind.LOSS_CLIMB,
    lambda f: f.kind == FindingKind.OVERFITTING,
    lambda f: f.kind == FindingKind.GRAD_NORM_DRIFT,
    lambda f: f.kind == FindingKind.RESUME_REGRESSION,
)


def _nothing_healthy(f: Finding, last_healthy_step: int | None) -> bool:
    """RollbackPlan.nothing_healthy, for the plan being made."""
    return f.kind == FindingKind.NAN_INF and last_healthy_step is None


def _lead(findings: Iterable[Finding]) -> Finding | None:
    ruled = [f for f in findings if lr_cut_for(f) is not None]
    for test in _RULE_ORDER:
        hit = [f for f in ruled if test(f)]
        if hit:
            return min(hit, key=lambda f: f.start_step)
    return None


# -- evidence read --------------------------------------------------------------------------


def _best_val_step(ev: Evidence, until: int) -> int | None:
    """The step with the lowest validation loss up to ``until`` (overfitting's rollback point)."""
    s = ev.series(VAL_LOSS)
    ok = s.steps <= until
    if not ok.any():
        return None
    return int(s.steps[ok][np.argmin(s.values[ok])])


def _trainer_best_other(ev: Evidence, best: int | None) -> str | None:
    """The trainer's own best checkpoint, when it names one at another step than the lowest
    val loss: "the trainer recorded checkpoint-3000 as its best, by eval/wer (0.7432 there,
    0.7888 at step 1,000): keep that one if eval/wer is what the model is for"."""
    tb = ev.trainer_best
    text = ev.trainer_best_clause(best) if best is not None else ""
    if tb is None or not text:
        return None
    if tb.metric is not None and tb.metric != VAL_LOSS:
        text += f": keep that one if {tb.metric} is what the model is for"
    return text


def _value_before(ev: Evidence, metric: str, step: int) -> float | None:
    """The last finite value of ``metric`` strictly before ``step`` (at ``step`` when it is the
    first logged point)."""
    s = ev.series(metric)
    if len(s.steps) == 0:
        return None
    i = int(np.searchsorted(s.steps, step, side="left")) - 1
    return float(s.values[max(i, 0)])


def _before_resume(ev: Evidence, metric: str | None, step: int) -> int:
    """The last healthy step of a trouble that began at a resume: the last step logged before
    the resumed job's first (the resume's own first step already shows the trouble), or that
    first step where nothing was logged before it."""
    before = _last_logged_before(ev, metric, step)
    return step if before is None else before


def _resume_checkpoint(ev: Evidence, metric: str | None, seam: int) -> tuple[int, bool, str, int]:
    """The checkpoint a job that resumed at ``seam`` loaded: it holds the state after the last
    step logged before the seam (HF's checkpoint-400 resumes logging at step 401, or 410
    every 10 steps; a job rewound to it logs its steps again from there), which is also the
    last healthy step. (checkpoint step, known, where it comes from, last healthy step)"""
    healthy = _before_resume(ev, metric, seam)
    return healthy, True, f"the resume at step {seam:,} (the job loaded it)", healthy


def _resume_steps(ev: Evidence) -> set[int]:
    """The steps where a job resumed (the importers' restart findings)."""
    return {int(g.start_step) for g in ev.run.import_findings if g.kind is FindingKind.RESTART}


def _last_logged_before(ev: Evidence, metric: str | None, step: int) -> int | None:
    for m in (metric, "loss"):
        if not m:
            continue
        before = step_before(ev.logged(m).steps, step)  # (a NaN was logged too)
        if before is not None:
            return before
    # Neither logged before the onset: no step is known healthy (a step of another series
    # before it, a validation loss at step 0, says nothing of these).
    return None


def _lr_change_before(ev: Evidence, onset: int) -> Any:
    """The raised LR stretch no schedule explains that was going on at the onset or began
    within CAUSE_LOOKBACK steps before it: where the trouble was caused (its first step)."""
    hits = [
        s
        for s in ev.schedule.unexplained
        if s.start_step <= onset
        and (s.start_step >= onset - CAUSE_LOOKBACK or s.end_step >= onset)
        and (s.lr_before is None or max(s.lr_start, s.lr_end) > s.lr_before)
    ]
    return min(hits, key=lambda s: s.start_step) if hits else None


def _lr_change_text(ev: Evidence, seg: Any) -> str:
    """ "the LR went from 0.0016 to 0.48 (peak at step 600) from step 501, which no schedule
    explains"."""
    lr = ev.series(LR)
    inside = (lr.steps >= seg.start_step) & (lr.steps <= seg.end_step)
    if not inside.any() or seg.lr_before is None:
        return f"the LR no schedule explains from step {seg.start_step:,}"
    i = int(np.argmax(np.where(inside, lr.values, -np.inf)))
    return (
        f"the LR went from {_num(seg.lr_before)} to {_num(float(lr.values[i]))} "
        f"(x{times(float(lr.values[i]) / seg.lr_before)} at step {int(lr.steps[i]):,}) "
        f"from step {seg.start_step:,}, which no schedule explains"
    )


def _checkpoint(
    ev: Evidence, healthy: int | None, every: int | None
) -> tuple[int | None, bool, str]:
    """(step, known?, where that comes from); never an assumed or interval-derived step 0."""
    if healthy is None:
        return None, False, "the trouble starts at the first logged step"
    cps = ev.checkpoints
    step, source = cps.before(healthy, every)
    known = bool(cps.saved) or cps.interval is not None
    if (
        step is not None
        and step <= max(ev.run.first_step, 0)
        and not (cps.saved and step in cps.saved)
    ):
        # Step 0 from an interval or an assumption is the initialisation, not a checkpoint.
        src = (
            f"the run's checkpoint interval ({cps.interval_key} = {cps.interval}) "
            f"saves none before step {healthy:,}"
            if cps.interval is not None
            else "the log shows no checkpoints or save interval"
        )
        return None, False, src
    return step, known and step is not None, source


TRAINER_NAMES = {"megatron": "Megatron-LM", "hf": "the HF Trainer", "lightning": "Lightning"}


def trainer_of(run: Run) -> str | None:
    """The trainer that wrote the log, when its format says: megatron, hf, lightning."""
    fmt = run.format or ""
    sources = run.sources()
    if "megatron" in fmt or any(s.startswith("megatron") for s in sources):
        return "megatron"
    if "hf_trainer_state" in fmt:
        return "hf"
    if "lightning" in fmt:
        return "lightning"
    keys = {k.rsplit(".", 1)[-1] for k in run.config}
    if {"per_device_train_batch_size", "save_steps"} & keys:
        return "hf"
    return None


def _commands(
    trainer: str | None,
    ckpt: int | None,
    lr: tuple[float, float] | None,
    skip: tuple[int, int] | None,
    run: Run,
) -> tuple[str, ...]:
    new_lr = _num(lr[1]) if lr else None  # the smallest cut: the upper end of the range
    if trainer == "megatron":
        line = "--load <checkpoint dir>"
        if ckpt is not None:
            line += f" (latest_checkpointed_iteration.txt: {ckpt})"
        out = [line]
        if new_lr:
            out += [f"--lr {new_lr}", "--override-opt_param-scheduler"]
        if skip is not None:
            out.append(f"--skip-train-iteration-range {skip[0]}-{skip[1]}")
        return tuple(out)
    if trainer == "hf":
        out_dir = str(run.config.get("output_dir") or "<output_dir>")
        where = f"{out_dir}/checkpoint-{ckpt}" if ckpt is not None else "<checkpoint dir>"
        out = [f'trainer.train(resume_from_checkpoint="{where}")']
        out.append(f"--resume_from_checkpoint {where}")
        if new_lr:
            out.append(f"--learning_rate {new_lr}")
        return tuple(out)
    if trainer == "lightning":
        out = ['trainer.fit(model, datamodule, ckpt_path="<checkpoint .ckpt>")']
        if new_lr:
            out.append(f"# set the optimizer's lr to {new_lr} in configure_optimizers")
        return tuple(out)
    return ()


# -- the plan -------------------------------------------------------------------------------


def rollback_plan(
    run: Run | Evidence,
    findings: Iterable[Finding],
    *,
    checkpoint_every: int | None = None,
    lead: Finding | None = None,
    causes: Sequence[Any] | None = None,
) -> RollbackPlan | None:
    """The rollback plan for one incident (the findings of one time window and cause).

    Returns None when no finding of the incident calls for a rollback or first aid.
    ``lead`` forces which finding's rule sets the LR cut (by default the strictest);
    ``causes`` are the incident's tested causes (:mod:`forensics.causes`): a supported bad
    batch (or data shared across seeds) adds the batches to skip.
    """
    ev = run if isinstance(run, Evidence) else Evidence(run)
    fs = list(findings)
    f = lead if lead is not None else _lead(fs)
    if f is None:
        return None
    rule = lr_cut_for(f)
    if rule is None:
        return None
    do_rollback, cut, cut_text = rule
    # The onset: the earliest actionable dynamics finding of the incident still going on when
    # the lead began (a throughput drop does not move it).
    onset, cause = f.start_step, None
    for g in fs:
        if (
            g is not f
            and needs_action(g)
            and g.kind in DYNAMICS
            and not _recovered_series(g, f, fs)
            and g.start_step < onset
            and (
                g.end_step is None
                or g.end_step >= f.start_step
                or (g.metric is not None and ev.ran_into(g.metric, g.end_step, f.start_step))
                or _scale_still_down(ev, g, f.start_step)
            )
        ):
            onset, cause = g.start_step, g
    # A loss spike cut from a steady climb (the loss never came back and had been rising
    # since a low): the climb's first step is the onset, its low the last healthy step.
    low = f.measures.get("rose_since_step") if cause is None else None
    climb = low if isinstance(low, int) and low < onset else None
    climbing = climb is not None
    if climb is not None:
        onset = climb + 1
    lr_seg = None
    if f.kind != FindingKind.OVERFITTING:
        lr_seg = _lr_change_before(ev, onset)
    lr_change = None
    if lr_seg is not None:
        lr_change = _lr_change_text(ev, lr_seg)
        onset = lr_seg.start_step
        healthy = _last_logged_before(ev, LR, onset)
    else:
        healthy = _last_logged_before(ev, f.metric if cause is None else cause.metric, onset)
    if f.kind == FindingKind.OVERFITTING:
        # The best val step at or before the finding's onset, so the advice never points past
        # the step the finding says the val loss turned up (a later noisy dip).
        best = _best_val_step(ev, f.start_step)
        healthy = best if best is not None else healthy
    ckpt, known, source = _checkpoint(ev, healthy, checkpoint_every)
    if f.kind == FindingKind.OVERFITTING and healthy is not None and ckpt is not None:
        # A later checkpoint the log measures as better than the last one before the lowest
        # val loss (the loss turned up slowly): keep that one.
        vs = ev.series(VAL_LOSS)
        mb = measured_best(ev.checkpoints, vs.steps, vs.values, healthy)
        if mb is not None and mb.before_step == ckpt:
            ckpt, source = mb.step, f"{source}: {mb.clause(healthy)}"
    # An LR that left its schedule at the step a job resumed: the resume changed it (a
    # schedule restarted, a new LR in the new job's config). The checkpoint it loaded held
    # healthy weights: load it again with the whole state and the LR from before.
    lr_at_resume = lr_seg is not None and lr_seg.start_step in _resume_steps(ev)
    if lr_at_resume:
        ckpt, known, source, healthy = _resume_checkpoint(ev, f.metric, onset)
        cut = (0.0, 0.0)
    if at_resume(f):
        # The weights before the seam were fine: the checkpoint the job resumed from is known
        # to exist, and loading it again with the whole state is the remedy.
        ckpt, known, source, healthy = _resume_checkpoint(ev, f.metric, f.start_step)
    resumed_at = None if lr_seg is not None or climbing else _resume_at_onset(f, causes)
    if lr_at_resume:
        resumed_at = onset
    if resumed_at is not None:
        # A spike that began at a resume (the incident's supported cause): the same remedy.
        # The LR did nothing new there, so it is not cut.
        ckpt, known, source, healthy = _resume_checkpoint(ev, f.metric, resumed_at)
        cut, cut_text = (0.0, 0.0), "unchanged (the resume, not the LR, is the suspect)"
    if lr_seg is not None and lr_seg.lr_before is not None:
        lr_before: float | None = float(lr_seg.lr_before)
    else:
        lr_before = _value_before(ev, LR, onset) if len(ev.series(LR).steps) else None
    # The resumed job runs on from the checkpoint, at the LR its schedule gives there: where
    # the schedule had moved it by more than 5% by the incident (a cosine tail: 0.0016 at the
    # checkpoint, 8e-09 at the spike), the cut is of the checkpoint's LR, not of one the run
    # never resumes at. An unexplained LR change keeps its own "before" (the healthy LR).
    lr_ckpt = None
    if (
        lr_seg is None
        and do_rollback
        and ckpt is not None
        and lr_before is not None
        and resumed_at is None
        and not at_resume(f)
    ):
        at = _value_before(ev, LR, ckpt + 1)
        # (within 5% the two are one LR for a 10-50% cut: the one before the incident is told)
        if at is not None and np.isfinite(at) and at > 0 and abs(at - lr_before) > 0.05 * at:
            lr_ckpt = at
    base = lr_ckpt if lr_ckpt is not None else lr_before
    lr_resume = (
        (base * (1 - cut[1]), base * (1 - cut[0])) if base is not None and cut[1] > 0 else None
    )
    if f.kind == FindingKind.GRAD_NORM_DRIFT and lr_change is not None and lr_before is not None:
        # A climb that an LR change off the schedule began: the first aid is the LR from
        # before the change, not a third of the changed one (nor of the one before it).
        cut = (0.0, 0.0)
        cut_text = f"back to {_num(lr_before)}, its value before the change (first aid)"
        lr_resume = None
    if (at_resume(f) or lr_at_resume) and lr_change is not None and lr_before is not None:
        # The resume changed the LR itself (a schedule restarted or re-created): the remedy is
        # the LR it had before, not an unchanged one.
        cut_text = f"back to {_num(lr_before)}, its value before the resume changed it"
    skip = _skip_steps(ev, fs, lr_seg is not None, causes) if do_rollback else None
    nothing_healthy = _nothing_healthy(f, healthy)
    if nothing_healthy:  # (no LR to resume with, no batches to skip: see nothing_healthy)
        lr_resume, skip = None, None
    best_other = None
    if f.kind == FindingKind.OVERFITTING:
        why = (
            "the lowest validation loss before it turned up"
            if healthy is not None
            else "no validation loss to pick the best step"
        )
        best_other = _trainer_best_other(ev, healthy)
        if best_other:
            why = f"{why}; {best_other}"
    elif lr_change is not None:
        why = f"{lr_change}: resume with the LR from before it"
        if lr_at_resume:
            why = f"the resume at step {onset:,} changed the LR: {lr_change}"
    elif at_resume(f):
        why = (
            f"the loss turned up after the resume at step {f.start_step:,}: load that "
            "checkpoint again with the optimizer moments, the LR schedule's step and the "
            "data position"
        )
    elif resumed_at is not None:
        why = (
            f"the {f.kind.value} began at the resume at step {resumed_at:,}: load that "
            "checkpoint again with the optimizer moments, the LR schedule's step and the "
            "data position"
        )
    elif nothing_healthy:
        why = (
            f"the {f.kind.value} starts at the first logged step: no step of this run is "
            "known healthy"
        )
    elif cause is not None:
        why = f"{cause.kind.value} from step {cause.start_step:,} was still going on at the onset"
    elif climbing:
        why = f"the loss had been climbing since its low at step {climb:,}"
    else:
        why = f"onset of the {f.kind.value} at step {f.start_step:,}"
    decide_by = None
    if f.kind == FindingKind.LOSS_SPIKE and f.measures.get("classification") == "unresolved":
        peak = f.peak_step if f.peak_step is not None else f.start_step
        decide_by = peak + int(ev.params.spikes.recover_steps)
    trainer = ev.trainer  # looked up once per run, not once per plan
    commands = (
        _commands(trainer, ckpt, lr_resume, skip, ev.run)
        if do_rollback and f.kind != FindingKind.OVERFITTING and not nothing_healthy
        else ()
    )
    if f.kind == FindingKind.OVERFITTING and trainer == "hf" and ckpt is not None:
        commands = ("load_best_model_at_end=True, metric_for_best_model='eval_loss'",)
    return RollbackPlan(
        finding=f,
        trainer_best=best_other,
        rollback=do_rollback,
        onset_step=onset,
        last_healthy_step=healthy,
        checkpoint_step=ckpt if do_rollback else None,
        checkpoint_known=known if do_rollback else False,
        checkpoint_source=source,
        lr_cut=cut,
        lr_cut_text=cut_text,
        lr_before=lr_before,
        lr_resume=lr_resume,
        why=why,
        skip_steps=skip,
        commands=commands,
        trainer=trainer,
        lr_change=lr_change,
        decide_by=decide_by,
        onset_kind=(
            cause.kind.value if cause is not None else ("loss climb" if climbing else f.kind.value)
        ),
        findings=tuple(fs),
        resumed_at=resumed_at,
        lr_at_checkpoint=lr_ckpt if lr_resume is not None else None,
    )


def _scale_still_down(ev: Evidence, g: Finding, step: int) -> bool:
    """Is ``g`` a loss-scale collapse (at least :data:`~forensics.causes.COLLAPSE_HALVINGS`
    halvings, as the causes table reads one) the scale had not climbed back from by ``step``:
    at most :data:`_SCALE_HELD_HALVINGS` halvings above where the fall ended, at every logged
    point up to ``step``? Its halvings end when the scale reaches its floor, but the collapse
    goes on while the scale sits there (a divergence 180 steps after the scale hit 1 had
    rolled back to between the overflows and the divergence, "last healthy step" in the
    middle of them). A shallower fall to a level the scale then holds is the scaler finding
    a new level, not a trouble still going on."""
    from forensics.causes import COLLAPSE_HALVINGS

    if g.kind is not FindingKind.LOSS_SCALE_DROP or g.end_step is None or not ev.has(LOSS_SCALE):
        return False
    halvings = g.measures.get("halvings")
    if not isinstance(halvings, int | float) or halvings < COLLAPSE_HALVINGS:
        return False
    s = ev.series(LOSS_SCALE)
    a = int(np.searchsorted(s.steps, g.end_step, side="right"))
    b = int(np.searchsorted(s.steps, step, side="right"))
    if a == 0 or b <= a:
        return False
    floor = float(s.values[a - 1])  # the scale where the fall ended
    return bool(floor >= 0 and (s.values[a:b] <= floor * 2.0**_SCALE_HELD_HALVINGS).all())


_SCALE_HELD_HALVINGS = 2  # a scaler stuck at its floor may try one or two growths in between


def _recovered_series(g: Finding, lead: Finding, fs: list[Finding]) -> bool:
    """Is ``g`` a series of periodic spikes whose spikes before the lead all came back (two or
    more, each physiological)? Then the run was healthy between them: a rollback goes back
    before the lead, not before the series' first spike (which would throw away every step
    since and meet the same recurring batch again). Without spike findings to show it, the
    series still counts as going on."""
    if g.kind is not FindingKind.PERIODIC_SPIKES:
        return False
    before = [
        h
        for h in fs
        if h.kind is FindingKind.LOSS_SPIKE
        and h is not lead
        and g.start_step <= h.start_step < lead.start_step
    ]
    return len(before) >= 2 and all(
        h.measures.get("classification") == "physiological" for h in before
    )


def _resume_at_onset(f: Finding, causes: Sequence[Any] | None) -> int | None:
    """The step of a supported resume the lead (a loss or grad-norm spike, not a red light)
    began at, within one logging interval; None otherwise. A spike the job took at its resume
    came from what the resume restored, not from the LR: reload with the whole state."""
    if f.kind not in (FindingKind.LOSS_SPIKE, FindingKind.GRAD_NORM_SPIKE):
        return None
    if f.severity == Severity.FATAL or not causes:
        return None
    iv = f.measures.get("log_interval")
    reach = float(iv) if isinstance(iv, (int, float)) else 1.0
    for c in causes:
        if getattr(c, "cause", None) != "resume" or getattr(c, "status", None) != "supported":
            continue
        steps = getattr(c, "steps", ())
        if steps and 0 <= f.start_step - int(steps[0]) <= reach:
            return int(steps[0])
    return None


def _supported_batch(causes: Iterable[Any]) -> list[Any]:
    return [
        c
        for c in causes
        if getattr(c, "cause", None) in ("bad_batch", "shared_data")
        and getattr(c, "status", None) == "supported"
    ]


def _skip_steps(
    ev: Evidence, fs: list[Finding], lr_caused: bool, causes: Sequence[Any] | None
) -> tuple[int, int] | None:
    """The batches to skip on resume, only when the incident's cause is a batch (never for an
    LR change no schedule explains): the steps the bad-batch evidence names, else the first
    loss spike's steps, with a margin of SKIP_MARGIN on each side.

    Without tested causes, a loss spike the grad norm led counts as a batch."""
    if lr_caused or any(g.kind == FindingKind.PERIODIC_SPIKES for g in fs):
        return None  # a recurring batch is a data problem to fix, not a range to skip
    if causes is not None:
        hits = _supported_batch(causes)
        if not hits:
            return None
        steps = sorted(s for c in hits for s in getattr(c, "steps", ()))
        if steps:
            # One bad batch (or a few adjacent ones); steps far apart mean it recurs.
            a = b = steps[0]
            for s in steps[1:]:
                if s - b > SKIP_CLUSTER:
                    return None  # it recurs
                b = s
            return max(ev.run.first_step, a - SKIP_MARGIN), b + SKIP_MARGIN
    spikes = [
        g
        for g in fs
        if g.kind == FindingKind.LOSS_SPIKE
        and (causes is not None or g.measures.get("grad_norm_lead_steps") is not None)
    ]
    if not spikes:
        return None
    g = min(spikes, key=lambda x: x.start_step)
    a = max(ev.run.first_step, g.start_step - SKIP_MARGIN)
    b = (g.peak_step if g.peak_step is not None else g.start_step) + SKIP_MARGIN
    return a, b


def incident_rollbacks(
    run: Run | Evidence,
    incidents: Sequence[Any],
    findings: Sequence[Finding],
    *,
    checkpoint_every: int | None = None,
) -> list[RollbackPlan]:
    """A plan per incident (set on ``incident.rollback`` when it is a rollback; first aid
    without a rollback is returned but not attached), first aid for a drift inside an incident
    another finding leads, and a plan per finding outside every incident that calls for one.
    In onset order."""
    ev = run if isinstance(run, Evidence) else Evidence(run)
    out: list[RollbackPlan] = []
    covered: set[int] = set()
    for inc in incidents:
        covered.update(id(f) for f in inc.findings)
        plan = rollback_plan(
            ev, inc.findings, checkpoint_every=checkpoint_every, causes=getattr(inc, "causes", None)
        )
        if plan is None:
            continue
        if plan.rollback:
            inc.rollback = plan
        out.append(plan)
        # First aid for a drift inside the incident (cut the LR and keep training) is still
        # advice of its own when the incident's plan is a rollback led by another finding.
        for g in inc.findings:
            rule = lr_cut_for(g)
            if g is not plan.finding and rule is not None and not rule[0]:
                aid = rollback_plan(ev, inc.findings, checkpoint_every=checkpoint_every, lead=g)
                if aid is not None:
                    out.append(aid)
    rest = [f for f in findings if id(f) not in covered]
    for plan in rollback_advice(ev, rest, checkpoint_every=checkpoint_every):
        out.append(plan)
    return sorted(out, key=lambda p: p.onset_step)


def rollback_advice(
    run: Run | Evidence, findings: list[Finding], *, checkpoint_every: int | None = None
) -> list[RollbackPlan]:
    """A rollback plan per finding that calls for one (the per-finding grouping used until
    findings are grouped into incidents; :func:`rollback_plan` takes one incident).

    The episode's onset is the earliest actionable training-dynamics finding still going on
    when this one began (a grad-norm climb that precedes a spike makes the spike's eve
    unhealthy too; a throughput drop does not).
    """
    ev = run if isinstance(run, Evidence) else Evidence(run)
    out: list[RollbackPlan] = []
    for f in findings:
        if lr_cut_for(f) is None:
            continue
        context = [f] + [g for g in findings if g is not f]
        plan = rollback_plan(ev, context, checkpoint_every=checkpoint_every, lead=f)
        if plan is not None:
            out.append(plan)
    return out


__all__ = [
    "DATA_POSITION",
    "LR_CUT_DRIFT",
    "LR_CUT_RED_LIGHT",
    "LR_CUT_SPIKE",
    "Rollback",
    "RollbackPlan",
    "lr_cut_for",
    "incident_rollbacks",
    "rollback_advice",
    "rollback_plan",
    "trainer_of",
]
