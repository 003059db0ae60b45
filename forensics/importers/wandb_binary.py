"""The W&B binary run log (``run-<id>.wandb``) read without the wandb package.

Framing: a LevelDB-style log with a 7-byte W&B header (``:W&B``, uint16 LE 0xBEE1, version
byte), then 32 KiB blocks of chunks ``uint32 crc | uint16 len | uint8 type | data``; a record
is one FULL chunk or FIRST MIDDLE* LAST. The CRC is plain CRC-32 over type byte + data.
Each record payload is a serialized ``wandb_internal.Record``; we hand-decode the few fields
we need and skip the rest by wire type (field numbers: ../shared/formats.md section 3c).
The SDK is heavy (a Go core, pydantic, ...) and we only need history, config and summary.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forensics.errors import UnreadableInputError
from forensics.importers.base import as_number

MAGIC = b":W&B"
HEADER_LEN = 7
BLOCK = 32768
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4

# Record oneof fields we read (wandb_internal.proto).
R_HISTORY, R_SUMMARY, R_CONFIG, R_OUTPUT, R_OUTPUT_RAW, R_RUN, R_EXIT = 2, 3, 5, 4, 13, 17, 18


@dataclass
class WandbLog:
    """What one ``.wandb`` file holds, decoded."""

    steps: list[int] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    times: list[float | None] = field(default_factory=list)
    records: list[int] = field(default_factory=list)
    history_records: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    console: list[str] = field(default_factory=list)
    skipped_values: dict[str, int] = field(default_factory=dict)  # non-numeric history keys
    bytes_left: int = 0  # an incomplete record at the end (a killed or running job)
    bad_chunks: int = 0  # CRC mismatches / impossible lengths, resynced at the next block


# -- framing ---------------------------------------------------------------------------
def iter_records(
    buf: bytes, verify_crc: bool = False, log: WandbLog | None = None
) -> Iterator[bytes]:
    """Yield record payloads. A corrupt block is skipped (resync at the next block)."""
    if len(buf) < HEADER_LEN or buf[:4] != MAGIC:
        raise UnreadableInputError("not a W&B run log (expected the ':W&B' header)")
    magic, _version = struct.unpack_from("<HB", buf, 4)
    if magic != 0xBEE1:
        raise UnreadableInputError(f"unknown W&B log magic 0x{magic:04x} (expected 0xBEE1)")
    pos, n = HEADER_LEN, len(buf)
    parts: list[bytes] = []
    record_start = pos  # where the record being assembled began
    while pos < n:
        block_end = (pos // BLOCK + 1) * BLOCK
        if block_end - pos < CHUNK_HEADER:  # block trailer: zero padding
            pos = block_end
            continue
        if pos + CHUNK_HEADER > n:
            break
        crc, length, ctype = struct.unpack_from("<IHB", buf, pos)
        if ctype == 0 and length == 0:  # zero-filled rest of a block
            pos = block_end
            continue
        end = pos + CHUNK_HEADER + length
        if ctype in (FULL, FIRST, MIDDLE, LAST) and end > n and end <= block_end:
            break  # the last chunk was cut off: a killed or still-running job
        if ctype not in (FULL, FIRST, MIDDLE, LAST) or end > block_end:
            if log is not None:
                log.bad_chunks += 1
            parts, pos = [], block_end
            continue
        data = buf[pos + CHUNK_HEADER : end]
        if verify_crc and zlib.crc32(data, zlib.crc32(bytes((ctype,)))) & 0xFFFFFFFF != crc:
            if log is not None:
                log.bad_chunks += 1
            parts, pos = [], block_end
            continue
        if ctype in (FULL, FIRST):
            record_start = pos
        pos = end
        if ctype == FULL:
            parts = []
            yield data
        elif ctype == FIRST:
            parts = [data]
        elif ctype == MIDDLE and parts:
            parts.append(data)
        elif ctype == LAST and parts:
            parts.append(data)
            yield b"".join(parts)
            parts = []
    left_from = record_start if parts else pos
    if log is not None and left_from < n and any(buf[left_from:]):
        log.bytes_left = n - left_from


# -- protobuf wire format ------------------------------------------------------------
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 70:
            raise ValueError("varint too long")


def fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value): varints as int, length-delimited as bytes."""
    pos, n = 0, len(buf)
    while pos < n:
        key = buf[pos]
        if key < 0x80:  # one-byte keys and lengths are the rule: skip the general varint call
            pos += 1
        else:
            key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, pos = _varint(buf, pos)
        elif wt == 2:
            ln = buf[pos]
            if ln < 0x80:
                pos += 1
            else:
                ln, pos = _varint(buf, pos)
            val = buf[pos : pos + ln]
            if len(val) != ln:
                raise ValueError("truncated field")
            pos += ln
        elif wt == 1:
            val = buf[pos : pos + 8]
            pos += 8
        elif wt == 5:
            val = buf[pos : pos + 4]
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wt}")
        yield num, wt, val


def _item(buf: bytes) -> tuple[str, Any, bool]:
    """Decode a HistoryItem / SummaryItem / ConfigItem: (name, value, has_value)."""
    # Fast path for the shape wandb-core writes for nearly every item: one short key
    # (field 1 or 2) then a short value_json (field 16), lengths below 128.
    n = len(buf)
    if n > 4 and buf[0] in (0x0A, 0x12) and buf[1] < 0x80:
        p = 2 + buf[1]
        if (
            p + 3 <= n
            and buf[p] == 0x82
            and buf[p + 1] == 0x01
            and buf[p + 2] < 0x80
            and p + 3 + buf[p + 2] == n
        ):
            raw = buf[p + 3 :]
            try:
                # numbers, NaN and Infinity: the common case, no JSON parser
                value = int(raw) if raw.lstrip(b"-").isdigit() else float(raw)
            except ValueError:
                value = _json(raw.decode("utf-8", "replace"))
            return buf[2:p].decode("utf-8", "replace"), value, True
    key, nested, value, has = "", [], None, False
    for num, wt, val in fields(buf):
        if num == 1 and wt == 2:
            key = val.decode("utf-8", "replace")
        elif num == 2 and wt == 2:
            nested.append(val.decode("utf-8", "replace"))
        elif num == 16 and wt == 2:
            value, has = _json(val.decode("utf-8", "replace")), True
        elif num == 3 and wt == 0:  # typed encoding (x_history_value_encoding)
            value, has = None, True
        elif num == 4 and wt == 0:
            value, has = bool(val), True
        elif num == 5 and wt == 0:
            value, has = (val >> 1) ^ -(val & 1), True  # sint64 zigzag
        elif num == 6 and wt == 1:
            value, has = struct.unpack("<d", val)[0], True
        elif num == 7 and wt == 2:
            value, has = val.decode("utf-8", "replace"), True
        elif num == 8 and wt == 2:
            value, has = _json(val.decode("utf-8", "replace")), True
    return key or ".".join(nested), value, has


def _json(text: str) -> Any:
    try:
        return json.loads(text)  # Python's json accepts bare NaN / Infinity, as W&B writes them
    except (ValueError, RecursionError):
        return text


def _timestamp(buf: bytes) -> float:
    secs = nanos = 0
    for num, wt, val in fields(buf):
        if num == 1 and wt == 0:
            secs = val
        elif num == 2 and wt == 0:
            nanos = val
    return secs + nanos / 1e9


# -- records ---------------------------------------------------------------------------
def _history(buf: bytes, rec_num: int, log: WandbLog) -> None:
    items: dict[str, Any] = {}
    step = None
    for num, wt, val in fields(buf):
        if num == 1 and wt == 2:
            name, value, has = _item(val)
            if has:
                items[name] = value
        elif num == 2 and wt == 2:
            step = 0
            for n2, w2, v2 in fields(val):
                if n2 == 1 and w2 == 0:
                    step = v2 if v2 < 1 << 63 else v2 - (1 << 64)
    log.history_records += 1
    if "_step" in items and as_number(items["_step"]) is not None:
        step = int(as_number(items["_step"]))  # type: ignore[arg-type]
    if step is None:
        step = log.history_records - 1
    wt_ = as_number(items.get("_timestamp"))
    for name, value in items.items():
        if name in ("_step", "_runtime", "_timestamp") or name.startswith("_wandb"):
            continue
        x = as_number(value)
        if x is None:
            log.skipped_values[name] = log.skipped_values.get(name, 0) + 1
            continue
        log.steps.append(step)
        log.tags.append(name)
        log.values.append(x)
        log.times.append(wt_)
        log.records.append(rec_num)


def _update_items(buf: bytes, target: dict[str, Any]) -> None:
    """Apply a SummaryRecord / ConfigRecord: field 1 = update items, 2 = remove items."""
    for num, wt, val in fields(buf):
        if wt != 2:
            continue
        name, value, has = _item(val)
        if num == 1 and has:
            target[name] = value
        elif num == 2:
            target.pop(name, None)


def _run(buf: bytes, log: WandbLog) -> None:
    names = {
        1: "run_id",
        2: "entity",
        3: "project",
        6: "run_group",
        7: "job_type",
        8: "display_name",
        9: "notes",
        13: "host",
        12: "sweep_id",
    }
    tags: list[str] = []
    for num, wt, val in fields(buf):
        if num in names and wt == 2:
            log.run[names[num]] = val.decode("utf-8", "replace")
        elif num == 4 and wt == 2:
            _update_items(val, log.config)
        elif num == 10 and wt == 2:
            tags.append(val.decode("utf-8", "replace"))
        elif num == 14 and wt == 0:
            log.run["starting_step"] = val
        elif num == 17 and wt == 2:
            log.run["start_time"] = _timestamp(val)
        elif num == 18 and wt == 0:
            log.run["resumed"] = bool(val)
        elif num == 22 and wt == 0:
            log.run["forked"] = bool(val)
    if tags:
        log.run["tags"] = tags


def _exit(buf: bytes, log: WandbLog) -> None:
    code = 0
    for num, wt, val in fields(buf):
        if num == 1 and wt == 0:
            code = val - (1 << 64) if val >= 1 << 63 else val  # int32 negatives use 10 bytes
        elif num == 2 and wt == 0:
            log.run["runtime_s"] = val
    log.exit_code = code


def _console(buf: bytes, log: WandbLog) -> None:
    for num, wt, val in fields(buf):
        if num == 3 and wt == 2:
            log.console.append(val.decode("utf-8", "replace"))
    if len(log.console) > 4000:  # only the end of the console says how the job ended
        del log.console[:-2000]


def read_wandb(path: Path, verify_crc: bool = False) -> WandbLog:
    """Decode a ``.wandb`` file. Raises UnreadableInputError when it is not one."""
    buf = path.read_bytes()
    log = WandbLog()
    idx = 0
    try:
        records = iter_records(buf, verify_crc, log)
        for idx, payload in enumerate(records):
            try:
                _record(payload, idx, log)
            except (ValueError, IndexError, struct.error):
                log.bad_chunks += 1  # a payload that is not a Record: skip it, keep going
    except UnreadableInputError as exc:
        raise UnreadableInputError(f"{path}: {exc}") from None
    for k, v in list(log.config.items()):
        if isinstance(v, dict) and set(v) == {"value"}:  # files/config.yaml style {key: {value: x}}
            log.config[k] = v["value"]
    log.config.pop("_wandb", None)
    return log


def _record(payload: bytes, idx: int, log: WandbLog) -> None:
    for num, wt, val in fields(payload):
        if wt != 2:
            continue
        if num == R_HISTORY:
            _history(val, idx, log)
        elif num == R_SUMMARY:
            _update_items(val, log.summary)
        elif num == R_CONFIG:
            _update_items(val, log.config)
        elif num == R_RUN:
            _run(val, log)
        elif num == R_EXIT:
            _exit(val, log)
        elif num in (R_OUTPUT, R_OUTPUT_RAW):
            _console(val, log)
