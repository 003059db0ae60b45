"""Neptune exporter Parquet (issue 19): files written in neptune-exporter's documented layout
(``<project dir>/<run_id>_part_<n>.parquet``, its SCHEMA: decimal steps, ms timestamps, one
typed column per attribute kind) with pyarrow, as its ParquetWriter does."""

from __future__ import annotations

import datetime as dt
import json
import math
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

import forensics
from forensics.cli import app
from forensics.errors import MultipleJobsError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

runner = CliRunner()
N = 600
SPIKE = 300
T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)


def _schema():  # noqa: ANN202 - neptune-exporter's model.SCHEMA
    return pa.schema(
        [
            ("project_id", pa.string()),
            ("run_id", pa.string()),
            ("attribute_path", pa.string()),
            ("attribute_type", pa.string()),
            ("step", pa.decimal128(18, 6)),
            ("timestamp", pa.timestamp("ms", tz="UTC")),
            ("int_value", pa.int64()),
            ("float_value", pa.float64()),
            ("string_value", pa.string()),
            ("bool_value", pa.bool_()),
            ("datetime_value", pa.timestamp("ms", tz="UTC")),
            ("string_set_value", pa.list_(pa.string())),
            ("file_value", pa.struct([("path", pa.string())])),
            (
                "histogram_value",
                pa.struct(
                    [
                        ("type", pa.string()),
                        ("edges", pa.list_(pa.float64())),
                        ("values", pa.list_(pa.float64())),
                    ]
                ),
            ),
        ]
    )


def _row(run_id: str, path: str, kind: str, **kw: object) -> dict:
    row = dict.fromkeys(_schema().names)
    row.update(project_id="acme/llm", run_id=run_id, attribute_path=path, attribute_type=kind)
    row.update(kw)
    return row


def _loss(s: float, spike: bool) -> float:
    v = 2.0 + 6.0 / (1 + s / 30) ** 0.7 + 0.01 * math.sin(s)
    return v * 3.0 if spike and SPIKE <= s < SPIKE + 3 else v


def write_export(
    data: Path, run_id: str, *, spike: bool, step_unit: float = 1.0, parts: int = 2
) -> list[Path]:
    """One run as neptune-exporter writes it: parameters first, then metrics, in parts."""
    params = [
        _row(run_id, "parameters/lr", "float", float_value=3e-4),
        _row(run_id, "parameters/batch_size", "int", int_value=512),
        _row(run_id, "parameters/optimizer", "string", string_value="adamw"),
        _row(run_id, "parameters/fp16", "bool", bool_value=True),
        _row(run_id, "parameters/save_steps", "int", int_value=200),
        _row(run_id, "sys/name", "string", string_value="baseline"),
        _row(run_id, "sys/tags", "string_set", string_set_value=["llm", "issue-19"]),
        _row(run_id, "sys/creation_time", "datetime", datetime_value=T0),
    ]
    metrics = []
    for i in range(N):
        s = Decimal(str(round(i * step_unit, 6)))
        ts = T0 + dt.timedelta(seconds=i)
        metrics.append(
            _row(
                run_id,
                "train/loss",
                "float_series",
                step=s,
                timestamp=ts,
                float_value=_loss(i, spike),
            )
        )
        metrics.append(
            _row(
                run_id,
                "train/grad_norm",
                "float_series",
                step=s,
                timestamp=ts,
                float_value=0.5
                + math.exp(-i / 80)
                + (4.0 if spike and SPIKE <= i < SPIKE + 3 else 0),
            )
        )
    metrics.append(
        _row(
            run_id,
            "eval/probe",
            "float_series",
            step=Decimal(10),
            timestamp=T0,
            float_value=math.nan,
        )
    )
    metrics.append(
        _row(
            run_id,
            "monitoring/stdout",
            "string_series",
            step=Decimal(1),
            timestamp=T0,
            string_value="hi",
        )
    )
    rows = params + metrics
    project = data / "acme_llm-1a2b3c"
    project.mkdir(parents=True, exist_ok=True)
    chunk = math.ceil(len(rows) / parts)
    out = []
    for n in range(parts):
        path = project / f"{run_id}_part_{n}.parquet"
        table = pa.Table.from_pylist(rows[n * chunk : (n + 1) * chunk], schema=_schema())
        pq.write_table(table, path, compression="snappy")
        out.append(path)
    return out


def test_metrics_config_and_metadata(tmp_path: Path) -> None:
    """float_series are the metrics (exact values, steps, times); parameters nest as config."""
    write_export(tmp_path / "data", "LLM-7", spike=True)
    run = forensics.read_run(tmp_path / "data" / "acme_llm-1a2b3c")
    assert run.format == "neptune_parquet" and run.name == "LLM-7"
    assert run.metrics()["loss"] == "train/loss" and run.metrics()["grad_norm"] == "train/grad_norm"
    got = run.view().filter(pl.col("tag") == "train/loss").select("step", "value", "wall_time")
    want = pl.DataFrame(
        {
            "step": list(range(N)),
            "value": [_loss(i, True) for i in range(N)],
            "wall_time": [T0.timestamp() + i for i in range(N)],
        },
        schema={"step": pl.Int64, "value": pl.Float64, "wall_time": pl.Float64},
    )
    assert_frame_equal(got.sort("step"), want)
    probe = run.view().filter(pl.col("tag") == "eval/probe").get_column("value").to_list()
    assert len(probe) == 1 and math.isnan(probe[0])
    assert run.config["parameters"] == {
        "lr": 3e-4,
        "batch_size": 512,
        "optimizer": "adamw",
        "fp16": True,
        "save_steps": 200,
    }
    assert run.metadata["neptune_sys/name"] == "baseline"
    assert run.metadata["neptune_sys/tags"] == ["llm", "issue-19"]
    assert run.metadata["neptune_run_id"] == "LLM-7"
    assert run.metadata["neptune_project"] == "acme/llm"
    assert any("string_series" in n for n in run.notes)
    assert not [f for f in run.import_findings if f.kind == "restart"]


def test_spike_found_and_checkpoint_interval_from_config(tmp_path: Path) -> None:
    """The pipeline finds the injected spike; parameters/save_steps feeds the rollback advice."""
    write_export(tmp_path / "data", "LLM-7", spike=True)
    diag = forensics.analyze(tmp_path / "data" / "acme_llm-1a2b3c")
    spikes = [f for f in diag.findings if f.kind == "loss_spike"]
    assert spikes and any(abs(f.start_step - SPIKE) <= 3 for f in spikes)
    sources = [rb.checkpoint_source for rb in diag.rollbacks]
    assert not sources or any("save_steps" in s for s in sources)


def test_fractional_steps_are_scaled(tmp_path: Path) -> None:
    """Decimal steps of 0.5 become whole steps times 10, and the notes say so."""
    write_export(tmp_path / "data", "LLM-9", spike=False, step_unit=0.5)
    run = forensics.read_run(tmp_path / "data" / "acme_llm-1a2b3c")
    steps = run.series("loss").get_column("step").to_list()
    assert steps[:3] == [0, 5, 10] and steps[-1] == (N - 1) * 5
    assert any("multiplied by 10" in n for n in run.notes)


def test_project_folder_is_a_folder_of_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs in a project folder: exit 2 with the list; --all analyzes each; .tmp parts noted."""
    data = tmp_path / "data"
    write_export(data, "LLM-7", spike=True)
    write_export(data, "LLM-8", spike=False, parts=1)
    # An export interrupted while writing a third run: only a .tmp part, never a job.
    (data / "acme_llm-1a2b3c" / "LLM-9_part_0.parquet.tmp").write_bytes(b"PAR1 cut")
    with pytest.raises(MultipleJobsError):
        forensics.read_run(data)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    res = runner.invoke(app, ["analyze", str(data), "--all", "--no-report", "--format", "json"])
    assert res.exit_code == 0, res.output
    docs = json.loads(res.stdout)
    assert sorted(d["run"]["name"] for d in docs) == ["LLM-7", "LLM-8"]
    assert {d["run"]["format"] for d in docs} == {"neptune_parquet"}
    by_name = {d["run"]["name"]: d["verdict"] for d in docs}
    assert by_name["LLM-8"] == "healthy" and by_name["LLM-7"] != "healthy"
