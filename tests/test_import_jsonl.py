"""JSONL importer: step and time keys, loose numbers, bad lines, nesting, LLaMA-Factory, Levanter,
compressed files, restarts and truncation."""

from __future__ import annotations

import gzip
import json
import logging
import math
from pathlib import Path

import polars as pl
import pytest

from forensics.errors import UnknownFormatError, UnreadableInputError
from forensics.findings import FindingKind
from forensics.importers import discover_jobs, read_run


def _write(path: Path, objs: list[dict], extra_lines: dict[int, str] | None = None) -> Path:
    lines = [json.dumps(o) for o in objs]  # json.dumps writes bare NaN / Infinity like real loggers
    for at, text in sorted((extra_lines or {}).items()):
        lines.insert(at, text)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    "record, step",
    [
        ({"step": 5, "global_step": 9, "_step": 1, "loss": 1.0}, 5),
        ({"global_step": 9, "iteration": 3, "loss": 1.0}, 9),
        ({"iteration": 3, "iter": 4, "loss": 1.0}, 3),
        ({"iter": 4, "num_updates": 8, "loss": 1.0}, 4),
        ({"num_updates": "8", "_step": 2, "loss": 1.0}, 8),
        ({"trainer/global_step": 11, "_step": 2, "loss": 1.0}, 11),
        ({"current_steps": 12, "_step": 2, "loss": 1.0}, 12),
        ({"_step": 2, "loss": 1.0}, 2),
        ({"trainer": {"global_step": 13}, "loss": 1.0}, 13),
    ],
)
def test_step_key_order(tmp_path: Path, record: dict, step: int) -> None:
    """The step comes from the first usual key present (step, global_step, iteration, ... _step)."""
    _write(tmp_path / "metrics.jsonl", [record])
    run = read_run(tmp_path / "metrics.jsonl")
    assert run.series("loss").get_column("step").to_list() == [step]
    assert set(run.frame.get_column("tag").to_list()) == {"loss"}  # step keys are not metrics


@pytest.mark.parametrize(
    "record, wall",
    [
        ({"_timestamp": 1700000000.5, "timestamp": 1, "step": 1, "loss": 1}, 1700000000.5),
        ({"timestamp": 1700000001, "step": 1, "loss": 1}, 1700000001.0),
        ({"wall_time": 1700000002.25, "step": 1, "loss": 1}, 1700000002.25),
        ({"timestamp": 1700000003000, "step": 1, "loss": 1}, 1700000003.0),
        ({"timestamp": "2023-11-14T22:13:20+00:00", "step": 1, "loss": 1}, 1700000000.0),
    ],
    ids=["_timestamp", "timestamp", "wall_time", "milliseconds", "iso"],
)
def test_time_keys(tmp_path: Path, record: dict, wall: float) -> None:
    """Wall time from _timestamp / timestamp / wall_time (unix seconds, milliseconds or ISO
    date)."""
    _write(tmp_path / "m.jsonl", [record])
    assert read_run(tmp_path / "m.jsonl").series("loss").get_column("wall_time").to_list() == [wall]


def test_loose_numbers_nan_and_infinity(tmp_path: Path) -> None:
    """Numbers as strings, "nan", bare NaN / Infinity and "1,234" are read; other strings are not
    metrics."""
    p = tmp_path / "m.jsonl"
    p.write_text(
        '{"step": 1, "loss": "1.5e-1", "lr": "3e-4", "gnorm": NaN, "tps": "1,234", "note": '
        '"warmup"}\n'
        '{"step": 2, "loss": "nan", "lr": Infinity, "gnorm": -Infinity, "tps": 1000}\n'
    )
    f = read_run(p).frame
    got = {(r["tag"], r["step"]): r["value"] for r in f.iter_rows(named=True)}
    assert got[("loss", 1)] == 0.15 and got[("lr", 1)] == 3e-4 and got[("tps", 1)] == 1234.0
    assert math.isnan(got[("gnorm", 1)]) and math.isnan(got[("loss", 2)])
    assert got[("lr", 2)] == math.inf and got[("gnorm", 2)] == -math.inf
    assert "note" not in set(f.get_column("tag").to_list())


def test_bad_lines_are_skipped_counted_and_located(tmp_path: Path) -> None:
    """Broken lines never abort the file; their count and line numbers go into the run notes."""
    objs = [{"step": s, "loss": 2.0 - s * 0.01} for s in range(10)]
    p = _write(
        tmp_path / "m.jsonl",
        objs,
        {3: "{not json", 6: "[1, 2, 3]", 8: "Traceback (most recent call last):"},
    )
    run = read_run(p)
    assert run.series("loss").height == 10
    (note,) = [n for n in run.notes if "skipped" in n]
    assert "skipped 3 line(s)" in note and "4, 7, 9" in note


def test_nested_objects_flatten_with_slash(tmp_path: Path) -> None:
    """Nested dicts become slash-joined tags that the alias table understands."""
    p = _write(
        tmp_path / "m.jsonl",
        [{"step": 1, "train": {"loss": 2.0, "grad_norm": 0.5}, "eval": {"hellaswag": 0.3}}],
    )
    run = read_run(p)
    assert set(run.frame.get_column("tag").to_list()) == {
        "train/loss",
        "train/grad_norm",
        "eval/hellaswag",
    }
    assert set(run.metrics()) == {"loss", "grad_norm", "eval/hellaswag"}


def test_llama_factory_trainer_log(tmp_path: Path) -> None:
    """LLaMA-Factory trainer_log.jsonl: current_steps is the step, elapsed_time a relative clock."""
    objs = [
        {
            "current_steps": 5 * i,
            "total_steps": 100,
            "loss": 2.0 - 0.1 * i,
            "eval_loss": None,
            "learning_rate": 1e-4,
            "epoch": 0.05 * i,
            "percentage": 5.0 * i,
            "elapsed_time": f"0:0{i}:00",
            "remaining_time": "1 day, 2:03:04",
        }
        for i in range(1, 6)
    ]
    _write(tmp_path / "trainer_log.jsonl", objs)
    run = read_run(tmp_path)
    loss = run.series("loss")
    assert loss.get_column("step").to_list() == [5, 10, 15, 20, 25]
    assert loss.get_column("wall_time").to_list() == [60.0, 120.0, 180.0, 240.0, 300.0]
    assert "val_loss" not in run.metrics()  # eval_loss: null is no point
    assert run.metrics()["lr"] == "learning_rate"


def test_levanter_json_logger_through_python_logging(tmp_path: Path) -> None:
    """Levanter's json_logger lines (behind a logging prefix) give metrics, hparams and
    histograms."""
    p = tmp_path / "levanter.log"
    handler = logging.FileHandler(p)
    handler.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
    log = logging.getLogger("levanter.json_logger.test")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    log.info(
        json.dumps(
            {
                "tracker": "json_logger",
                "event": "hparams",
                "hparams": {"trainer": {"train_batch_size": 256}},
            }
        )
    )
    for s in range(1, 4):
        metrics = {
            "train/loss": 3.0 / s,
            "optim/learning_rate": 3e-4,
            "grad/norm/total": 10.0 + s,
            "throughput/tokens_per_second": 5e4,
            "grad/hist/layers.0": {
                "min": -1.0,
                "max": 2.0,
                "num": 4,
                "sum": 2.0,
                "sum_squares": 6.0,
                "bucket_limits": [0, 1],
                "bucket_counts": [2, 2],
            },
        }
        log.info(
            json.dumps({"tracker": "json_logger", "event": "log", "step": s, "metrics": metrics})
        )
    log.info(json.dumps({"tracker": "json_logger", "event": "summary", "metrics": {"best": 1.0}}))
    log.info(
        json.dumps({"tracker": "json_logger", "event": "finish", "summary": {"train/loss": 1.0}})
    )
    handler.close()
    log.removeHandler(handler)
    run = read_run(p)
    assert run.series("loss").get_column("value").to_list() == [3.0, 1.5, 1.0]
    assert run.metrics()["grad_norm"] == "grad/norm/total"
    assert any("sum of per-parameter L2 norms" in n for n in run.notes)
    assert run.config["trainer/train_batch_size"] == 256
    mean = (
        run.frame.filter(pl.col("tag") == "grad/hist/layers.0/mean").get_column("value").to_list()
    )
    assert mean == [0.5, 0.5, 0.5]
    assert run.series("throughput").height == 3


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_compressed_logs(tmp_path: Path, suffix: str) -> None:
    """.gz and .zst logs are read transparently."""
    text = "".join(
        json.dumps({"step": s, "loss": 1.0 / (s + 1)}) + "\n" for s in range(50)
    ).encode()
    p = tmp_path / f"metrics.jsonl{suffix}"
    if suffix == ".gz":
        p.write_bytes(gzip.compress(text))
    else:
        import zstandard

        p.write_bytes(zstandard.ZstdCompressor().compress(text))
    assert read_run(p).series("loss").height == 50


def test_corrupt_gzip_is_a_one_line_error(tmp_path: Path) -> None:
    """A .gz that is not gzip data: UnreadableInputError naming the file."""
    good = gzip.compress(b'{"step": 1, "loss": 1}\n{"step": 2, "loss": 1}\n')
    p = tmp_path / "metrics.jsonl.gz"
    p.write_bytes(good[:10] + b"\xff" * 40)
    with pytest.raises((UnreadableInputError, UnknownFormatError)) as err:
        read_run(p)
    assert "\n" not in str(err.value) and "metrics.jsonl.gz" in str(err.value)


def test_steps_going_back_are_a_restart(tmp_path: Path) -> None:
    """A resumed job appending to the same file (steps 0..29, then 20..39): two segments, one
    restart."""
    objs = [{"step": s, "loss": 1.0, "_timestamp": 1000 + s} for s in range(30)]
    objs += [{"step": s, "loss": 2.0, "_timestamp": 5000 + s} for s in range(20, 40)]
    run = read_run(_write(tmp_path / "m.jsonl", objs))
    (f,) = run.import_findings
    assert f.kind == FindingKind.RESTART
    assert (
        f.measures["resumed_from_step"],
        f.measures["last_step_before"],
        f.measures["steps_replayed"],
    ) == (20, 29, 10)
    assert f.measures["wall_clock_gap_s"] == (5000 + 20) - (1000 + 29)
    assert run.series("loss").filter(pl.col("step") >= 20).get_column(
        "value"
    ).unique().to_list() == [2.0]


def test_two_restarts_two_findings(tmp_path: Path) -> None:
    """Two resumptions: segments 0/1/2, one finding each, and the view keeps the latest value per
    step."""
    objs = [{"step": s, "loss": 1.0} for s in range(100)]
    objs += [{"step": s, "loss": 2.0} for s in range(60, 150)]
    objs += [{"step": s, "loss": 3.0} for s in range(120, 200)]
    run = read_run(_write(tmp_path / "m.jsonl", objs))
    got = [
        (f.measures["resumed_from_step"], f.measures["last_step_before"], f.measures["segment"])
        for f in run.import_findings
    ]
    assert got == [(60, 99, 1), (120, 149, 2)]
    counts = dict(run.series("loss").group_by("value").len().iter_rows())
    assert counts == {1.0: 60, 2.0: 60, 3.0: 80}


def test_cut_off_last_line_is_truncation(tmp_path: Path) -> None:
    """A last line cut mid-object (killed job): every full line read, plus truncated_log."""
    p = tmp_path / "m.jsonl"
    p.write_text(
        "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(5)) + '{"step": 5, "lo'
    )
    run = read_run(p)
    assert run.series("loss").height == 5
    assert [f.kind for f in run.import_findings] == [FindingKind.TRUNCATED_LOG]


def test_no_step_anywhere_numbers_the_lines_as_points(tmp_path: Path) -> None:
    """Objects without any step key (a quick script's {"loss": 2.31} per line): the lines
    numbered in the order written, as points, and said so (x_unit "point", a note); not
    steps. (It had been a one-line error: no run at all for a plain loss log.)"""
    p = _write(tmp_path / "m.jsonl", [{"loss": 1.0}, {"note": "x"}, {"loss": 0.9}])
    run = read_run(p)
    assert run.x_unit == "point"
    loss = run.series("loss")
    assert loss.get_column("step").to_list() == [1, 2]  # (the line without a number is none)
    assert loss.get_column("value").to_list() == [1.0, 0.9]
    assert any("no line names a step" in n and "as points" in n for n in run.notes)


def test_pretty_printed_json_is_not_jsonl(tmp_path: Path) -> None:
    """A pretty-printed .json document (all_results.json) is not claimed as a JSONL log."""
    (tmp_path / "all_results.json").write_text(
        json.dumps({"epoch": 3.0, "train_loss": 1.2}, indent=2)
    )
    with pytest.raises(UnknownFormatError):
        discover_jobs(tmp_path)


def test_bad_line_numbers_are_written_with_digits_grouped(tmp_path: Path) -> None:
    """A broken line far into the file is named as the report writes numbers (line 1,502)."""
    objs = [{"step": s, "loss": 2.0 - s * 1e-4} for s in range(1600)]
    p = _write(tmp_path / "m.jsonl", objs, {1501: "{not json"})
    (note,) = [n for n in read_run(p).notes if "skipped" in n]
    assert "skipped 1 line(s) that are not JSON objects (line 1,502)" in note
