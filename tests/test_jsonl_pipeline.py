"""The pipelined JSONL read (:meth:`BlockReader.feed_all`: the next block parsed in a worker
thread while this one's rows are made) gives what feeding one block at a time gives: the
same frame, the same skipped lines and notes, the same restart findings, whatever the block
size, on a file shaped like a real log with bad lines, a restart and keys that appear
mid-file."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import pytest

from forensics.importers import jsonl, jsonl_blocks
from forensics.importers.base import text_bytes

# Every test twice: plain blocks read by the compiled kernel and by polars (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("jsonl_reader_path")


def _real_shaped(tmp_path: Path, n: int = 1500) -> bytes:
    """The benchmark's shape (layer norms every 50 lines, val every 500), then: bad lines
    (text, a bare list, a cut object, a step no trainer logs), a restart (the steps go back
    to 300 and run again), keys first seen past the middle, nulls, NaN and a string value."""
    from benchmarks.generate import series, write_jsonl

    text = write_jsonl(tmp_path, series(n, n_layers=4)).read_text()
    lines = text.splitlines()
    out: list[str] = []
    for i, line in enumerate(lines):
        obj = json.loads(line)
        if i >= n * 3 // 5:  # keys that appear mid-file, one of them now and then only
            obj["late/throughput"] = float(i)
            if i % 13 == 0:
                obj["late/rare"] = i / 7
        if i % 97 == 5:
            obj["eval/loss"] = None
        if i % 211 == 7:
            obj["train/loss"] = float("nan")
        if i % 301 == 11:
            obj["note"] = "checkpoint saved"
        out.append(json.dumps(obj))
        if i % 173 == 17:
            out.append("Traceback (most recent call last):")
        if i % 389 == 3:
            out.append("[1, 2, 3]")
        if i == n * 2 // 5:
            out.append('{"step": 641, "train/loss": 1.')  # a line cut mid-record
        if i == n // 2:
            out.append(json.dumps({"step": 2**63, "train/loss": 1.0}))
    # a restart: the run resumed from an earlier checkpoint
    restart = [json.dumps({**json.loads(ln), "resumed": 1.0}) for ln in lines[n // 5 : n // 2]]
    at = n * 4 // 5
    return ("\n".join(out[:at] + restart + out[at:]) + "\n").encode()


def _one_at_a_time(raw: bytes, block: int) -> tuple[jsonl.Lines, jsonl_blocks.BlockReader]:
    reader = jsonl_blocks.BlockReader("m.jsonl")
    for piece in jsonl_blocks.blocks(raw, block):
        reader.feed(piece)
    return reader.lines(), reader


def _pipelined(raw: bytes, block: int) -> tuple[jsonl.Lines, jsonl_blocks.BlockReader]:
    reader = jsonl_blocks.BlockReader("m.jsonl")
    reader.feed_all(jsonl_blocks.blocks(raw, block))
    return reader.lines(), reader


def _assert_same(got: jsonl.Lines, want: jsonl.Lines) -> None:
    assert got.frame.schema == want.frame.schema
    assert got.frame.equals(want.frame)
    assert (got.bad, got.config, got.relative_time, got.cut, got.tags) == (
        want.bad,
        want.config,
        want.relative_time,
        want.cut,
        want.tags,
    )
    a, b = jsonl.finish(got, "m.jsonl"), jsonl.finish(want, "m.jsonl")
    assert a.frame.equals(b.frame)
    assert a.notes == b.notes
    assert [(f.kind, f.summary, f.measures) for f in a.findings] == [
        (f.kind, f.summary, f.measures) for f in b.findings
    ]


@pytest.mark.parametrize(
    ("n", "block"), [(300, 64), (300, 700), (1500, 4_000), (1500, 30_000), (1500, 1 << 24)]
)
def test_pipelined_read_equals_one_block_at_a_time(tmp_path: Path, n: int, block: int) -> None:
    """Tiny blocks too (64 bytes: a block a line), so that many blocks go through."""
    raw = _real_shaped(tmp_path, n)
    got, pipe = _pipelined(raw, block)
    want, single = _one_at_a_time(raw, block)
    _assert_same(got, want)
    assert (pipe.fast_lines, pipe.slow_lines) == (single.fast_lines, single.slow_lines)
    assert pipe.schema == single.schema and list(pipe.schema) == list(single.schema)
    assert (pipe._nulls, pipe._shapes, pipe._split_failures) == (
        single._nulls,
        single._shapes,
        single._split_failures,
    )
    # The file is what it claims to be: skipped lines counted, a restart found, late keys.
    result = jsonl.finish(got, "m.jsonl")
    assert len(got.bad) >= 3 and any("skipped" in note for note in result.notes)
    assert [f.kind.value for f in result.findings] == ["restart"]
    assert {"late/throughput", "late/rare", "resumed"} <= set(got.tags or ())
    # and the reference reader (every line in Python) agrees with both
    slow = jsonl.parse_lines(raw, "m.jsonl", fast=False)
    assert slow.frame.equals(got.frame) and slow.bad == got.bad


def test_the_file_read_is_pipelined_and_equals_one_block_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """read_lines parses its blocks in a worker thread (not this one), and gives what
    feeding the file's blocks one at a time gives, the last line cut off too."""
    raw = _real_shaped(tmp_path) + b'{"step": 5000, "train/lo'
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(raw)
    threads: set[str] = set()
    parse = jsonl_blocks.Parser.parse

    def spy(self: jsonl_blocks.Parser, block: bytes) -> jsonl_blocks.Parsed | None:
        threads.add(threading.current_thread().name)
        return parse(self, block)

    monkeypatch.setattr(jsonl_blocks, "BLOCK", 5_000)
    monkeypatch.setattr(jsonl_blocks.Parser, "parse", spy)
    got = jsonl.read_lines(path, "m.jsonl")
    assert threads and threading.current_thread().name not in threads
    want, _ = _one_at_a_time(raw, 5_000)
    _assert_same(got, want)
    assert got.cut and got.bad[-1] == raw.count(b"\n") + 1


def test_an_error_in_the_worker_reaches_the_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure while parsing ahead is raised where the blocks are fed, not lost."""

    def boom(self: jsonl_blocks.Parser, block: bytes) -> None:
        raise MemoryError("no room")

    monkeypatch.setattr(jsonl_blocks.Parser, "parse", boom)
    reader = jsonl_blocks.BlockReader("m.jsonl")
    with pytest.raises(MemoryError):
        reader.feed_all(jsonl_blocks.blocks(b'{"step": 1, "loss": 1.0}\n' * 100, 64))


class _Stream(io.BytesIO):
    def seekable(self) -> bool:
        return False


@pytest.mark.parametrize("size", [1, 7, 64, 700, 1 << 20])
def test_file_blocks_read_at_their_length_equal_the_text(tmp_path: Path, size: int) -> None:
    """The file's blocks (each read at its length, its end looked up first) are whole lines
    and join to the text as text_bytes reads it (BOM dropped, NULs removed), a line longer
    than the block and a last line without its newline included; a stream that cannot
    seek gives the same text."""
    long = json.dumps({"step": 3, "blob": "x" * 5000}).encode()
    raw = (
        b"\xef\xbb\xbf"
        + b'{"step": 1, "loss": 1.0}\r\n'
        + b'{"step": 2, "lo\x00ss": 2.0}\n'
        + long
        + b"\n\n\x00\x00\n"
        + b'{"step": 4, "loss": 4.0}'
    )
    path = tmp_path / "m.jsonl"
    path.write_bytes(raw)
    with path.open("rb") as fh:
        got = list(jsonl._file_blocks(fh, size))
    assert b"".join(got) == text_bytes(raw)
    assert all(b.endswith(b"\n") for b in got[:-1]) and all(got)
    assert b"".join(jsonl._file_blocks(_Stream(raw), size)) == text_bytes(raw)
    for b in (raw[3:], b"", b"\n", b"{}"):  # no BOM; empty; one newline; no newline at all
        path.write_bytes(b)
        with path.open("rb") as fh:
            assert b"".join(jsonl._file_blocks(fh, size)) == text_bytes(b)
