"""The run cache: a parsed run kept in the user cache folder, keyed by its files.

A second ``analyze``, ``compare``, ``export`` or a ``watch`` restart on an unchanged run reads
the canonical frame back instead of re-parsing the logs. The key covers what the read
depends on: the importer and files of every source with each file's size and modification
time (nanoseconds), the read options, and the forensics code that turns files into frames
(the size and modification time of the importer modules), so a changed log file or a new
importer gives a new entry. Entries live under ``$FORENSICS_CACHE_DIR``, else
``$XDG_CACHE_HOME/forensics/runs``, else ``~/.cache/forensics/runs``, never inside the run
folder (it is evidence: a cache that would land there is not written).

An entry is laid out for a cheap read back (see :func:`_layout`): a column holding one value
is stored as that value (rebuilt as a polars literal column, nothing allocated per row);
numeric columns without nulls as raw ``.npy`` arrays that are memory-mapped, not decoded
(polars takes numpy's buffer without a copy); a column of few distinct values (the tags,
the metrics, the nullable layer) as those values and a raw array of one- or two-byte codes
into them, rebuilt by one gather (decoding them from Parquet was a third of a small run's
cached read); the rest in one Parquet file. A run whose plain arrays would crowd the cache
(over a quarter of the cap) is kept with the exact compact encodings of
:mod:`forensics.cache_codecs` (steps as runs of a stride, record indices as small
differences, float32 values as float32, tag, metric and layer as one code a row: a 10M-step
event-file run in 1.09 GB instead of 2.3 GB), rebuilt in a pass or two over memory; only a run
whose compact arrays would not fit the cap (:data:`COMPACT_SHARE`) keeps every column in
the compressed Parquet file, which reads back slowest.

``FORENSICS_NO_CACHE=1`` (or ``--no-cache``, ``ReadOptions(cache=False)``) turns it off;
``FORENSICS_CACHE_MAX_MB`` caps the folder (default 2048): the least recently used entries
go first, and a run larger than the cap is not kept.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import polars as pl

    from forensics.importers.base import ReadOptions, Source
    from forensics.run import Run

FORMAT = 7  # bump when the entry layout, the Run fields or the frame's dtypes change
DEFAULT_MAX_MB = 2048
_REST = "frame.parquet"  # the columns neither constant, raw nor coded
_META = "run.pickle"
# Raw arrays are kept while they take at most this share of the cap, and always below this
# size (a small run is never compressed because of a small cap).
RAW_SHARE = 0.25
RAW_MIN_BYTES = 64 * 2**20
# Past that share, the compact encodings (forensics.cache_codecs) are kept while they fit
# this share of the cap: the whole of it, as a Parquet entry may take (their bytes are mostly
# values, which lz4 hardly shrinks, and they read back several times faster); a run whose
# compact arrays would not fit is tried as Parquet.
COMPACT_SHARE = 1.0
_CODES = "codes.npy"  # the joint codes of the few-valued columns in a compact entry


def enabled(options: ReadOptions | None = None) -> bool:
    if os.environ.get("FORENSICS_NO_CACHE", "").strip() not in ("", "0"):
        return False
    return options is None or getattr(options, "cache", True)


def max_bytes() -> int:
    try:
        mb = float(os.environ.get("FORENSICS_CACHE_MAX_MB", DEFAULT_MAX_MB))
    except ValueError:
        mb = DEFAULT_MAX_MB
    return int(mb * 1024 * 1024)


def cache_dir() -> Path:
    """The folder entries live in (not created here)."""
    explicit = os.environ.get("FORENSICS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "forensics" / "runs"
    try:
        return Path.home() / ".cache" / "forensics" / "runs"
    except RuntimeError:  # no HOME and no passwd entry
        uid = os.getuid() if hasattr(os, "getuid") else 0
        return Path(tempfile.gettempdir()) / f"forensics-{uid}" / "runs"


@lru_cache(maxsize=1)
def _code_fingerprint() -> tuple[tuple[str, int, int], ...]:
    """Size and mtime of the modules that turn files into the canonical frame. Once per
    process: the code a process runs is the code it loaded (the walk over the importers'
    files cost about a third of a small run's cached read)."""
    import forensics

    pkg = Path(forensics.__file__).parent
    mods = [pkg / "schema.py", pkg / "run.py", pkg / "cache.py", pkg / "cache_codecs.py"]
    mods += [pkg / "findings.py"]
    mods += sorted((pkg / "importers").rglob("*.py"))
    out = []
    for m in mods:
        try:
            st = m.stat()
        except OSError:
            continue
        out.append((m.name, st.st_size, st.st_mtime_ns))
    return tuple(out)


# A file modified this recently may change again within one tick of the file system's
# clock, keeping its size and time stamp (git's "racily clean" problem), and a live run is
# still being written: such reads are not stored.
SETTLE_NS = 2_000_000_000


def key(
    path: Path, job: str, sources: list[Source], options: ReadOptions, only_job: bool
) -> tuple[str, bool] | None:
    """The entry name for this read and whether it may be stored (every file settled), or
    None when a file cannot be stat'ed."""
    import forensics

    files: list[Any] = []
    newest = 0
    try:
        for s in sources:
            stats, last = _file_stats([*s.files, *s.options.get("also_claims", [])])
            newest = max(newest, last)
            opts = {k: v for k, v in s.options.items() if k != "also_claims"}
            files.append(
                (s.importer, s.job, str(s.root), s.scope, repr(sorted(opts.items())), stats)
            )
    except OSError:
        return None
    parts = (
        FORMAT,
        forensics.__version__,
        _code_fingerprint(),
        str(Path(path).resolve()),
        job,
        only_job,
        bool(options.verify_crc),
        sorted(options.aliases.items()),
        options.batch_size,
        options.series_order,  # (the same rows in another order: export reads in line order)
        files,
    )
    settled = time.time_ns() - newest > SETTLE_NS
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:40], settled


def _file_stats(files: list[Path]) -> tuple[list[tuple[str, int, int, int]], int]:
    """Each file's (name, size, modification time, inode) and the newest time (OSError when a
    file cannot be stat'ed)."""
    stats = []
    newest = 0
    for f in files:
        st = os.stat(f)
        stats.append((str(f), st.st_size, st.st_mtime_ns, st.st_ino))
        newest = max(newest, st.st_mtime_ns)
    return stats, newest


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.resolve().relative_to(parent.resolve())
        return True
    except (ValueError, OSError):
        return False


def _usable_dir(run_path: Path) -> Path | None:
    d = cache_dir()
    evidence = run_path if run_path.is_dir() else run_path.parent
    if _inside(d, evidence):
        return None  # the cache would write into the run folder: never
    return d


def load(entry: str, run_path: Path) -> Run | None:
    """The cached Run, or None (absent, unreadable or from another layout)."""
    d = _usable_dir(run_path)
    if d is None:
        return None
    folder = d / entry
    try:
        with open(folder / _META, "rb") as fh:
            meta = pickle.load(fh)  # noqa: S301 - the user's own cache folder, written by us
        if meta.get("format") != FORMAT:
            return None
        frame = _read_frame(folder, meta["frame"])
        if frame is None:
            return None
        os.utime(folder)  # least recently used goes first when the cap is reached
    except Exception:  # noqa: BLE001 - a damaged entry is a miss, never an error
        return None
    from forensics.run import Run

    return Run(**meta["run"], frame=frame)  # (no empty default frame made and replaced)


def _read_frame(folder: Path, layout: dict[str, Any]) -> pl.DataFrame | None:
    """The frame an entry holds, or None when a part does not match its description."""
    import polars as pl

    height: int = layout["height"]
    schema: dict[str, pl.DataType] = layout["schema"]
    kept: dict[str, pl.Series] = {}
    if any(kind == "rest" for kind, _ in layout["columns"].values()):
        rest = pl.read_parquet(folder / _REST)
        kept.update((c, rest.get_column(c)) for c in rest.columns)
    # Coded columns are looked up eagerly (``values[codes]``, one gather each): as
    # expressions in the select that builds the frame they were a tenth of a millisecond
    # each, a fifth of a small run's cached read for its three coded columns.
    joint = None
    if layout.get("joint") is not None:
        code_kind, code_offset = layout["joint"]
        joint = _mapped(folder / _CODES, code_kind, code_offset, height)
        if joint is None:
            return None
    for name, (kind, dtype) in layout["columns"].items():
        if kind == "raw":
            kind_str, offset = dtype
            arr = _mapped(folder / f"{name}.npy", kind_str, offset, height)
            if arr is None:
                return None
            kept[name] = pl.Series(name, arr)  # numpy's buffer, not a copy
        elif kind == "joint":
            (values,) = dtype
            kept[name] = _looked_up(values, joint, name)
        elif kind in _COMPACT_KINDS:
            got = _decoded(folder, name, kind, dtype, height, schema[name])
            if got is None:
                return None
            kept[name] = got
        elif kind == "coded":
            values, (kind_str, offset) = dtype
            codes = _mapped(folder / f"{name}.npy", kind_str, offset, height)
            if codes is None:
                return None
            kept[name] = _looked_up(values, codes, name)
    consts = {c: v for c, (kind, v) in layout["columns"].items() if kind == "const"}
    if height <= _CONST_ROWS:
        # A small run's constant columns made whole: a select of literals took a third of
        # its cached read.
        kept.update(
            (c, pl.Series(c, [v], dtype=schema[c]).new_from_index(0, height))
            for c, v in consts.items()
        )
        frame = pl.DataFrame([kept[c] for c in layout["columns"]])
    else:  # literal columns: polars keeps one value, not one per row
        frame = pl.DataFrame(list(kept.values())).select(
            pl.lit(consts[c], dtype=schema[c]).alias(c) if c in consts else pl.col(c)
            for c in layout["columns"]
        )
    if (
        frame.height != height
        or frame.columns != list(schema)
        or frame.dtypes != [*schema.values()]
    ):
        return None
    return frame


_CONST_ROWS = 1 << 20  # rows up to which a cached read makes its constant columns whole


def _looked_up(values: pl.Series, codes: np.ndarray | None, name: str) -> pl.Series:
    """Each row's value from its code (a code past the values raises polars'
    OutOfBoundsError: a miss, as :func:`load` catches it)."""
    import polars as pl

    return values[pl.Series(codes)].alias(name)


_COMPACT_KINDS = ("float32", "ramps", "deltas", "joint")


def _decoded(
    folder: Path, name: str, kind: str, payload: Any, height: int, dtype: pl.DataType
) -> pl.Series | None:
    """A column kept by one of :mod:`forensics.cache_codecs`' encodings (not the joint codes,
    gathered by :func:`_read_frame`), rebuilt."""
    import numpy as np
    import polars as pl

    from forensics import cache_codecs as codecs

    target = np.dtype(pl.Series([], dtype=dtype).to_numpy().dtype)
    if kind == "ramps":
        (pieces,) = payload
        return pl.Series(name, codecs.from_ramps(pieces, height, target))
    kind_str, offset = payload[-1]
    arr = _mapped(folder / f"{name}.npy", kind_str, offset, height)
    if arr is None:
        return None
    if kind == "float32":
        return pl.Series(name, codecs.from_float32(arr))
    rows, firsts, first = payload[:3]
    return pl.Series(name, codecs.from_deltas(arr, rows, firsts, first, target))


def _compact(
    frame: pl.DataFrame, layout: dict[str, tuple[str, Any]], cap: int
) -> tuple[dict[str, tuple[str, Any, np.ndarray | None]], Any] | None:
    """The compact encodings of the columns ``_layout`` marked for them: for each, its kind,
    what the metadata keeps and the array its file keeps (or None), and the joint codes of
    the few-valued columns (codes and values) or None; None when they would still take more
    than :data:`COMPACT_SHARE` of the cap."""
    import numpy as np

    from forensics import cache_codecs as codecs

    n = frame.height
    limit = max(64, n >> 12)  # runs or large jumps a column may have (each costs a slice)
    out: dict[str, tuple[str, Any, np.ndarray | None]] = {}
    size = 0
    for name, (kind, _) in layout.items():
        if kind != "compact":
            continue
        a = frame.get_column(name).to_numpy()
        if frame.schema[name].is_float():
            f32 = codecs.as_float32(a)
            if f32 is not None:
                out[name] = ("float32", None, f32)
                size += f32.nbytes
                continue
        else:
            pieces = codecs.ramps(a, limit)
            if pieces is not None:
                out[name] = ("ramps", (pieces,), None)
                size += pieces.nbytes
                continue
            small = codecs.deltas(a, limit, np.int8) or codecs.deltas(a, limit, np.int16)
            if small is not None:
                d, rows, firsts = small
                out[name] = ("deltas", (rows, firsts, int(a[0])), d)
                size += d.nbytes
                continue
        out[name] = ("raw", None, a)
        size += a.nbytes
    coded = {}
    for name, (kind, _) in layout.items():
        if kind == "compact_coded":
            got = _coded(frame.get_column(name))
            if got is not None:  # (else the column is kept in the Parquet file)
                coded[name] = got
    joint = codecs.joint_codes(coded, _MAX_CODES) if coded else None
    if coded and joint is None:  # (too many combinations: each column its own codes)
        for name, (own, codes) in coded.items():
            out[name] = ("coded", (own,), codes)
            size += codes.nbytes
    if joint is not None:
        shared, each = joint
        size += shared.nbytes
        out.update((c, ("joint", (each[c],), None)) for c in coded)
    if size > COMPACT_SHARE * cap:
        return None
    return out, joint


def _mapped(path: Path, kind: str, offset: int, height: int) -> np.ndarray | None:
    """The ``height`` values of type ``kind`` from ``offset`` on in a ``.npy`` file, mapped
    copy-on-write (the file is never written, whatever polars does with the buffer); None when
    the file's size does not match.

    The type and where the data starts were noted when the file was written, so the header is
    not parsed again (np.load reads it with ast: a tenth of a small run's cached read), and
    the map is made by ``mmap`` itself: ``np.memmap`` resolves the path and checks its
    arguments in Python, a quarter of a 10k-step run's cached read over its seven columns.
    """
    import mmap

    import numpy as np

    item = np.dtype(kind)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        if os.fstat(fd).st_size != offset + height * item.itemsize:
            return None
        buf = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)  # (the map outlives the descriptor)
    finally:
        os.close(fd)
    return np.frombuffer(buf, dtype=item, count=height, offset=offset)


def _layout(frame: pl.DataFrame, cap: int) -> dict[str, tuple[str, Any]]:
    """How each column is kept: ``("const", value)``, ``("raw", None)`` (a ``.npy`` file),
    ``("coded", None)`` (its distinct values and a ``.npy`` file of codes, :func:`_coded`),
    ``("rest", None)`` (in the Parquet file), or for a run whose plain arrays would crowd
    the cache ``("compact", None)`` / ``("compact_coded", None)`` (:func:`_compact` decides)."""
    n = frame.height
    out: dict[str, tuple[str, Any]] = {}
    numeric = []
    for name, dtype in frame.schema.items():
        s = frame.get_column(name)
        nulls = s.null_count()
        if n and not dtype.is_float():  # floats: 0.0 and -0.0, NaNs are told apart raw only
            if nulls == n:
                out[name] = ("const", None)
                continue
            if nulls == 0 and _one_value(s):
                out[name] = ("const", s[0])
                continue
        if n and nulls == 0 and (dtype.is_integer() or dtype.is_float()):
            numeric.append(name)
        out[name] = ("rest", None)
    # (not floats: their distinct values would merge 0.0 and -0.0, and NaNs)
    few = [
        c
        for c, (kind, _) in out.items()
        if kind == "rest" and c not in numeric and not frame.schema[c].is_float()
    ]
    # (those of too many values are told by _coded, which finds them anyway, and kept in
    # the Parquet file: counting every column's distinct values first took as long again)
    raw_bytes = sum(n * _itemsize(frame.schema[c]) for c in numeric) + n * 2 * len(few)
    # Plain arrays while they are small; past that, the compact encodings are tried (store
    # falls back to Parquet when even they would crowd the cache).
    plain = raw_bytes <= max(RAW_SHARE * cap, RAW_MIN_BYTES)
    for name in numeric:
        out[name] = ("raw" if plain else "compact", None)
    for name in few:
        out[name] = ("coded" if plain else "compact_coded", None)
    if all(kind == "const" for kind, _ in out.values()):  # something must carry the height
        first = frame.columns[0]
        out[first] = ("rest", None)
    return out


def _one_value(s: pl.Series) -> bool:
    """Does a column without nulls hold one value only? For integers and categories by
    their smallest and largest (physical) value: counting the distinct values of a step
    column hashed every row, a quarter of the time a large run's entry took to write."""
    phys = s.to_physical()
    if phys.dtype.is_integer():
        return bool(phys.min() == phys.max())
    return s.n_unique() == 1


_MAX_CODES = 1 << 16  # distinct values a coded column may have (two-byte codes)
_MAX_SPAN = 1 << 22  # physical values a code table may span (4 MiB of two-byte codes)


def _coded(s: pl.Series) -> tuple[pl.Series, np.ndarray] | None:
    """A column as its distinct values (nulls included, in first-seen order) and each row's
    code into them (``uint8`` or ``uint16``); None for a column whose physical values are not
    integers spanning under :data:`_MAX_SPAN`, or when the codes would not give it back
    exactly."""
    import numpy as np
    import polars as pl

    ints = {
        pl.Int8: np.int8,
        pl.Int16: np.int16,
        pl.Int32: np.int32,
        pl.Int64: np.int64,
        pl.UInt8: np.uint8,
        pl.UInt16: np.uint16,
        pl.UInt32: np.uint32,
    }
    values = s.unique(maintain_order=True)
    phys, vphys = s.to_physical(), values.to_physical()  # (a categorical's category ids)
    lo, hi = phys.min(), phys.max()
    if (
        len(values) > _MAX_CODES
        or not any(phys.dtype == d for d in ints)
        or lo is None
        or int(hi) - int(lo) >= _MAX_SPAN  # type: ignore[arg-type]
        or int(hi) >= 1 << 62  # type: ignore[arg-type]  # (a null's code goes one past it)
    ):
        return None  # (kept in the Parquet file)
    # A table from each physical value (a null as one past the largest) to its code: one
    # lookup a row (a hash join of the column on its values took 0.1 s for 7M rows).
    code_type = np.uint8 if len(values) <= 256 else np.uint16
    lo, top = int(lo), int(hi) + 1  # type: ignore[arg-type]
    table = np.zeros(top - lo + 1, dtype=code_type)
    keys = vphys.cast(pl.Int64).fill_null(top).to_numpy() - lo  # (each value's, small)
    table[keys] = np.arange(len(values))
    # The rows' physical values in their own width (a null as ``top`` where it fits),
    # looked up block by block: whole-length int64 copies of a 73M-row column were 1.2 GB
    # of new pages and most of the time a 10M-step run's entry took to write.
    if phys.null_count():
        own = next(t for d, t in ints.items() if phys.dtype == d)
        fits = top <= int(np.iinfo(own).max)  # type: ignore[type-var]
        phys = (phys if fits else phys.cast(pl.Int64)).fill_null(top)
    rows = phys.to_numpy()
    arr = np.empty(len(rows), dtype=code_type)
    for i in range(0, len(rows), _CODE_BLOCK):
        blk = rows[i : i + _CODE_BLOCK].astype(np.int64) - lo
        got = table[blk]
        # Exact by construction; checked all the same, on the physical values (the values'
        # own type is the column's): each row's code must name the value it holds.
        if not np.array_equal(keys[got], blk):
            return None
        arr[i : i + _CODE_BLOCK] = got
    return values, arr


_CODE_BLOCK = 1 << 20  # rows coded at a time


def _itemsize(dtype: pl.DataType) -> int:
    import polars as pl

    return int(pl.Series([], dtype=dtype).to_numpy().dtype.itemsize)


def store(entry: str, run: Run, run_path: Path) -> None:
    """Keep the run (best effort: a full disk or a read-only cache folder only costs speed)."""
    d = _usable_dir(run_path)
    if d is None:
        return
    cap = max_bytes()
    frame = run.frame
    if frame.estimated_size() > 4 * cap:  # certainly too large even compressed
        return
    tmp: Path | None = None
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=d))
        layout = _layout(frame, cap)
        columns: dict[str, tuple[str, Any]] = {}
        rest = []
        joint: Any = None
        encoded: dict[str, tuple[str, Any, np.ndarray | None]] = {}
        if any(kind.startswith("compact") for kind, _ in layout.values()):
            # (None: even compact it would crowd the cache, so those columns go to Parquet)
            compact = _compact(frame, layout, cap)
            if compact is not None:
                encoded, shared = compact
                if shared is not None:
                    joint = _saved(tmp / _CODES, shared[0])
            for name, (kind, payload, arr) in encoded.items():
                if arr is not None:
                    where = _saved(tmp / f"{name}.npy", arr)
                    payload = (*payload, where) if payload is not None else (where,)
                columns[name] = ("raw", where) if kind == "raw" else (kind, payload)
            layout = {
                c: (("rest", None) if k.startswith("compact") else (k, v))
                for c, (k, v) in layout.items()
                if c not in encoded
            }
            del encoded, compact
        for name, (kind, value) in layout.items():
            coded = _coded(frame.get_column(name)) if kind == "coded" else None
            if kind == "raw":
                columns[name] = (
                    "raw",
                    _saved(tmp / f"{name}.npy", frame.get_column(name).to_numpy()),
                )
            elif coded is not None:
                values, codes = coded
                columns[name] = ("coded", (values, _saved(tmp / f"{name}.npy", codes)))
                del codes
            elif kind == "coded":  # (codes that do not give it back: kept in the Parquet file)
                columns[name] = ("rest", None)
                rest.append(name)
            else:
                columns[name] = (kind, value)
                if kind == "rest":
                    rest.append(name)
        if rest:
            frame.select(rest).write_parquet(tmp / _REST, compression="lz4", statistics=False)
        meta = {
            "format": FORMAT,
            "frame": {
                "height": frame.height,
                "schema": dict(frame.schema),
                "columns": {c: columns[c] for c in frame.columns},
                "joint": joint,
            },
            "run": {
                "name": run.name,
                "path": run.path,
                "format": run.format,
                "notes": list(run.notes),
                "import_findings": list(run.import_findings),
                "config": dict(run.config),
                "metadata": dict(run.metadata),
            },
        }
        with open(tmp / _META, "wb") as fh:
            pickle.dump(meta, fh, protocol=pickle.HIGHEST_PROTOCOL)
        size = _size(tmp)
        if size > cap:
            shutil.rmtree(tmp, ignore_errors=True)
            return
        target = d / entry
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
        tmp = None
        _evict(d, cap, keep=target)
    except Exception:  # noqa: BLE001 - caching is an optimisation, never a failure
        pass
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _saved(npy: Path, arr: np.ndarray) -> tuple[str, int]:
    """Write ``arr`` as a .npy file; its type and where its bytes start, for :func:`_mapped`."""
    import numpy as np

    np.save(npy, arr, allow_pickle=False)
    return arr.dtype.str, _data_offset(npy)


def _data_offset(npy: Path) -> int:
    """Where the array's bytes start in a .npy file: the format's 6-byte magic string and
    2-byte version, then the header's length (2 bytes little-endian in version 1, 4 bytes
    in versions 2 and 3) and the header."""
    with open(npy, "rb") as fh:
        head = fh.read(12)
    if head[:6] != b"\x93NUMPY":
        raise ValueError(f"{npy}: not a .npy file")
    if head[6] == 1:
        return 10 + int.from_bytes(head[8:10], "little")
    return 12 + int.from_bytes(head[8:12], "little")


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def _evict(d: Path, cap: int, keep: Path) -> None:
    """Remove least recently used entries until the folder fits the cap."""
    entries = []
    for e in d.iterdir():
        if not e.is_dir():
            continue
        if e.name.startswith(".tmp-"):
            if time.time() - e.stat().st_mtime > 3600:  # a crashed writer's leftovers
                shutil.rmtree(e, ignore_errors=True)
            continue
        entries.append((e.stat().st_mtime, _size(e), e))
    total = sum(s for _, s, _ in entries)
    for _, s, e in sorted(entries, key=lambda t: t[0]):
        if total <= cap:
            break
        if e == keep:
            continue
        shutil.rmtree(e, ignore_errors=True)
        total -= s


def clear() -> None:
    """Remove every entry."""
    shutil.rmtree(cache_dir(), ignore_errors=True)


# -- the discovery memo ---------------------------------------------------------------------
# Which importer claims which files is decided by sniffing their contents (a text log's
# families each search the first and last 256 kB): about 8 ms for a trainer's text log,
# most of a cached read of a small run. The answer for an unchanged listing (every file's
# name, size, modification time and inode, and the same importer code) is kept beside the
# entries, in one small file per listing.
_DISCOVERY = ".discovery"  # (a dot: not an entry; evicted as one when least recently used)


def discovery_key(path: Path, files: list[Path]) -> tuple[str, bool] | None:
    """The memo's name for this listing and whether it may be stored (every file settled),
    or None when a file cannot be stat'ed."""
    import forensics

    try:
        stats, newest = _file_stats(files)
        where = str(Path(path).resolve())
    except OSError:
        return None
    parts = (FORMAT, forensics.__version__, _code_fingerprint(), where, Path(path).is_file(), stats)
    settled = time.time_ns() - newest > SETTLE_NS
    return "d" + hashlib.sha256(repr(parts).encode()).hexdigest()[:40], settled


def load_discovery(name: str, run_path: Path) -> Any | None:
    """The memo's discovery (as :func:`~forensics.importers.discover_jobs` returned it), or
    None (absent or unreadable)."""
    d = _usable_dir(run_path)
    if d is None:
        return None
    try:
        with open(d / _DISCOVERY / name, "rb") as fh:
            return pickle.load(fh)  # noqa: S301 - the user's own cache folder, written by us
    except Exception:  # noqa: BLE001 - a damaged memo is a miss, never an error
        return None


def store_discovery(name: str, jobs: Any, run_path: Path) -> None:
    """Keep a discovery (best effort, written whole or not at all)."""
    d = _usable_dir(run_path)
    if d is None:
        return
    from forensics.atomic import write_atomic

    folder = d / _DISCOVERY
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(folder / name, pickle.dumps(jobs, protocol=pickle.HIGHEST_PROTOCOL))
        os.utime(folder)  # (the eviction's least recently used order)
    except Exception:  # noqa: BLE001 - caching is an optimisation, never a failure
        pass
