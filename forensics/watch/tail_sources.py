"""One tail per source of a job: each keeps its own result and reads only what changed.

* :class:`RereadTail`: documents rewritten whole (trainer_state.json, an MLflow store, a
  Neptune parquet export, W&B exports and ``.wandb`` files, Megatron golden values) and
  compressed logs (``.gz``/``.zst`` cannot be resumed mid-stream): read again whole by the
  importer when a file's size, time stamp or inode changes.
* :class:`JsonlTail`: JSONL resumes at the last complete line and parses only the lines
  appended (the importer's own :func:`~forensics.importers.jsonl.parse_lines`); the partial
  last line waits for the next poll.
* :class:`PrefixTail`: text logs and Lightning CSV read only the appended bytes from disk
  and keep the complete lines in memory; their parsers need the whole text (family sniffing
  on head and tail, steps borrowed from neighbouring lines, rank copies, the CSV header), so
  the complete lines are parsed again on each change.
* :class:`~forensics.watch.tail_tfevents.TfeventsTail`: event files resume at the last
  complete record.

Every tail's ``result`` is what :func:`forensics.importers.read_source` gives for the same
complete bytes, so merging the tails' results makes the Run a full read would.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from forensics.importers import ReadOptions, Source, finish_source, read_source
from forensics.importers.base import COMPRESSED, ImportResult, rel, utf16_kind
from forensics.importers.restarts import assign_segments
from forensics.schema import SCHEMA, conform
from forensics.watch.tail_files import Cursor, split_complete


class SourceTail:
    """What every tail shares: its source, its finished result and what it cost."""

    mode = "reread"

    def __init__(self, source: Source, options: ReadOptions) -> None:
        self.source = source
        self.options = options
        self.result: ImportResult | None = None
        self.x_notes: list[str] = []
        self.rereads = 0  # whole reads of the source (the first one included)
        self.appends = 0  # polls whose rows were appended alone (see _append)
        self._tags: set[str] = set()
        self._calm = False  # no restart and no step going back in ``result`` so far
        self._last = pl.DataFrame()  # the last row of each tag in ``result``

    @property
    def bytes_read(self) -> int:
        raise NotImplementedError

    def poll(self) -> bool:
        """Read what is new; True when ``result`` changed."""
        raise NotImplementedError

    def update(self, source: Source) -> bool:
        """The same job seen again by discovery (more files, perhaps). False when this tail
        cannot follow the change (the caller then starts a new one)."""
        same = source.files == self.source.files
        if same:
            self.source = source
        return same

    def _finish(self, res: ImportResult) -> None:
        """Take a result the importer's file-level steps made from all rows so far."""
        self.result, self.x_notes = finish_source(self.source, res, self.options)
        frame = self.result.frame
        self._tags = set(frame.get_column("tag").unique().to_list())
        ordered = frame.sort("file_idx", "record_idx", maintain_order=True)
        self._calm = not (frame.get_column("segment").max() or 0) and not _steps_back(ordered)
        self._last = _last_rows(ordered)

    def _append(self, new: pl.DataFrame) -> bool:
        """Rows appended after the rows of ``result`` (canonical columns, record order): when
        they start no restart and bring no new tag, ``result`` grows by them alone (their
        canonical names, segment 0) instead of the file-level steps running on everything
        again. False when that does not hold: the caller then runs those steps."""
        if self.result is None or not self._calm or new.is_empty():
            return False
        if not set(new.get_column("tag").unique().to_list()) <= self._tags:
            return False  # a new series changes per-tag notes (x axis, units): the full way
        last_file = self._last.get_column("file_idx").max()
        if last_file is not None and new.get_column("file_idx").min() < last_file:  # type: ignore[operator]
            return False  # rows that sort before rows already read (two files growing)
        new = conform(new).with_columns(pl.lit(0, dtype=SCHEMA["segment"]).alias("segment"))
        probe = pl.concat([self._last.select(new.columns), new])
        if _steps_back(probe) or (assign_segments(probe).get_column("segment").max() or 0):
            return False  # a restart (a step, a counter or a clock going back)
        res = ImportResult(frame=new)
        add, _ = finish_source(self.source, res, self.options)
        self.result.frame = pl.concat([self.result.frame, add.frame])
        self.appends += 1
        self._last = _last_rows(pl.concat([self._last, add.frame]))
        return True


class RereadTail(SourceTail):
    """A source read again whole when any of its files changes (size, time stamp, inode)."""

    def __init__(self, source: Source, options: ReadOptions) -> None:
        super().__init__(source, options)
        self._stamp: tuple[tuple[int, int, int], ...] | None = None
        self._bytes = 0

    @property
    def bytes_read(self) -> int:
        return self._bytes

    def _files(self) -> list[Path]:
        return [*self.source.files, *self.source.options.get("also_claims", [])]

    def poll(self) -> bool:
        stamp = []
        for f in self._files():
            try:
                st = os.stat(f)
            except OSError:
                stamp.append((0, -1, -1))
                continue
            stamp.append((st.st_ino, st.st_size, st.st_mtime_ns))
        now = tuple(stamp)
        if now == self._stamp and self.result is not None:
            return False
        self.result, self.x_notes = read_source(self.source, self.options)
        self._stamp = now
        self._bytes += sum(size for _, size, _ in now if size > 0)
        self.rereads += 1
        return True


class _LineTail(SourceTail):
    """A one-file source of lines: a cursor, the partial last line carried to the next poll.
    Falls back to :class:`RereadTail` behaviour for UTF-16 files."""

    mode = "incremental"

    def __init__(self, source: Source, options: ReadOptions) -> None:
        super().__init__(source, options)
        self.cursor = Cursor(source.files[0])
        self.carry = b""
        self.done = 0  # bytes of complete lines taken in
        self.name = rel(source.files[0], source.root)
        self._fallback: RereadTail | None = None

    @property
    def bytes_read(self) -> int:
        return self.cursor.bytes_read + (self._fallback.bytes_read if self._fallback else 0)

    def poll(self) -> bool:
        if self._fallback is not None:
            changed = self._fallback.poll()
            self.result, self.x_notes = self._fallback.result, self._fallback.x_notes
            self.rereads = self._fallback.rereads
            return changed
        got = self.cursor.read_new()
        if got.reset:
            self.carry, self.done = b"", 0
            self.result, self._calm = None, False
            self.reset()
        first = self.cursor.offset == len(got.data)  # these bytes start the file
        if first and utf16_kind(got.data[:4096]):
            self.mode = "reread"
            self._fallback = RereadTail(self.source, self.options)
            return self.poll()
        lines, self.carry = split_complete(self.carry, got.data)
        if not lines and not got.reset:
            return False
        if not self.done and lines.startswith(b"\xef\xbb\xbf"):
            lines = lines[3:]  # a UTF-8 BOM (read_bytes drops it too)
        self.done += len(lines)
        if b"\x00" in lines:
            lines = lines.replace(b"\x00", b"")  # NUL bytes, as read_bytes drops them
        self.add(lines)
        return True

    def reset(self) -> None:
        raise NotImplementedError

    def add(self, lines: bytes) -> None:
        """Take in complete lines (possibly none, after a reset) and update ``result``."""
        raise NotImplementedError


class JsonlTail(_LineTail):
    """JSONL: only appended lines are parsed; the file-level steps run on the whole."""

    def __init__(self, source: Source, options: ReadOptions) -> None:
        super().__init__(source, options)
        self.reset()

    def reset(self) -> None:
        from forensics.importers.jsonl import Lines

        self.lines = Lines(frame=pl.DataFrame())
        self.n_lines = 0
        self.rereads += 1

    def add(self, lines: bytes) -> None:
        from forensics.importers.jsonl import Lines, finish, parse_lines

        if lines:
            got = parse_lines(lines, self.name, first_line=self.n_lines + 1)
            # In line order (as finish() would sort the whole, stably): the whole then stays
            # in order and its segmentation needs no sort.
            got.frame = got.frame.sort("record_idx", maintain_order=True)
            self.n_lines += lines.count(b"\n")
            acc = self.lines
            # Lines that change no note or config (a relative clock already noted is fine).
            calm = not (got.bad or got.config or got.unread or got.fractional) and (
                acc.relative_time or not got.relative_time
            )
            frame = got.frame if acc.frame.is_empty() else pl.concat([acc.frame, got.frame])
            self.lines = Lines(
                frame=frame,
                bad=acc.bad + got.bad,
                unread={
                    k: acc.unread.get(k, []) + got.unread.get(k, [])
                    for k in (*acc.unread, *(k for k in got.unread if k not in acc.unread))
                },
                config={**acc.config, **got.config},
                relative_time=acc.relative_time or got.relative_time,
                fractional=acc.fractional + got.fractional,
            )
            if calm and self._append(got.frame):
                return
        if self.lines.frame.is_empty():
            self.result = None
            return
        self._finish(finish(self.lines, self.name))


class PrefixTail(_LineTail):
    """Text logs and Lightning CSV: appended bytes read, the complete lines parsed whole."""

    def __init__(self, source: Source, options: ReadOptions) -> None:
        super().__init__(source, options)
        self.text = bytearray()

    def reset(self) -> None:
        self.text = bytearray()
        self.rereads += 1

    def add(self, lines: bytes) -> None:
        from forensics.importers import _importer

        self.text += lines
        if not self.text:
            self.result = None
            return
        importer = _importer(self.source.importer).IMPORTER
        self._finish(importer.read_raw(self.source, bytes(self.text)))


def _last_rows(frame: pl.DataFrame) -> pl.DataFrame:
    """The last row of each tag (rows in record order), columns as given."""
    return frame.group_by("tag", maintain_order=True).last().select(frame.columns)


def _steps_back(frame: pl.DataFrame) -> bool:
    """Does any series' step go back (rows in record order)? Such a step-back is a restart
    or two writers interleaving; either way the importer's segmentation must judge it."""
    back = pl.col("step") < pl.col("step").shift(1).over("tag")
    return bool(frame.select(back.fill_null(False).any()).item())


def tail_for(source: Source, options: ReadOptions) -> SourceTail:
    """The tail that reads ``source`` as incrementally as its format allows."""
    from forensics.watch.tail_tfevents import TfeventsTail

    compressed = any(f.name.endswith(COMPRESSED) for f in source.files)
    if compressed:
        return RereadTail(source, options)
    if source.importer == "tfevents":
        return TfeventsTail(source, options)
    if source.importer == "jsonl":
        return JsonlTail(source, options)
    if source.importer in ("text_logs", "lightning_csv"):
        return PrefixTail(source, options)
    return RereadTail(source, options)
