"""The project's own exception types. The CLI maps them to exit code 2 in one place."""

from __future__ import annotations

import os


class ForensicsError(Exception):
    """Base class: a problem with the user's input that deserves a one-line message."""


class UnknownFormatError(ForensicsError):
    """No importer recognised the path."""


class UnreadableInputError(ForensicsError):
    """A file was recognised but could not be read (corrupt, empty, no steps)."""


class MultipleJobsError(ForensicsError):
    """The path holds several distinct training jobs; we refuse to guess which one."""

    def __init__(self, path: str, jobs: list[str], one_file: bool = False) -> None:
        self.jobs = jobs
        what = "file" if not os.path.isdir(path) else "folder"
        how = (
            # (runs inside one file, a W&B panel export: no path points at one of them)
            f"use --all to analyze each, or compare the {what} to put them side by side"
            if one_file
            else "point at one of them, or use --all to analyze each"
        )
        super().__init__(
            f"{path} holds {len(jobs)} separate training jobs ({summarize(jobs)}); {how}"
        )


def summarize(names: list[str], n: int = 10) -> str:
    """A list of names for one line: all of them when few, else the first n and the count."""
    if len(names) <= n:
        return ", ".join(names)
    return f"{', '.join(names[:n])} ... (first {n} of {len(names)})"


class ConfigError(ForensicsError):
    """A bad value in [tool.forensics] / forensics.toml or on the command line."""
