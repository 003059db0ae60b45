"""The compiled event-file scan (``forensics/importers/_tfscan.c``) gives numpy's framing,
length checks and decoded rows, array for array, bit for bit.

Compared on files the real writers made (torch's SummaryWriter with old- and new-style
float and double scalars, tensorboardX with the scalars plugin's metadata, histograms and
text that the fast shape leaves to protobuf), on the project's sample runs and the real runs
in ../shared, and on each of them damaged: bytes changed, a stretch overwritten, cut short,
zero-filled from the middle. The reader's own tests (test_import_tfevents) check the rows
against protobuf and tbparse through whichever path is built.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED

from forensics.importers import tfevents_scan as scan

pytestmark = pytest.mark.skipif(scan._tfscan is None, reason="the kernel is not built")

ROOT = Path(__file__).resolve().parent.parent
_FIELDS = ("rec", "step", "wall_time", "value", "tag_id", "has_meta", "is_tensor", "matched")


def _writers(tmp: Path) -> list[Path]:
    pytest.importorskip("tensorboardX")
    from tensorboardX import SummaryWriter as TbxWriter
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tmp / "torch"))
    for s in range(0, 3000, 7):
        w.add_scalar("loss", math.sin(s) + 2.0, s)
        w.add_scalar("train/lr", 1e-4 * s, s, new_style=True)
        w.add_scalar("grad_norm", float("nan") if s == 700 else s**0.5, s, new_style=True)
        w.add_scalar("double", np.float64(1e-300) * s, s, new_style=True, double_precision=True)
        if s % 500 == 0:
            w.add_histogram("layers.0.weight", np.linspace(-1, 1, 50) * s, s)
            w.add_text("note", f"step {s}", s)
    w.add_scalar("neg", -1.0, -5)  # a negative step: a ten-byte varint
    w.add_scalar("big", 3.0, 2**40)
    w.close()
    t = TbxWriter(str(tmp / "tbx"))
    for s in range(0, 2000, 3):
        t.add_scalar("loss", 1.0 / (s + 1), s)
        t.add_scalar("a/very/long/tag/name/that/spans/several/words/of/eight/bytes", s, s)
        t.add_scalars("multi", {"x": s, "y": -s}, s)
    t.close()
    return sorted(p for p in tmp.rglob("*tfevents*") if p.is_file())


def _real() -> list[Path]:
    found = list((ROOT / "sample_runs").rglob("*tfevents*"))
    if SHARED.exists():
        found += list((SHARED / "real_runs").rglob("*tfevents*"))
    return sorted(p for p in found if p.is_file())


def _damaged(data: bytes, rng: np.random.Generator) -> list[bytes]:
    out = [data]
    n = len(data)
    if n < 64:
        return out
    for _ in range(6):
        b = bytearray(data)
        for i in rng.integers(0, n, size=int(rng.integers(1, 8))):
            b[int(i)] = int(rng.integers(0, 256))
        out.append(bytes(b))
    for _ in range(3):
        b = bytearray(data)
        i, k = int(rng.integers(0, n)), int(rng.integers(1, 80))
        b[i : i + k] = rng.integers(0, 256, size=k).astype(np.uint8).tobytes()
        out.append(bytes(b))
    cut = int(rng.integers(1, n))
    out += [data[:cut], data[:cut] + bytes(n - cut)]  # cut short; zero-filled from there
    return out


def _same_rows(x: scan.FastRows, y: scan.FastRows) -> None:
    for k in _FIELDS:
        a, b = getattr(x, k), getattr(y, k)
        assert a.dtype == b.dtype and a.shape == b.shape, k
        assert a.tobytes() == b.tobytes(), k
    assert x.tags == y.tags


def _check(data: bytes) -> int:
    """Both paths on one buffer; the rows decoded (0 when the framing holds none)."""
    n = len(data)
    got = scan._walk_compiled(data, 1 << 30, n)
    want = scan.walk_numpy(data, 1 << 30, n)
    assert (got.end, got.stop) == (want.end, want.stop)
    assert np.array_equal(got.offs, want.offs) and np.array_equal(got.lens, want.lens)
    if not len(got.offs):
        return 0
    a = np.frombuffer(data, dtype=np.uint8)
    ok = scan.length_crc_ok(a, got.offs, got.lens)
    assert np.array_equal(ok, scan.length_crc_ok_numpy(a, got.offs, got.lens))
    rows = 0
    third = len(got.offs) // 3
    # The whole buffer (padded: the last record ends it), and a later stretch of it.
    for lo in (0, third):
        offs, lens = got.offs[lo:], got.lens[lo:]
        if len(offs):
            fast = scan.decode_fast(a, offs, lens)
            _same_rows(fast, scan.decode_fast_numpy(a, offs, lens))
            rows += len(fast.rec)
    return rows


def test_the_kernel_reads_the_writers_files_as_numpy_does(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    rows = 0
    files = _writers(tmp_path)
    assert len(files) >= 3
    for path in files:
        for data in _damaged(path.read_bytes(), rng):
            rows += _check(data)
    assert rows > 5000


def test_the_kernel_reads_the_sample_and_real_runs_as_numpy_does() -> None:
    files = _real()
    if not files:
        pytest.skip("no event file among the sample runs or ../shared")
    rng = np.random.default_rng(11)
    for path in files:
        for data in _damaged(path.read_bytes(), rng)[:4]:
            _check(data)


def test_the_walk_stops_as_numpy_does() -> None:
    """Zero length, a length past the limit, a header cut off, a record cut off."""
    rec = (5).to_bytes(8, "little") + bytes(4) + b"abcde" + bytes(4)
    for data, stop in [
        (rec * 3, "eof"),
        (rec * 2 + bytes(20), "zero"),
        (rec + (1 << 40).to_bytes(8, "little") + bytes(30), "huge"),
        (rec * 2 + rec[:7], "short"),
        (rec * 2 + rec[:15], "short"),
        (b"", "eof"),
    ]:
        got = scan._walk_compiled(data, 1 << 30, len(data))
        want = scan.walk_numpy(data, 1 << 30, len(data))
        assert got.stop == want.stop == stop
        assert (got.end, got.offs.tolist()) == (want.end, want.offs.tolist())


def test_bad_arguments_are_refused_not_read_past() -> None:
    data = bytes(64)
    offs = np.array([60], dtype=np.int64)
    with pytest.raises(ValueError):
        scan._tfscan.crc_lengths(data, offs, np.empty(1, dtype=np.uint8))
    with pytest.raises(ValueError):
        scan._tfscan.walk(data, 65, 1 << 30, None, None)
    out = [np.empty(1, dtype=t) for t in (np.uint8, np.int64, float, float, np.int64, np.int64)]
    with pytest.raises(ValueError, match="past buf"):
        scan._tfscan.decode(data, offs, np.array([10], dtype=np.int64), *out)


@pytest.mark.parametrize("sample", ["histogram_layers", "resumed", "truncated_log", "bad_batch"])
def test_the_reader_gives_the_same_run_through_either_path(
    sample: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The whole event-file read (framing by blocks, restarts, a cut-off last record,
    histograms) gives the same frame and notes with the kernel as with numpy's path."""
    from forensics.importers import ReadOptions, read_run

    folder = ROOT / "sample_runs" / sample
    opts = ReadOptions(cache=False)
    with_kernel = read_run(folder, options=opts)
    monkeypatch.setattr(scan, "_tfscan", None)
    without = read_run(folder, options=opts)
    assert with_kernel.frame.height > 1000
    assert with_kernel.frame.equals(without.frame)
    assert with_kernel.notes == without.notes
    assert [f.summary for f in with_kernel.import_findings] == [
        f.summary for f in without.import_findings
    ]
