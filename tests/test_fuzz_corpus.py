"""The fuzzing corpus as regression tests: every kept input gives a Run or one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from forensics.errors import ForensicsError
from forensics.importers import read_run

CORPUS = Path(__file__).parent / "fuzz_corpus"
FILES = sorted(
    p
    for p in CORPUS.rglob("*")
    if p.is_file() and p.suffix != ".txt" and p.name[0] not in "._" and p.name != "README.md"
)
MUST_READ_FAILS = {"hfdeep"}  # beyond any JSON parser's nesting limit: one line is right


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(CORPUS)) for p in FILES])
def test_corpus_input(tmp_path: Path, path: Path) -> None:
    """A kept input: read into a Run (issue 18's must be), or the project's one-line error."""
    label, name = path.name.split("__", 1)
    (tmp_path / name).write_bytes(path.read_bytes())
    try:
        run = read_run(tmp_path)
    except ForensicsError as exc:
        assert "\n" not in str(exc)
        assert path.parent.name != "issue18" or label in MUST_READ_FAILS, str(exc)
        return
    assert path.parent.name != "issue18" or label not in MUST_READ_FAILS
    if path.parent.name == "issue18":
        assert run.frame.height > 0
