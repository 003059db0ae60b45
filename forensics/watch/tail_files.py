"""Reading only what was appended to a file since the last poll.

A :class:`Cursor` remembers where it stopped in one file (its inode, the byte offset read up
to, the first bytes it saw). Each :meth:`Cursor.read_new` returns the bytes appended since,
or says the file must be read again from the start: it was replaced (another inode), it
shrank below the offset, or its first bytes changed (a writer that rewrites the whole file,
such as Lightning's CSV logger when a new column appears). Nothing is ever written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_HEAD = 256  # first bytes remembered to notice a file rewritten in place


@dataclass
class Appended:
    """What :meth:`Cursor.read_new` found."""

    data: bytes  # the bytes appended since the last call (from 0 after a reset)
    reset: bool  # the file was replaced or rewritten: everything read before is void


class Cursor:
    """One file read forward across polls; ``bytes_read`` counts what came from disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ino: int | None = None
        self.offset = 0
        self.head = b""
        self.stamp: tuple[int, int] | None = None  # (size, mtime_ns) at the last read
        self.bytes_read = 0

    def read_new(self) -> Appended:
        """The bytes appended since the last call (see the module docstring for resets).

        Raises OSError when the file cannot be opened (gone, permission)."""
        st = os.stat(self.path)
        stamp = (st.st_size, st.st_mtime_ns)
        if stamp == self.stamp and st.st_ino == self.ino:
            return Appended(b"", False)
        reset = self.ino is not None and (st.st_ino != self.ino or st.st_size < self.offset)
        with open(self.path, "rb") as fh:
            if not reset and self.head:
                now = fh.read(len(self.head))
                self.bytes_read += len(now)
                reset = now != self.head
            if reset:
                self.offset, self.head = 0, b""
            fh.seek(self.offset)
            data = fh.read(max(0, st.st_size - self.offset))
        self.bytes_read += len(data)
        self.offset += len(data)
        if len(self.head) < _HEAD:
            self.head = (self.head + data)[:_HEAD]
        self.ino, self.stamp = st.st_ino, stamp
        return Appended(data, reset)


def split_complete(carry: bytes, data: bytes) -> tuple[bytes, bytes]:
    """(complete lines, the partial last line to carry to the next poll)."""
    buf = carry + data if carry else data
    cut = buf.rfind(b"\n") + 1
    return buf[:cut], buf[cut:]
