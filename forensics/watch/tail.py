"""Reading a run that is still being written.

:class:`RunTail` is the one interface the watcher and the benchmarks use: ``poll()`` reads
whatever is new and says whether the run changed; ``run`` is the run as read so far.

Each source of the job has its own tail (:mod:`forensics.watch.tail_sources`): line formats
and event files resume where they stopped and parse only what was appended; documents that
are rewritten whole are read again when they change. The job's sources are merged into a Run
on each change (:func:`forensics.importers.merge_job`), as a whole read merges them, so
``run.frame`` is the frame :func:`~forensics.importers.read_run` would give on the complete
lines and records written so far. Discovery runs again when the folder's file list changes
or a file no importer claimed yet grows (a log that printed its first metric line). Nothing
is written anywhere: the run cache is neither read nor filled.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from forensics.errors import MultipleJobsError, UnknownFormatError, UnreadableInputError
from forensics.importers import ReadOptions, Source, discover, group_jobs, list_files, merge_job
from forensics.importers.base import ImportResult
from forensics.run import Run
from forensics.watch.tail_sources import SourceTail, tail_for

_Key = tuple[str, str, int]


class RunTail:
    """A run folder (or file) read forward on each poll, as far as its records are complete.

    Attributes:
        path: what the user pointed at.
        run: the run as read so far (None before the first poll that found a log).
        bytes_read: bytes read from disk over the tail's life (the cost of polling; the
            sniffing of discovery is not counted).
        last_change: ``time.monotonic()`` of the last poll that found new data.
        sources: one :class:`~forensics.watch.tail_sources.SourceTail` per source of the
            job, with its own ``bytes_read``, ``mode`` (incremental or reread) and
            ``rereads`` (reads from the start).
        discoveries: how many times the folder was discovered.
    """

    def __init__(self, path: str | os.PathLike[str], options: ReadOptions | None = None) -> None:
        self.path = Path(path)
        self.options = options
        self.run: Run | None = None
        self.last_change: float | None = None
        self.sources: dict[_Key, SourceTail] = {}
        self.discoveries = 0
        self._job: tuple[str, list[Source]] | None = None
        self._listing: dict[Path, tuple[int, int]] | None = None
        self._spent = 0  # bytes read by tails since dropped

    @property
    def bytes_read(self) -> int:
        return self._spent + sum(t.bytes_read for t in self.sources.values())

    def _list(self) -> dict[Path, tuple[int, int]]:
        files = [self.path] if self.path.is_file() else list_files(self.path)
        out: dict[Path, tuple[int, int]] = {}
        for f in files:
            try:
                st = f.stat()
            except OSError:
                continue
            out[f] = (st.st_size, st.st_mtime_ns)
        return out

    def _claimed(self) -> set[Path]:
        job = self._job[1] if self._job else []
        return {f for s in job for f in [*s.files, *s.options.get("also_claims", [])]}

    def _needs_discovery(self, listing: dict[Path, tuple[int, int]]) -> bool:
        if self._listing is None or set(listing) != set(self._listing):
            return True
        claimed = self._claimed()
        return any(listing[f] != self._listing[f] for f in listing if f not in claimed)

    def _discover(self) -> bool:
        """Find the job's sources again; True when the set of tails changed."""
        self.discoveries += 1
        try:
            jobs = group_jobs(discover(self.path))
        except (UnknownFormatError, UnreadableInputError):
            self._job = None  # nothing recognisable yet (an empty folder, a log's preamble)
            return self._drop_all()
        if len(jobs) > 1:
            raise MultipleJobsError(str(self.path), sorted(jobs))
        ((job, sources),) = jobs.items()
        self._job = (job, sources)
        options = self.options or ReadOptions()
        fresh: dict[_Key, SourceTail] = {}
        changed = False
        for s in sources:
            key = self._key(s, fresh)
            old = self.sources.pop(key, None)
            if old is not None and old.update(s):
                fresh[key] = old
                continue
            if old is not None:
                self._spent += old.bytes_read
            fresh[key] = tail_for(s, options)
            changed = True
        changed = changed or bool(self.sources)
        self._drop_all()
        self.sources = fresh
        return changed

    def _drop_all(self) -> bool:
        had = bool(self.sources)
        self._spent += sum(t.bytes_read for t in self.sources.values())
        self.sources = {}
        return had

    @staticmethod
    def _key(s: Source, taken: dict[_Key, SourceTail]) -> _Key:
        n = 0
        while (s.importer, s.job, n) in taken:
            n += 1
        return (s.importer, s.job, n)

    def poll(self) -> bool:
        """Read what is new; True when the run changed since the last poll.

        A folder with nothing recognisable yet is no error (``run`` stays None). Raises
        MultipleJobsError when the folder holds several jobs, and the importers' one-line
        UnreadableInputError for a file that is corrupt rather than still being written."""
        try:
            listing = self._list()
        except UnreadableInputError:
            listing = {}  # the folder is not there (yet, or any more)
        changed = False
        if self._needs_discovery(listing):
            changed = self._discover()
        self._listing = listing
        for tail in self.sources.values():
            changed = tail.poll() or changed
        if not changed:
            return False
        run = self._merge()
        if run is None:
            return False
        self.run = run
        self.last_change = time.monotonic()
        return True

    def _merge(self) -> Run | None:
        if self._job is None:
            return None
        job = self._job[0]
        results: list[tuple[Source, ImportResult]] = []
        x_notes: list[str] = []
        for tail in self.sources.values():
            if tail.result is not None:
                results.append((tail.source, tail.result))
                x_notes.extend(tail.x_notes)
        if not results:
            return None
        try:
            every = [t.source for t in self.sources.values()]
            return merge_job(self.path, job, every, results, x_notes, self.options)
        except UnreadableInputError:
            return None  # no metric with a step yet
