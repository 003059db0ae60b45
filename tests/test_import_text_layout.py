"""The fast Megatron path gives the same frame as the plain long-row path.

The importer reads a big Megatron log in pieces and keeps its common layout wide
(forensics/importers/text/megatron.py, layout.py), laying the rows out once in the order
restart numbering wants and skipping that numbering when no series can restart. Here the
same logs are read that way and the plain way (every row long, canonical frame, restart
numbering, as importers/text/__init__.py did before), and read whole and in small pieces:
the frames must be equal row for row.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import polars as pl
import pytest

from forensics.importers.base import Source
from forensics.importers.restarts import assign_segments, counter_tags
from forensics.importers.text import IMPORTER, _elapsed_as_wall_time, layout, megatron, parse_text
from forensics.schema import conform


def _log(
    n: int,
    seed: int,
    *,
    consumed: bool = True,
    restart_at: int | None = None,
    reset_at: int | None = None,
    noise: bool = False,
) -> bytes:
    """A Megatron-LM stdout log in the shape ``training_log`` prints it."""
    rng = random.Random(seed)
    out = ["using world size: 8, data-parallel size: 2"]
    step = base = 0
    for i in range(n):
        step += 1
        if restart_at is not None and i == restart_at:
            step -= 40  # resumed from an earlier checkpoint
        if reset_at is not None and i == reset_at:
            base = step  # a new job counting its samples from 0 while the step goes on
        keys = []
        if consumed:
            keys.append(f"consumed samples: {(step - base) * 512:12d}")
        keys += [
            f"elapsed time per iteration (ms): {500 + rng.random() * 10:.1f}",
            f"learning rate: {1.5e-4 * min(1.0, step / 100):.6E}",
            f"global batch size: {512 if step < n // 2 else 1024:5d}",
            f"lm loss: {2 + 8 / (1 + step / 100) + rng.random() * 0.01:.6E}",
            f"loss scale: {65536.0 if step < n // 3 else 32768.0}",
        ]
        old_fork = noise and rng.random() < 0.03  # printed before grad norm existed
        if not old_fork:
            keys.append(f"grad norm: {1 + rng.random():.3f}")
        keys.append("number of skipped iterations:   0")
        date = f"[2024-05-01 {10 + step // 3600:02d}:{step // 60 % 60:02d}:{step % 60:02d}]"
        line = f" {date} iteration {step:8d}/{n:8d} | " + " | ".join(keys) + " |"
        out.append(line)
        if noise and rng.random() < 0.05:
            out.append(line)  # another rank printed the same iteration
        if noise and step % 97 == 0:
            out.append(
                f" validation loss at iteration {step} | lm loss value: {rng.random() + 2:.6E} |"
                f" lm loss PPL: {rng.random() * 10 + 7:.6E} |"
            )
        if noise and rng.random() < 0.01:
            out.append(f" iteration {step:8d}/{n:8d} | loss scale: -1.0 | lm loss: nan |")
    return ("\n".join(out) + "\n").encode()


def _source(tmp_path: Path) -> Source:
    return Source("text_logs", [tmp_path / "train.log"], "train.log", tmp_path, scope="file")


def _long_way(raw: bytes) -> pl.DataFrame:
    """The frame built from every row as a long row (the importer's plain path)."""
    log = parse_text(raw, "train.log")
    frame = layout.canonical(log.frame, log.families[0], "train.log", log.x_kind)
    frame, elapsed = _elapsed_as_wall_time(frame, "train.log")
    counters = counter_tags(frame.get_column("tag").unique().to_list())
    if log.may_restart or counters or elapsed:
        frame = assign_segments(conform(frame))
    return frame


CASES = {
    "clean": {},
    "restart": {"restart_at": 900},
    "noisy": {"noise": True},
    "noisy_restart": {"noise": True, "restart_at": 700},
    "counter_reset": {"reset_at": 800},
    "no_counter": {"consumed": False, "noise": True},
    # Every line holds every tag and no counter: rows laid out tag after tag, no mask.
    "no_counter_clean": {"consumed": False},
}


def _assert_same_rows(got: pl.DataFrame, ref: pl.DataFrame) -> None:
    """``got`` holds ``ref``'s rows: row for row where the log may restart (restart numbering
    reads line order; a line printed twice, a key on odd lines too), else laid out tag after
    tag (the order the analysis view reads): the same rows, each tag's rows contiguous and in
    line order."""
    assert got.height == ref.height > 0
    if got.equals(ref):
        return
    key = ["record_idx", "tag"]  # a line prints each tag once
    assert got.sort(key).equals(ref.sort(key))
    assert got.get_column("segment").max() == 0  # (a restart keeps line order)
    runs = got.get_column("tag").cast(pl.String).rle().struct.field("value")
    assert runs.len() == runs.n_unique()  # every tag in one run
    per_tag = got.select(pl.col("record_idx").diff().over("tag").fill_null(1).min()).item()
    assert per_tag > 0  # line order within each tag


# Cases whose log cannot restart: no step goes back, no counter falls, no tag on odd lines.
QUIET = {"clean", "no_counter_clean"}


@pytest.mark.parametrize("case", list(CASES))
def test_fast_path_equals_long_rows(case: str, tmp_path: Path) -> None:
    raw = _log(1500, seed=len(case), **CASES[case])
    ref = _long_way(raw)
    # In line order (export, the watcher's tail): row for row.
    assert IMPORTER.read_raw(_source(tmp_path), raw).frame.equals(ref)
    # For the analysis (ReadOptions.series_order): the same rows, tag after tag where the log
    # cannot restart.
    res = IMPORTER.read_raw(_source(tmp_path), raw, series_order=True)
    _assert_same_rows(res.frame, ref)
    if case in QUIET:
        assert not res.frame.equals(ref.sort(["record_idx"], maintain_order=True))
    restarted = "restart" in case or "reset" in case
    assert (res.frame.get_column("segment").max() == 1) is restarted
    assert any(f.kind.value == "restart" for f in res.findings) is restarted


@pytest.mark.parametrize("case", list(CASES))
def test_pieces_equal_whole(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _log(1500, seed=10 + len(case), **CASES[case])
    whole = IMPORTER.read_raw(_source(tmp_path), raw)
    # ~5 pieces, each with more than the 200 iteration lines the layout is read from.
    monkeypatch.setattr(megatron, "CHUNK_BYTES", 90_000)
    assert len(megatron._spans(raw, megatron.CHUNK_BYTES)) >= 4
    pieces = IMPORTER.read_raw(_source(tmp_path), raw)
    assert pieces.frame.equals(whole.frame)
    assert pieces.notes == whole.notes
    assert [f.to_dict() for f in pieces.findings] == [f.to_dict() for f in whole.findings]


def test_constant_key_printed_from_mid_run_has_no_rows_before(tmp_path: Path) -> None:
    """A key that prints the same text on every line that has it ("number of nan
    iterations: 0", added by a later Megatron version) gives rows only where it is printed:
    the constant is read once, not spread to the lines without the key."""
    lines = ["using world size: 8"]
    for s in range(1, 400):
        keys = [f"lm loss: {3 - s / 1000:.4f}", "loss scale: 1.0"]
        if s > 100:
            keys.append("number of nan iterations:   0")
        date = f"[2024-05-01 10:{s // 60:02d}:{s % 60:02d}]"
        lines.append(f" {date} iteration {s:8d}/     400 | " + " | ".join(keys) + " |")
    raw = ("\n".join(lines) + "\n").encode()
    frame = IMPORTER.read_raw(_source(tmp_path), raw, series_order=True).frame
    nan = frame.filter(pl.col("tag") == "number of nan iterations")
    assert nan.height == 299
    assert nan.get_column("step").min() == 101
    assert frame.filter(pl.col("tag") == "lm loss").height == 399
    _assert_same_rows(frame, _long_way(raw))


def test_log_with_invalid_utf8_is_read_lossily(tmp_path: Path) -> None:
    """The lines are read as strict UTF-8 first; a log with latin-1 bytes (in its preamble
    and in a key) is read again lossily: the same frame as its text with those bytes
    replaced by U+FFFD."""
    lines = _log(600, seed=3).split(b"\n")
    lines[0] = b"d\xe9marrage du job"
    lines[300] = lines[300] + b" r\xe9sum\xe9 count: 7 |"
    raw = b"\n".join(lines)
    replaced = raw.decode("utf-8", "replace").encode()
    with pytest.raises(pl.exceptions.ComputeError, match="utf-8"):
        pl.read_csv(raw, has_header=False, separator="\x1f", quote_char=None, encoding="utf8")
    got = IMPORTER.read_raw(_source(tmp_path), raw).frame
    assert got.equals(IMPORTER.read_raw(_source(tmp_path), replaced).frame)
    odd = got.filter(pl.col("tag") == "r\ufffdsum\ufffd count")
    assert odd.get_column("value").to_list() == [7.0]


@pytest.mark.parametrize(
    "sample",
    [
        "",
        " iteration      100/  500000 | consumed samples:        51200 |",
        " iteration      100/  500000 | consumed samples:       51,200 |",
        " consumed samples: 51,200 | iteration 100/500 |",  # the 51,200 before "iteration"
        "1,234 iteration\n iteration 5/10 | x: 1,23 | y: 12,3456 |",
        "iteration 1,234,567\n",
        "setup 1,000\n iteration 5/10 | lr: 1.0 |\n",
        "iteration 5/10 | a: 1,2345 | b: 9,999,9 | c: 7,000\r\n",
        "iterations1,000",
    ],
)
def test_commas_matches_the_regex_it_replaces(sample: str) -> None:
    """The thousands-separator check gives the regex's answer, for these and random lines."""
    regex = re.compile(r"iteration[^\n]*\d,\d{3}\b")  # the check _commas replaces
    rng = random.Random(len(sample))
    parts = ["iteration", " ", "1", ",", "234", "5", "\n", "a", "|", ",12", "9,999"]
    samples = [sample] + ["".join(rng.choices(parts, k=12)) for _ in range(200)]
    for s in samples:
        assert megatron._commas(s) == bool(regex.search(s)), s
