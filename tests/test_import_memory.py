"""The import's memory work (issue 17): ``add_canonical`` gives every row the metric and layer
its tag canonicalises to, as a row-by-row mapping would, whichever way a column is built (a
per-row gather, or a constant when every tag gives one value); ``finish_source`` leaves the
result's frame canonical."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from forensics.importers import ReadOptions, Source, finish_source
from forensics.importers.base import ImportResult
from forensics.schema import SCHEMA, add_canonical, canonicalize, conform


def _plain(frame: pl.DataFrame, source: str | None, aliases: dict[str, str]) -> pl.DataFrame:
    """Metric and layer by a lookup per row (the plain computation)."""
    extra = tuple(sorted(aliases.items()))
    tags = frame.get_column("tag").cast(pl.Utf8).to_list()
    pairs = [canonicalize(t, source, extra) if t is not None else (None, None) for t in tags]
    return conform(frame).with_columns(
        pl.Series("metric", [m for m, _ in pairs], dtype=SCHEMA["metric"]),
        pl.Series("layer", [n for _, n in pairs], dtype=SCHEMA["layer"]),
    )


def _frame(tags: list[str | None], n: int, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(tags), n)
    return conform(
        pl.DataFrame(
            {
                "tag": pl.Series([tags[i] for i in pick], dtype=pl.Utf8),
                "step": np.arange(n, dtype=np.int64),
                "value": rng.standard_normal(n),
            }
        )
    )


_LAYERED = [
    "train/loss",
    "train/lr",
    "train/grad_norm",
    "grad_norm/layers.0",
    "grad_norm/layers.11",
    "param_norm/layers.3",
    "act_absmax/layers.7",
    "val/loss",
    "my_custom_thing",
]


@pytest.mark.parametrize(
    "tags",
    [
        _LAYERED,
        [*_LAYERED, None],  # rows without a tag
        ["train/loss", "train/lr", "samples_seen"],  # no per-layer tag: layer a constant null
        ["train/loss", None],  # one metric beside null tags: not a constant
        ["train/loss"],  # one tag: both columns constants
        ["my_custom_thing", "other_unmapped"],  # no vital sign at all
        [None],  # no tag at all
    ],
)
@pytest.mark.parametrize("n", [0, 1, 3000])
def test_add_canonical_as_a_lookup_per_row(tags: list[str | None], n: int) -> None:
    frame = _frame(tags, n, seed=len(tags) + n)
    aliases = {"my_custom_thing": "throughput"}
    got = add_canonical(frame, "tfevents", aliases)
    want = _plain(frame, "tfevents", aliases)
    assert got.schema == want.schema == pl.Schema(SCHEMA)
    assert got.height == n
    assert got.select(pl.all().cast(pl.Utf8)).equals(want.select(pl.all().cast(pl.Utf8)))
    # The rows are those a string comparison finds (categoricals compared with literals).
    for m in ("loss", "grad_norm_layer"):
        assert got.filter(pl.col("metric") == m).height == want.filter(pl.col("metric") == m).height


def test_add_canonical_of_a_string_tag_column() -> None:
    frame = pl.DataFrame(
        {"tag": ["train/loss", "grad_norm/layers.2", None], "value": [1.0, 2.0, 3.0]}
    )
    got = add_canonical(conform(frame.with_columns(pl.col("tag").cast(pl.Utf8))), "jsonl")
    assert got.select("metric", "layer").rows() == [
        ("loss", None),
        ("grad_norm_layer", 2),
        (None, None),
    ]


def test_finish_source_gives_the_canonical_frame(tmp_path: Path) -> None:
    frame = pl.DataFrame(
        {
            "source": ["jsonl"] * 4,
            "file": ["m.jsonl"] * 4,
            "file_idx": np.zeros(4, dtype=np.int64),
            "record_idx": np.arange(4, dtype=np.int64),
            "step": [1, 2, 3, 4],
            "x_kind": ["step"] * 4,
            "tag": ["loss", "lr", "grad_norm/layers.1", "loss"],
            "value": [1.0, 0.1, 2.0, 0.9],
            "segment": np.zeros(4, dtype=np.int64),
        }
    )
    res = ImportResult(frame=frame)
    src = Source("jsonl", [tmp_path / "m.jsonl"], ".", tmp_path)
    out, notes = finish_source(src, res, ReadOptions())
    assert out is res and notes == []
    assert out.frame.schema == pl.Schema(SCHEMA)
    assert out.frame.select("tag", "metric", "layer").rows() == [
        ("loss", "loss", None),
        ("lr", "lr", None),
        ("grad_norm/layers.1", "grad_norm_layer", 1),
        ("loss", "loss", None),
    ]
    assert out.frame.get_column("record_idx").to_list() == [0, 1, 2, 3]


@pytest.mark.parametrize("chunk", [97, 1 << 22])
def test_tfevents_record_numbers_in_32_bits_as_in_64(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """An event file too small for 2^31 records keeps its record numbers in 32 bits from the
    start (and its columns shrunk to the rows read): the run equals the 64-bit read's, with
    protobuf's rows (histograms, a purge) put in among the fast ones, in blocks or whole."""
    pytest.importorskip("tensorboardX")
    from forensics.importers import read_run, tfevents_file
    from tests.test_import_tfevents import _mixed_run

    run_dir = _mixed_run(tmp_path / "run")
    monkeypatch.setattr(tfevents_file, "CHUNK", chunk)
    narrow = read_run(run_dir, options=ReadOptions(cache=False))
    monkeypatch.setattr(tfevents_file, "REC32_BYTES", 0)  # every file read with 64 bits
    wide = read_run(run_dir, options=ReadOptions(cache=False))
    assert narrow.frame.height > 600
    assert narrow.frame.equals(wide.frame)
    assert narrow.notes == wide.notes
    assert [f.measures for f in narrow.import_findings] == [
        f.measures for f in wide.import_findings
    ]
