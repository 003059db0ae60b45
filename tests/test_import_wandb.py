"""W&B in the forms users hold: local run folders (binary ``.wandb`` written by the real client,
old ``wandb-history.jsonl``), the web UI's chart CSV and API history exports.

The binary runs are written by wandb itself (offline mode, in a subprocess, once per module);
the importer reads them without importing wandb. The web-UI and API exports need a W&B server
to produce, so they are written here in the shapes those tools save (formats.md section 3).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest
from conftest import shared_path

from forensics.errors import MultipleJobsError, UnreadableInputError
from forensics.findings import FindingKind
from forensics.importers import ReadOptions, discover, discover_jobs, read_run
from forensics.importers.wandb_binary import iter_records, read_wandb

WRITER = textwrap.dedent("""
    import json, math, sys, wandb
    out = {}
    run = wandb.init(project="forensics-test", mode="offline", name="alpha",
                     config={"lr": 3e-4, "betas": [0.9, 0.95], "batch_size": 64,
                             "model": {"n_layer": 4}})
    for step in range(300):
        loss = 2.0 + 3.5 * math.exp(-step / 80) + 0.03 * math.sin(step)
        if step == 200:
            loss *= 2.5
        d = {"train/loss": loss, "train/grad_norm": 0.5 + step / 1000, "train/lr": 3e-4}
        if step % 50 == 0:
            d["val/loss"] = loss + 0.05
        run.log(d, step=step)
    run.log({"nested": {"a": 1, "b": {"c": 2.5}}, "note": "text", "nan_val": float("nan")},
            step=300)
    run.summary["best_val"] = 2.07
    out["alpha"] = run.dir
    run.finish()
    # HF Trainer style: no step= argument, so W&B's _step counts log calls; the trainer's
    # step is train/global_step, and evaluations are separate log calls.
    run = wandb.init(project="forensics-test", mode="offline", name="beta",
                     config={"learning_rate": 5e-5})
    for gs in range(0, 200, 10):
        run.log({"train/loss": 3.0 - gs / 100, "train/learning_rate": 5e-5,
                 "train/global_step": gs})
        if gs % 50 == 0:
            run.log({"eval/loss": 3.1 - gs / 100, "train/global_step": gs})
    out["beta"] = run.dir
    run.finish()
    run = wandb.init(project="forensics-test", mode="offline", name="crashy")
    for s in range(20):
        run.log({"loss": 3 - s / 10}, step=s)
        print(f"step {s} loss {3 - s / 10}")
    print("Traceback (most recent call last):")
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    out["crashy"] = run.dir
    run.finish(exit_code=1)
    print("RUN_DIRS=" + json.dumps(out))
""")


def _loss(step: int) -> float:
    v = 2.0 + 3.5 * math.exp(-step / 80) + 0.03 * math.sin(step)
    return v * 2.5 if step == 200 else v


@pytest.fixture(scope="module")
def wandb_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three offline runs written by the real wandb client into one WANDB_DIR."""
    pytest.importorskip("wandb")
    root = tmp_path_factory.mktemp("wandb_dir")
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(root),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "wrap",
    }
    proc = subprocess.run(
        [sys.executable, "-c", WRITER],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RUN_DIRS="))
    dirs = {
        k: Path(v).parent for k, v in json.loads(line[len("RUN_DIRS=") :]).items()
    }  # run.dir is <run>/files
    return {"root": root, **dirs}


def _series(run, metric: str) -> dict[int, float]:  # noqa: ANN001
    return dict(run.series(metric).select("step", "value").iter_rows())


def test_binary_run_history_config_and_summary(wandb_runs: dict[str, Path]) -> None:
    """A run folder written by wandb: every logged value at its step, config and summary kept."""
    run = read_run(wandb_runs["alpha"])
    assert run.format == "wandb_run"
    loss = _series(run, "loss")
    assert sorted(loss) == list(range(300))
    assert all(loss[s] == pytest.approx(_loss(s)) for s in (0, 150, 200, 299))
    assert _series(run, "val_loss") == {
        s: pytest.approx(_loss(s) + 0.05) for s in range(0, 300, 50)
    }
    assert _series(run, "grad_norm")[100] == pytest.approx(0.6)
    assert run.config == {
        "lr": 3e-4,
        "betas": [0.9, 0.95],
        "batch_size": 64,
        "model": {"n_layer": 4},
    }
    assert run.metadata["wandb_display_name"] == "alpha"
    assert run.metadata["wandb_summary"]["best_val"] == pytest.approx(2.07)
    tags = dict(run.frame.filter(pl.col("step") == 300).select("tag", "value").iter_rows())
    assert tags["nested.b.c"] == 2.5 and math.isnan(tags["nan_val"]) and "note" not in tags
    assert run.series("loss").get_column("wall_time").null_count() == 0
    assert not run.import_findings


def test_binary_decoder_agrees_with_wandbs_own_protobuf(wandb_runs: dict[str, Path]) -> None:
    """The hand decoder reads the same history items as wandb's generated protobuf classes."""
    from wandb.proto import wandb_internal_pb2 as pb

    path = next(wandb_runs["alpha"].glob("run-*.wandb"))
    expected: list[tuple[int, str, float]] = []
    for payload in iter_records(path.read_bytes(), verify_crc=True):
        rec = pb.Record.FromString(payload)
        if rec.WhichOneof("record_type") != "history":
            continue
        items = {
            (it.key or ".".join(it.nested_key)): json.loads(it.value_json)
            for it in rec.history.item
        }
        for k, v in items.items():
            if k.startswith("_") or isinstance(v, str):
                continue
            expected.append((int(items["_step"]), k, float(v)))
    log = read_wandb(path, verify_crc=True)
    ours = list(zip(log.steps, log.tags, log.values, strict=True))
    assert len(ours) == len(expected) == 300 * 3 + 6 + 3
    assert sorted(map(repr, ours)) == sorted(map(repr, expected))  # repr: NaN compares equal


def test_several_run_folders_are_several_jobs(wandb_runs: dict[str, Path]) -> None:
    """Each run folder under wandb/ is its own job; the wandb/ folder's debug logs are no job."""
    jobs = discover_jobs(wandb_runs["root"])
    assert len(jobs) == 3 and all(j.startswith("wandb/offline-run-") for j in jobs)
    with pytest.raises(MultipleJobsError):
        read_run(wandb_runs["root"])


def test_trainer_global_step_is_the_x_axis(wandb_runs: dict[str, Path]) -> None:
    """HF-style logging: train/global_step, not W&B's _step (which counts log calls), is the
    step."""
    run = read_run(wandb_runs["beta"])
    assert _series(run, "loss") == {gs: pytest.approx(3.0 - gs / 100) for gs in range(0, 200, 10)}
    assert _series(run, "val_loss") == {
        gs: pytest.approx(3.1 - gs / 100) for gs in (0, 50, 100, 150)
    }
    assert run.frame.filter(pl.col("tag") == "train/global_step").is_empty()
    assert any("train/global_step" in n for n in run.notes)


def test_crash_printed_on_the_console_is_reported(wandb_runs: dict[str, Path]) -> None:
    """A run that exited non-zero after printing a CUDA OOM: a crash finding at its last step."""
    run = read_run(wandb_runs["crashy"])
    crash = [f for f in run.import_findings if f.kind == FindingKind.CRASH]
    assert len(crash) == 1 and crash[0].start_step == 19
    assert crash[0].measures["reason"] == "out_of_memory"
    assert "CUDA out of memory" in crash[0].measures["line"]
    assert run.metadata["wandb_exit_code"] == 1


def _copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return next(dst.glob("run-*.wandb"))


def test_truncated_binary_reads_every_complete_record(
    wandb_runs: dict[str, Path], tmp_path: Path
) -> None:
    """A killed job's .wandb ends mid-record: the complete records import and a truncated_log is
    noted."""
    full = read_run(wandb_runs["alpha"]).series("loss")
    path = _copy_run(wandb_runs["alpha"], tmp_path / "run-20240101_000000-abc")
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * 0.6) + 3])
    run = read_run(path.parent)
    part = run.series("loss")
    assert 50 < part.height < full.height
    assert part.get_column("value").to_list() == full.get_column("value").to_list()[: part.height]
    trunc = [f for f in run.import_findings if f.kind == FindingKind.TRUNCATED_LOG]
    assert len(trunc) == 1 and trunc[0].measures["bytes_lost"] > 0


def test_zero_padding_at_the_end_is_not_truncation(
    wandb_runs: dict[str, Path], tmp_path: Path
) -> None:
    """Zero-filled space after the last record (preallocation) is padding, not a cut record."""
    path = _copy_run(wandb_runs["alpha"], tmp_path / "run-20240101_000000-abc")
    path.write_bytes(path.read_bytes() + b"\x00" * 40000)
    run = read_run(path.parent)
    assert run.series("loss").height == 300
    assert not [f for f in run.import_findings if f.kind == FindingKind.TRUNCATED_LOG]


def test_corrupt_block_is_skipped_with_crc_checks(
    wandb_runs: dict[str, Path], tmp_path: Path
) -> None:
    """With CRC checks, a damaged 32 KiB block is skipped and reading resumes at the next block."""
    path = _copy_run(wandb_runs["alpha"], tmp_path / "run-20240101_000000-abc")
    data = bytearray(path.read_bytes())
    assert len(data) > 3 * 32768
    for i in range(32768 + 1000, 32768 + 1400):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    run = read_run(path.parent, options=ReadOptions(verify_crc=True))
    n = run.series("loss").height
    assert 150 < n < 300
    assert any("corrupt chunk" in note for note in run.notes)


def test_not_a_wandb_file(tmp_path: Path) -> None:
    """A file named like a W&B log without the W&B header is unreadable input, in one line."""
    bad = tmp_path / "run-20240101_000000-abc" / "run-abc.wandb"
    bad.parent.mkdir()
    bad.write_bytes(b"this is not a wandb file" * 10)
    with pytest.raises(UnreadableInputError, match="W&B"):
        read_run(bad.parent)


def test_shared_sample_matches_the_script_that_made_it() -> None:
    """The offline sample in ../shared (wandb 0.31) imports with the values its script logged."""
    folder = shared_path("format_samples", "wandb-offline")
    run = read_run(folder)
    scale = _series(run, "loss_scale")
    assert len(scale) == 400 and scale[249] == 65536.0 and scale[250] == 16384.0
    assert sorted(_series(run, "val_loss")) == list(range(0, 400, 50))
    loss = _series(run, "loss")
    assert loss[250] > 2.0 * loss[249]  # the injected x2.4 spike
    assert run.config == {"lr": 3e-4, "model": {"n_layer": 4, "d_model": 256}, "beta2": 0.95}
    tags = dict(run.frame.filter(pl.col("step") == 400).select("tag", "value").iter_rows())
    assert tags["nested.b.c"] == 2.5 and tags["flag"] == 1.0 and math.isinf(tags["inf_val"])
    assert run.metadata["wandb_summary"]["best_val"] == pytest.approx(2.07)


def test_old_client_folder_with_history_jsonl(tmp_path: Path) -> None:
    """Older clients: files/wandb-history.jsonl, config.yaml and wandb-summary.json in the run
    folder."""
    run_dir = tmp_path / "wandb" / "run-20200101_120000-oldrun1"
    files = run_dir / "files"
    files.mkdir(parents=True)
    rows = [
        {"_step": i, "_runtime": i * 2.0, "_timestamp": 1.6e9 + i, "loss": 3 - i / 10, "lr": 1e-4}
        for i in range(10)
    ]
    rows.append(
        {
            "_step": 10,
            "_runtime": 20.0,
            "_timestamp": 1.6e9 + 10,
            "gradients/h.0.weight": {"_type": "histogram", "values": [1, 2], "bins": [0, 1, 2]},
        }
    )
    (files / "wandb-history.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + "{broken\n"
    )
    (files / "config.yaml").write_text(
        "wandb_version: 1\n_wandb:\n  desc: null\n  value: {}\nlr:\n  desc: null\n  value: "
        "0.0001\nbatch_size:\n  desc: null\n  value: 32\n"
    )
    (files / "wandb-summary.json").write_text(json.dumps({"loss": 2.1, "_step": 9}))
    run = read_run(tmp_path)
    assert run.format == "wandb_run"
    assert _series(run, "loss")[9] == pytest.approx(2.1)
    assert run.config == {"lr": 1e-4, "batch_size": 32}
    assert run.metadata["wandb_summary"]["loss"] == 2.1
    assert any("not JSON objects" in n for n in run.notes)


# -- web UI chart CSV ----------------------------------------------------------------------
def _ui_csv(path: Path, runs: list[str], metric: str, steps: range, f, spread: float = 0.0) -> Path:  # noqa: ANN001
    header = ["Step"] + [
        c for r in runs for c in (f"{r} - {metric}", f"{r} - {metric}__MIN", f"{r} - {metric}__MAX")
    ]
    lines = [",".join(f'"{h}"' for h in header)]
    for s in steps:
        cells = [str(s)]
        for i, _ in enumerate(runs):
            v = f(s) + i
            cells += [repr(v), repr(v - spread), repr(v + spread)]
        lines.append(",".join(cells))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_ui_chart_csvs_of_one_run_are_one_job(tmp_path: Path) -> None:
    """Chart exports (one CSV per panel) of one run: one job; __MIN/__MAX are not metrics."""
    _ui_csv(
        tmp_path / "loss.csv",
        ["brisk-pond-1"],
        "train/loss",
        range(0, 1000, 10),
        lambda s: 5.0 - s / 1000,
    )
    _ui_csv(
        tmp_path / "gn.csv", ["brisk-pond-1"], "train/grad_norm", range(0, 1000, 10), lambda s: 1.0
    )
    run = read_run(tmp_path)
    assert run.format == "wandb_csv"
    assert _series(run, "loss")[500] == pytest.approx(4.5)
    assert _series(run, "grad_norm")[990] == 1.0
    assert not run.frame.filter(pl.col("tag").cast(pl.Utf8).str.contains("__M")).height
    assert any("sampled points" in n for n in run.notes)
    assert not any("down-sampled" in n for n in run.notes)


def _two_run_csv(path: Path) -> None:
    """A loss panel comparing two runs, one of them a group."""
    _ui_csv(
        path,
        ["Group: exp - a", "brisk-pond-1"],
        "train/loss",
        range(0, 100, 10),
        lambda s: 3.0,
        spread=0.1,
    )


def test_ui_chart_csv_with_two_runs_is_two_jobs(tmp_path: Path) -> None:
    """A panel comparing two runs (one of them a group) holds two jobs; names split on the last ' -
    '."""
    _two_run_csv(tmp_path / "loss.csv")
    jobs = discover_jobs(tmp_path)
    assert sorted(jobs) == ["brisk-pond-1", "exp - a"]
    with pytest.raises(MultipleJobsError):
        read_run(tmp_path)
    src = [s for s in discover(tmp_path) if s.options["run_name"] == "brisk-pond-1"][0]
    from forensics.importers.wandb_csv import IMPORTER

    res = IMPORTER.read(src, ReadOptions())
    assert set(res.frame.get_column("tag").to_list()) == {"train/loss"}
    assert res.frame.get_column("value").to_list() == [4.0] * 10
    assert any("down-sampled" in n for n in res.notes)


def test_each_run_of_a_two_run_csv_file_is_named_after_its_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``analyze loss.csv --all``: each job's verdict line names its W&B run (both were called
    "loss", after the file)."""
    from typer.testing import CliRunner

    from forensics.cli import app

    _two_run_csv(tmp_path / "loss.csv")
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path / "out")
    out = CliRunner().invoke(app, ["analyze", str(tmp_path / "loss.csv"), "--all", "--no-report"])
    assert out.exit_code == 0, out.output
    heads = [line.split("  steps")[0] for line in out.output.splitlines() if "  steps " in line]
    assert sorted(heads) == ["brisk-pond-1", "exp - a"]


# -- API history exports ---------------------------------------------------------------------
def _history_rows() -> list[dict]:
    """What run.history() returns: sparse rows, _step/_runtime/_timestamp, eval rows apart."""
    rows = []
    for i, gs in enumerate(range(0, 100, 10)):
        rows.append(
            {
                "_step": 2 * i,
                "_runtime": float(i),
                "_timestamp": 1.7e9 + i,
                "train/loss": 3.0 - gs / 100,
                "train/global_step": float(gs),
                "eval/loss": None,
            }
        )
        rows.append(
            {
                "_step": 2 * i + 1,
                "_runtime": float(i),
                "_timestamp": 1.7e9 + i,
                "train/loss": None,
                "train/global_step": float(gs),
                "eval/loss": 3.2 - gs / 100,
            }
        )
    rows[4]["train/loss"] = float("nan")
    return rows


@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
def test_api_history_exports(tmp_path: Path, kind: str) -> None:
    """API history saved as CSV, JSONL (scan_history rows) or parquet: global step axis, NaN
    kept."""
    rows = _history_rows()
    path = tmp_path / f"history.{kind}"
    if kind == "csv":
        pl.DataFrame(rows).write_csv(path)  # NaN as "NaN", not logged as an empty cell
    elif kind == "jsonl":
        path.write_text(
            "".join(json.dumps({k: v for k, v in r.items() if v is not None}) + "\n" for r in rows)
        )
    else:
        pl.DataFrame(rows).write_parquet(path)
    assert [s.importer for s in discover(path)] == ["wandb_csv"]
    run = read_run(path)
    loss = _series(run, "loss")
    assert sorted(loss) == list(range(0, 100, 10)) and loss[50] == pytest.approx(2.5)
    assert math.isnan(loss[20])
    assert _series(run, "val_loss")[90] == pytest.approx(2.3)
    assert set(run.frame.get_column("tag").to_list()) == {"train/loss", "eval/loss"}


def test_api_history_csv_saved_by_pandas(tmp_path: Path) -> None:
    """pandas' to_csv adds an unnamed index column and writes NaN as empty (= not logged)."""
    import pandas as pd

    path = tmp_path / "history.csv"
    pd.DataFrame(_history_rows()).to_csv(path)
    run = read_run(path)
    assert set(run.frame.get_column("tag").to_list()) == {"train/loss", "eval/loss"}
    assert sorted(_series(run, "loss")) == [0, 10, 30, 40, 50, 60, 70, 80, 90]
