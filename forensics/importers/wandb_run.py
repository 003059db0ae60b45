"""A local W&B run folder: ``wandb/run-*/`` or ``wandb/offline-run-*/``.

History comes from the binary ``run-<id>.wandb`` (read by :mod:`wandb_binary`), or from
``files/wandb-history.jsonl`` of older clients. The run's config (``RunRecord.config``,
config records, ``files/config.yaml``) is kept as run config for the report;
``wandb-summary.json`` and the run record go to metadata. Each run folder is its own job.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import polars as pl

from forensics.findings import Finding, FindingKind, Severity
from forensics.importers.base import ImportResult, ReadOptions, Source, read_text, rel
from forensics.importers.restarts import assign_segments, restart_findings
from forensics.importers.wandb_binary import read_wandb
from forensics.importers.wandb_csv import GLOBAL_STEP_KEYS, _jsonl_history
from forensics.schema import conform, empty_frame

NAME = "wandb_run"
RUN_DIR = re.compile(r"^(?:offline-)?run-\d{8}_\d{6}-[A-Za-z0-9]+$")
BINARY = re.compile(r"^run-[A-Za-z0-9_-]*\.wandb$")
_MARKERS = ("wandb-history.jsonl", "wandb-summary.json", "wandb-metadata.json")


def _run_dir(f: Path, root: Path) -> Path | None:
    """The run folder a file belongs to, or None when it is not part of one."""
    if BINARY.match(f.name):
        return f.parent
    if f.name not in _MARKERS:
        return None
    d = f.parent.parent if f.parent.name == "files" else f.parent
    return d if d == root or root in d.parents else f.parent


class WandbRunImporter:
    NAME = NAME

    def discover(self, root: Path, files: list[Path]) -> list[Source]:
        dirs: dict[Path, list[Path]] = {}
        for f in files:
            d = _run_dir(f, root)
            if d is not None:
                dirs.setdefault(d, [])
        # A marker file alone (a summary without history) does not make a run unless the
        # folder looks like a W&B run folder.
        out: list[Source] = []
        # Files under each run folder and debug logs per folder, in one pass over the files
        # (a folder of thousands of runs must not cost runs x files).
        under: dict[Path, list[Path]] = {d: [] for d in dirs}
        debug_logs: dict[Path, list[Path]] = {}
        for f in files:
            for anc in f.parents:
                if anc in under:
                    under[anc].append(f)
                if anc == root:
                    break
            if f.name.startswith("debug") and f.suffix == ".log":
                debug_logs.setdefault(f.parent, []).append(f)
        for d in sorted(dirs):
            members = list(under[d])
            binaries = sorted(f for f in members if f.parent == d and BINARY.match(f.name))
            history = [f for f in members if f.name == "wandb-history.jsonl"]
            if not binaries and not history and not RUN_DIR.match(d.name):
                continue
            main = binaries or history[:1]
            if not main:
                main = [f for f in members if f.name == "wandb-summary.json"][:1]
            # The wandb/ folder's own debug logs (symlinks to the latest run's) are not a job.
            members += debug_logs.get(d.parent, [])
            out.append(
                Source(
                    NAME,
                    main,
                    rel(d, root),
                    root,
                    scope="folder",
                    options={"also_claims": members, "run_dir": str(d)},
                )
            )
        return out

    def read(self, source: Source, options: ReadOptions) -> ImportResult:
        run_dir = Path(source.options.get("run_dir", source.files[0].parent))
        notes: list[str] = []
        findings: list[Finding] = []
        config: dict[str, Any] = {}
        metadata: dict[str, Any] = {}
        frames: list[pl.DataFrame] = []
        console: list[str] = []
        exit_code: int | None = None
        binaries = [f for f in source.files if f.suffix == ".wandb"]
        for file_idx, path in enumerate(binaries):
            name = rel(path, source.root)
            log = read_wandb(path, verify_crc=options.verify_crc)
            config.update(log.config)
            metadata.update({f"wandb_{k}": v for k, v in log.run.items()})
            if log.summary:
                metadata["wandb_summary"] = _json_safe(
                    {k: v for k, v in log.summary.items() if not k.startswith("_wandb")}
                )
            exit_code = log.exit_code if log.exit_code is not None else exit_code
            console.extend(log.console)
            if log.bad_chunks:
                notes.append(
                    f"{name}: {log.bad_chunks} corrupt chunk(s) skipped (resumed at the next 32 KiB block)"
                )
            if log.skipped_values:
                keys = ", ".join(sorted(log.skipped_values)[:5])
                notes.append(
                    f"{name}: non-numeric history values skipped (media, histograms or text): {keys}"
                )
            frame = pl.DataFrame(
                {
                    "step": log.steps,
                    "tag": log.tags,
                    "value": log.values,
                    "wall_time": log.times,
                    "record_idx": log.records,
                },
                schema={
                    "step": pl.Int64,
                    "tag": pl.Utf8,
                    "value": pl.Float64,
                    "wall_time": pl.Float64,
                    "record_idx": pl.Int64,
                },
            ).with_columns(
                pl.lit(name).alias("file"),
                pl.lit(file_idx).alias("file_idx"),
                pl.lit("wandb_binary").alias("source"),
            )
            frames.append(frame)
            if log.bytes_left:
                last = int(frame.get_column("step").max()) if frame.height else 0  # type: ignore[arg-type]
                findings.append(
                    Finding(
                        kind=FindingKind.TRUNCATED_LOG,
                        severity=Severity.INFO,
                        metric=None,
                        start_step=last,
                        measures={"file": name, "bytes_lost": log.bytes_left},
                        summary=(
                            f"{name} ends inside a record ({log.bytes_left} bytes): the job was killed or was "
                            "still running; every complete record was read."
                        ),
                    )
                )
        if not any(f.height for f in frames):
            hist = _find(run_dir, "wandb-history.jsonl")
            if hist is not None:
                name = rel(hist, source.root)
                if frames:
                    notes.append(f"the .wandb file holds no history; read {name} instead")
                frames = [
                    _jsonl_history(hist, name, notes).with_columns(
                        pl.lit(0).alias("file_idx"), pl.lit("wandb_history").alias("source")
                    )
                ]
        _read_side_files(run_dir, config, metadata, notes)
        frame = (
            pl.concat([conform(f.with_columns(pl.lit("step").alias("x_kind"))) for f in frames])
            if frames
            else empty_frame()
        )
        frame = use_global_step(frame, notes)
        frame = assign_segments(conform(frame))
        findings.extend(restart_findings(frame))
        if exit_code is not None:
            metadata["wandb_exit_code"] = exit_code
        out_log = _find(run_dir, "output.log")
        if not console and out_log is not None:
            console = [ln + "\n" for ln in read_text(out_log).splitlines()[-400:]]
        if console and exit_code != 0:
            from forensics.importers.text.crash import crash_finding

            last = int(frame.get_column("step").max()) if frame.height else 0  # type: ignore[arg-type]
            found = crash_finding(
                "".join(console[-800:])
                if any(c.endswith("\n") for c in console)
                else "\n".join(console[-400:]),
                last,
            )
            if found is not None:
                findings.append(found)
        return ImportResult(
            frame=conform(frame), notes=notes, findings=findings, config=config, metadata=metadata
        )


def use_global_step(frame: pl.DataFrame, notes: list[str]) -> pl.DataFrame:
    """Re-index rows on ``train/global_step`` when the trainer logged it (HF, Lightning):
    W&B's ``_step`` counts ``log`` calls, which differ from optimizer steps."""
    gs = frame.filter(pl.col("tag").is_in(list(GLOBAL_STEP_KEYS)))
    if gs.is_empty():
        return frame
    records = frame.select("file_idx", "record_idx").unique().height
    if gs.height < 0.5 * records:
        return frame
    key = gs.get_column("tag")[0]
    lut = gs.select("file_idx", "record_idx", pl.col("value").alias("_gs")).unique(
        ["file_idx", "record_idx"]
    )
    out = (
        frame.filter(~pl.col("tag").is_in(list(GLOBAL_STEP_KEYS)))
        .join(lut, on=["file_idx", "record_idx"], how="left")
        .sort("file_idx", "record_idx", maintain_order=True)
        .with_columns(pl.col("_gs").fill_null(strategy="forward"))
        .with_columns(
            pl.when(pl.col("_gs").is_not_null())
            .then(pl.col("_gs").cast(pl.Int64))
            .otherwise(pl.col("step"))
            .alias("step")
        )
        .drop("_gs")
    )
    notes.append(f"the x axis is {key} (the trainer's optimizer step), not W&B's _step")
    return out


def _find(run_dir: Path, name: str) -> Path | None:
    for cand in (run_dir / "files" / name, run_dir / name):
        # A link pointing outside the run folder is not followed (it is not the run's file).
        if cand.is_file() and run_dir.resolve() in cand.resolve().parents:
            return cand
    return None


def _read_side_files(
    run_dir: Path, config: dict[str, Any], metadata: dict[str, Any], notes: list[str]
) -> None:
    cfg = _find(run_dir, "config.yaml")
    if cfg is not None:
        import yaml

        try:
            data = yaml.safe_load(read_text(cfg)) or {}
        except (yaml.YAMLError, RecursionError):
            notes.append(f"{cfg.name}: not valid YAML; config not read")
            data = {}
        if isinstance(data, dict):
            for k, v in data.items():
                if k.startswith("_wandb") or k == "wandb_version":
                    continue
                config.setdefault(k, v.get("value") if isinstance(v, dict) and "value" in v else v)
    summ = _find(run_dir, "wandb-summary.json")
    if summ is not None and "wandb_summary" not in metadata:
        try:
            data = json.loads(read_text(summ))
            if isinstance(data, dict):
                metadata["wandb_summary"] = _json_safe(
                    {k: v for k, v in data.items() if k != "_wandb"}
                )
        except (ValueError, RecursionError):
            notes.append(f"{summ.name}: not valid JSON; summary not read")
    meta = _find(run_dir, "wandb-metadata.json")
    if meta is not None:
        try:
            data = json.loads(read_text(meta))
            if isinstance(data, dict):
                for k in (
                    "host",
                    "program",
                    "args",
                    "gpu",
                    "gpu_count",
                    "cuda",
                    "startedAt",
                    "python",
                    "os",
                ):
                    if k in data:
                        metadata[f"wandb_{k}"] = data[k]
        except (ValueError, RecursionError):
            pass


def _json_safe(obj: Any) -> Any:
    """Non-finite floats become None so metadata can go into JSON documents."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_json_safe(v) for v in obj]
    return obj


IMPORTER = WandbRunImporter()
