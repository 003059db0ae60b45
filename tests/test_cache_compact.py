"""The run cache's compact tier: a run whose plain arrays would crowd the cache is kept with
exact encodings (forensics.cache_codecs) and read back bit for bit."""

from __future__ import annotations

import math
import os
import pickle
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import write_tb_run
from polars.testing import assert_frame_equal

from forensics import cache
from forensics import cache_codecs as codecs
from forensics.importers import ReadOptions, read_run

OLD = time.time() - 3600


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 7 rows, so the encoders' block seams fall inside every test column."""
    monkeypatch.setattr(codecs, "_BLOCK", 7)


# -- the encodings ----------------------------------------------------------------------------
RAMP_CASES = {
    "one row": [5],
    "two rows": [5, 9],
    "one run": list(range(0, 40)),
    "series after series": list(range(0, 30)) + list(range(0, 30)) + list(range(100, 160, 3)),
    "falling and flat": [9, 7, 5, 3, 3, 3, 3, 10, 10, -4, -8, -12],
    "repeats at the seams": [0, 0, 1, 2, 3, 3, 3, 4, 5, 6, 7, 7],
    "int64 ends": [-(1 << 61), 0, 1 << 61],
}


@pytest.mark.parametrize(
    ("case", "dtype"),
    [
        (c, t)
        for c in sorted(RAMP_CASES)
        for t in (np.int64, np.int32)
        if "int64" not in c or t is np.int64
    ],
)
def test_ramps_give_the_column_back(small_blocks, case: str, dtype) -> None:
    a = np.array(RAMP_CASES[case], dtype=np.int64).astype(dtype)
    pieces = codecs.ramps(a, limit=100)
    assert pieces is not None
    back = codecs.from_ramps(pieces, len(a), a.dtype)
    assert back.dtype == a.dtype and np.array_equal(back, a), (back, a)


def test_ramps_are_refused_past_their_limit(small_blocks) -> None:
    """A column that is no run of strides (every difference new) is left as it is."""
    a = np.cumsum(np.arange(50, dtype=np.int64))
    assert codecs.ramps(a, limit=10) is None
    assert codecs.ramps(np.arange(50, dtype=np.int64), limit=1) is not None


@pytest.mark.parametrize("width", [np.int8, np.int16])
def test_deltas_give_the_column_back_with_their_large_jumps(small_blocks, width) -> None:
    """Record indices of series after series: small steps, a few jumps back and forth."""
    rng = np.random.default_rng(3)
    parts = [np.cumsum(rng.integers(1, 100, 40)) + off for off in (10, 5_000_000, 7, 90_000)]
    a = np.concatenate(parts).astype(np.int32)
    got = codecs.deltas(a, limit=20, width=width)
    assert got is not None
    small, rows, firsts = got
    assert small.dtype == width and len(rows) == len(firsts) >= 3
    back = codecs.from_deltas(small, rows, firsts, int(a[0]), a.dtype)
    assert back.dtype == a.dtype and np.array_equal(back, a)


def test_deltas_sum_each_stretch_from_its_own_start(small_blocks) -> None:
    """An int16 column climbing by 100 to 29,900 twice, a jump back between: one running sum
    over both climbs would reach 59,800, past int16 (a 10M-step run's record index passed
    int32 so, and was kept at four bytes a row); summed stretch by stretch it comes back."""
    twice = np.concatenate([np.arange(0, 30_000, 100)] * 2).astype(np.int16)
    got = codecs.deltas(twice, limit=5, width=np.int8)
    assert got is not None
    back = codecs.from_deltas(*got, int(twice[0]), twice.dtype)
    assert back.dtype == twice.dtype and np.array_equal(back, twice)


def test_deltas_are_refused_where_they_cannot_give_the_column_back(small_blocks) -> None:
    """Too many large jumps, no narrower type than the column's, or two values further apart
    than the column's type can count: None, and the column stays as it is."""
    a = np.arange(0, 50 * 1000, 1000, dtype=np.int64)
    assert codecs.deltas(a, limit=10, width=np.int8) is None  # 49 jumps
    assert codecs.deltas(a, limit=49, width=np.int8) is not None
    assert codecs.deltas(np.arange(9, dtype=np.int8), limit=9, width=np.int8) is None
    wide = np.array([-30_000, -29_950, 29_950, 30_000], dtype=np.int16)
    assert codecs.deltas(wide, limit=5, width=np.int8) is None


def test_float32_only_when_every_bit_comes_back(small_blocks) -> None:
    """float64 values that are float32 (NaN, inf, -0.0 among them) narrow; one value that
    is not, or a NaN with a payload float32 cannot hold, keeps the column float64."""
    a = np.array([1.5, -0.0, np.inf, -np.inf, np.nan, 3.0e-39, 0.1], dtype=np.float32)
    wide = np.tile(a.astype(np.float64), 3)
    got = codecs.as_float32(wide)
    assert got is not None
    back = codecs.from_float32(got)
    assert back.tobytes() == wide.tobytes()
    assert codecs.as_float32(np.append(wide, 0.1)) is None  # (0.1 as a double)
    payload = np.array([np.nan]).view(np.int64) | 1
    assert codecs.as_float32(np.append(wide, payload.view(np.float64))) is None


def test_joint_codes_give_every_column_back(small_blocks) -> None:
    """Three few-valued columns (a null among them) coded together: each column is its
    values gathered by the joint codes."""
    tag = pl.Series(["a", "b", None, "c", "a", "b"] * 5, dtype=pl.Categorical)
    layer = pl.Series([0, 1, None, 2, 0, 1] * 5, dtype=pl.Int16)
    metric = pl.Series(["x", "x", "y", "y", "x", "x"] * 5, dtype=pl.Categorical)
    coded = {}
    for name, s in (("tag", tag), ("layer", layer), ("metric", metric)):
        got = cache._coded(s)
        assert got is not None
        coded[name] = got
    joint = codecs.joint_codes(coded, 256)
    assert joint is not None
    codes, values = joint
    assert codes.dtype == np.uint8 and len(codes) == len(tag)
    for name, s in (("tag", tag), ("layer", layer), ("metric", metric)):
        assert values[name].gather(pl.Series(codes)).equals(s, check_dtypes=True, null_equal=True)
    assert codecs.joint_codes(coded, 2) is None  # four combinations


# -- the cache's compact tier -----------------------------------------------------------------
def _compact_cap(monkeypatch, frame: pl.DataFrame) -> None:
    """A cap under which the frame's plain arrays are over a quarter, its compact ones under
    COMPACT_SHARE: the compact tier is taken."""
    monkeypatch.setattr(cache, "RAW_MIN_BYTES", 0)
    plain = frame.height * (4 + 8 + 8 + 8 + 3 * 2)
    monkeypatch.setenv("FORENSICS_CACHE_MAX_MB", str(2 * plain / 2**20))


def _kinds(d: Path) -> dict[str, str]:
    (entry,) = [e for e in d.iterdir() if not e.name.startswith(".")]
    meta = pickle.loads((entry / "run.pickle").read_bytes())
    return {c: k for c, (k, _) in meta["frame"]["columns"].items()}


def test_an_event_file_run_is_kept_compact_and_read_back_bit_for_bit(
    tmp_path, cache_dir, monkeypatch
) -> None:
    """A run written by tensorboardX (scalars stored as float32), with a NaN tail: its steps
    kept as runs, record indices as differences, values as float32, tag, metric and layer
    as one code; read back identical (every bit), without parsing."""
    run_dir = write_tb_run(tmp_path / "run", n=700, nan_at=650)
    for f in run_dir.iterdir():
        os.utime(f, (OLD, OLD))
    fresh = read_run(run_dir, options=ReadOptions(cache=False))
    _compact_cap(monkeypatch, fresh.frame)
    read_run(run_dir)  # fills
    kinds = _kinds(cache_dir)
    assert kinds["step"] == "ramps" and kinds["value"] == "float32", kinds
    assert kinds["record_idx"] in ("ramps", "deltas"), kinds
    assert {kinds[c] for c in ("tag", "metric")} == {"joint"}, kinds
    from forensics.importers import tfevents

    def boom(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("parsed again")

    monkeypatch.setattr(tfevents.IMPORTER, "read", boom)
    back = read_run(run_dir)
    assert back.frame.schema == fresh.frame.schema
    assert_frame_equal(back.frame, fresh.frame)
    for c in ("value", "wall_time", "step", "record_idx"):
        a, b = fresh.frame.get_column(c).to_numpy(), back.frame.get_column(c).to_numpy()
        assert a.tobytes() == b.tobytes(), c
    assert math.isnan(back.frame.filter(pl.col("step") == 699)["value"][0])


def test_a_compact_entry_with_values_that_are_not_float32_keeps_them_raw(
    tmp_path, cache_dir, monkeypatch
) -> None:
    """JSONL values parsed from decimals are doubles: kept as they are; the entry still
    round-trips."""
    import json

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with (run_dir / "metrics.jsonl").open("w") as fh:
        for s in range(500):
            fh.write(json.dumps({"step": s, "loss": 2.0 - s / 1000, "lr": 3e-4}) + "\n")
    os.utime(run_dir / "metrics.jsonl", (OLD, OLD))
    fresh = read_run(run_dir, options=ReadOptions(cache=False))
    _compact_cap(monkeypatch, fresh.frame)
    read_run(run_dir)
    kinds = _kinds(cache_dir)
    assert kinds["value"] == "raw" and kinds["step"] == "ramps", kinds
    assert_frame_equal(read_run(run_dir).frame, fresh.frame)


def test_a_damaged_compact_entry_is_a_miss(tmp_path, cache_dir, monkeypatch) -> None:
    """The joint codes cut short, or a float32 file of another length: the entry is not used
    and the run is parsed again."""
    run_dir = write_tb_run(tmp_path / "run", n=300)
    for f in run_dir.iterdir():
        os.utime(f, (OLD, OLD))
    fresh = read_run(run_dir, options=ReadOptions(cache=False))
    _compact_cap(monkeypatch, fresh.frame)
    read_run(run_dir)
    (entry,) = [e for e in cache_dir.iterdir() if not e.name.startswith(".")]
    for name in ("codes.npy", "value.npy"):
        f = entry / name
        kept = f.read_bytes()
        f.write_bytes(kept[:-4])
        assert cache.load(entry.name, run_dir) is None, name
        f.write_bytes(kept)
    assert cache.load(entry.name, run_dir) is not None
    assert_frame_equal(read_run(run_dir).frame, fresh.frame)


def test_a_run_too_large_even_compact_is_kept_in_parquet(tmp_path, cache_dir, monkeypatch):
    """Compact arrays over COMPACT_SHARE of the cap: every column in the Parquet file."""
    run_dir = write_tb_run(tmp_path / "run", n=300)
    for f in run_dir.iterdir():
        os.utime(f, (OLD, OLD))
    fresh = read_run(run_dir, options=ReadOptions(cache=False))
    _compact_cap(monkeypatch, fresh.frame)
    monkeypatch.setattr(cache, "COMPACT_SHARE", 1e-9)
    read_run(run_dir)
    (entry,) = [e for e in cache_dir.iterdir() if not e.name.startswith(".")]
    assert not list(entry.glob("*.npy"))
    assert_frame_equal(read_run(run_dir).frame, fresh.frame)


def test_columns_of_too_many_combinations_keep_their_own_codes(tmp_path, cache_dir, monkeypatch):
    """Three tags (three metrics) and a nullable layer cycling through three values apart
    from them: twelve combinations, more than the (lowered) four a code may name, so each
    column keeps codes of its own; a layer of five values and nulls, too many for codes,
    goes to the Parquet file while tag and metric share one code. Both read back
    identical."""
    run_dir = write_tb_run(tmp_path / "run", n=300)
    for f in run_dir.iterdir():
        os.utime(f, (OLD, OLD))
    run = read_run(run_dir, options=ReadOptions(cache=False))
    _compact_cap(monkeypatch, run.frame)
    monkeypatch.setattr(cache, "_MAX_CODES", 4)
    for cycle, want in (
        (3, {"tag": "coded", "metric": "coded", "layer": "coded"}),
        (5, {"tag": "joint", "metric": "joint", "layer": "rest"}),
    ):
        run.frame = run.frame.with_columns(
            pl.when(pl.int_range(pl.len()) % 7 == 0)
            .then(None)
            .otherwise(pl.int_range(pl.len()) % cycle)
            .cast(pl.Int16)
            .alias("layer")
        )
        entry = f"{cycle}" * 40
        cache.store(entry, run, run_dir)
        meta = pickle.loads((cache_dir / entry / "run.pickle").read_bytes())
        kinds = {c: k for c, (k, _) in meta["frame"]["columns"].items()}
        assert {c: kinds[c] for c in want} == want, kinds
        back = cache.load(entry, run_dir)
        assert back is not None
        assert_frame_equal(back.frame, run.frame)
