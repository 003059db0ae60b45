"""Protobuf-free scanning of TensorBoard event files (TFRecord framing), vectorised with numpy.

A TFRecord is ``u64 length | u32 masked_crc32c(length) | data | u32 masked_crc32c(data)``.
Walking the framing is inherently sequential (each length says where the next record is),
so that is one lean Python loop; everything after it works on whole arrays at once:

* the length CRC of every record is checked with a table-driven CRC-32C over numpy columns
  (8 bytes per record, so this is cheap and always on: it is what makes a corrupt or
  zero-filled file fail fast instead of being read as nonsense);
* the common scalar record shape that torch and tensorboardX write is decoded without
  protobuf (see :func:`decode_fast`); records of any other shape are left to the caller's
  protobuf fallback.

The fast shape, byte for byte (``L*`` are one-byte lengths, ``<step>`` a varint)::

    09 <f64 wall_time> [10 <step>] 2A L1 0A L2 0A Lt <tag> PAYLOAD
    PAYLOAD = 15 <f32>                                  simple_value (TF1, torch, tensorboardX)
            | 42 08 08 01 2A 04 <f32>     [META]        torch new_style float
            | 42 0C 08 02 32 08 <f64>     [META]        torch new_style double
    META    = 4A 0B 0A 09 0A 07 "scalars"               SummaryMetadata(plugin "scalars")
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MASK_DELTA = 0xA282EAD8


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
    """Bytes a[idx : idx + width] per index as an (n, width) uint8 array.

    Indexing a sliding-window view copies each row straight from the buffer (no index
    matrix). Windows that would run past the end are clipped: callers mask those rows out.
    """
    if len(a) < width:
        a = np.concatenate([a, np.zeros(width - len(a), dtype=np.uint8)])
    win = np.lib.stride_tricks.sliding_window_view(a, width)
    return win[np.minimum(idx, len(win) - 1)]


def length_crc_ok(a: np.ndarray, offs: np.ndarray) -> np.ndarray:
    """Per record: does the stored masked CRC match the CRC-32C of its 8 length bytes?"""
    if len(offs) == 0:
        return np.zeros(0, dtype=bool)
    b = _gather(a, offs, 12)
    crc = np.full(len(offs), 0xFFFFFFFF, dtype=np.uint32)
    for k in range(8):
        crc = _TABLE[(crc ^ b[:, k]) & 0xFF] ^ (crc >> np.uint32(8))
    crc ^= np.uint32(0xFFFFFFFF)
    m = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(MASK_DELTA)
    stored = np.ascontiguousarray(b[:, 8:12]).view("<u4").ravel()
    return m == stored


@dataclass
class Framing:
    offs: np.ndarray  # start of each complete record
    lens: np.ndarray  # data length of each record
    end: int  # byte position after the last complete record
    stop: str  # "eof" | "short" (last record cut off) | "zero" (zero length) | "huge"


def walk(buf: bytes, max_record: int) -> Framing:
    """Record boundaries up to the first record that cannot be complete.

    The chain of lengths is sequential, but real files repeat a short pattern of record
    lengths (one per tag, changing only when the step's varint grows). So after a few records
    read one by one, the pattern is extrapolated over a whole block of offsets at once and
    checked against the lengths actually stored there; the verified prefix is exact (each
    offset follows from a verified length), and the walk resumes one by one where the guess
    first fails.
    """
    n = len(buf)
    a = np.frombuffer(buf, dtype=np.uint8)
    unpack = struct.Struct("<Q").unpack_from
    offs: list[int] = []
    lens: list[int] = []
    blocks: list[tuple[np.ndarray, np.ndarray]] = []
    recent: list[int] = []  # lengths read one by one since the last look for a pattern
    hist = np.zeros(0, dtype=np.int64)  # the latest lengths, wherever they came from
    pattern = np.zeros(0, dtype=np.int64)
    pos = 0
    stop = ""
    block = 64
    cont: np.ndarray | None = None  # the pattern, continued, after a fully verified block
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
            recent = []
            # The longest cycle the history repeats (per-layer norms every 50 steps, eval
            # every 500) first, then the short one of the last records.
            candidates = _patterns(hist)
        else:
            candidates = [cont]
        got = None
        for pattern in candidates:
            got = _speculate(a, pos, pattern, block, max_record)
            if len(got):
                break
        if got is None or not len(got):
            block, cont = 64, None
            if pos + 12 > n:
                stop = "eof"
            continue
        period = len(pattern)
        glens = pattern[np.arange(len(got)) % period]
        blocks.append((np.asarray(offs, dtype=np.int64), np.asarray(lens, dtype=np.int64)))
        blocks.append((got, glens))
        offs, lens = [], []
        hist = np.concatenate([hist, glens[-_HISTORY:]])[-_HISTORY:]
        pos = int(got[-1] + glens[-1] + 16)
        if len(got) == block:
            block = min(block * 2, 1 << 20)
            cont = np.roll(pattern, -(len(got) % period))
        else:
            block, cont = 64, None
    if stop == "eof" and pos < n:
        stop = "short"  # fewer than 12 bytes left: a cut-off header
    blocks.append((np.asarray(offs, dtype=np.int64), np.asarray(lens, dtype=np.int64)))
    return Framing(
        np.concatenate([b[0] for b in blocks]), np.concatenate([b[1] for b in blocks]), pos, stop
    )


_HISTORY = 16384  # lengths kept to find a long cycle


def _patterns(hist: np.ndarray) -> list[np.ndarray]:
    """Candidate next lengths: the longest-lived cycle of the history, then the short one."""
    out: list[np.ndarray] = []
    p = _long_period(hist)
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
    if n < 2 * probe:
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
    a: np.ndarray, pos: int, pattern: np.ndarray, block: int, max_record: int
) -> np.ndarray:
    """Offsets of the records from ``pos`` on that follow ``pattern`` (verified prefix only)."""
    n = len(a)
    k = np.arange(block)
    expect = pattern[k % len(pattern)]
    offs = pos + np.concatenate([[0], np.cumsum(expect[:-1] + 16)])
    fits = offs + expect + 16 <= n
    stored = (
        _gather(a, offs, 8).view("<u8").ravel().astype(np.int64)
        if n >= 8
        else np.zeros(block, np.int64)
    )
    ok = fits & (stored == expect) & (expect <= max_record)
    bad = np.flatnonzero(~ok)
    m = int(bad[0]) if len(bad) else block
    return offs[:m]


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


def _varint(a: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode varints starting at pos: (value as int64, byte length, valid)."""
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


def _floats(a: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    raw = np.ascontiguousarray(_gather(a, pos, width))
    return raw.view("<f4" if width == 4 else "<f8").ravel().astype(np.float64)


def decode_fast(a: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> FastRows:
    """Decode every record of the fast shape at once; ``matched`` marks the others as not done."""
    n_rec = len(offs)
    d = offs + 12
    e = d + lens
    ok = (lens >= 19) & (a[np.minimum(d, len(a) - 1)] == 0x09)
    p = d + 9
    has_step = ok & (a[np.minimum(p, len(a) - 1)] == 0x10)
    step = np.zeros(n_rec, dtype=np.int64)
    q = p.copy()
    idx = np.flatnonzero(has_step)
    if len(idx):
        val, vlen, valid = _varint(a, p[idx] + 1)
        step[idx] = val
        q[idx] = p[idx] + 1 + vlen
        ok[idx[~valid]] = False
    h = _gather(a, q, 6).astype(np.int64)
    l1, l2, lt = h[:, 1], h[:, 3], h[:, 5]
    ok &= (h[:, 0] == 0x2A) & (h[:, 2] == 0x0A) & (h[:, 4] == 0x0A)
    ok &= (l1 < 0x80) & (l2 < 0x80) & (lt < 0x80)
    ok &= (q + 2 + l1 == e) & (l2 == l1 - 2)
    r = q + 6 + lt  # first byte of the value payload
    kind = a[np.minimum(r, len(a) - 1)]
    simple = ok & (kind == 0x15) & (r + 5 == e)
    pay = _gather(a, r, 6)
    is_f = (
        ok
        & (kind == 0x42)
        & (pay[:, 1] == 0x08)
        & (pay[:, 2] == 0x08)
        & (pay[:, 3] == 0x01)
        & (pay[:, 4] == 0x2A)
        & (pay[:, 5] == 0x04)
    )
    is_d = (
        ok
        & (kind == 0x42)
        & (pay[:, 1] == 0x0C)
        & (pay[:, 2] == 0x08)
        & (pay[:, 3] == 0x02)
        & (pay[:, 4] == 0x32)
        & (pay[:, 5] == 0x08)
    )
    vend = np.where(is_d, r + 14, r + 10)
    tens = is_f | is_d
    bare = tens & (vend == e)
    meta = np.zeros(n_rec, dtype=bool)
    cand = np.flatnonzero(tens & (vend + 13 == e))
    if len(cand):
        meta[cand] = (_gather(a, vend[cand], 13) == _META).all(axis=1)
    tens &= bare | meta
    matched = simple | tens
    rec = np.flatnonzero(matched)
    value = np.empty(len(rec), dtype=np.float64)
    ms = simple[rec]
    value[ms] = _floats(a, r[rec][ms] + 1, 4)
    mf = is_f[rec] & ~ms
    value[mf] = _floats(a, r[rec][mf] + 6, 4)
    md = is_d[rec] & ~ms
    value[md] = _floats(a, r[rec][md] + 6, 8)
    wall = _floats(a, d[rec] + 1, 8)
    tag_id, tags = _tags(a, q[rec] + 6, lt[rec])
    return FastRows(rec, step[rec], wall, value, tag_id, tags, meta[rec], tens[rec], matched)


def decode_fast_chunked(
    a: np.ndarray, offs: np.ndarray, lens: np.ndarray, chunk: int = 1 << 20
) -> FastRows:
    """:func:`decode_fast` over blocks of records: the same result, with the working arrays
    (a few dozen bytes per record) bounded by the block instead of the whole file."""
    if len(offs) <= chunk:
        return decode_fast(a, offs, lens)
    parts: list[FastRows] = []
    tags: dict[str, int] = {}
    for i in range(0, len(offs), chunk):
        fr = decode_fast(a, offs[i : i + chunk], lens[i : i + chunk])
        remap = np.asarray([tags.setdefault(t, len(tags)) for t in fr.tags], dtype=np.int64)
        fr.rec += i
        fr.tag_id = remap[fr.tag_id] if len(remap) else fr.tag_id
        parts.append(fr)

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(p, name) for p in parts])

    return FastRows(
        rec=cat("rec"),
        step=cat("step"),
        wall_time=cat("wall_time"),
        value=cat("value"),
        tag_id=cat("tag_id"),
        tags=list(tags),
        has_meta=cat("has_meta"),
        is_tensor=cat("is_tensor"),
        matched=cat("matched"),
    )


def _tags(a: np.ndarray, start: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Distinct tag strings and each record's index into them, without a per-record loop.

    Records are grouped by tag length; within a group the tag bytes form a fixed-width
    matrix, hashed to one uint64 per record. Hash collisions are checked, never assumed away.
    """
    tag_id = np.zeros(len(start), dtype=np.int64)
    tags: list[str] = []
    for width in np.unique(length):
        sel = np.flatnonzero(length == width)
        w = int(width)
        if w == 0:
            tags.append("")
            tag_id[sel] = len(tags) - 1
            continue
        mat = _gather(a, start[sel], w)
        hsh = np.zeros(len(sel), dtype=np.uint64)
        for k in range(w):  # FNV-1a over the columns
            hsh = (hsh ^ mat[:, k].astype(np.uint64)) * np.uint64(0x100000001B3)
        uniq, first, inv = np.unique(hsh, return_index=True, return_inverse=True)
        if not (mat == mat[first[inv]]).all():
            void = np.ascontiguousarray(mat).view(f"V{w}").ravel()
            uniq, first, inv = np.unique(void, return_index=True, return_inverse=True)
        base = len(tags)
        tags.extend(bytes(mat[i]).decode("utf-8", errors="replace") for i in first)
        tag_id[sel] = base + inv.ravel()
    return tag_id, tags
