"""W&B exports users save by hand: the web UI's chart CSV, and API history as CSV/JSONL/parquet.

* Chart CSV (panel menu -> Export): ``Step, "<run> - <metric>", "<run> - <metric>__MIN",
  "<run> - <metric>__MAX", ...``. One CSV per panel, so a folder of them is one run, or
  several runs when several run names appear. The points are the chart's sampled points.
* API history (``run.history()`` / ``scan_history()`` saved by the user, or the
  ``<run>-history`` parquet artifact): columns ``_step``, ``_runtime``, ``_timestamp`` plus the
  user's keys. ``train/global_step`` (HF Trainer) is the better x axis when present.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import polars as pl

from forensics.errors import UnreadableInputError
from forensics.importers.base import (
    ImportResult,
    ReadOptions,
    Source,
    not_numbers_note,
    read_bytes,
    read_head,
    rel,
    strip_suffixes,
)
from forensics.importers.restarts import assign_segments, restart_findings
from forensics.sampled import excursion_text
from forensics.schema import conform, empty_frame

NAME = "wandb_csv"
GLOBAL_STEP_KEYS = ("train/global_step", "trainer/global_step")
W_STEP, W_TIME = "_step", "_timestamp"
_UI_SEP = " - "
_MINMAX = re.compile(r"__(?:MIN|MAX)$")
_JSON_EXT = (".jsonl", ".ndjson", ".json")
_INDEX = re.compile(r"^(?:|index|Unnamed: \d+|level_0)$")


# -- sniffing ----------------------------------------------------------------------------
def _csv_header(path: Path) -> list[str]:
    head = read_head(path, 65536).decode("utf-8", "replace")
    first = head.splitlines()[0] if head else ""
    try:
        return pl.read_csv(io.StringIO(first + "\n"), has_header=True, n_rows=0).columns
    except Exception:  # noqa: BLE001 - a file that is not CSV is simply not ours
        return []


def _ui_columns(header: list[str]) -> dict[str, list[tuple[str, str]]]:
    """run name -> [(column, metric)] for chart-export value columns (no __MIN/__MAX)."""
    runs: dict[str, list[tuple[str, str]]] = {}
    for col in header[1:]:
        if _UI_SEP not in col or _MINMAX.search(col):
            continue
        run, metric = col.rsplit(_UI_SEP, 1)
        run = run.removeprefix("Group: ").strip()
        if metric in ("_step", "_runtime", "_timestamp"):
            continue
        runs.setdefault(run, []).append((col, metric))
    return runs


def is_ui_export(header: list[str]) -> bool:
    return len(header) >= 2 and bool(_ui_columns(header)) and _UI_SEP not in header[0]


def is_api_header(header: list[str]) -> bool:
    return W_STEP in header or (W_TIME in header and "_runtime" in header)


def _first_json(path: Path) -> dict[str, Any] | None:
    for line in read_head(path, 65536).decode("utf-8", "replace").splitlines():
        if line.strip():
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                return None
            return obj if isinstance(obj, dict) else None
    return None


def _file_source(f: Path, root: Path, kind: str) -> Source:
    """One exported file read on its own (an API export: csv, jsonl or parquet)."""
    return Source(NAME, [f], rel(f, root), root, scope="file", options={"kind": kind})


class WandbCsvImporter:
    NAME = NAME

    def discover(self, root: Path, files: list[Path]) -> list[Source]:
        out: list[Source] = []
        ui_by_dir: dict[Path, dict[str, list[Path]]] = {}
        for f in files:
            base = strip_suffixes(f.name).lower()
            if base.endswith(".csv"):
                header = _csv_header(f)
                if is_ui_export(header):
                    for run in _ui_columns(header):
                        ui_by_dir.setdefault(f.parent, {}).setdefault(run, []).append(f)
                elif is_api_header(header):
                    out.append(_file_source(f, root, "api_csv"))
            elif base.endswith(_JSON_EXT):
                obj = _first_json(f)
                if obj is not None and W_STEP in obj and ("_timestamp" in obj or "_runtime" in obj):
                    out.append(_file_source(f, root, "api_jsonl"))
            elif base.endswith(".parquet"):
                try:
                    cols = pl.read_parquet_schema(f)
                except Exception:  # noqa: BLE001
                    continue
                if W_STEP in cols:
                    out.append(_file_source(f, root, "api_parquet"))
        for folder, runs in ui_by_dir.items():
            job = rel(folder, root)
            for run, fs in runs.items():
                # One run in the folder: the folder is the job. Several: one job per run name.
                rjob = job if len(runs) == 1 else (run if job == "." else f"{job}/{run}")
                out.append(
                    Source(
                        NAME,
                        sorted(set(fs)),
                        rjob,
                        root,
                        scope="folder",
                        options={"kind": "ui_csv", "run_name": run},
                    )
                )
        return out

    def read(self, source: Source, options: ReadOptions) -> ImportResult:
        kind = source.options.get("kind")
        if kind == "ui_csv":
            return _read_ui(source)
        path = source.files[0]
        name = rel(path, source.root)
        notes: list[str] = []
        try:
            if kind == "api_parquet":
                wide = pl.read_parquet(path)
            elif kind == "api_csv":
                wide = pl.read_csv(io.BytesIO(read_bytes(path)), infer_schema=False)
            else:
                return _finish(_jsonl_history(path, name, notes), notes, source="wandb_history")
        except UnreadableInputError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise UnreadableInputError(
                f"{path}: cannot read this W&B history export ({type(exc).__name__}: {exc})"
            ) from None
        at = ("row", 1) if kind == "api_parquet" else ("line", 2)
        frame = history_long(wide.with_row_index("_row"), notes, name, at)
        return _finish(
            frame.with_columns(pl.lit(name).alias("file")), notes, source="wandb_history"
        )


# -- API history -------------------------------------------------------------------------
def _as_float(s: pl.Series) -> pl.Series | None:
    if s.dtype.is_numeric() or s.dtype == pl.Boolean:
        return s.cast(pl.Float64)
    if s.dtype == pl.Utf8:
        return s.str.strip_chars().cast(pl.Float64, strict=False)
    return None


def _not_numbers(raw: pl.Series, vals: pl.Series) -> pl.Series | None:
    """Where a text column's cell is neither empty nor a number ("N/A") in a column that
    holds numbers in other rows (None: nowhere). An empty cell is a value not logged, and a
    column of text is no metric (skipped with its own note)."""
    if raw.dtype != pl.Utf8 or not vals.is_not_null().any():
        return None
    bad = vals.is_null() & (raw.str.strip_chars().str.len_chars() > 0)
    return bad if bad.any() else None


def _unread_note(name: str, bad: dict[str, list[int]], where: str) -> str | None:
    """:func:`not_numbers_note`, the columns named in the order their first bad cell comes."""
    first_seen = dict(sorted(bad.items(), key=lambda kv: kv[1][0]))
    return not_numbers_note(name, first_seen, where)


def history_long(
    wide: pl.DataFrame, notes: list[str], name: str, at: tuple[str, int] = ("line", 0)
) -> pl.DataFrame:
    """A wide history table (one row per ``log`` call, column ``_row``) -> long rows.

    ``at``: how a note names a row, and what to add to ``_row`` for it: a CSV's line is
    ``_row + 2`` (``("line", 2)``), JSON lines keep their line in ``_row``, a Parquet
    file's rows are counted from 1 (``("row", 1)``)."""
    step_col = W_STEP if W_STEP in wide.columns else None
    for k in GLOBAL_STEP_KEYS:
        if k in wide.columns:
            gs = _as_float(wide.get_column(k))
            if gs is not None and gs.is_not_null().mean() >= 0.5:  # type: ignore[operator]
                step_col = k
                notes.append(
                    f"{name}: the x axis is {k} (the trainer's optimizer step), not W&B's _step"
                )
                break
    steps = _as_float(wide.get_column(step_col)) if step_col else None
    if steps is None:
        steps = pl.Series(range(wide.height), dtype=pl.Float64)
        notes.append(f"{name}: no step column; rows are numbered in order")
    steps = steps.fill_null(strategy="forward")
    times = _as_float(wide.get_column(W_TIME)) if W_TIME in wide.columns else None
    if (times is None or times.null_count() == times.len()) and "_runtime" in wide.columns:
        # No unix time: W&B's _runtime (seconds since the run started) still places a hang.
        times = _as_float(wide.get_column("_runtime"))
        if times is not None:
            notes.append(f"{name}: times are W&B's _runtime, seconds since the run started")
    parts = []
    skipped: list[str] = []
    unread: dict[str, list[int]] = {}
    for col in wide.columns:
        if col == "_row" or col.startswith("_") or col in GLOBAL_STEP_KEYS or _INDEX.match(col):
            continue  # W&B's own columns, the step axis, and a saved pandas index
        vals = _as_float(wide.get_column(col))
        if vals is None or (
            vals.null_count() == vals.len() and wide.get_column(col).null_count() < wide.height
        ):
            skipped.append(col)
            continue
        bad = _not_numbers(wide.get_column(col), vals)
        if bad is not None:
            rows = wide.get_column("_row").filter(bad).to_list()
            unread[col] = [int(r) + at[1] for r in rows]
        parts.append(
            pl.DataFrame(
                {
                    "record_idx": wide.get_column("_row").cast(pl.Int64),
                    "step": steps,
                    "tag": pl.Series([col] * wide.height, dtype=pl.Utf8),
                    "value": vals,
                    "wall_time": times
                    if times is not None
                    else pl.Series([None] * wide.height, dtype=pl.Float64),
                }
            )
        )
    if skipped:
        notes.append(
            f"{name}: {len(skipped)} non-numeric column(s) skipped (media, histograms or "
            f"text): {', '.join(skipped[:5])}"
        )
    note = _unread_note(name, unread, at[0])
    if note:
        notes.append(note)
    if not parts:
        return empty_frame()
    long = pl.concat(parts).filter(pl.col("value").is_not_null() & pl.col("step").is_not_null())
    return long.with_columns(pl.col("step").cast(pl.Int64))


def flatten_dots(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """W&B shows nested dicts as ``a.b``; histograms and media (``_type``) stay whole."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and "_type" not in v:
            out.update(flatten_dots(v, key + "."))
        else:
            out[key] = v
    return out


def _jsonl_history(path: Path, name: str, notes: list[str]) -> pl.DataFrame:
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    for lineno, line in enumerate(
        read_bytes(path).decode("utf-8", "replace").splitlines(), start=1
    ):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError
        except (ValueError, RecursionError):
            bad.append(lineno)
            continue
        flat = flatten_dots(obj)
        # Keep only scalars so polars can build columns; objects (histograms) are skipped.
        rows.append(
            {
                k: (float(v) if isinstance(v, bool) else v)
                for k, v in flat.items()
                if isinstance(v, (int, float, str)) or v is None
            }
        )
        rows[-1]["_row"] = lineno
    if bad:
        shown = ", ".join(map(str, bad[:10])) + (" ..." if len(bad) > 10 else "")
        notes.append(
            f"{name}: skipped {len(bad)} line(s) that are not JSON objects (lines {shown})"
        )
    if not rows:
        return empty_frame()
    cols = sorted({k for r in rows for k in r})
    data = {c: [r.get(c) for r in rows] for c in cols}
    series = {}
    for c, vals in data.items():
        if any(isinstance(v, str) for v in vals):
            series[c] = pl.Series(c, [None if v is None else str(v) for v in vals], dtype=pl.Utf8)
        else:
            series[c] = pl.Series(
                c, vals, dtype=pl.Float64 if c != "_row" else pl.Int64, strict=False
            )
    wide = pl.DataFrame(list(series.values()))
    return history_long(wide, notes, name).with_columns(pl.lit(name).alias("file"))


def _finish(frame: pl.DataFrame, notes: list[str], source: str) -> ImportResult:
    frame = frame.with_columns(
        pl.lit(source).alias("source"), pl.lit(0).alias("file_idx"), pl.lit("step").alias("x_kind")
    )
    frame = assign_segments(conform(frame))
    return ImportResult(frame=conform(frame), notes=notes, findings=restart_findings(frame))


# -- chart CSV ---------------------------------------------------------------------------
def _read_ui(source: Source) -> ImportResult:
    run_name = source.options["run_name"]
    notes: list[str] = []
    parts = []
    sampled = False
    widest: dict[str, dict[str, Any]] = {}  # metric tag -> its widest bucket (see _widest)
    for file_idx, path in enumerate(source.files):
        name = rel(path, source.root)
        try:
            df = pl.read_csv(io.BytesIO(read_bytes(path)), infer_schema=False)
        except Exception as exc:  # noqa: BLE001
            raise UnreadableInputError(
                f"{path}: cannot read this W&B chart export ({type(exc).__name__})"
            ) from None
        xname = df.columns[0]
        x = df.get_column(xname).str.strip_chars().cast(pl.Float64, strict=False)
        is_step = "step" in xname.lower() or xname.lower() in ("iteration", "iter", "epoch")
        if not is_step:
            notes.append(
                f"{name}: the chart's x axis is {xname!r}, not a step; points are numbered in order"
            )
            x = pl.Series(range(df.height), dtype=pl.Float64)
        cols = _ui_columns(df.columns).get(run_name, [])
        unread: dict[str, list[int]] = {}
        for col, metric in cols:
            vals = df.get_column(col).str.strip_chars().cast(pl.Float64, strict=False)
            bad = _not_numbers(df.get_column(col), vals)
            if bad is not None:  # (a CSV's line: the header is line 1)
                unread[col] = [int(i) + 2 for i in bad.arg_true().to_list()]
            for suffix in ("__MIN", "__MAX"):
                if col + suffix in df.columns:
                    other = (
                        df.get_column(col + suffix).str.strip_chars().cast(pl.Float64, strict=False)
                    )
                    if ((other - vals).abs() > 1e-12 * (vals.abs() + 1)).any():
                        sampled = True
                        w = _widest(x, vals, other, suffix == "__MAX")
                        if w is not None and w["ratio"] > widest.get(metric, {}).get("ratio", 1.0):
                            widest[metric] = w
            parts.append(
                pl.DataFrame(
                    {
                        "file": [name] * df.height,
                        "file_idx": [file_idx] * df.height,
                        "record_idx": list(range(1, df.height + 1)),
                        "step": x,
                        "tag": [metric] * df.height,
                        "value": vals,
                    },
                    schema_overrides={"file_idx": pl.Int32, "record_idx": pl.Int64},
                ).with_columns(pl.lit("step" if is_step else "points").alias("x_kind"))
            )
        note = _unread_note(name, unread, "line")
        if note:
            notes.append(note)
    down = ", down-sampled here (its __MIN/__MAX columns differ from the values)" if sampled else ""
    notes.append(
        f"W&B chart exports hold the chart's sampled points, not the full history{down}; "
        "short spikes may be averaged away"
    )
    for metric, w in sorted(widest.items()):
        # (a bucket's extreme within 5% of its point is the bucket's noise, not something
        # the points hide: "the sampled 1.241 there is 1.0x that" said nothing)
        if w["ratio"] >= _NOTED_EXCURSION:
            notes.append(f"{metric}: {excursion_text(w)}, which the sampled points leave out")
    meta: dict[str, Any] = {"wandb_run_name": run_name}
    if sampled:
        # What the verdict is judged on, and what the buckets hold beyond it (Diagnosis.unjudged).
        meta["sampled_export"] = {"excursions": widest}
    if not parts:
        return ImportResult(frame=empty_frame(), notes=notes, metadata=meta)
    frame = pl.concat(parts).filter(pl.col("value").is_not_null() & pl.col("step").is_not_null())
    # The same metric drawn on two panels is exported twice: keep one copy.
    frame = frame.unique(subset=["step", "tag", "value"], keep="first", maintain_order=True)
    frame = frame.with_columns(pl.col("step").cast(pl.Int64), pl.lit("wandb_csv").alias("source"))
    frame = assign_segments(conform(frame))
    return ImportResult(
        frame=conform(frame),
        notes=notes,
        findings=restart_findings(frame),
        metadata=meta,
    )


_NOTED_EXCURSION = 1.05  # a bucket's extreme at least this far beyond its point is noted


def _widest(x: pl.Series, vals: pl.Series, bound: pl.Series, upper: bool) -> dict[str, Any] | None:
    """The bucket whose maximum (``upper``) or minimum lies furthest from its sampled value,
    as a ratio of positive numbers: ``{"step", "value", "bound", "ratio", "upper"}``; None
    when no bucket of positive numbers reaches beyond its value."""
    f = pl.DataFrame({"x": x, "v": vals, "b": bound}).filter(
        (pl.col("v") > 0) & (pl.col("b") > 0) & pl.col("x").is_not_null()
    )
    if f.is_empty():
        return None
    ratio = (pl.col("b") / pl.col("v")) if upper else (pl.col("v") / pl.col("b"))
    f = f.with_columns(ratio.alias("r"))
    i = f.get_column("r").arg_max()
    if i is None or not float(f.get_column("r")[i]) > 1.0:
        return None
    row = f.row(i, named=True)
    return {
        "step": int(row["x"]),
        "value": float(row["v"]),
        "bound": float(row["b"]),
        "ratio": float(row["r"]),
        "upper": upper,
    }


IMPORTER = WandbCsvImporter()
