"""The compiled reading of Megatron iteration lines (forensics/importers/text/_megatron.c)
gives what the polars path gives, bit for bit, and hands every line it cannot read so to
the polars path.

Each log is read in pieces twice: with the kernel, and with the kernel switched off (every
piece split by polars' CSV reader). The frames, notes and findings must be equal, and each
case says which lines the kernel must have read itself and which it must have handed over:
a test that only ever compared the polars path with itself would pass whatever the kernel
did.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from forensics.importers.base import Source
from forensics.importers.text import IMPORTER, megatron

kernel = megatron._megatron
needs_kernel = pytest.mark.skipif(
    kernel is None, reason="the Megatron kernel was not built here (no C compiler at install)"
)

KEYS = (
    "consumed samples",
    "elapsed time per iteration (ms)",
    "learning rate",
    "global batch size",
    "lm loss",
    "loss scale",
    "grad norm",
    "number of skipped iterations",
    "number of nan iterations",
)


def _line(step: int, rng: random.Random, date: str | None = " ", **over: str) -> str:
    cells = {
        "consumed samples": f"{step * 512:12d}",
        "elapsed time per iteration (ms)": f"{500 + rng.random() * 10:.1f}",
        "learning rate": f"{1.5e-4 * min(1.0, step / 100):.6E}",
        "global batch size": "  512",
        "lm loss": f"{2 + 8 / (1 + step / 100) + rng.random() * 0.01:.6E}",
        "loss scale": "65536.0",
        "grad norm": f"{1 + rng.random():.3f}",
        "number of skipped iterations": "  0",
        "number of nan iterations": "  0",
    }
    cells.update({k.replace("_", " "): v for k, v in over.items()})
    head = ""
    if date is not None:
        t = datetime(2024, 2, 28, 23, 0, 0) + timedelta(seconds=step)
        head = f" [{t:%Y-%m-%d}{date}{t:%H:%M:%S}]"
    body = " | ".join(f"{k}: {v}" for k, v in cells.items() if v is not None)
    return f"{head} iteration {step:8d}/   100000 | {body} |"


def _log(n: int = 3000, seed: int = 0, edit: Callable[[int, str], str] | None = None) -> bytes:
    """A Megatron log of ``n`` iteration lines after a preamble, with a validation line every
    250 steps; ``edit(step, line)`` rewrites a line (or returns several)."""
    rng = random.Random(seed)
    out = ["using world size: 8, data-parallel size: 2", "> building GPT model ...", ""]
    for step in range(1, n + 1):
        line = _line(step, rng)
        out.append(edit(step, line) if edit else line)
        if step % 250 == 0:
            out.append(
                f" validation loss at iteration {step} | lm loss value: {rng.random() + 2:.6E} |"
                f" lm loss PPL: {rng.random() * 10 + 7:.6E} |"
            )
    return ("\n".join(out) + "\n").encode()


def _both(raw: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """The log read in eight pieces with the kernel and without: equal. Returns the lines of
    the pieces offered to the kernel (all but the last, which sets the layout) that it read,
    and those it left to polars."""
    source = Source("text_logs", [tmp_path / "train.log"], "train.log", tmp_path, scope="file")
    tally = [0, 0]
    real = megatron._kernel_read

    def counted(*args: object) -> list[megatron._Part]:
        parts = real(*args)  # type: ignore[arg-type]
        for part in parts:  # (one worker thread at a time holds the interpreter)
            if isinstance(part, megatron._KernelRead):
                tally[0] += part.n_lines
            else:
                tally[1] += raw[part[0] : part[1]].count(b"\n")
        return parts

    with monkeypatch.context() as patch:
        patch.setattr(megatron, "CHUNK_BYTES", len(raw) // 8)
        patch.setattr(megatron, "_kernel_read", counted)
        fast = IMPORTER.read_raw(source, raw)
        patch.setattr(megatron, "_kernel_read", real)
        patch.setattr(megatron, "_megatron", None)
        plain = IMPORTER.read_raw(source, raw)
    assert fast.frame.height > 0
    assert fast.frame.equals(plain.frame), "the kernel's rows differ from the polars path's"
    assert fast.notes == plain.notes
    assert [f.to_dict() for f in fast.findings] == [f.to_dict() for f in plain.findings]
    return tally[0], tally[1]


def _every_other(change: Callable[[str], str], every: int = 7) -> Callable[[int, str], str]:
    return lambda step, line: change(line) if step % every == 0 else line


# Each case: a log edit, and who reads the lines: "kernel" every line; "edited" polars the
# edited lines, the kernel the others; "polars" most lines (every line edited, or a byte
# outside ASCII every seventh line: past 16 such lines polars reads the rest of a piece).
CASES: dict[str, tuple[Callable[[int, str], str] | None, str]] = {
    "plain": (None, "kernel"),
    "rank copies": (lambda s, ln: f"{ln}\n{ln}" if s % 5 == 0 else ln, "kernel"),
    "overflow and other lines": (
        lambda s, ln: (
            f"[Rank 0] OVERFLOW! Skipping step. Attempted loss scale: 65536\n{ln}"
            if s % 9 == 0
            else f"saving checkpoint at iteration {s}\n\n{ln}"
            if s % 13 == 0
            else ln
        ),
        "kernel",
    ),
    "dates with a T": (_every_other(lambda ln: ln.replace(" 23:", "T23:", 1)), "kernel"),
    "thousands separators": (
        lambda s, ln: ln.replace(f"{s * 512:12d}", f"{s * 512:12,d}"),
        "kernel",
    ),
    "deepspeed's scale -1 and grad norm 0": (
        lambda s, ln: _line(s, random.Random(s), **{"loss_scale": "-1.0", "grad_norm": "0.000"}),
        "kernel",
    ),
    "numbers polars parses the slow way": (
        lambda s, ln: _line(
            s,
            random.Random(s),
            lm_loss=("1.2345678901234567890123E+00", "2.5e-320", "1e400", "-0.0", "+7.")[s % 5],
            grad_norm=(".5", "3", "1e22", "9007199254740993", "12345678901234567890")[s % 5],
        ),
        "kernel",
    ),
    "inf printed": (
        _every_other(lambda ln: ln.replace("grad norm: 1", "grad norm: inf 1")),
        "edited",
    ),
    "nan printed": (lambda s, ln: _line(s, random.Random(s), lm_loss="nan"), "polars"),
    "a key missing (an old fork)": (
        _every_other(lambda ln: ln.replace("grad norm", "gnorm")),
        "edited",
    ),
    "a byte outside ASCII": (
        _every_other(lambda ln: ln.replace("lm loss", "lm loss \u00b5")),
        "polars",
    ),
    "an fp16 interval of skipped steps (no loss, no grad norm)": (
        lambda s, ln: (
            _line(
                s,
                random.Random(s),
                lm_loss=None,
                grad_norm=None,
                number_of_skipped_iterations="  1",
            )
            if s % 40 == 0
            else ln
        ),
        "edited",
    ),
    "a few lines with a byte outside ASCII": (
        lambda s, ln: f"saving to /ckpt/\u00e9t\u00e9-{s}\n{ln}" if s % 150 == 0 else ln,
        "edited",
    ),
    "a letter after the step": (_every_other(lambda ln: ln.replace("/", "x/", 1)), "edited"),
    "an impossible date": (
        _every_other(lambda ln: ln.replace("2024-02-2", "2024-02-3", 1)),
        "edited",
    ),
    "a tab in the padding": (
        _every_other(lambda ln: ln.replace("lm loss: ", "lm loss:\t")),
        "edited",
    ),
    "an empty number": (_every_other(lambda ln: ln.replace("lm loss: ", "lm loss:  |")), "edited"),
}


@needs_kernel
@pytest.mark.parametrize("case", list(CASES))
def test_the_kernel_reads_as_polars_does(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    edit, who = CASES[case]
    by_kernel, by_polars = _both(_log(edit=edit), tmp_path, monkeypatch)
    if who == "kernel":
        assert by_kernel > 2000 and by_polars == 0, (by_kernel, by_polars)
    elif who == "edited":
        # Polars reads each edited line (and the kernel goes on after it): a seventh or so.
        assert 0 < by_polars < by_kernel / 4, (by_kernel, by_polars)
    else:
        assert by_kernel < by_polars, (by_kernel, by_polars)


@needs_kernel
def test_cut_lines_and_empty_cells_are_nulls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line cut right after a bar has no cells past it (null values); an empty cell between
    two bars is null too. Both read by the kernel as by polars."""

    def edit(step: int, line: str) -> str:
        if step % 11 == 0:
            return line[: line.index("| lm loss") + 1]
        if step % 17 == 0:
            return line.replace("| global batch size:   512 |", "||")
        return line

    by_kernel, by_polars = _both(_log(edit=edit), tmp_path, monkeypatch)
    assert by_kernel > 2000 and by_polars == 0


@needs_kernel
def test_logs_without_dates_and_with_a_layout_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Undated lines (wall time null); a key renamed mid-run (the early lines do not fit the
    layout read from the last lines: polars reads them, in growing runs, the kernel the
    later ones)."""
    rng = random.Random(3)
    undated = "\n".join(_line(s, rng, date=None) for s in range(1, 3001)).encode()
    by_kernel, by_polars = _both(undated, tmp_path, monkeypatch)
    assert by_kernel > 2000 and by_polars == 0

    def late_key(step: int, line: str) -> str:
        return line if step > 1500 else line.replace(" grad norm: ", " grad_nrm: ")

    by_kernel, by_polars = _both(_log(edit=late_key), tmp_path, monkeypatch)
    assert by_kernel > 1000 and by_polars > 1000, (by_kernel, by_polars)


def _column(texts: list[str]) -> tuple[bytes, tuple[bytes | None, ...]]:
    body = "".join(
        f" [2024-05-01 10:00:00] iteration {i + 1}/ 9 | x: {t} |\n" for i, t in enumerate(texts)
    )
    return body.encode(), (b" x:", None)


def _val(n: int) -> np.ndarray:
    return np.empty(3 * n, np.int64)


def _kernel_numbers(texts: list[str]) -> list[float] | None:
    assert kernel is not None
    buf, keys = _column(texts)
    n = len(texts) + 1
    ln, step, wall = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n)
    values = np.empty((1, n))
    got = kernel.read(buf, keys, (None, None), False, True, ln, step, wall, values, _val(n), 0, 0)
    # (declined: the reading stopped at the line that holds the text)
    return None if got[5] < len(buf) else values[0, : got[1]].tolist()


def _bits(xs: list[float]) -> list[bytes]:
    return [struct.pack("<d", x) for x in xs]


@needs_kernel
def test_numbers_match_polars_bit_for_bit() -> None:
    rng = np.random.default_rng(7)
    x = np.concatenate(
        [
            rng.standard_normal(3000) * 10.0 ** rng.integers(-30, 30, 3000),
            rng.random(500) * 1e-300,
            np.array([0.0, -0.0, 5e-324, 1.7976931348623157e308, 2.0**53, 2.0**53 + 2]),
        ]
    )
    texts = [f"{v:.6E}" for v in x] + [f"{v:.3f}" for v in x[:500]] + [repr(float(v)) for v in x]
    texts += [f"{v:.20e}" for v in x[:300]] + [f"{int(abs(v) * 1e6)}" for v in x[:300]]
    texts += ["1.", ".5", "+1", "-.5", "1E+05", "1e-5", "01.50", "1e400", "-1e400", "1e-400"]
    texts += ["123456789012345678901234567890", "0.000000000000000000000000001"]
    want = pl.Series(texts).cast(pl.Float64, strict=False)
    assert want.null_count() == 0
    got = _kernel_numbers(texts)
    assert got is not None
    assert _bits(got) == _bits(want.to_list())


@needs_kernel
@pytest.mark.parametrize("text", ["nan", "inf", "-Infinity", "1.5e", "e5", "0x10", "1_0", "", "."])
def test_texts_polars_reads_otherwise_are_declined(text: str) -> None:
    assert _kernel_numbers(["1.0", text]) is None


@needs_kernel
def test_dates_match_polars() -> None:
    rng = random.Random(11)
    start = datetime(1970, 1, 1)
    when = [start + timedelta(seconds=rng.randrange(0, 30 * 365 * 86400 * 33)) for _ in range(3000)]
    when += [datetime(2024, 2, 29, 23, 59, 59), datetime(2000, 2, 29), datetime(2100, 3, 1)]
    lines = [f" [{t:%Y-%m-%d %H:%M:%S}] iteration {i + 1}/ 9 | x: 1 |" for i, t in enumerate(when)]
    buf = ("\n".join(lines)).encode()
    n = len(lines) + 1
    ln, step, wall, values = (
        np.empty(n, np.int64),
        np.empty(n, np.int64),
        np.empty(n),
        np.empty((1, n)),
    )
    val = _val(n)
    keys: tuple[tuple[bytes | None, ...], tuple[bytes | None, ...]] = ((b" x:", None), (None, None))
    got = kernel.read(buf, *keys, False, True, ln, step, wall, values, val, 0, 0)
    assert got[1] == len(when) and got[5] == len(buf)
    want = [t.replace(tzinfo=UTC).timestamp() for t in when]
    assert _bits(wall[: len(when)].tolist()) == _bits(want)
    assert step[: len(when)].tolist() == list(range(1, len(when) + 1))
    for bad in (
        "2023-02-29 10:00:00",
        "2024-13-01 10:00:00",
        "2024-01-01 24:00:00",
        "2024-01-01 10:60:00",
        "2024-01-01 10:00:60",
        "1969-12-31 23:59:59",
    ):
        one = f" [{bad}] iteration 1/ 9 | x: 1 |".encode()
        assert kernel.read(one, *keys, False, True, ln, step, wall, values, val, 0, 0)[5] == 0


@needs_kernel
def test_the_kernel_stops_at_a_line_it_declines_and_goes_on_from_a_row() -> None:
    """Lines before a declined one are read, the reading stops where that line starts; a
    second call fills the same arrays from a later row (``first``), as _kernel_read does."""
    lines = [f" iteration {i}/ 9 | x: {i}.5 |\n" for i in range(1, 7)]
    lines[3] = " iteration 4/ 9 | x: nan |\n"
    buf = "".join(lines).encode()
    ln, step, wall, values, val = _arrays(8)
    n_lines, m, hint, const, nv, stop = kernel.read(
        buf, (b" x:",), (None,), False, False, ln, step, wall, values, val, 0, 0
    )
    assert (n_lines, m, hint, nv) == (3, 3, False, 0)
    assert stop == len("".join(lines[:3]))
    rest = "".join(lines[4:]).encode()
    got = kernel.read(rest, (b" x:",), (None,), False, False, ln, step, wall, values, val, 3, 0)
    assert got[:2] == (2, 2) and got[5] == len(rest)
    assert step[:5].tolist() == [1, 2, 3, 5, 6]
    assert ln[:5].tolist() == [0, 1, 2, 0, 1]  # (each call's rows count from its own start)
    assert values[0, :5].tolist() == [1.5, 2.5, 3.5, 5.5, 6.5]


def _arrays(n: int) -> tuple[np.ndarray, ...]:
    return np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n), np.empty((1, n)), _val(n)


@needs_kernel
def test_the_kernel_refuses_what_it_cannot_hold() -> None:
    buf = b" iteration 1/ 9 | x: 1 |\n iteration 2/ 9 | x: 2 |\n"
    x: tuple[bytes | None, ...] = (b" x:",)
    one = (np.empty(1, np.int64), np.empty(1, np.int64), np.empty(1), np.empty((1, 1)), _val(1))
    with pytest.raises(ValueError):  # two iteration lines, room for one
        kernel.read(buf, x, (None,), False, False, *one, 0, 0)
    with pytest.raises(ValueError):  # room for two, but from row 2 of 3
        kernel.read(buf, x, (None,), False, False, *_arrays(3), 2, 0)
    with pytest.raises(ValueError):  # a first row past the arrays
        kernel.read(buf, x, (None,), False, False, *_arrays(3), 4, 0)
    with pytest.raises(ValueError):  # values too small for the keyed columns
        kernel.read(buf, (b" x:", b" y:"), (None, None), False, False, *_arrays(3), 0, 0)
    with pytest.raises(ValueError):  # val smaller than three a row
        kernel.read(buf, x, (None,), False, False, *_arrays(3)[:4], _val(2), 0, 0)
    with pytest.raises(TypeError):
        kernel.read(buf, (" x:",), (None,), False, False, *_arrays(3), 0, 0)  # type: ignore[arg-type]
    assert kernel.lines(b"a\nb\n") == (2, -1)
    assert kernel.lines("ab\n\u00e9\n".encode()) == (2, 3)
    assert kernel.lines(b"a" * 1000 + b"\x00b") == (0, 1000)


def test_the_kernel_is_built_where_a_compiler_is() -> None:
    """setup.py builds the kernel as an optional extension (polars reads every piece
    otherwise: the same rows, more slowly). Where a C compiler is found it must be built."""
    import shutil
    import sysconfig

    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) on this machine")
    assert kernel is not None


@needs_kernel
def test_a_mapped_log_is_read_by_the_kernel_from_the_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big log is mapped, and the kernel reads its pieces from the map (no copy): the same
    rows as the polars path reading the file's bytes."""
    from forensics.importers import ReadOptions
    from forensics.importers.text import engine

    raw = _log(edit=CASES["overflow and other lines"][0])
    path = tmp_path / "train.log"
    path.write_bytes(raw)
    source = Source("text_logs", [path], path.name, tmp_path, scope="file")
    mapped: list[bool] = []
    real = megatron._kernel_read

    def counted(raw: object, *args: object) -> list[megatron._Part]:
        parts = real(raw, *args)  # type: ignore[arg-type]
        read = [p for p in parts if isinstance(p, megatron._KernelRead)]
        mapped.append(isinstance(raw, engine.MappedText) and len(read) == len(parts))
        return parts

    monkeypatch.setattr(engine, "MAP_BYTES", 0)
    monkeypatch.setattr(megatron, "CHUNK_BYTES", len(raw) // 8)
    monkeypatch.setattr(megatron, "_kernel_read", counted)
    got = IMPORTER.read(source, ReadOptions(cache=False))
    assert mapped and all(mapped)
    monkeypatch.setattr(megatron, "_megatron", None)
    ref = IMPORTER.read_raw(source, raw, series_order=True)
    assert got.frame.equals(ref.frame)
    assert got.notes == ref.notes


_DAMAGE = (
    b"nan",
    b"inf",
    b"-0",
    b"1e999",
    b"1,234",
    b" | x: 5 |",
    b"\n\n",
    b"iteration 7",
    b"/",
    b"[2024-13-01 10:00:00]",
    b"validation loss at iteration 9 | lm loss value: 1 |\n",
    "\u00e9\u00b5".encode(),
    b"\x00",
)


def _damaged(raw: bytes, rng: random.Random) -> bytes:
    """``raw`` with up to 40 random cuts, flipped bytes, duplicated lines and insertions of
    what confuses a reader (nan, separators, dates, a NUL, non-ASCII)."""
    b = bytearray(raw)
    for _ in range(rng.randrange(1, 40)):
        op, i = rng.randrange(5), rng.randrange(len(b))
        if op == 0:
            b[i] = rng.randrange(256)
        elif op == 1:
            b[i] = rng.choice(b" |:/[]-+.eE0123456789\t\n")
        elif op == 2:
            del b[i : i + rng.randrange(1, 200)]
        elif op == 3:
            b[i:i] = rng.choice(_DAMAGE)
        else:
            start, end = raw.rfind(b"\n", 0, i) + 1, raw.find(b"\n", i) + 1
            b[i:i] = raw[start:end]
    return bytes(b)


@needs_kernel
def test_damaged_logs_read_the_same_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Randomly damaged logs (a bounded run of the differential fuzzing done by hand: 2,150
    logs, no difference): the kernel with its hand-overs to polars gives the polars path's
    frame, notes and findings; both readings took part."""
    by_kernel = by_polars = 0
    for seed in range(30):
        rng = random.Random(seed)
        raw = _damaged(_log(n=rng.randrange(1500, 2500), seed=seed), rng)
        k, p = _both(raw, tmp_path, monkeypatch)
        by_kernel, by_polars = by_kernel + k, by_polars + p
    assert by_kernel > 10_000 and by_polars > 100, (by_kernel, by_polars)
