"""One vocabulary: the alias table, per-layer patterns, eval names, x axis, user aliases, and the
metrics table / export built on them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest

from forensics.errors import ConfigError
from forensics.importers import ReadOptions, read_run
from forensics.run_frame import export_run, metrics_table
from forensics.schema import canonicalize, check_aliases, layer_of, x_kind_of


@pytest.mark.parametrize(
    "tag, expected",
    [
        # loss / val_loss spellings from the formats reference
        ("loss", ("loss", None)),
        ("train/loss", ("loss", None)),
        ("lm loss", ("loss", None)),
        ("Loss/train", ("loss", None)),
        ("reduced_train_loss", ("loss", None)),
        ("train_loss_step", ("loss", None)),
        ("loss_metrics/global_avg_loss", ("loss", None)),
        ("train/CrossEntropyLoss", ("loss", None)),
        ("Train/Samples/train_loss", ("loss", None)),
        ("lm loss vs samples", ("loss", None)),
        ("lm_loss_vs_samples", ("loss", None)),
        ("epoch_loss", ("loss", None)),
        ("val_loss", ("val_loss", None)),
        ("eval/loss", ("val_loss", None)),
        ("eval_loss", ("val_loss", None)),
        ("validation/epoch_loss", ("val_loss", None)),
        ("lm loss validation", ("val_loss", None)),
        ("metrics/eval/LanguageCrossEntropy", ("val_loss", None)),
        ("validation_metrics/loss", ("val_loss", None)),
        # grad norm, clipped, param norm
        ("grad_norm", ("grad_norm", None)),
        ("gnorm", ("grad_norm", None)),
        ("grad-norm", ("grad_norm", None)),
        ("optim/total_grad_norm", ("grad_norm", None)),
        ("learning/raw_grad_norm", ("grad_norm", None)),
        ("l2_norm/grad/global", ("grad_norm", None)),
        ("grad_2.0_norm_total", ("grad_norm", None)),
        ("grad/norm/total", ("grad_norm", None)),
        ("learning/grad_norm", ("grad_norm_clipped", None)),
        ("params-norm", ("param_norm", None)),
        ("learning/param_norm", ("param_norm", None)),
        # lr, loss scale
        ("learning_rate", ("lr", None)),
        ("optim/learning_rate_group0", ("lr", None)),
        ("lr-AdamW", ("lr", None)),
        ("lr-AdamW/pg1", ("lr", None)),
        ("lr-DecoupledAdamW/group0", ("lr", None)),
        ("learning-rate", ("lr", None)),
        ("loss-scale", ("loss_scale", None)),
        ("Train/Samples/loss_scale", ("loss_scale", None)),
        # throughput, memory, step time
        ("tokens_per_second", ("throughput", None)),
        ("throughput/device/tokens_per_second", ("throughput", None)),
        ("throughput(tps)", ("throughput", None)),
        ("tps", ("throughput", None)),
        ("memory/max_reserved(GiB)", ("memory", None)),
        ("mem-allocated-bytes", ("memory", None)),
        ("System/Peak GPU Memory (MB)", ("memory", None)),
        ("peak_memory_alloc", ("memory", None)),
        ("elapsed time per iteration (ms)", ("step_time", None)),
        ("iteration-time", ("step_time", None)),
        ("perf/step_time_seconds", ("step_time", None)),
        ("train_step_timing in s", ("step_time", None)),
        # per-layer patterns with a layer index
        ("l2_norm/grad/model.layers.7.mlp.weight", ("grad_norm_layer", 7)),
        ("optim/grad/transformer.blocks.3.att_proj.weight.norm", ("grad_norm_layer", 3)),
        ("grad/norm/transformer/stacked/5/mlp", ("grad_norm_layer", 5)),
        ("grad_2.0_norm/model.layers.2.self_attn.q_proj.weight", ("grad_norm_layer", 2)),
        ("grad_norm/layers.3", ("grad_norm_layer", 3)),
        ("layer_3/grad_norm", ("grad_norm_layer", 3)),
        ("grad_norm_layer_3", ("grad_norm_layer", 3)),
        ("transformer.h.11.attn/grad_norm", ("grad_norm_layer", 11)),
        ("gradients/decoder.layers.4.fc1/norm", ("grad_norm_layer", 4)),
        ("l2_norm/param/model.layers.1.mlp", ("param_norm_layer", 1)),
        ("param_norm/layers.2", ("param_norm_layer", 2)),
        ("optim/param/transformer.blocks.0.ff.weight.norm", ("param_norm_layer", 0)),
        ("act/mean/block_2", ("act_mean", 2)),
        ("act/std/layers.4", ("act_std", 4)),
        ("act/absmax/block_0", ("act_absmax", 0)),
        ("activations/layers.4/std", ("act_std", 4)),
        ("layers.6/act/absmax", ("act_absmax", 6)),
        # eval metrics
        ("eval_accuracy", ("eval/accuracy", None)),
        ("eval/hellaswag", ("eval/hellaswag", None)),
        ("eval_wer", ("eval/wer", None)),
        ("val_perplexity", ("eval/perplexity", None)),
        ("test/acc", ("eval/acc", None)),
        ("hellaswag", ("eval/hellaswag", None)),
        ("mmlu", ("eval/mmlu", None)),
        # stays unmapped (raw name kept)
        ("eval_runtime", (None, None)),
        ("eval_samples_per_second", (None, None)),
        ("eval/steps_per_second", (None, None)),
        ("optim/grad/transformer.blocks.3.att_proj.weight.max", (None, None)),  # a stat, not a norm
        ("gradients/decoder.layers.4.fc1/mean", (None, None)),
        # the output head's grad norm, named without a layer: its own vital sign
        ("l2_norm/grad/lm_head.weight", ("grad_norm_head", None)),
        ("l2_norm/grad/final_layernorm.weight", (None, None)),  # another module: unread
        ("patch3/grad_norm", (None, None)),
        ("total_flos", (None, None)),
        ("train/train_loss", (None, None)),
        ("percentage", (None, None)),
    ],
)
def test_canonicalize(tag: str, expected: tuple) -> None:
    """Raw tags from the formats reference map to the one vocabulary (or stay unmapped)."""
    assert canonicalize(tag) == expected


@pytest.mark.parametrize(
    "tag, source, expected",
    [
        ("trl", "llmc", ("loss", None)),
        ("trl", None, (None, None)),
        ("norm", "llmc", ("grad_norm", None)),
        ("train_loss", "hf_trainer_state", (None, None)),
        ("train_loss", "jsonl", ("loss", None)),
    ],
)
def test_source_scoped_aliases(tag: str, source: str | None, expected: tuple) -> None:
    """Terse or ambiguous keys map only for the source that writes them."""
    assert canonicalize(tag, source) == expected


@pytest.mark.parametrize(
    "tag, kind",
    [
        ("lm loss vs samples", "samples"),
        ("lm_loss_vs_samples", "samples"),
        ("Train/Samples/lr", "samples"),
        ("lm loss vs tokens", "tokens"),
        ("lm loss", "step"),
        ("train/loss", "step"),
    ],
)
def test_x_kind(tag: str, kind: str) -> None:
    """Samples- and token-indexed tags are recognised by name."""
    assert x_kind_of(tag) == kind


@pytest.mark.parametrize(
    "path, layer",
    [
        ("model.layers.3.mlp", 3),
        ("transformer.h.11.attn", 11),
        ("transformer.blocks.0.att", 0),
        ("layer_12", 12),
        ("block7", 7),
        ("decoder.layers.4.fc1", 4),
        ("stacked.2", 2),
        ("lm_head.weight", None),
        ("patch3", None),
        ("graph.12", None),
    ],
)
def test_layer_index(path: str, layer: int | None) -> None:
    """Layer indices come from layer/block/h/stacked path components only."""
    assert layer_of(path) == layer


def _jsonl(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(
            json.dumps({"step": s, "my/odd_loss": 1.0 / (s + 1), "block3_gn": 0.5, "lr": 1e-3})
            + "\n"
            for s in range(20)
        )
    )
    return path


def test_user_aliases(tmp_path: Path) -> None:
    """--alias raw=canonical (ReadOptions.aliases) maps tags the table does not know; per-layer
    ones keep their layer."""
    p = _jsonl(tmp_path / "m.jsonl")
    assert "loss" not in read_run(p).metrics()
    run = read_run(
        p,
        options=ReadOptions(
            aliases={"my/odd_loss": "loss", "block3_gn": "grad_norm_layer", "lr": "eval/my_lr"}
        ),
    )
    assert run.metrics()["loss"] == "my/odd_loss"
    assert run.layers("grad_norm_layer") == [3]
    assert "eval/my_lr" in run.metrics()


def test_unknown_alias_target_is_a_config_error() -> None:
    """A typo in an alias target is reported with the valid names, not silently ignored."""
    with pytest.raises(ConfigError, match="grad-norm"):
        check_aliases({"x": "grad-norm"})
    check_aliases({"x": "grad_norm", "y": "eval/hellaswag"})


def test_metrics_table(tmp_path: Path) -> None:
    """metrics_table lists raw tag, canonical name, layer, points and step range, and which tag
    is used."""
    p = tmp_path / "m.jsonl"
    lines = [
        {"step": s, "loss": 2.0, "train/loss": 2.0, "grad_norm/layers.1": 0.3, "mystery": 1}
        for s in range(10)
    ]
    lines += [{"step": s, "loss": 2.0} for s in range(10, 15)]
    p.write_text("".join(json.dumps(o) + "\n" for o in lines))
    t = metrics_table(read_run(p))
    assert t.columns[:6] == ["tag", "metric", "layer", "points", "first_step", "last_step"]
    rows = {r["tag"]: r for r in t.iter_rows(named=True)}
    assert rows["loss"]["points"] == 15 and rows["loss"]["used"] and not rows["train/loss"]["used"]
    assert (rows["loss"]["first_step"], rows["loss"]["last_step"]) == (0, 14)
    assert (
        rows["grad_norm/layers.1"]["metric"] == "grad_norm_layer"
        and rows["grad_norm/layers.1"]["layer"] == 1
    )
    assert rows["mystery"]["metric"] is None and not rows["mystery"]["used"]


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_export_round_trip(tmp_path: Path, suffix: str) -> None:
    """export_run writes the whole canonical long frame (with the run name) to parquet or csv."""
    run = read_run(_jsonl(tmp_path / "run" / "m.jsonl").parent)
    out = export_run(run, tmp_path / "out" / f"frame{suffix}")
    back = pl.read_parquet(out) if suffix == ".parquet" else pl.read_csv(out)
    assert back.height == run.frame.height == 60
    assert back.columns == ["run", *run.frame.columns]
    assert set(back.get_column("run").to_list()) == {"run"}


def test_export_refuses_other_suffixes_and_the_run_folder(tmp_path: Path) -> None:
    """Only .parquet/.csv, and never into the run folder (the evidence)."""
    run = read_run(_jsonl(tmp_path / "run" / "m.jsonl").parent)
    with pytest.raises(ConfigError, match="parquet or .csv"):
        export_run(run, tmp_path / "frame.xlsx")
    with pytest.raises(ConfigError, match="inside the run folder"):
        export_run(run, tmp_path / "run" / "frame.csv")


def test_frame_rows_are_narrow_whatever_the_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17's memory bound rests on narrow rows: the importer name, the file and the
    canonical metric are categoricals of one or two bytes, so a row of the long frame is at
    most 44 bytes (step, value and wall time 8 each, record 4, tag 4; it was 51 with
    four-byte categories). The same from an event file written by tensorboardX, from JSONL
    and from the cache's Parquet copy, and the frames of two formats stack."""
    from conftest import write_tb_run

    tb = read_run(write_tb_run(tmp_path / "tb", n=400), options=ReadOptions(cache=False))
    js = read_run(_jsonl(tmp_path / "js" / "m.jsonl").parent, options=ReadOptions(cache=False))
    for f in (tmp_path / "tb").iterdir():  # (the cache keeps only files not being written)
        os.utime(f, (1.7e9, 1.7e9))
    monkeypatch.setenv("FORENSICS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FORENSICS_NO_CACHE", raising=False)
    read_run(tmp_path / "tb")
    assert any((tmp_path / "cache").iterdir())  # the entry the second read takes
    cached = read_run(tmp_path / "tb")
    for run in (tb, js, cached):
        f = run.frame
        assert f.schema == tb.frame.schema
        per_row = sum(f.get_column(c).estimated_size() for c in f.columns) / f.height
        assert per_row <= 44.5, per_row
        phys = {c: f.get_column(c).to_physical().dtype for c in ("source", "file", "metric")}
        assert phys == {"source": pl.UInt8, "file": pl.UInt16, "metric": pl.UInt16}
    both = pl.concat([tb.frame, js.frame])
    assert both.height == tb.frame.height + js.frame.height
    assert set(both.get_column("source").cast(pl.Utf8).unique()) == {"tfevents", "jsonl"}
