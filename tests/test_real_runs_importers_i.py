"""Real logs from public repositories (../shared/real_runs): every TensorBoard, HF trainer_state,
LLaMA-Factory JSONL and Lightning CSV file imports, with counts and values read off the files."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import shared_path

from forensics.errors import MultipleJobsError
from forensics.importers import ReadOptions, read_run

HF_RUNS = {
    # folder: (loss points, first loss, last loss, last step)
    "hf-trainer-alpaca-repro": (1218, 1.5021, 0.4774, 1218),
    "hf-trainer-baize-tcm-lora": (6687, 2.2619, 0.0889, 6687),
    "hf-trainer-metamath-sft": (128, 1.0372, 0.5728, 128),
    "hf-trainer-tinyllama-sft": (186, 2.0762, 1.025, 2790),
    "hf-trainer-whisper-large-v2-ja": (200, 0.3048, 0.0002, 5000),
    "llamafactory-luojiu-7b-qlora-cpt": (1742, 1.7484, 1.3703, 8710),
    "llamafactory-mistral7b-translator-lora": (866, 2.4977, 0.1333, 8660),
}


def _numeric_cells(entries: list[dict]) -> int:
    """Count the numbers a log_history holds, the step excluded: what the importer must turn into
    rows."""
    return sum(
        1
        for e in entries
        for k, v in e.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
    )


@pytest.mark.parametrize("folder", sorted(HF_RUNS))
def test_hf_trainer_states(folder: str) -> None:
    """Each trainer_state.json: loss points, first/last values and every number of log_history
    kept."""
    root = shared_path("real_runs", folder)
    n, first, last, last_step = HF_RUNS[folder]
    run = read_run(root)
    loss = run.series("loss")
    assert loss.height == n
    assert loss.get_column("value")[0] == first and loss.get_column("value")[-1] == last
    assert loss.get_column("step")[-1] == last_step
    state_path = root / (run.metadata["trainer_state"])
    hist = json.loads(state_path.read_text())["log_history"]
    hf_rows = run.frame.filter(pl.col("source") == "hf_trainer_state")
    assert hf_rows.height == _numeric_cells(hist)


def test_tinyllama_eval_entries() -> None:
    """TRL's eval entries: 14 eval_loss points ending on the 1.122 plateau."""
    run = read_run(shared_path("real_runs", "hf-trainer-tinyllama-sft"))
    val = run.series("val_loss")
    assert val.height == 14 and val.get_column("value")[-1] == pytest.approx(1.1219, abs=1e-4)
    assert run.metrics()["eval/mean_token_accuracy"] == "eval_mean_token_accuracy"


def test_whisper_uses_the_top_level_copy_and_reads_wer() -> None:
    """Whisper: last-checkpoint/ holds the same step, the top-level copy is read; eval_wer ->
    eval/wer."""
    run = read_run(shared_path("real_runs", "hf-trainer-whisper-large-v2-ja"))
    assert run.metadata["trainer_state"] == "trainer_state.json"
    assert run.series("eval/wer").height == 5 and run.series("val_loss").height == 5
    assert any("last-checkpoint/trainer_state.json" in n for n in run.notes)


def test_mistral_checkpoints_and_grad_norm_peak() -> None:
    """checkpoint-4000 is listed for rollback advice; grad norm peaks at 16.25 at step 50."""
    run = read_run(shared_path("real_runs", "llamafactory-mistral7b-translator-lora"))
    assert run.metadata["checkpoints"] == [4000]
    gn = run.series("grad_norm")
    peak = gn.filter(pl.col("value") == gn.get_column("value").max())
    assert peak.get_column("step").to_list() == [50] and peak.get_column("value")[
        0
    ] == pytest.approx(16.2518, abs=1e-4)


def test_llama_factory_zero_throughput_is_not_a_vital_sign() -> None:
    """LLaMA-Factory writes "throughput": "0.00" and "total_tokens": 0 on every line when it
    does not count tokens. Read as values, the mistral run's checklist answered "Does
    data-loading throughput reach the expected level?" with "pass: median 0 tokens/s". Left
    out with a note; the checklist says it is not measurable."""
    root = shared_path("real_runs", "llamafactory-mistral7b-translator-lora")
    objs = [json.loads(x) for x in (root / "trainer_log.jsonl").read_text().splitlines()]
    assert {o["throughput"] for o in objs} == {"0.00"} and {o["total_tokens"] for o in objs} == {0}
    run = read_run(root)
    assert not run.has("throughput")
    tags = set(run.frame.get_column("tag").cast(pl.Utf8).unique().to_list())
    assert not tags & {"throughput", "total_tokens"}
    assert any("throughput and total_tokens printed as 0 on every line" in n for n in run.notes)
    from forensics.pipeline import analyze_run

    diag = analyze_run(run)
    answers = [
        (c.status, c.evidence)
        for phase in diag.phases
        for c in phase.items
        if "throughput" in c.question
    ]
    assert answers and all(st == "not measurable" for st, _ in answers), answers


@pytest.mark.parametrize(
    "folder, lines",
    [("llamafactory-luojiu-7b-qlora-cpt", 1743), ("llamafactory-mistral7b-translator-lora", 867)],
)
def test_llama_factory_jsonl_alone_and_beside_trainer_state(folder: str, lines: int) -> None:
    """trainer_log.jsonl reads on its own; in its folder it is compared with trainer_state.json and
    noted."""
    root = shared_path("real_runs", folder)
    log = root / "trainer_log.jsonl"
    objs = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    assert len(objs) == lines
    alone = read_run(log)
    losses = [o["loss"] for o in objs if o.get("loss") is not None]
    assert alone.series("loss").get_column("value").to_list() == losses
    assert alone.series("loss").get_column("step").to_list() == [
        o["current_steps"] for o in objs if o.get("loss") is not None
    ]
    both = read_run(root)
    assert any("trainer_log.jsonl" in n and "hold the same metrics" in n for n in both.notes)
    assert both.series("loss").height == len(losses)


def test_tensorboard_real_event_files_match_tbparse() -> None:
    """The HF callback's three event files (one in an hparams sub-folder) equal tbparse value for
    value."""
    from tbparse import SummaryReader

    runs = shared_path("real_runs", "tfevents-hf-trainer-japanese-gpt2-medium", "runs")
    run = read_run(runs)
    ref = SummaryReader(str(runs)).scalars
    assert run.frame.height == len(ref) == 30
    ours = run.frame.select("tag", "step", "value").sort("tag", "step")
    theirs = pl.DataFrame(
        {
            "tag": ref["tag"].to_numpy().astype(str),
            "step": ref["step"].to_numpy().astype(np.int64),
            "value": ref["value"].to_numpy().astype(np.float64),
        }
    ).sort("tag", "step")
    assert ours.equals(theirs)
    assert run.series("loss").get_column("value")[0] == pytest.approx(0.4742, abs=1e-6)
    assert run.series("eval/accuracy").get_column("value").to_list() == [
        pytest.approx(0.999054, abs=1e-6)
    ]
    assert run.config["num_train_epochs"] == 100  # hparams from the sub-folder


def test_tensorboard_with_trainer_state_is_one_run() -> None:
    """The output folder (event files + trainer_state.json) is one job; the JSON copy wins on a
    tie."""
    run = read_run(shared_path("real_runs", "tfevents-hf-trainer-japanese-gpt2-medium"))
    assert set(run.format.split("+")) == {"tfevents", "hf_trainer_state"}
    assert run.metrics()["loss"] == "loss" and run.series("loss").get_column("value")[0] == 0.4742
    assert run.metrics()["val_loss"] == "eval/loss"  # only the event files have the eval
    # The note names the source that still gives those ("it still gives" had read as the
    # trainer_state.json just named, the source used).
    (note,) = [n for n in run.notes if "hold the same metrics" in n]
    assert note.endswith("; the tfevents source still gives eval/accuracy, val_loss")


LIGHTNING = {
    # version: (csv data rows, loss points, first step, last step in file)
    0: (2834, 2814, 49, 140739),
    5: (1134, 1126, 140749, 197035),
    7: (220, 220, 49, 10999),
    8: (1511, 1511, 49, 75549),
}


def _csv_cells(path: Path) -> tuple[int, int]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    cells = sum(1 for r in rows for k, v in r.items() if k != "step" and v not in ("", None))
    return len(rows), cells


def test_lightning_parent_folder_lists_its_versions() -> None:
    """The lightning_logs parent holds four jobs: MultipleJobsError lists them (version_5
    resumes version_0: one run of the three, unless stitching is off; tests/test_chains.py)."""
    folder = shared_path("real_runs", "lightning-csv-slm-wikitext103")
    with pytest.raises(MultipleJobsError) as err:
        read_run(folder, options=ReadOptions(stitch=False))
    assert err.value.jobs == [f"lightning_logs/version_{v}" for v in (0, 5, 7, 8)]
    with pytest.raises(MultipleJobsError) as err:
        read_run(folder)
    assert err.value.jobs == [f"lightning_logs/version_{v}" for v in ("0+version_5", 7, 8)]


@pytest.mark.parametrize("version", sorted(LIGHTNING))
def test_lightning_versions(version: int) -> None:
    """Each version imports alone: every non-empty cell is a row, steps and config as in the
    files."""
    folder = shared_path(
        "real_runs", "lightning-csv-slm-wikitext103", "lightning_logs", f"version_{version}"
    )
    rows, loss_points, first, last = LIGHTNING[version]
    n_rows, n_cells = _csv_cells(folder / "metrics.csv")
    assert n_rows == rows
    run = read_run(folder)
    assert run.frame.height == n_cells
    assert run.series("loss").height == loss_points
    assert (
        run.frame.get_column("step").min() == first and run.frame.get_column("step").max() == last
    )
    assert run.config["d_model"] == 768 and "num_epochs" in run.config
    assert run.import_findings == []


def test_lightning_v5_resumes_v0() -> None:
    """v5 continues where v0 stopped (step 140749 after 140739) with num_epochs raised to 20; val
    loss rises."""
    logs = shared_path("real_runs", "lightning-csv-slm-wikitext103", "lightning_logs")
    v0, v5 = read_run(logs / "version_0"), read_run(logs / "version_5")
    assert v5.frame.get_column("step").min() > v0.frame.get_column("step").max()
    assert (v0.config["num_epochs"], v5.config["num_epochs"]) == (10, 20)
    assert v0.series("val_loss").get_column("value")[-1] == pytest.approx(3.5705, abs=1e-4)
    assert v5.series("val_loss").get_column("value")[-1] == pytest.approx(3.6042, abs=1e-4)
    v7 = read_run(logs / "version_7").series("loss").get_column("value")
    assert abs(float(np.median(v7.to_numpy())) - 7.6) < 0.1 and not any(math.isnan(x) for x in v7)
