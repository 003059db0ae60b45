"""The stages as plain functions: read -> evidence -> detect -> diagnose -> render."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from forensics.config import Config
from forensics.importers import ReadOptions, read_job
from forensics.importers import read_run as _read_run

if TYPE_CHECKING:
    from forensics.diagnosis import Diagnosis
    from forensics.evidence import Evidence
    from forensics.run import Run


def read_options(config: Config | None = None, verify_crc: bool = False) -> ReadOptions:
    config = config or Config()
    return ReadOptions(
        verify_crc=verify_crc, aliases=dict(config.aliases), batch_size=config.batch_size
    )


def read_run(path: str | os.PathLike[str], *, options: ReadOptions | None = None) -> Run:
    """Read one job's logs into a Run (see :func:`forensics.importers.read_run`).

    ``path`` may also be an ``s3://``, ``gs://`` or other fsspec URL: its objects are fetched
    in ranges into a local mirror first (:mod:`forensics.remote`); ``run.metadata["url"]``
    keeps the URL.
    """
    from forensics.remote import is_url, local_path

    run = _read_run(local_path(path), options=options)
    if is_url(os.fspath(path)):
        run.metadata["url"] = os.fspath(path)
    return run


def analyze_run(
    run: Run, config: Config | None = None, *, evidence: Evidence | None = None
) -> Diagnosis:
    """Build the run's evidence once, detect and diagnose from it.

    The one :class:`~forensics.evidence.Evidence` (with the configured parameters) is what the
    detectors judge against and what the diagnosis keeps for the checklists and the report's
    charts, so every number drawn is the number a finding states. ``evidence``: the run's
    evidence with ``config.params`` when the caller built it (the watcher's reuses the last
    poll's series: :mod:`forensics.watch.incremental`).
    """
    from forensics.detectors import detect
    from forensics.diagnosis import diagnose
    from forensics.evidence import Evidence

    config = config or Config()
    ev = Evidence(run, config.params) if evidence is None else evidence
    findings = detect(run, ev.params, ignore=config.ignore, evidence=ev)
    return diagnose(ev, findings, checkpoint_every=config.checkpoint_every)


def analyze(
    path: str | os.PathLike[str], config: Config | None = None, *, verify_crc: bool = False
) -> Diagnosis:
    """Read the run at ``path``, run every detector, and diagnose it.

    Example:
        >>> import forensics
        >>> diag = forensics.analyze("sample_runs/bad_batch")  # doctest: +SKIP
        >>> diag.verdict, [f.kind for f in diag.findings]       # doctest: +SKIP
    """
    run = read_run(path, options=read_options(config, verify_crc))
    return analyze_run(run, config)


def blind_tags(run: Run) -> list[str]:
    """The series of a run that has some but none that maps to a vital sign (a green light on
    it would judge nothing); empty otherwise, as for a log with no series at all (a job that
    crashed before its first step). The cached vital signs are read first: the frame is
    scanned for unmapped tags only when there is none (watch asks on every poll)."""
    return [] if run.metrics() else run.unmapped_tags()


def no_vital_sign(run: Run, shown: str) -> str | None:
    """Why a run with series but no vital sign cannot be judged (None when it can be or has
    no series). ``shown``: the path the suggested command reads."""
    tags = blind_tags(run)
    if not tags:
        return None
    return (
        f"no vital sign recognised among its {len(tags):,} series ({listed(tags)}), so no "
        f"check can run; `forensics metrics {shown}` lists them with the nearest vital sign; "
        "map one with --alias RAW=CANONICAL"
    )


def require_vital_sign(run: Run, shown: str, where: str | None = None) -> None:
    """Raise :class:`~forensics.errors.ForensicsError` (``where: why``, ``where`` defaulting
    to ``shown``) for a run :func:`no_vital_sign` cannot judge."""
    why = no_vital_sign(run, shown)
    if why is not None:
        from forensics.errors import ForensicsError

        raise ForensicsError(f"{shown if where is None else where}: {why}")


def listed(names: list[str], most: int = 6) -> str:
    """``a, b, c`` or ``a, b, c and 4 more``: names for a one-line message."""
    extra = f" and {len(names) - most:,} more" if len(names) > most else ""
    return ", ".join(names[:most]) + extra


__all__ = [
    "analyze",
    "analyze_run",
    "blind_tags",
    "no_vital_sign",
    "read_job",
    "read_options",
    "read_run",
    "require_vital_sign",
]
