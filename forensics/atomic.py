"""Outputs written atomically: a temporary file in the target folder, then one rename.

A reader polling the report while ``analyze`` runs sees the old file or the new one, never an
empty or partial page; a full disk or a killed process leaves no partial file behind (the
temporary file is removed). Replacing the directory entry instead of writing through it also
means a report path that is a hard link to another file (a file of the run: evidence) leaves
that file untouched.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from forensics.errors import ForensicsError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` in one rename.

    On any error the temporary file is removed and ``path`` is left as it was. OS errors
    become a one-line :class:`ForensicsError` naming ``path``.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name[:100]}.", suffix=".tmp"
        )
    except OSError as exc:
        raise ForensicsError(f"{path}: cannot write ({exc.strerror or exc})") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a report is an ordinary file
        os.replace(tmp, path)
    except OSError as exc:
        raise ForensicsError(f"{path}: cannot write ({exc.strerror or exc})") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()  # gone already after a successful replace


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write text (UTF-8) or bytes to ``path`` atomically (see :func:`atomic_path`)."""
    payload = data.encode("utf-8", "replace") if isinstance(data, str) else data
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())


def write_with(path: Path, writer: Callable[[Path], object]) -> None:
    """Let ``writer`` fill a temporary file (polars' write_parquet), then rename it to ``path``."""
    with atomic_path(path) as tmp:
        writer(tmp)
