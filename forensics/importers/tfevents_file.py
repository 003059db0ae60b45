"""One TensorBoard event file read a block at a time: framing, CRCs, damage, decoding.

The file is memory-mapped and walked in blocks of :data:`CHUNK` bytes (a record that does not
fit is the start of the next block). Each block's records are framed and length-checked
(:mod:`tfevents_scan`), the common scalar records decoded straight into column arrays, and
the block's pages released, so the reader's memory is its output plus one block, whatever the
file's size. Records of other shapes (histograms, hparams, purge marks, TF2 tensors ...) are
only noted; they are decoded with protobuf once the whole file has been walked, in record
order, after every ``scalars`` tag of the fast records is known: exactly the order a
whole-file decode takes, so a tag's plugin is known to them as it would be.

Damage: a cut-off last record (a killed job) yields every complete record and a
``truncated_log`` finding; a crash's zero-filled last block likewise; corrupt framing before
the end is a one-line error.
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import numpy as np

from forensics.errors import UnreadableInputError
from forensics.findings import Finding, FindingKind, Severity
from forensics.importers.tfevents_proto import ProtoRows, decode_records
from forensics.importers.tfevents_scan import (
    PAD,
    FastRows,
    TagTable,
    WalkState,
    crc32c_py,
    decode_fast,
    header_ok,
    length_crc_ok,
    masked,
    walk,
)

MAX_RECORD = 1 << 30  # a length beyond this is corruption, not data
CHUNK = 1 << 22  # bytes framed and decoded at a time
REC32_BYTES = 16 << 31  # a smaller file holds under 2^31 records (16 bytes each at least)


def any_crc():  # noqa: ANN201
    """The crc32c package when installed, else the pure-Python CRC (one record's worth)."""
    try:
        import crc32c

        return crc32c.crc32c
    except ImportError:
        return crc32c_py


class FileRows:
    """What one event file gave: rows in record order (then value order within a record) as
    column arrays, ``tag`` indexing the folder's :class:`TagTable`, and everything else."""

    def __init__(self) -> None:
        self.rec = np.zeros(0, dtype=np.int64)
        self.step = np.zeros(0, dtype=np.int64)
        self.value = np.zeros(0, dtype=np.float64)
        self.wall = np.zeros(0, dtype=np.float64)
        self.tag = np.zeros(0, dtype=np.int32)
        self.tensor = np.zeros(0, dtype=np.int64)  # rows of tensor scalars without metadata
        self.purges: list[tuple[int, int]] = []
        self.hparams: dict[str, Any] = {}
        self.skipped: dict[str, int] = {}
        self.hist: dict[str, float] = {}
        self.bad_crc = 0
        self.cut_bytes = 0
        self.zero_tail = False
        self.last_step: int | None = None
        self.records = 0

    @property
    def height(self) -> int:
        return len(self.rec)


def read_event_file(
    path: Path,
    plugin_of: dict[str, str],
    crc,
    table: TagTable,  # noqa: ANN001
) -> FileRows:
    """Read one event file (see the module docstring); ``plugin_of`` (tag -> plugin) is
    shared by the job's files, ``crc`` checks every record's data when given."""
    out = FileRows()
    try:
        buf = _map(path)
    except OSError as exc:
        raise UnreadableInputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        _read(path, buf, out, plugin_of, crc, table)
    finally:
        if isinstance(buf, mmap.mmap):
            try:
                buf.close()
            except BufferError:  # a view still alive somewhere: the mapping goes with it
                pass
    return out


def _read(path: Path, buf, out: FileRows, plugin_of: dict[str, str], crc, table: TagTable) -> None:  # noqa: ANN001
    n = len(buf)
    if n == 0:
        return
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
    # A crash can leave the last block zero-filled from the middle of a record: the record
    # the zeros begin in was being written, not corrupted. It is dropped when its data CRC
    # fails (at most one record reaches into the trailing zero run).
    z = _zero_run_start(a, path)
    # Record numbers in 32 bits when the file cannot hold more records (each takes at least
    # 16 bytes): the frame's record_idx is 32-bit, and a 64-bit column would be held beside
    # its narrowed copy until the reader's frame is dropped (28 MiB for 7M rows).
    cols = _Columns(np.int32 if n < REC32_BYTES else np.int64)
    tensor: list[np.ndarray] = []
    rest: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # left to protobuf: (start,
    # end, record index) of the records
    meta: set[int] = set()  # tag ids a fast record declares "scalars"
    pos = rec0 = end = 0
    span = CHUNK
    state = WalkState()
    while True:
        hi = min(n, pos + span)
        fr = walk(a[pos:hi], MAX_RECORD, state=state)
        if hi < n and fr.stop in ("eof", "short"):
            if not len(fr.offs):  # a record longer than the block: a longer block
                need = int.from_bytes(buf[pos : pos + 8], "little") + 16 if pos + 8 <= n else 0
                span = max(2 * span, need)
                continue
            last = False
        else:
            last = True
        span = CHUNK
        good = length_crc_ok(a[pos:hi], fr.offs, fr.lens)
        k = len(good) if good.all() else int(np.argmin(good))
        stop = fr.stop if k == len(good) else "bad_crc"
        while k and z < n and pos + int(fr.offs[k - 1] + fr.lens[k - 1] + 16) > z:
            o, ln = pos + int(fr.offs[k - 1]), int(fr.lens[k - 1])
            stored = int.from_bytes(buf[o + 12 + ln : o + 16 + ln], "little")
            if masked(any_crc()(buf[o + 12 : o + 12 + ln])) == stored:
                break  # a complete record whose last bytes happen to be zeros
            k, stop = k - 1, "bad_crc"
        walked_more = k < len(fr.offs)
        offs, lens = fr.offs[:k], fr.lens[:k]
        if k:
            keep = _data_crc_ok(buf, pos, offs, lens, crc)
            out.bad_crc += int(k - keep.sum()) if keep is not None else 0
            fast = decode_fast(a[pos : min(n, hi + PAD)], offs, lens, table)
            if fast.has_meta.any():
                meta.update(np.flatnonzero(np.bincount(fast.tag_id[fast.has_meta])).tolist())
            sel = keep[fast.rec] if keep is not None else None
            unmatched = ~fast.matched if keep is None else ~fast.matched & keep
            left = np.flatnonzero(unmatched)
            if len(left):
                start = pos + offs[left] + 12
                rest.append((start, start + lens[left], rec0 + left))
            tens = fast.is_tensor & ~fast.has_meta
            if tens.any():
                tensor.append(cols.n + np.flatnonzero(tens if sel is None else tens[sel]))
            # The file's rows, extrapolated from the share of it read so far.
            m = len(fast.rec) if sel is None else int(sel.sum())
            expect = int((cols.n + m) * n / (pos + int(offs[-1] + lens[-1] + 16)) * 1.02) + 64
            cols.put(fast, rec0, sel, m, expect)
            rec0 += k
            end = pos + int(offs[-1] + lens[-1] + 16)
        if last or walked_more or fr.stop in ("zero", "huge"):
            break
        _release(buf, pos, pos + fr.end)
        pos += fr.end
    out.records = rec0
    if walked_more or fr.stop != "eof":
        _classify_tail(path, buf, end, rec0, stop, out, z)
    for t in sorted(meta):
        plugin_of[table.tags[t]] = "scalars"
    proto = _decode_rest(path, buf, rest, plugin_of)
    cols.take(out, tensor, proto, table)
    out.purges, out.hparams, out.skipped = proto.purges, proto.hparams, proto.skipped
    out.hist = proto.hist


def _data_crc_ok(buf, pos: int, offs: np.ndarray, lens: np.ndarray, crc) -> np.ndarray | None:  # noqa: ANN001
    """Per record: does its data CRC hold (None when not asked to check)?"""
    if crc is None:
        return None
    keep = np.ones(len(offs), dtype=bool)
    view = memoryview(buf)
    for i, (o, ln) in enumerate(zip((offs + pos).tolist(), lens.tolist(), strict=True)):
        stored = int.from_bytes(view[o + 12 + ln : o + 16 + ln], "little")
        c = crc(view[o + 12 : o + 12 + ln])
        if ((((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF) != stored:
            keep[i] = False
    view.release()
    return keep


def _decode_rest(
    path: Path,
    buf,  # noqa: ANN001
    rest: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    plugin_of: dict[str, str],
) -> ProtoRows:
    if not rest:
        return ProtoRows()
    starts, ends, recs = (np.concatenate(x) for x in zip(*rest, strict=True))
    try:
        return decode_records(buf, starts, ends, recs, plugin_of)
    except ValueError as exc:
        raise UnreadableInputError(f"{path}: {exc}; the file is corrupt") from None


class _Columns:
    """The fast rows of a file, written block after block into arrays sized for the whole
    file from the first blocks (grown if it holds more): no per-block arrays to join."""

    DTYPES = (
        ("rec", np.int64),
        ("step", np.int64),
        ("value", np.float64),
        ("wall", np.float64),
        ("tag", np.int32),
    )

    def __init__(self, rec: type = np.int64) -> None:
        self.n = 0
        self.cols: dict[str, np.ndarray] = {}
        self.dtypes = (("rec", rec), *self.DTYPES[1:])

    def put(self, fast: FastRows, rec0: int, sel: np.ndarray | None, m: int, expect: int) -> None:
        end = self.n + m
        if not self.cols or end > len(self.cols["rec"]):
            size = max(expect, end, int(len(self.cols["rec"]) * 1.25) if self.cols else 0)
            old = self.cols
            self.cols = {k: np.empty(size, dtype=t) for k, t in self.dtypes}
            for k, col in old.items():
                self.cols[k][: self.n] = col[: self.n]
        got = (fast.rec, fast.step, fast.value, fast.wall_time, fast.tag_id)
        for (k, _), col in zip(self.dtypes, got, strict=True):
            dst = self.cols[k][self.n : end]
            if sel is None:
                dst[:] = col
            else:
                np.compress(sel, col, out=dst)
        if rec0:
            self.cols["rec"][self.n : end] += rec0
        self.n = end

    def take(
        self, out: FileRows, tensor: list[np.ndarray], proto: ProtoRows, table: TagTable
    ) -> None:
        """Into ``out``: the columns, with protobuf's rows put in record order."""
        for k, _ in self.dtypes:
            if self.cols:
                col = self.cols.pop(k)
                # Sized from an estimate: the rest given back in place (realloc); a slice
                # would keep the whole allocation (the estimate's 2% margin, about 5 MiB for
                # a 1M-step file, as long as the frame lives).
                try:
                    col.resize(self.n, refcheck=True)
                except ValueError:  # a view of it alive somewhere: sliced instead
                    col = col[: self.n]
                setattr(out, k, col)
                del col
        self.cols = {}
        if tensor:
            out.tensor = np.concatenate(tensor)
        if proto.rec:
            # Protobuf rows are in (record, value) order and never share a record with a fast
            # row: each goes in before the first fast row of a later record.
            prec = np.asarray(proto.rec, dtype=np.int64)
            at = np.searchsorted(out.rec, prec)
            tags = np.asarray([table.id_of(t) for t in proto.tag], dtype=np.int32)
            if len(out.tensor):
                out.tensor = out.tensor + np.searchsorted(at, out.tensor, side="right")
            out.rec = np.insert(out.rec, at, prec)
            out.step = np.insert(out.step, at, np.asarray(proto.step, dtype=np.int64))
            out.value = np.insert(out.value, at, np.asarray(proto.value, dtype=np.float64))
            out.wall = np.insert(out.wall, at, np.asarray(proto.wall_time, dtype=np.float64))
            out.tag = np.insert(out.tag, at, tags)
        if len(out.step):
            out.last_step = int(out.step[-1])


def _release(buf, lo: int, hi: int) -> None:  # noqa: ANN001
    """Drop the mapped pages of bytes [lo, hi) from memory (the file keeps them)."""
    if not isinstance(buf, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = lo - lo % mmap.PAGESIZE
    stop = hi - hi % mmap.PAGESIZE
    if stop > start:
        buf.madvise(mmap.MADV_DONTNEED, start, stop - start)


def _map(path: Path):  # noqa: ANN202 - bytes or a read-only mmap (same buffer protocol)
    """The file's bytes, memory-mapped: a multi-gigabyte (or sparse) event file is paged in
    as it is scanned instead of copied into memory whole."""
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
    path: Path, buf: bytes, end: int, k: int, stop: str, out: FileRows, z: int
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


def truncated(name: str, got: FileRows) -> Finding:
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
            f"as when a job is killed; the {got.records:,} complete records before it were read."
        ),
    )
