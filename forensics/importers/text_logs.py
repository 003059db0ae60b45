"""Text logs big-model trainers print (Megatron, DeepSpeed, llm.c, nanoGPT, torchtitan,
fairseq, Composer, MLPerf, and a generic per-step key-value fallback).

Each log file is its own job (a folder of SLURM logs is several jobs); a log inside a
TensorBoard or HF output folder joins that folder's job. Parsing lives in
:mod:`forensics.importers.text`; this module claims files and builds the canonical frame.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from forensics.importers.base import (
    ImportResult,
    ReadOptions,
    Source,
    binary_junk,
    open_bytes,
    read_bytes,
    rel,
    strip_suffixes,
    text_bytes,
)
from forensics.importers.restarts import assign_segments, restart_findings
from forensics.schema import SCHEMA, conform

NAME = "text_logs"
SUFFIXES = (".log", ".txt", ".out", ".err", ".stdout", ".stderr")
CRASH_ONLY_SUFFIXES = (".log", ".out", ".err", ".stdout", ".stderr")
SNIFF_BYTES = 262144


def _is_candidate(p: Path) -> bool:
    base = strip_suffixes(p.name).lower()
    return base.endswith(SUFFIXES) or ".log." in base or base.startswith("slurm-")


def head_and_tail(path: Path, n: int = SNIFF_BYTES) -> tuple[bytes, bytes]:
    """First and last ``n`` bytes (compressed files: the head only)."""
    try:
        with open_bytes(path) as fh:
            head = fh.read(n)
            if path.name.endswith((".gz", ".zst")):
                return head, b""
            size = path.stat().st_size
            if size <= n:
                return head, b""
            fh.seek(max(n, size - n))
            return head, fh.read(n)
    except Exception:  # noqa: BLE001 - sniffing never raises (corrupt .gz/.zst, permissions)
        return b"", b""


class TextLogsImporter:
    NAME = NAME

    def discover(self, root: Path, files: list[Path]) -> list[Source]:
        from forensics.importers.text import clean, looks_crashed, sniff

        out: list[Source] = []
        for f in files:
            if not _is_candidate(f):
                continue
            head, tail = head_and_tail(f)
            if not head or binary_junk(head):
                continue
            head, tail = text_bytes(head), text_bytes(tail)
            sample = (
                clean(head).decode("utf-8", "replace")
                + "\n"
                + clean(tail).decode("utf-8", "replace")
            )
            families = sniff(sample)
            if not families:
                end = (tail or head).decode("utf-8", "replace")
                if not (
                    strip_suffixes(f.name).lower().endswith(CRASH_ONLY_SUFFIXES)
                    and looks_crashed(end)
                ):
                    continue
            out.append(
                Source(NAME, [f], rel(f, root), root, scope="file", options={"families": families})
            )
        return out

    def read(self, source: Source, options: ReadOptions) -> ImportResult:
        from forensics.importers.text import parse_text

        path = source.files[0]
        name = rel(path, source.root)
        raw = read_bytes(path)
        log = parse_text(raw, name)
        family = log.families[0] if log.families else "text"
        frame = log.frame.select(
            pl.lit(f"{family}_text").alias("source"),
            pl.lit(name).alias("file"),
            pl.lit(0, dtype=pl.Int32).alias("file_idx"),
            (pl.col("ln") + 1).alias("record_idx"),
            "step",
            pl.lit(log.x_kind).alias("x_kind"),
            "tag",
            pl.lit(None, dtype=pl.Utf8).alias("metric"),
            pl.lit(None, dtype=pl.Int32).alias("layer"),
            "value",
            "wall_time",
            pl.lit(0, dtype=pl.Int32).alias("segment"),
        )
        if log.may_restart:
            frame = assign_segments(conform(frame))
        notes = list(log.notes)
        if log.families:
            notes.append(f"{name}: read as {' + '.join(log.families)} text log")
        if frame.is_empty():
            notes.append(f"{name}: no metric line found")
        findings = restart_findings(frame) + log.findings
        return ImportResult(
            frame=frame if frame.schema == SCHEMA else conform(frame),
            notes=notes,
            findings=findings,
            config=log.config,
            metadata=log.metadata,
        )


IMPORTER = TextLogsImporter()
