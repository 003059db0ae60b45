"""Diagnosis: the verdict, a prescription per finding, the timeline, rollback advice, checklists.

``diagnose(run, findings)`` turns what the detectors saw into what the user should do. It
holds no HTML: the report renders it, the CLI prints it, ``to_document()`` serialises the
findings document (schema_version 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from forensics.checklists import Coverage, Phase, coverage, evaluate_checklists
from forensics.evidence import Evidence
from forensics.findings import Finding, FindingKind, Severity, worst_severity
from forensics.prescriptions import (
    AREAS,
    STANDING_GUIDANCE,
    Check,
    Prescription,
    needs_action,
    prescribe,
)
from forensics.prescriptions import TABLE as PRESCRIPTIONS
from forensics.run import Run
from forensics.schema import LR, VAL_LOSS
from forensics.timeline import Timeline, build_timeline

SCHEMA_VERSION = 1

# Kinds that describe the training dynamics going wrong; an ongoing one makes the eve of a later
# event unhealthy too. Infrastructure and evaluation findings do not move the rollback point.
_DYNAMICS = {
    FindingKind.LOSS_SPIKE,
    FindingKind.GRAD_NORM_SPIKE,
    FindingKind.DIVERGENCE,
    FindingKind.NAN_INF,
    FindingKind.LOSS_SCALE_DROP,
    FindingKind.GRAD_NORM_DRIFT,
    FindingKind.PARAM_NORM_JUMP,
    FindingKind.LAYER_GRAD_SHIFT,
    FindingKind.ACTIVATION_OUTLIER,
    FindingKind.PERIODIC_SPIKES,
}

# Learning-rate cuts by situation (the article's numbers): (low, high) fraction removed.
LR_CUT_SPIKE = (0.2, 0.5)  # a spike that does not recover (7.1)
LR_CUT_RED_LIGHT = (0.1, 0.1)  # automatic rollback after a fatal divergence (6.3)
LR_CUT_DRIFT = (2 / 3, 2 / 3)  # grad-norm drift first aid: down to a third (3.5)


@dataclass(frozen=True)
class Rollback:
    """Where to go back to after a pathological event, and how much to cut the learning rate."""

    finding: Finding
    rollback: bool  # False for first aid that keeps training (grad-norm drift)
    onset_step: (
        int  # onset of the episode (may precede the finding when trouble was already going on)
    )
    last_healthy_step: int | None
    checkpoint_step: int | None
    checkpoint_source: str
    lr_cut: tuple[float, float]
    lr_cut_text: str
    lr_at_onset: float | None
    new_lr: tuple[float, float] | None
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.finding.kind.value,
            "start_step": self.finding.start_step,
            "rollback": self.rollback,
            "onset_step": self.onset_step,
            "last_healthy_step": self.last_healthy_step,
            "checkpoint_step": self.checkpoint_step,
            "checkpoint_source": self.checkpoint_source,
            "lr_cut": self.lr_cut_text,
            "lr_at_onset": self.lr_at_onset,
            "new_lr": list(self.new_lr) if self.new_lr else None,
        }


@dataclass(frozen=True)
class Investigation:
    """One area of the order of investigation with the checks the findings call for."""

    area: str
    checks: list[tuple[Check, list[FindingKind]]]


@dataclass
class Diagnosis:
    """Everything the report and the summary show about one run.

    ``evidence`` is the one computation the findings were judged against; the checklists,
    the report's charts and compare read it instead of recomputing anything.
    """

    run: Run
    findings: list[Finding]
    verdict: str
    prescriptions: list[str]
    checkpoint_every: int | None = None
    rollbacks: list[Rollback] = field(default_factory=list)
    timeline: Timeline | None = None
    phases: list[Phase] = field(default_factory=list)
    coverage: list[Coverage] = field(default_factory=list)
    evidence: Evidence | None = None

    @cached_property
    def ev(self) -> Evidence:
        """The run's evidence (the one the detectors read; built with defaults if absent)."""
        return self.evidence if self.evidence is not None else Evidence(self.run)

    @property
    def standing_guidance(self) -> tuple[Prescription, ...]:
        return STANDING_GUIDANCE

    def prescription_for(self, finding: Finding) -> str:
        """The prescription diagnose() wrote for this finding (looked up by identity)."""
        return self._rx_by_id.get(id(finding)) or self.prescriptions[self.findings.index(finding)]

    @cached_property
    def _rx_by_id(self) -> dict[int, str]:
        return {id(f): p for f, p in zip(self.findings, self.prescriptions, strict=True)}

    def ranked(self) -> list[Finding]:
        """Findings by severity (worst first), then onset: the order the report lists them."""
        return sorted(self.findings, key=lambda f: (-f.severity.rank, f.start_step, f.kind.value))

    @cached_property
    def investigation(self) -> list[Investigation]:
        """The checks the findings call for: data, then optimizer, then layers (article 3.5)."""
        by_area: dict[str, dict[str, tuple[Check, list[FindingKind]]]] = {a: {} for a in AREAS}
        for f in self.ranked():
            if not needs_action(f):
                continue
            for chk in PRESCRIPTIONS[f.kind].checks:
                slot = by_area.setdefault(chk.area, {})
                if chk.text not in slot:
                    slot[chk.text] = (chk, [])
                if f.kind not in slot[chk.text][1]:
                    slot[chk.text][1].append(f.kind)
        return [Investigation(a, list(by_area[a].values())) for a in by_area if by_area[a]]

    def to_document(self) -> dict[str, Any]:
        """The findings document, schema_version 1 (key order is part of the contract)."""
        run = self.run
        return {
            "schema_version": SCHEMA_VERSION,
            "run": {
                "name": run.name,
                "path": str(run.path),
                "format": run.format,
                "first_step": run.first_step,
                "last_step": run.last_step,
                "metrics": run.metrics(),
            },
            "verdict": self.verdict,
            "findings": [
                f.to_dict(p) for f, p in zip(self.findings, self.prescriptions, strict=True)
            ],
        }

    # -- notebooks: see forensics.notebook -------------------------------------------------
    def _repr_html_(self) -> str:
        """Jupyter's view: verdict, findings and a chart per vital sign, no file written."""
        from forensics.notebook import diagnosis_html

        return diagnosis_html(self)

    @property
    def frame(self) -> Any:
        """The run's canonical long frame (polars)."""
        return self.run.frame

    def to_arrow(self) -> Any:
        """The run's frame as a pyarrow Table."""
        return self.run.to_arrow()

    def to_pandas(self) -> Any:
        """The run's frame as pandas, through Arrow (Arrow-backed dtypes)."""
        return self.run.to_pandas()


def verdict_of(findings: list[Finding]) -> str:
    """The highest severity among the findings; ``healthy`` when none is above info."""
    worst = worst_severity(findings)
    if worst is None or worst == Severity.INFO:
        return "healthy"
    return worst.value


def evidence_of(run_or_evidence: Run | Evidence) -> Evidence:
    """The evidence given, or one built with the default parameters for a bare run."""
    if isinstance(run_or_evidence, Evidence):
        return run_or_evidence
    return Evidence(run_or_evidence)


def diagnose(
    run: Run | Evidence, findings: list[Finding], *, checkpoint_every: int | None = None
) -> Diagnosis:
    """Turn findings into a verdict, prescriptions, a timeline, rollback advice and checklists.

    Args:
        run: the run's :class:`~forensics.evidence.Evidence` (the one the detectors read),
            or a bare run (evidence is then built with the default parameters).
        findings: detector output, kept in the order given (step order from ``detect``).
        checkpoint_every: the checkpoint interval to assume when the run shows none
            (``--checkpoint-every``); the article's 500 when None.
    """
    ev = evidence_of(run)
    findings = list(findings)
    return Diagnosis(
        run=ev.run,
        findings=findings,
        verdict=verdict_of(findings),
        prescriptions=[prescribe(f) for f in findings],
        checkpoint_every=checkpoint_every,
        rollbacks=rollback_advice(ev, findings, checkpoint_every=checkpoint_every),
        timeline=build_timeline(findings),
        phases=evaluate_checklists(ev, findings),
        coverage=coverage(ev),
        evidence=ev,
    )


# -- rollback ----------------------------------------------------------------------------


def _lr_cut_for(f: Finding) -> tuple[bool, tuple[float, float], str] | None:
    """(roll back?, cut range, wording) for findings that call for a rollback or first aid."""
    if f.severity == Severity.FATAL or f.kind == FindingKind.DIVERGENCE:
        return True, LR_CUT_RED_LIGHT, "10% lower (the red-light rule)"
    if f.kind == FindingKind.LOSS_SPIKE and f.measures.get("classification") in (
        "pathological",
        "unresolved",
    ):
        return True, LR_CUT_SPIKE, "20-50% lower"
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
    return None


def _best_val_step(ev: Evidence, until: int) -> int | None:
    """The step with the lowest validation loss up to ``until`` (overfitting's rollback point)."""
    s = ev.series(VAL_LOSS)
    ok = s.steps <= until
    if not ok.any():
        return None
    return int(s.steps[ok][np.argmin(s.values[ok])])


def _value_at(ev: Evidence, metric: str, step: int) -> float | None:
    """The last finite value of ``metric`` at or before ``step``."""
    s = ev.series(metric)
    i = int(np.searchsorted(s.steps, step, side="right")) - 1
    return float(s.values[i]) if i >= 0 else None


def _last_logged_before(ev: Evidence, metric: str | None, step: int) -> int | None:
    for m in (metric, "loss"):
        if not m:
            continue
        steps = ev.logged(m).steps  # a NaN was logged too
        if len(steps) == 0:
            continue
        i = int(np.searchsorted(steps, step, side="left")) - 1
        if i >= 0:
            return int(steps[i])
    return step - 1 if step > ev.run.first_step else None


def rollback_advice(
    run: Run | Evidence, findings: list[Finding], *, checkpoint_every: int | None = None
) -> list[Rollback]:
    """Rollback and learning-rate advice for each pathological event.

    The episode's onset is the earliest actionable training-dynamics finding still going on
    when this one began (a grad-norm climb that precedes a spike makes the spike's eve
    unhealthy too; a throughput drop does not). The checkpoint to go back to comes from
    the evidence's :attr:`~forensics.evidence.Evidence.checkpoints`.
    """
    ev = evidence_of(run)
    actionable = [f for f in findings if needs_action(f) and f.kind in _DYNAMICS]
    out: list[Rollback] = []
    for f in findings:
        rule = _lr_cut_for(f)
        if rule is None:
            continue
        do_rollback, cut, cut_text = rule
        onset, cause = f.start_step, None
        for g in actionable:
            if (
                g is not f
                and g.start_step < onset
                and (g.end_step is None or g.end_step >= f.start_step)
            ):
                onset, cause = g.start_step, g
        healthy = _last_logged_before(ev, f.metric if cause is None else cause.metric, onset)
        if f.kind == FindingKind.OVERFITTING:
            # The best val step at or before the finding's onset, so the advice never points
            # past the step the finding says the val loss turned up (a later noisy dip).
            best = _best_val_step(ev, f.start_step)
            healthy = best if best is not None else healthy
        ckpt, source = (
            ev.checkpoints.before(healthy, checkpoint_every)
            if healthy is not None
            else (None, "the trouble starts at the first logged step")
        )
        lr = _value_at(ev, LR, healthy if healthy is not None else onset)
        new_lr = (lr * (1 - cut[1]), lr * (1 - cut[0])) if lr is not None and cut[1] > 0 else None
        if f.kind == FindingKind.OVERFITTING:
            why = (
                "the lowest validation loss before it turned up"
                if healthy is not None
                else "no validation loss to pick the best step"
            )
        elif cause is not None:
            why = (
                f"{cause.kind.value} from step {cause.start_step:,} was still going on at the onset"
            )
        else:
            why = f"onset of the {f.kind.value} at step {f.start_step:,}"
        out.append(
            Rollback(f, do_rollback, onset, healthy, ckpt, source, cut, cut_text, lr, new_lr, why)
        )
    return out
