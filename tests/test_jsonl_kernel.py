"""The compiled reading of plain JSONL blocks (forensics/importers/_jsonl.c) gives what the
polars path and the per-line reader give, bit for bit, and leaves every block it cannot read
so to them.

A log is read three ways: with the kernel, with the kernel switched off (polars reads the
plain blocks), and line by line by the per-line reader (the reference). The frames, skipped
lines, cut-off line and tags must be equal, and each case says which blocks the kernel must
have read itself: a test that only compared the polars path with itself would pass whatever
the kernel did.
"""

from __future__ import annotations

import json
import random
import struct
from decimal import Decimal, getcontext
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from forensics.importers import jsonl, jsonl_blocks
from tests.conftest import REAL_RUNS

kernel = jsonl_blocks._jsonl
needs_kernel = pytest.mark.skipif(
    kernel is None, reason="the JSONL kernel was not built here (no C compiler at install)"
)
pytestmark = needs_kernel


class _Counted:
    """The parser's kernel reading (``Parser._flat``) with a count of the blocks it read and
    the blocks it left to the other paths."""

    def __init__(self) -> None:
        self.read = 0
        self.left = 0
        self._flat = jsonl_blocks.Parser._flat

    def method(self) -> object:
        """A function to put in the parser class's place of ``_flat``."""

        def flat(parser: jsonl_blocks.Parser, block: jsonl_blocks.Block) -> object:
            got = self._flat(parser, block)
            if got is None:
                self.left += 1
            else:
                self.read += 1
            return got

        return flat


def _three_ways(
    raw: bytes, monkeypatch: pytest.MonkeyPatch, block: int = 4096, by_series: bool = True
) -> tuple[_Counted, jsonl.Lines]:
    """The log read with the kernel (counted), without it and line by line: all equal."""
    counted = _Counted()
    monkeypatch.setattr(jsonl_blocks, "BLOCK", block)
    with monkeypatch.context() as patch:
        patch.setattr(jsonl_blocks.Parser, "_flat", counted.method())
        fast = jsonl.parse_lines(raw, "m.jsonl", by_series=by_series)
    with monkeypatch.context() as patch:
        patch.setattr(jsonl_blocks, "_jsonl", None)
        polars = jsonl.parse_lines(raw, "m.jsonl", by_series=by_series)
    slow = jsonl.parse_lines(raw, "m.jsonl", fast=False, by_series=by_series)
    for other in (polars, slow):
        assert fast.frame.schema == other.frame.schema
        assert fast.frame.equals(other.frame), (fast.frame, other.frame)
        assert (fast.bad, fast.cut) == (other.bad, other.cut)
        assert fast.relative_time == other.relative_time
        assert set(fast.tags or ()) == set(other.tags or ())
    assert fast.by_series == polars.by_series
    return counted, fast


def _lines(objs: list[dict[str, object]]) -> bytes:
    return "".join(json.dumps(o) + "\n" for o in objs).encode()


def _metrics(n: int, seed: int = 0, layers: int = 4) -> list[dict[str, object]]:
    """The benchmark's shape: a few keys a step, layer norms every 50 steps, val every 100."""
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    for s in range(n):
        o: dict[str, object] = {
            "step": s,
            "_timestamp": 1.7e9 + 0.5 * s + rng.random() * 0.01,
            "train/loss": 10.0 / (1 + s / 50) + rng.gauss(0, 0.01),
            "train/lr": 3e-4 * min(1.0, s / 20),
            "train/grad_norm": struct.unpack("f", struct.pack("f", 1 + rng.random()))[0],
            "train/loss_scale": 65536.0,
        }
        if s % 50 == 0:
            o.update({f"grad_norm/layers.{i}": rng.random() / 10 for i in range(layers)})
        if s % 100 == 99:
            o["val/loss"] = 9.0 / (1 + s / 50)
        out.append(o)
    return out


# -- numbers ----------------------------------------------------------------------------------


def _number_texts(rng: random.Random, n: int) -> list[str]:
    """Numbers as loggers write them (float and float32 reprs, ints of any size) and as few
    do (long decimals, exponents, doubles' midpoints printed to 17-22 digits)."""
    getcontext().prec = 80
    out: list[str] = []
    for _ in range(n):
        k = rng.random()
        if k < 0.25:
            t = repr(rng.uniform(-1e3, 1e3))
        elif k < 0.45:
            t = repr(struct.unpack("f", struct.pack("f", rng.uniform(0, 20)))[0])
        elif k < 0.65:
            t = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 21))).lstrip("0")
            t = t or "0"
            if rng.random() < 0.6:
                t += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 21)))
            if rng.random() < 0.4:
                t += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 40))
            if rng.random() < 0.3:
                t = "-" + t
        elif k < 0.75:
            t = str(rng.randint(-(2**64), 2**64))
        elif k < 0.9:  # a midpoint between two doubles, cut to 15-22 characters
            x = rng.uniform(1e-5, 1e5)
            bits = struct.unpack("<Q", struct.pack("<d", x))[0]
            hi = struct.unpack("<d", struct.pack("<Q", bits + 1))[0]
            t = format((Decimal(x) + Decimal(hi)) / 2, "f")[: rng.randint(15, 22)].rstrip(".")
        else:
            t = repr(rng.lognormvariate(0, 20))
        if t not in ("inf", "-inf", "nan"):
            out.append(t)
    return out


def test_numbers_are_read_bit_for_bit_as_python_and_polars_read_them() -> None:
    """Every number: the float Python's json module gives, which is what polars' JSON reader
    gives (both correctly rounded; "-0" is the integer 0 to both)."""
    assert kernel is not None
    texts = _number_texts(random.Random(7), 20_000) + ["-0", "0", "-0.0", "0e5", "-0E-3"]
    texts += ["9007199254740993", "18446744073709551616", "2.2250738585072014e-308", "1e-400"]
    raw = "".join(f'{{"a": {t}}}\n' for t in texts).encode()
    got = kernel.scan(raw)
    assert got is not None and got[0] == got[1] == len(texts)
    values = np.frombuffer(got[5], dtype=np.float64)
    want = np.array([float(json.loads(t)) for t in texts])
    assert (values.view(np.uint64) == want.view(np.uint64)).all()
    ref = pl.read_ndjson(raw, schema={"a": pl.Float64}).get_column("a").to_numpy()
    assert (values.view(np.uint64) == ref.view(np.uint64)).all()


@pytest.mark.parametrize(
    "text",
    ["01", "1.", ".5", "+1", "1e", "-", "1.5e+", "-NaN", "nan", "Inf", "-inf", "infinity",
     "NaN1", "1e400", "-1e999", "0x10", "1_0", "1.5.2", "1e5e5", '"1"', "true", "false",
     "nul", "nulls", "Null", "[1]", '{"b": 1}', "1 2"],
)  # fmt: skip
def test_values_that_are_not_plain_finite_numbers_leave_the_block(text: str) -> None:
    assert kernel is not None
    assert kernel.scan(b'{"step": 1, "a": 1}\n{"a": %s}\n' % text.encode()) is None


@pytest.mark.parametrize(
    "line",
    [
        b'{"a":1,}',
        b'{"a":1 "b":2}',
        b'{"a":1}x',
        b'{"a":1}{"b":2}',
        b'{"a":1,"a":2}',  # a key twice
        b'{"a":1,"a":null}',  # a key twice, the last null (Python keeps the null)
        b'{"":1}',
        b'{"a\\u0062":1}',  # an escape in a key
        b'{"\xc3\xa9":1}',  # a non-ASCII key
        b'{"a\tb":1}',  # a control byte in a key
        b'{"a":1',  # cut off
        b"\x0b{}",  # whitespace JSON does not know
        b"[1, 2]",
        b"text",
        b'2024-01-01 {"a": 1}',
    ],
)
def test_lines_that_are_not_flat_objects_of_numbers_leave_the_block(line: bytes) -> None:
    assert kernel is not None
    assert kernel.scan(b'{"step": 1, "a": 1}\n' + line + b"\n") is None


def test_what_the_kernel_reads_keys_in_the_order_first_shown() -> None:
    """Keys in the order of their first line, then their place in it; each key's values in
    line order; blank lines (spaces, tabs, a carriage return) counted as lines, not objects."""
    assert kernel is not None
    raw = b'{"b": 1, "a": 2}\n\n \t\r\n{"c": 3 , "a":4}\r\n{ }\n{"b":5}'
    got = kernel.scan(memoryview(raw))
    assert got is not None
    n_lines, objects, keys, counts, lines, values = got
    assert (n_lines, objects, keys) == (6, 4, ["b", "a", "c"])
    assert np.frombuffer(counts, dtype=np.int64).tolist() == [2, 2, 1]
    assert np.frombuffer(lines, dtype=np.int32).tolist() == [0, 5, 0, 3, 3]
    assert np.frombuffer(values, dtype=np.float64).tolist() == [1, 5, 2, 4, 3]


# -- whole logs -------------------------------------------------------------------------------


@pytest.mark.parametrize("by_series", [True, False])
def test_a_metrics_log_is_read_by_the_kernel_with_the_same_rows(
    monkeypatch: pytest.MonkeyPatch, by_series: bool
) -> None:
    counted, got = _three_ways(_lines(_metrics(3000)), monkeypatch, by_series=by_series)
    assert counted.left == 0 and counted.read > 20
    assert got.frame.height == 3000 * 4 + 60 * 4 + 30  # (step and time are no rows)
    assert got.by_series is by_series


def test_keys_first_seen_in_a_later_block_in_another_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block whose first-seen key order differs from the file's: its rows are put in the
    file's key order (the series layout), as polars' rows are."""
    objs = _metrics(600)
    for s in range(300, 600):  # keys written in reverse, and two new keys in the middle
        o = dict(reversed(list(objs[s].items())))
        if s % 37 == 0:
            o = {"late/b": s, **o, "late/a": -s}
        objs[s] = o
    counted, _ = _three_ways(_lines(objs), monkeypatch, block=2048)
    assert counted.left == 0


def test_a_wide_log_of_thousands_of_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """3,000 keys a line (a per-parameter log): many keys a block, the file's key order kept
    across blocks that show them in other orders."""
    rng = random.Random(3)
    objs: list[dict[str, object]] = []
    for s in range(60):
        keys = [f"p/{i}" for i in range(3000)]
        if s % 2:
            rng.shuffle(keys)
        objs.append({"step": s, **{k: rng.random() for k in keys[: rng.randint(2500, 3000)]}})
    counted, got = _three_ways(_lines(objs), monkeypatch, block=200_000)
    assert counted.left == 0 and counted.read > 5
    assert len(got.tags or ()) == 3000


@pytest.mark.parametrize(
    ("name", "edit", "left"),
    [
        ("a null", lambda o, s: {**o, "train/lr": None} if s == 250 else o, 0),
        ("a null step", lambda o, s: {**o, "step": None, "global_step": s} if s > 9 else o, 0),
        ("a null time", lambda o, s: {**o, "_timestamp": None, "_runtime": s} if s > 9 else o, 0),
        (
            "a key null before its first value",
            lambda o, s: {"late": None if s < 300 else s, **o},
            0,
        ),
        ("NaN", lambda o, s: {**o, "train/loss": float("nan")} if s == 250 else o, 0),
        ("infinities", lambda o, s: {**o, "a": float("inf"), "b": -float("inf")}, 0),
        ("a NaN step", lambda o, s: {**o, "step": float("nan")} if s == 250 else o, 1),
        ("an infinite step", lambda o, s: {**o, "_step": float("inf")} if s == 250 else o, 1),
        ("a NaN time", lambda o, s: {**o, "_timestamp": float("nan")} if s == 250 else o, 1),
        ("a NaN runtime", lambda o, s: {**o, "_runtime": float("nan")} if s == 250 else o, 1),
        ("a string", lambda o, s: {**o, "note": "resumed"} if s == 250 else o, 1),
        ("a bool", lambda o, s: {**o, "skipped": True} if s in (10, 250) else o, 2),
        ("nested", lambda o, s: {**o, "eval": {"loss": 1.0}} if s == 250 else o, 1),
        ("a step beyond 2**62", lambda o, s: {**o, "step": 2**62} if s == 250 else o, 1),
        ("a float step", lambda o, s: {**o, "step": s + 0.5} if s == 250 else o, 0),
        ("a step in another key", lambda o, s: {**o, "global_step": s} if s >= 250 else o, 0),
        ("time in milliseconds", lambda o, s: {**o, "_timestamp": 1.7e12 + s}, 0),
        ("W&B runtime only", lambda o, s: {"_runtime": s * 0.5, **o} if s > 100 else o, 0),
        ("no step", lambda o, s: {k: v for k, v in o.items() if k != "step"}, 0),
        ("ints", lambda o, s: {**o, "tokens": s * 2**40, "neg": -s}, 0),
    ],
)
def test_blocks_the_kernel_leaves_and_lines_it_reads(
    monkeypatch: pytest.MonkeyPatch, name: str, edit: object, left: int
) -> None:
    """A block holding a line the kernel does not read goes whole to the other paths (the
    same rows either way); every other block is the kernel's."""
    objs = [edit(o, s) for s, o in enumerate(_metrics(500))]  # type: ignore[operator]
    counted, _ = _three_ways(_lines(objs), monkeypatch, block=4096)
    assert counted.left == left, name
    assert counted.read > 10


def test_a_sparse_export_with_nulls_is_read_by_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A history exported through pandas (``to_json(orient="records", lines=True)``): every
    column on every line, null where the step logged no value. Null gives no row, as the
    other paths read it; a key null on its first lines takes its place in the key order
    from its first value."""
    objs = _metrics(900)
    keys = sorted({k for o in objs for k in o})
    sparse = [{k: o.get(k) for k in keys} for o in objs]
    counted, got = _three_ways(_lines(sparse), monkeypatch, block=8192)
    assert counted.left == 0 and counted.read > 10
    assert got.frame.height == 900 * 4 + 18 * 4 + 9


def test_a_diverged_log_whose_metrics_turn_nan_is_read_by_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From step 300 on the loss and grad norm are NaN and the loss scale infinite, as
    Python's json module writes them: rows with those values, every block the kernel's (it
    left such blocks to the per-line reader before, about 20 us a line)."""
    objs = _metrics(600)
    for o in objs[300:]:
        o.update({"train/loss": float("nan"), "train/grad_norm": float("nan")})
        o["train/loss_scale"] = float("inf")
    counted, got = _three_ways(_lines(objs), monkeypatch, block=4096)
    assert counted.left == 0 and counted.read > 10
    nan = got.frame.filter(pl.col("value").is_nan())
    assert nan.height == 600 and nan.get_column("step").min() == 300


def test_text_edits_the_kernel_reads_or_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = _lines(_metrics(400)).decode().splitlines()
    lines[10] = lines[10].replace(": ", " :  ").replace(", ", " ,\t")  # spaces around tokens
    lines[20] = lines[20] + "\r"  # a CRLF line
    lines[30] = ""  # blank lines
    lines[31] = "   "
    lines[200] = lines[200][:40]  # a cut line in the middle: a skipped line
    raw = ("\n".join(lines) + "\n").encode()
    counted, got = _three_ways(raw, monkeypatch, block=4096)
    assert counted.left == 1 and got.bad == [201]
    cut = raw[: len(raw) - 25]  # the last line cut off: a truncated log
    counted, got = _three_ways(cut, monkeypatch, block=4096)
    assert counted.left == 2 and got.cut  # (line 201's block and the last)


def _damaged(rng: random.Random) -> bytes:
    """A metrics log with random damage: cut and flipped bytes, doubled lines, nulls, NaN,
    strings, nested objects, new keys, escapes, blank and CRLF lines, steps going back."""
    objs = _metrics(rng.randint(50, 700), seed=rng.randint(0, 99), layers=rng.randint(0, 6))
    lines = [json.dumps(o) for o in objs]
    for _ in range(rng.randint(0, 12)):
        i = rng.randrange(len(lines))
        k = rng.randrange(14)
        ln = lines[i]
        if k == 0:
            lines[i] = ln[: rng.randrange(len(ln))]
        elif k == 1:
            j = rng.randrange(len(ln))
            lines[i] = ln[:j] + chr(rng.randrange(1, 127)) + ln[j + 1 :]
        elif k == 2:
            lines.insert(i, ln)
        elif k == 3:
            lines[i] = ln.replace("65536.0", rng.choice(["null", "NaN", '"x"', "true", "-0"]))
        elif k == 4:
            lines[i] = ln[:-1] + f', "new/{rng.randrange(3)}": {rng.random()}}}'
        elif k == 5:
            lines[i] = ln[:-1] + ', "nested": {"a": 1}}'
        elif k == 6:
            lines[i] = ln.replace('"train/lr"', '"train\\/lr"')
        elif k == 7:
            lines.insert(i, rng.choice(["", "  ", "\r", "garbage", "[1]"]))
        elif k == 8:
            lines[i] = ln + "\r"
        elif k == 9:
            lines[i] = ln.replace('"step": ', '"step": 1') if '"step": ' in ln else ln
        elif k == 10:
            lines[i] = ln.replace(", ", ",", rng.randint(1, 5))
        elif k == 11:
            lines[i] = ln.replace("1.", "1.e", 1)
        elif k == 12:
            lines[i] = ln.replace('"train/loss": ', '"train/loss": 1e3', 1)
        else:
            lines[i] = ln.replace("{", '{"\u00e9": 1, ', 1)
    end = "" if rng.random() < 0.2 else "\n"
    return ("\n".join(lines) + end).encode()


@pytest.mark.parametrize("seed", range(30))
def test_damaged_logs_give_the_same_rows_whichever_path_reads_a_block(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng = random.Random(seed)
    raw = _damaged(rng)
    counted, _ = _three_ways(raw, monkeypatch, block=rng.choice([512, 2048, 8192, 1 << 20]))
    assert counted.read + counted.left > 0


def test_the_real_jsonl_logs_read_the_same_by_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every JSONL log under ../shared/real_runs: the same rows with the kernel and without
    it (8 KiB blocks, so that a log is many blocks). The two there are LLaMA-Factory's, whose
    every line holds strings ("elapsed_time": "0:00:24"): the kernel leaves each block."""
    if not REAL_RUNS.exists():
        pytest.skip(f"{REAL_RUNS} is absent (../shared is not beside the project)")
    paths = sorted(p for p in REAL_RUNS.rglob("*.jsonl") if p.stat().st_size < 50 << 20)
    if not paths:
        pytest.skip("no JSONL log under ../shared/real_runs")
    for path in paths:
        counted, _ = _three_ways(path.read_bytes(), monkeypatch, block=8192)
        assert counted.left > 0
        if path.name == "trainer_log.jsonl":
            assert counted.read == 0


def test_a_file_read_from_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The importer's read of a file (blocks from the file, three threads): the same frame with
    the kernel as without."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(_lines(_metrics(2000)))
    monkeypatch.setattr(jsonl_blocks, "BLOCK", 8192)
    counted = _Counted()
    with monkeypatch.context() as patch:
        patch.setattr(jsonl_blocks.Parser, "_flat", counted.method())
        fast = jsonl.read_lines(path, "m", by_series=True)
    monkeypatch.setattr(jsonl_blocks, "_jsonl", None)
    ref = jsonl.read_lines(path, "m", by_series=True)
    assert fast.frame.equals(ref.frame) and fast.by_series and counted.left == 0
    assert counted.read > 10
