"""TensorBoard importer: real event files from tensorboardX / torch SummaryWriter, checked
against tbparse (the reference reader) value for value, plus framing, restarts and errors."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from forensics.errors import ConfigError, MultipleJobsError, UnreadableInputError
from forensics.findings import FindingKind
from forensics.importers import ReadOptions, discover_jobs, read_run
from forensics.importers.tfevents_proto import decode_records
from forensics.importers.tfevents_scan import walk

pytest.importorskip("tensorboardX")


def _tbx(
    logdir: Path,
    series: dict[str, list[tuple[int, float]]],
    suffix: str = "",
    purge_step: int | None = None,
) -> Path:
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(logdir), filename_suffix=suffix, purge_step=purge_step)
    rows = sorted((s, t, v) for t, pts in series.items() for s, v in pts)
    for s, t, v in rows:
        w.add_scalar(t, v, s)
    w.close()
    return logdir


def _tbparse_long(logdir: Path, kind: str = "scalars") -> pl.DataFrame:
    from tbparse import SummaryReader

    df = getattr(SummaryReader(str(logdir), extra_columns={"dir_name"}), kind)
    scalar = np.asarray(
        [np.ndim(v) == 0 for v in df["value"]], dtype=bool
    )  # .tensors also holds histograms
    return pl.DataFrame(
        {
            "dir": df["dir_name"].to_numpy().astype(str)[scalar],
            "tag": df["tag"].to_numpy().astype(str)[scalar],
            "step": df["step"].to_numpy().astype(np.int64)[scalar],
            "value": np.asarray(
                [float(v) for v, ok in zip(df["value"], scalar, strict=True) if ok],
                dtype=np.float64,
            ),
        }
    )


def _ours(run) -> pl.DataFrame:  # noqa: ANN001
    return run.frame.select(pl.col("tag").cast(pl.Utf8), "step", "value")


def test_tensorboardx_scalars_match_tbparse(tmp_path: Path) -> None:
    """Old-style simple_value scalars (incl. NaN, inf, step 0, big steps) equal tbparse's values."""
    rng = np.random.default_rng(0)
    steps = [0, 1, 2, 127, 128, 16383, 16384, 2_000_000, 3_000_000_000]
    series = {
        "train/loss": [(s, float(rng.normal())) for s in steps],
        "train/grad_norm": [(s, float(abs(rng.normal()))) for s in steps],
        "a_tag_that_is_rather_long/" + "x" * 60: [(s, 1.0 / (s + 1)) for s in steps],
        "odd": [(1, float("nan")), (2, float("inf")), (3, -float("inf")), (4, 0.0)],
    }
    _tbx(tmp_path, series)
    ours = _ours(read_run(tmp_path)).sort("tag", "step")
    ref = _tbparse_long(tmp_path).select("tag", "step", "value").sort("tag", "step")
    assert ours.height == ref.height == sum(len(v) for v in series.values())
    assert ours.select("tag", "step").equals(ref.select("tag", "step"))
    a, b = ours.get_column("value").to_numpy(), ref.get_column("value").to_numpy()
    assert np.array_equal(a, b, equal_nan=True)
    from tbparse import SummaryReader

    wt = SummaryReader(str(tmp_path), extra_columns={"wall_time"}).scalars.sort_values(
        ["tag", "step"]
    )
    ours_wt = read_run(tmp_path).frame.sort("tag", "step").get_column("wall_time").to_numpy()
    assert np.array_equal(ours_wt, wt["wall_time"].to_numpy().astype(np.float64))


def test_torch_new_style_and_double_scalars_match_tbparse_tensors(tmp_path: Path) -> None:
    """torch new_style float/double scalars (plugin 'scalars', float_val/double_val) equal tbparse
    .tensors."""
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tmp_path))
    for s in range(0, 300, 7):
        w.add_scalar("old", s * 0.5, s)
        w.add_scalar("new_f", 1.0 / (s + 1), s, new_style=True)
        w.add_scalar("new_d", math.pi * s, s, new_style=True, double_precision=True)
    w.close()
    ours = _ours(read_run(tmp_path))
    ref = pl.concat(
        [_tbparse_long(tmp_path, "scalars"), _tbparse_long(tmp_path, "tensors")]
    ).select("tag", "step", "value")
    assert ours.height == ref.height == 3 * len(range(0, 300, 7))
    joined = ours.join(ref, on=["tag", "step"], suffix="_ref")
    assert joined.height == ours.height
    assert (joined.get_column("value") == joined.get_column("value_ref")).all()
    # double precision survives: not rounded to float32
    d = ours.filter(pl.col("tag") == "new_d").sort("step").get_column("value").to_list()
    assert d[1] == math.pi * 7


def _event_file_writer(logdir: Path):  # noqa: ANN202
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    return EventFileWriter(str(logdir))


def _tf2_value(tag: str, plugin: str, first: bool, **tensor):  # noqa: ANN003, ANN202
    from tensorboard.compat.proto import summary_pb2, tensor_pb2

    meta = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin)
    )
    return summary_pb2.Summary.Value(
        tag=tag, tensor=tensor_pb2.TensorProto(**tensor), metadata=meta if first else None
    )


def _write_events(logdir: Path, values_per_step: list[list]) -> None:  # noqa: ANN001
    from tensorboard.compat.proto import event_pb2, summary_pb2

    w = _event_file_writer(logdir)
    for s, values in enumerate(values_per_step):
        w.add_event(
            event_pb2.Event(step=s, wall_time=1.7e9 + s, summary=summary_pb2.Summary(value=values))
        )
    w.close()


def test_tf2_style_tensor_content_scalars_and_histograms(tmp_path: Path) -> None:
    """TF2-style records (tensor_content, metadata only on a tag's first value, [k,3] histograms)
    match tbparse."""
    from tensorboard.compat.proto import tensor_shape_pb2

    hist = np.array([[0.0, 1.0, 2.0], [1.0, 3.0, 6.0]])  # 2 values around 0.5, 6 around 2.0
    dim = tensor_shape_pb2.TensorShapeProto.Dim
    shape = tensor_shape_pb2.TensorShapeProto(dim=[dim(size=2), dim(size=3)])
    _write_events(
        tmp_path,
        [
            [
                _tf2_value(
                    "epoch_loss",
                    "scalars",
                    s == 0,
                    dtype=1,
                    tensor_content=struct.pack("<f", 0.25 * s),
                ),
                _tf2_value(
                    "act/layers.2",
                    "histograms",
                    s == 0,
                    dtype=2,
                    tensor_content=hist.astype("<f8").tobytes(),
                    tensor_shape=shape,
                ),
            ]
            for s in range(5)
        ],
    )
    run = read_run(tmp_path)
    loss = run.series("loss")
    assert loss.get_column("value").to_list() == [0.0, 0.25, 0.5, 0.75, 1.0]
    ref = _tbparse_long(tmp_path, "tensors").filter(pl.col("tag") == "epoch_loss").sort("step")
    assert ref.get_column("value").to_list() == loss.get_column("value").to_list()
    mean = run.frame.filter(pl.col("tag") == "act/layers.2/mean").get_column("value")[0]
    assert mean == pytest.approx((2 * 0.5 + 6 * 2.0) / 8)
    assert run.series("act_mean", layer=2).height == 5
    assert run.frame.filter(pl.col("tag") == "act/layers.2/min").get_column("value")[0] == 0.0
    assert run.frame.filter(pl.col("tag") == "act/layers.2/max").get_column("value")[0] == 3.0


@pytest.mark.parametrize(
    "tensor, expected",
    [
        ({"dtype": 9, "int64_val": [7]}, 7.0),
        ({"dtype": 3, "int_val": [-3]}, -3.0),
        ({"dtype": 2, "double_val": [0.1]}, 0.1),
        ({"dtype": 19, "half_val": [int(np.array(1.5, dtype=np.float16).view(np.uint16))]}, 1.5),
        (
            {
                "dtype": 14,
                "tensor_content": (np.array([2.5], dtype=np.float32).view(np.uint32) >> 16)
                .astype("<u2")
                .tobytes(),
            },
            2.5,
        ),
        ({"dtype": 2, "tensor_content": struct.pack("<d", 1e-300)}, 1e-300),
    ],
    ids=["int64_val", "int_val", "double_val", "half_val", "bfloat16_content", "double_content"],
)
def test_new_style_scalar_encodings(tmp_path: Path, tensor: dict, expected: float) -> None:
    """Every TensorProto encoding of a scalar decodes to the logged number."""
    _write_events(tmp_path, [[_tf2_value("lr", "scalars", True, **tensor)]])
    assert read_run(tmp_path).series("lr").get_column("value").to_list() == [expected]


def test_histograms_reduce_to_exact_stats(tmp_path: Path) -> None:
    """TF1 histograms become <tag>/min,max,mean,std,absmax,norm with the data's exact moments."""
    from torch.utils.tensorboard import SummaryWriter

    data = np.array([-3.0, 1.0, 2.0, 4.0, 0.5])
    w = SummaryWriter(str(tmp_path))
    w.add_histogram("gradients/model.layers.4.mlp", data, 10)
    w.add_scalar("loss", 1.0, 10)
    w.close()
    f = read_run(tmp_path).frame
    got = dict(
        f.filter(pl.col("tag").cast(pl.Utf8).str.starts_with("gradients/"))
        .select("tag", "value")
        .iter_rows()
    )
    p = "gradients/model.layers.4.mlp/"
    assert got[p + "min"] == -3.0 and got[p + "max"] == 4.0 and got[p + "absmax"] == 4.0
    assert got[p + "mean"] == pytest.approx(data.mean())
    assert got[p + "std"] == pytest.approx(data.std())
    assert got[p + "norm"] == pytest.approx(np.linalg.norm(data))
    norm_row = f.filter(pl.col("tag") == p + "norm")
    assert (
        norm_row.get_column("metric")[0] == "grad_norm_layer"
        and norm_row.get_column("layer")[0] == 4
    )
    assert f.filter(pl.col("tag") == p + "mean").get_column("metric")[0] is None


def test_fast_path_equals_protobuf_decoding(tmp_path: Path) -> None:
    """The numpy fast path gives the same rows as decoding every record with protobuf."""
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tmp_path))
    for s in range(0, 5000, 3):
        w.add_scalar("loss", math.sin(s), s)
        w.add_scalar("lr", 1e-4 * s, s, new_style=True)
    w.close()
    run = read_run(tmp_path)
    path = next(tmp_path.glob("*tfevents*"))
    buf = path.read_bytes()
    fr = walk(buf, 1 << 30)
    proto = decode_records(buf, fr.offs + 12, fr.offs + 12 + fr.lens, np.arange(len(fr.offs)), {})
    ref = pl.DataFrame(
        {
            "record_idx": proto.rec,
            "tag": proto.tag,
            "step": proto.step,
            "value": proto.value,
            "wall_time": proto.wall_time,
        }
    )
    ours = run.frame.select("record_idx", "tag", "step", "value", "wall_time").sort("record_idx")
    assert ours.equals(ref.sort("record_idx"))


def test_sub_runs_train_validation_and_add_scalars(tmp_path: Path) -> None:
    """train/ and validation/ sub-runs form one job; add_scalars folders become <main>/<key>
    tags."""
    from tensorboardX import SummaryWriter

    job = tmp_path / "logs"
    for split, base in (("train", 2.0), ("validation", 2.5)):
        w = SummaryWriter(str(job / split))
        for e in range(4):
            w.add_scalar("epoch_loss", base - 0.1 * e, e)
        w.close()
    run = read_run(job)
    assert run.series("loss").get_column("value").to_list() == pytest.approx([2.0, 1.9, 1.8, 1.7])
    assert run.series("val_loss").get_column("value").to_list() == pytest.approx(
        [2.5, 2.4, 2.3, 2.2]
    )
    assert run.metrics()["val_loss"] == "validation/epoch_loss"
    assert not run.import_findings  # two sub-runs are not a restart

    scal = tmp_path / "scal"
    w = SummaryWriter(str(scal))
    for s in range(3):
        w.add_scalars("loss", {"train": 1.0 + s, "val": 2.0 + s}, s)
    w.close()
    tags = set(read_run(scal).frame.get_column("tag").to_list())
    assert tags == {"loss/train", "loss/val"}
    assert read_run(scal).series("val_loss").height == 3


def test_new_file_that_continues_is_not_a_restart(tmp_path: Path) -> None:
    """Several event files whose steps simply continue: one segment, no restart finding."""
    _tbx(tmp_path, {"loss": [(s, 1.0) for s in range(0, 50)]}, suffix=".a")
    _tbx(tmp_path, {"loss": [(s, 2.0) for s in range(50, 100)]}, suffix=".b")
    run = read_run(tmp_path)
    assert run.frame.get_column("segment").unique().to_list() == [0]
    assert run.import_findings == []
    assert run.frame.get_column("file_idx").unique().sort().to_list() == [0, 1]


def test_restart_segments_view_and_finding(tmp_path: Path) -> None:
    """A resumed job replaying steps 50..99: segment 1, later values win, restart finding with
    measures."""
    _tbx(
        tmp_path,
        {"loss": [(s, 1.0) for s in range(100)], "lr": [(s, 0.1) for s in range(100)]},
        suffix=".a",
    )
    _tbx(
        tmp_path,
        {"loss": [(s, 2.0) for s in range(50, 150)], "lr": [(s, 0.2) for s in range(50, 150)]},
        suffix=".b",
    )
    run = read_run(tmp_path)
    assert run.frame.height == 400  # every row kept
    seg = run.frame.group_by("segment").len().sort("segment").rows()
    assert seg == [(0, 200), (1, 200)]
    loss = run.series("loss")
    assert loss.height == 150
    assert loss.filter(pl.col("step") < 50).get_column("value").unique().to_list() == [1.0]
    assert loss.filter(pl.col("step") >= 50).get_column("value").unique().to_list() == [2.0]
    (f,) = run.import_findings
    assert f.kind == FindingKind.RESTART and f.metric is None and f.start_step == 50
    m = f.measures
    assert m["resumed_from_step"] == 50 and m["last_step_before"] == 99
    assert m["steps_replayed"] == 50 and m["points_replayed"] == 100
    assert m["wall_clock_gap_s"] is not None and m["wall_clock_gap_s"] >= 0


def test_purge_step_session_start_is_a_restart(tmp_path: Path) -> None:
    """tensorboardX purge_step writes SessionLog.START: a restart even before any step goes back."""
    _tbx(tmp_path, {"loss": [(s, 1.0) for s in range(0, 100, 10)]}, suffix=".a")
    # The resumed job logs a new tag first, then loss from 60 on: the START at 60 marks the cut.
    _tbx(tmp_path, {"loss": [(s, 2.0) for s in range(60, 200, 10)]}, suffix=".b", purge_step=60)
    run = read_run(tmp_path)
    (f,) = run.import_findings
    assert f.measures["resumed_from_step"] == 60 and f.measures["last_step_before"] == 90
    assert run.series("loss").filter(pl.col("step") == 60).get_column("value").to_list() == [2.0]


def test_truncated_last_record_reads_the_rest(tmp_path: Path) -> None:
    """A file cut mid-record (killed job): every complete record plus a truncated_log info
    finding."""
    _tbx(tmp_path, {"loss": [(s, float(s)) for s in range(20)]})
    path = next(tmp_path.glob("*tfevents*"))
    data = path.read_bytes()
    path.write_bytes(data[:-7])
    run = read_run(tmp_path)
    assert run.series("loss").height == 19
    (f,) = run.import_findings
    assert f.kind == FindingKind.TRUNCATED_LOG and f.start_step == 18
    assert f.measures["bytes_lost"] > 0


def test_zero_filled_tail_is_truncation(tmp_path: Path) -> None:
    """Zeros after valid records (a crash on some file systems) read as a truncated log."""
    _tbx(tmp_path, {"loss": [(s, 1.0) for s in range(10)]})
    path = next(tmp_path.glob("*tfevents*"))
    path.write_bytes(path.read_bytes() + b"\0" * 4096)
    run = read_run(tmp_path)
    assert run.series("loss").height == 10
    assert run.import_findings[0].measures["zero_filled"] is True


@pytest.mark.parametrize(
    "content, words",
    [
        (b"\0" * 100_000, "zero"),
        (
            bytes(np.random.default_rng(1).integers(0, 256, 50_000, dtype=np.uint8)),
            "not a TensorBoard event file",
        ),
        (b"hello world, this is a text file\n" * 10, "not a TensorBoard event file"),
    ],
    ids=["zero-filled", "random-bytes", "text"],
)
def test_bad_event_files_fail_fast_with_one_line(
    tmp_path: Path, content: bytes, words: str
) -> None:
    """Zero-filled, random or text content under an event-file name: one-line UnreadableInputError
    naming the file."""
    bad = tmp_path / "events.out.tfevents.1700000000.host"
    bad.write_bytes(content)
    with pytest.raises(UnreadableInputError) as err:
        read_run(tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and bad.name in msg and words in msg


def test_corrupt_length_in_the_middle_is_an_error(tmp_path: Path) -> None:
    """A damaged length field after good records fails the length CRC: error, not garbage rows."""
    _tbx(tmp_path, {"loss": [(s, 1.0) for s in range(50)]})
    path = next(tmp_path.glob("*tfevents*"))
    data = bytearray(path.read_bytes())
    fr = walk(bytes(data), 1 << 30)
    data[int(fr.offs[20])] ^= 0x01  # one bit of record 20's length
    path.write_bytes(bytes(data))
    with pytest.raises(UnreadableInputError, match="corrupt TensorBoard record framing"):
        read_run(tmp_path)


def test_verify_crc_skips_a_damaged_record(tmp_path: Path) -> None:
    """With verify_crc a record whose data CRC fails is skipped and noted; without it, it is
    read."""
    pytest.importorskip("crc32c")
    _tbx(tmp_path, {"loss": [(s, 1.0) for s in range(30)]})
    path = next(tmp_path.glob("*tfevents*"))
    data = bytearray(path.read_bytes())
    fr = walk(bytes(data), 1 << 30)
    end = int(fr.offs[10] + 12 + fr.lens[10])
    data[end - 1] ^= 0x40  # last byte of record 10's float
    path.write_bytes(bytes(data))
    assert read_run(tmp_path).series("loss").height == 30
    run = read_run(tmp_path, options=ReadOptions(verify_crc=True))
    assert run.series("loss").height == 29
    assert any("failed the CRC check" in n for n in run.notes)


def test_verify_crc_without_crc32c_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--verify-crc without the crc32c package: a ConfigError that says what to install."""
    import builtins

    real_import = builtins.__import__

    def no_crc(name: str, *a, **k):  # noqa: ANN002, ANN003, ANN202
        if name == "crc32c":
            raise ImportError("no crc32c")
        return real_import(name, *a, **k)

    _tbx(tmp_path, {"loss": [(0, 1.0)]})
    monkeypatch.setattr(builtins, "__import__", no_crc)
    with pytest.raises(ConfigError, match="crc32c"):
        read_run(tmp_path, options=ReadOptions(verify_crc=True))


def test_two_separate_runs_are_multiple_jobs(tmp_path: Path) -> None:
    """Two unrelated event-file runs under one folder: MultipleJobsError listing both."""
    _tbx(tmp_path / "runA", {"loss": [(0, 1.0)]})
    _tbx(tmp_path / "runB", {"loss": [(0, 1.0)]})
    with pytest.raises(MultipleJobsError) as err:
        read_run(tmp_path)
    assert err.value.jobs == ["runA", "runB"]
    assert set(discover_jobs(tmp_path)) == {"runA", "runB"}


def test_samples_indexed_tags_are_recorded_and_converted(tmp_path: Path) -> None:
    """Megatron 'lm loss vs samples' is x_kind samples; converted with a batch size, else noted."""
    _tbx(tmp_path, {"lm loss vs samples": [(s * 64, 3.0) for s in range(1, 11)]})
    run = read_run(tmp_path)
    assert run.frame.get_column("x_kind").unique().to_list() == ["samples"]
    assert any("logged points" in n for n in run.notes)
    assert run.series("loss").get_column("step").to_list()[:2] == [64, 128]
    conv = read_run(tmp_path, options=ReadOptions(batch_size=64))
    assert conv.series("loss").get_column("step").to_list() == list(range(1, 11))
    assert any("converted to steps with batch size 64" in n for n in conv.notes)


def _mixed_run(logdir: Path) -> Path:
    """A real tensorboardX file with scalars (steps from 0 to past 2**21, so the step's varint
    grows), tags of many lengths, histograms (records far longer than a small block) and a
    restart by purge_step."""
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(0)
    w = SummaryWriter(str(logdir), filename_suffix=".a")
    for s in [*range(300), 20_000, 20_001, 3_000_000]:
        w.add_scalar("loss", 2.0 - s * 1e-6, s)
        w.add_scalar("x" * (s % 30 + 1), float(s), s)  # 30 tags of lengths 1..30
        if s % 40 == 0:
            w.add_histogram("grad/layers.1.weight", rng.normal(size=5000), s, bins="auto")
    w.close()
    w = SummaryWriter(str(logdir), purge_step=250, filename_suffix=".b")
    for s in range(250, 320):
        w.add_scalar("loss", 1.0, s)
    w.close()
    return logdir


@pytest.mark.parametrize("chunk", [97, 4096])
def test_block_by_block_read_equals_one_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Files are framed and decoded a block at a time (records cut by a block's end start
    the next one, a record longer than a block gets a longer one): the frame, notes and
    findings equal those of one block holding the whole file."""
    from forensics.importers import tfevents_file

    run_dir = _mixed_run(tmp_path / "run")
    whole = read_run(run_dir, options=ReadOptions(cache=False))
    monkeypatch.setattr(tfevents_file, "CHUNK", chunk)
    blocks = read_run(run_dir, options=ReadOptions(cache=False))
    assert blocks.frame.equals(whole.frame) and blocks.frame.height > 600
    assert blocks.notes == whole.notes
    assert [f.measures for f in blocks.import_findings] == [
        f.measures for f in whole.import_findings
    ]
    assert blocks.frame.get_column("segment").max() == 1  # the purge is a restart


def test_a_tag_hash_collision_never_merges_tags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tags are looked up by a hash of their bytes, then checked byte for byte: with a hash
    that sends every tag of a word count to one key, the tags stay apart (resolved from the
    bytes) and the frame is the one the real hash gives."""
    from forensics.importers import tfevents_scan

    run_dir = _mixed_run(tmp_path / "run")
    ref = read_run(run_dir, options=ReadOptions(cache=False))
    monkeypatch.setattr(tfevents_scan, "_MIX", np.uint64(0))
    monkeypatch.setattr(tfevents_scan, "_LEN_MIX", np.uint64(0))
    got = read_run(run_dir, options=ReadOptions(cache=False))
    assert got.frame.equals(ref.frame)
    assert got.frame.get_column("tag").n_unique() == 31 + 6  # loss, 30 x-tags, 6 hist stats


def test_truncation_note_groups_the_record_count() -> None:
    """The truncated_log sample's note counts its complete records as every other count is
    written (5,374, not 5374)."""
    run = read_run(Path(__file__).resolve().parents[1] / "sample_runs" / "truncated_log")
    (f,) = [g for g in run.import_findings if g.kind == FindingKind.TRUNCATED_LOG]
    assert "the 5,374 complete records before it were read" in f.summary, f.summary
