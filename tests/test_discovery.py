"""What a run is: discovery, job grouping, two sources of the same metrics, and bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest
from conftest import snapshot, write_tb_run

from forensics.errors import (
    ForensicsError,
    MultipleJobsError,
    UnknownFormatError,
    UnreadableInputError,
)
from forensics.importers import discover_jobs, read_run


def _hf_state(path: Path, steps: range) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    hist = [
        {"epoch": s / 100, "learning_rate": 1e-4, "loss": 2.0 - s / 1000, "step": s} for s in steps
    ]
    path.write_text(
        json.dumps({"global_step": steps[-1], "log_history": hist}, indent=2, sort_keys=True)
    )


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert msg and "\n" not in msg
    return msg


def test_nonexistent_and_empty_paths(tmp_path: Path) -> None:
    """A missing path or an empty folder: one-line errors naming it."""
    with pytest.raises(UnreadableInputError) as err:
        read_run(tmp_path / "nope")
    assert "nope" in _one_line(err)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnreadableInputError) as err:
        read_run(tmp_path / "empty")
    assert "empty" in _one_line(err) and "expected" in _one_line(err)


def test_unknown_format_folder_and_binary_junk(tmp_path: Path) -> None:
    """Files no importer knows, or binary junk: UnknownFormatError naming the path and what was
    expected."""
    (tmp_path / "README.md").write_text("# my run\nsome notes\n")
    (tmp_path / "plot.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(500))
    with pytest.raises(UnknownFormatError) as err:
        read_run(tmp_path)
    assert str(tmp_path) in _one_line(err) and "expected TensorBoard" in _one_line(err)
    with pytest.raises(UnknownFormatError) as err:
        read_run(tmp_path / "plot.png")
    assert "binary data" in _one_line(err) and "plot.png" in _one_line(err)


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root reads every file, so permissions cannot be tested"
)
def test_unreadable_file(tmp_path: Path) -> None:
    """A file the user may not read: UnreadableInputError, not a traceback."""
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1, "loss": 1}\n')
    p.chmod(0)
    with pytest.raises(UnreadableInputError):
        read_run(p)


def test_run_without_steps(tmp_path: Path) -> None:
    """An event file with no scalar at all: 'no metric with a step', naming the files."""
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(tmp_path))
    w.add_text("notes", "hello", 0)
    w.close()
    with pytest.raises(UnreadableInputError) as err:
        read_run(tmp_path)
    assert "no metric with a step" in _one_line(err) and "tfevents" in _one_line(err)


def test_hf_output_folder_with_event_files_is_one_job(tmp_path: Path) -> None:
    """trainer_state.json plus runs/<date>/ event files of the same job merge into one run."""
    write_tb_run(tmp_path / "runs" / "Jun29_06-31-19_host", n=50, spike_at=None)
    _hf_state(tmp_path / "trainer_state.json", range(1, 50))
    assert list(discover_jobs(tmp_path)) == ["."]
    run = read_run(tmp_path)
    assert set(run.format.split("+")) == {"tfevents", "hf_trainer_state"}
    assert run.name == tmp_path.name
    assert any("hold the same metrics" in n for n in run.notes)
    assert run.metrics()["loss"] == "train/loss"  # 50 TensorBoard points beat 49 JSON points
    assert run.metrics()["grad_norm"] == "train/grad_norm"


def test_two_event_runs_beside_one_trainer_state_are_not_merged(tmp_path: Path) -> None:
    """Two runs/<date>/ folders under one output folder are two jobs: refuse to guess."""
    write_tb_run(tmp_path / "runs" / "A", n=20, spike_at=None)
    write_tb_run(tmp_path / "runs" / "B", n=20, spike_at=None)
    _hf_state(tmp_path / "trainer_state.json", range(1, 20))
    with pytest.raises(MultipleJobsError) as err:
        read_run(tmp_path)
    assert err.value.jobs == [".", "runs/A", "runs/B"]


def test_trainer_log_beside_trainer_state_uses_the_richer_source(tmp_path: Path) -> None:
    """LLaMA-Factory's two files of one run: the one with more loss points is used, the other
    noted."""
    _hf_state(tmp_path / "trainer_state.json", range(10, 101, 10))
    _hf_state(tmp_path / "checkpoint-50" / "trainer_state.json", range(10, 51, 10))
    lines = [
        {
            "current_steps": s,
            "total_steps": 100,
            "loss": 2.0,
            "learning_rate": 1e-4,
            "epoch": s / 100,
            "elapsed_time": "0:00:10",
        }
        for s in range(5, 101, 5)
    ]
    (tmp_path / "trainer_log.jsonl").write_text("".join(json.dumps(o) + "\n" for o in lines))
    run = read_run(tmp_path)
    assert run.metrics()["loss"] == "loss" and run.series("loss").height == 20
    assert run.frame.filter(pl.col("source") == "hf_trainer_state").is_empty()
    (note,) = [n for n in run.notes if "hold the same metrics" in n]
    assert "trainer_log.jsonl has more points" in note
    assert run.metadata["checkpoints"] == [50]  # still known although no trainer_state row is used


def test_several_log_files_are_several_jobs(tmp_path: Path) -> None:
    """Two JSONL logs side by side (two job ids) are listed, not merged."""
    for job in ("job-101", "job-102"):
        (tmp_path / f"{job}.jsonl").write_text(
            "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(5))
        )
    with pytest.raises(MultipleJobsError) as err:
        read_run(tmp_path)
    assert err.value.jobs == ["job-101.jsonl", "job-102.jsonl"]
    assert "job-101.jsonl" in _one_line(err) and "--all" in _one_line(err)


def test_a_log_file_inside_an_event_run_joins_it(tmp_path: Path) -> None:
    """A metrics file written into a TensorBoard run folder belongs to that job."""
    write_tb_run(tmp_path, n=30, spike_at=None)
    (tmp_path / "extra.jsonl").write_text(
        "".join(json.dumps({"step": s, "eval/hellaswag": 0.3}) + "\n" for s in range(0, 30, 10))
    )
    run = read_run(tmp_path)
    assert run.format == "tfevents+jsonl"
    assert run.series("eval/hellaswag").height == 3


def test_single_file_path(tmp_path: Path) -> None:
    """PATH may be one event file; the run is named after its folder (event file names say
    nothing)."""
    write_tb_run(tmp_path, n=10, spike_at=None)
    f = next(tmp_path.glob("*tfevents*"))
    run = read_run(f)
    assert run.series("loss").height == 10 and run.name == tmp_path.name


def test_nothing_is_written_into_the_run_folder(tmp_path: Path) -> None:
    """Reading every format leaves the run folder byte for byte as it was."""
    write_tb_run(tmp_path / "runs" / "x", n=40)
    _hf_state(tmp_path / "trainer_state.json", range(1, 40))
    (tmp_path / "trainer_log.jsonl").write_text(
        json.dumps({"current_steps": 1, "loss": 2.0}) + "\n"
    )
    before = snapshot(tmp_path)
    read_run(tmp_path)
    assert snapshot(tmp_path) == before


def test_every_error_is_a_forensics_error(tmp_path: Path) -> None:
    """Bad input of every kind surfaces as a ForensicsError subclass (exit code 2 in the CLI)."""
    cases = {
        "junk.bin": os.urandom(2000),
        "events.out.tfevents.1.host": os.urandom(2000),
        "trainer_state.json": b"{",
        # (a JSONL with no number at all: a loss log without steps is read, as points)
        "m.jsonl": b'{"note": "a"}\n{"note": "b"}\n',
    }
    for name, content in cases.items():
        d = tmp_path / name.replace(".", "_")
        d.mkdir()
        (d / name).write_bytes(content)
        with pytest.raises(ForensicsError):
            read_run(d)
