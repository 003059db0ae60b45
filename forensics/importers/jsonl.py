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
* A file is read in blocks (:mod:`forensics.importers.jsonl_blocks`): plain lines by polars'
  JSON reader, checked against the text, the others by :func:`line_rows`; the same rows
  either way. Within a line, rows follow the order in which the file first showed its keys.
  Read for analysis (``ReadOptions.series_order``) a file with no restart hands its rows over
  series after series (each key's rows in line order): the analysis view's order.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

import polars as pl

from forensics.findings import Finding, FindingKind, Severity
from forensics.importers.base import (
    COMPRESSED,
    ImportResult,
    ReadOptions,
    Source,
    as_number,
    head_lines,
    not_numbers_note,
    open_bytes,
    read_bytes,
    read_head,
    rel,
    split_lines,
    strip_suffixes,
    text_bytes,
    utf16_kind,
)
from forensics.importers.restarts import (
    assign_segments,
    epoch_local_steps,
    interleaved_note,
    restart_findings,
)
from forensics.schema import conform

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
SKIP_KEYS = set(STEP_KEYS) | set(TIME_KEYS) | {"_runtime"}
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
        # milliseconds since the epoch (times 0.001, as the block reader's polars expression:
        # a division there is one bit off for some values, depending on the rows)
        return x * 0.001 if x > 1e11 else x
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
        return finish(read_lines(path, name, by_series=options.series_order), name)


@dataclass
class Lines:
    """What a run of lines holds, before the file-level steps (segments, notes)."""

    frame: pl.DataFrame  # labelled rows in line order (see by_series), not yet segmented
    bad: list[int] = field(default_factory=list)  # line numbers that are not JSON objects
    # key -> the line numbers where its value was neither a number nor null
    unread: dict[str, list[int]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    relative_time: bool = False  # LLaMA-Factory elapsed_time was the clock
    cut: bool = False  # the last line is cut off mid-record (no newline after it)
    # The tags of the frame's rows when the reader knows them (else found in the frame).
    tags: list[str] | None = None
    # The rows series after series instead (each tag's in line order; block by block for a
    # file of very many tags), read from lines whose steps never go back and whose relative
    # clock never starts again (:func:`_no_restart`'s checks in line order, made by the
    # reader). A stable sort by line gives the rows in line order.
    by_series: bool = False
    fractional: int = 0  # lines whose step is not a whole number (cast down to one)


def parse_lines(
    raw: bytes, name: str, first_line: int = 1, *, fast: bool = True, by_series: bool = False
) -> Lines:
    """The rows of ``raw`` (text bytes, whole lines; ``first_line`` is the number of its
    first line in the file, so that a tail reading appended lines numbers them as a whole
    read would). ``fast=False``: every line through the per-line reader. ``by_series``: the
    rows series after series where that is allowed (:attr:`Lines.by_series`)."""
    from forensics.importers.jsonl_blocks import BlockReader, blocks

    reader = BlockReader(name, first_line, fast=fast, by_series=by_series)
    reader.feed_all(blocks(raw))
    return reader.lines()


def read_lines(path: Path, name: str, *, by_series: bool = False) -> Lines:
    """A file's rows, read block by block (a plain file is never held whole in memory).
    ``by_series``: as :func:`parse_lines`."""
    from forensics.importers import jsonl_blocks
    from forensics.importers.jsonl_blocks import BlockReader

    head = read_head(path, 4096, raw=True)
    if path.name.endswith(COMPRESSED) or utf16_kind(head) is not None:
        return parse_lines(read_bytes(path), name, by_series=by_series)
    reader = BlockReader(name, by_series=by_series)
    with path.open("rb") as fh:
        reader.feed_all(_file_blocks(fh, jsonl_blocks.BLOCK))
    return reader.lines()


def _file_blocks(fh: BinaryIO, size: int) -> Iterator[bytes]:
    """The file's text in blocks of whole lines of about ``size`` bytes (the last may lack
    its newline): a UTF-8 BOM dropped, NUL bytes removed. Where a block's last line ends is
    looked up first, so that the block is read at its length: no chunk is joined to the
    piece of line left over from the one before (a copy of every block)."""
    if not fh.seekable():
        yield from _stream_blocks(fh, size)
        return
    at = 3 if fh.read(3) == b"\xef\xbb\xbf" else 0  # a UTF-8 BOM (text_bytes drops it)
    while True:
        end = _line_end(fh, at + size)
        fh.seek(at)
        block = fh.read(end - at)
        if not block:
            return
        at += len(block)
        yield _no_nul(block)
        del block  # not held while the next block is read


def _line_end(fh: BinaryIO, at: int) -> int:
    """Where the line holding byte ``at - 1`` ends (past its newline; else the file's end)."""
    pos = max(at - 1, 0)
    fh.seek(pos)
    while chunk := fh.read(1 << 16):
        k = chunk.find(b"\n")
        if k >= 0:
            return pos + k + 1
        pos += len(chunk)
    return pos


def _stream_blocks(fh: BinaryIO, size: int) -> Iterator[bytes]:
    """:func:`_file_blocks` of a stream that cannot seek: each chunk read joined to the
    piece of line the chunk before left over."""
    carry = fh.read(3)
    if carry == b"\xef\xbb\xbf":
        carry = b""  # a UTF-8 BOM (text_bytes drops it)
    while chunk := fh.read(size):
        cut = chunk.rfind(b"\n") + 1
        if cut:
            block = _no_nul(b"".join((carry, memoryview(chunk)[:cut])))
            carry = chunk[cut:]
            del chunk  # not held while the block is read
            yield block
            del block
        else:
            carry += chunk
    if carry:
        yield _no_nul(carry)


def _no_nul(data: bytes) -> bytes:
    """NUL bytes removed, as text_bytes does (a crash's zero-filled tail)."""
    return data.replace(b"\x00", b"") if b"\x00" in data else data


def line_rows(
    line: str,
    config: dict[str, Any],
    unread: list[str] | None = None,
    fractional: list[float] | None = None,
) -> tuple[int | None, float | None, list[tuple[str, float]], bool] | None:
    """One line as (step, wall time, [(tag, value)...], relative clock), or None for a line
    that is not a JSON object (or logs a step no trainer logs). Levanter's ``hparams``
    events update ``config``. ``unread`` gets the keys whose value is neither a number nor
    null (``"N/A"``, a list): a metric's value left out where the key logs numbers
    elsewhere (:func:`finish` counts those), else a key that is no metric (a run name).
    ``fractional`` gets the step when it is not a whole number (it is cast down)."""
    obj = _parse(line)
    if obj is None:
        return None
    if obj.get("tracker") == "json_logger":  # Levanter
        event = obj.get("event")
        if event == "hparams" and isinstance(obj.get("hparams"), dict):
            config.update(flatten(obj["hparams"]))
        if event != "log" or not isinstance(obj.get("metrics"), dict):
            return None, None, [], False
        flat = flatten(obj["metrics"])
        flat["step"] = obj.get("step")
    else:
        flat = flatten(obj)
    step = None
    for k in STEP_KEYS:
        x = _number(flat.get(k))
        if x is not None and math.isfinite(x):
            step = int(x)
            if fractional is not None and x != math.floor(x):
                fractional.append(x)
            break
    if step is not None and not -(2**62) < step < 2**62:
        return None  # a step no trainer logs: a corrupt line
    wt = None
    relative = False
    for k in TIME_KEYS:
        if k in flat and (wt := _time(flat[k])) is not None:
            break
    if wt is None and "elapsed_time" in flat:
        wt = _elapsed(flat["elapsed_time"])
        relative = wt is not None
    if wt is None and "_runtime" in flat:  # W&B: seconds since the run started
        wt = _number(flat["_runtime"])
    rows: list[tuple[str, float]] = []
    for k, v in flat.items():
        if k in SKIP_KEYS:
            continue
        x = _number(v)
        if x is not None:
            rows.append((k, x))
        elif unread is not None and v is not None:
            unread.append(k)
    return step, wt, rows, relative


def finish(lines: Lines, name: str) -> ImportResult:
    """A file's rows (:func:`parse_lines`, one call or several concatenated) -> its result:
    restart segments, notes on skipped lines, a cut-off last line as ``truncated_log``.
    Rows series after series (:attr:`Lines.by_series`) stay so when there is no restart;
    else the segmentation puts them in line order (a stable sort by line), as read."""
    notes: list[str] = []
    frame = lines.frame
    if lines.by_series:  # (the reader checked the lines in order: the counters are left)
        quiet = not frame.is_empty() and _counters_hold(frame, lines.tags)
    else:
        quiet = _no_restart(frame, lines.tags)
        if not quiet:
            frame, local = epoch_local_steps(frame, name)
            if local is not None:
                notes.append(local)
                quiet = _no_restart(frame, lines.tags)
    if quiet:
        frame = frame.with_columns(pl.lit(0, dtype=pl.Int32).alias("segment"))
        findings: list[Finding] = []
    else:
        frame = assign_segments(frame)
        if (shared := interleaved_note(frame, name)) is not None:
            notes.append(shared)
        findings = restart_findings(frame)
    bad = lines.bad
    if lines.cut:
        findings.append(
            Finding(
                kind=FindingKind.TRUNCATED_LOG,
                severity=Severity.INFO,
                metric=None,
                start_step=_last_step(frame, series=quiet and lines.by_series),
                measures={"file": name, "line": bad[-1]},
                summary=(
                    f"The last line of {name} is cut off: the writer stopped mid-line, as "
                    "when a job is killed."
                ),
            )
        )
    if bad:
        shown = ", ".join(f"{b:,}" for b in bad[:10]) + (" ..." if len(bad) > 10 else "")
        notes.append(
            f"{name}: skipped {len(bad):,} line(s) that are not JSON objects (line {shown})"
        )
    if lines.unread:
        # A metric's value that is no number ("N/A", a list) where the key logs numbers on
        # other lines: left out, counted. Keys that never log a number are no metrics.
        tags = set(lines.tags) if lines.tags is not None else set(frame["tag"].unique())
        lost = {k: v for k, v in lines.unread.items() if k in tags}
        note = not_numbers_note(name, lost, holders="keys that log numbers on other lines")
        if note:
            notes.append(note)
    if lines.fractional:
        notes.append(
            f"{name}: {lines.fractional:,} line(s) have a step that is not a whole number "
            "(0.5, say: an epoch or a fraction logged as the step); steps are read as whole "
            "numbers, so each such line falls on the whole step below it"
        )
    if lines.relative_time:
        notes.append(
            f"{name}: times are LLaMA-Factory's elapsed_time, seconds since the job started"
        )
        frame, zeros = _without_zero_counts(frame, _LLAMAFACTORY_COUNTS)
        if zeros:
            notes.append(
                f"{name}: {' and '.join(zeros)} printed as 0 on every line (LLaMA-Factory "
                "writes 0 when it does not count the tokens it trains on); those values were "
                "not used"
            )
    return ImportResult(frame=conform(frame), notes=notes, findings=findings, config=lines.config)


# LLaMA-Factory's token counts: "0.00" and 0 on every line unless token counting is on.
_LLAMAFACTORY_COUNTS = ("throughput", "total_tokens")


def _without_zero_counts(
    frame: pl.DataFrame, tags: tuple[str, ...]
) -> tuple[pl.DataFrame, list[str]]:
    """The frame without the rows of each of ``tags`` whose every value is 0 (a placeholder:
    a job that trained did not do so at 0 tokens a second), and the tags dropped."""
    tag = pl.col("tag").cast(pl.Utf8)
    found = (
        frame.filter(tag.is_in(tags))
        .group_by(tag.alias("t"))
        .agg((pl.col("value") == 0).all().alias("zero"), pl.len().alias("n"))
        .filter(pl.col("zero") & (pl.col("n") > 0))
    )
    zeros = sorted(found.get_column("t").to_list())
    if not zeros:
        return frame, []
    return frame.filter(~tag.is_in(zeros)), zeros


def _no_restart(frame: pl.DataFrame, tags: list[str] | None = None) -> bool:
    """True when :func:`assign_segments` would find no restart, known without its per-tag
    sort: the rows are in line order, the steps never go back (so no series' step does),
    no counter falls to less than half and no relative clock starts again (the other
    restarts it looks for, with its thresholds). Then there is also no interleaving note.
    ``tags``: the frame's tags, when known (finding them is a pass over every row)."""
    from forensics.importers.restarts import _MIN_CLOCK_S, _RELATIVE_CLOCK

    if frame.is_empty():
        return False
    rec = frame.get_column("record_idx")
    step = frame.get_column("step").drop_nulls()
    if rec.null_count() or not rec.is_sorted() or not step.is_sorted():
        return False
    if not _counters_hold(frame, tags):
        return False
    w = frame.get_column("wall_time")
    w = w.filter(w.is_finite() & (w >= 0))
    if len(w) > 1 and w.max() < _RELATIVE_CLOCK:  # type: ignore[operator]
        p, cur = w.slice(0, len(w) - 1), w.slice(1)
        if ((p >= _MIN_CLOCK_S) & (cur < 0.5 * p)).any():
            return False
    return True


def _counters_hold(frame: pl.DataFrame, tags: list[str] | None = None) -> bool:
    """No counter (epoch, consumed samples...) falls to less than half of its row before
    (rows with a step; each tag's rows in line order, the frame's as a whole need not be)."""
    from forensics.importers.restarts import counter_tags

    if tags is None:
        tags = frame.get_column("tag").unique().cast(pl.String).to_list()
    counters = counter_tags(tags)
    if counters:
        c = frame.filter(pl.col("tag").is_in(counters) & pl.col("step").is_not_null())
        prev = pl.col("value").shift(1).over("tag")
        if c.select(((prev > 0) & (pl.col("value") < 0.5 * prev)).any()).item():
            return False
    return True


def _last_step(frame: pl.DataFrame, series: bool) -> int:
    """The step of the last line with one (0 if none). ``series``: the rows are series after
    series, from lines whose steps never go back: the largest step is the last."""
    steps = frame.get_column("step")
    if series:
        top = steps.max()
        return 0 if top is None else int(top)  # type: ignore[arg-type]
    last = steps.drop_nulls()
    return int(last[-1]) if len(last) else 0


IMPORTER = JsonlImporter()
