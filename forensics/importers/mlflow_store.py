"""MLflow's local tracking stores, read without mlflow installed.

File store (``mlruns/``, what ``mlflow.set_tracking_uri("file:./mlruns")`` writes)::

    mlruns/<experiment_id>/meta.yaml                  experiment name
    mlruns/<experiment_id>/<run_id>/meta.yaml         run_name, status, start/end time
    mlruns/<experiment_id>/<run_id>/metrics/<key>     lines "timestamp value step"
    mlruns/<experiment_id>/<run_id>/params/<key>      the value as text
    mlruns/<experiment_id>/<run_id>/tags/<key>        the value as text

A key with ``/`` (``train/loss``) is a sub-folder. Timestamps are milliseconds; ``nan`` and
``inf`` are written as such. Each run folder is one job, so an ``mlruns`` folder (or an
experiment folder) is a folder of jobs: ``--all`` analyzes each.

SQLite store (``mlflow.db``, ``sqlite:///mlflow.db``, MLflow's default backend since the file
store went into maintenance): tables ``runs``, ``experiments``, ``metrics`` (``key, value,
timestamp, step, is_nan, run_uuid``), ``params`` and ``tags``. NaN is stored as 0 with
``is_nan`` set and +-Inf as +-DBL_MAX; both are turned back. The database is opened read-only
and immutable: reading it never writes a journal beside it. Each run in it is one job, named
``mlflow.db/<experiment_id>/<run_id>`` like the file store's folders.

Params become ``run.config`` (numbers parsed), user tags ``run.config["tags"]``; MLflow's
own ``mlflow.*`` tags, the run name, status and experiment go to ``run.metadata``.
"""

from __future__ import annotations

import math
import sqlite3
import sys
from pathlib import Path
from typing import Any

import polars as pl

from forensics.errors import UnreadableInputError
from forensics.importers.base import ImportResult, ReadOptions, Source, read_head, rel
from forensics.importers.restarts import assign_segments, restart_findings
from forensics.schema import conform

NAME = "mlflow_store"
_SQLITE_MAGIC = b"SQLite format 3\x00"
_SQLITE_TABLES = {"runs", "metrics", "params", "tags", "experiments"}
_DBL_MAX = sys.float_info.max


# ---------------------------------------------------------------------------- helpers
def _parse_value(text: str) -> Any:
    """A param as MLflow stored it (always text): ints and floats become numbers."""
    t = text.strip()
    for cast in (int, float):
        try:
            return cast(t)
        except ValueError:
            continue
    return t


def _read_small(path: Path) -> str:
    return path.read_bytes()[: 1 << 20].decode("utf-8", errors="replace")


def _meta_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    import yaml

    try:
        data = yaml.safe_load(_read_small(path))
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _run_dir_of(f: Path) -> Path | None:
    """The run folder of a file inside ``<run>/metrics|params|tags/``, else None."""
    for parent in f.parents:
        if parent.name in ("metrics", "params", "tags"):
            run = parent.parent
            if (run / "meta.yaml").is_file() and (run / "metrics").is_dir():
                return run
            return None
    return None


def _key_values(folder: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if not folder.is_dir():
        return out
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            out[p.relative_to(folder).as_posix()] = _read_small(p)
    return out


def _config_and_meta(
    params: dict[str, str], tags: dict[str, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    config: dict[str, Any] = {k: _parse_value(v) for k, v in params.items()}
    user_tags = {k: v for k, v in tags.items() if not k.startswith("mlflow.")}
    if user_tags:
        config["tags"] = user_tags
    meta = {k: v for k, v in tags.items() if k.startswith("mlflow.") and len(v) < 2000}
    return config, meta


def _finish(frame: pl.DataFrame) -> tuple[pl.DataFrame, list]:
    """Segments from the order MLflow recorded the points in (time, then record)."""
    if frame.is_empty():
        return conform(frame), []
    # The order across files needs the 64-bit offset record_idx; the frame keeps line numbers.
    order = frame.get_column("record_idx").alias("_order")
    frame = conform(frame.with_columns(pl.col("record_idx") % (1 << 40))).with_columns(order)
    frame = assign_segments(frame, order=["wall_time", "_order"])
    return conform(frame), restart_findings(frame)


# ---------------------------------------------------------------------------- file store
def _read_metric_file(path: Path) -> pl.DataFrame:
    raw = path.read_bytes()
    if not raw.strip():
        return pl.DataFrame(schema={"t": pl.Int64, "value": pl.Float64, "step": pl.Int64})
    df = pl.read_csv(
        raw,
        separator=" ",
        has_header=False,
        infer_schema=False,
        truncate_ragged_lines=True,
        comment_prefix=None,
    )
    cols = df.columns
    # Very old clients wrote "timestamp value" without a step: step 0, as MLflow reads it.
    step = pl.col(cols[2]) if len(cols) > 2 else pl.lit("0")
    return df.select(
        pl.col(cols[0]).cast(pl.Int64, strict=False).alias("t"),
        pl.col(cols[1]).cast(pl.Float64, strict=False).alias("value"),
        step.cast(pl.Int64, strict=False).fill_null(0).alias("step"),
    )


def _read_file_store(source: Source) -> ImportResult:
    run_dir = Path(source.options["run_dir"])
    metrics_dir = run_dir / "metrics"
    frames: list[pl.DataFrame] = []
    notes: list[str] = []
    for i, f in enumerate(sorted(p for p in metrics_dir.rglob("*") if p.is_file())):
        df = _read_metric_file(f)
        bad = df.filter(pl.col("value").is_null() | pl.col("t").is_null()).height
        if bad:
            notes.append(
                f"{rel(f, source.root)}: {bad} line(s) not 'timestamp value step' were skipped"
            )
            df = df.filter(pl.col("value").is_not_null() & pl.col("t").is_not_null())
        frames.append(
            df.with_row_index("record_idx", offset=1).select(
                pl.lit(NAME).alias("source"),
                pl.lit(rel(f, source.root)).alias("file"),
                pl.lit(0, dtype=pl.Int32).alias("file_idx"),
                pl.col("record_idx").cast(pl.Int64) + i * (1 << 40),
                "step",
                pl.lit("step").alias("x_kind"),
                pl.lit(f.relative_to(metrics_dir).as_posix()).alias("tag"),
                "value",
                (pl.col("t") / 1000.0).alias("wall_time"),
            )
        )
    frame = pl.concat(frames) if frames else pl.DataFrame()
    # record_idx was offset per file to keep one order across files; give back line numbers.
    frame, findings = _finish(frame)
    frame = frame.with_columns(pl.col("record_idx") % (1 << 40))
    meta_file = _meta_yaml(run_dir / "meta.yaml")
    exp = _meta_yaml(run_dir.parent / "meta.yaml")
    config, meta = _config_and_meta(_key_values(run_dir / "params"), _key_values(run_dir / "tags"))
    metadata = {
        "run_name": meta_file.get("run_name") or meta.get("mlflow.runName"),
        "mlflow_store": "file",
        "mlflow_run_id": meta_file.get("run_id") or run_dir.name,
        "mlflow_run_name": meta_file.get("run_name") or meta.get("mlflow.runName"),
        "mlflow_experiment": exp.get("name") or run_dir.parent.name,
        "mlflow_status": _STATUS.get(meta_file.get("status") or 0, meta_file.get("status")),
        **meta,
    }
    if meta_file.get("lifecycle_stage") == "deleted":
        notes.append(f"{rel(run_dir, source.root)}: MLflow marks this run as deleted")
    return ImportResult(
        frame=frame,
        notes=notes,
        findings=findings,
        config=config,
        metadata={k: v for k, v in metadata.items() if v is not None},
    )


# RunStatus numbers of the file store's meta.yaml.
_STATUS = {1: "RUNNING", 2: "SCHEDULED", 3: "FINISHED", 4: "FAILED", 5: "KILLED"}


# ---------------------------------------------------------------------------- sqlite store
def _connect(path: Path) -> sqlite3.Connection:
    # immutable=1: no lock, no -wal/-shm file is created next to the evidence.
    uri = path.resolve().as_uri() + "?mode=ro&immutable=1"
    return sqlite3.connect(uri, uri=True)


def _sqlite_runs(path: Path) -> list[tuple[str, str, str | None]] | None:
    """(experiment_id, run_uuid, run name) of every run, or None if not an MLflow database."""
    try:
        con = _connect(path)
    except sqlite3.Error:
        return None
    try:
        tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
        if not _SQLITE_TABLES <= tables:
            return None
        rows = con.execute(
            "select cast(experiment_id as text), run_uuid, name from runs "
            "order by start_time, run_uuid"
        ).fetchall()
    except sqlite3.Error:
        return None
    finally:
        con.close()
    return [(str(e), str(r), n) for e, r, n in rows]


def _read_sqlite(source: Source) -> ImportResult:
    path = source.files[0]
    run_uuid = source.options["run_uuid"]
    try:
        con = _connect(path)
        try:
            rows = con.execute(
                "select key, value, timestamp, step, is_nan from metrics where run_uuid = ? "
                "order by rowid",
                (run_uuid,),
            ).fetchall()
            params = dict(
                con.execute("select key, value from params where run_uuid = ?", (run_uuid,))
            )
            tags = dict(con.execute("select key, value from tags where run_uuid = ?", (run_uuid,)))
            info = con.execute(
                "select r.name, r.status, r.lifecycle_stage, e.name from runs r "
                "left join experiments e on e.experiment_id = r.experiment_id "
                "where r.run_uuid = ?",
                (run_uuid,),
            ).fetchone()
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise UnreadableInputError(
            f"{path}: cannot be read as an MLflow database ({exc})"
        ) from None
    keys = [r[0] for r in rows]
    values = []
    for _, v, _, _, is_nan in rows:
        if is_nan:
            values.append(math.nan)
        elif v is not None and abs(v) >= _DBL_MAX:
            values.append(math.copysign(math.inf, v))
        else:
            values.append(v)
    name = rel(path, source.root)
    frame = pl.DataFrame(
        {
            "tag": keys,
            "value": values,
            "wall_time": [r[2] / 1000.0 if r[2] is not None else None for r in rows],
            "step": [r[3] for r in rows],
        },
        schema={"tag": pl.Utf8, "value": pl.Float64, "wall_time": pl.Float64, "step": pl.Int64},
    ).with_columns(
        pl.lit(NAME).alias("source"),
        pl.lit(name).alias("file"),
        pl.lit(0, dtype=pl.Int32).alias("file_idx"),
        pl.int_range(1, pl.len() + 1, dtype=pl.Int64).alias("record_idx"),
        pl.lit("step").alias("x_kind"),
    )
    frame, findings = _finish(frame)
    config, meta = _config_and_meta(
        {str(k): str(v) for k, v in params.items()}, {str(k): str(v) for k, v in tags.items()}
    )
    notes = []
    run_name, status, stage, exp_name = info or (None, None, None, None)
    if stage == "deleted":
        notes.append(f"{name}: MLflow marks run {run_uuid} as deleted")
    metadata = {
        "run_name": run_name,
        "mlflow_store": "sqlite",
        "mlflow_run_id": run_uuid,
        "mlflow_run_name": run_name,
        "mlflow_experiment": exp_name,
        "mlflow_status": status,
        **meta,
    }
    return ImportResult(
        frame=frame,
        notes=notes,
        findings=findings,
        config=config,
        metadata={k: v for k, v in metadata.items() if v is not None},
    )


# ---------------------------------------------------------------------------- importer
class MlflowStoreImporter:
    NAME = NAME

    def discover(self, root: Path, files: list[Path]) -> list[Source]:
        out: list[Source] = []
        runs: dict[Path, list[Path]] = {}
        for f in files:
            run = _run_dir_of(f)
            if run is not None:
                runs.setdefault(run, []).append(f)
                continue
            if read_head(f, 16, raw=True) == _SQLITE_MAGIC:
                found = _sqlite_runs(f)
                if not found:
                    continue
                db = rel(f, root)
                for exp_id, run_uuid, _ in found:
                    out.append(
                        Source(
                            NAME,
                            [f],
                            f"{db}/{exp_id}/{run_uuid}",
                            root,
                            scope="file",
                            options={"store": "sqlite", "run_uuid": run_uuid},
                        )
                    )
        for run, claimed in sorted(runs.items()):
            extra = [run / "meta.yaml", run.parent / "meta.yaml"]
            out.append(
                Source(
                    NAME,
                    sorted(p for p in claimed if "metrics" in p.relative_to(run).parts[:1]),
                    rel(run, root),
                    root,
                    options={
                        "store": "file",
                        "run_dir": run,
                        "also_claims": [
                            p for p in claimed if p.relative_to(run).parts[0] != "metrics"
                        ]
                        + extra,
                    },
                )
            )
        return out

    def read(self, source: Source, options: ReadOptions) -> ImportResult:
        if source.options.get("store") == "sqlite":
            return _read_sqlite(source)
        return _read_file_store(source)


IMPORTER = MlflowStoreImporter()
