"""Resume chains: several jobs of one folder read as one run when one continues another.

A run that outlives one job (a SLURM time limit, a preemption, Lightning's ``version_N``
folders, W&B resumed runs) leaves one job per attempt. The tool reads them as one run with
a restart (a new ``segment``) at each seam, so what happens across the seam is visible.

The rule (:func:`continues`: may ``job`` follow the chain built so far, whose last job is
``last``?):

- Same metric names: at least half of the smaller job's tags are shared, and when either
  job logs a training loss both log it under the same tag.
- Not a fresh start: the job's first step lies beyond 1.5 of its logging intervals (a job
  that starts at its first logging point began from scratch: two seeds side by side, or an
  unrelated run with the same names, are never chained).
- Its first step lies after the chain's first step and after the last job's first step
  (the job cannot begin before what it resumes; starting exactly where the last job
  started is allowed only when the wall clocks show it began after that job ended).
- Where it starts against the chain's last step ``L`` (``i``: the larger logging interval):
  at or before ``L`` is an *overlap* (the resume re-does the steps since its checkpoint:
  the later values win, as in a restart inside one job); from ``L`` to ``L + 2i`` an
  *exact continuation*; further on a *gap*, chained only when the loss continues across
  it (the job's first losses lie within the band the previous job's last losses, extended
  along their trend, allow: 4 robust deviations or 2% of their level, the trend's fall over
  the gap capped at the previous job's whole fall), since no step evidence ties the two.
- Wall clocks, when both jobs log absolute ones, must agree: the job starts after the
  previous one ended (2 minutes of clock skew allowed); jobs that ran at the same time
  are not a chain.

Jobs are taken in order of their first wall time when every job logs one, else of their
first step. A job that could continue two chains (two seeds resumed side by side) joins
neither: the tool does not guess. ``ReadOptions(stitch=False)`` (``--no-stitch``, or
``FORENSICS_NO_STITCH=1``) keeps every job apart.

A stitched unit is a job of :func:`stitch_jobs`'s result whose sources carry
``options["chain_job"]`` (the member job each came from); :func:`read_chain` reads each
member as its own job (so each keeps its cache entry) and merges them. A job kept apart that
looks resumed (it does not start from scratch) goes the same way alone, to carry the note
saying why it was not stitched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from forensics.findings import Finding
from forensics.importers.restarts import duration_text
from forensics.schema import SCHEMA

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from forensics.importers.base import ReadOptions, Source
    from forensics.run import Run

CHAIN_KEY = "chain_job"  # Source.options key: the member job a stitched source belongs to
FRESH_INTERVALS = 1.5  # a first step within this many logging intervals is a fresh start
CONTINUE_INTERVALS = 2.0  # a first step within this many intervals after the last: a continuation
MIN_SHARED = 0.5  # share of the smaller job's tags both jobs log
CLOCK_SKEW_S = 120.0  # clocks of two nodes may disagree by this much
ABSOLUTE_CLOCK = 1e9  # wall times below this are seconds since the job started, not dates
EDGE_POINTS = 20  # loss points at each end of a job that describe its level
GAP_BAND_FLOOR = 0.02  # the gap rule's band is at least 2% of the loss level
GAP_BAND_MADS = 4.0  # ... and at least 4 robust deviations of the last losses


def enabled(options: ReadOptions | None) -> bool:
    if os.environ.get("FORENSICS_NO_STITCH", "").strip() not in ("", "0"):
        return False
    return options is None or getattr(options, "stitch", True)


@dataclass(frozen=True)
class JobSpan:
    """What the chain rule needs of one job (small: a sweep computes it for every job)."""

    job: str
    first_step: int
    last_step: int
    tags: frozenset[str]
    loss_tag: str | None
    interval: float  # median step between logged points of the densest series (loss first)
    first_wall: float | None  # absolute unix seconds, None without them
    last_wall: float | None
    head_loss: float | None  # median of the first losses
    tail_loss: float | None  # median of the last losses
    tail_mad: float  # their robust spread
    tail_slope: float  # loss per step over the last losses (least squares), <= 0 kept


def job_span(
    root: str | os.PathLike[str], job: str, sources: list[Source], options: ReadOptions
) -> JobSpan | None:
    """Read one job (through the cache) and describe it; None when it cannot be read (its own
    read reports the error later)."""
    from forensics.importers import read_job

    try:
        run = read_job(Path(root), job, sources, options=options, only_job=False)
    except Exception:  # noqa: BLE001 - stitching adds no failure: the job's own read reports it
        return None
    return span_of(job, run)


def span_of(job: str, run: Run) -> JobSpan | None:
    from forensics.schema import LOSS

    f = run.frame
    if f.get_column("step").null_count():  # filtered only then: a filter copies every row
        f = f.filter(pl.col("step").is_not_null())
    if f.is_empty():
        return None
    steps = f.get_column("step")
    tags = frozenset(f.get_column("tag").unique().to_list())
    loss = run.series(LOSS) if run.has(LOSS) else None
    loss_tag = run.metrics().get(LOSS) if loss is not None else None
    if loss is not None and loss.height >= 2:
        dense = loss.get_column("step").to_numpy()
    else:
        counts = f.group_by("tag").len().sort(["len", "tag"], descending=[True, False])
        top = counts.get_column("tag")[0]
        dense = np.unique(f.filter(pl.col("tag") == top).get_column("step").to_numpy())
    diffs = np.diff(dense.astype(np.float64))
    diffs = diffs[diffs > 0]
    interval = float(np.median(diffs)) if len(diffs) else 1.0
    walls = f.get_column("wall_time").drop_nulls().to_numpy()
    walls = walls[np.isfinite(walls)]
    absolute = len(walls) > 0 and float(walls.min()) >= ABSOLUTE_CLOCK
    head = tail = None
    mad = slope = 0.0
    if loss is not None and loss.height:
        v = loss.get_column("value").to_numpy().astype(np.float64)
        s = loss.get_column("step").to_numpy().astype(np.float64)
        ok = np.isfinite(v)
        v, s = v[ok], s[ok]
        if len(v):
            head = float(np.median(v[:EDGE_POINTS]))
            tv, ts = v[-EDGE_POINTS:], s[-EDGE_POINTS:]
            tail = float(np.median(tv))
            mad = float(np.median(np.abs(tv - tail))) * 1.4826
            if len(tv) >= 3 and float(np.ptp(ts)) > 0:
                slope = min(0.0, float(np.polyfit(ts, tv, 1)[0]))
    return JobSpan(
        job=job,
        first_step=int(steps.min()),  # type: ignore[arg-type]
        last_step=int(steps.max()),  # type: ignore[arg-type]
        tags=tags,
        loss_tag=loss_tag,
        interval=max(interval, 1.0),
        first_wall=float(walls.min()) if absolute else None,
        last_wall=float(walls.max()) if absolute else None,
        head_loss=head,
        tail_loss=tail,
        tail_mad=mad,
        tail_slope=slope,
    )


@dataclass(frozen=True)
class Seam:
    """How ``job`` continues the chain before it, as the rule judged it."""

    kind: str  # "overlap", "continuation" or "gap"
    why: str  # the evidence, in words


def continues(first: JobSpan, last: JobSpan, chain_last_step: int, job: JobSpan) -> Seam | str:
    """The seam when ``job`` continues the chain whose first job is ``first``, last job
    ``last`` and last logged step ``chain_last_step``; else why not (a sentence)."""
    shared = last.tags & job.tags
    if len(shared) < MIN_SHARED * min(len(last.tags), len(job.tags)):
        return f"it shares {len(shared)} of its {len(job.tags)} metric names with {last.job}"
    if (last.loss_tag or job.loss_tag) and last.loss_tag != job.loss_tag:
        return f"its training loss ({job.loss_tag}) is not {last.job}'s ({last.loss_tag})"
    if job.first_step <= FRESH_INTERVALS * job.interval:
        return f"it starts from scratch (step {job.first_step:,})"
    clocks = last.last_wall is not None and job.first_wall is not None
    if clocks and job.first_wall < last.last_wall - CLOCK_SKEW_S:  # type: ignore[operator]
        return f"it was running before {last.job} ended (wall clock)"
    if job.first_step <= first.first_step:
        return f"it starts at step {job.first_step:,}, before {first.job}'s first logged step"
    if job.first_step <= last.first_step and not clocks:
        return (
            f"it starts at step {job.first_step:,}, where {last.job} starts too, and no wall "
            "clock says which came first"
        )
    step = max(last.interval, job.interval)
    if job.first_step <= chain_last_step:
        return Seam(
            "overlap",
            f"it re-does steps {job.first_step:,}-{chain_last_step:,} that {last.job} had "
            "logged (a resume from an earlier checkpoint)",
        )
    if job.first_step <= chain_last_step + CONTINUE_INTERVALS * step:
        return Seam(
            "continuation",
            f"its first step {job.first_step:,} follows {last.job}'s last step "
            f"{chain_last_step:,} within {CONTINUE_INTERVALS:g} logging intervals",
        )
    return _gap(last, chain_last_step, job)


def _gap(last: JobSpan, chain_last_step: int, job: JobSpan) -> Seam | str:
    """A job that starts well after the chain's last step: a chain only when the loss goes
    on where the previous job's trend leads."""
    missing = f"steps {chain_last_step + 1:,}-{job.first_step - 1:,} are in neither log"
    if last.tail_loss is None or job.head_loss is None:
        return f"{missing} and no training loss shows that it continues {last.job}"
    level = last.tail_loss
    band = max(GAP_BAND_MADS * last.tail_mad, GAP_BAND_FLOOR * abs(level))
    predicted = level + last.tail_slope * (job.first_step - chain_last_step)
    # The trend carried over a long gap cannot fall further than the job's whole fall.
    fall = max(0.0, (last.head_loss or level) - level)
    lo, hi = max(min(predicted, level), level - fall) - band, level + band
    if lo <= job.head_loss <= hi:
        return Seam(
            "gap",
            f"{missing}, but its first losses ({job.head_loss:.4g}) lie where "
            f"{last.job}'s last ones ({level:.4g}) lead ({lo:.4g} to {hi:.4g})",
        )
    return (
        f"{missing} and its first losses ({job.head_loss:.4g}) lie outside where "
        f"{last.job}'s last ones ({level:.4g}) lead ({lo:.4g} to {hi:.4g})"
    )


@dataclass
class _Chain:
    links: list[tuple[JobSpan, Seam | None]]  # each job with the seam it was joined by
    last_step: int


Chain = list[tuple[JobSpan, Seam | None]]


def find_chains(spans: Iterable[JobSpan]) -> tuple[list[Chain], dict[str, str]]:
    """Group job spans into chains, each in order with the seam that joined each job (None for
    the first); single jobs are chains of one. Also a note for each job that looks resumed
    but was kept apart, saying why."""
    items = list(spans)
    if items and all(s.first_wall is not None for s in items):
        items.sort(key=lambda s: (s.first_wall, s.first_step, s.job))
    else:
        items.sort(key=lambda s: (s.first_step, s.job))
    chains: list[_Chain] = []
    notes: dict[str, str] = {}
    for job in items:
        fits: list[tuple[_Chain, Seam]] = []
        why_not: list[str] = []
        for ch in chains:
            got = continues(ch.links[0][0], ch.links[-1][0], ch.last_step, job)
            if isinstance(got, Seam):
                fits.append((ch, got))
            else:
                why_not.append(f"{ch.links[-1][0].job}: {got}")
        if len(fits) == 1:
            ch, seam = fits[0]
            ch.links.append((job, seam))
            ch.last_step = max(ch.last_step, job.last_step)
            continue
        chains.append(_Chain([(job, None)], job.last_step))
        if len(fits) > 1:
            names = ", ".join(c.links[-1][0].job for c, _ in fits)
            notes[job.job] = (
                f"{job.job} (from step {job.first_step:,}) could continue {names}: not "
                "stitched to any (the log cannot say which it resumed)"
            )
        elif job.first_step > FRESH_INTERVALS * job.interval and why_not:
            notes[job.job] = (
                f"{job.job} starts at step {job.first_step:,} (a resume?) but continues no "
                "other job here: " + "; ".join(why_not[:3])
            )
    return [ch.links for ch in chains], notes


def short_names(jobs: list[str]) -> tuple[str, list[str]]:
    """The folder the jobs share and each job's own part: ``lightning_logs``, ``[version_0,
    version_5]``; ``job_0/metrics.jsonl`` and ``job_1/metrics.jsonl`` are ``job_0``, ``job_1``."""
    parts = [Path(j).parts or (j,) for j in jobs]  # "." (the folder itself) has no parts
    lead = 0
    while all(len(p) > lead + 1 for p in parts) and len({p[lead] for p in parts}) == 1:
        lead += 1
    trail = 0
    while (
        all(len(p) > lead + trail + 1 for p in parts) and len({p[-1 - trail] for p in parts}) == 1
    ):
        trail += 1
    names = ["/".join(p[lead : len(p) - trail]) for p in parts]
    return "/".join(parts[0][:lead]), names


def chain_name(jobs: list[str]) -> str:
    """The unit's name: the shared folder, then the jobs' own parts joined by '+'."""
    folder, names = short_names(jobs)
    if len(names) > 4:
        names = [names[0], f"{len(names) - 2} more", names[-1]]
    return f"{folder}/{'+'.join(names)}" if folder else "+".join(names)


def stitch_jobs(
    root: str | os.PathLike[str],
    jobs: dict[str, list[Source]],
    options: ReadOptions | None = None,
    *,
    mapper: Callable[..., Iterable[JobSpan | None]] | None = None,
) -> dict[str, list[Source]]:
    """The jobs with each resume chain merged into one unit (see the module's rule).

    ``mapper`` (``executor.map``) computes the jobs' spans in parallel (a sweep). Each job is
    read once here and cached, so reading the unit later costs a cache load."""
    from forensics.importers.base import ReadOptions

    options = options or ReadOptions()
    if len(jobs) < 2 or not enabled(options):
        return jobs
    names = sorted(jobs)
    n = len(names)
    spans = list(
        (mapper or map)(job_span, [str(root)] * n, names, [jobs[j] for j in names], [options] * n)
    )
    chains, notes = find_chains(s for s in spans if s is not None)
    out: dict[str, list[Source]] = {}
    for n_, s in zip(names, spans, strict=True):
        if s is None:  # unreadable: kept as its own job, whose read says what is wrong
            out[n_] = jobs[n_]
    for links in chains:
        members = [span.job for span, _ in links]
        if len(links) == 1 and members[0] not in notes:
            out[members[0]] = jobs[members[0]]
            continue
        # A chain, or a job kept apart with a note saying why: read through read_chain.
        out[chain_name(members) if len(members) > 1 else members[0]] = [
            replace(
                src,
                options={
                    **src.options,
                    CHAIN_KEY: span.job,
                    "chain_seam": None if seam is None else (seam.kind, seam.why),
                    "chain_notes": [notes[j] for j in members if j in notes],
                },
            )
            for span, seam in links
            for src in jobs[span.job]
        ]
    return dict(sorted(out.items()))


def is_chain(sources: list[Source]) -> bool:
    return bool(sources) and CHAIN_KEY in sources[0].options


_CHAIN_OPTIONS = (CHAIN_KEY, "chain_seam", "chain_notes")


def _plain(src: Source) -> Source:
    """The source as discovery gave it (the member's own cache key)."""
    return replace(src, options={k: v for k, v in src.options.items() if k not in _CHAIN_OPTIONS})


def read_chain(
    path: Path, unit: str, sources: list[Source], options: ReadOptions, only_job: bool
) -> Run:
    """Read every member job of a stitched unit and merge them into one Run."""
    from forensics.importers import read_job

    members: dict[str, list[Source]] = {}
    seams: dict[str, tuple[str, str]] = {}
    notes: list[str] = []
    for src in sources:
        j = src.options[CHAIN_KEY]
        members.setdefault(j, []).append(_plain(src))
        if src.options.get("chain_seam"):
            seams[j] = src.options["chain_seam"]
        notes = src.options.get("chain_notes", notes)
    if len(members) == 1:  # a job kept apart, with the note saying why
        ((j, plain),) = members.items()
        run = read_job(path, j, plain, options=options, only_job=only_job)
        for n in notes:
            run.note(n)
        return run
    runs = [(j, read_job(path, j, s, options=options, only_job=False)) for j, s in members.items()]
    run = merge_runs(runs, seams)
    given = Path(path)
    if only_job:  # the chain is all the folder holds: named after it, like one job
        run.name, run.path = given.resolve().name, given
    else:
        common = os.path.commonpath(list(members)) if "." not in members else ""
        folder = short_names(list(members))[0]
        run.name = chain_name(list(members))[len(folder) + 1 if folder else 0 :]
        run.path = given / common if common else given
    for n in notes:
        run.note(n)
    return run


def merge_runs(runs: list[tuple[str, Run]], seams: dict[str, tuple[str, str]]) -> Run:
    """One Run from member runs in chain order: segments numbered on across the seams,
    a restart finding naming the jobs at each seam, ``metadata["jobs"]`` listing them."""
    from forensics.importers.restarts import restart_findings
    from forensics.run import Run

    frames: list[pl.DataFrame] = []
    seg_base = 0
    file_base = 0
    seam_segment: dict[int, tuple[str, str]] = {}
    shifted: list[list[Finding]] = []
    jobs_meta: list[dict[str, Any]] = []
    for i, (job, r) in enumerate(runs):
        f = r.frame
        top = int(f.get_column("segment").fill_null(0).max() or 0) if f.height else 0  # type: ignore[arg-type]
        nfiles = int(f.get_column("file_idx").fill_null(0).max() or 0) + 1 if f.height else 0  # type: ignore[arg-type]
        frames.append(
            f.with_columns(
                (pl.col("segment") + seg_base).cast(SCHEMA["segment"]),
                (pl.col("file_idx") + file_base).cast(SCHEMA["file_idx"]),
            )
        )
        if i:
            seam_segment[seg_base] = (runs[i - 1][0], job)
        shifted.append([_offset_segment(g, seg_base) for g in r.import_findings])
        jobs_meta.append({"job": job, "first_step": r.first_step, "last_step": r.last_step})
        seg_base += top + 1
        file_base += nfiles
    first = runs[0][1]
    run = Run(
        name=first.name, path=first.path, format="+".join(dict.fromkeys(r.format for _, r in runs))
    )
    run.frame = pl.concat(frames, how="vertical")
    short = dict(
        zip([m["job"] for m in jobs_meta], short_names([j for j, _ in runs])[1], strict=True)
    )
    spans = ", ".join(
        f"{short[m['job']]} (steps {m['first_step']:,}-{m['last_step']:,})" for m in jobs_meta
    )
    run.note(
        f"{len(runs)} jobs read as one run, each resuming the one before: {spans}; "
        "--no-stitch reads them apart"
    )
    for job, r in runs:
        for n in r.notes:
            run.note(f"{short[job]}: {n}")
    restarts = {g.measures.get("segment"): g for g in restart_findings(run.frame) if g.measures}
    for found in shifted:
        run.import_findings.extend(found)
    for seg, (prev, job) in seam_segment.items():
        g = restarts.get(seg)
        if g is not None:
            kind, why = seams.get(job, ("continuation", ""))
            run.import_findings.append(_seam_finding(g, prev, job, kind, why))
    run.import_findings.sort(key=lambda g: g.start_step)
    # Config: the last job's values win; what changed at a seam is said.
    for i, (job, r) in enumerate(runs):
        if i:
            changed = [
                f"{k} {run.config[k]!r} -> {v!r}"
                for k, v in r.config.items()
                if k in run.config and run.config[k] != v
            ]
            if changed:
                run.note(
                    f"the config changed when {short[job]} resumed (from step "
                    f"{r.first_step:,}): " + ", ".join(changed[:8])
                )
        run.config.update(r.config)
        meta = dict(r.metadata)
        sources = meta.pop("sources", {})
        units = meta.pop("units", {})
        run.metadata.update(meta)
        for fmt, files in sources.items():
            run.metadata.setdefault("sources", {}).setdefault(fmt, []).extend(files)
        if units:
            run.metadata.setdefault("units", {}).update(units)
    # The stitched jobs in chain order (their steps are in the note above).
    run.metadata["jobs"] = [m["job"] for m in jobs_meta]
    return run


def _offset_segment(g: Finding, base: int) -> Finding:
    if not base or g.measures.get("segment") is None:
        return g
    measures = dict(g.measures)
    measures["segment"] = int(measures["segment"]) + base  # type: ignore[arg-type]
    return replace(g, measures=measures)


def _seam_finding(g: Finding, prev: str, job: str, kind: str, why: str) -> Finding:
    """The restart at a seam, with the jobs named."""
    m = dict(g.measures)
    a, b = short_names([prev, job])[1]
    m.update(previous_job=prev, job=job, seam=kind)
    resumed, last = int(m["resumed_from_step"]), int(m["last_step_before"])  # type: ignore[arg-type]
    text = (
        f"Resumed from job {a} at step {resumed:,} in job {b} ({a} had logged up to step {last:,}"
    )
    gap = m.get("wall_clock_gap_s")
    if isinstance(gap, (int, float)) and gap >= 0:
        text += f"; {b} wrote its first record {duration_text(gap)} after {a}'s last"
    text += "): "
    if kind == "overlap":
        text += (
            f"{b} re-did steps {resumed:,}-{last:,}; the {m['points_replayed']:,} earlier points "
            "there give way to the later ones."
        )
    elif kind == "gap":
        text += f"{why}."
    else:
        text += "the steps continue where they stopped."
    # A seam with nothing logged twice is one step, not a range running backwards.
    return replace(g, measures=m, summary=text, end_step=last if last >= resumed else None)
