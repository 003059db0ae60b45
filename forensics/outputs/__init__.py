"""CI outputs beside the findings document: SARIF for code scanning, JUnit XML for test tabs.

Each module turns a :class:`~forensics.diagnosis.Diagnosis` into one part (a SARIF run, a
JUnit test suite) so that ``--all`` can put every job of a folder into one file. Files are
written atomically: a CI step that reads them never sees half a file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from forensics.errors import ForensicsError

__all__ = ["atomic_write_text", "log_file_for"]


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and os.replace."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
                fh.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ForensicsError(f"{path}: cannot write ({exc.strerror or exc})") from None


def log_file_for(run: object, rel_file: str | None) -> Path | None:
    """The absolute path of a log file named relative to the folder the run was read from.

    Importers name files relative to the path the user gave; with ``--all`` that is a parent
    of the job's own folder, so the run's folder and its parents are tried in turn.
    """
    if not rel_file:
        return None
    run_path = Path(getattr(run, "path", "."))
    if run_path.is_file():
        if run_path.name == Path(rel_file).name:
            return run_path
        run_path = run_path.parent
    for base in (run_path, *run_path.parents):
        cand = base / rel_file
        if cand.is_file():
            return cand
    return None
