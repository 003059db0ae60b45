"""Importers: find what a path holds, read it, and merge one job's sources into a Run.

Each format lives in its own module exposing an object with ``NAME``, ``discover`` and
``read`` (see :class:`forensics.importers.base.Importer`). :data:`REGISTRY` lists them in
claiming order: specific formats first, generic fallbacks last, so a file is read once.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import polars as pl

from forensics.errors import MultipleJobsError, UnknownFormatError, UnreadableInputError
from forensics.importers.base import ImportResult, ReadOptions, Source
from forensics.run import Run
from forensics.schema import add_canonical, conform

# Module names under forensics.importers, in claiming order. Imported lazily.
REGISTRY: list[str] = [
    "tfevents",
    "wandb_run",
    "hf_trainer_state",
    "lightning_csv",
    "wandb_csv",
    "jsonl",
    "text_logs",
]

_SKIP_DIRS = {"__pycache__", ".git", "node_modules", ".ipynb_checkpoints"}
MAX_FILES = 20000


def _importer(name: str):  # noqa: ANN202 - returns a module implementing Importer
    try:
        return importlib.import_module(f"forensics.importers.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"forensics.importers.{name}":
            return None  # not written yet
        raise


def list_files(root: Path) -> list[Path]:
    """Every regular file under root (sorted, hidden and cache folders skipped)."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for f in sorted(filenames):
            if f.startswith("."):
                continue
            out.append(Path(dirpath) / f)
            if len(out) > MAX_FILES:
                raise UnreadableInputError(f"{root}: more than {MAX_FILES} files; point at one run folder")
    return out


def discover(path: Path) -> list[Source]:
    """All sources under path, each claimed by one importer."""
    path = Path(path)
    if not path.exists():
        raise UnreadableInputError(f"{path}: no such file or folder")
    if path.is_file():
        root, files = path.parent, [path]
    else:
        root, files = path, list_files(path)
        if not files:
            raise UnreadableInputError(f"{path}: the folder is empty; expected training logs")
    unclaimed = list(files)
    sources: list[Source] = []
    for name in REGISTRY:
        mod = _importer(name)
        if mod is None or not unclaimed:
            continue
        found = mod.IMPORTER.discover(root, unclaimed)
        claimed = {f for s in found for f in s.files}
        claimed |= {f for s in found for f in s.options.get("also_claims", [])}
        unclaimed = [f for f in unclaimed if f not in claimed]
        sources.extend(found)
    if not sources:
        what = "file" if path.is_file() else "folder"
        raise UnknownFormatError(
            f"{path}: no training log recognised in this {what} (expected TensorBoard event files, "
            "W&B exports, JSONL metrics, trainer_state.json, Lightning metrics.csv or a trainer's text log)"
        )
    return sources


def group_jobs(sources: list[Source]) -> dict[str, list[Source]]:
    """Group sources by job; file-scoped jobs inside a folder job's folder join it."""
    jobs: dict[str, list[Source]] = {}
    folder_jobs = sorted({s.job for s in sources if s.scope == "folder"}, key=len, reverse=True)
    for s in sources:
        key = s.job
        if s.scope == "file":
            parent = str(Path(s.job).parent.as_posix()) if s.job != "." else "."
            for fj in folder_jobs:
                if fj == "." or parent == fj or parent.startswith(fj + "/"):
                    key = fj
                    break
        jobs.setdefault(key, []).append(s)
    return jobs


def discover_jobs(path: Path) -> dict[str, list[Source]]:
    return group_jobs(discover(Path(path)))


def read_run(path: str | os.PathLike[str], *, options: ReadOptions | None = None) -> Run:
    """Read everything one training job logged at ``path`` into a :class:`Run`.

    Raises:
        MultipleJobsError: the path holds several jobs (use :func:`discover_jobs`).
        UnknownFormatError / UnreadableInputError: nothing readable there.
    """
    path = Path(path)
    jobs = discover_jobs(path)
    if len(jobs) > 1:
        raise MultipleJobsError(str(path), sorted(jobs))
    (job, sources), = jobs.items()
    return read_job(path, job, sources, options=options)


def read_job(path: Path, job: str, sources: list[Source], *, options: ReadOptions | None = None) -> Run:
    options = options or ReadOptions()
    path = Path(path).resolve()
    results: list[tuple[Source, ImportResult]] = []
    for s in sources:
        mod = _importer(s.importer)
        res = mod.IMPORTER.read(s, options)
        frame = conform(res.frame)
        frame = add_canonical(frame, s.importer, options.aliases)
        res.frame = frame
        results.append((s, res))

    results, dropped_notes = _choose_overlapping(results)
    base = path if path.is_dir() else path.parent
    name = path.name if job == "." or path.is_file() else Path(job).name
    if path.is_file():
        name = path.name.split(".")[0] if path.name.split(".")[0] else path.stem
    run = Run(name=name, path=(base / job).resolve() if job != "." and path.is_dir() else path,
              format="+".join(dict.fromkeys(s.importer for s, _ in results)))
    frames = [r.frame for _, r in results]
    run.frame = pl.concat(frames, how="vertical") if frames else run.frame
    for note in dropped_notes:
        run.note(note)
    for _, r in results:
        for n in r.notes:
            run.note(n)
        run.import_findings.extend(r.findings)
        run.config.update(r.config)
        run.metadata.update(r.metadata)
    if run.frame.filter(pl.col("step").is_not_null()).is_empty():
        raise UnreadableInputError(f"{path}: the log holds no metric with a step; nothing to analyze")
    return run


def _choose_overlapping(results: list[tuple[Source, ImportResult]]) -> tuple[list[tuple[Source, ImportResult]], list[str]]:
    """The same metrics in two formats (trainer_log.jsonl beside trainer_state.json): keep the
    source with more points for the metrics they share, and say so."""
    notes: list[str] = []
    if len(results) < 2:
        return results, notes

    def points(r: ImportResult) -> dict[str, int]:
        f = r.frame.filter(pl.col("metric").is_not_null())
        return dict(f.group_by("metric").len().iter_rows())

    pts = [points(r) for _, r in results]
    keep = [True] * len(results)
    for i in range(len(results)):
        for j in range(len(results)):
            if i == j or not keep[i] or not keep[j]:
                continue
            shared = set(pts[i]) & set(pts[j])
            if "loss" in shared or len(shared) >= 2:
                ni, nj = sum(pts[i][m] for m in shared), sum(pts[j][m] for m in shared)
                loser = j if (ni, -i) > (nj, -j) else i
                winner = i if loser == j else j
                keep[loser] = False
                ls, ws = results[loser][0], results[winner][0]
                notes.append(
                    f"{', '.join(p.name for p in ls.files)} ({ls.importer}) holds the same metrics as "
                    f"{', '.join(p.name for p in ws.files)} ({ws.importer}) with fewer points; it was not used"
                )
    return [r for r, k in zip(results, keep) if k], notes
