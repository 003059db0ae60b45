"""TensorBoard event files read forward, record by record.

Each file keeps the offset after its last complete record (TFRecord framing: length, length
CRC, data, data CRC). A record still being written waits in ``carry`` for the next poll. New
event files of the job (a restart opens one) are picked up as discovery lists them; a file
that sorts before one already read, shrinks or is replaced sends the whole source back to a
fresh read. Records are decoded with the importer's own :func:`decode_framed` and assembled
with its :func:`assemble`, so the result is the importer's on the same complete records.
Anything the framing walk does not take as complete records or a record still being written
(a bad length CRC, a zero-filled block, a foreign file) is left to the importer's whole read,
which knows how to report it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from forensics.importers import ReadOptions, Source
from forensics.importers.base import rel
from forensics.importers.tfevents import (
    MAX_RECORD,
    NAME,
    _crc_function,
    _prefix_tags,
    _prefixed,
    _x_kind_expr,
    assemble,
    decode_framed,
)
from forensics.importers.tfevents_scan import header_ok, length_crc_ok, masked, walk
from forensics.watch.tail_files import Cursor
from forensics.watch.tail_sources import RereadTail, SourceTail


class _EventFile:
    def __init__(self, path: Path) -> None:
        self.cursor = Cursor(path)
        self.carry = b""
        self.records = 0  # complete records decoded so far (the next record's index)
        self.bad_crc = 0


class TfeventsTail(SourceTail):
    mode = "incremental"

    def __init__(self, source: Source, options: ReadOptions) -> None:
        super().__init__(source, options)
        self._spent = 0  # bytes of files and whole reads given up
        self._crc = _crc_function() if options.verify_crc else None
        self._fallback: RereadTail | None = None
        self._start()

    def _start(self) -> None:
        self._spent += sum(f.cursor.bytes_read for f in getattr(self, "files", []))
        self.files = [_EventFile(p) for p in self.source.files]
        self.parts: list[pl.DataFrame] = []
        self.fresh: list[pl.DataFrame] = []  # rows of this poll
        self.plain = True  # this poll found nothing but plain scalar records
        self.plugin_of: dict[str, str] = {}
        self.purges: list[tuple[int, int, int]] = []
        self.config: dict[str, Any] = {}
        self.hists: dict[str, float] = {}  # histogram tag -> norm error bound (tb_histograms)
        self.skipped: dict[str, int] = {}
        self.rereads += 1
        self.result, self._calm = None, False

    @property
    def bytes_read(self) -> int:
        spent = self._spent + sum(f.cursor.bytes_read for f in self.files)
        return spent + (self._fallback.bytes_read if self._fallback else 0)

    def update(self, source: Source) -> bool:
        if self._fallback is not None:
            ok = self._fallback.update(source)
            self.source = self._fallback.source
            return ok
        old = self.source.files
        if source.files[: len(old)] != old:
            return False  # a file gone or sorted before those read: start again
        self.source = source
        self.files += [_EventFile(p) for p in source.files[len(old) :]]
        return True

    def poll(self) -> bool:
        if self._fallback is not None:
            changed = self._fallback.poll()
            self.result, self.x_notes = self._fallback.result, self._fallback.x_notes
            return changed
        changed, self.fresh, self.plain = False, [], True
        for file_idx, ef in enumerate(self.files):
            got = ef.cursor.read_new()
            if got.reset:  # shrank or replaced: every file read again from its start
                self._start()
                return self.poll() or True
            if not got.data:
                continue
            buf = ef.carry + got.data if ef.carry else got.data
            taken = self._take(file_idx, ef, buf)
            if taken is None:
                return self._give_up()
            changed = changed or taken
        if changed and self.plain and self._append_fresh():
            return True
        if changed or (self.result is None and self.parts):
            self._assemble()
            return True
        return False

    def _give_up(self) -> bool:
        """Framing a file being appended to does not show (a bad length CRC, a zero-filled
        block, a foreign file): from now on the importer reads the source whole, and
        reports what it finds (or raises its one-line error)."""
        self.mode = "reread"
        self._spent += sum(f.cursor.bytes_read for f in self.files)
        self.files = []
        self._fallback = RereadTail(self.source, self.options)
        return self.poll()

    def _take(self, file_idx: int, ef: _EventFile, buf: bytes) -> bool | None:
        """Decode the complete records at the start of ``buf``; None when the framing is not
        that of a file being appended to (left to a whole read)."""
        if ef.records == 0 and len(buf) >= 12 and not header_ok(buf[:12]):
            return None
        fr = walk(buf, MAX_RECORD)
        a = np.frombuffer(buf, dtype=np.uint8)
        if not length_crc_ok(a, fr.offs).all() or fr.stop not in ("eof", "short"):
            return None
        k = len(fr.offs)
        ef.carry = bytes(buf[fr.end :]) if fr.end < len(buf) else b""
        if k == 0:
            return False
        offs, lens = fr.offs, fr.lens
        keep = np.ones(k, dtype=bool)
        if self._crc is not None:
            view = memoryview(buf)
            for i, (o, ln) in enumerate(zip(offs.tolist(), lens.tolist(), strict=True)):
                stored = int.from_bytes(view[o + 12 + ln : o + 16 + ln], "little")
                keep[i] = masked(self._crc(view[o + 12 : o + 12 + ln])) == stored
            ef.bad_crc += int((~keep).sum())
        try:
            df, proto = decode_framed(buf, a, offs, lens, keep, self.plugin_of)
        except ValueError:
            return None
        base = ef.records
        ef.records += k
        path = self.source.files[file_idx]
        name = rel(path, self.source.root)
        df = df.with_columns(
            pl.col("record_idx") + base,
            pl.lit(file_idx, dtype=pl.Int32).alias("file_idx"),
            pl.lit(name).alias("file"),
        )
        job_dir: Path = self.source.options.get("job_dir", self.source.root)
        if df.height:
            df = _prefix_tags(df, path.parent, job_dir)
            self.parts.append(df)
            self.fresh.append(df)
        if proto.purges or proto.hparams or proto.skipped or proto.hist or not keep.all():
            self.plain = False
        self.purges.extend((file_idx, base + r, s) for r, s in proto.purges)
        self.config.update(proto.hparams)
        for t, e in _prefixed(proto.hist, path.parent, job_dir).items():
            self.hists[t] = max(self.hists.get(t, 0.0), e)
        for kind, n in proto.skipped.items():
            self.skipped[kind] = self.skipped.get(kind, 0) + n
        return True

    def _append_fresh(self) -> bool:
        """Plain scalar records appended (no purge, hparams, tensor without metadata or
        skipped kind): try growing the result by them alone (see SourceTail._append).

        Records that brought no rows (a new file's header, a graph) leave nothing to append:
        the whole assembly runs instead, so the new file is named as a whole read names it."""
        if not self.fresh:
            return False
        new = pl.concat(self.fresh) if len(self.fresh) > 1 else self.fresh[0]
        if new.get_column("_tensor").any():
            return False
        new = new.drop("_tensor").sort("file_idx", "record_idx", maintain_order=True)
        new = new.with_columns(pl.lit(NAME).alias("source"), _x_kind_expr(new))
        return self._append(new)

    def _assemble(self) -> None:
        # Files in name order, as a whole read concatenates them.
        parts = sorted(self.parts, key=lambda p: int(p.get_column("file_idx")[0]))
        if len(parts) > 1:
            self.parts = [pl.concat(parts, how="vertical")]
        notes = [
            f"{rel(p, self.source.root)}: {ef.bad_crc} record(s) failed the CRC check and were "
            "skipped"
            for p, ef in zip(self.source.files, self.files, strict=True)
            if ef.bad_crc
        ]
        res = assemble(
            self.source,
            list(self.parts),
            self.plugin_of,
            list(self.purges),
            [],
            notes,
            dict(self.config),
            dict(self.skipped),
            dict(self.hists),
        )
        self._finish(res)
