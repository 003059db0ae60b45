"""The Megatron reader's shortcuts give what the plain computations give, bit for bit.

Three shortcuts (forensics/importers/text/megatron.py, layout.py):

- the date of an iteration line is sliced at a constant offset when every line of a piece
  has its ``[`` there, and a ``T`` between date and time is turned into a space only on
  pieces where some date did not parse as it is;
- a full line-after-line table of values is filled a block of rows at a time;
- the log is read in pieces.

Each is checked against the plain way: the date found and parsed on every line, the table
filled column by column, the log read whole, and every row the importer gives against its
own line split by hand (Python's ``float`` and ``datetime``), on real-shaped logs with odd
lines and on the real Megatron logs under ../shared.
"""

from __future__ import annotations

import math
import random
import re
import struct
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import shared_path

from forensics.importers.base import Source
from forensics.importers.text import IMPORTER, layout, megatron
from forensics.importers.text.engine import read_pipes

_SAMPLE = " [2024-05-01 10:00:00] iteration        1/     100 | lm loss: 1.0 |\n"


def _plain_wall_time(it: pl.DataFrame) -> pl.Series:
    """The date as the reader found it before the shortcut: after the first ``[`` of every
    line, ``T`` made a space on every line."""
    c0 = pl.col("c0")
    date = c0.str.slice(c0.str.find("[", literal=True) + 1, 19).str.replace("T", " ", literal=True)
    return it.select(megatron._seconds(date).alias("wall_time")).to_series()


def _bits(values: list[float | None]) -> list[object]:
    """Floats compared by their bits (NaN equals NaN, -0.0 differs from 0.0)."""
    return [None if v is None else struct.pack("<d", v) for v in values]


DATE_CASES = {
    "fixed": [f" [2024-05-01 10:00:{s:02d}] iteration {s:8d}/     100 " for s in range(60)],
    "t_dates": [f" [2024-05-01T10:00:{s:02d}] iteration {s:8d}/     100 " for s in range(60)],
    "mixed_t": [
        f" [2024-05-01{'T' if s % 3 else ' '}10:00:{s:02d}] iteration {s:8d}/     100 "
        for s in range(60)
    ],
    "moving_bracket": [
        f"{'rank0: ' if s % 2 else ''} [2024-05-01 10:00:{s:02d}] iteration {s}/ 100 "
        for s in range(60)
    ],
    "fractions": [f" [2024-05-01 10:00:{s:02d}.{s:03d}] iteration {s}/ 100 " for s in range(60)],
    "some_without_date": [
        f" [2024-05-01 10:00:{s:02d}] iteration {s}/ 100 " if s % 5 else f" iteration {s}/ 100 "
        for s in range(60)
    ],
    "garbage": [
        " [2024-05-01 10:00:00] iteration 1/ 100 ",
        " [2024-13-45 99:99:99] iteration 2/ 100 ",
        " [not a date, a tag T] iteration 3/ 100 ",
        " [2024-05-01 10:00:0] iteration 4/ 100 ",
        " []iteration 5/ 100 ",
        " [2024-05-01T10:00:05Z] iteration 6/ 100 ",
        " [T2024-05-01 10:00:0] iteration 7/ 100 ",
    ],
    "empty": [],
}


@pytest.mark.parametrize("case", list(DATE_CASES))
def test_dates_equal_the_plain_reading(case: str) -> None:
    it = pl.DataFrame({"c0": DATE_CASES[case]}, schema={"c0": pl.Utf8})
    fast = megatron._wall_time(it, _SAMPLE)
    plain = _plain_wall_time(it)
    assert fast.dtype == plain.dtype == pl.Float64
    assert _bits(fast.to_list()) == _bits(plain.to_list())


def test_dates_in_a_piece_cut_from_a_real_shaped_log() -> None:
    """The date column as a piece holds it (cells from the pipe split, iteration lines
    filtered, chunks of several reads)."""
    lines = [
        f" [2024-05-0{1 + i // 50_000} {i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}]"
        f" iteration {i:8d}/  200000 | lm loss: {i / 7:.6E} |"
        for i in range(1, 3000)
    ]
    raw = ("\n".join(lines) + "\n").encode()
    cells = pl.concat([read_pipes(raw[:60_000], 3), read_pipes(raw[60_000:], 3)], rechunk=False)
    fast = megatron._wall_time(cells, _SAMPLE)
    assert _bits(fast.to_list()) == _bits(_plain_wall_time(cells).to_list())


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 14])
def test_row_blocks_fill_as_columns_do(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(block)
    n, k = 1000, 6
    cols = []
    for i in range(k):
        # Chunk borders of every column elsewhere, and none at a block's border.
        cuts = sorted(set(rng.integers(1, n, size=i + 1).tolist()))
        x = rng.standard_normal(n)
        x[rng.integers(0, n, size=5)] = [np.nan, np.inf, -np.inf, -0.0, 1e308]
        parts = [pl.Series(f"_v{i}", x[a:b]) for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
        cols.append(pl.concat(parts, rechunk=False))
    plain = np.empty((n, k))
    for i, s in enumerate(cols):
        layout._fill(plain[:, i], s)
    monkeypatch.setattr(layout, "_ROW_BLOCK", block)
    fast = np.full((n, k), 12345.0)
    layout._fill_rows(fast, cols)
    assert fast.tobytes() == plain.tobytes()


# -- whole logs: pieces against the whole, every row against its own line -----------------
def _odd_log(seed: int) -> bytes:
    """A Megatron log with the odd lines real ones have: rank copies, keys missing (an old
    fork without grad norm), nan/inf values, skipped iterations, validation and other lines
    interleaved, a resume that goes back, dates with a "T", a rank prefix, and a last line
    cut short."""
    rng = random.Random(seed)
    out = ["using world size: 8, data-parallel size: 2", "> building GPT model ..."]
    step = 0
    for i in range(2400):
        step += 1
        if i == 1500:
            step -= 60  # resumed from an earlier checkpoint
        keys = [
            f"consumed samples: {step * 512:12d}",
            f"elapsed time per iteration (ms): {500 + rng.random() * 10:.1f}",
            f"learning rate: {1.5e-4 * min(1.0, step / 100):.6E}",
            f"global batch size: {512:5d}",
        ]
        loss = 2 + 8 / (1 + step / 100) + rng.random() * 0.01
        odd = rng.random()
        printed = "nan" if odd < 0.01 else "inf" if odd < 0.015 else f"{loss:.6E}"
        keys.append(f"lm loss: {printed}")
        keys.append(f"loss scale: {65536.0 if step < 900 else 32768.0}")
        if rng.random() > 0.03:  # an old fork printed no grad norm
            keys.append(f"grad norm: {1 + rng.random():.3f}")
        keys.append(f"number of skipped iterations: {1 if odd > 0.99 else 0:3d}")
        keys.append("number of nan iterations:   0")
        sep = "T" if 1200 <= i < 1300 else " "
        date = f"[2024-05-01{sep}{10 + step // 3600:02d}:{step // 60 % 60:02d}:{step % 60:02d}]"
        prefix = "rank0: " if 1700 <= i < 1750 else ""
        line = f"{prefix} {date} iteration {step:8d}/    5000 | " + " | ".join(keys) + " |"
        out.append(line)
        if rng.random() < 0.05:
            out.append(line)  # another rank printed the same iteration
        if step % 97 == 0:
            out.append(
                f" validation loss at iteration {step} | lm loss value: {rng.random() + 2:.6E} |"
                f" lm loss PPL: {rng.random() * 10 + 7:.6E} |"
            )
        if rng.random() < 0.02:
            out.append(f"[rank{rng.randrange(8)}]: saving checkpoint at iteration {step}")
    out.append(out[-1][: len(out[-1]) // 2])  # killed while printing
    return "\n".join(out).encode()


def _source(tmp_path: Path, name: str) -> Source:
    return Source("text_logs", [tmp_path / name], name, tmp_path, scope="file")


_DATE = re.compile(r"\[(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)")


def _check_rows_against_lines(frame: pl.DataFrame, raw: bytes) -> int:
    """Every row of an iteration line: its value is the number printed after its key on
    that line, and its wall time the line's date, both read by hand. Returns the rows
    checked."""
    lines = raw.decode("utf-8", "replace").split("\n")
    rows = frame.select("record_idx", pl.col("tag").cast(pl.Utf8), "value", "wall_time")
    checked = 0
    for ln, tag, value, wall in rows.iter_rows():
        line = lines[ln - 1]
        if "validation loss at" in line or not re.search(r"iteration\s+\d+", line):
            continue
        cells = line.split("|")
        printed = [c.split(":", 1)[1] for c in cells[1:] if c.split(":", 1)[0].strip() == tag]
        assert printed, (ln, tag, line)
        want = float(printed[0].strip().replace(",", ""))
        assert struct.pack("<d", value) == struct.pack("<d", want) or (
            math.isnan(value) and math.isnan(want)
        ), (ln, tag, value, want)
        date = _DATE.search(cells[0][cells[0].find("[") :]) if "[" in cells[0] else None
        if date is None:
            assert wall is None, (ln, line)
        else:
            when = datetime.strptime(" ".join(date.groups()), "%Y-%m-%d %H:%M:%S")
            assert wall == when.replace(tzinfo=UTC).timestamp(), (ln, line)
        checked += 1
    return checked


def _pieces_and_whole(
    tmp_path: Path, name: str, raw: bytes, monkeypatch: pytest.MonkeyPatch
) -> pl.DataFrame:
    whole = IMPORTER.read_raw(_source(tmp_path, name), raw)
    # Several pieces, each with more than the 200 iteration lines the layout is read from.
    monkeypatch.setattr(megatron, "CHUNK_BYTES", max(len(raw) // 5, 90_000))
    pieces = IMPORTER.read_raw(_source(tmp_path, name), raw)
    monkeypatch.undo()
    assert pieces.frame.equals(whole.frame)
    assert pieces.notes == whole.notes
    assert [f.to_dict() for f in pieces.findings] == [f.to_dict() for f in whole.findings]
    return whole.frame


@pytest.mark.parametrize("seed", [1, 2])
def test_odd_log_rows_equal_their_lines(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = _odd_log(seed)
    frame = _pieces_and_whole(tmp_path, "train.log", raw, monkeypatch)
    assert frame.get_column("segment").max() == 1  # the resume was seen
    assert frame.filter(pl.col("value").is_nan()).height > 0
    assert frame.filter(pl.col("tag") == "lm loss value").height > 0
    assert _check_rows_against_lines(frame, raw) > 20_000


def _real_megatron_logs() -> list[Path]:
    root = shared_path("real_runs", "bigscience-megatron-experiments")
    return sorted(root.glob("*.out"))


def test_real_megatron_logs_rows_equal_their_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs = _real_megatron_logs()
    assert logs
    total = 0
    for path in logs:
        raw = path.read_bytes()
        frame = _pieces_and_whole(tmp_path, path.name, raw, monkeypatch)
        total += _check_rows_against_lines(frame, raw)
    assert total > 0


@pytest.mark.parametrize("advice", [True, False])
def test_small_pages_puts_numpys_advice_back(advice: bool) -> None:
    toggle = getattr(getattr(np, "_core", np).multiarray, "_set_madvise_hugepage", None)
    if toggle is None:
        pytest.skip("this numpy has no huge-page advice switch")
    before = toggle(advice)
    try:
        with layout._small_pages():
            assert toggle(False) is False  # off while the rows are laid out
        assert toggle(advice) is advice  # and back as it was
    finally:
        toggle(before)
