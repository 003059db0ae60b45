"""Importers: find what a path holds, read it, and merge one job's sources into a Run.

Each format lives in its own module (or package) exposing ``IMPORTER``, an object with
``NAME``, ``discover`` and ``read`` (see :class:`forensics.importers.base.Importer`).
:data:`REGISTRY` maps each format name to its module, in claiming order: specific formats
first, generic fallbacks last, so a file is read once.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import polars as pl

from forensics.allocator import trim
from forensics.errors import MultipleJobsError, UnknownFormatError, UnreadableInputError
from forensics.findings import FindingKind
from forensics.importers import chains
from forensics.importers.base import (
    COMPRESSED,
    ImportResult,
    ReadOptions,
    Source,
    binary_junk,
    convert_x_axis,
    read_bytes,
    read_head,
    rel,
    strip_suffixes,
)
from forensics.importers.perplexity import derive_losses
from forensics.importers.tb_histograms import histogram_vitals
from forensics.run import Run
from forensics.schema import FLAGS, add_canonical, check_aliases, conform, tag_units

__all__ = [
    "REGISTRY",
    "ImportResult",
    "ReadOptions",
    "Source",
    "discover",
    "discover_jobs",
    "finish_source",
    "group_jobs",
    "merge_job",
    "read_job",
    "read_run",
    "read_source",
]

# Format name (a Source's ``importer``, a Run's ``format``) -> module under
# forensics.importers, in claiming order. Imported lazily.
REGISTRY: dict[str, str] = {
    "tfevents": "tfevents",
    "mlflow_store": "mlflow_store",
    "neptune_parquet": "neptune_parquet",
    "wandb_run": "wandb_run",
    "hf_trainer_state": "hf_trainer_state",
    "lightning_csv": "lightning_csv",
    "wandb_csv": "wandb_csv",
    "megatron_golden": "megatron_golden",
    "jsonl": "jsonl",
    "text_logs": "text",
}

_SKIP_DIRS = {"__pycache__", ".git", "node_modules", ".ipynb_checkpoints"}
MAX_FILES = 20000


def _importer(name: str) -> ModuleType:
    """The module of a format (its ``IMPORTER`` implements the Importer protocol)."""
    return importlib.import_module(f"forensics.importers.{REGISTRY[name]}")


def list_files(root: Path, notes: list[str] | None = None) -> list[Path]:
    """Every regular file under root (sorted, hidden and cache folders skipped).

    The run folder is the boundary: a link pointing outside it is not followed (the user did
    not pass that file), and a sub-folder or file that cannot be read is passed over; both
    are counted in ``notes``. Only an unreadable root is an error.
    """
    out: list[Path] = []
    base = root.resolve()
    outside: list[str] = []
    unreadable: list[str] = []

    def fail(exc: OSError) -> None:
        if exc.filename is None or Path(exc.filename) == root:
            raise UnreadableInputError(f"{root}: cannot be listed ({exc.strerror or exc})")
        unreadable.append(rel(Path(exc.filename), root))

    for dirpath, dirnames, filenames in os.walk(root, onerror=fail):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for d in dirnames:  # os.walk does not descend into linked folders; say so for outside ones
            q = Path(dirpath) / d
            if q.is_symlink() and not _within(q.resolve(), base):
                outside.append(rel(q, root))
        for f in sorted(filenames):
            if f.startswith("."):
                continue
            p = Path(dirpath) / f
            try:
                if p.is_symlink() and not _within(p.resolve(), base):
                    outside.append(rel(p, root))
                    continue
                if not p.is_file():  # pipes and sockets would block a read
                    continue
                if not os.access(p, os.R_OK):
                    unreadable.append(f"{rel(p, root)} (permission denied)")
                    continue
            except (OSError, RuntimeError) as exc:  # a link into an unreadable folder, a loop
                unreadable.append(f"{rel(p, root)} ({getattr(exc, 'strerror', None) or exc})")
                continue
            out.append(p)
            if len(out) > MAX_FILES:
                raise UnreadableInputError(
                    f"{root}: more than {MAX_FILES} files; point at one run folder"
                )
    if notes is not None:
        if outside:
            notes.append(
                f"{len(outside)} link(s) pointing outside the run folder not followed: "
                + _listing(outside)
            )
        if unreadable:
            notes.append(
                f"{len(unreadable)} unreadable path(s) passed over: {_listing(unreadable)}"
            )
    return out


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _listing(items: list[str], n: int = 10) -> str:
    """A long list shortened: the first n names, then how many more."""
    shown = ", ".join(items[:n])
    return shown + (f" ... ({len(items) - n} more)" if len(items) > n else "")


_EXPECTED = (
    "expected TensorBoard event files, W&B exports, JSONL metrics, trainer_state.json, "
    "Lightning metrics.csv or a trainer's text log"
)


def discover(path: Path) -> list[Source]:
    """All sources under path, each claimed by one importer."""
    path = Path(path)
    try:
        path.stat()
    except FileNotFoundError:
        raise UnreadableInputError(f"{path}: no such file or folder") from None
    except OSError as exc:  # a name too long, a link loop, a folder on the way not searchable
        raise UnreadableInputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    notes: list[str] = []
    if path.is_file():
        if not os.access(path, os.R_OK):
            raise UnreadableInputError(f"{path}: cannot be read (permission denied)")
        root, files = path.parent, [path]
    else:
        root, files = path, list_files(path, notes)
        if not files:
            if notes:  # every file unreadable: say so, not "empty"
                raise UnreadableInputError(f"{path}: nothing readable; {'; '.join(notes)}")
            raise UnreadableInputError(f"{path}: the folder is empty; {_EXPECTED}")
    unclaimed = list(files)
    sources: list[Source] = []
    for name in REGISTRY:
        if not unclaimed:
            break
        found = _importer(name).IMPORTER.discover(root, unclaimed)
        claimed = {f for s in found for f in s.files}
        claimed |= {f for s in found for f in s.options.get("also_claims", [])}
        unclaimed = [f for f in unclaimed if f not in claimed]
        sources.extend(found)
    if not sources:
        if path.is_file():
            if path.name.endswith(COMPRESSED):
                read_bytes(path)  # a corrupt archive: say so rather than "unknown format"
            what = (
                "binary data"
                if binary_junk(read_head(path, 8192, raw=True))
                else "no training log format recognised"
            )
            raise UnknownFormatError(f"{path}: {what}; {_EXPECTED}")
        also = f" ({'; '.join(notes)})" if notes else ""
        raise UnknownFormatError(
            f"{path}: no training log recognised in this folder ({len(files):,} files){also}; "
            f"{_EXPECTED}"
        )
    for s in sources:
        s.options.setdefault("discovery_notes", notes)
    return sources


def group_jobs(sources: list[Source]) -> dict[str, list[Source]]:
    """Group sources into training jobs.

    Folder jobs nested inside another folder job's folder belong to it (an HF output folder
    with its ``runs/<date>/`` event files), unless that folder would take in two nested jobs
    of one format: two event-file runs, two trainer states. Then they are distinct jobs and the
    caller refuses to guess. File jobs (a single log file) join the folder job around them.
    """
    folder = sorted({s.job for s in sources if s.scope == "folder"}, key=lambda j: (_depth(j), j))
    folder_set = set(folder)
    parent_of: dict[str, str] = {}
    for j in folder:
        # The closest enclosing folder job, found by walking up (linear in the number of jobs).
        if j == ".":
            continue
        for anc in [*(a.as_posix() for a in Path(j).parents if a != Path(".")), "."]:
            if anc in folder_set:
                parent_of[j] = anc
                break
    # Refuse to merge when an enclosing job would absorb two nested jobs of the same format.
    nested: dict[tuple[str, str], set[str]] = {}
    for s in sources:
        if s.scope == "folder" and s.job in parent_of:
            nested.setdefault((parent_of[s.job], s.importer), set()).add(s.job)
    ambiguous = {j for js in nested.values() if len(js) > 1 for j in js}

    def top(j: str) -> str:
        while j in parent_of and j not in ambiguous:
            j = parent_of[j]
        return j

    jobs: dict[str, list[Source]] = {}
    tops = {top(j) for j in folder}
    for s in sources:
        if s.scope == "folder":
            key = top(s.job)
        else:
            # The deepest top-level folder job around the file, walking up from its folder.
            where = Path(s.job).parent if s.job != "." else Path(".")
            chain = [where.as_posix(), *(a.as_posix() for a in where.parents)]
            if "." not in chain:
                chain.append(".")
            key = next((a for a in chain if a in tops), s.job)
        jobs.setdefault(key, []).append(s)
    return jobs


def _depth(job: str) -> int:
    return 0 if job == "." else len(Path(job).parts)


def _inside(job: str, folder: str) -> bool:
    """Is job (a relative path) inside folder (a relative path, "." for the root)?"""
    return folder == "." or job.startswith(folder.rstrip("/") + "/")


def discover_jobs(path: Path) -> dict[str, list[Source]]:
    return group_jobs(discover(Path(path)))


def read_run(path: str | os.PathLike[str], *, options: ReadOptions | None = None) -> Run:
    """Read everything one training job logged at ``path`` into a :class:`Run`.

    Jobs that resume one another are one run (:mod:`forensics.importers.chains`) unless
    ``options.stitch`` is off.

    Raises:
        MultipleJobsError: the path holds several jobs (use :func:`discover_jobs`).
        UnknownFormatError / UnreadableInputError: nothing readable there.
    """
    path = Path(path)
    jobs = _discovered(path, options)
    if len(jobs) > 1:  # one run resumed in several jobs is one run (see chains.py)
        jobs = chains.stitch_jobs(path, jobs, options)
    if len(jobs) > 1:
        raise MultipleJobsError(str(path), sorted(jobs), one_file=jobs_in_one_file(path, jobs))
    ((job, sources),) = jobs.items()
    return read_job(path, job, sources, options=options)


def jobs_in_one_file(path: Path, jobs: dict[str, list[Source]]) -> bool:
    """Do the jobs all come from one file (a W&B panel export of several runs)? No path then
    points at one of them."""
    files = {f for sources in jobs.values() for s in sources for f in s.files}
    return Path(path).is_file() or len(files) == 1


def _discovered(path: Path, options: ReadOptions | None) -> dict[str, list[Source]]:
    """:func:`discover_jobs`, read back from the cache's memo when the listing is unchanged
    (see :func:`forensics.cache.discovery_key`)."""
    from forensics import cache

    if not cache.enabled(options):
        return discover_jobs(path)
    notes: list[str] = []
    try:
        if path.is_file():
            files = [path] if os.access(path, os.R_OK) else []
        else:
            files = list_files(path, notes) if path.is_dir() else []
    except (OSError, UnreadableInputError):
        files = []
    key = cache.discovery_key(path, files) if files and not notes else None
    if key is not None:
        hit = cache.load_discovery(key[0], path)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
    jobs = discover_jobs(path)  # (its own errors for a missing, empty or unreadable path)
    if key is not None and key[1]:
        cache.store_discovery(key[0], jobs, path)
    return jobs


def read_job(
    path: Path,
    job: str,
    sources: list[Source],
    *,
    options: ReadOptions | None = None,
    only_job: bool = True,
) -> Run:
    """Read one job's sources into a Run: canonical names, x axis, one source per vital sign.

    An unchanged run (same files, sizes and modification times, same options) is read back
    from the user cache folder (:mod:`forensics.cache`) unless ``options.cache`` is off.
    """
    from forensics import cache

    options = options or ReadOptions()
    check_aliases(options.aliases)
    if chains.is_chain(sources):  # a resume chain: its member jobs read and merged
        return chains.read_chain(path, job, sources, options, only_job)
    key = cache.key(path, job, sources, options, only_job) if cache.enabled(options) else None
    if key is not None:
        hit = cache.load(key[0], Path(path))
        if hit is not None:
            return _with_checkpoints(hit, Path(path), job, only_job)
    run = _read_job(path, job, sources, options, only_job)
    trim()  # the readers' temporaries given back (forensics.allocator)
    if key is not None and key[1]:
        cache.store(key[0], run, Path(path))
    return _with_checkpoints(run, Path(path), job, only_job)


def _with_checkpoints(run: Run, path: Path, job: str, only_job: bool) -> Run:
    """The checkpoints saved beside the log, by their names (Megatron's iter_0000500,
    DeepSpeed's global_step500, Lightning's step=400.ckpt ...), when the log itself listed
    none (HF's checkpoint folders come with their trainer_state.json), in the job's own
    folder only. Looked up after the cache: a checkpoint saved since the last read is not in
    the cached run."""
    if not run.metadata.get("checkpoints"):
        from forensics.importers.checkpoint_names import checkpoint_steps, run_folder

        folder = run_folder(path, job, only_job)
        steps = checkpoint_steps(folder) if folder is not None else []
        if steps:
            run.metadata["checkpoints"] = steps
    return run


def _read_job(
    path: Path, job: str, sources: list[Source], options: ReadOptions, only_job: bool
) -> Run:
    results: list[tuple[Source, ImportResult]] = []
    x_notes: list[str] = []
    for s in sources:
        res, notes = read_source(s, options)
        x_notes.extend(notes)
        results.append((s, res))
    return merge_job(path, job, sources, results, x_notes, options, only_job)


def read_source(s: Source, options: ReadOptions) -> tuple[ImportResult, list[str]]:
    """One source read by its importer and put in canonical form (:func:`finish_source`)."""
    mod = _importer(s.importer)
    try:
        res = mod.IMPORTER.read(s, options)
    except OSError as exc:
        where = exc.filename or ", ".join(str(f) for f in s.files)
        raise UnreadableInputError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    return finish_source(s, res, options)


def finish_source(
    s: Source, res: ImportResult, options: ReadOptions
) -> tuple[ImportResult, list[str]]:
    """An importer's result in canonical form: schema, steps on the x axis, vital-sign names.
    Returns it (changed in place) and the x-axis notes for the run."""
    _one_chunk(res)
    # The result's reference dropped first: the reader's columns that conform narrows (a
    # 64-bit record index, 32-bit file and segment numbers) are freed once conform has made
    # their narrow copies, not held through add_canonical (56 MiB for a 1M-step event file).
    frame, res.frame = res.frame, res.frame.clear()
    frame = conform(frame)
    frame, notes = convert_x_axis(frame, options.batch_size)
    res.frame = derive_losses(add_canonical(frame, s.importer, options.aliases), res.notes)
    return res, notes


def _one_chunk(res: ImportResult) -> None:
    """The result's columns each made one chunk, one column at a time (the old chunks freed as
    it goes). A reader that appends blocks leaves its columns in many chunks beside one-chunk
    ones, and polars' ``select`` then copies every misaligned column at once (``conform`` and
    ``add_canonical``): about 180 MiB held twice for a 1M-step JSONL run.

    Chunks are counted on one-column frames: a constant column (``pl.lit``) is held as one
    value, but a Series of it (``iter_columns``, the frame's ``n_chunks("all")``) is made
    per row and kept by the frame (4 bytes a row for each of source, file and x_kind: about
    70 MiB for a 1M-step run, held until the view reorders the frame)."""
    frame = res.frame
    if all(frame.select(name).n_chunks("first") <= 1 for name in frame.columns):
        return
    res.frame = frame.clear()  # the result's reference dropped: each old column freed in turn
    done: list[pl.DataFrame] = []
    for name in frame.columns:
        done.append(frame.select(name).rechunk())
        frame = frame.drop(name)
        # A reader's blocks of numpy arrays (a few MiB each) live in glibc's heap, where
        # freed ones stay resident: given back before the next column is copied.
        trim()
    res.frame = pl.concat(done, how="horizontal")


def merge_job(
    path: Path,
    job: str,
    sources: list[Source],
    results: list[tuple[Source, ImportResult]],
    x_notes: list[str],
    options: ReadOptions | None = None,
    only_job: bool = True,
) -> Run:
    """One job's sources, each already read (:func:`read_source`), merged into a Run.

    ``results`` are not changed (a tail keeps them for the next merge)."""
    given = Path(path)  # run.path: the path as the user gave it
    path = given.resolve()
    # Copies: the steps below replace frames and extend notes and metadata of what they get.
    results = [
        (s, replace(r, notes=list(r.notes), findings=list(r.findings), metadata=dict(r.metadata)))
        for s, r in results
    ]
    aliases = (options or ReadOptions()).aliases
    histogram_vitals(results, aliases)  # per-layer vitals from TensorBoard histograms
    kept, dropped_notes = _choose_overlapping(results)
    # A folder whose only job is one log file directly inside it is named after the folder;
    # one of several file jobs (--all) keeps its own name and path.
    if (
        only_job
        and job != "."
        and path.is_dir()
        and Path(job).parent == Path(".")
        and all(s.scope == "file" for s in sources)
    ):
        job = "."
    if path.is_file() and job != "." and not (path.parent / job).exists():
        # One of several runs a file holds (a W&B UI CSV of two runs): the run's own name, as
        # the tool that wrote the file shows it (both were called after the file before).
        name = job
    elif path.is_file():
        # The file stem (run.name contract); an event file's name says nothing, its folder does.
        name = (
            path.parent.name
            if "tfevents" in path.name
            else Path(strip_suffixes(path.name)).stem or path.name
        )
    else:
        name = path.name if job == "." else Path(job).name
        if job != "." and all(s.scope == "file" for s in sources):
            name = Path(strip_suffixes(name)).stem or name  # a log file's stem, as for a file PATH
    run_path = given / job if job != "." and path.is_dir() else given
    if not (path / job).exists():  # a job named by its run, not a path (W&B UI CSV, several runs)
        run_path = given
    run = Run(name=name, path=run_path, format="+".join(dict.fromkeys(s.importer for s, _ in kept)))
    # conform: steps after an importer's own (histogram vitals) keep the canonical dtypes.
    frames = [conform(r.frame) for _, r in kept]
    run.frame = pl.concat(frames, how="vertical") if frames else run.frame
    discovery = dict.fromkeys(n for s in sources for n in s.options.get("discovery_notes", []))
    for note in [*discovery, *dropped_notes, *x_notes]:
        run.note(note)
    seen_restarts: set[tuple[object, object]] = set()
    # Notes, findings, config and metadata of every source read, even one whose rows all lost
    # to a richer source: its checkpoints list or truncated tail are still facts about the run.
    for _, r in results:
        for n in r.notes:
            run.note(n)
        for f in r.findings:
            if f.kind == FindingKind.RESTART:
                key = (f.measures.get("resumed_from_step"), f.measures.get("last_step_before"))
                if key in seen_restarts:
                    continue  # the same restart seen through a second format
                seen_restarts.add(key)
            run.import_findings.append(f)
        run.config.update(r.config)
        run.metadata.update(r.metadata)
    run.metadata["sources"] = {s.importer: [rel(f, s.root) for f in s.files] for s, _ in kept}
    units = tag_units(run.frame)
    if units:  # throughput / step time / memory units read from the names (mem_gb -> GB)
        run.metadata["units"] = units
    # A store that names its runs (MLflow, Neptune) names the run better than its file does.
    run.name = str(run.metadata.pop("run_name", None) or run.name)
    # Counted, not filtered: a filter of every row with a step would copy the whole frame.
    n_stepless = run.frame.get_column("step").null_count()
    if n_stepless and n_stepless == run.frame.height and _numbered_in_order(run):
        n_stepless = 0
    if n_stepless:
        stepless = run.frame.filter(pl.col("step").is_null())
        # Values logged without any step (an epoch summary line, a step too large to hold)
        # cannot be placed on the x axis: counted here, never dropped silently.
        per_file = stepless.group_by("file").len().sort("file").iter_rows()
        run.note(
            "values without a step were left out: " + ", ".join(f"{n} in {f}" for f, n in per_file)
        )
    crashed = any(f.kind == FindingKind.CRASH for f in run.import_findings)
    if run.frame.height == n_stepless and not crashed:
        # A job that crashed before its first step is still worth a report (the crash line);
        # anything else with no step has nothing to analyze.
        files = ", ".join(rel(f, s.root) for s in sources for f in s.files[:3])
        raise UnreadableInputError(
            f"{path}: no metric with a step was found in {files}; expected logged training metrics"
        )
    # Each flagged tag looked for (a comparison per row, bits): the frame's unique tags would
    # hash every row (about 4 bytes a row, the import's peak for a 1M-step event file).
    looks = [(pl.col("tag") == tag).any().alias(str(i)) for i, tag in enumerate(FLAGS)]
    found = run.frame.select(looks).row(0) if looks else ()
    for text, present in zip(FLAGS.values(), found, strict=True):
        if present:
            run.note(text)
    return run


def _numbered_in_order(run: Run) -> bool:
    """A JSONL log none of whose lines names a step (a quick script's ``{"loss": 2.31}`` per
    line): its lines numbered in the order written (x kind ``points``, said as such), rather
    than no run at all. Only when no row of the run has a step: points beside steps would put
    an unplaced series on a scale it does not share. True when the rows were numbered."""
    if run.format != "jsonl" or not run.frame.height:
        return False
    order = pl.struct("file_idx", "record_idx").rank("dense").cast(pl.Int64)
    run.frame = run.frame.with_columns(
        order.alias("step"), pl.lit("points").cast(run.frame.schema["x_kind"]).alias("x_kind")
    )
    files = ", ".join(sorted({str(f) for f in run.frame.get_column("file").unique().to_list()}))
    from forensics.importers.jsonl import STEP_KEYS

    run.note(
        f"{files}: no line names a step ({', '.join(STEP_KEYS[:4])} ...); the lines are "
        "numbered in the order written, as points"
    )
    return True


def _files(s: Source) -> str:
    names = [rel(f, s.root) for f in s.files[:1]]
    return names[0] + (
        f" (+{len(s.files) - 1} files)" if len(s.files) > 1 and s.importer == "tfevents" else ""
    )


# On equal point counts the more precise source wins: JSON keeps doubles, TensorBoard float32.
_PRECISION = {"hf_trainer_state": 3, "jsonl": 2, "lightning_csv": 2, "tfevents": 1}


def _choose_overlapping(
    results: list[tuple[Source, ImportResult]],
) -> tuple[list[tuple[Source, ImportResult]], list[str]]:
    """The same metrics in two formats (trainer_log.jsonl beside trainer_state.json, an HF
    folder's event files beside its trainer_state.json): for the vital signs both hold, keep
    the source with more points and say so. The other source still contributes the vital
    signs only it has; its unmapped tags are left out (they repeat the winner's under other
    names)."""
    notes: list[str] = []
    if len(results) < 2:
        return results, notes

    def points(r: ImportResult) -> dict[str, int]:
        f = r.frame.lazy().filter(pl.col("metric").is_not_null())  # lazy: no copy of the rows
        return dict(f.group_by("metric").len().collect().iter_rows())

    for i in range(len(results)):
        for j in range(i + 1, len(results)):
            (si, ri), (sj, rj) = results[i], results[j]
            if si.importer == sj.importer:
                continue
            pi, pj = points(ri), points(rj)
            shared = set(pi) & set(pj)
            if not ("loss" in shared or len(shared) >= 2):
                continue
            # The loss decides when both have it: counting side series (epoch) would let a
            # source win on bookkeeping rows.
            basis = ["loss"] if "loss" in shared else sorted(shared)
            ni, nj = sum(pi[m] for m in basis), sum(pj[m] for m in basis)
            rank_i, rank_j = (
                (ni, _PRECISION.get(si.importer, 0)),
                (nj, _PRECISION.get(sj.importer, 0)),
            )
            (ws, wr), (ls, lr) = (
                (results[i], results[j]) if rank_i >= rank_j else (results[j], results[i])
            )
            win_metrics = set(points(wr))
            lr.frame = lr.frame.filter(
                pl.col("metric").is_not_null() & ~pl.col("metric").is_in(list(win_metrics))
            )
            lr.findings = [f for f in lr.findings if f.kind != FindingKind.RESTART]
            kept = sorted(set(points(lr)))
            why = "more points" if ni != nj else "as many points and more precise numbers"
            # (named: "it" read as the source just named, the one used)
            also = f"; the {ls.importer} source still gives {', '.join(kept)}" if kept else ""
            notes.append(
                f"{_files(ls)} ({ls.importer}) and {_files(ws)} ({ws.importer}) hold the same "
                f"metrics ({', '.join(sorted(shared))}); {_files(ws)} has {why} and is used for "
                f"them{also}"
            )
    return [(s, r) for s, r in results if not r.frame.is_empty()], notes
