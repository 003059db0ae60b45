"""A big plain text log is mapped, not read whole (forensics/importers/text/engine.py,
``map_text``): the importer must give the same frame, notes and findings as from the file's
bytes, and must read (not map) every log whose bytes the reading would change."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from forensics.importers import ReadOptions
from forensics.importers.base import Source
from forensics.importers.text import IMPORTER, engine, megatron
from forensics.importers.text.engine import MappedText, map_text
from tests.test_import_text_layout import _log

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "pretrain_gpt.py", line 10, in <module>\n'
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
)


def _source(path: Path) -> Source:
    return Source("text_logs", [path], path.name, path.parent, scope="file")


@pytest.fixture
def mapped(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every log is mapped whatever its size; records, per read, whether it was."""
    monkeypatch.setattr(engine, "MAP_BYTES", 0)
    seen: list[bool] = []
    real = engine.map_text

    def spy(path: Path) -> MappedText | None:
        out = real(path)
        seen.append(out is not None)
        return out

    monkeypatch.setattr("forensics.importers.text.map_text", spy)
    return seen


def _same(path: Path, raw: bytes) -> None:
    """The file read through the importer (mapped or not) = its bytes parsed."""
    got = IMPORTER.read(_source(path), ReadOptions())
    ref = IMPORTER.read_raw(_source(path), raw, series_order=True)  # (read's default)
    assert got.frame.height > 0
    assert got.frame.equals(ref.frame)
    assert got.notes == ref.notes
    assert [f.to_dict() for f in got.findings] == [f.to_dict() for f in ref.findings]


def _noisy(seed: int) -> bytes:
    """Rank copies, validation lines, odd lines, a key printed from mid-run."""
    raw = _log(1500, seed=seed, noise=True, restart_at=700)
    lines = raw.decode().splitlines()
    out = []
    for i, ln in enumerate(lines):
        if i > 900 and "iteration" in ln and "|" in ln and "validation" not in ln:
            ln += " number of nan iterations:   0 |"  # a key added by a later version
        out.append(ln)
    return ("\n".join(out) + "\n").encode()


@pytest.mark.parametrize("pieces", [False, True])
def test_mapped_log_equals_its_bytes(
    pieces: bool, mapped: list[bool], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = _noisy(seed=3) + TRACEBACK.encode()  # a crash; the last line has no newline
    if pieces:
        monkeypatch.setattr(megatron, "CHUNK_BYTES", 90_000)
        assert len(megatron._spans(raw, megatron.CHUNK_BYTES)) >= 4
    path = tmp_path / "train.log"
    path.write_bytes(raw)
    _same(path, raw)
    assert mapped == [True]
    found = IMPORTER.read(_source(path), ReadOptions()).findings
    assert any("out of memory" in f.summary.lower() for f in found)


def test_mapped_log_with_invalid_utf8(mapped: list[bool], tmp_path: Path) -> None:
    raw = _noisy(seed=4)
    at = raw.index(b"| lm loss", len(raw) // 2)
    raw = raw[:at] + b"| caf\xe9 \xff |" + raw[at:]  # latin-1 bytes inside an iteration line
    path = tmp_path / "train.log"
    path.write_bytes(raw)
    _same(path, raw)
    assert mapped == [True]


@pytest.mark.parametrize(
    "change",
    ["crlf", "cr", "ansi", "nul", "bom", "utf16"],
)
def test_logs_the_reading_changes_are_read(change: str, mapped: list[bool], tmp_path: Path) -> None:
    """Bytes that text_bytes or clean would change: the file is read, never mapped (a map
    would keep a progress bar's carriage return, and lose the line it hides)."""
    text = _log(600, seed=5).decode()
    lines = text.splitlines()
    if change == "crlf":
        text = "\r\n".join(lines) + "\r\n"
    elif change == "cr":
        # A progress bar redrawn on one line: iteration 601 only shows after the \r.
        text += " iteration      601/     601 | lm loss: 1.000000E+00 |\r"
        text += " iteration      602/     602 | lm loss: 9.000000E-01 |\n"
    elif change == "ansi":
        text = "\n".join(f"\x1b[32m{ln}\x1b[0m" for ln in lines) + "\n"
    elif change == "nul":
        text += "\x00" * 64
    elif change == "bom":
        text = "\ufeff" + text
    path = tmp_path / "train.log"
    raw = text.encode("utf-16-le" if change == "utf16" else "utf-8")
    path.write_bytes(raw)
    assert map_text(path) is None
    got = IMPORTER.read(_source(path), ReadOptions())
    assert mapped == [False]
    if change == "cr":
        steps = got.frame.filter(got.frame.get_column("tag") == "lm loss").get_column("step")
        assert {601, 602} <= set(steps.to_list())
    if change != "utf16":
        plain = tmp_path / "plain.log"
        plain.write_bytes(_log(600, seed=5))
        ref = IMPORTER.read(_source(plain), ReadOptions()).frame
        if change in ("crlf", "ansi", "nul", "bom"):
            assert got.frame.drop("file").equals(ref.drop("file"))


def test_a_file_that_cannot_be_mapped_is_read(
    mapped: list[bool], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system without mmap: the log is read, not refused."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(19, "No such device")

    monkeypatch.setattr(engine.mmap, "mmap", refuse)
    raw = _noisy(seed=7)
    path = tmp_path / "train.log"
    path.write_bytes(raw)
    _same(path, raw)
    assert mapped == [False]


def test_small_logs_are_read(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(_log(100, seed=6))
    assert map_text(path) is None  # under MAP_BYTES: a read costs little


@pytest.mark.parametrize("seed", range(4))
def test_mapped_text_acts_as_bytes(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every bytes method the importer calls gives the same answer on the map."""
    monkeypatch.setattr(engine, "MAP_BYTES", 0)
    rng = random.Random(seed)
    alphabet = b"ab\n|:  9"
    raw = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 5000)))
    raw += b"\n" if seed % 2 else b"x"
    path = tmp_path / "t.log"
    path.write_bytes(raw)
    m = map_text(path)
    assert m is not None
    n = len(raw)
    assert len(m) == n and bytes(m) == raw and m[:] == raw
    assert m.decode("utf-8", "replace") == raw.decode("utf-8", "replace")
    assert m.endswith(b"\n") == raw.endswith(b"\n") and m.endswith(b"9x") == raw.endswith(b"9x")
    for _ in range(50):
        a, b = sorted(rng.randint(-n - 2, n + 2) for _ in range(2))
        assert m[a:b] == raw[a:b]
        assert m[-abs(a) :] == raw[-abs(a) :]
        lo, hi = sorted(rng.randint(0, n) for _ in range(2))
        for sub in (b"\n", b"|", b"a:", b"zz"):
            assert m.find(sub, lo) == raw.find(sub, lo)
            assert m.count(sub, lo, hi) == raw.count(sub, lo, hi)
            assert (sub in m) == (sub in raw)
    # Counted a block at a time: block edges inside the range change nothing.
    monkeypatch.setattr(MappedText, "BLOCK", 7)
    for _ in range(20):
        lo, hi = sorted(rng.randint(0, n) for _ in range(2))
        assert m.count(b"\n", lo, hi) == raw.count(b"\n", lo, hi)
        assert m.count(b"\n", lo) == raw.count(b"\n", lo)


@pytest.mark.parametrize("seed", range(3))
def test_the_c_library_search_finds_what_bytes_find_finds(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A phrase searched in a big map goes to the C library's memmem (4x faster than
    ``mmap.find`` on Megatron's "saved checkpoint " over a 1M-step log): the same first
    occurrence, from any start to any end, at the map's edges and where there is none."""
    from forensics.importers.text import search

    if not search.available():
        pytest.skip("no C library memmem here (the map keeps Python's search)")
    monkeypatch.setattr(engine, "MAP_BYTES", 0)
    monkeypatch.setattr(engine, "_LIBC_FROM", 0)  # (every search through the C library)
    called = []
    real = search.find
    monkeypatch.setattr(
        search,
        "find",
        lambda *a: called.append(a[1]) or real(*a),  # type: ignore[func-returns-value]
    )
    rng = random.Random(seed)
    raw = bytes(rng.choice(b"ab \n|") for _ in range(rng.randint(2000, 6000)))
    raw = b"saved checkpoint " + raw + b"saved checkpoint at iteration 9"
    path = tmp_path / "t.log"
    path.write_bytes(raw)
    m = map_text(path)
    assert m is not None
    n = len(raw)
    for _ in range(200):
        lo, hi = sorted(rng.randint(0, n) for _ in range(2))
        for sub in (b"ab", b"a b|", b"saved checkpoint ", b"iteration 9", b"zz", b"b\na"):
            assert m.find(sub, lo, hi) == raw.find(sub, lo, hi), (sub, lo, hi)
            assert m.find(sub, lo) == raw.find(sub, lo)
            assert (sub in m) == (sub in raw)
    assert m.find(b"ab", -50) == raw.find(b"ab", -50)  # (a negative start: Python's search)
    assert b"saved checkpoint " in called


def test_a_carriage_return_late_in_a_big_log_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The NUL / ESC / CR check before a log is mapped scans it in two halves on two
    threads: a CR in the last bytes of a 3 MiB log still keeps it from being mapped (it is
    read, and its line breaks mended), an ESC or a NUL in the first half too."""
    monkeypatch.setattr(engine, "MAP_BYTES", 1 << 20)
    line = b" iteration        1/     100 | lm loss: 2.5E+00 |\n"
    body = line * ((3 << 20) // len(line))
    for raw, mapped in (
        (body, True),
        (body + b"x\r\n", False),
        (b"\x1b[0m" + body, False),
        (body[:100] + b"\x00" + body[100:], False),
    ):
        path = tmp_path / "big.log"
        path.write_bytes(raw)
        assert (map_text(path) is not None) == mapped
