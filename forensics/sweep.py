"""`forensics sweep DIR`: every run under a folder analysed, one index page, worst run first.

A hyper-parameter sweep or a night of jobs: each job under ``DIR`` (as ``analyze --all``
finds them) is read, analysed and rendered in its own process (:mod:`concurrent.futures`,
``--jobs`` workers) or, with ``--scheduler``, on the workers of a Dask cluster
(:mod:`forensics.sweep_dask`), each report written beside the index (never inside a run).
The index has one row per run: verdict, top findings, final and best loss, the config values
that vary across the sweep, and the report's link; runs that could not be read are rows too, at
the top.

:func:`analyze_job` is a plain function of picklable arguments returning a plain row, so any
executor can run it.
"""

from __future__ import annotations

import os
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forensics.config import Config
    from forensics.findings import Finding

# Worst first: runs that could not be analysed, then by verdict.
VERDICT_ORDER = {"error": 0, "fatal": 1, "critical": 2, "warning": 3, "healthy": 4}
TOP_FINDINGS = 3


def _safe(name: str) -> str:
    import re

    return re.sub(r"[^\w.-]+", "_", name).strip("._")[:200] or "run"


def empty_row(root: str, job: str) -> dict[str, Any]:
    """A row with nothing measured yet (verdict and error still to set)."""
    return {
        "job": job,
        "name": job if job != "." else Path(root).name,
        "findings": 0,
        "worst_rank": 0,
        "top_findings": [],
        "final_loss": None,
        "best_loss": None,
        "last_step": None,
        "config": {},
        "unjudged": None,
    }


def error_row(root: str, job: str, error: str) -> dict[str, Any]:
    """The row of a run that could not be analysed."""
    return empty_row(root, job) | {"verdict": "error", "error": error, "html": None}


def analyze_job(
    root: str,
    job: str,
    sources: list[Any] | None,
    config: Config | None,
    plotlyjs: str,
    remote: bool = False,
) -> dict[str, Any]:
    """Read, analyse and render one job: its index row and its report's HTML (``html``).

    Never raises for a bad run: a run that cannot be read or analysed is a row with verdict
    ``error`` and the message. ``remote``: running on a cluster worker, which reads the run by
    the path the client found it at; a path the worker cannot see says so, with its host."""
    from forensics.errors import ForensicsError
    from forensics.importers import read_job
    from forensics.pipeline import analyze_run, no_vital_sign, read_options
    from forensics.schema import LOSS

    row = empty_row(root, job)
    if remote and not (Path(root) / job).exists():
        import socket

        return error_row(
            root,
            job,
            f"{Path(root) / job}: not found on the Dask worker on {socket.gethostname()} "
            "(workers read the runs by path: the folder must be at the same path on every worker)",
        )
    if sources is None:
        row.update(verdict="error", error="no training log found", html=None)
        return row
    try:
        run = read_job(Path(root), job, sources, options=read_options(config), only_job=False)
        why = no_vital_sign(run, str(Path(root) / job))
        if why is not None:  # (a green row would judge nothing)
            raise ForensicsError(why)
        diag = analyze_run(run, config)
        from forensics.report import render_html

        html = render_html(diag, plotlyjs=plotlyjs)
    except (ForensicsError, OSError, ValueError) as exc:
        msg = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        if remote and isinstance(exc, OSError):
            import socket

            msg += f" (on the Dask worker on {socket.gethostname()})"
        row.update(verdict="error", error=msg, html=None)
        return row
    loss = diag.ev.series(LOSS)
    from forensics.compare import _vital

    vital = _vital(diag.ev, LOSS)
    ranked = diag.ranked()
    row.update(
        verdict=diag.verdict,
        error=None,
        findings=len(diag.findings),
        worst_rank=max((f.severity.rank for f in diag.findings), default=0),
        top_findings=[
            {
                "kind": f.kind.value,
                "severity": f.severity.value,
                "step": f.start_step,
                "metric": f.metric,
                # What ended a crashed job (a sweep of failed jobs reads "crash @ 0" nine
                # times otherwise): "out of memory", "cuda" ...; null for other kinds.
                "reason": _reason(f),
            }
            for f in ranked[:TOP_FINDINGS]
        ],
        final_loss=None if vital is None else vital["final"],
        best_loss=None if vital is None or len(loss) == 0 else float(loss.values.min()),
        last_step=None if vital is None else vital["last_step"],
        config=run.config,
        html=html,
        # What the light does not cover (no training loss, a clipped grad norm ...): a
        # "healthy" row with such a note judged less than its word says.
        unjudged=diag.unjudged(),
    )
    return row


def _reason(f: Finding) -> str | None:
    """What ended a crashed job ("out of memory"); None for any other finding."""
    reason = f.measures.get("reason") if f.kind.value == "crash" else None
    return reason.replace("_", " ") if isinstance(reason, str) else None


def top_labels(top: list[dict[str, Any]]) -> list[str]:
    """Each top finding's kind with what tells it apart: a crash's reason ("crash (out of
    memory)"), and the metric of a kind the row shows more than once ("nan_inf (loss)" beside
    "nan_inf (grad_norm)", which read "nan_inf @ 1, nan_inf @ 1")."""
    kinds = [f["kind"] for f in top]
    out = []
    for f in top:
        extra = f.get("reason") or (
            f.get("metric") if kinds.count(f["kind"]) > 1 and f.get("metric") else None
        )
        out.append(f"{f['kind']} ({extra})" if extra else f["kind"])
    return out


def limited(unjudged: str | None) -> str:
    """`` (light limited: No training loss in the log)``: a sweep line's word on what the
    run's light does not cover (its first clause; the report has the whole), '' for none."""
    if not unjudged:
        return ""
    return f" (light limited: {unjudged.split(':')[0].split(' (')[0].rstrip('.')})"


def top_text(top: list[dict[str, Any]]) -> str:
    """ "crash (out of memory) @ 0, loss_spike @ 1,200": a row's top findings in a line."""
    return ", ".join(f"{k} @ {f['step']:,}" for k, f in zip(top_labels(top), top, strict=True))


def find_jobs(root: Path) -> tuple[dict[str, list[Any]], list[str]]:
    """The jobs under ``root`` and the sub-folders that hold none (runs that logged nothing
    readable: listed as errors)."""
    from forensics.errors import UnknownFormatError
    from forensics.importers import discover_jobs

    try:
        jobs = discover_jobs(root)
    except UnknownFormatError:
        jobs = {}
    empty = []
    for child in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        name = child.name
        if not any(j == name or j.startswith(name + "/") for j in jobs):
            empty.append(name)
    return jobs, empty


def _stitched(
    root: Path,
    found: dict[str, list[Any]],
    config: Config | None,
    executor: Executor | None,
    jobs: int | None,
) -> dict[str, list[Any]]:
    """Jobs that resume one another as one run each (forensics.importers.chains), the jobs
    read in parallel to judge it (each is cached, so its analysis reads it back)."""
    from forensics.importers.chains import enabled, stitch_jobs
    from forensics.pipeline import read_options

    options = read_options(config)
    if len(found) < 2 or not enabled(options):
        return found
    if executor is not None:
        return stitch_jobs(root, found, options, mapper=executor.map)
    workers = min(jobs or os.cpu_count() or 1, len(found))
    if workers <= 1:
        return stitch_jobs(root, found, options)
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        return stitch_jobs(root, found, options, mapper=pool.map)


def _sort_key(row: dict[str, Any]) -> tuple:
    final = row.get("final_loss")
    return (
        VERDICT_ORDER.get(row["verdict"], 0),
        -row.get("worst_rank", 0),
        -row.get("findings", 0),
        -(final if isinstance(final, float) else float("inf")),
        row["name"],
    )


def sweep(
    root: str | os.PathLike[str],
    out_dir: Path,
    *,
    jobs: int | None = None,
    config: Config | None = None,
    plotlyjs: str = "inline",
    executor: Executor | None = None,
    scheduler: str | None = None,
) -> list[dict[str, Any]]:
    """Analyse every job under ``root`` in parallel; write each report into ``out_dir``.

    ``scheduler``: a Dask scheduler's address; the jobs run on its workers, which read the runs
    by the same absolute paths (the folder must be mounted there at the same path).

    Returns the rows, worst first, each with ``report`` (the file name in ``out_dir``, or
    None) and ``varying`` (the config values that differ across the sweep)."""
    from forensics.atomic import write_atomic
    from forensics.compare import config_diff
    from forensics.errors import ForensicsError

    # Absolute: a cluster worker (or a pool process) may not share the caller's working directory.
    root = Path(os.path.abspath(root))
    if not root.is_dir():
        raise ForensicsError(f"{root}: sweep takes a folder of runs")
    found, empty = find_jobs(root)
    if not found and not empty:
        raise ForensicsError(f"{root}: no runs found")
    found = _stitched(root, found, config, executor, jobs)
    tasks: list[tuple[str, str, list[Any] | None, Config | None, str]] = [
        (str(root), j, s, config, plotlyjs) for j, s in sorted(found.items())
    ]
    tasks += [(str(root), e, None, config, plotlyjs) for e in empty]
    if scheduler is not None:
        from forensics.sweep_dask import analyze_on_cluster

        rows = analyze_on_cluster(scheduler, tasks)
    elif executor is not None:
        rows = list(executor.map(analyze_job, *zip(*tasks, strict=True)))
    elif (jobs or os.cpu_count() or 1) <= 1 or len(tasks) == 1:
        rows = [analyze_job(*t) for t in tasks]
    else:
        workers = min(jobs or os.cpu_count() or 1, len(tasks))
        import multiprocessing

        # spawn, not fork: a forked copy of a process whose polars / torch thread pools are
        # running can deadlock in the child.
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            rows = list(pool.map(analyze_job, *zip(*tasks, strict=True)))
    out_dir.mkdir(parents=True, exist_ok=True)
    used: set[str] = set()
    for row in rows:
        html = row.pop("html", None)
        row["report"] = None
        if html is not None:
            name = _safe(row["name"])
            while name in used:
                name += "_"
            used.add(name)
            row["report"] = f"{name}.html"
            write_atomic(out_dir / row["report"], html)
    ok = [r for r in rows if r.get("config")]  # runs whose logs carry no config are left out
    varying = config_diff([r.get("config") or {} for r in ok])
    for r in rows:
        r["varying"] = {}
    for k, vals in varying.items():
        for r, v in zip(ok, vals, strict=True):
            r["varying"][k] = v
    rows.sort(key=_sort_key)
    return rows


def render_sweep_html(root: str, rows: list[dict[str, Any]], reports: str) -> str:
    """The index page: one row per run, worst first, each linking its report."""
    from forensics.report.render import _env, _version

    keys = sorted({k for r in rows for k in r.get("varying", {})})
    return (
        _env()
        .get_template("sweep.html")
        .render(
            root=root,
            rows=rows,
            keys=keys,
            reports=reports,
            version=_version(),
            top_labels=top_labels,
        )
    )


def to_document(root: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    from forensics.compare import _plain

    return {
        "schema_version": 1,
        "root": root,
        "runs": [
            {k: _plain(v) if k != "config" else None for k, v in r.items() if k != "config"}
            | {"varying": {k: _plain(v) for k, v in r.get("varying", {}).items()}}
            for r in rows
        ],
    }


__all__ = ["analyze_job", "error_row", "find_jobs", "render_sweep_html", "sweep", "to_document"]
