"""MLflow file and SQLite stores (issue 19), written by the real mlflow client in a subprocess
and read without mlflow."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import snapshot
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

import forensics
from forensics.cli import app
from forensics.errors import MultipleJobsError
from forensics.importers import discover_jobs, read_job

runner = CliRunner()
N = 600
SPIKE = 300

# Two runs in experiment "sweep": "lr-3e-4" with a loss spike, NaN and Inf values, params and
# tags; "lr-1e-3" clean. Then "lr-3e-4" is resumed (start_run(run_id=...)) and re-logs steps
# 550-599: a restart. Expected points go to expected.json.
WRITER = r"""
import json, math, sys, time
import mlflow
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

uri, out = sys.argv[1], sys.argv[2]
mlflow.set_tracking_uri(uri)
mlflow.set_experiment("sweep")
client = MlflowClient()
expected = {}

def series(s, seed):
    loss = 2.0 + 6.0 / (1 + s / 30) ** 0.7 + 0.01 * math.sin(s * seed)
    gn = 0.5 + 1.5 * math.exp(-s / 80) + 0.01 * math.cos(s * seed)
    if seed == 1 and 300 <= s < 303:
        loss, gn = loss * 3.0, gn * 8.0
    return {"train/loss": loss, "train/grad_norm": gn, "lr": 3e-4 * min(1.0, (s + 1) / 50)}

def log(run_id, steps, seed):
    now = int(time.time() * 1000)
    batch = [Metric(k, v, now, s) for s in steps for k, v in series(s, seed).items()]
    for i in range(0, len(batch), 900):
        client.log_batch(run_id, metrics=batch[i:i + 900])
    time.sleep(0.01)  # the resume logs later than the first attempt, as a real one does

ids = {}
for name, seed in (("lr-3e-4", 1), ("lr-1e-3", 2)):
    with mlflow.start_run(run_name=name) as run:
        ids[name] = run.info.run_id
        lr = 3e-4 if seed == 1 else 1e-3
        mlflow.log_params({"lr": lr, "batch_size": 32, "optimizer": "adamw"})
        mlflow.set_tags({"team": "llm", "purpose": "issue 19"})
        log(run.info.run_id, range(600), seed)
        if seed == 1:
            mlflow.log_metric("eval/nan_probe", float("nan"), step=100)
            mlflow.log_metric("eval/nan_probe", float("inf"), step=200)
            mlflow.log_metric("eval/nan_probe", float("-inf"), step=300)
            mlflow.log_metric("eval/nan_probe", 0.5, step=400)
with mlflow.start_run(run_id=ids["lr-3e-4"]):
    log(ids["lr-3e-4"], range(550, 600), 1)
json.dump(ids, open(out, "w"))
"""


def _write_store(uri: str, cwd: Path) -> dict[str, str]:
    pytest.importorskip("mlflow", reason="the tests write stores with the real mlflow client")
    env = {
        **os.environ,
        "MLFLOW_ALLOW_FILE_STORE": "true",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "1",
        "GIT_PYTHON_REFRESH": "quiet",
    }
    res = subprocess.run(
        [sys.executable, "-c", WRITER, uri, str(cwd / "ids.json")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads((cwd / "ids.json").read_text())


@pytest.fixture(scope="module")
def file_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    d = tmp_path_factory.mktemp("mlflow_file")
    ids = _write_store("file:./mlruns", d)
    (d / "ids.json").unlink()
    return d / "mlruns", ids


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    d = tmp_path_factory.mktemp("mlflow_sqlite")
    (d / "store").mkdir()
    ids = _write_store(f"sqlite:///{d / 'store' / 'mlflow.db'}", d)
    (d / "ids.json").unlink()
    for p in (d / "store").iterdir():  # nothing but the database stays beside it
        assert p.name == "mlflow.db" or p.is_dir(), p
    return d / "store" / "mlflow.db", ids


def _run_dir(mlruns: Path, run_id: str) -> Path:
    (hit,) = list(mlruns.glob(f"*/{run_id}"))
    return hit


def _points(run: forensics.Run, tag: str) -> pl.DataFrame:
    """The analysis view of one tag: the resumed segment pre-empts the first attempt."""
    return run.view().filter(pl.col("tag") == tag).select("step", "value").sort("step")


def _expected(tag: str, seed: int) -> pl.DataFrame:
    steps = list(range(N))
    vals = []
    for s in steps:
        loss = 2.0 + 6.0 / (1 + s / 30) ** 0.7 + 0.01 * math.sin(s * seed)
        gn = 0.5 + 1.5 * math.exp(-s / 80) + 0.01 * math.cos(s * seed)
        if seed == 1 and SPIKE <= s < SPIKE + 3:
            loss, gn = loss * 3.0, gn * 8.0
        vals.append({"train/loss": loss, "train/grad_norm": gn}[tag])
    return pl.DataFrame(
        {"step": steps, "value": vals}, schema={"step": pl.Int64, "value": pl.Float64}
    )


def _read(store: str, file_store, sqlite_store, name: str) -> forensics.Run:
    if store == "file":
        mlruns, ids = file_store
        return forensics.read_run(_run_dir(mlruns, ids[name]))
    db, ids = sqlite_store
    jobs = discover_jobs(db)
    (job,) = [j for j in jobs if j.endswith(ids[name])]
    return read_job(db, job, jobs[job], only_job=False)


@pytest.mark.parametrize("store", ["file", "sqlite"])
def test_metrics_as_logged(store: str, file_store, sqlite_store) -> None:
    """Every point the client logged is read back exactly, keys with '/' included."""
    run = _read(store, file_store, sqlite_store, "lr-3e-4")
    assert run.format == "mlflow_store"
    for tag in ("train/loss", "train/grad_norm"):
        assert_frame_equal(_points(run, tag), _expected(tag, 1))
    assert run.metrics()["loss"] == "train/loss" and run.metrics()["grad_norm"] == "train/grad_norm"
    assert run.frame.filter(pl.col("wall_time").is_null()).is_empty()


@pytest.mark.parametrize("store", ["file", "sqlite"])
def test_nan_and_inf_are_kept(store: str, file_store, sqlite_store) -> None:
    """NaN, +Inf and -Inf come back as such (SQLite stores them as is_nan and +-DBL_MAX)."""
    run = _read(store, file_store, sqlite_store, "lr-3e-4")
    vals = _points(run, "eval/nan_probe").get_column("value").to_list()
    assert math.isnan(vals[0]) and vals[1:] == [math.inf, -math.inf, 0.5]


@pytest.mark.parametrize("store", ["file", "sqlite"])
def test_params_tags_and_restart(store: str, file_store, sqlite_store) -> None:
    """Params are the config (numbers parsed), user tags beside them; the resume is a restart."""
    run = _read(store, file_store, sqlite_store, "lr-3e-4")
    assert run.config["lr"] == pytest.approx(3e-4)
    assert run.config["batch_size"] == 32 and run.config["optimizer"] == "adamw"
    assert run.config["tags"] == {"team": "llm", "purpose": "issue 19"}
    assert run.metadata["mlflow_run_name"] == "lr-3e-4"
    assert run.metadata["mlflow_experiment"] == "sweep"
    restarts = [f for f in run.import_findings if f.kind == "restart"]
    assert len(restarts) == 1 and restarts[0].measures["resumed_from_step"] == 550


@pytest.mark.parametrize("store", ["file", "sqlite"])
def test_spike_found_at_its_step(store: str, file_store, sqlite_store) -> None:
    """The pipeline over an MLflow run finds the injected loss spike where it was logged."""
    from forensics.pipeline import analyze_run

    run = _read(store, file_store, sqlite_store, "lr-3e-4")
    diag = analyze_run(run)
    spikes = [f for f in diag.findings if f.kind == "loss_spike"]
    assert spikes and any(abs(f.start_step - SPIKE) <= 3 for f in spikes)


@pytest.mark.parametrize("store", ["file", "sqlite"])
def test_a_store_is_a_folder_of_jobs(
    store: str, file_store, sqlite_store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several runs: exit 2 with the list; --all analyzes each; the store is never written."""
    path, ids = file_store if store == "file" else sqlite_store
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(MultipleJobsError):
        forensics.read_run(path)
    evidence = path if path.is_dir() else path.parent
    before = snapshot(evidence)
    res = runner.invoke(app, ["analyze", str(path), "--all", "--no-report", "--format", "json"])
    assert res.exit_code == 0, res.output
    docs = json.loads(res.stdout)
    assert len(docs) == 2
    assert sorted(d["run"]["name"] for d in docs) == ["lr-1e-3", "lr-3e-4"]  # MLflow's run names
    assert {d["run"]["path"].rsplit("/", 1)[-1] for d in docs} <= {*ids.values(), path.name}
    verdicts = sorted(d["verdict"] for d in docs)
    assert verdicts[0] == "healthy" and verdicts[1] != "healthy"
    assert snapshot(evidence) == before


def test_read_without_mlflow(file_store, sqlite_store, tmp_path: Path) -> None:
    """Both stores are read in a process where importing mlflow fails."""
    mlruns, ids = file_store
    db, _ = sqlite_store
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "mlflow" or name.startswith("mlflow."):
            raise ImportError("mlflow is blocked in this test")
sys.meta_path.insert(0, Block())
import forensics
from forensics.importers import discover_jobs
run = forensics.read_run({str(_run_dir(mlruns, ids["lr-1e-3"]))!r})
assert run.has("loss"), run.metrics()
assert len(discover_jobs({str(db)!r})) == 2
assert "mlflow" not in sys.modules
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]
