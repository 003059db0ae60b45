"""Diagnosis: the verdict, a prescription per finding, the timeline, rollback advice, checklists.

``diagnose(run, findings)`` turns what the detectors saw into what the user should do: each
finding's causes tested against the evidence (:mod:`forensics.causes`), the incidents the
findings form (:mod:`forensics.incidents`), the verdict, the prescriptions, the timeline. It
holds no HTML: the report renders it, the CLI prints it, ``to_document()`` serialises the
findings document (schema_version 2: version 1 plus each finding's ``causes`` and the
``incidents`` array; see the README's findings contract).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

from forensics.causes import SUPPORTED, Cause, causes_of
from forensics.checklists import Coverage, Phase, coverage, evaluate_checklists
from forensics.evidence import Evidence
from forensics.findings import Finding, FindingKind, Severity, worst_severity
from forensics.incidents import (
    Incident,
    build_incidents,
    lr_points,
    previous_points,
    run_timeline,
)
from forensics.prescriptions import (
    AREAS,
    CAUSE_ADVICE,
    LARGE_GRADIENT_ADVICE,
    STANDING_GUIDANCE,
    Check,
    Prescription,
    checks_for,
    light_prefix,
    needs_action,
    prescribe,
)
from forensics.rollback import (  # rollback_advice: re-exported for callers of diagnosis
    Rollback,
    incident_rollbacks,
    rollback_advice,  # noqa: F401
)
from forensics.run import Run
from forensics.timeline import Timeline

SCHEMA_VERSION = 2


class Advice(NamedTuple):
    """A next step (:meth:`Diagnosis.what_to_do`): what it is about (``where``: a finding's
    kind and onset, or the supported root cause and its step) and what to do."""

    where: str
    text: str


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
    # Each finding's causes tested against the evidence, in the findings' order.
    causes: list[list[Cause]] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)

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

    def causes_for(self, finding: Finding) -> list[Cause]:
        """The causes diagnose() tested for this finding (looked up by identity)."""
        for f, cs in zip(self.findings, self.causes, strict=False):
            if f is finding:
                return cs
        return []

    def unjudged(self) -> str | None:
        """What the light cannot cover, in a sentence or two (None when nothing): a log with
        no training loss (the loss's checks did not run, so the light covers only what the
        log has), and a down-sampled W&B chart export (judged on its sampled points: a spike
        within a bucket shows only in the bucket's maximum)."""
        parts = [
            p for p in (self._no_loss(), self._too_short(), self._sampled(), self._clipped()) if p
        ]
        return " ".join(parts) if parts else None

    def _clipped(self) -> str | None:
        """A grad norm logged after clipping (:func:`forensics.detectors.drift.
        grad_norm_ceiling`): no climb above the clip can show, so a light that judged the
        grad norm did not judge one."""
        from forensics.schema import GRAD_NORM

        if self.evidence is None or not self.run.has(GRAD_NORM):
            return None
        from forensics.detectors.drift import grad_norm_ceiling
        from forensics.evidence.trend_utils import num

        got = grad_norm_ceiling(self.evidence)
        if got is None:
            return None
        top, k, n, first = got
        return (
            f"The grad norm looks clipped: it is exactly {num(top)}, its highest value, at "
            f"{k:,} of {n:,} points (from step {first:,} on), so a climb above {num(top)} "
            "cannot show and the light does not cover one."
        )

    def _too_short(self) -> str | None:
        """A loss logged at fewer points than its trend checks need (the plateau's and the
        no-learning check's minimum): a green light on it would say more than was judged (one
        logged step read as healthy)."""
        from forensics.schema import LOSS

        if not self.run.has(LOSS) or self.evidence is None:
            return None
        s = self.evidence.series(LOSS)
        params = self.evidence.params
        need = min(params["plateau"].min_points, params["no_learning"].min_points)
        if len(s) >= need or len(s) == 0:  # (none finite: the NaN / Inf finding says so)
            return None
        where = (
            f"step {int(s.steps[0]):,}"
            if len(s) == 1
            else f"steps {int(s.steps[0]):,}-{int(s.steps[-1]):,}"
        )
        n = "1 finite loss point" if len(s) == 1 else f"{len(s):,} finite loss points"
        side = params["spikes"].min_side  # (a spike is scored against the points before it)
        if len(s) <= side:
            return (
                f"Only {n} in the log ({where}): too few for any check that compares the loss "
                f"with its own level (a spike needs {side} points before it, a plateau or a run "
                f"that never learned {need}), so the light covers little more than NaN / Inf."
            )
        return (
            f"Only {n} in the log ({where}): the plateau and no-learning checks need {need} "
            "and did not run, and a spike is judged against the few points beside it."
        )

    def _no_loss(self) -> str | None:
        from forensics.schema import LOSS

        if self.run.has(LOSS):
            return None
        from forensics.pipeline import no_vital_sign

        why = no_vital_sign(self.run, str(self.run.path))
        if why is not None:
            return f"The light judges nothing: {why}."
        logged = sorted(m for m in self.run.metrics() if not m.startswith("eval/"))
        have = f" ({', '.join(logged)})" if logged else ""
        said = (
            "No training loss in the log: its checks (spikes, divergence, plateau, the "
            f"train/val gap) did not run, and the light covers only what was logged{have}."
        )
        near = _loss_like_tags(self.run)
        if near:
            from forensics.pipeline import listed
            from forensics.schema import alias_line

            said += (
                f" Logged under names near a loss's, and not read as one: {listed(near)}; "
                f"`{alias_line(near[0], LOSS)}` judges {near[0]} as the training loss."
            )
        return said

    def _sampled(self) -> str | None:
        sampled = self.run.metadata.get("sampled_export")
        if not isinstance(sampled, dict):
            return None
        from forensics.params import SpikesParams
        from forensics.sampled import excursion_text
        from forensics.schema import GRAD_NORM, LOSS

        p = self.evidence.params.spikes if self.evidence is not None else SpikesParams()
        # A bucket's extreme as far from its point as a spike's least height: the loss's and
        # the grad norm's (their spikes are what a sampled chart hides).
        least = {LOSS: p.loss_min_ratio, GRAD_NORM: p.grad_norm_min_ratio}
        tags = self.run.metrics()
        wide = sorted(
            (
                (tags[m], w)
                for m, r in least.items()
                if (w := sampled.get("excursions", {}).get(tags.get(m))) and w["ratio"] >= r
            ),
            key=lambda tw: -tw[1]["ratio"],
        )
        beyond = "; ".join(f"{t}: {excursion_text(w)}" for t, w in wide)
        return (
            "Judged on the sampled points of a down-sampled W&B chart export, not the run's "
            "full history: a spike inside a bucket shows only in its __MIN/__MAX columns."
            + (f" They go further here: {beyond}." if beyond else "")
            + " Export the full history (the API's run.scan_history()) to judge it."
        )

    def x_unit_note(self) -> str | None:
        """A sentence where the log counts epochs or its points, not optimizer steps: every
        "step" the findings name is an epoch (a point), and the windows set in steps count
        those (None else)."""
        if self.run.x_unit == "point":
            return (
                "This log prints no step: its points are numbered in the order logged, every "
                '"step" below is the n-th point, and the windows set in steps (the 500-step '
                "baseline, the 100-300 steps of a spike's recovery) count points here."
            )
        if self.run.x_unit != "epoch":
            return None
        return (
            'This log counts epochs, not optimizer steps: every "step" below is an epoch, and '
            "the windows set in steps (the 500-step baseline, the 100-300 steps of a "
            "spike's recovery) count epochs here."
        )

    def order_sentence(self, limit: int | None = None) -> str:
        """Who moved first, for the banner and the terminal. With several incidents, the most
        severe one's order (the earliest of equals), named: the run's whole order would open
        with an earlier, milder incident's first mover (a warm-up end at step 30 heading a
        critical incident at step 300 it has nothing to do with). The report's timeline
        section keeps the run's whole order."""
        incidents = self.incidents
        if len(incidents) < 2:
            timeline = self.timeline if self.timeline is not None else Timeline([], [])
            return timeline.sentence(limit)
        worst = min(incidents, key=lambda i: (-i.severity.rank, i.start_step))
        sev = worst.severity
        ties = sum(1 for i in incidents if i.severity is sev)
        which = (
            f"the most severe of {len(incidents)} incidents"
            if ties == 1
            else f"the first of {ties} {sev.value} incidents"
        )
        text = worst.timeline.sentence(limit)
        return (
            f"{worst.id[0].upper()}{worst.id[1:]} ({sev.value}, steps {worst.steps}), "
            f"{which}: {text[0].lower()}{text[1:]}"
        )

    def what_to_do(self, findings: Sequence[Finding]) -> Advice | None:
        """The next step for the most severe of ``findings`` (the earliest of equals) that
        calls for action: its prescription, or, where its incident's supported root cause says more
        than the finding's row (a bad batch behind a loss-scale drop: find the batch, not
        "move to bf16"), that cause's advice. None when none calls for action. The terminal
        ends on it when there is no rollback to advise; each incident card of the report
        without a rollback shows it."""
        worst_first = sorted(findings, key=_rank_key)
        act = next((f for f in worst_first if needs_action(f)), None)
        if act is None:
            return None
        home = self.incident_of(act)
        root = home.supported[0] if home is not None and home.supported else None
        if home is None or root is None or root.cause not in CAUSE_ADVICE:
            return Advice(
                f"{act.kind.value} from step {act.start_step:,}", self.prescription_for(act)
            )
        step = root.steps[0] if root.steps else act.start_step
        text = light_prefix(act) + CAUSE_ADVICE[root.cause]
        unbounded = any(c.cause == "large_gradient" and c.status == SUPPORTED for c in home.causes)
        if unbounded and root.cause != "lr_change":
            # The weights moved with that gradient and held: whatever set it off, the update
            # was not bounded (the article's row for a param-norm jump).
            text += " " + LARGE_GRADIENT_ADVICE
        return Advice(f"{root.cause.replace('_', ' ')} at step {step:,}", text)

    def incident_of(self, finding: Finding) -> Incident | None:
        """The incident this finding belongs to (None for a note outside every incident)."""
        for inc in self.incidents:
            if any(g is finding for g in inc.findings):
                return inc
        return None

    @cached_property
    def _rx_by_id(self) -> dict[int, str]:
        return {id(f): p for f, p in zip(self.findings, self.prescriptions, strict=True)}

    def ranked(self) -> list[Finding]:
        """Findings by severity (worst first), then onset: the order the report lists them."""
        return sorted(self.findings, key=_rank_key)

    @cached_property
    def investigation(self) -> list[Investigation]:
        """The checks the findings call for: data, then optimizer, then layers (article 3.5)."""
        by_area: dict[str, dict[str, tuple[Check, list[FindingKind]]]] = {a: {} for a in AREAS}
        for f in self.ranked():
            if not needs_action(f):
                continue
            for chk in checks_for(f):
                slot = by_area.setdefault(chk.area, {})
                if chk.text not in slot:
                    slot[chk.text] = (chk, [])
                if f.kind not in slot[chk.text][1]:
                    slot[chk.text][1].append(f.kind)
        return [Investigation(a, list(by_area[a].values())) for a in by_area if by_area[a]]

    def to_document(self) -> dict[str, Any]:
        """The findings document, schema_version 2 (key order is part of the contract)."""
        run = self.run
        causes = self.causes or [[] for _ in self.findings]
        return {
            "schema_version": SCHEMA_VERSION,
            "run": {
                "name": run.name,
                "path": str(run.path),
                "format": run.format,
                "first_step": run.first_step,
                "last_step": run.last_step,
                "metrics": run.metrics(),
                # What the verdict cannot cover (no training loss: its checks did not run), so
                # that a gate reading "healthy" from this file sees it too; null otherwise.
                "unjudged": self.unjudged(),
                # What the steps count: "epoch" for a log indexed by epoch, else "step".
                "x_unit": run.x_unit,
            },
            "verdict": self.verdict,
            "findings": [
                {**f.to_dict(p), "causes": [c.to_dict() for c in cs]}
                for f, p, cs in zip(self.findings, self.prescriptions, causes, strict=True)
            ],
            "incidents": [inc.to_dict() for inc in self.incidents],
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
    from forensics.allocator import trim

    ev = evidence_of(run)
    findings = list(findings)
    causes = causes_of(ev, findings)
    trim()  # (the cause tests' temporaries given back before the next stage's)
    previous = previous_points(ev)
    incidents = build_incidents(findings, causes, previous, lr_points(ev))
    diag = Diagnosis(
        run=ev.run,
        findings=findings,
        verdict=verdict_of(findings),
        prescriptions=[prescribe(f, c) for f, c in zip(findings, causes, strict=True)],
        checkpoint_every=checkpoint_every,
        rollbacks=incident_rollbacks(ev, incidents, findings, checkpoint_every=checkpoint_every),
        timeline=run_timeline(incidents, findings, previous),
        phases=evaluate_checklists(ev, findings),
        coverage=coverage(ev),
        evidence=ev,
        causes=causes,
        incidents=incidents,
    )
    trim()  # (the checklists' series reads given back before the report or summary)
    return diag


def _rank_key(f: Finding) -> tuple[int, int, str]:
    """Worst first, then by onset: the order the report lists findings in."""
    return (-f.severity.rank, f.start_step, f.kind.value)


def _loss_like_tags(run: Run) -> list[str]:
    """The run's unmapped series whose name is nearest the training loss's spellings, as
    ``forensics metrics`` offers them an ``--alias`` (an RLHF log's ``act_loss`` and
    ``cri_loss``): the no-loss sentence names them, so the light's limit does not read as if
    nothing like a loss was logged."""
    from forensics.run_frame import metrics_table, unmapped_tags
    from forensics.schema import LOSS

    kinds = unmapped_tags(metrics_table(run))
    return [t for t, (kind, c) in kinds.items() if kind == "near" and c == LOSS]
