"""TensorBoard event files (tfevents): TFRecord framing + tensorboard.Event protobufs."""

from __future__ import annotations

import struct
from pathlib import Path

import polars as pl

from forensics.errors import UnreadableInputError
from forensics.findings import Finding, FindingKind, Severity
from forensics.importers.base import ImportResult, ReadOptions, Source, rel
from forensics.importers.restarts import assign_segments, restart_findings
from forensics.schema import conform

NAME = "tfevents"
MAX_RECORD = 256 * 1024 * 1024  # a length beyond this is corruption, not data


def is_event_file(p: Path) -> bool:
    return "tfevents" in p.name and not p.name.endswith(".profile-empty")


def _job_of(p: Path, root: Path) -> str:
    # Lightning writes one version_N folder per job; everything else under root is one job.
    for parent in p.relative_to(root).parents:
        if parent.name.startswith("version_") and parent.name[8:].isdigit():
            return parent.as_posix()
    return "."


class TfeventsImporter:
    NAME = NAME

    def discover(self, root: Path, files: list[Path]) -> list[Source]:
        by_job: dict[str, list[Path]] = {}
        for f in files:
            if is_event_file(f):
                by_job.setdefault(_job_of(f, root), []).append(f)
        return [
            Source(NAME, sorted(fs, key=lambda p: (p.name, str(p))), job, root)
            for job, fs in by_job.items()
        ]

    def read(self, source: Source, options: ReadOptions) -> ImportResult:
        rows: dict[str, list] = {k: [] for k in ("file", "file_idx", "record_idx", "step", "tag", "value", "wall_time")}
        notes: list[str] = []
        findings: list[Finding] = []
        from tensorboard.compat.proto import event_pb2  # heavy: imported only here

        plugin_of: dict[str, str] = {}
        for file_idx, path in enumerate(source.files):
            buf = path.read_bytes()
            name = rel(path, source.root)
            pos, idx, n = 0, 0, len(buf)
            while pos + 12 <= n:
                (length,) = struct.unpack_from("<Q", buf, pos)
                if length > MAX_RECORD:
                    raise UnreadableInputError(f"{path}: corrupt TensorBoard record at byte {pos} (length {length})")
                end = pos + 12 + length + 4
                if end > n:
                    break
                data = buf[pos + 12 : pos + 12 + length]
                pos = end
                try:
                    ev = event_pb2.Event.FromString(data)
                except Exception as exc:  # noqa: BLE001
                    raise UnreadableInputError(f"{path}: record {idx} is not a TensorBoard event ({exc})") from None
                idx += 1
                if not ev.HasField("summary"):
                    continue
                for v in ev.summary.value:
                    if v.HasField("metadata") and v.metadata.plugin_data.plugin_name:
                        plugin_of[v.tag] = v.metadata.plugin_data.plugin_name
                    kind = v.WhichOneof("value")
                    if kind == "simple_value":
                        val = float(v.simple_value)
                    elif kind == "tensor" and plugin_of.get(v.tag) == "scalars":
                        val = _tensor_scalar(v.tensor)
                        if val is None:
                            continue
                    else:
                        continue
                    rows["file"].append(name)
                    rows["file_idx"].append(file_idx)
                    rows["record_idx"].append(idx)
                    rows["step"].append(int(ev.step))
                    rows["tag"].append(v.tag)
                    rows["value"].append(val)
                    rows["wall_time"].append(float(ev.wall_time))
            if pos < n:
                findings.append(
                    Finding(
                        kind=FindingKind.TRUNCATED_LOG, severity=Severity.INFO, metric=None,
                        start_step=rows["step"][-1] if rows["step"] else 0,
                        measures={"file": name, "bytes_left": n - pos},
                        summary=f"{name} ends mid-record ({n - pos} bytes cut off): the job was killed while writing; every complete record was read.",
                    )
                )
        frame = pl.DataFrame(rows, schema={"file": pl.Utf8, "file_idx": pl.Int32, "record_idx": pl.Int64, "step": pl.Int64,
                                           "tag": pl.Utf8, "value": pl.Float64, "wall_time": pl.Float64})
        frame = frame.with_columns(pl.lit(NAME).alias("source"), pl.lit("step").alias("x_kind"))
        frame = assign_segments(conform(frame))
        findings.extend(restart_findings(frame))
        return ImportResult(frame=conform(frame), notes=notes, findings=findings)


def _tensor_scalar(t) -> float | None:  # noqa: ANN001
    for field in ("float_val", "double_val", "int_val", "int64_val"):
        vals = getattr(t, field)
        if len(vals):
            return float(vals[0])
    if t.tensor_content:
        fmt = {1: "<f", 2: "<d", 3: "<i", 9: "<q"}.get(t.dtype)
        if fmt:
            return float(struct.unpack_from(fmt, t.tensor_content)[0])
    return None


IMPORTER = TfeventsImporter()
