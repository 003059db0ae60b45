"""Replaced attempts: what a job showed in the steps that a resume from an earlier checkpoint
logged again.

When an attempt goes wrong (the loss blows up, the job crashes) and is resumed from an earlier
checkpoint, the resumed job logs the same steps again, and the analysis view keeps the later
values (TensorBoard's rule: a record at step s pre-empts earlier records at steps >= s). The
failed attempt's last stretch, often the bad night itself, would then leave the analysis
with nothing but a restart note.

Each resume that replayed logged steps is looked at on its own: the rows of the earlier
segments (from ``CONTEXT_STEPS`` before the resume's first step, for the baselines, to where
they stop) are a run of their own, judged by the same detectors with the same parameters. Its
findings above info that reach into the replaced steps, and that the analysis of the run as it
stands does not hold, are summarised in one ``replaced_attempt`` warning at the resume, with
the cause the attempt's own log supports, the LR each job ran and whether the resumed job got
through those steps. The steps it names are the replaced attempt's: the charts draw the
resumed job's values there, and the attempt's dotted beside them.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from forensics.evidence.trend_utils import num
from forensics.findings import Finding, FindingKind, Severity, sort_findings
from forensics.run import Run
from forensics.schema import LR

# Steps of the earlier attempt before the resume's first step kept as context (baselines,
# trends): the detectors' longest look-backs (a 500-step baseline, a 300-point trend, a few
# eval windows) fit well inside it, and a long run's whole history is not judged twice.
CONTEXT_STEPS = 20_000
# Replaced attempts judged at most (a job preempted every hour resumes hundreds of times).
MAX_ATTEMPTS = 20
# Run-level notes of the importers; the run as it stands already carries them.
_NOT_THE_ATTEMPTS = frozenset({FindingKind.RESTART, FindingKind.TRUNCATED_LOG, FindingKind.CRASH})


def replaced_attempts(
    run: Run, params: Any, ignore: set[FindingKind], findings: list[Finding]
) -> list[Finding]:
    """One ``replaced_attempt`` finding per resume whose replaced steps held findings above
    info that ``findings`` (the run's, as it stands) do not; ``params``: the detectors'."""
    out: list[Finding] = []
    if FindingKind.REPLACED_ATTEMPT in ignore:
        return out
    shown = {(f.kind, f.metric, f.start_step) for f in findings}
    # Resumes that logged steps again (the others go on, or two writers interleave).
    rewinds = [
        f
        for f in run.import_findings
        if f.kind is FindingKind.RESTART and f.measures.get("points_repeated")
    ]
    if len(rewinds) > MAX_ATTEMPTS:
        # A job preempted over and over: the largest rewinds (most likely a failure rolled
        # back, not a preemption's few hundred steps), each judged costing a small analysis.
        by_size = sorted(rewinds, key=lambda f: -_int(f.measures["points_repeated"]))
        rewinds = sorted(by_size[:MAX_ATTEMPTS], key=lambda f: f.start_step)
        run.note(
            f"replaced_attempt: {len(by_size) - MAX_ATTEMPTS:,} of {len(by_size):,} resumes that "
            f"logged steps again were not judged (the {MAX_ATTEMPTS} that replaced the most "
            "points were)"
        )
    for restart in rewinds:
        m = restart.measures
        attempt = _attempt(run, _int(m["segment"]), _int(m["resumed_from_step"]))
        if attempt is None:
            continue
        found, attempt_ev = _judge(attempt, params, ignore)
        resumed = _int(m["resumed_from_step"])
        kept = [
            f
            for f in found
            if f.severity is not Severity.INFO
            and f.kind not in _NOT_THE_ATTEMPTS
            and _reach(f) >= resumed
            and (f.kind, f.metric, f.start_step) not in shown
        ]
        if kept:
            cause_text, cause_ids = _causes_text(attempt_ev, _worst(kept), found)
            out.append(_finding(restart, kept, attempt, run, findings, cause_text, cause_ids))
    return out


def _attempt(run: Run, segment: int, resumed: int) -> Run | None:
    """The earlier segments' rows from CONTEXT_STEPS before ``resumed`` on, as a run."""
    frame = run.frame.filter(
        (pl.col("segment") < segment)
        & (pl.col("step").is_null() | (pl.col("step") >= resumed - CONTEXT_STEPS))
    )
    if frame.is_empty():
        return None
    earlier = [
        f
        for f in run.import_findings
        if f.kind is FindingKind.RESTART and _int(f.measures.get("segment", 0)) < segment
    ]
    return Run(
        name=run.name,
        path=run.path,
        format=run.format,
        frame=frame,
        import_findings=earlier,
        config=run.config,
        metadata=run.metadata,
    )


def _judge(attempt: Run, params: Any, ignore: set[FindingKind]) -> tuple[list[Finding], Any]:
    """The attempt's findings (import findings included, as the causes read them) and the
    evidence they were judged against."""
    from forensics.detectors import build
    from forensics.evidence import Evidence

    ev = Evidence(attempt, params)
    found: list[Finding] = list(attempt.import_findings)
    for det in build(ev.params):
        found.extend(f for f in det.detect(ev) if f.kind not in ignore)
    return sort_findings(found), ev


def _causes_text(ev: Any, worst: Finding, found: list[Finding]) -> tuple[str, str | None]:
    """What the attempt's own log supports as the cause of its worst finding (the causes
    tested there, as the report tests the run's): a sentence and the causes' ids."""
    from forensics.causes import SUPPORTED, find_causes

    sup = [c for c in find_causes(ev, worst, found) if c.status == SUPPORTED]
    if not sup:
        return " In that attempt the log supports no cause of it.", None
    c = sup[0]
    more = f" (+{len(sup) - 1} more)" if len(sup) > 1 else ""
    return (
        f" In that attempt the log supports: {c.text} ({c.evidence}){more}.",
        ", ".join(x.cause for x in sup),
    )


def _reach(f: Finding) -> int:
    return max(f.start_step, f.peak_step or f.start_step, f.end_step or f.start_step)


def _worst(kept: list[Finding]) -> Finding:
    return max(kept, key=lambda f: (f.severity.rank, -f.start_step))


def _finding(
    restart: Finding,
    kept: list[Finding],
    attempt: Run,
    run: Run,
    findings: list[Finding],
    cause_text: str,
    cause_ids: str | None,
) -> Finding:
    m = restart.measures
    resumed, last = _int(m["resumed_from_step"]), _int(m["last_step_before"])
    worst = _worst(kept)
    first = kept[0]
    kinds = sorted({f.kind.value for f in kept})
    steps = attempt.frame.get_column("step")
    since = int(steps.min()) if steps.null_count() < len(steps) else resumed  # type: ignore[arg-type]
    n = len(kept)
    listed = "; ".join(
        f"{f.severity.value} {f.kind.value}{_on(f.metric)} from step {f.start_step:,}"
        for f in kept[:4]
    ) + (f"; and {n - 4} more" if n > 4 else "")
    lr_then, lr_now, at = _lrs(attempt, run, max(worst.start_step, resumed))
    # (a resumed job not yet at that step is read at its own last step, and said so)
    now_at = min(at, run.last_step)
    there = "there" if now_at >= at else f"at step {now_at:,}, its last logged"
    if lr_then is None or lr_now is None:
        lr_text = ""
    elif lr_then == lr_now:
        lr_text = (
            f" At step {at:,} the resumed job runs the LR the attempt ran ({num(lr_now)}): "
            "the log shows no change of LR."
            if now_at >= at
            else f" At step {at:,} the attempt ran an LR of {num(lr_then)}; the resumed job "
            f"runs the same {there}: the log shows no change of LR."
        )
    else:
        lr_text = (
            f" At step {at:,} the attempt ran an LR of {num(lr_then)}; the resumed job runs "
            f"{num(lr_now)} {there} ({lr_now / lr_then:.2g}x)."
            if lr_then
            else ""
        )
    # Did the resumed job get through the steps where the attempt went wrong?
    again = [
        f
        for f in findings
        if f.kind is worst.kind
        and f.metric == worst.metric
        and f.severity is not Severity.INFO
        and f.start_step <= last
        and _reach(f) >= worst.start_step
    ]
    passed: bool | None = None
    if again:
        passed = False
        pass_text = f" The resumed job shows it again (from step {again[0].start_step:,})."
    elif run.last_step > last:
        passed = True
        pass_text = (
            f" The resumed job went through steps {worst.start_step:,}-{last:,} without it "
            f"(it has logged up to step {run.last_step:,})."
        )
    elif run.last_step < worst.start_step:
        pass_text = (
            f" The resumed job has not yet reached step {worst.start_step:,}, where the attempt "
            f"went wrong (it has logged up to step {run.last_step:,})."
        )
    else:
        pass_text = (
            f" The resumed job has logged up to step {run.last_step:,} without it so far, but "
            f"not yet past step {last:,}."
        )
    shown = min(last, run.last_step)
    summary = (
        f"The attempt that the resume at step {resumed:,} replaced (it had logged up to step "
        f"{last:,}) went wrong before it stopped: {worst.summary.rstrip('.')} "
        f"({worst.severity.value} in that attempt).{cause_text} "
        f"{n} finding{'s' if n != 1 else ''} in its replaced steps: {listed}.{lr_text}"
        f"{pass_text} The charts show the resumed job at steps {resumed:,}-{shown:,}."
    )
    return Finding(
        kind=FindingKind.REPLACED_ATTEMPT,
        severity=Severity.WARNING,
        metric=None,
        start_step=first.start_step,
        peak_step=worst.start_step,
        end_step=last,
        measures={
            "resumed_from_step": resumed,
            "attempt_last_step": last,
            "segment": _int(m["segment"]),
            "findings": n,
            "worst_severity": worst.severity.value,
            "worst_kind": worst.kind.value,
            "worst_metric": worst.metric,
            "worst_step": worst.start_step,
            "first_kind": first.kind.value,
            "first_step": first.start_step,
            "kinds": ", ".join(kinds),
            "judged_from_step": since,
            "lr_attempt": lr_then,
            "lr_resumed": lr_now,
            "lr_step": at if lr_then is not None and lr_now is not None else None,
            "resumed_passed": passed,
            "attempt_causes": cause_ids,
        },
        judged_against={"context_steps": CONTEXT_STEPS},
        summary=summary,
    )


def _lrs(attempt: Run, run: Run, step: int) -> tuple[float | None, float | None, int]:
    """The LR each of the two attempts logged last at or before ``step`` (from the resume on:
    the resumed job's own), and that step; None where one of them logged none."""
    got: list[float | None] = []
    for r in (attempt, run):
        s = r.series(LR)
        before = s.filter(pl.col("step") <= step).drop_nulls("value")
        got.append(float(before.get_column("value")[-1]) if before.height else None)
    return got[0], got[1], step


def _int(v: object) -> int:
    """A measure the restart finding stores as an integer."""
    return int(v) if isinstance(v, int | float) else 0


def _on(metric: str | None) -> str:
    return f" ({metric})" if metric else ""
