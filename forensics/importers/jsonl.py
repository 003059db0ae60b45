"""JSONL metric logs: one JSON object per line (generic, LLaMA-Factory, Levanter, W&B history).

* Nested objects are flattened with ``/`` (``{"train": {"loss": 1}}`` -> ``train/loss``); a
  nested histogram (``min, max, num, sum, sum_squares``, as Levanter writes) becomes
  ``<key>/min|max|mean|std|absmax|norm`` like TensorBoard histograms.
* The step is the first of :data:`STEP_KEYS` present; the time the first of :data:`TIME_KEYS`
  (unix seconds, or an ISO date). LLaMA-Factory's ``trainer_log.jsonl`` has neither a time
  stamp nor a ``step``: its ``current_steps`` is the step and ``elapsed_time`` ("1:02:03")
  gives seconds since the start.
* Numbers given as strings (``"1.2e-4"``, ``"nan"``, ``"1,234"``) and the bare ``NaN`` /
  ``Infinity`` Python's json module writes are accepted. Other strings are not metrics.
* Levanter's json_logger writes its JSON through Python logging, so a line may carry a
  logging prefix; its ``log`` events give the metrics, ``hparams`` the run config.
* A line that is not a JSON object is skipped and counted (line numbers in the run notes);
  it never aborts the file. A cut-off last line is reported as ``truncated_log``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from forensics.findings import Finding, FindingKind, Severity
from forensics.importers.base import (
    ImportResult,
    ReadOptions,
    Source,
    as_number,
    head_lines,
    open_bytes,
    read_bytes,
    read_head,
    rel,
    rows_frame,
    split_lines,
    strip_suffixes,
    text_bytes,
)
from forensics.importers.restarts import assign_segments, interleaved_note, restart_findings
from forensics.schema import SCHEMA, conform

NAME = "jsonl"
STEP_KEYS = (
    "step",
    "global_step",
    "iteration",
    "iter",
    "num_updates",
    "trainer/global_step",
    "current_steps",
    "_step",
)
TIME_KEYS = ("_timestamp", "timestamp", "wall_time")
_SKIP_KEYS = set(STEP_KEYS) | set(TIME_KEYS) | {"_runtime"}
_SUFFIXES = (".jsonl", ".ndjson", ".json", ".log", ".txt", ".out")
_HIST_KEYS = {"min", "max", "num", "sum", "sum_squares"}
_LEVANTER = '{"tracker"'
_ELAPSED = re.compile(r"^(?:(\d+) days?, )?(\d+):(\d\d):(\d\d(?:\.\d+)?)$")


_number = as_number  # shared with the W&B readers


def _hist(d: dict[str, Any]) -> dict[str, float] | None:
    from forensics.importers.tfevents_proto import _hist_stats

    try:
        return _hist_stats(
            float(d["min"]),
            float(d["max"]),
            float(d["num"]),
            float(d["sum"]),
            float(d["sum_squares"]),
        )
    except (TypeError, ValueError):
        return None


def flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> one level with ``/``-joined keys; histogram dicts -> their stats."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            stats = _hist(v) if _HIST_KEYS <= v.keys() else None
            if stats is not None:
                out.update({f"{key}/{s}": x for s, x in stats.items()})
            else:
                out.update(flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def _time(v: Any) -> float | None:
    x = _number(v)
    if x is not None:
        return x / 1000.0 if x > 1e11 else x  # milliseconds since the epoch
    if isinstance(v, str):
        try:
            return datetime.fromisoformat(v.strip().replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _elapsed(v: Any) -> float | None:
    m = _ELAPSED.match(v.strip()) if isinstance(v, str) else None
    if not m:
        return None
    days, h, mnt, sec = m.groups()
    return int(days or 0) * 86400 + int(h) * 3600 + int(mnt) * 60 + float(sec)


def _parse(line: str) -> dict[str, Any] | None:
    """A line as a JSON object, or None. Levanter lines may follow a logging prefix."""
    s = line.strip()
    if not s.startswith("{"):
        i = s.find(_LEVANTER)
        if i < 0:
            return None
        s = s[i:]
    try:
        obj = json.loads(s)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        return None
    if not isinstance(obj, dict):
        return None
    if _SURROGATE.search(s):
        try:
            obj = _no_surrogates(obj)
        except RecursionError:
            return None
    return obj


_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _no_surrogates(v: Any) -> Any:
    """A lone surrogate escape (``"\\ud800"``) is legal JSON but no text: make it U+FFFD so
    that tags and config values can be stored, printed and written."""
    if isinstance(v, str):
        return v.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if isinstance(v, dict):
        return {_no_surrogates(k): _no_surrogates(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_no_surrogates(x) for x in v]
    return v


_HEAD = 65536
_LONG_LINE_SCAN = 1 << 30  # how far to look for the end of a long first line


def _head_lines(path: Path) -> list[str]:
    """Up to 50 non-empty lines from the head, for sniffing. A line longer than the head (a
    first record holding a 100 MB blob) is not judged on its cut-off start: the lines after
    it are read instead, and it counts as an object when it starts like one."""
    head = read_head(path, _HEAD)
    if len(head) < _HEAD or b"\n" in head or not head.lstrip().startswith(b"{"):
        return head_lines(path, 50)
    try:
        with open_bytes(path) as fh:
            seen = 0
            while seen < _LONG_LINE_SCAN and (chunk := fh.read(1 << 20)):
                seen += len(chunk)
                i = chunk.find(b"\n")
                if i >= 0:
                    rest = text_bytes(chunk[i + 1 :] + fh.read(_HEAD))
                    break
            else:
                return []
    except Exception:  # noqa: BLE001 - sniffing never raises
        return []
    text = rest.decode("utf-8", "replace")
    lines = [ln for ln in split_lines(text) if ln.strip()][:49]
    return ["{}"] + lines


# Anything the per-line reader treats specially sends a file to it: a carriage return,
# a blank line, a BOM, NUL bytes.
_NOT_FLAT = (b"\r", b"\n\n", b"\x00")
_NUMERIC = (pl.Boolean, pl.Null)


def _read_flat(raw: bytes) -> pl.DataFrame | None:
    """The common case at the speed of polars' JSON reader: one flat object per line, every
    value a number, a bool or null. Returns the rows (step, tag, value, wall_time,
    record_idx) the per-line reader would, or None for anything else (nested objects,
    strings, bare NaN, a bad or cut-off line, Levanter's logger lines), which then goes
    line by line. Within a line, rows follow the file's first-seen key order."""
    if not raw or raw.startswith((b"\n", b"\xef\xbb\xbf")) or any(b in raw for b in _NOT_FLAT):
        return None
    n_lines = raw.count(b"\n") + (0 if raw.endswith(b"\n") else 1)
    try:
        df = pl.read_ndjson(raw, infer_schema_length=None)
    except Exception:  # noqa: BLE001 - polars refuses what the per-line reader handles
        return None
    if df.height != n_lines or not df.width:
        return None
    for dt in df.schema.values():
        if not (dt.is_numeric() or dt in _NUMERIC):
            return None
    num = {c: pl.col(c).cast(pl.Float64) for c in df.columns}
    step_keys = [k for k in STEP_KEYS if k in num]
    step = pl.coalesce(
        [pl.when(num[k].is_finite()).then(num[k]) for k in step_keys] + [pl.lit(None, pl.Float64)]
    )
    # W&B's _runtime (seconds since the run started) when no unix time was logged
    time_keys = [k for k in (*TIME_KEYS, "_runtime") if k in num]
    wt = pl.coalesce([num[k] for k in time_keys] + [pl.lit(None, pl.Float64)])
    wt = pl.when(wt > 1e11).then(wt / 1000.0).otherwise(wt)  # milliseconds since the epoch
    base = df.select(
        (pl.int_range(pl.len(), dtype=pl.Int64) + 1).alias("record_idx"),
        step.alias("_step"),
        wt.alias("wall_time"),
        *[num[c].alias(c) for c in df.columns if c not in _SKIP_KEYS],
    )
    s = base.get_column("_step").drop_nulls()
    if len(s) and not (-(2.0**62) < s.min() and s.max() < 2.0**62):  # type: ignore[operator]
        return None  # steps no trainer logs: the per-line reader reports those lines
    base = base.with_columns(pl.col("_step").cast(pl.Int64).alias("step")).drop("_step")
    keys = ["record_idx", "step", "wall_time"]
    metrics = [c for c in base.columns if c not in keys]
    parts = [
        base.select(
            *keys, pl.lit(c, dtype=SCHEMA["tag"]).alias("tag"), pl.col(c).alias("value")
        ).filter(pl.col("value").is_not_null())
        for c in _first_seen_order(raw, df, metrics)
    ]
    if not parts:
        return None
    # Concatenated per key; restart segmentation sorts by record (stably), so each line's
    # rows come out in key order.
    return pl.concat(parts).select("step", "tag", "value", "wall_time", "record_idx")


def _first_seen_order(raw: bytes, df: pl.DataFrame, cols: list[str]) -> list[str]:
    """Columns in the order the per-line reader meets them: by the first line holding a
    value, then by their place in that line's object."""
    firsts = df.select(pl.col(c).is_not_null().arg_max().alias(c) for c in cols).row(0)
    first_of = dict(zip(cols, firsts, strict=True))
    ends = np.flatnonzero(np.frombuffer(raw, dtype=np.uint8) == 10)
    place: dict[str, int] = {}
    for r in sorted(set(firsts)):
        start = int(ends[r - 1]) + 1 if r else 0
        end = int(ends[r]) if r < len(ends) else len(raw)
        for i, k in enumerate(json.loads(raw[start:end])):
            place.setdefault(k, i)
    return sorted(cols, key=lambda c: (first_of[c], place.get(c, 0)))


class JsonlImporter:
    NAME = NAME

    def discover(self, root: Path, files: list[Path]) -> list[Source]:
        out: list[Source] = []
        for f in files:
            base = strip_suffixes(f.name)
            if not base.endswith(_SUFFIXES):
                continue
            lines = _head_lines(f)
            objs = [ln for ln in lines if _parse(ln) is not None]
            # Most lines must be objects; a .json file must hold more than one (not a
            # pretty-printed document such as all_results.json).
            if (
                not objs
                or len(objs) < max(1, len(lines) // 2)
                or (base.endswith(".json") and len(objs) < 2)
            ):
                continue
            if base == "trainer_log.jsonl":  # LLaMA-Factory: the job is its output folder
                out.append(Source(NAME, [f], rel(f.parent, root), root, scope="folder"))
            else:
                out.append(Source(NAME, [f], rel(f, root), root, scope="file"))
        return out

    def read(self, source: Source, options: ReadOptions) -> ImportResult:
        path = source.files[0]
        name = rel(path, source.root)
        return finish(parse_lines(read_bytes(path), name), name)


@dataclass
class Lines:
    """What a run of lines holds, before the file-level steps (segments, notes)."""

    frame: pl.DataFrame  # labelled rows in line order, not yet segmented
    bad: list[int] = field(default_factory=list)  # line numbers that are not JSON objects
    config: dict[str, Any] = field(default_factory=dict)
    relative_time: bool = False  # LLaMA-Factory elapsed_time was the clock
    cut: bool = False  # the last line is cut off mid-record (no newline after it)


def parse_lines(raw: bytes, name: str, first_line: int = 1) -> Lines:
    """The rows of ``raw`` (text bytes, whole lines; ``first_line`` is the number of its
    first line in the file, so that a tail reading appended lines numbers them as a whole
    read would)."""
    fast = _read_flat(raw)
    if fast is not None:
        frame = fast.with_columns(
            pl.lit(NAME, dtype=SCHEMA["source"]).alias("source"),
            pl.lit(name, dtype=SCHEMA["file"]).alias("file"),
            pl.lit(0).alias("file_idx"),
            pl.lit("step").alias("x_kind"),
        )
        if first_line != 1:
            frame = frame.with_columns(pl.col("record_idx") + (first_line - 1))
        return Lines(frame=conform(frame))
    text = raw.decode("utf-8", errors="replace")
    steps: list[int | None] = []
    tags: list[str] = []
    values: list[float] = []
    times: list[float | None] = []
    recs: list[int] = []
    bad: list[int] = []
    config: dict[str, Any] = {}
    relative_time = False
    lines = split_lines(text)
    for lineno, line in enumerate(lines, start=first_line):
        if not line.strip():
            continue
        obj = _parse(line)
        if obj is None:
            bad.append(lineno)
            continue
        if obj.get("tracker") == "json_logger":  # Levanter
            event = obj.get("event")
            if event == "hparams" and isinstance(obj.get("hparams"), dict):
                config.update(flatten(obj["hparams"]))
            if event != "log" or not isinstance(obj.get("metrics"), dict):
                continue
            flat = flatten(obj["metrics"])
            flat["step"] = obj.get("step")
        else:
            flat = flatten(obj)
        step = None
        for k in STEP_KEYS:
            x = _number(flat.get(k))
            if x is not None and math.isfinite(x):
                step = int(x)
                break
        if step is not None and not -(2**62) < step < 2**62:
            bad.append(lineno)  # a step no trainer logs: a corrupt line
            continue
        wt = None
        for k in TIME_KEYS:
            if k in flat and (wt := _time(flat[k])) is not None:
                break
        if wt is None and "elapsed_time" in flat:
            wt = _elapsed(flat["elapsed_time"])
            relative_time = relative_time or wt is not None
        if wt is None and "_runtime" in flat:  # W&B: seconds since the run started
            wt = _number(flat["_runtime"])
        for k, v in flat.items():
            if k in _SKIP_KEYS:
                continue
            x = _number(v)
            if x is None:
                continue
            steps.append(step)
            tags.append(k)
            values.append(x)
            times.append(wt)
            recs.append(lineno)
    frame = rows_frame(
        {"step": steps, "tag": tags, "value": values, "wall_time": times, "record_idx": recs},
        source=NAME,
        file=name,
    )
    cut = bool(bad) and bad[-1] == first_line - 1 + len(lines) and not text.endswith("\n")
    return Lines(conform(frame), bad, config, relative_time, cut)


def finish(lines: Lines, name: str) -> ImportResult:
    """A file's rows (:func:`parse_lines`, one call or several concatenated) -> its result:
    restart segments, notes on skipped lines, a cut-off last line as ``truncated_log``."""
    frame = assign_segments(lines.frame)
    notes: list[str] = []
    if (shared := interleaved_note(frame, name)) is not None:
        notes.append(shared)
    findings = restart_findings(frame)
    bad = lines.bad
    if lines.cut:
        last = frame.get_column("step").drop_nulls()
        findings.append(
            Finding(
                kind=FindingKind.TRUNCATED_LOG,
                severity=Severity.INFO,
                metric=None,
                start_step=int(last[-1]) if len(last) else 0,
                measures={"file": name, "line": bad[-1]},
                summary=(
                    f"The last line of {name} is cut off: the writer stopped mid-line, as "
                    "when a job is killed."
                ),
            )
        )
    if bad:
        shown = ", ".join(map(str, bad[:10])) + (" ..." if len(bad) > 10 else "")
        notes.append(f"{name}: skipped {len(bad)} line(s) that are not JSON objects (line {shown})")
    if lines.relative_time:
        notes.append(
            f"{name}: times are LLaMA-Factory's elapsed_time, seconds since the job started"
        )
    return ImportResult(frame=conform(frame), notes=notes, findings=findings, config=lines.config)


IMPORTER = JsonlImporter()
