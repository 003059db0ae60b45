"""JSONL metric logs: one JSON object per line (generic, LLaMA-Factory, Levanter, W&B history)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import polars as pl

from forensics.importers.base import ImportResult, ReadOptions, Source, head_lines, read_text, rel, strip_suffixes
from forensics.importers.restarts import assign_segments, restart_findings
from forensics.schema import conform

NAME = "jsonl"
STEP_KEYS = ("step", "global_step", "iteration", "iter", "num_updates", "trainer/global_step", "current_steps", "_step")
TIME_KEYS = ("_timestamp", "timestamp", "wall_time")
_SKIP_KEYS = set(TIME_KEYS) | {"_runtime", "_step"}


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        s = v.strip().replace(",", "")
        try:
            return float(s)  # float() accepts "nan", "inf", "Infinity", "1.2e-4"
        except ValueError:
            return None
    return None


def flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        else:
            out[key] = v
    return out


class JsonlImporter:
    NAME = NAME

    def discover(self, root: Path, files: list[Path]) -> list[Source]:
        out: list[Source] = []
        for f in files:
            base = strip_suffixes(f.name)
            if not (base.endswith(".jsonl") or base.endswith(".ndjson") or base.endswith(".json") or base.endswith(".log") or base.endswith(".txt")):
                continue
            lines = head_lines(f, 50)
            objs = [ln for ln in lines if ln.lstrip().startswith("{")]
            if not objs or len(objs) < max(1, len(lines) // 2):
                continue
            try:
                first = json.loads(objs[0])
            except ValueError:
                continue
            if not isinstance(first, dict):
                continue
            if base == "trainer_log.jsonl":  # LLaMA-Factory: the job is its output folder
                out.append(Source(NAME, [f], rel(f.parent, root), root, scope="folder"))
            else:
                out.append(Source(NAME, [f], rel(f, root), root, scope="file"))
        return out

    def read(self, source: Source, options: ReadOptions) -> ImportResult:
        path = source.files[0]
        name = rel(path, source.root)
        steps: list[int | None] = []
        tags: list[str] = []
        values: list[float] = []
        times: list[float | None] = []
        recs: list[int] = []
        bad: list[int] = []
        counter = 0
        for lineno, line in enumerate(read_text(path).splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    raise ValueError("not an object")
            except ValueError:
                bad.append(lineno)
                continue
            flat = flatten(obj)
            step = None
            for k in STEP_KEYS:
                if k in flat and _number(flat[k]) is not None and math.isfinite(_number(flat[k]) or 0.0):
                    step = int(_number(flat[k]))  # type: ignore[arg-type]
                    break
            if step is None:
                step = counter
            counter += 1
            wt = None
            for k in TIME_KEYS:
                if k in flat and _number(flat[k]) is not None:
                    wt = _number(flat[k])
                    break
            for k, v in flat.items():
                if k in STEP_KEYS or k in _SKIP_KEYS:
                    continue
                x = _number(v)
                if x is None:
                    continue
                steps.append(step)
                tags.append(k)
                values.append(x)
                times.append(wt)
                recs.append(lineno)
        frame = pl.DataFrame(
            {"step": steps, "tag": tags, "value": values, "wall_time": times, "record_idx": recs},
            schema={"step": pl.Int64, "tag": pl.Utf8, "value": pl.Float64, "wall_time": pl.Float64, "record_idx": pl.Int64},
        ).with_columns(
            pl.lit(NAME).alias("source"), pl.lit(name).alias("file"), pl.lit(0).alias("file_idx"), pl.lit("step").alias("x_kind")
        )
        frame = assign_segments(conform(frame))
        notes = []
        if bad:
            shown = ", ".join(map(str, bad[:10])) + (" ..." if len(bad) > 10 else "")
            notes.append(f"{name}: skipped {len(bad)} line(s) that are not JSON objects (lines {shown})")
        return ImportResult(frame=conform(frame), notes=notes, findings=restart_findings(frame))


IMPORTER = JsonlImporter()
