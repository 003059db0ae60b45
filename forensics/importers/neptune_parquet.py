"""Neptune exporter Parquet (``neptune-exporter export``): runs moved off Neptune to disk.

The exporter writes one folder per project and each run in parts::

    <data-path>/<sanitized project>/<run_id>_part_<n>.parquet     (Snappy, ~50 MB a part)

with one long table: ``project_id, run_id, attribute_path, attribute_type, step``
(decimal(18, 6)), ``timestamp`` (ms, UTC) and one typed payload column per kind
(``int_value, float_value, string_value, bool_value, datetime_value, string_set_value,
file_value, histogram_value``). A part still named ``.parquet.tmp`` was being written when
the export stopped: its rows are read when the file is whole, and the run notes say so.

Each run (all its parts) is one job; a project folder holding several runs is a folder of
jobs. ``float_series`` attributes are the metrics (``tag`` is the attribute path, e.g.
``train/loss``); the single-value attributes (``float``, ``int``, ``string``, ``bool``,
``datetime``, ``string_set``) are the config, nested at ``/``; ``sys/*`` attributes
(name, tags, creation time) go to the metadata. String series, histograms and files are
counted in a note, not read. Decimal steps that are all whole numbers become integer steps;
fractional steps are scaled by the smallest power of ten that makes them whole, and the
notes say by how much.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import polars as pl

from forensics.errors import UnreadableInputError
from forensics.importers.base import ImportResult, ReadOptions, Source, rel
from forensics.importers.restarts import assign_segments, restart_findings
from forensics.schema import conform

NAME = "neptune_parquet"
_PART = re.compile(r"^(?P<run>.+)_part_(?P<n>\d+)\.parquet(?P<tmp>\.tmp)?$")
_REQUIRED = {"project_id", "run_id", "attribute_path", "attribute_type", "step"}
_PARAM_COLUMNS = {
    "float": "float_value",
    "int": "int_value",
    "string": "string_value",
    "bool": "bool_value",
    "datetime": "datetime_value",
    "string_set": "string_set_value",
}
_WANTED = [
    "run_id",
    "project_id",
    "attribute_path",
    "attribute_type",
    "step",
    "timestamp",
    *_PARAM_COLUMNS.values(),
]
_MAX_SCALE = 6  # decimal(18, 6)


def _columns(path: Path) -> list[str] | None:
    try:
        return list(pl.read_parquet_schema(path))
    except Exception:  # noqa: BLE001 - not a parquet file, or a part cut short
        return None


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"config/optim/lr": 1}`` -> ``{"config": {"optim": {"lr": 1}}}`` (flat key on clashes)."""
    out: dict[str, Any] = {}
    for key, value in sorted(flat.items()):
        parts = key.split("/")
        node = out
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                node = None  # type: ignore[assignment]
                break
            node = nxt
        if node is None or parts[-1] in node:
            out[key] = value
        else:
            node[parts[-1]] = value
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


class NeptuneParquetImporter:
    NAME = NAME

    def discover(self, root: Path, files: list[Path]) -> list[Source]:
        runs: dict[tuple[Path, str], dict[str, list[tuple[int, Path]]]] = {}
        for f in files:
            m = _PART.match(f.name)
            if m is None:
                continue
            cols = _columns(f)
            if cols is None and not m["tmp"]:
                continue
            if cols is not None and not _REQUIRED <= set(cols):
                continue
            slot = runs.setdefault((f.parent, m["run"]), {"parts": [], "tmp": []})
            slot["tmp" if m["tmp"] else "parts"].append((int(m["n"]), f))
        out = []
        for (folder, run), slot in sorted(runs.items()):
            if not slot["parts"]:
                continue  # only .tmp parts: the exporter had not finished this run
            parts = [f for _, f in sorted(slot["parts"])]
            tmp = [f for _, f in sorted(slot["tmp"])]
            out.append(
                Source(
                    NAME,
                    parts,
                    rel(folder / run, root),
                    root,
                    scope="file",
                    options={"also_claims": tmp, "tmp_parts": tmp},
                )
            )
        return out

    def read(self, source: Source, options: ReadOptions) -> ImportResult:
        notes: list[str] = []
        frames: list[pl.DataFrame] = []
        for i, f in enumerate([*source.files, *source.options.get("tmp_parts", [])]):
            cols = _columns(f)
            if cols is None:
                notes.append(
                    f"{rel(f, source.root)}: an unfinished export part, not readable; left out"
                )
                continue
            try:
                df = pl.read_parquet(f, columns=[c for c in _WANTED if c in cols])
            except pl.exceptions.PolarsError as exc:
                raise UnreadableInputError(f"{f}: not a readable Parquet part ({exc})") from None
            if f.name.endswith(".tmp"):
                notes.append(
                    f"{rel(f, source.root)}: a part the exporter had not finished renaming; read"
                )
            frames.append(
                df.with_columns(
                    pl.lit(rel(f, source.root)).alias("_file"),
                    pl.lit(i, dtype=pl.Int32).alias("_file_idx"),
                    pl.int_range(1, pl.len() + 1, dtype=pl.Int64).alias("_rec"),
                )
            )
        if not frames:
            raise UnreadableInputError(f"{source.files[0]}: no readable Neptune export part")
        data = pl.concat(frames, how="diagonal_relaxed")
        run_ids = data.get_column("run_id").drop_nulls().unique().to_list()
        if len(run_ids) > 1:
            notes.append(
                f"{source.job}: the parts hold several run ids ({', '.join(map(str, run_ids[:5]))})"
            )

        series = data.filter(pl.col("attribute_type") == "float_series")
        steps = series.get_column("step").cast(pl.Float64)
        scale = 1
        finite = steps.drop_nulls()
        for k in range(_MAX_SCALE + 1):
            scaled = finite * 10**k
            err = (scaled - scaled.round()).abs().max() if len(scaled) else 0.0
            if err is None or float(err) < 1e-6:  # type: ignore[arg-type]
                scale = 10**k
                break
        if scale > 1:
            notes.append(
                f"{source.job}: Neptune steps are fractional; steps are multiplied by {scale:,} "
                "(as neptune-exporter's --step-multiplier) to be whole"
            )
        has_ts = "timestamp" in series.columns
        frame = series.select(
            pl.lit(NAME).alias("source"),
            pl.col("_file").alias("file"),
            pl.col("_file_idx").alias("file_idx"),
            pl.col("_rec").alias("record_idx"),
            (pl.col("step").cast(pl.Float64) * scale).round().cast(pl.Int64).alias("step"),
            pl.lit("step").alias("x_kind"),
            pl.col("attribute_path").alias("tag"),
            pl.col("float_value").cast(pl.Float64).alias("value"),
            (
                pl.col("timestamp").dt.epoch("ms").cast(pl.Float64) / 1000.0
                if has_ts
                else pl.lit(None, dtype=pl.Float64)
            ).alias("wall_time"),
        )
        frame = assign_segments(conform(frame))
        findings = restart_findings(frame)

        config: dict[str, Any] = {}
        metadata: dict[str, Any] = {
            "run_name": run_ids[0] if run_ids else None,
            "neptune_run_id": run_ids[0] if run_ids else None,
        }
        if "project_id" in data.columns:
            projects = data.get_column("project_id").drop_nulls().unique().to_list()
            metadata["neptune_project"] = projects[0] if projects else None
        params = data.filter(pl.col("attribute_type").is_in(list(_PARAM_COLUMNS)))
        for path, kind, *vals in params.select(
            "attribute_path",
            "attribute_type",
            *[
                pl.col(c) if c in params.columns else pl.lit(None).alias(c)
                for c in _PARAM_COLUMNS.values()
            ],
        ).iter_rows():
            value = _plain(vals[list(_PARAM_COLUMNS).index(kind)])
            if isinstance(value, float) and not math.isfinite(value):
                value = str(value)
            if path.startswith("sys/"):
                metadata[f"neptune_{path}"] = value
            else:
                config[path] = value
        other = (
            data.filter(~pl.col("attribute_type").is_in(["float_series", *_PARAM_COLUMNS]))
            .group_by("attribute_type")
            .agg(pl.col("attribute_path").n_unique())
            .sort("attribute_type")
        )
        if other.height:
            what = ", ".join(f"{n} {t}" for t, n in other.iter_rows())
            notes.append(f"{source.job}: not read (no vital sign in them): {what} attribute(s)")
        return ImportResult(
            frame=conform(frame),
            notes=notes,
            findings=findings,
            config=_nest(config),
            metadata={k: v for k, v in metadata.items() if v is not None},
        )


IMPORTER = NeptuneParquetImporter()
