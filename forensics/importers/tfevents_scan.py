"""Protobuf-free scanning of TensorBoard event files (TFRecord framing), vectorised with numpy
(and the same in C where ``forensics/importers/_tfscan.c`` was built: the walk, the length
checks and the decoding below, one pass each; the tags are interned here either way).

A TFRecord is ``u64 length | u32 masked_crc32c(length) | data | u32 masked_crc32c(data)``.
Walking the framing is inherently sequential (each length says where the next record is),
so that is one lean Python loop; everything after it works on whole arrays at once:

* the length CRC of every record is checked against a table of the CRC-32C of each distinct
  length (a file has a few dozen; always on: it is what makes a corrupt or zero-filled file
  fail fast instead of being read as nonsense);
* the common scalar record shape that torch and tensorboardX write is decoded without
  protobuf (see :func:`decode_fast`); records of any other shape are left to the caller's
  protobuf fallback.

Fields are read through :class:`Words`: little-endian views of the buffer that start at every
byte, so one fancy index reads a u64 (or f32, f64) at each record's own offset, with no byte
matrix in between. The caller decodes a file a few megabytes at a time, so these working
arrays stay small and in cache.

The fast shape, byte for byte (``L*`` are one-byte lengths, ``<step>`` a varint)::

    09 <f64 wall_time> [10 <step>] 2A L1 0A L2 0A Lt <tag> PAYLOAD
    PAYLOAD = 15 <f32>                                  simple_value (TF1, torch, tensorboardX)
            | 42 08 08 01 2A 04 <f32>     [META]        torch new_style float
            | 42 0C 08 02 32 08 <f64>     [META]        torch new_style double
    META    = 4A 0B 0A 09 0A 07 "scalars"               SummaryMetadata(plugin "scalars")

Besides, the ``09 <f64> 1A Ln <file_version>`` record every writer puts first carries no
value: :func:`decode_fast` marks it ``matched`` with no row, so a plain scalar file never
needs protobuf at all.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

try:  # the compiled walk, length checks and decoding (forensics/importers/_tfscan.c)
    from forensics.importers import _tfscan
except ImportError:  # pragma: no cover - no C compiler at install: numpy's path
    _tfscan = None  # type: ignore[assignment]

MASK_DELTA = 0xA282EAD8
PAD = 32  # bytes a buffer needs after its last record for the reads of decode_fast


def _crc_table() -> np.ndarray:
    poly = 0x82F63B78  # CRC-32C (Castagnoli), reflected
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table[i] = c
    return table


_TABLE = _crc_table()


def crc32c_py(data: bytes) -> int:
    """Pure-Python CRC-32C, for a few bytes (sniffing); use the crc32c package for bulk data."""
    c = 0xFFFFFFFF
    for b in data:
        c = int(_TABLE[(c ^ b) & 0xFF]) ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def header_ok(head: bytes) -> bool:
    """True when the first 12 bytes are a TFRecord length with a valid masked CRC."""
    if len(head) < 12:
        return False
    (crc,) = struct.unpack_from("<I", head, 8)
    return masked(crc32c_py(head[:8])) == crc


def _gather(a: np.ndarray, idx: np.ndarray, width: int) -> np.ndarray:
    """Bytes a[idx : idx + width] per index as an (n, width) uint8 array (rare paths only).

    Windows that would run past the end are clipped: callers mask those rows out.
    """
    if len(a) < width:
        a = np.concatenate([a, np.zeros(width - len(a), dtype=np.uint8)])
    win = np.lib.stride_tricks.sliding_window_view(a, width)
    return win[np.minimum(idx, len(win) - 1)]


def at_every_byte(a: np.ndarray, dtype: str) -> np.ndarray:
    """A read-only view of ``a`` (uint8) whose element i is the ``dtype`` value at byte i."""
    width = np.dtype(dtype).itemsize
    if len(a) < width:
        return np.zeros(0, dtype=dtype)
    return as_strided(
        a[:width].view(dtype), shape=(len(a) - width + 1,), strides=(1,), writeable=False
    )


class Words:
    """Little-endian u8/u32/u64/f32/f64 read at any byte offset of a uint8 buffer."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        self.u4 = at_every_byte(a, "<u4")
        self.u8 = at_every_byte(a, "<u8")
        self.f4 = at_every_byte(a, "<f4")
        self.f8 = at_every_byte(a, "<f8")


def padded(a: np.ndarray, end: int) -> np.ndarray:
    """``a`` when it holds at least PAD bytes after ``end``, else a copy with zeros after it."""
    if len(a) >= end + PAD:
        return a
    out = np.zeros(end + PAD, dtype=np.uint8)
    out[: min(len(a), end)] = a[:end]
    return out


def _crc_u64(v: np.ndarray) -> np.ndarray:
    """Masked CRC-32C of the 8 little-endian bytes of each uint64."""
    crc = np.full(len(v), 0xFFFFFFFF, dtype=np.uint32)
    for k in range(8):
        byte = ((v >> np.uint64(8 * k)) & np.uint64(0xFF)).astype(np.uint32)
        crc = _TABLE[(crc ^ byte) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
    crc ^= np.uint32(0xFFFFFFFF)
    return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(MASK_DELTA)


def length_crc_ok(a: np.ndarray, offs: np.ndarray, lens: np.ndarray | None = None) -> np.ndarray:
    """Per record: does the stored masked CRC match the CRC-32C of its 8 length bytes?

    ``lens`` (the lengths :func:`walk` read at ``offs``) saves reading them again. A file
    has few distinct lengths, so each one's CRC is computed once and looked up (numpy's
    path; the compiled one computes each record's)."""
    if len(offs) == 0:
        return np.zeros(0, dtype=bool)
    if _tfscan is not None:
        ok = np.empty(len(offs), dtype=bool)
        _tfscan.crc_lengths(a, np.ascontiguousarray(offs, dtype=np.int64), ok.view(np.uint8))
        return ok
    return length_crc_ok_numpy(a, offs, lens)


def length_crc_ok_numpy(
    a: np.ndarray, offs: np.ndarray, lens: np.ndarray | None = None
) -> np.ndarray:
    """:func:`length_crc_ok` by numpy."""
    if len(offs) == 0:
        return np.zeros(0, dtype=bool)
    stored = at_every_byte(a, "<u4")[offs + 8]
    length = at_every_byte(a, "<u8")[offs] if lens is None else lens.astype(np.uint64, copy=False)
    top = int(length.max())
    if len(length) > 64 and top < 1 << 16:
        present = np.zeros(top + 1, dtype=bool)
        present[length] = True
        seen = np.flatnonzero(present).astype(np.uint64)
        table = np.zeros(top + 1, dtype=np.uint32)
        table[seen] = _crc_u64(seen)
        return table[length] == stored
    return _crc_u64(length) == stored


@dataclass
class Framing:
    offs: np.ndarray  # start of each complete record
    lens: np.ndarray  # data length of each record
    end: int  # byte position after the last complete record
    stop: str  # "eof" | "short" (last record cut off) | "zero" (zero length) | "huge"


@dataclass
class WalkState:
    """What the walk of one block of a file hands to the walk of the next."""

    hist: np.ndarray | None = None  # the latest lengths
    cont: np.ndarray | None = None  # the pattern that ran off the block's end, in phase
    block: int = 64  # how many records it was verifying at once


def walk(buf, max_record: int, n: int | None = None, state: WalkState | None = None) -> Framing:  # noqa: ANN001
    """Record boundaries in ``buf[:n]`` (bytes-like) up to the first record that cannot be
    complete: by the compiled kernel where it was built (one pass over the headers), else by
    numpy (:func:`walk_numpy`), where ``state`` carries the pattern from one block of a file
    to the next.

    numpy's walk: the chain of lengths is sequential, but real files repeat a short pattern of
    record lengths (one per tag, changing only when the step's varint grows). So after a few records
    read one by one, the pattern is extrapolated over a whole block of offsets at once and
    checked against the lengths actually stored there; the verified prefix is exact (each
    offset follows from a verified length), and the walk resumes one by one where the guess
    first fails.
    """
    n = len(buf) if n is None else n
    if _tfscan is not None:
        return _walk_compiled(buf, max_record, n)
    return walk_numpy(buf, max_record, n, state)


_STOPS = ("eof", "short", "zero", "huge")  # the compiled walk's stop codes


def _walk_compiled(buf, max_record: int, n: int) -> Framing:  # noqa: ANN001
    """:func:`walk` by the compiled kernel: the records counted, then read (two passes over
    the headers only; a block's state is not needed, nothing is guessed)."""
    assert _tfscan is not None
    count, _, _ = _tfscan.walk(buf, n, max_record, None, None)
    offs = np.empty(count, dtype=np.int64)
    lens = np.empty(count, dtype=np.int64)
    _, end, stop = _tfscan.walk(buf, n, max_record, offs, lens)
    return Framing(offs, lens, end, _STOPS[stop])


def walk_numpy(buf, max_record: int, n: int, state: WalkState | None = None) -> Framing:  # noqa: ANN001
    """:func:`walk` by numpy (the lengths read one by one in Python and a pattern guessed
    ahead, see :func:`walk`)."""
    state = WalkState() if state is None else state
    a = np.frombuffer(buf, dtype=np.uint8)
    u8 = at_every_byte(a, "<u8")
    unpack = struct.Struct("<Q").unpack_from
    offs: list[int] = []
    lens: list[int] = []
    blocks: list[tuple[np.ndarray, np.ndarray]] = []
    recent: list[int] = []  # lengths read one by one since the last look for a pattern
    # The latest lengths, wherever they came from.
    hist = np.zeros(0, dtype=np.int64) if state.hist is None else state.hist
    pos = 0
    stop = ""
    block = state.block
    cont = state.cont  # the pattern, continued, after a fully verified block
    state.cont, state.block = None, 64
    fresh = _LONG_AGAIN  # lengths seen since the last long-cycle search that found none
    while not stop:
        if cont is None:
            # One by one: a few records, enough to see a repeating pattern.
            for _ in range(32):
                if pos + 12 > n:
                    stop = "eof"
                    break
                (length,) = unpack(buf, pos)
                if length == 0:  # no real Event serialises to zero bytes: zero-filled space
                    stop = "zero"
                    break
                if length > max_record:
                    stop = "huge"
                    break
                if pos + length + 16 > n:
                    stop = "short"
                    break
                offs.append(pos)
                lens.append(length)
                recent.append(length)
                pos += length + 16
            if stop:
                break
            hist = np.concatenate([hist, np.asarray(recent, dtype=np.int64)])[-_HISTORY:]
            fresh += len(recent)
            recent = []
            # The longest cycle the history repeats (per-layer norms every 50 steps, eval
            # every 500) first, then the short one of the last records. A search that found
            # no long cycle is not repeated before a few hundred more lengths are seen.
            look = fresh >= _LONG_AGAIN
            p = _long_period(hist) if look else 0
            if look and not p:
                fresh = 0
            candidates = _patterns(hist, p)
        else:
            candidates = [cont]
        got = glens = None
        ran_off = False
        for pattern in candidates:
            got, glens, ran_off = _speculate(u8, n, pos, pattern, block)
            if len(got):
                break
        if got is None or glens is None or not len(got):
            block, cont = 64, None
            if pos + 12 > n:
                stop = "eof"
            continue
        period = len(pattern)
        blocks.append((np.asarray(offs, dtype=np.int64), np.asarray(lens, dtype=np.int64)))
        blocks.append((got, glens))
        offs, lens = [], []
        hist = np.concatenate([hist, glens[-_HISTORY:]])[-_HISTORY:]
        pos = int(got[-1] + glens[-1] + 16)
        if len(got) == block:
            block = min(block * 2, 1 << 20)
            cont = np.roll(pattern, -(len(got) % period))
        else:
            if ran_off:  # the pattern held to the end of the buffer: the next block tries it
                state.cont, state.block = np.roll(pattern, -(len(got) % period)), block
            block, cont = 64, None
    if stop == "eof" and pos < n:
        stop = "short"  # fewer than 12 bytes left: a cut-off header
    if recent:
        hist = np.concatenate([hist, np.asarray(recent, dtype=np.int64)])[-_HISTORY:]
    state.hist = hist
    blocks.append((np.asarray(offs, dtype=np.int64), np.asarray(lens, dtype=np.int64)))
    return Framing(
        np.concatenate([b[0] for b in blocks]), np.concatenate([b[1] for b in blocks]), pos, stop
    )


_HISTORY = 16384  # lengths kept to find a long cycle


_LONG_AGAIN = 256  # lengths to see before looking for a long cycle again after none


def _patterns(hist: np.ndarray, p: int) -> list[np.ndarray]:
    """Candidate next lengths: the long cycle ``p`` of the history (0: none), then the short
    one of the last records."""
    out: list[np.ndarray] = []
    if p:
        out.append(hist[-p:])
    q = _period(hist[-32:].tolist())
    if q and q != p:
        out.append(hist[-q:])
    return out


def _long_period(h: np.ndarray, probe: int = 64, span: int = 2048) -> int:
    """Smallest p such that the latest max(span, 2p) lengths repeat with period p, or 0.

    Candidates must first match the last ``probe`` lengths, then a sample of the last
    ``span // 2`` (all survivors at once); the rest are checked in full, smallest first.
    """
    n = len(h)
    if n < max(2 * probe, span):  # no p can be checked over max(span, 2p) lengths yet
        return 0
    cands = np.arange(1, n // 2 + 1)
    for k in range(1, probe + 1):
        cands = cands[h[n - k - cands] == h[n - k]]
        if not len(cands):
            return 0
    lo = max(n - span // 2, int(cands[-1]))
    idx = np.linspace(lo, n - 1, num=min(256, n - lo)).astype(np.int64)
    cands = cands[(h[idx[None, :] - cands[:, None]] == h[idx][None, :]).all(axis=1)]
    for p in cands.tolist():
        w = max(span, 2 * p)
        if w > n:
            break
        seg = h[n - w :]
        if np.array_equal(seg[p:], seg[:-p]):
            return int(p)
    return 0


def _period(lens: list[int], longest: int = 16) -> int:
    """Smallest p such that the last 2p lengths repeat with period p (0 if none)."""
    for p in range(1, longest + 1):
        if len(lens) >= 2 * p and lens[-p:] == lens[-2 * p : -p]:
            return p
    return 0


def _speculate(
    u8: np.ndarray, n: int, pos: int, pattern: np.ndarray, block: int
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Offsets and lengths of the records from ``pos`` on that follow ``pattern`` (verified
    prefix only; the pattern's lengths were read from the file, so none is too long), and
    whether the first record not verified is one that runs past ``n``."""
    expect = np.resize(pattern, block)
    size = expect + 16
    offs = np.empty(block, dtype=np.int64)
    offs[0] = pos
    np.cumsum(size[:-1], out=offs[1:])
    offs[1:] += pos
    fits = offs + size <= n
    if n >= 8:
        ok = fits & (u8[np.minimum(offs, n - 8)].view(np.int64) == expect)
    else:
        ok = np.zeros(block, dtype=bool)
    m = block if ok.all() else int(np.argmin(ok))
    return offs[:m], expect[:m], m < block and not fits[m]


@dataclass
class FastRows:
    rec: np.ndarray  # index of the record (into the framing arrays)
    step: np.ndarray  # int64
    wall_time: np.ndarray  # float64
    value: np.ndarray  # float64
    tag_id: np.ndarray  # index into tags
    tags: list[str]
    has_meta: np.ndarray  # bool: the record itself says plugin "scalars"
    is_tensor: np.ndarray  # bool: new-style tensor scalar (needs the scalars plugin)
    matched: np.ndarray  # bool per record: decoded here (False: use protobuf)


_META = np.frombuffer(b"\x4a\x0b\x0a\x09\x0a\x07scalars", dtype=np.uint8)
_META_LO = int(_META[:8].view("<u8")[0])
_META_HI = int(_META[5:13].view("<u8")[0])
_U = np.uint64
_LOW7 = _U(0x7F7F7F7F7F7F7F7F)
_HIGH = _U(0x8080808080808080)
_BYTE_INDEX = _U(0x0001020304050607)  # (256**k * this) >> 56 == k for k < 8
_HEAD_MASK = _U(0x0000FF00FF00FF)  # the 2A _ 0A _ 0A bytes of the tag header
_HEAD = _U(0x00000A000A002A)
_HEAD_LEN_HIGH = _U(0x0000800080008000)  # high bits of L1, L2, Lt
_PAY6 = _U(0xFFFFFFFFFFFF)
_PAY_F32 = _U(0x042A01080842)  # 42 08 08 01 2A 04
_PAY_F64 = _U(0x083202080C42)  # 42 0C 08 02 32 08


def _varint8(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Varints that fit in the 8 bytes of each uint64: (value, byte length, found)."""
    term = ~v & _HIGH  # the high bit of every byte that ends a varint
    low = term & (_U(0) - term)  # its first one
    found = term != 0
    k = ((low >> _U(7)) * _BYTE_INDEX) >> _U(56)  # index of that byte
    x = v & ((low << _U(1)) - _U(1)) & _LOW7  # the varint's bytes, 7 payload bits each
    # Pack the 7-bit groups: pairs, then quads, then the two halves.
    x = (x & _U(0x007F007F007F007F)) | ((x >> _U(1)) & _U(0x3F803F803F803F80))
    x = (x & _U(0x00003FFF00003FFF)) | ((x >> _U(2)) & _U(0x0FFFC0000FFFC000))
    x = (x & _U(0x000000000FFFFFFF)) | ((x >> _U(4)) & _U(0x00FFFFFFF0000000))
    return x.view(np.int64), k.astype(np.int64) + 1, found


def _varint(a: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode varints of up to 10 bytes starting at pos: (value as int64, byte length, valid)."""
    if len(pos) == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z, np.zeros(0, dtype=bool)
    b = _gather(a, pos, 10)
    term = b < 0x80
    valid = term.any(axis=1)
    vlen = term.argmax(axis=1) + 1
    val = np.zeros(len(pos), dtype=np.uint64)
    for k in range(int(vlen[valid].max()) if valid.any() else 0):
        part = (b[:, k].astype(np.uint64) & np.uint64(0x7F)) << np.uint64(7 * k)
        val |= np.where(k < vlen, part, np.uint64(0))
    return val.view(np.int64), vlen.astype(np.int64), np.asarray(valid)


def decode_fast(
    a: np.ndarray, offs: np.ndarray, lens: np.ndarray, table: TagTable | None = None
) -> FastRows:
    """Decode every record of the fast shape at once; ``matched`` marks the others as not done.

    ``a`` is the buffer as uint8 (a copy with padding is made when it lacks PAD bytes after
    the last record); ``table`` interns tags across calls (``tags`` is its list). By the
    compiled kernel where it was built, else by numpy (:func:`decode_fast_numpy`): the same
    rows."""
    if _tfscan is None:
        return decode_fast_numpy(a, offs, lens, table)
    table = TagTable() if table is None else table
    n_rec = len(offs)
    if n_rec == 0:
        return _no_rows(table)
    a, offs = _padded_block(a, offs, lens)  # (the tags' words are read 8 bytes at a time)
    offs = np.ascontiguousarray(offs, dtype=np.int64)
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    flags = np.empty(n_rec, dtype=np.uint8)
    step, tag_at, tag_len = (np.empty(n_rec, dtype=np.int64) for _ in range(3))
    wall, value = np.empty(n_rec), np.empty(n_rec)
    _tfscan.decode(a, offs, lens, flags, step, wall, value, tag_at, tag_len)
    rows = (flags & 1).astype(bool)
    rec = np.flatnonzero(rows)
    at = _rows_at(rec)
    w = Words(a)
    d = offs + 12
    version = _version_records(w.a, d, d + lens, np.flatnonzero(flags & 8))
    tag_id = table.ids(w, tag_at[at], tag_len[at])
    fl = flags[at]
    matched = rows.copy()
    matched[version] = True
    return FastRows(
        rec,
        step[at],
        wall[at],
        value[at],
        tag_id,
        table.tags,
        (fl & 4) != 0,
        (fl & 2) != 0,
        matched,
    )


def _no_rows(table: TagTable) -> FastRows:
    z = np.zeros(0, dtype=np.int64)
    f = np.zeros(0, dtype=np.float64)
    b = np.zeros(0, dtype=bool)
    return FastRows(z, z, f, f, z, table.tags, b, b, b)


def _padded_block(
    a: np.ndarray, offs: np.ndarray, lens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``a`` and ``offs`` as they are when ``a`` holds PAD bytes after the last record; else
    a padded copy of the records (the buffer ends with them) and the offsets into it."""
    end = int(offs[-1] + lens[-1] + 16)
    if len(a) >= end + PAD:
        return a, offs
    base = int(offs[0])
    return padded(a[base:end], end - base), offs - base


def _rows_at(rec: np.ndarray) -> slice | np.ndarray:
    """What selects the rows' records: a slice when they are consecutive (usually every
    record of the block but a writer's first one: views, not a gather per column)."""
    if len(rec) and int(rec[-1]) - int(rec[0]) + 1 == len(rec):
        return slice(int(rec[0]), int(rec[-1]) + 1)
    return rec


def decode_fast_numpy(
    a: np.ndarray, offs: np.ndarray, lens: np.ndarray, table: TagTable | None = None
) -> FastRows:
    """:func:`decode_fast` by numpy: the byte tests on whole arrays."""
    table = TagTable() if table is None else table
    n_rec = len(offs)
    if n_rec == 0:
        return _no_rows(table)
    a, offs = _padded_block(a, offs, lens)
    w = Words(a)
    d = offs + 12
    e = d + lens
    b0, b9 = w.a[d], w.a[d + 9]
    ok = (lens >= 19) & (b0 == 0x09)
    version = _version_records(
        w.a, d, e, np.flatnonzero((lens >= 11) & (b0 == 0x09) & (b9 == 0x1A))
    )
    has_step = ok & (b9 == 0x10)
    step, vlen, found = _varint8(w.u8[d + 10])
    long_step = np.flatnonzero(has_step & ~found)
    if len(long_step):  # 9- or 10-byte varints (negative steps): the general decoder
        val, vl, valid = _varint(w.a, d[long_step] + 10)
        step[long_step], vlen[long_step] = val, vl
        ok[long_step[~valid]] = False
    step = np.where(has_step, step, 0)
    q = np.where(has_step, d + 10 + vlen, d + 9)
    h = w.u8[q]
    l1 = ((h >> _U(8)) & _U(0xFF)).astype(np.int64)
    lt = ((h >> _U(40)) & _U(0xFF)).astype(np.int64)
    ok &= ((h & _HEAD_MASK) == _HEAD) & ((h & _HEAD_LEN_HIGH) == _U(0))
    ok &= (q + 2 + l1 == e) & (((h >> _U(24)) & _U(0xFF)).astype(np.int64) == l1 - 2)
    r = np.minimum(q + 6 + lt, len(w.u8) - 1)  # first byte of the value payload
    pay = w.u8[r]
    simple = ok & ((pay & _U(0xFF)) == _U(0x15)) & (r + 5 == e)
    head6 = pay & _PAY6
    is_f = ok & (head6 == _PAY_F32)
    is_d = ok & (head6 == _PAY_F64)
    tens = is_f | is_d
    if tens.any():
        vend = np.where(is_d, r + 14, r + 10)
        bare = tens & (vend == e)
        meta = np.zeros(n_rec, dtype=bool)
        cand = np.flatnonzero(tens & (vend + 13 == e))
        if len(cand):
            meta[cand] = (w.u8[vend[cand]] == _U(_META_LO)) & (w.u8[vend[cand] + 5] == _U(_META_HI))
        tens &= bare | meta
    else:
        meta = tens
    rows = simple | tens
    rec = np.flatnonzero(rows)
    at = _rows_at(rec)
    rr = r[at]
    if not tens.any():  # simple values only (simple and tensor shapes are disjoint)
        value = w.f4[rr + 1].astype(np.float64)
    else:
        value = np.empty(len(rec), dtype=np.float64)
        ms = simple[at]
        value[ms] = w.f4[rr[ms] + 1]
        mf = is_f[at] & ~ms
        value[mf] = w.f4[rr[mf] + 6]
        md = is_d[at] & ~ms
        value[md] = w.f8[rr[md] + 6]
    wall = w.f8[d[at] + 1]
    tag_id = table.ids(w, q[at] + 6, lt[at])
    matched = rows.copy()
    matched[version] = True
    return FastRows(rec, step[at], wall, value, tag_id, table.tags, meta[at], tens[at], matched)


def _version_records(a: np.ndarray, d: np.ndarray, e: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """The records among ``cand`` that are a writer's first Event and nothing else:
    ``09 <f64 wall_time> 1A Ln <file_version>`` then optionally ``52 Lm 0A Lk <writer>``
    (source_metadata), every length one byte and both strings ASCII (protobuf would refuse
    a string that is not UTF-8). They carry no value: nothing to decode."""
    out = []
    for i, lo, hi in zip(cand.tolist(), d[cand].tolist(), e[cand].tolist(), strict=True):
        rec = a[lo + 10 : hi].tobytes()
        ln = rec[0]
        if ln >= 0x80 or 1 + ln > len(rec) or not rec[1 : 1 + ln].isascii():
            continue
        tail = rec[1 + ln :]
        if tail and not (
            len(tail) >= 4
            and tail[0] == 0x52
            and tail[1] == len(tail) - 2 < 0x80
            and tail[2] == 0x0A
            and tail[3] == len(tail) - 4
            and tail[4:].isascii()
        ):
            continue
        out.append(i)
    return np.asarray(out, dtype=np.int64)


def decode_fast_chunked(
    a: np.ndarray, offs: np.ndarray, lens: np.ndarray, chunk: int = 1 << 16
) -> FastRows:
    """:func:`decode_fast` over blocks of records: the same result, with the working arrays
    bounded by the block (and kept in cache) instead of spanning the whole buffer."""
    if len(offs) <= chunk:
        return decode_fast(a, offs, lens)
    table = TagTable()
    parts: list[FastRows] = []
    for i in range(0, len(offs), chunk):
        fr = decode_fast(a, offs[i : i + chunk], lens[i : i + chunk], table)
        fr.rec += i
        parts.append(fr)

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(p, name) for p in parts])

    return FastRows(
        rec=cat("rec"),
        step=cat("step"),
        wall_time=cat("wall_time"),
        value=cat("value"),
        tag_id=cat("tag_id"),
        tags=table.tags,
        has_meta=cat("has_meta"),
        is_tensor=cat("is_tensor"),
        matched=cat("matched"),
    )


_MIX = _U(0x9E3779B97F4A7C15)
_LEN_MIX = _U(0xC2B2AE3D27D4EB4F)
# MASKS[k]: the low k bytes of a u64 (k = 0..8).
_MASKS = np.asarray([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)
# Odd multipliers tried, in order, for a collision-free slot table of the known keys.
_MULTS = [
    _U((0x9E3779B97F4A7C15 * (2 * i + 1) + 0x632BE59BD9B4E019 * i) % (1 << 64) | 1)
    for i in range(24)
]


class _Slots:
    """Known tags of one word count in a small open table: slot = (key * mult) >> shift,
    with every known key in its own slot (the multiplier is chosen so)."""

    def __init__(self, n_words: int) -> None:
        self.n_words = n_words
        self.keys = np.zeros(0, dtype=np.uint64)  # per known tag
        self.lens = np.zeros(0, dtype=np.int64)
        self.words = np.zeros((n_words, 0), dtype=np.uint64)
        self.ids = np.zeros(0, dtype=np.int64)
        self.mult = _MULTS[0]
        self.shift = _U(63)
        self.slot_of = np.zeros(2, dtype=np.int64)  # slot -> index of a known tag, -1: none

    def add(self, keys: np.ndarray, lens: np.ndarray, words: np.ndarray, ids: np.ndarray) -> bool:
        """Add tags (distinct keys; ``words`` [n_words, n]); False when a key is already
        another tag's (a hash collision)."""
        known = np.sort(self.keys)
        at = np.minimum(np.searchsorted(known, keys), max(len(known) - 1, 0))
        if len(known) and bool(np.any(known[at] == keys)):
            return False
        self.keys = np.concatenate([self.keys, keys])
        self.lens = np.concatenate([self.lens, lens])
        self.words = np.concatenate([self.words, words], axis=1)
        self.ids = np.concatenate([self.ids, ids])
        bits = max(4, len(self.keys).bit_length() + 2)
        while True:
            for mult in _MULTS:
                slot = np.sort((self.keys * mult) >> _U(64 - bits))
                if bool(np.all(slot[1:] != slot[:-1])):
                    self.mult, self.shift = mult, _U(64 - bits)
                    self.slot_of = np.full(1 << bits, -1, dtype=np.int64)
                    at_slot = ((self.keys * mult) >> self.shift).astype(np.int64)
                    self.slot_of[at_slot] = np.arange(len(self.keys))
                    return True
            bits += 1

    def find(
        self, key: np.ndarray, length: np.ndarray, words: list[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(tag id, found) per row: its key, length and every word equal a known tag's."""
        if not len(self.keys):
            return np.zeros(len(key), dtype=np.int64), np.zeros(len(key), dtype=bool)
        k = self.slot_of[((key * self.mult) >> self.shift).astype(np.int64)]
        hit = k >= 0
        if not hit.all():
            k = np.where(hit, k, 0)
        hit &= self.lens[k] == length  # same length and words: the same key, no need to compare
        for j, x in enumerate(words):
            hit &= self.words[j][k] == x
        return self.ids[k], hit


class TagTable:
    """Tag byte strings -> small ids, kept across the blocks and files of a read.

    A record's tag is read as the u64 words of its bytes (the last one masked to the tag's
    length) and keyed by a hash of its words and length, looked up in a small table; every
    row is then checked word for word (and length) against the tag its key names, so a hash
    collision can never merge two tags (a word count where one occurs is resolved byte by
    byte from then on).
    """

    def __init__(self) -> None:
        self.tags: list[str] = []
        self._by_bytes: dict[bytes, int] = {}
        self._by_str: dict[str, int] = {}
        self._slots: dict[int, _Slots] = {}  # word count -> its known tags
        self._slow: set[int] = set()  # word counts with a key collision

    def id_of(self, tag: str) -> int:
        i = self._by_str.get(tag)
        if i is None:
            i = self._by_str[tag] = len(self.tags)
            self.tags.append(tag)
        return i

    def _id_of_bytes(self, raw: bytes) -> int:
        i = self._by_bytes.get(raw)
        if i is None:
            i = self._by_bytes[raw] = self.id_of(raw.decode("utf-8", errors="replace"))
        return i

    def ids(self, w: Words, start: np.ndarray, length: np.ndarray) -> np.ndarray:
        """The tag id of each row whose tag is the ``length`` bytes at ``start``."""
        out = np.zeros(len(start), dtype=np.int64)
        if not len(start):
            return out
        n_words = (length + 7) >> 3
        counts = np.bincount(n_words)
        present = np.flatnonzero(counts)
        for nw in present.tolist():
            sel = np.flatnonzero(n_words == nw) if len(present) > 1 else None
            pos = start if sel is None else start[sel]
            ln = length if sel is None else length[sel]
            got = self._ids_of(w, pos, ln, nw)
            if sel is None:
                out = got
            else:
                out[sel] = got
        return out

    def _ids_of(self, w: Words, pos: np.ndarray, ln: np.ndarray, nw: int) -> np.ndarray:
        if nw == 0:
            return np.full(len(pos), self.id_of(""), dtype=np.int64)
        if nw in self._slow:
            return self._ids_by_bytes(w, pos, ln)
        words = [w.u8[pos + 8 * j] for j in range(nw)]
        words[-1] &= _MASKS[ln - 8 * (nw - 1)]
        key = ln.astype(np.uint64) * _LEN_MIX
        for x in words:
            key = (key ^ x) * _MIX
        slots = self._slots.setdefault(nw, _Slots(nw))
        ids, hit = slots.find(key, ln, words)
        if hit.all():
            return ids
        todo = np.flatnonzero(~hit)
        if self._learn(w, slots, pos[todo], ln[todo], key[todo], [x[todo] for x in words]):
            again, hit2 = slots.find(key[todo], ln[todo], [x[todo] for x in words])
            ids[todo[hit2]] = again[hit2]
            todo = todo[~hit2]
        if len(todo):  # a hash collision: this word count is resolved byte by byte from now on
            self._slow.add(nw)
            ids[todo] = self._ids_by_bytes(w, pos[todo], ln[todo])
        return ids

    def _learn(
        self,
        w: Words,
        slots: _Slots,
        pos: np.ndarray,
        ln: np.ndarray,
        key: np.ndarray,
        words: list[np.ndarray],
    ) -> bool:
        """Add the tags of rows no known tag matched; False on a key collision."""
        order = np.argsort(key, kind="stable")
        ks = key[order]
        first = order[np.concatenate([[True], ks[1:] != ks[:-1]])]
        ids = [
            self._id_of_bytes(w.a[p : p + n].tobytes())
            for p, n in zip(pos[first].tolist(), ln[first].tolist(), strict=True)
        ]
        return slots.add(
            key[first],
            ln[first],
            np.stack([x[first] for x in words]),
            np.asarray(ids, dtype=np.int64),
        )

    def _ids_by_bytes(self, w: Words, pos: np.ndarray, ln: np.ndarray) -> np.ndarray:
        buf = w.a
        return np.asarray(
            [
                self._id_of_bytes(buf[p : p + n].tobytes())
                for p, n in zip(pos.tolist(), ln.tolist(), strict=True)
            ],
            dtype=np.int64,
        )
