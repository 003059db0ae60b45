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

Read for analysis (``ReadOptions.series_order``), a job that cannot restart hands its rows
over tag after tag (:func:`_by_tag`, in C where it was built: ``_group.c``), the analysis
view's layout; ``export`` asks for the rows as read.

Histograms become extra scalar series ``<tag>/min``, ``/max``, ``/mean``, ``/std``,
``/absmax`` and ``/norm`` (see :mod:`tfevents_proto`); :mod:`tb_histograms` makes per-layer
vital signs of them. Tags logged against consumed samples
or tokens (``... vs samples``, ``Train/Samples/...``) get that ``x_kind``. Every
``SessionLog.START`` that would purge logged steps (``purge_step=``) starts a new segment.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from forensics.errors import ConfigError
from forensics.findings import Finding
from forensics.importers.base import ImportResult, ReadOptions, Source, rel
from forensics.importers.restarts import _RELATIVE_CLOCK as RELATIVE_CLOCK
from forensics.importers.restarts import assign_segments, counter_tags, restart_findings
from forensics.importers.tb_histograms import META_KEY as HIST_META
from forensics.importers.tfevents_file import (
    MAX_RECORD as MAX_RECORD,
)
from forensics.importers.tfevents_file import (
    FileRows,
    read_event_file,
    truncated,
)
from forensics.importers.tfevents_proto import ProtoRows, decode_records
from forensics.importers.tfevents_scan import TagTable, decode_fast_chunked
from forensics.schema import SCHEMA, conform, x_kind_of

try:  # the compiled grouping of rows (setup.py builds it where a C compiler is found)
    from forensics.importers import _group
except ImportError:  # pragma: no cover - an install without a compiler: numpy's path
    _group = None  # type: ignore[assignment]

NAME = "tfevents"
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
        got: list[tuple[int, FileRows, TagTable]] = []
        tables: dict[Path, TagTable] = {}  # per folder: its tags get the folder's prefix
        purges: list[tuple[int, int, int]] = []
        findings: list[Finding] = []
        notes: list[str] = []
        config: dict[str, Any] = {}
        skipped: dict[str, int] = {}
        hists: dict[str, float] = {}  # histogram tag (prefixed) -> norm error bound
        for file_idx, path in enumerate(source.files):
            name = rel(path, source.root)
            table = tables.setdefault(path.parent, TagTable())
            rows = read_event_file(path, plugin_of, crc, table)
            if rows.height:
                got.append((file_idx, rows, table))
            purges.extend((file_idx, r, s) for r, s in rows.purges)
            config.update(rows.hparams)
            for t, e in _prefixed(rows.hist, path.parent, job_dir).items():
                hists[t] = max(hists.get(t, 0.0), e)
            for k, v in rows.skipped.items():
                skipped[k] = skipped.get(k, 0) + v
            if rows.bad_crc:
                notes.append(
                    f"{name}: {rows.bad_crc} record(s) failed the CRC check and were skipped"
                )
            if rows.cut_bytes:
                findings.append(truncated(name, rows))
        if not got:
            return assemble(source, [], plugin_of, purges, findings, notes, config, skipped, hists)
        frame, restarts = _job_frame(
            source, job_dir, got, tables, plugin_of, purges, options.series_order
        )
        return finish(source, frame, purges, findings, notes, config, skipped, hists, restarts)


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
    """A job's decoded rows (per file frames from :func:`decode_framed`, tags prefixed) -> its
    result: tensor scalars kept once their tag is known as scalars, x kinds, restart segments
    (purges included); ``hists`` (histogram tag -> norm error bound) is handed to read_job's
    per-layer vitals. The incremental reader's way; a whole read builds the same frame from
    column arrays (:func:`_job_frame`)."""
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
    frame = frame.with_columns(
        pl.lit(NAME, dtype=SCHEMA["source"]).alias("source"), _x_kind_expr(frame)
    )
    return finish(source, conform(frame), purges, findings, notes, config, skipped, hists, True)


def finish(
    source: Source,
    frame: pl.DataFrame,
    purges: list[tuple[int, int, int]],
    findings: list[Finding],
    notes: list[str],
    config: dict[str, Any],
    skipped: dict[str, int],
    hists: dict[str, float] | None,
    restarts: bool,
) -> ImportResult:
    """The job's canonical frame -> its result: restart segments (only looked for when
    ``restarts``; else every row is segment 0), findings, notes, metadata."""
    names = [rel(p, source.root) for p in source.files]
    if restarts:
        frame = assign_segments(frame, purges=purges)
        findings.extend(restart_findings(frame))
    else:
        frame = frame.with_columns(pl.lit(0, dtype=pl.Int32).alias("segment"))
    if skipped:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(skipped.items()))
        notes.append(f"TensorBoard records without vital signs were ignored ({kinds})")
    meta: dict[str, Any] = {"tfevents_files": names}
    if hists:  # per-layer vitals are given in read_job (tb_histograms), after canonicalising
        meta[HIST_META] = hists
    return ImportResult(frame=frame, notes=notes, findings=findings, config=config, metadata=meta)


def _job_frame(
    source: Source,
    job_dir: Path,
    got: list[tuple[int, FileRows, TagTable]],
    tables: dict[Path, TagTable],
    plugin_of: dict[str, str],
    purges: list[tuple[int, int, int]],
    series_order: bool = False,
) -> tuple[pl.DataFrame, bool]:
    """The files' column arrays -> the job's canonical frame (every string column built from
    its few distinct values, never per row), and whether restarts may be in it.

    ``series_order`` (ReadOptions): a job that cannot restart hands its rows over tag after
    tag (tags in the order the files first showed them, each tag's rows in record order), as
    the JSONL reader does: the analysis view is then zero-copy slices of the frame. The rows
    are moved here, as plain arrays, each written where it goes block by block
    (:func:`_by_tag`): cheaper than the view's move of the finished frame (its categorical
    columns gathered, the order inverted twice to bound the memory)."""
    # Each folder's tags with the folder's prefix, then one list of distinct names for the job.
    names: dict[str, int] = {}
    remap: dict[int, np.ndarray] = {}
    for folder, table in tables.items():
        final = _prefix_map(table.tags, folder, job_dir)
        remap[id(table)] = np.asarray(
            [names.setdefault(final[t], len(names)) for t in table.tags], dtype=np.uint32
        )
    tags = list(names)

    def column(attr: str) -> np.ndarray:
        parts = [getattr(rows, attr) for _, rows, _ in got]
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    if len(got) == 1 and np.array_equal(remap[id(got[0][2])], np.arange(len(tags))):
        # (polars gathers with unsigned 32-bit indices: the ids as such, no converted copy)
        tag_id = got[0][1].tag.view(np.uint32)
    else:
        tag_id = np.concatenate([remap[id(table)][rows.tag] for _, rows, table in got])
    # New-style tensor scalars without metadata count only once the tag is known as scalars.
    keep: np.ndarray | None = None
    scalar = {t for t, p in plugin_of.items() if p == "scalars"}
    known = np.asarray([t in scalar for t in tags], dtype=bool)
    base = 0
    for _, rows, _ in got:
        drop = rows.tensor[~known[tag_id[base + rows.tensor]]]
        if len(drop):
            keep = np.ones(len(tag_id), dtype=bool) if keep is None else keep
            keep[base + drop] = False
        base += rows.height
    cols = {
        "record_idx": column("rec"),
        "step": column("step"),
        "value": column("value"),
        "wall_time": column("wall"),
    }
    file_ids: np.ndarray | None = None
    if len(got) > 1:
        counts = [rows.height for _, rows, _ in got]
        cols["file_idx"] = np.repeat(np.asarray([i for i, _, _ in got], dtype=np.int32), counts)
        file_ids = np.repeat(np.arange(len(got), dtype=np.uint32), counts)
    if keep is not None:
        cols = {k: v[keep] for k, v in cols.items()}
        tag_id = tag_id[keep]
        if file_ids is not None:
            file_ids = file_ids[keep]
    restarts = _may_restart(cols["step"], cols["wall_time"], tags, purges)
    if series_order and not restarts and len(tag_id) > 1:
        tag_id, file_ids = _by_tag(cols, tag_id, len(tags), file_ids)
    kinds = [x_kind_of(t) for t in tags]
    # Gathers by a Series of the ids (zero-copy): given the numpy array, polars converts it
    # through a wider copy first (about 12 bytes a row more at the peak).
    tag_idx = pl.Series(tag_id)
    frame = pl.DataFrame(cols).with_columns(
        pl.Series("tag", tags, dtype=_CAT).gather(tag_idx),
        pl.lit(NAME, dtype=SCHEMA["source"]).alias("source"),
    )
    if len(got) == 1:
        frame = frame.with_columns(
            pl.lit(got[0][0], dtype=pl.Int32).alias("file_idx"),
            pl.lit(rel(source.files[got[0][0]], source.root), dtype=SCHEMA["file"]).alias("file"),
        )
    else:
        files = [rel(source.files[i], source.root) for i, _, _ in got]
        frame = frame.with_columns(
            pl.Series("file", files, dtype=SCHEMA["file"]).gather(pl.Series(file_ids))
        )
    if len(set(kinds)) == 1:
        frame = frame.with_columns(pl.lit(kinds[0], dtype=_CAT).alias("x_kind"))
    else:
        frame = frame.with_columns(pl.Series("x_kind", kinds, dtype=_CAT).gather(tag_idx))
    del tag_id, tag_idx
    frame = frame.with_columns(
        [pl.lit(None, dtype=SCHEMA[c]).alias(c) for c in ("metric", "layer")]
    ).select([pl.col(c) for c in SCHEMA if c != "segment"])
    return frame, restarts


def _by_tag(
    cols: dict[str, np.ndarray], tag_id: np.ndarray, n_tags: int, file_ids: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The rows put tag after tag (tags in the order of their first row, each tag's rows in
    their order), in place: each column's rows written where they go into one spare array,
    then copied back. In place because the file readers' arrays are the columns (the frame is
    made from them without a copy): the spare is the only new memory the compiled kernel
    (``_group.c``) needs; numpy's path (:func:`_group_numpy`, without a C compiler) adds
    the rows' destinations. Returns the tag ids (``tag_id`` rewritten) and the file ids in
    the new order."""
    totals = np.bincount(tag_id, minlength=n_tags)
    shown = _first_shown(tag_id, n_tags)
    columns = [*cols.values(), *([file_ids] if file_ids is not None else [])]
    spare = np.empty(len(tag_id) * max(c.dtype.itemsize for c in columns), dtype=np.uint8)
    if _group is not None and tag_id.dtype == np.uint32:
        _group.group(tag_id, shown.astype(np.uint32), columns, spare)
    else:
        _group_numpy(tag_id, shown, totals, columns, spare)
    del spare
    at = 0
    for t, c in zip(shown.tolist(), totals[shown].tolist(), strict=True):
        tag_id[at : at + c] = t  # (the ids rewritten in place: no second array of them)
        at += c
    return tag_id, file_ids


def _group_numpy(
    tag_id: np.ndarray,
    shown: np.ndarray,
    totals: np.ndarray,
    columns: list[np.ndarray],
    spare: np.ndarray,
) -> None:
    """:func:`_by_tag`'s move without the kernel: the destinations, then each column scattered
    by them (numpy writes the rows reading the column in order, several times faster than a
    gather from an interleaved column)."""
    dest = _destinations(tag_id, shown, totals)
    for col in columns:
        moved = spare[: col.nbytes].view(col.dtype)
        for a in range(0, len(col), _BLOCK * 2):
            b = a + _BLOCK * 2
            moved[dest[a:b].astype(np.intp)] = col[a:b]
        col[:] = moved


_BLOCK = 1 << 16  # rows placed at a time (their keys and slots stay in the cache)


def _first_shown(tag_id: np.ndarray, n_tags: int) -> np.ndarray:
    """The tag ids in the order of their first row (ids with no row last)."""
    n = len(tag_id)
    first = np.full(n_tags, n, dtype=np.int64)
    for a in range(((n - 1) // _BLOCK) * _BLOCK, -1, -_BLOCK):  # the blocks from the last
        block = tag_id[a : a + _BLOCK]
        # (each id's earliest row written last: numpy assigns repeated indices in order)
        first[block[::-1]] = np.arange(a + len(block) - 1, a - 1, -1)
    return np.argsort(first, kind="stable")


def _destinations(tag_id: np.ndarray, shown: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Where each row goes when the rows are put tag after tag in the order ``shown``, each
    tag's rows in their order (the inverse of a stable argsort by the tag's place in
    ``shown``), block by block: a block's rows sorted by that place go after the earlier
    blocks' rows of the same tag. ``totals``: the rows of each tag id."""
    n, n_tags = len(tag_id), len(shown)
    out = np.empty(n, dtype=np.uint32 if n < 1 << 32 else np.int64)
    key = np.uint16 if n_tags <= 1 << 16 else np.uint32  # (numpy radix-sorts 16-bit keys)
    place = np.empty(n_tags, dtype=key)
    place[shown] = np.arange(n_tags, dtype=key)
    per_place = totals[shown]
    free = np.concatenate(([0], np.cumsum(per_place)[:-1])).astype(np.int64)
    for a in range(0, n, _BLOCK):
        r = place[tag_id[a : a + _BLOCK]]
        o = np.argsort(r, kind="stable")
        c = np.bincount(r, minlength=n_tags)
        first = np.concatenate(([0], np.cumsum(c)[:-1]))
        slot = np.repeat(free - first, c)  # the block's k-th row in that order goes to slot + k
        slot += np.arange(len(r))
        out[o + a] = slot
        free += c
    return out


def _may_restart(
    steps: np.ndarray,
    w: np.ndarray,
    tags: list[str],
    purges: list,  # noqa: ANN001
) -> bool:
    """False when :func:`assign_segments` could find nothing: no purge, no counter tag, steps
    that never go back in record order (so no tag's do), wall times that are not a relative
    clock. Then every row is segment 0 and the per-tag search is not needed."""
    if purges or counter_tags(tags):
        return True
    if len(steps) > 1 and not bool(np.all(steps[1:] >= steps[:-1])):
        return True
    top = float(np.max(w)) if len(w) else math.nan
    if not math.isfinite(top):  # NaN or inf somewhere: the relative-clock test exactly
        ok = w[np.isfinite(w) & (w >= 0)]
        return len(ok) > 1 and float(ok.max()) < RELATIVE_CLOCK
    return len(w) > 1 and top < RELATIVE_CLOCK and int(np.sum(w >= 0)) > 1


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
    if fast.has_meta.any():
        for t in np.flatnonzero(np.bincount(fast.tag_id[fast.has_meta])).tolist():
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


def _prefix_tags(frame: pl.DataFrame, folder: Path, job_dir: Path) -> pl.DataFrame:
    """Tags of a sub-folder get its path as a prefix (see :func:`_prefix_map`)."""
    if folder == job_dir:
        return frame
    tags = frame.get_column("tag").unique().to_list()
    mapping = _prefix_map(tags, folder, job_dir)
    return frame.with_columns(pl.col("tag").replace_strict(mapping, return_dtype=_CAT))


def _prefix_map(tags: list[str], folder: Path, job_dir: Path) -> dict[str, str]:
    """Tag -> its name in the job: tags of a sub-folder get its path as a prefix; add_scalars
    folders become <main>/<key> (tensorboardX writes them to ``<main>/<key>/``, torch to
    ``<main with _>_<key>/``)."""
    if folder == job_dir:
        return {t: t for t in tags}
    try:
        sub = folder.relative_to(job_dir).as_posix()
    except ValueError:
        return {t: t for t in tags}
    mapping: dict[str, str] = {}
    for tag in tags:
        stem = tag.replace("/", "_") + "_"
        if sub.startswith(tag + "/"):  # tensorboardX add_scalars: <main>/<key>/
            mapping[tag] = sub
        elif (
            "/" not in sub and sub.startswith(stem) and len(sub) > len(stem)
        ):  # torch: <main>_<key>/
            mapping[tag] = f"{tag}/{sub[len(stem) :]}"
        else:
            mapping[tag] = f"{sub}/{tag}"
    return mapping


def _prefixed(hist: dict[str, float], folder: Path, job_dir: Path) -> dict[str, float]:
    """Histogram tags named as their stat series are (the sub-folder prefix of _prefix_tags)."""
    if not hist or folder == job_dir:
        return hist
    tags = pl.DataFrame({"tag": list(hist)}, schema={"tag": pl.Utf8})
    new = _prefix_tags(tags, folder, job_dir).get_column("tag").to_list()
    return dict(zip(new, hist.values(), strict=True))


IMPORTER = TfeventsImporter()
