"""Issue 14, vocabulary: throughput, step time, memory and wall time under any namespace and
the common spellings; units read from the names; the `--alias` hint for unmapped tags."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from forensics.cli import app
from forensics.importers import read_run
from forensics.schema import (
    GRAD_NORM_EMBED,
    GRAD_NORM_HEAD,
    GRAD_NORM_LAYER,
    MEMORY,
    NAN_ITERS,
    STEP_TIME,
    THROUGHPUT,
    alias_line,
    canonicalize,
    module_series,
    nearest_canonical,
    unit_of,
)

runner = CliRunner()


@pytest.mark.parametrize(
    ("tag", "metric", "unit"),
    [
        ("tokens/s", THROUGHPUT, "tokens/s"),
        ("tok/s", THROUGHPUT, "tokens/s"),
        ("tps", THROUGHPUT, "tokens/s"),
        ("myproj/perf/tokens_per_sec", THROUGHPUT, "tokens/s"),
        ("samples_per_second", THROUGHPUT, "samples/s"),
        ("speed/samples_per_second", THROUGHPUT, "samples/s"),
        ("it/s", THROUGHPUT, "it/s"),
        ("step_time", STEP_TIME, "s"),
        ("iter time", STEP_TIME, "s"),
        ("iter time (ms)", STEP_TIME, "ms"),
        ("perf/iter_time_ms", STEP_TIME, "ms"),
        ("timing/step_duration_ms", STEP_TIME, "ms"),
        ("rss", MEMORY, None),
        ("host/rss_mb", MEMORY, "MB"),
        ("mem_gb", MEMORY, "GB"),
        ("memory_allocated", MEMORY, None),
        ("cuda/memory_allocated_bytes", MEMORY, "bytes"),
        ("max_memory_reserved", MEMORY, None),
        ("my_team/sys/max_memory_reserved_mb", MEMORY, "MB"),
        ("gpu_mem", MEMORY, None),
        ("System/Peak GPU Memory (MB)", MEMORY, "MB"),
        # a count of iterations (Megatron's line), not a rate: its own sign
        ("number of nan iterations", NAN_ITERS, None),
    ],
)
def test_vital_sign_spellings(tag: str, metric: str, unit: str | None) -> None:
    assert canonicalize(tag) == (metric, None)
    assert unit_of(tag, metric) == unit


@pytest.mark.parametrize(
    "tag",
    [
        "train/train_samples_per_second",  # HF's whole-run summary
        "eval_samples_per_second",  # eval-time speed, not training throughput
        "system/gpu.0.memory",  # W&B system: memory-controller utilisation
        "mem_free_gb",  # the inverse of usage
        "train_runtime",
        # counters, not rates: the plural's "s" is not "per second"
        "consumed samples",  # Megatron's iteration line
        "num_tokens",
        "tokens",
        "global_steps",
        "train/samples",
    ],
)
def test_lookalikes_stay_unmapped(tag: str) -> None:
    assert canonicalize(tag)[0] is None


def test_skipped_iterations_are_a_count_of_their_own() -> None:
    """Megatron's count of skipped iterations is read as such, never as a rate."""
    assert canonicalize("number of skipped iterations") == ("skipped_iters", None)
    assert unit_of("number of skipped iterations", "skipped_iters") is None


def test_nearest_canonical_and_alias_line() -> None:
    assert nearest_canonical("learnrate") == "lr"
    assert nearest_canonical("my/gradnorm_total") == "grad_norm"
    assert nearest_canonical("throughputz") == THROUGHPUT
    # Nothing near: no alias to a vital sign the name has nothing to do with (these were
    # offered "--alias CurrSamplesPerSec=lr" and "--alias reward=lr")
    assert nearest_canonical("CurrSamplesPerSec") is None
    assert nearest_canonical("reward") is None
    assert nearest_canonical("MemAllocated") == "memory"
    # The held-out loss only for a name that says held-out, the loss scale only for one that
    # says scale ("loss_avg" was offered as the val loss, "lr_scaled" as the loss scale)
    assert nearest_canonical("loss_avg") == "loss"
    assert nearest_canonical("valid_loss_avg") == "val_loss"
    assert nearest_canonical("lr_scaled") != "loss_scale"
    assert nearest_canonical("loss_smoothed") != "loss_scale"
    assert nearest_canonical("amp_scale") == "loss_scale"
    assert alias_line("my/odd tag", "loss") == "--alias 'my/odd tag=loss'"


def _tb_run(path: Path) -> None:
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(path))
    for s in range(60):
        w.add_scalar("train/loss", 3.0 - s * 0.01, s)
        w.add_scalar("acme/perf/tok_per_sec", 1000.0 + s, s)
        w.add_scalar("acme/sys/max_memory_reserved_gb", 10.0, s)
        w.add_scalar("acme/perf/iter_time_ms", 250.0, s)
        w.add_scalar("acme/strange_objective", 1.0, s)
        w.add_scalar("acme/gradnorm_total", 1.0, s)
    w.close()


def test_namespaced_vitals_from_tensorboardx(tmp_path: Path) -> None:
    """A real tensorboardX run: namespaced throughput, memory and step time mapped, their units
    recorded per tag in run.metadata and per vital sign by Run.unit."""
    _tb_run(tmp_path / "run")
    run = read_run(tmp_path / "run")
    chosen = run.metrics()
    assert chosen[THROUGHPUT] == "acme/perf/tok_per_sec"
    assert chosen[MEMORY] == "acme/sys/max_memory_reserved_gb"
    assert chosen[STEP_TIME] == "acme/perf/iter_time_ms"
    assert run.metadata["units"]["acme/sys/max_memory_reserved_gb"] == "GB"
    assert (run.unit(THROUGHPUT), run.unit(MEMORY), run.unit(STEP_TIME)) == (
        "tokens/s",
        "GB",
        "ms",
    )


def test_metrics_command_shows_alias_hint(tmp_path: Path) -> None:
    _tb_run(tmp_path / "run")
    res = runner.invoke(app, ["metrics", str(tmp_path / "run")], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.stdout.splitlines() if "acme/gradnorm_total" in ln)
    assert "--alias acme/gradnorm_total=grad_norm" in line
    # A name near no vital sign gets no alias: "strange_objective" was offered step_time.
    line = next(ln for ln in res.stdout.splitlines() if "acme/strange_objective" in ln)
    assert "(none close)" in line and "--alias" not in line
    unit_line = next(ln for ln in res.stdout.splitlines() if "max_memory_reserved_gb" in ln)
    assert " GB " in unit_line


def test_wandb_export_runtime_as_wall_time(tmp_path: Path) -> None:
    """A W&B API history export (shape of `run.history()` saved to CSV) whose only clock is
    `_runtime`, with throughput and memory under the project's namespace: the clock becomes wall
    time, so a 30-minute hang between two steps is seen."""
    n = 200
    runtime = [float(i) for i in range(n)]
    for i in range(120, n):
        runtime[i] += 1800.0
    pl.DataFrame(
        {
            "_step": list(range(n)),
            "_runtime": runtime,
            "train/loss": [3.0 - i * 0.005 for i in range(n)],
            "myproj/throughput/tokens_per_second": [5000.0] * n,
            "myproj/system/gpu_mem_gb": [20.0] * n,
        }
    ).write_csv(tmp_path / "history.csv")
    run = read_run(tmp_path / "history.csv")
    chosen = run.metrics()
    assert chosen[THROUGHPUT] == "myproj/throughput/tokens_per_second"
    assert chosen[MEMORY] == "myproj/system/gpu_mem_gb"
    loss = run.series("loss")
    assert loss.get_column("wall_time").null_count() == 0
    assert any("_runtime" in n for n in run.notes)
    from forensics.pipeline import analyze_run

    kinds = {str(f.kind) for f in analyze_run(run).findings}
    assert any("stall" in k or "hang" in k for k in kinds), kinds


def test_text_log_elapsed_field_is_wall_time(tmp_path: Path) -> None:
    """A text log without dates whose lines carry an elapsed-time field: that field is the
    clock (seconds since the job started), so the hang before the last lines is seen."""
    lines = []
    for s in range(1, 201):
        t = s * 1.5 + (3600.0 if s > 150 else 0.0)
        lines.append(f"step {s} | loss: {3.0 - s * 0.004:.4f} | lr 3e-4 | elapsed: {t:.1f}")
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    run = read_run(tmp_path / "train.log")
    loss = run.series("loss")
    assert loss.get_column("wall_time").null_count() == 0
    assert loss.get_column("wall_time")[0] == pytest.approx(1.5)
    assert any("elapsed" in n for n in run.notes)
    from forensics.pipeline import analyze_run

    kinds = {str(f.kind) for f in analyze_run(run).findings}
    assert any("stall" in k or "hang" in k for k in kinds), kinds


def test_text_log_elapsed_ms_scaled() -> None:
    from forensics.importers.text import _ELAPSED_TAG

    assert _ELAPSED_TAG.match("elapsed_ms").group("unit") == "ms"  # type: ignore[union-attr]
    assert _ELAPSED_TAG.match("elapsed time per iteration (ms)") is None


def test_metrics_command_proposes_no_alias_for_counters() -> None:
    """Megatron's counters and perplexity look like no vital sign: no --alias hint that would
    map "global batch size" to the loss because the strings look alike."""
    sample = Path(__file__).resolve().parents[1] / "sample_runs" / "loss_scale_collapse"
    res = runner.invoke(app, ["metrics", str(sample)], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    for tag in ("global batch size", "lm loss PPL", "consumed samples"):
        line = next(ln for ln in res.stdout.splitlines() if f" {tag} " in ln)
        assert "(not a vital sign)" in line and "--alias" not in line, line


def test_units_come_in_a_fixed_order(tmp_path: Path) -> None:
    """run.metadata["units"] is listed in the report: its order must not depend on polars'
    unique() (it changed from one process to the next)."""
    _tb_run(tmp_path / "run")
    units = read_run(tmp_path / "run").metadata["units"]
    by_metric = {MEMORY: 0, STEP_TIME: 1, THROUGHPUT: 2}
    tags = list(units)
    chosen = {"acme/sys/max_memory_reserved_gb": MEMORY, "acme/perf/iter_time_ms": STEP_TIME}
    chosen["acme/perf/tok_per_sec"] = THROUGHPUT
    assert tags == sorted(tags, key=lambda t: (by_metric[chosen[t]], t))


def test_metrics_command_offers_no_alias_for_eval_speeds_summaries_or_taken_signs(
    tmp_path: Path,
) -> None:
    """HF Trainer's evaluation speeds and times are no training vital sign, its end-of-run
    summary (train_loss, train_samples_per_second: one point each) is no series, and a tag
    near a vital sign the run already reads from another tag (running_loss beside loss) names
    that tag: none gets an --alias hint (eval_samples_per_second was offered as the
    throughput, train_loss as the loss)."""
    sample = Path(__file__).resolve().parents[1] / "sample_runs" / "late_overfit"
    res = runner.invoke(app, ["metrics", str(sample)], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    lines = {ln.split("│")[1].strip(): ln for ln in res.stdout.splitlines() if ln.count("│") > 3}
    for tag in ("eval_samples_per_second", "eval_steps_per_second", "eval_runtime"):
        assert "(not a vital sign)" in lines[tag] and "--alias" not in lines[tag], lines[tag]
    for tag in ("train_loss", "train_samples_per_second", "train_steps_per_second"):
        assert "(logged once)" in lines[tag] and "--alias" not in lines[tag], lines[tag]
    rows = [{"step": s, "loss": 3 - s / 100, "running_loss": 3 - s / 90} for s in range(50)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = runner.invoke(app, ["metrics", str(tmp_path)], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.stdout.splitlines() if "│ running_loss " in ln)
    assert "(loss is read from loss)" in line and "--alias" not in line, line


def test_module_series_without_a_layer_number(tmp_path: Path) -> None:
    """Per-module grad norms named without a layer number beside numbered layers. The output
    head's and the embedding's are read as grad_norm_head and grad_norm_embed; another
    module's (the final norm) is said to be unread. grad_norm/lm_head had been offered
    ``--alias grad_norm/lm_head=grad_norm_clipped`` (the head's norm judged as the whole
    model's), and grad_norm/model.embed_tokens called "not a vital sign"."""
    rng = np.random.default_rng(0)
    (tmp_path / "run").mkdir()
    with (tmp_path / "run" / "metrics.jsonl").open("w") as fh:
        for step in range(100):
            row = {"step": step, "loss": 3 - step / 100, "grad_norm": 1.0}
            row.update({f"grad_norm/model.layers.{i}": 0.3 + 0.01 * rng.random() for i in (0, 1)})
            row["grad_norm/lm_head"] = 0.25 + 0.01 * rng.random()
            row["grad_norm/model.embed_tokens"] = 0.2 + 0.01 * rng.random()
            row["grad_norm/model.norm"] = 0.05 + 0.01 * rng.random()
            fh.write(json.dumps(row) + "\n")
    res = runner.invoke(app, ["metrics", str(tmp_path / "run")], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    for tag, metric in (
        ("grad_norm/lm_head", GRAD_NORM_HEAD),
        ("grad_norm/model.embed_tokens", GRAD_NORM_EMBED),
    ):
        line = next(ln for ln in lines if tag + " " in ln)
        assert f" {metric} " in line and "--alias" not in line, line
    line = next(ln for ln in lines if "grad_norm/model.norm " in ln)
    assert "(grad_norm_layer of a module without a layer number: not read)" in line, line
    assert "--alias" not in line
    assert module_series("gradients/model.norm.weight/norm") == GRAD_NORM_LAYER
    assert module_series("act/absmax/lm_head") == "act_absmax"
    assert module_series("grad_norm/before_clip") is None  # no module named
    assert module_series("grad_norm/layers.3") is None  # a numbered layer: read


@pytest.mark.parametrize(
    ("tag", "metric"),
    [
        ("grad_norm/lm_head", GRAD_NORM_HEAD),
        ("grad_norm/model.embed_tokens", GRAD_NORM_EMBED),
        ("optim/grad/transformer.wte.weight.norm", GRAD_NORM_EMBED),  # OLMo, GPT-2 names
        ("optim/grad/lm_head.weight.norm", GRAD_NORM_HEAD),
        ("l2_norm/grad/embedding.word_embeddings.weight", GRAD_NORM_EMBED),  # NeMo
        ("l2_norm/grad/output_layer.weight", GRAD_NORM_HEAD),
        ("grad_norm/gpt_neox.embed_in", GRAD_NORM_EMBED),
        ("grad_norm/embed_out", GRAD_NORM_HEAD),
        ("grad_norm/output", GRAD_NORM_HEAD),  # Meta's Llama names
        ("grad_norm/tok_embeddings", GRAD_NORM_EMBED),
        ("grad_norm/model.layers.3.embed_proj", "grad_norm_layer"),  # a layer's, by its index
        ("grad_norm/model.norm", None),
    ],
)
def test_embedding_and_head_grad_norms(tag: str, metric: str | None) -> None:
    assert canonicalize(tag)[0] == metric


def test_metrics_command_offers_no_step_time_alias_for_a_clock(tmp_path: Path) -> None:
    """A clock that only grows (modded-nanogpt's train_time, a JSONL's elapsed_time) or an
    epoch's duration is named like a step time; offered as one (`--alias train_time=
    step_time`), every step would read slower than the one before."""
    from forensics.schema import is_clock

    for tag in ("train_time", "epoch_time", "elapsed_time", "time/elapsed", "total_time_s"):
        assert is_clock(tag), tag
    for tag in ("step_time", "train/step_time", "iteration-time", "train_step_timing"):
        assert not is_clock(tag), tag
    log = tmp_path / "run" / "metrics.jsonl"
    log.parent.mkdir()
    log.write_text(
        "".join(
            json.dumps({"step": s, "loss": 3.0 - s / 1000, "train_time": 0.2 * s}) + "\n"
            for s in range(1, 200)
        )
    )
    res = runner.invoke(app, ["metrics", str(log)], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.stdout.splitlines() if " train_time " in ln)
    assert "(a clock or an epoch's time, not a step time)" in line and "--alias" not in line
