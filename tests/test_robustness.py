"""Bad input found in review: each gets a counted skip or a one-line error, never a hang or a
traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import write_tb_run
from typer.testing import CliRunner

from forensics.cli import app
from forensics.importers import read_run

runner = CliRunner()


def _jsonl(path: Path, n: int = 300, extra: list[str] = ()) -> Path:
    lines = [json.dumps({"step": i, "loss": 3.0 - i * 0.001}) for i in range(n)] + list(extra)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(autouse=True)
def _cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")


def test_a_named_pipe_in_the_run_folder_does_not_hang(tmp_path: Path) -> None:
    """A FIFO beside the logs is not a file to read: it is passed over instead of blocking."""
    run = tmp_path / "run"
    run.mkdir()
    _jsonl(run / "m.jsonl")
    os.mkfifo(run / "pipe.log")
    assert read_run(run).series("loss").height == 300


@pytest.mark.parametrize(
    "bad",
    [
        '{"step": 1e20, "loss": 1.0}',
        '{"step": 99999999999999999999, "loss": 1.0}',
        '{"step": 301, "loss": 1' + "0" * 400 + "}",
        "{" * 0 + '{"a":' * 5000 + "1" + "}" * 5000,
    ],
    ids=["step-1e20", "step-beyond-int64", "value-beyond-float", "nested-5000"],
)
def test_absurd_jsonl_lines_are_skipped_and_counted(tmp_path: Path, bad: str) -> None:
    """One absurd line among good ones: the file imports; the line is skipped and counted, or its
    value becomes inf."""
    path = _jsonl(tmp_path / "m.jsonl", extra=[bad])
    res = runner.invoke(app, ["analyze", str(path), "--no-report", "--format", "json"])
    assert res.exit_code == 0, res.output
    run = read_run(path)
    assert run.series("loss").height >= 300
    if "value-beyond-float" not in bad and "0" * 400 not in bad:
        assert any("line" in n and "301" in n for n in run.notes), run.notes


def test_a_half_written_checkpoint_copy_is_skipped(tmp_path: Path) -> None:
    """checkpoint-1000's state cut in half by a killed job: checkpoint-500's copy is used, and the
    skip is noted."""
    out = tmp_path / "out"
    for step, cut in ((500, False), (1000, True)):
        d = out / f"checkpoint-{step}"
        d.mkdir(parents=True)
        text = json.dumps(
            {
                "global_step": step,
                "log_history": [
                    {"loss": 2.0 - s / 1000, "step": s} for s in range(10, step + 1, 10)
                ],
            }
        )
        (d / "trainer_state.json").write_text(text[: len(text) // 2] if cut else text)
    run = read_run(out)
    assert run.last_step == 500
    assert any("checkpoint-1000/trainer_state.json" in n and "skipped" in n for n in run.notes), (
        run.notes
    )


def test_trainer_state_with_null_steps(tmp_path: Path) -> None:
    """No global_step and an entry with "step": null: the entry is counted out, the rest imports."""
    d = tmp_path / "hf"
    d.mkdir()
    hist = [{"loss": 2.0, "step": s} for s in range(1, 50)] + [{"loss": 1.0, "step": None}]
    (d / "trainer_state.json").write_text(json.dumps({"log_history": hist}))
    assert read_run(d).series("loss").height == 49


def test_values_without_a_step_are_reported(tmp_path: Path) -> None:
    """Lines with no step key (an epoch summary) cannot be placed: their values (2 a line) are
    counted in the notes."""
    path = _jsonl(tmp_path / "m.jsonl", extra=['{"epoch": 1, "eval_loss": 2.0}'] * 3)
    run = read_run(path)
    assert any("without a step" in n and "6 in m.jsonl" in n for n in run.notes), run.notes


def test_all_with_json_prints_one_array(tmp_path: Path) -> None:
    """--all --format json over two jobs prints one JSON array, a document per job."""
    root = tmp_path / "lightning_logs"
    write_tb_run(root / "version_0", n=120, spike_at=None)
    write_tb_run(root / "version_1", n=120, spike_at=None, seed=2)
    res = runner.invoke(app, ["analyze", str(root), "--all", "--no-report", "--format", "json"])
    assert res.exit_code == 0, res.output
    docs = json.loads(res.stdout)
    assert [Path(d["run"]["path"]).name for d in docs] == ["version_0", "version_1"]


@pytest.mark.parametrize(
    "toml, needle",
    [
        ('[tool.forensics]\nignore = "plateau"\n', "list of finding kinds"),
        ('[tool.forensics.detectors.spikes]\nrecover_steps = "abc"\n', "recover_steps"),
    ],
    ids=["ignore-string", "param-type"],
)
def test_bad_configuration_is_one_line(tmp_path: Path, toml: str, needle: str) -> None:
    """A configuration value of the wrong type: exit 2 with one line naming it, before any
    analysis."""
    (Path.cwd() / "pyproject.toml").write_text(toml)
    path = _jsonl(tmp_path / "m.jsonl")
    res = runner.invoke(app, ["analyze", str(path), "--no-report"])
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], res.stderr


def test_a_cut_short_gzip_log_is_read_up_to_the_cut(tmp_path: Path) -> None:
    """A .jsonl.gz cut in half by a killed job: the complete lines are read; a corrupt one is a
    one-line error."""
    import gzip

    raw = gzip.compress(_jsonl(tmp_path / "m.jsonl", n=2000).read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(raw[: len(raw) // 2])
    run = read_run(cut)
    assert 100 < run.series("loss").height < 2000
    junk = tmp_path / "junk.jsonl.gz"
    junk.write_bytes(b"\x1f\x8b\x08\x00" + os.urandom(2000))
    res = runner.invoke(app, ["analyze", str(junk), "--no-report"])
    assert (
        res.exit_code == 2
        and "cannot be decompressed" in res.stderr
        and res.stderr.count("\n") == 1
    )


def test_interleaved_writers_are_not_called_a_replay(tmp_path: Path) -> None:
    """Two event files, even steps then odd steps: the restart note says no step was logged
    twice."""
    from tensorboardX import SummaryWriter

    run = tmp_path / "tb"
    for suffix, start in ((".a", 0), (".b", 1)):
        w = SummaryWriter(str(run), filename_suffix=suffix)
        for s in range(start, 600, 2):
            w.add_scalar("train/loss", 3.0 - s * 0.001, s)
        w.close()
    (restart,) = [f for f in read_run(run).import_findings if f.kind.value == "restart"]
    assert restart.measures["points_repeated"] == 0
    assert "no step was logged twice" in restart.summary


def test_lightning_csv_cut_inside_a_quote(tmp_path: Path) -> None:
    """metrics.csv whose last line stops inside a quoted field: the rest imports, the cut line is
    noted."""
    d = tmp_path / "lightning_logs" / "version_0"
    d.mkdir(parents=True)
    rows = (
        ["epoch,step,train_loss"]
        + [f"0,{s},{3 - s / 1000}" for s in range(0, 600, 10)]
        + ['0,601,"2.4']
    )
    (d / "metrics.csv").write_text("\n".join(rows))
    run = read_run(d)
    assert run.series("loss").height == 60
    assert any("cut short" in n for n in run.notes), run.notes


def test_wandb_ui_csv_with_two_runs_all(tmp_path: Path) -> None:
    """A W&B chart CSV holding two runs, with --all: each run's document names a path that
    exists."""
    d = tmp_path / "export"
    d.mkdir()
    head = ["Step"] + [
        f"{r} - train/loss{s}" for r in ("runA", "runB") for s in ("", "__MIN", "__MAX")
    ]
    rows = [",".join(head)] + [
        ",".join([str(s)] + [f"{3 - s / 1000:.4f}"] * 6) for s in range(0, 300, 5)
    ]
    (d / "loss.csv").write_text("\n".join(rows) + "\n")
    res = runner.invoke(app, ["analyze", str(d), "--all", "--no-report", "--format", "json"])
    assert res.exit_code == 0, res.output
    docs = json.loads(res.stdout)
    assert sorted(doc["run"]["name"] for doc in docs) == ["runA", "runB"]
    assert all(Path(doc["run"]["path"]).exists() for doc in docs)
