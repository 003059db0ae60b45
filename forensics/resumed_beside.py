"""A job analyzed alone that looks resumed: is the job it resumes in the folder beside it?

Pointed at one job folder (Lightning's ``version_5``), the tool reads only that job's steps:
a resume that went wrong shows only against the job before it, which is in a sibling folder.
When the job starts well after the start of training (beyond
:data:`~forensics.importers.chains.FRESH_INTERVALS` of its logging interval) and the folder
above it holds other jobs, the resume-chain rule (:mod:`forensics.importers.chains`) is run
over them; if this job is part of a chain there, the user is told which jobs and to analyze
that folder to read them as one run.

Nothing is written: the siblings are only read (through the user cache). Bounded: at most
:data:`MAX_ENTRIES` entries under the folder looked in, :data:`MAX_JOBS` jobs and
:data:`MAX_BYTES` of their files, so that pointing at one job of a folder of large runs (or
at a file in a home folder) does not walk or read them all.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forensics.importers import chains

if TYPE_CHECKING:
    from collections.abc import Callable

    from forensics.importers.base import ReadOptions, Source
    from forensics.run import Run

MAX_JOBS = 32  # jobs in the folder above, at most
MAX_BYTES = 256 << 20  # bytes of their files, at most
MAX_ENTRIES = 2000  # files and folders under the folder looked in, at most


def hint(root: Path, run: Run, options: ReadOptions) -> str | None:
    """The sentence for a run read from ``root`` (one job) that continues, or is continued by,
    jobs in the folder above it; None otherwise (a fresh start, no such jobs, a chain read
    already, stitching off, or more to read than the bounds allow)."""
    if not chains.enabled(options) or run.metadata.get("jobs") or not run.frame.height:
        return None
    if run.first_step <= chains.FRESH_INTERVALS:  # (most runs: no pass over the frame)
        return None
    span = chains.span_of(run.name, run)
    if span is None or span.first_step <= chains.FRESH_INTERVALS * span.interval:
        return None
    # Where the jobs beside it may be: for a file, the folder holding it (SLURM logs side by
    # side), then the folder above that (Lightning's version_N/metrics.csv); for a folder, the
    # folder above it.
    places = [root.parent, root.parent.parent] if root.is_file() else [root.parent]
    for parent in places:
        got = _beside(parent, root, run, span, options)
        if got is not None:
            return got
    return None


def _beside(
    parent: Path, root: Path, run: Run, span: chains.JobSpan, options: ReadOptions
) -> str | None:
    if parent == parent.parent or not _small_tree(parent):  # (never the filesystem's root)
        return None
    try:
        from forensics.importers import discover_jobs

        jobs = discover_jobs(parent)
    except Exception:  # noqa: BLE001 - a hint adds no failure: the folder above may be anything
        return None
    if not 2 <= len(jobs) <= MAX_JOBS:
        return None
    mine = [j for j, srcs in jobs.items() if _is_mine(_files(srcs), root)]
    if len(mine) != 1 or _bytes(jobs) > MAX_BYTES:
        return None
    own = replace(span, job=mine[0])

    def spans(read: Callable[..., chains.JobSpan | None], *columns: list[Any]) -> list:
        """``map(read, *columns)``, with this job's span (known) instead of a second read."""
        return [
            own if name == mine[0] else read(where, name, srcs, opts)
            for where, name, srcs, opts in zip(*columns, strict=True)
        ]

    for unit, srcs in chains.stitch_jobs(parent, jobs, options, mapper=spans).items():
        members = list(dict.fromkeys(s.options.get(chains.CHAIN_KEY) for s in srcs))
        if mine[0] not in members or len(members) < 2:
            continue
        at = members.index(mine[0])
        before, after = members[:at], members[at + 1 :]
        what = []
        if before:
            what.append(f"continues {_names(before)}")
        if after:
            what.append(f"is continued by {_names(after)}")
        return (
            f"This job {' and '.join(what)} in {parent} (a resume chain): the report reads "
            f"only its own steps ({run.first_step:,}-{run.last_step:,}); analyze {parent} "
            f"to read {unit} as one run, seams included."
        )
    return None


def _small_tree(folder: Path) -> bool:
    """At most MAX_ENTRIES files and folders under ``folder`` (a home folder or a store of
    thousands of runs is not walked whole for a hint: the count stops at the bound)."""
    n = 0
    try:
        for _, dirs, files in os.walk(folder):
            n += len(dirs) + len(files)
            if n > MAX_ENTRIES:
                return False
    except OSError:
        return False
    return True


def _is_mine(files: list[Path], root: Path) -> bool:
    """Are ``files`` the job read from ``root`` (the file itself, or every file inside the
    folder)?"""
    if not files:
        return False
    if root.is_file():
        return root.resolve() in {f.resolve() for f in files}
    return _inside(files, root)


def _files(sources: list[Source]) -> list[Path]:
    return [f for s in sources for f in s.files]


def _inside(files: list[Path], folder: Path) -> bool:
    top = folder.resolve()
    return all(top in f.resolve().parents or f.resolve() == top for f in files)


def _bytes(jobs: dict[str, list[Source]]) -> int:
    total = 0
    for srcs in jobs.values():
        for f in _files(srcs):
            try:
                total += f.stat().st_size
            except OSError:
                pass
    return total


def _names(jobs: list[str | None]) -> str:
    return ", ".join(str(j) for j in jobs)
