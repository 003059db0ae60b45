"""Megatron-LM functional-test golden values (``golden_values_*.json``)::

    {"lm loss": {"start_step": 1, "end_step": 51000, "step_interval": 5,
                 "values": {"1": 12.95, "5": 12.91, ..., "50865": "nan", ...}}, ...}

Each file is one run (A100 and H100 files beside each other are two runs of one config).
``"nan"`` entries before a metric's first and after its last recorded step are missing
data, not NaN values: when every metric stops before ``end_step`` the log was cut short,
reported as a ``truncated_log`` finding. A metric recorded only now and then (mostly
``"nan"``, like ``iteration-time``) keeps only its recorded points. ``model_config.yaml``
beside the file (``MODEL_ARGS``) becomes the run config.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import polars as pl

from forensics.errors import UnreadableInputError
from forensics.findings import Finding, FindingKind, Severity
from forensics.importers.base import (
    ImportResult,
    ReadOptions,
    Source,
    read_head,
    read_text,
    rel,
    strip_suffixes,
)
from forensics.schema import conform

NAME = "megatron_golden"
_SNIFF = re.compile(rb'^\s*\{\s*"[^"]+"\s*:\s*\{\s*"(?:start_step|end_step|step_interval|values)"')


def _value(v: Any) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


class MegatronGoldenImporter:
    NAME = NAME

    def discover(self, root: Path, files: list[Path]) -> list[Source]:
        out = []
        present = set(files)  # a list would make discovery quadratic
        for f in files:
            if not strip_suffixes(f.name).lower().endswith(".json"):
                continue
            if _SNIFF.match(read_head(f, 4096)):
                cfg = f.parent / "model_config.yaml"
                extra = [cfg] if cfg in present else []
                out.append(
                    Source(
                        NAME, [f], rel(f, root), root, scope="file", options={"also_claims": extra}
                    )
                )
        return out

    def read(self, source: Source, options: ReadOptions) -> ImportResult:
        path = source.files[0]
        name = rel(path, source.root)
        try:
            data = json.loads(read_text(path))
        except (ValueError, RecursionError) as exc:
            raise UnreadableInputError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise UnreadableInputError(f"{path}: expected an object of metrics with 'values'")
        steps: list[int] = []
        tags: list[str] = []
        values: list[float] = []
        notes: list[str] = []
        last_recorded: dict[str, int] = {}
        end_step = 0
        for metric, spec in data.items():
            if not isinstance(spec, dict) or not isinstance(spec.get("values"), dict):
                continue
            end_step = max(end_step, int(spec.get("end_step") or 0))
            pts = sorted(
                (
                    (int(k), _value(v))
                    for k, v in spec["values"].items()
                    if str(k).lstrip("-").isdigit()
                )
            )
            recorded = [i for i, (_, v) in enumerate(pts) if not math.isnan(v)]
            if not recorded:
                notes.append(f"{name}: '{metric}' holds no recorded value")
                continue
            lo, hi = recorded[0], recorded[-1]
            span = pts[lo : hi + 1]
            sparse = len(recorded) < 0.5 * len(span)
            if sparse:
                notes.append(
                    f"{name}: '{metric}' is recorded at {len(recorded):,} of {len(span):,} steps; "
                    'its "nan" entries are missing points, not NaN values'
                )
            for s, v in span:
                if sparse and math.isnan(v):
                    continue
                steps.append(s)
                tags.append(metric)
                values.append(v)
            last_recorded[metric] = pts[hi][0]
        frame = (
            pl.DataFrame(
                {"step": steps, "tag": tags, "value": values},
                schema={"step": pl.Int64, "tag": pl.Utf8, "value": pl.Float64},
            )
            .with_row_index("record_idx")
            .with_columns(
                pl.col("record_idx").cast(pl.Int64),
                pl.lit(NAME).alias("source"),
                pl.lit(name).alias("file"),
                pl.lit(0).alias("file_idx"),
                pl.lit("step").alias("x_kind"),
                pl.lit(0).alias("segment"),
            )
        )
        findings = []
        last = max(last_recorded.values(), default=0)
        if last_recorded and last < end_step:
            findings.append(
                Finding(
                    kind=FindingKind.TRUNCATED_LOG,
                    severity=Severity.INFO,
                    metric=None,
                    start_step=last,
                    end_step=end_step,
                    measures={"last_recorded_step": last, "end_step": end_step, "file": name},
                    summary=(
                        f"The values stop at step {last:,} although the file covers steps up to "
                        f'{end_step:,}: the trailing "nan" entries are missing data (the run was '
                        "cut short), not NaN values."
                    ),
                )
            )
        return ImportResult(
            frame=conform(frame), notes=notes, findings=findings, config=_model_config(path.parent)
        )


def _model_config(folder: Path) -> dict[str, Any]:
    cfg = folder / "model_config.yaml"
    if not cfg.is_file() or folder.resolve() not in cfg.resolve().parents:
        return {}  # absent, or a link pointing outside the run folder (not followed)
    import yaml

    try:
        data = yaml.safe_load(cfg.read_text(encoding="utf-8", errors="replace")) or {}
    except (yaml.YAMLError, RecursionError):
        return {}
    args = data.get("MODEL_ARGS") if isinstance(data, dict) else None
    if not isinstance(args, dict):
        return {}
    return {str(k).lstrip("-"): v for k, v in args.items()}


IMPORTER = MegatronGoldenImporter()
