"""The JSONL reader's polars path gives the per-line reader's rows exactly: the same frame
(row for row, in the same order), the same skipped lines, config, clock and cut-off line, on
every kind of line the importer handles, on real logs and on the sample runs, whatever the
block size; and streaming a file gives what reading it whole gives."""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forensics.importers import jsonl, jsonl_blocks
from forensics.importers.base import read_bytes
from tests.conftest import ROOT, shared_path

# Every test twice: plain blocks read by the compiled kernel and by polars (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("jsonl_reader_path")


def _same(raw: bytes, block: int | None = None, first_line: int = 1) -> jsonl.Lines:
    """parse_lines with polars and with the per-line reader only: everything equal."""
    old = jsonl_blocks.BLOCK
    try:
        if block:
            jsonl_blocks.BLOCK = block
        fast = jsonl.parse_lines(raw, "m.jsonl", first_line)
        slow = jsonl.parse_lines(raw, "m.jsonl", first_line, fast=False)
    finally:
        jsonl_blocks.BLOCK = old
    assert fast.frame.schema == slow.frame.schema
    assert fast.frame.equals(slow.frame), (fast.frame, slow.frame)
    assert (fast.bad, fast.config, fast.relative_time, fast.cut) == (
        slow.bad,
        slow.config,
        slow.relative_time,
        slow.cut,
    )
    return fast


def _lines(*objs: object) -> bytes:
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs).encode()


CASES: dict[str, bytes] = {
    "plain": _lines(*({"step": s, "loss": 2.0 / (s + 1), "lr": 1e-4} for s in range(50))),
    "ints_and_bools": _lines(
        *({"step": s, "tokens": 10**s, "skipped": s % 2 == 0} for s in range(25))
    ),
    "huge_int": _lines({"step": 1, "n": 12345678901234567890123}, {"step": 2, "n": 2**63 + 1}),
    "step_aliases": _lines(
        {"global_step": 3, "loss": 1.0},
        {"iteration": 4, "iter": 9, "loss": 1.0},
        {"_step": 5, "num_updates": "8", "loss": 1.0},
        {"trainer/global_step": 6, "_step": 1, "loss": 1.0},
        {"current_steps": 7, "loss": 1.0},
        {"step": 1e300, "loss": 1.0},
        {"step": 2**62, "loss": 1.0},
        {"step": -(2**62) + 1, "loss": 1.0},
        {"step": 8.7, "loss": 1.0},
    ),
    "time_keys": _lines(
        {"step": 1, "_timestamp": 1700000000.5, "timestamp": 1, "loss": 1},
        {"step": 2, "timestamp": 1700000003000, "loss": 1},
        {"step": 3, "wall_time": 1700000002.25, "loss": 1},
        {"step": 4, "_runtime": 12.5, "loss": 1},
        {"step": 5, "_runtime": 2e11, "loss": 1},
        {"step": 6, "timestamp": "2023-11-14T22:13:20+00:00", "loss": 1},
    ),
    "loose_numbers": (
        b'{"step": 1, "loss": "1.5e-1", "lr": "3e-4", "gnorm": NaN, "tps": "1,234", "note": "w"}\n'
        b'{"step": 2, "loss": "nan", "lr": Infinity, "gnorm": -Infinity, "tps": 1000}\n'
        b'{"step": 3, "loss": 1e999, "lr": -1e999, "gnorm": 1.5, "tps": 1000}\n'
    ),
    "bad_lines": _lines(
        {"step": 0, "loss": 1.0},
        "{not json",
        "[1, 2, 3]",
        "Traceback (most recent call last):",
        '{"step": 1, "loss": 1.0,}',
        '{"step": 2, "loss": 1.0} {"step": 3}',
        '{"step": 4, "loss": +1}',
        "   ",
        "",
        {"step": 5, "loss": 0.5},
        '{"step": 6, "loss": 01}',
        "42",
    ),
    "nested": _lines(
        *(
            {"step": s, "train": {"loss": 2.0, "grad_norm": 0.5}, "eval": {"acc": 0.3}}
            for s in range(5)
        ),
        {"step": 9, "grad/hist": {"min": -1, "max": 2, "num": 4, "sum": 2, "sum_squares": 6}},
    ),
    "nulls_and_late_keys": _lines(
        *({"step": s, "loss": 1.0, "eval_loss": None} for s in range(10)),
        {"step": 10, "loss": 1.0, "eval_loss": 0.9},
        *({"step": s, "loss": 1.0, "new_key": float(s)} for s in range(11, 30)),
        {"step": 30, "loss": None, "late": True},
    ),
    "duplicate_keys": (
        b'{"step": 1, "loss": 1.0, "loss": 2.0}\n'
        b'{"step": 2, "loss": 1.0, "loss": null}\n'
        b'{"step": 3, "loss": null, "loss": 3.0}\n'
        b'{"step": 4, "step": 7, "loss": 4.0}\n'
    ),
    "key_order_varies": _lines(
        {"step": 1, "a": 1, "b": 2},
        {"b": 3, "step": 2, "c": 4, "a": 5},
        {"c": 6, "b": 7, "a": 8, "step": 3},
    ),
    "strings_and_lists": _lines(
        *({"step": s, "loss": 1.0, "phase": "train", "shape": [1, 2]} for s in range(5)),
        {"step": 5, "loss": "0.5", "phase": "eval"},
        {"step": 6, "loss": 0.4, "x": [None, None, None], "y": {"z": 1}},
    ),
    "escapes": (
        b'{"step": 1, "a\\"b": 1.0, "loss": 2.0}\n'
        b'{"step": 2, "caf\\u00e9": 1.0, "loss": 2.0}\n'
        b'{"step": 3, "\\ud800": 1.0, "loss": 2.0}\n'
        b'{"step": 4, "k": "\\\\", "loss": 2.0}\n'
    ),
    "unicode_keys": (
        '{"step": 1, "损失": 1.0, "a\u2028b": 2.0}\n{"step": 2, "损失": 0.5}\n'.encode()
    ),
    "crlf": b'{"step": 1, "loss": 1.0}\r\n{"step": 2, "loss": 0.5}\r\n',
    "whitespace": (
        b'  {"step": 1, "loss": 1.0}  \n\t{"step": 2 , "loss" : 0.5}\n\n\n{"step":3,"loss":0.4}\n'
    ),
    "cut_off": _lines(*({"step": s, "loss": 1.0} for s in range(5))) + b'{"step": 5, "lo',
    "cut_after_brace": _lines({"step": 1, "loss": 1.0}) + b'{"step": 2, "x": {"a": 1}',
    "no_final_newline": _lines({"step": 1, "loss": 1.0}) + b'{"step": 2, "loss": 0.5}',
    "restart": _lines(
        *({"step": s, "loss": 1.0, "_timestamp": 1000 + s} for s in range(30)),
        *({"step": s, "loss": 2.0, "_timestamp": 5000 + s} for s in range(20, 40)),
    ),
    "llama_factory": _lines(
        *(
            {
                "current_steps": 5 * i,
                "loss": 2.0 - 0.1 * i,
                "eval_loss": None,
                "elapsed_time": f"0:0{i}:00",
                "epoch": 0.05 * i,
            }
            for i in range(1, 6)
        )
    ),
    "levanter": (
        b'2024-01-01 00:00:00,000 - levanter - INFO - {"tracker": "json_logger", "event": '
        b'"hparams", "hparams": {"trainer": {"train_batch_size": 256}}}\n'
        + b"".join(
            b"2024-01-01 00:00:00,000 - levanter - INFO - "
            + json.dumps(
                {
                    "tracker": "json_logger",
                    "event": "log",
                    "step": s,
                    "metrics": {"train/loss": 3.0 / s},
                }
            ).encode()
            + b"\n"
            for s in range(1, 4)
        )
        + _lines({"tracker": "json_logger", "event": "finish", "summary": {"train/loss": 1.0}})
    ),
    "empty_objects": _lines({}, {"step": 1}, {"loss": 1.0}, {"step": 2, "loss": 1.0}),
    "no_step": _lines({"loss": 1.0}, {"loss": 0.9}),
    "deep": b'{"step": 1, "a": ' + b'{"b": ' * 2000 + b"1" + b"}" * 2000 + b"}\n",
    # Columns on every line of a block between columns on some lines (the fast path lays the
    # first out as a matrix, the others through the lines holding them), a boolean among the
    # latter, a line with no value, a block where a column is all null.
    "every_line_and_sometimes": _lines(
        *(
            {
                "step": s,
                "a": float(s),
                **({"b": s * 0.5} if s % 3 == 0 else {}),
                "c": 2.0,
                **({"flag": s % 2 == 0} if s % 4 == 1 else {}),
                **({"late": 1.0} if s > 60 else {}),
                "d": -1.0,
            }
            for s in range(80)
        ),
        {"step": 80},
        {"step": 81, "d": 3.0, "b": 1.0, "a": 0.0, "c": 1.0},
    ),
    "mixed_bool_number": _lines(
        {"step": 1, "flag": True}, {"step": 2, "flag": 3.5}, {"step": 3, "flag": False}
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("block", [None, 64, 1])
def test_polars_rows_equal_the_per_line_reader(name: str, block: int | None) -> None:
    """Every kind of line, in one block and cut into blocks of one line."""
    _same(CASES[name], block)


def test_the_plain_case_goes_to_polars() -> None:
    """A file of flat numeric lines does not go line by line (else the fast path is dead)."""
    reader = jsonl_blocks.BlockReader("m")
    for block in jsonl_blocks.blocks(CASES["plain"] * 20):
        reader.feed(block)
    assert reader.slow_lines == 0 and reader.fast_lines == 1000


def test_only_the_odd_lines_go_line_by_line() -> None:
    """A NaN line, a nested line, a line with a new key and a bad line among plain lines:
    only those are read by the per-line reader, and the rows are the same."""
    objs = [{"step": s, "loss": 1.0 / (s + 1), "lr": 1e-4} for s in range(3000)]
    lines = [json.dumps(o) for o in objs]
    lines[100] = '{"step": 100, "loss": NaN, "lr": 1e-4}'
    lines[1500] = '{"step": 1500, "loss": 0.1, "nested": {"x": 1}}'
    lines[2000] = '{"step": 2000, "loss": 0.1, "val_loss": 0.2}'  # teaches the schema
    lines[2500] = "garbage"
    raw = ("\n".join(lines) + "\n").encode()
    _same(raw)
    reader = jsonl_blocks.BlockReader("m")
    reader.feed(raw)
    assert reader.fast_lines == 2997 and reader.slow_lines == 3
    assert reader.bad == [2501]


@pytest.mark.parametrize("sample", sorted((ROOT / "sample_runs").glob("*/*.jsonl")), ids=str)
def test_sample_runs(sample: Path) -> None:
    raw = read_bytes(sample)
    _same(raw)
    _same(raw, block=4096)


@pytest.mark.parametrize(
    "folder", ["llamafactory-luojiu-7b-qlora-cpt", "llamafactory-mistral7b-translator-lora"]
)
def test_real_logs(folder: str) -> None:
    raw = read_bytes(shared_path("real_runs", folder, "trainer_log.jsonl"))
    _same(raw)
    _same(raw, block=2048)
    # With the null eval_loss dropped (so that polars takes the lines), still the same rows.
    objs = [json.loads(ln) for ln in raw.decode().splitlines() if ln.strip()]
    plain = _lines(*({k: v for k, v in o.items() if isinstance(v, (int, float))} for o in objs))
    _same(plain)


@pytest.mark.parametrize(
    "path", sorted((ROOT / "tests" / "fuzz_corpus").rglob("*.jsonl*")), ids=lambda p: p.name
)
def test_fuzz_corpus_inputs(path: Path) -> None:
    _same(read_bytes(path))


def test_benchmark_shaped_run(tmp_path: Path) -> None:
    """The benchmark's LLM-shaped log (layer norms every 50 steps, val every 500): equal,
    streamed from the file in small blocks too, and with lines continued after a cut."""
    from benchmarks.generate import series, write_jsonl

    path = write_jsonl(tmp_path, series(1200, n_layers=4))
    raw = path.read_bytes()
    whole = _same(raw)
    _same(raw, block=10_000)
    old = jsonl_blocks.BLOCK
    try:
        jsonl_blocks.BLOCK = 7_000
        streamed = jsonl.read_lines(path, "m.jsonl")
    finally:
        jsonl_blocks.BLOCK = old
    assert streamed.frame.equals(whole.frame)
    cut = raw.index(b"\n", len(raw) // 2) + 1
    tail = _same(raw[cut:], first_line=raw[:cut].count(b"\n") + 1)
    assert tail.frame.get_column("record_idx")[0] == raw[:cut].count(b"\n") + 1


@pytest.mark.parametrize(
    "name, data",
    [
        ("bom", b"\xef\xbb\xbf" + CASES["plain"]),
        ("nul", CASES["plain"][:200] + b"\x00\x00" + CASES["plain"][200:] + b"\x00" * 64),
        ("no_newline", CASES["no_final_newline"]),
        ("cut", CASES["cut_off"]),
        ("crlf", CASES["crlf"]),
        ("utf16", CASES["plain"].decode().encode("utf-16")),
        ("gz", gzip.compress(CASES["restart"])),
    ],
)
def test_streamed_file_equals_whole_read(tmp_path: Path, name: str, data: bytes) -> None:
    """read_lines (block by block from the file) == parse_lines of the whole decoded text."""
    path = tmp_path / ("m.jsonl.gz" if name == "gz" else "m.jsonl")
    path.write_bytes(data)
    old = jsonl_blocks.BLOCK
    try:
        jsonl_blocks.BLOCK = 100
        streamed = jsonl.read_lines(path, "m.jsonl")
    finally:
        jsonl_blocks.BLOCK = old
    whole = jsonl.parse_lines(read_bytes(path), "m.jsonl", fast=False)
    assert streamed.frame.equals(whole.frame)
    assert (streamed.bad, streamed.cut) == (whole.bad, whole.cut)


def test_in_file_order_when_keys_agree() -> None:
    """When every line lists its keys in one order (what loggers write), the rows are in the
    lines' own order: line by line, each line's keys as written."""
    raw = CASES["nulls_and_late_keys"] + CASES["plain"]
    got = _same(raw).frame
    want = []
    for i, ln in enumerate(raw.decode().splitlines(), start=1):
        for k, v in json.loads(ln).items():
            if k != "step" and isinstance(v, (int, float)):
                want.append((i, k, float(v)))
    assert (
        list(
            zip(*(got.get_column(c).to_list() for c in ("record_idx", "tag", "value")), strict=True)
        )
        == want
    )


_KEYS = ["step", "loss", "lr", "a/b", "_timestamp", "iter", "x y", "flag"]
_VALUES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.sampled_from(["1.5", "nan", "warmup", "1,234", ""]),
    st.just({"inner": 1.0}),
    st.just([1, None]),
)
_LINE = st.one_of(
    st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=6).map(json.dumps),
    st.sampled_from(["", "garbage", "{", "[1]", '{"step": 1,}', "null"]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_LINE, max_size=30), st.booleans(), st.sampled_from([None, 80]))
def test_random_lines(lines: list[str], final_newline: bool, block: int | None) -> None:
    """Random lines of random keys, values and breakage: the same as the per-line reader."""
    text = "\n".join(lines) + ("\n" if final_newline else "")
    _same(text.encode(), block)


def test_random_plain_files_with_rare_odd_lines() -> None:
    """Large plain files with a few odd lines scattered (the bisection of refused pieces)."""
    rng = random.Random(7)
    for _ in range(3):
        lines = []
        for s in range(4000):
            obj = {"step": s, "loss": rng.random(), "lr": 1e-4 * rng.random()}
            if s % 97 == 0:
                obj[f"k{rng.randrange(5)}"] = rng.random()
            lines.append(json.dumps(obj))
        for _ in range(rng.randrange(1, 6)):
            i = rng.randrange(len(lines))
            lines[i] = rng.choice(
                ['{"step": 1, "loss": NaN}', "oops", '{"step": 2, "loss": 1e999}', '{"s": "x"}']
            )
        raw = ("\n".join(lines) + "\n").encode()
        got = _same(raw)
        assert not math.isnan(got.frame.get_column("value").drop_nans().sum())
    assert isinstance(pl.__version__, str)


def test_a_lone_surrogate_key_does_not_stop_polars() -> None:
    """A key polars cannot hold (a lone surrogate escape, which it reads as NUL) sends its
    own line line by line, not the lines after it; the tag is the per-line reader's."""
    raw = b'{"step": 0, "\\ud800": 1.0, "loss": 2.0}\n' + CASES["plain"] * 4
    _same(raw)
    reader = jsonl_blocks.BlockReader("m")
    reader.feed(raw)
    assert reader.slow_lines == 1 and reader.fast_lines == 200
    # Beside a NUL key polars knows, its NUL reading would pass every count.
    raw = b'{"step": 0, "\\u0000": 1.0}\n{"step": 1, "\\ud800": 5.0}\n'
    got = _same(raw).frame
    assert got.get_column("tag").cast(pl.String).to_list() == ["\x00", "\ufffd" * 3]


def test_escaped_keys_go_to_polars() -> None:
    """json.dumps escapes every non-ASCII key (ensure_ascii): such lines stay on polars' path
    with the same tags."""
    raw = _lines(*({"step": s, "损失": 1.0 / (s + 1), "café": 2.0} for s in range(100)))
    assert b"\\u635f" in raw
    got = _same(raw)
    assert set(got.frame.get_column("tag").cast(pl.String).to_list()) == {"损失", "café"}
    reader = jsonl_blocks.BlockReader("m")
    reader.feed(raw)
    assert (reader.fast_lines, reader.slow_lines) == (100, 0)


def test_null_values_go_to_polars() -> None:
    """Nulls (an eval loss logged as null between evaluations, pandas' missing values) do not
    send plain lines line by line; a duplicate key beside a null still does."""
    objs = [{"step": s, "loss": 1.0, "eval_loss": None if s % 10 else 0.5} for s in range(500)]
    raw = _lines(*objs)
    _same(raw)
    reader = jsonl_blocks.BlockReader("m")
    reader.feed(raw)
    assert reader.slow_lines == 0 and reader.fast_lines == 500
    dup = raw + b'{"step": 500, "loss": 1.0, "loss": null}\n'
    _same(dup)
    reader = jsonl_blocks.BlockReader("m")
    reader.feed(dup)
    # That block goes line by line where a null is (the lines without one still polars').
    assert reader.slow_lines == dup.count(b"null") and reader.bad == []
    # A value equal to the stand-in for null is a value.
    _same(raw + _lines({"step": 501, "loss": -5e-324, "eval_loss": None}))


def test_millisecond_times_agree_to_the_last_bit() -> None:
    """A W&B ``_timestamp`` in milliseconds becomes seconds alike in both readers, whatever
    the rows around it: polars divided a column of one row by a constant exactly and a longer
    one as a product with the reciprocal, one bit apart for this value (a case the random
    lines above found)."""
    line = b'{"step": 1, "loss": 0, "_timestamp": 4.736139882437046e+16}\n'
    for raw in (line, line * 3, b"{}\n" + line.replace(b"1", b"null", 1)):
        got = _same(raw)
        assert set(got.frame["wall_time"].to_list()) == {4.736139882437046e16 * 0.001}


@pytest.mark.polars_path
def test_nulls_first_met_in_a_later_block_go_to_polars() -> None:
    """The text is searched for nulls only once a block's count needed it: a null first met
    in a later block is still read by polars, and a key spelled with "null" is a key."""
    plain = [{"step": s, "loss": 1.0, "eval": 0.5} for s in range(3000)]
    nulls = [{"step": s, "loss": 1.0, "eval": None if s % 7 else 0.5} for s in range(3000, 6000)]
    raw = _lines(*plain, *nulls)
    _same(raw, 20_000)
    reader = jsonl_blocks.BlockReader("m")
    for block in jsonl_blocks.blocks(raw, 20_000):
        reader.feed(block)
    assert (reader.fast_lines, reader.slow_lines) == (6000, 0) and reader._nulls
    named = _lines(*({"step": s, "nullity": 0.5, "loss": 1.0} for s in range(3000)))
    _same(named)
    reader = jsonl_blocks.BlockReader("m")
    reader.feed(named)
    assert (reader.fast_lines, reader.slow_lines, reader._nulls) == (3000, 0, False)


@pytest.mark.polars_path
def test_lines_of_two_shapes_are_read_in_groups() -> None:
    """Narrow lines with a wide one every 50 (the benchmark's shape): read by polars in groups
    of one number of quotes, each with its own keys; the same rows."""
    objs = [{"step": s, "loss": 1.0 / (s + 1), "lr": 1e-4} for s in range(3000)]
    for s in range(0, 3000, 50):
        objs[s].update({f"grad_norm/layers.{i}": float(i + s) for i in range(40)})
    raw = _lines(*objs)
    _same(raw, 40_000)
    reader = jsonl_blocks.BlockReader("m")
    for block in jsonl_blocks.blocks(raw, 40_000):
        reader.feed(block)
    assert (reader.fast_lines, reader.slow_lines, reader._split_failures) == (3000, 0, 0)
    assert sorted(len(k or ()) for k in reader._shapes.values()) == [3, 43]


def test_a_group_whose_lines_differ_in_keys_is_read_with_every_key() -> None:
    """Lines with as many quotes but other keys than their group's first line: the group's
    count fails with the first line's keys, and the group is read again with all of them."""
    objs = [{"step": s, "a" if s % 3 else "b": float(s)} for s in range(600)]
    for s in range(0, 600, 20):
        objs[s]["wide"] = 1.0
        objs[s]["wider"] = True
    raw = _lines(*objs)
    _same(raw)
    _same(raw, 3000)
    reader = jsonl_blocks.BlockReader("m")
    reader.feed(raw)
    assert (reader.fast_lines, reader.slow_lines) == (600, 0)
    assert None in reader._shapes.values()


def test_keys_that_appear_late_are_learned_without_going_line_by_line() -> None:
    """A null-valued file whose new key appears mid-block: every line read by polars, rows
    the same."""
    objs = [{"step": s, "loss": 1.0, "eval": None} for s in range(3000)]
    for s in range(1700, 3000, 7):
        objs[s]["late/key"] = float(s)
    raw = _lines(*objs)
    _same(raw)
    reader = jsonl_blocks.BlockReader("m")
    reader.feed(raw)
    assert (reader.fast_lines, reader.slow_lines) == (3000, 0)
    assert "late/key" in reader.rank


def test_benchmark_shape_all_through_polars(tmp_path: Path) -> None:
    """The benchmark's shape (layer norms every 50 lines, val every 500): all polars'."""
    from benchmarks.generate import series, write_jsonl

    raw = write_jsonl(tmp_path, series(1200, n_layers=4)).read_bytes()
    reader = jsonl_blocks.BlockReader("m")
    for block in jsonl_blocks.blocks(raw, 20_000):
        reader.feed(block)
    assert (reader.fast_lines, reader.slow_lines) == (1200, 0)


_COUNTERS = {
    "epoch_falls": _lines(*({"step": s, "loss": 1.0, "epoch": s / 10 % 3} for s in range(60))),
    "samples_fall": _lines(
        *({"step": s, "consumed_samples": (s % 25) * 64 + 64, "loss": 1.0} for s in range(60))
    ),
    "relative_clock_falls": _lines(
        *({"step": s, "_runtime": (s % 30) * 10.0 + 1, "loss": 1.0} for s in range(60))
    ),
    "epoch_grows": _lines(*({"step": s, "loss": 1.0, "epoch": s / 10} for s in range(60))),
}


@pytest.mark.parametrize("name", sorted(CASES) + sorted(_COUNTERS))
def test_no_restart_shortcut_equals_the_segmentation(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """finish() skips the restart search only when it would find nothing: the same frame,
    notes and findings as running it."""
    raw = CASES.get(name) or _COUNTERS[name]
    lines = jsonl.parse_lines(raw, "m.jsonl")
    if lines.frame.is_empty():
        return
    got = jsonl.finish(lines, "m.jsonl")
    monkeypatch.setattr(jsonl, "_no_restart", lambda frame, tags=None: False)
    want = jsonl.finish(lines, "m.jsonl")
    assert got.frame.equals(want.frame)
    assert got.notes == want.notes
    assert [f.summary for f in got.findings] == [f.summary for f in want.findings]
