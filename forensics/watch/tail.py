"""Reading a run that is still being written.

:class:`RunTail` is the one interface the watcher and the benchmarks use: ``poll()`` reads
whatever is new and says whether the run changed; ``run`` is the run as read so far.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from forensics.importers import ReadOptions, list_files, read_run
from forensics.run import Run


class RunTail:
    """A run folder (or file) read again on each poll, as far as its files are complete.

    Attributes:
        path: what the user pointed at.
        run: the run as read so far (None before the first poll that found a log).
        bytes_read: bytes read from disk over the tail's life (the cost of polling).
        last_change: ``time.monotonic()`` of the last poll that found new data.
    """

    def __init__(self, path: str | os.PathLike[str], options: ReadOptions | None = None) -> None:
        self.path = Path(path)
        self.options = options
        self.run: Run | None = None
        self.bytes_read = 0
        self.last_change: float | None = None
        self._seen: dict[Path, tuple[int, int]] = {}

    def _fingerprint(self) -> dict[Path, tuple[int, int]]:
        files = [self.path] if self.path.is_file() else list_files(self.path)
        out: dict[Path, tuple[int, int]] = {}
        for f in files:
            try:
                st = f.stat()
            except OSError:
                continue
            out[f] = (st.st_size, st.st_mtime_ns)
        return out

    def poll(self) -> bool:
        """Read what is new; True when the run changed since the last poll.

        This first version re-reads the whole run when any file changed; incremental
        readers replace it per format without changing this interface.
        """
        seen = self._fingerprint()
        if seen == self._seen and self.run is not None:
            return False
        run = read_run(self.path, options=self.options)
        self.bytes_read += sum(size for size, _ in seen.values())
        self._seen = seen
        self.run = run
        self.last_change = time.monotonic()
        return True
