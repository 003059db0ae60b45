"""TensorBoard event files: discovery of runs and sub-runs, fast reading, restarts, truncation.

Layout. TensorBoard calls every folder that directly holds event files a run. One training
job often writes several: Keras ``train/`` and ``validation/``, torch ``add_scalars``
sub-folders, the hparams sub-folder HF's callback adds. The rules here:

* a folder with event files nested under another such folder is part of that job;
* sibling folders named like data splits (``train``, ``validation``, ``eval`` ...) form one
  job rooted at their parent;
* any other top-level event folders are separate jobs (the caller refuses to guess).

Tags written in a sub-folder of the job folder are prefixed with that folder
(``validation/epoch_loss``), except torch/tensorboardX ``add_scalars`` folders
(``<main>_<key>``), which become ``<main>/<key>``. Event files of a job are read in name
order (= start-time order), which is what lets :mod:`restarts` see a resumed job's replay.

Reading is :mod:`tfevents_scan` (numpy, no protobuf) for the common scalar shape and
:mod:`tfevents_proto` for the rest. Length CRCs are always checked (cheap, vectorised) so a
corrupt or zero-filled file fails fast; data CRCs only with ``ReadOptions.verify_crc`` (needs
the ``crc32c`` package). A cut-off last record (a killed job) yields every complete record and
a ``truncated_log`` finding.

Histograms become extra scalar series ``<tag>/min``, ``/max``, ``/mean``, ``/std``,
``/absmax`` and ``/norm`` (see :mod:`tfevents_proto`); :mod:`tb_histograms` makes per-layer
vital signs of them. Tags logged against consumed samples
or tokens (``... vs samples``, ``Train/Samples/...``) get that ``x_kind``. Every
``SessionLog.START`` that would purge logged steps (``purge_step=``) starts a new segment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from forensics.errors import ConfigError, UnreadableInputError
from forensics.findings import Finding, FindingKind, Severity
from forensics.importers.base import ImportResult, ReadOptions, Source, rel
from forensics.importers.restarts import assign_segments, restart_findings
from forensics.importers.tb_histograms import META_KEY as HIST_META
from forensics.importers.tfevents_proto import ProtoRows, decode_records
from forensics.importers.tfevents_scan import (
    crc32c_py,
    decode_fast_chunked,
    header_ok,
    length_crc_ok,
    masked,
    walk,
)
from forensics.schema import conform, x_kind_of

NAME = "tfevents"
MAX_RECORD = 1 << 30  # a length beyond this is corruption, not data
SPLIT_NAMES = {
    "train",
    "training",
    "validation",
    "valid",
    "val",
    "eval",
    "evaluation",
    "test",
    "testing",
}


def is_event_file(p: Path) -> bool:
    return "tfevents" in p.name and not p.name.endswith(".profile-empty")


def event_jobs(root: Path, files: list[Path]) -> dict[Path, list[Path]]:
    """Job folder -> its event files (name order), following the module's layout rules."""
    ev = [f for f in files if is_event_file(f)]
    dirs = {f.parent for f in ev}
    tops = sorted(d for d in dirs if not any(a in dirs for a in d.parents))
    jobs: dict[Path, list[Path]] = {}
    for top in tops:
        key = (
            top.parent
            if top.name.lower() in SPLIT_NAMES and top != root and root in top.parents
            else top
        )
        jobs.setdefault(key, [])
    for f in ev:
        # The deepest job folder at or above the file, walking up (linear in the files).
        key = next(k for k in (f.parent, *f.parent.parents) if k in jobs)
        jobs[key].append(f)
    return {k: sorted(v, key=lambda p: (p.name, str(p))) for k, v in jobs.items()}


class TfeventsImporter:
    NAME = NAME

    def discover(self, root: Path, files: list[Path]) -> list[Source]:
        return [
            Source(NAME, fs, rel(job, root), root, options={"job_dir": job})
            for job, fs in event_jobs(root, files).items()
        ]

    def read(self, source: Source, options: ReadOptions) -> ImportResult:
        crc = _crc_function() if options.verify_crc else None
        job_dir: Path = source.options.get("job_dir", source.root)
        plugin_of: dict[str, str] = {}
        parts: list[pl.DataFrame] = []
        purges: list[tuple[int, int, int]] = []
        findings: list[Finding] = []
        notes: list[str] = []
        config: dict[str, Any] = {}
        skipped: dict[str, int] = {}
        hists: dict[str, float] = {}  # histogram tag (prefixed) -> norm error bound
        for file_idx, path in enumerate(source.files):
            name = rel(path, source.root)
            got = _read_file(path, name, file_idx, plugin_of, crc)
            if got.frame.height:
                parts.append(_prefix_tags(got.frame, path.parent, job_dir))
            purges.extend((file_idx, r, s) for r, s in got.purges)
            config.update(got.hparams)
            for t, e in _prefixed(got.hist, path.parent, job_dir).items():
                hists[t] = max(hists.get(t, 0.0), e)
            for k, v in got.skipped.items():
                skipped[k] = skipped.get(k, 0) + v
            if got.bad_crc:
                notes.append(
                    f"{name}: {got.bad_crc} record(s) failed the CRC check and were skipped"
                )
            if got.cut_bytes:
                findings.append(_truncated(name, got))
        return assemble(source, parts, plugin_of, purges, findings, notes, config, skipped, hists)


def assemble(
    source: Source,
    parts: list[pl.DataFrame],
    plugin_of: dict[str, str],
    purges: list[tuple[int, int, int]],
    findings: list[Finding],
    notes: list[str],
    config: dict[str, Any],
    skipped: dict[str, int],
    hists: dict[str, float] | None = None,
) -> ImportResult:
    """A job's decoded rows (per file, tags prefixed) -> its result: tensor scalars kept once
    their tag is known as scalars, x kinds, restart segments (purges included); ``hists``
    (histogram tag -> norm error bound) is handed to read_job's per-layer vitals."""
    if parts:
        frame = pl.concat(parts, how="vertical")
        # New-style tensor scalars without metadata count only once the tag is known as scalars.
        scalar_tags = [t for t, p in plugin_of.items() if p == "scalars"]
        frame = frame.filter(~pl.col("_tensor") | pl.col("tag").is_in(scalar_tags)).drop("_tensor")
    else:
        frame = pl.DataFrame(
            schema={
                "file_idx": pl.Int32,
                "record_idx": pl.Int64,
                "step": pl.Int64,
                "tag": pl.Utf8,
                "value": pl.Float64,
                "wall_time": pl.Float64,
                "file": pl.Utf8,
            }
        )
    names = [rel(p, source.root) for p in source.files]
    frame = frame.with_columns(pl.lit(NAME, dtype=_CAT).alias("source"), _x_kind_expr(frame))
    frame = assign_segments(conform(frame), purges=purges)
    findings.extend(restart_findings(frame))
    if skipped:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(skipped.items()))
        notes.append(f"TensorBoard records without vital signs were ignored ({kinds})")
    meta: dict[str, Any] = {"tfevents_files": names}
    if hists:  # per-layer vitals are given in read_job (tb_histograms), after canonicalising
        meta[HIST_META] = hists
    return ImportResult(frame=frame, notes=notes, findings=findings, config=config, metadata=meta)


# The frame's string columns are categorical (schema.SCHEMA): built so from the start, the
# 7M-row columns of a 1M-step run are never materialised as strings.
_CAT = pl.Categorical()


def _x_kind_expr(frame: pl.DataFrame) -> pl.Expr:
    tags = frame.get_column("tag").unique().to_list()
    kinds = {t: x_kind_of(t) for t in tags}
    return pl.col("tag").replace_strict(kinds, default="step", return_dtype=_CAT).alias("x_kind")


def _crc_function():  # noqa: ANN202
    try:
        import crc32c
    except ImportError:
        raise ConfigError(
            "--verify-crc needs the crc32c package "
            "(pip install 'forensics[crc]' or pip install crc32c)"
        ) from None
    return crc32c.crc32c


def _any_crc():  # noqa: ANN202
    """The crc32c package when installed, else the pure-Python CRC (one record's worth)."""
    try:
        import crc32c

        return crc32c.crc32c
    except ImportError:
        return crc32c_py


class _FileResult:
    def __init__(self) -> None:
        self.frame = pl.DataFrame()
        self.purges: list[tuple[int, int]] = []
        self.hparams: dict[str, Any] = {}
        self.skipped: dict[str, int] = {}
        self.hist: dict[str, float] = {}
        self.bad_crc = 0
        self.cut_bytes = 0
        self.zero_tail = False
        self.last_step: int | None = None
        self.records = 0


def _read_file(path: Path, name: str, file_idx: int, plugin_of: dict[str, str], crc) -> _FileResult:  # noqa: ANN001
    out = _FileResult()
    try:
        buf = _map(path)
    except OSError as exc:
        raise UnreadableInputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    n = len(buf)
    if n == 0:
        return out
    if n >= 12 and not header_ok(buf[:12]):
        if not np.frombuffer(buf, dtype=np.uint8).any():
            raise UnreadableInputError(
                f"{path}: the file is all zero bytes; expected TensorBoard event records"
            )
        raise UnreadableInputError(
            f"{path}: not a TensorBoard event file (the first record's length check fails); "
            "expected TFRecord-framed events"
        )
    a = np.frombuffer(buf, dtype=np.uint8)
    fr = walk(buf, MAX_RECORD)
    good = length_crc_ok(a, fr.offs)
    k = int(np.argmin(good)) if not good.all() else len(good)
    stop = fr.stop if k == len(good) else "bad_crc"
    # A crash can leave the last block zero-filled from the middle of a record: the record
    # the zeros begin in was being written, not corrupted. It is dropped when its data CRC
    # fails (at most one record reaches into the trailing zero run).
    z = _zero_run_start(a, path)
    while k and z < n and int(fr.offs[k - 1] + fr.lens[k - 1] + 16) > z:
        o, ln = int(fr.offs[k - 1]), int(fr.lens[k - 1])
        stored = int.from_bytes(buf[o + 12 + ln : o + 16 + ln], "little")
        if masked(_any_crc()(buf[o + 12 : o + 12 + ln])) == stored:
            break  # a complete record whose last bytes happen to be zeros
        k, stop = k - 1, "bad_crc"
    offs, lens = fr.offs[:k], fr.lens[:k]
    end = int(offs[-1] + lens[-1] + 16) if k else 0
    if k < len(fr.offs) or fr.stop != "eof":
        _classify_tail(path, buf, end, k, stop, out, z)
    out.records = k
    keep = np.ones(k, dtype=bool)
    if crc is not None and k:
        view = memoryview(buf)
        for i, (o, ln) in enumerate(zip(offs.tolist(), lens.tolist(), strict=True)):
            stored = int.from_bytes(view[o + 12 + ln : o + 16 + ln], "little")
            c = crc(view[o + 12 : o + 12 + ln])
            if ((((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF) != stored:
                keep[i] = False
        out.bad_crc = int((~keep).sum())
    try:
        df, proto = decode_framed(buf, a, offs, lens, keep, plugin_of)
    except ValueError as exc:
        raise UnreadableInputError(f"{path}: {exc}; the file is corrupt") from None
    out.purges, out.hparams, out.skipped = proto.purges, proto.hparams, proto.skipped
    out.hist = proto.hist
    del a, buf  # the file's bytes are decoded: free them before the frame is built
    out.frame = df.with_columns(
        pl.lit(file_idx, dtype=pl.Int32).alias("file_idx"), pl.lit(name, dtype=_CAT).alias("file")
    )
    if df.height:
        out.last_step = int(df.get_column("step")[-1])
    return out


def decode_framed(
    buf,  # noqa: ANN001 - bytes or mmap
    a: np.ndarray,
    offs: np.ndarray,
    lens: np.ndarray,
    keep: np.ndarray,
    plugin_of: dict[str, str],
) -> tuple[pl.DataFrame, ProtoRows]:
    """Complete records (``offs``/``lens`` into ``buf``, ``a`` its bytes as uint8; ``keep``
    False for records that failed the data CRC) -> rows (``record_idx`` = index among them,
    step, tag, value, wall_time, ``_tensor``) and what protobuf found besides (purges,
    hparams, skipped kinds). A record that is not an Event is a ValueError."""
    fast = decode_fast_chunked(a, offs, lens)
    # Tags known as scalars from a fast-path record's own metadata.
    for t in np.unique(fast.tag_id[fast.has_meta]).tolist():
        plugin_of[fast.tags[t]] = "scalars"
    rest = np.flatnonzero(~fast.matched & keep)
    proto = decode_records(buf, offs[rest] + 12, offs[rest] + 12 + lens[rest], rest, plugin_of)
    sel = keep[fast.rec]
    tag_series = pl.Series("tag", fast.tags, dtype=_CAT)
    fast_df = pl.DataFrame(
        {
            "record_idx": fast.rec[sel],
            "_sub": np.zeros(int(sel.sum()), dtype=np.int64),
            "step": fast.step[sel],
            "tag": tag_series.gather(fast.tag_id[sel])
            if len(fast.tags)
            else pl.Series([], dtype=_CAT),
            "value": fast.value[sel],
            "wall_time": fast.wall_time[sel],
            "_tensor": fast.is_tensor[sel] & ~fast.has_meta[sel],
        },
        schema={
            "record_idx": pl.Int64,
            "_sub": pl.Int64,
            "step": pl.Int64,
            "tag": _CAT,
            "value": pl.Float64,
            "wall_time": pl.Float64,
            "_tensor": pl.Boolean,
        },
    )
    proto_df = pl.DataFrame(
        {
            "record_idx": proto.rec,
            "_sub": proto.sub,
            "step": proto.step,
            "tag": proto.tag,
            "value": proto.value,
            "wall_time": proto.wall_time,
            "_tensor": [False] * len(proto.rec),
        },
        schema=fast_df.schema,
    )
    df = (
        fast_df
        if proto_df.is_empty()
        else pl.concat([fast_df, proto_df]).sort("record_idx", "_sub")
    )
    return df.drop("_sub"), proto


def _map(path: Path):  # noqa: ANN202 - bytes or a read-only mmap (same buffer protocol)
    """The file's bytes, memory-mapped: a multi-gigabyte (or sparse) event file is paged in
    as it is scanned instead of copied into memory whole."""
    import mmap

    with open(path, "rb") as fh:
        try:
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (ValueError, OSError):  # an empty file, a file system without mmap
            return fh.read()


def _zero_run_start(a: np.ndarray, path: Path | None = None) -> int:
    """Where the run of zero bytes ending the file starts (len(a) when it ends otherwise).

    Holes of a sparse file are zeros by definition: they are skipped without being read
    (SEEK_DATA / SEEK_HOLE), so a mostly-empty multi-gigabyte file is not paged in."""
    for lo, hi in reversed(_data_regions(path, len(a))):
        found = _last_nonzero(a, lo, hi)
        if found is not None:
            return found + 1
    return 0


def _data_regions(path: Path | None, n: int) -> list[tuple[int, int]]:
    """(start, end) of the parts of the file that hold data; the whole file when unknown."""
    import errno
    import os

    if path is None or not hasattr(os, "SEEK_DATA"):
        return [(0, n)]
    out: list[tuple[int, int]] = []
    try:
        with open(path, "rb") as fh:
            fd, pos = fh.fileno(), 0
            while pos < n:
                try:
                    data = os.lseek(fd, pos, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # only a hole from pos on
                        break
                    raise
                hole = os.lseek(fd, data, os.SEEK_HOLE)
                out.append((data, min(hole, n)))
                pos = hole
    except OSError:
        return [(0, n)]
    return out


def _last_nonzero(a: np.ndarray, lo: int, hi: int) -> int | None:
    step = 1 << 16
    while hi > lo:
        start = max(lo, hi - step)
        nz = np.flatnonzero(a[start:hi])
        if len(nz):
            return start + int(nz[-1])
        hi = start
        step = min(step * 4, 1 << 26)
    return None


def _classify_tail(
    path: Path, buf: bytes, end: int, k: int, stop: str, out: _FileResult, z: int
) -> None:
    """After the last good record: a killed job's cut-off tail is fine, corruption is not."""
    n = len(buf)
    if z <= end:
        if k == 0:
            raise UnreadableInputError(f"{path}: zero-filled; expected TensorBoard event records")
        out.cut_bytes, out.zero_tail = n - end, True
        return
    if z < n:
        # Bytes of one record, then zeros to the end (a crash's zero-filled last block).
        declared = int.from_bytes(buf[end : end + 8], "little") if z - end >= 12 else 0
        if z - end < 12 or (header_ok(buf[end : end + 12]) and z - end < declared + 16):
            out.cut_bytes, out.zero_tail = n - end, True
            return
    left = n - end  # no copy of the tail: it may be gigabytes of a sparse file
    if stop == "short" and (left < 12 or header_ok(buf[end : end + 12])):
        out.cut_bytes = left  # the last record was being written when the job stopped
        return
    raise UnreadableInputError(
        f"{path}: corrupt TensorBoard record framing at byte {end} (after {k} good records); "
        "expected length-prefixed, CRC-checked event records"
    )


def _truncated(name: str, got: _FileResult) -> Finding:
    how = "is zero-filled" if got.zero_tail else "is cut off mid-record"
    return Finding(
        kind=FindingKind.TRUNCATED_LOG,
        severity=Severity.INFO,
        metric=None,
        start_step=got.last_step if got.last_step is not None else 0,
        measures={
            "file": name,
            "bytes_lost": got.cut_bytes,
            "records_read": got.records,
            "zero_filled": got.zero_tail,
        },
        summary=(
            f"The end of {name} {how} ({got.cut_bytes} bytes): the writer stopped while writing, "
            f"as when a job is killed; the {got.records} complete records before it were read."
        ),
    )


def _prefix_tags(frame: pl.DataFrame, folder: Path, job_dir: Path) -> pl.DataFrame:
    """Tags of a sub-folder get its path as a prefix; add_scalars folders become <main>/<key>
    (tensorboardX writes them to ``<main>/<key>/``, torch to ``<main with _>_<key>/``)."""
    if folder == job_dir:
        return frame
    try:
        sub = folder.relative_to(job_dir).as_posix()
    except ValueError:
        return frame
    mapping: dict[str, str] = {}
    for tag in frame.get_column("tag").unique().to_list():
        stem = tag.replace("/", "_") + "_"
        if sub.startswith(tag + "/"):  # tensorboardX add_scalars: <main>/<key>/
            mapping[tag] = sub
        elif (
            "/" not in sub and sub.startswith(stem) and len(sub) > len(stem)
        ):  # torch: <main>_<key>/
            mapping[tag] = f"{tag}/{sub[len(stem) :]}"
        else:
            mapping[tag] = f"{sub}/{tag}"
    return frame.with_columns(pl.col("tag").replace_strict(mapping, return_dtype=_CAT))


def _prefixed(hist: dict[str, float], folder: Path, job_dir: Path) -> dict[str, float]:
    """Histogram tags named as their stat series are (the sub-folder prefix of _prefix_tags)."""
    if not hist or folder == job_dir:
        return hist
    tags = pl.DataFrame({"tag": list(hist)}, schema={"tag": pl.Utf8})
    new = _prefix_tags(tags, folder, job_dir).get_column("tag").to_list()
    return dict(zip(new, hist.values(), strict=True))


IMPORTER = TfeventsImporter()
