"""Units taken from the metric names (``_mb``, ``_bytes``, ``_ms``) and shown in findings.

JSONL logs and a W&B web-UI chart export (one CSV per panel, ``"<run> - <metric>"`` columns with
``__MIN``/``__MAX``) are written here; the findings' ``unit`` measure is the unit the run read
from the name (``Run.unit``) and the summaries show the numbers in it: bytes as GB (MB below a
gigabyte), a millisecond step time in ms.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from forensics.cli import app
from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze_run, read_run
from forensics.schema import MEMORY, STEP_TIME

STEPS = np.arange(0, 3000, 10)
runner = CliRunner()


def _loss(steps: np.ndarray, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 1.5 + 3.0 * np.exp(-steps / 1500) * np.exp(rng.normal(0, 0.01, len(steps)))


def _jsonl(path: Path, columns: dict[str, dict[int, float]]) -> Path:
    """One JSON object per logged step, as a JSON-lines logger writes them."""
    steps = sorted({s for col in columns.values() for s in col})
    with path.open("w") as f:
        for s in steps:
            rec = {"step": s} | {k: v[s] for k, v in columns.items() if s in v}
            f.write(json.dumps(rec) + "\n")
    return path


def _wandb_chart_csv(path: Path, run: str, metric: str, values: dict[int, float]) -> Path:
    """A W&B chart export: ``Step`` then the run's value, __MIN and __MAX columns."""
    head = ["Step", f"{run} - {metric}", f"{run} - {metric}__MIN", f"{run} - {metric}__MAX"]
    lines = [",".join(f'"{h}"' for h in head)]
    lines += [f"{s},{v!r},{v!r},{v!r}" for s, v in sorted(values.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def _series(values: np.ndarray, steps: np.ndarray = STEPS) -> dict[int, float]:
    return {int(s): float(v) for s, v in zip(steps, values, strict=True)}


def _only(diag, kind: FindingKind):  # noqa: ANN001, ANN202
    found = [f for f in diag.findings if f.kind is kind]
    assert len(found) == 1, [(f.kind.value, f.summary) for f in diag.findings]
    return found[0]


def _numbers(pattern: str, text: str) -> list[float]:
    m = re.search(pattern, text)
    assert m, text
    return [float(g.replace(",", "")) for g in m.groups()]


def test_jsonl_memory_in_mb_and_step_time_in_ms(tmp_path: Path) -> None:
    """memory/max_allocated_mb climbing 1 MB a step, perf/step_time_ms at 850 ms rising to
    1,300 ms from step 1500 to 1790: the memory finding is in MB, the step-time one in ms."""
    mem = 10_000.0 + 1.0 * STEPS
    jitter = np.resize([0.0, 4.0, -4.0, 2.0, -2.0], len(STEPS))
    slow = (STEPS >= 1500) & (STEPS < 1800)
    step_ms = np.where(slow, 1300.0, 850.0) + jitter
    run_path = _jsonl(
        tmp_path / "metrics.jsonl",
        {
            "train/loss": _series(_loss(STEPS)),
            "memory/max_allocated_mb": _series(mem),
            "perf/step_time_ms": _series(step_ms),
        },
    )
    run = read_run(run_path)
    assert (run.unit(MEMORY), run.unit(STEP_TIME)) == ("MB", "ms")
    diag = analyze_run(run)

    grew = _only(diag, FindingKind.MEMORY_GROWTH)
    assert grew.measures["unit"] == "MB"
    m = grew.measures
    start, end = m["start_level"], m["end_level"]
    # The logged levels (10,000 MB + 1 MB a step) at the steps the finding names.
    assert 300 <= m["start_level_step"] <= 320 and 2_970 <= m["end_level_step"] <= 2_990
    assert start == pytest.approx(10_000 + m["start_level_step"], abs=1)
    assert end == pytest.approx(10_000 + m["end_level_step"], abs=1)
    shown = _numbers(
        r"Memory grew ([\d,]+) MB over ([\d,]+) steps without levelling off, "
        r"from ([\d,]+) MB at step ([\d,]+) to ([\d,]+) MB at step ([\d,]+)",
        grew.summary,
    )
    span = m["end_level_step"] - m["start_level_step"]
    assert shown == pytest.approx(
        [end - start, span, start, m["start_level_step"], end, m["end_level_step"]], abs=1
    )
    assert f"{1000 * (end - start) / span:,.0f} MB per 1k steps;" in grew.summary
    assert grew.summary.endswith("MB per 1k steps over the last third).")

    drop = _only(diag, FindingKind.THROUGHPUT_DROP)
    assert drop.measures["source"] == STEP_TIME and drop.measures["unit"] == "ms/step"
    assert drop.measures["baseline"] == pytest.approx(850, abs=5)
    assert drop.measures["level"] == pytest.approx(1300, abs=5)
    assert 1490 <= drop.start_step <= 1520 and drop.end_step == pytest.approx(1790, abs=30)
    before, after = _numbers(
        r"^Step time rose from ([\d,.]+) ms/step to ([\d,.]+) ms/step", drop.summary
    )
    assert before == pytest.approx(850, abs=5) and after == pytest.approx(1300, abs=5)
    assert "assumed" not in drop.summary


def test_wandb_chart_export_rss_in_bytes_is_shown_in_gb(tmp_path: Path) -> None:
    """A W&B chart export of sys/rss_bytes growing 1.15 MB a step from 2 GB: the unit is bytes,
    the levels stay in bytes in the measures, the summary says how many GB it grew."""
    _wandb_chart_csv(tmp_path / "loss.csv", "brisk-pond-1", "train/loss", _series(_loss(STEPS)))
    rss = 2.0e9 + 1.15e6 * STEPS
    _wandb_chart_csv(tmp_path / "rss.csv", "brisk-pond-1", "sys/rss_bytes", _series(rss))
    run = read_run(tmp_path)
    assert run.format == "wandb_csv" and run.unit(MEMORY) == "bytes"
    grew = _only(analyze_run(run), FindingKind.MEMORY_GROWTH)
    assert grew.measures["unit"] == "bytes"
    m = grew.measures
    start, end = m["start_level"], m["end_level"]
    # The logged levels at the steps the finding names (the last bin's median step, 2,980).
    assert end == pytest.approx(2.0e9 + 1.15e6 * m["end_level_step"], rel=1e-6)
    assert start == pytest.approx(2.0e9 + 1.15e6 * m["start_level_step"], rel=1e-6)
    assert m["end_level_step"] >= 2970
    assert end - start == pytest.approx(3.09e9, rel=0.01)
    shown = _numbers(
        r"Memory grew ([\d.]+) GB over [\d,]+ steps without levelling off, "
        r"from ([\d.]+) GB at step [\d,]+ to ([\d.]+) GB at step [\d,]+ "
        r"\(\+\d+%, ([\d.]+) GB per 1k steps; ",
        grew.summary,
    )
    assert shown == pytest.approx([(end - start) / 1e9, start / 1e9, end / 1e9, 1.15], rel=0.01)
    assert "bytes" not in grew.summary


def test_bytes_below_a_gigabyte_are_shown_in_mb(tmp_path: Path) -> None:
    """sys/rss_bytes from 200 MB to about 500 MB: MB, not 0.2 GB."""
    rss = 2.0e8 + 1.0e5 * STEPS
    run = read_run(
        _jsonl(
            tmp_path / "metrics.jsonl",
            {"train/loss": _series(_loss(STEPS)), "sys/rss_bytes": _series(rss)},
        )
    )
    grew = _only(analyze_run(run), FindingKind.MEMORY_GROWTH)
    assert grew.measures["unit"] == "bytes"
    start, end = grew.measures["start_level"], grew.measures["end_level"]
    shown = _numbers(r"from ([\d.]+) MB at step [\d,]+ to ([\d.]+) MB", grew.summary)
    assert shown == pytest.approx([start / 1e6, end / 1e6], rel=0.01)


def test_names_without_a_unit_fall_back_and_say_so(tmp_path: Path) -> None:
    """memory/allocated and perf/step_time state no unit: no unit measure, the summaries say
    the unit is not stated (memory) or assumed (s/step)."""
    slow = (STEPS >= 1500) & (STEPS < 1800)
    run = read_run(
        _jsonl(
            tmp_path / "metrics.jsonl",
            {
                "train/loss": _series(_loss(STEPS)),
                "memory/allocated": _series(10.0 + 0.001 * STEPS),
                "perf/step_time": _series(np.where(slow, 1.3, 0.85)),
            },
        )
    )
    assert run.unit(MEMORY) is None
    diag = analyze_run(run)
    grew = _only(diag, FindingKind.MEMORY_GROWTH)
    assert grew.measures["unit"] is None
    assert grew.summary.endswith("(the log does not state the unit).")
    drop = _only(diag, FindingKind.THROUGHPUT_DROP)
    assert drop.measures["unit"] is None
    assert drop.summary.startswith(
        "Step time rose from 0.85 s/step to 1.3 s/step (s/step assumed: the log states no unit)"
    )


def test_an_assumed_unit_inside_a_parenthesis_does_not_nest_one(tmp_path: Path) -> None:
    """A throughput named without a unit (tokens/s assumed) that fell 35%: the assumption
    joins the sentence's own parenthesis after a semicolon ("... -> 6,500 tokens/s; tokens/s
    assumed: the log states no unit)"), not a parenthesis inside it ("...))")."""
    low = (STEPS >= 1500) & (STEPS < 1700)
    run = read_run(
        _jsonl(
            tmp_path / "metrics.jsonl",
            {
                "train/loss": _series(_loss(STEPS)),
                "throughput": _series(np.where(low, 6_500.0, 10_000.0)),
            },
        )
    )
    drop = _only(analyze_run(run), FindingKind.THROUGHPUT_DROP)
    assert drop.measures["unit"] is None
    assert "(10,000 tokens/s -> 6,500 tokens/s; tokens/s assumed: the log states no unit)" in (
        drop.summary
    )
    assert "))" not in drop.summary


def test_slow_eval_steps_in_ms_are_shown_in_ms_and_seconds(tmp_path: Path) -> None:
    """perf/step_time_ms: 850 ms, 3,000 ms at every 200-step evaluation (eval/loss logged
    there): one info stall naming the evaluation pauses, each 3.0 s against the usual 850 ms;
    its seconds are the milliseconds scaled."""
    at_eval = (STEPS % 200 == 0) & (STEPS > 0)
    step_ms = np.where(at_eval, 3000.0, 850.0)
    evals = STEPS[STEPS % 200 == 0]
    run = read_run(
        _jsonl(
            tmp_path / "metrics.jsonl",
            {
                "train/loss": _series(_loss(STEPS)),
                "eval/loss": _series(_loss(evals, seed=1) + 0.05, evals),
                "perf/step_time_ms": _series(step_ms),
            },
        )
    )
    diag = analyze_run(run)
    stall = _only(diag, FindingKind.STALL)
    assert stall.severity is Severity.INFO and stall.measures["housekeeping"] == "eval_interval"
    assert stall.measures["slow_steps"] == int(at_eval.sum())
    assert stall.measures["gap_seconds"] == pytest.approx(3.0)
    assert stall.measures["usual_step_seconds"] == pytest.approx(0.85)
    assert "(3.0 s each, the usual step 850 ms)" in stall.summary


def test_cli_text_shows_the_units(tmp_path: Path) -> None:
    """The terminal summary carries the same units (W&B chart export, bytes as GB)."""
    _wandb_chart_csv(tmp_path / "loss.csv", "brisk-pond-1", "train/loss", _series(_loss(STEPS)))
    rss = 2.0e9 + 1.15e6 * STEPS
    _wandb_chart_csv(tmp_path / "rss.csv", "brisk-pond-1", "sys/rss_bytes", _series(rss))
    out = tmp_path.parent / f"{tmp_path.name}-report.html"
    res = runner.invoke(app, ["analyze", str(tmp_path), "--out", str(out)], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    assert re.search(r"Memory grew 3\.\d+ GB over [\d,]+ steps", res.stdout), res.stdout
