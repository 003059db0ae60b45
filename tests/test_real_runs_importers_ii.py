"""Real logs from public repositories (../shared/real_runs) in the Importers II formats: Megatron /
Megatron-DeepSpeed SLURM logs, DeepSpeed-Chat logs, llm.c, modded-nanogpt, Megatron golden values
and MLPerf results. Expected steps and values are read off the files here, line by line, by code
independent of the importer; tests skip with a reason when ../shared is absent."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from conftest import shared_path

from forensics.errors import MultipleJobsError
from forensics.findings import FindingKind
from forensics.importers import ReadOptions, Source, discover_jobs, read_run
from forensics.importers.text import IMPORTER as TEXT


def _series(run, metric: str) -> dict[int, float]:  # noqa: ANN001
    return dict(run.series(metric).select("step", "value").iter_rows())


def _close(a: dict[int, float], b: dict[int, float]) -> bool:
    return a.keys() == b.keys() and all(
        (math.isnan(a[k]) and math.isnan(b[k])) or a[k] == pytest.approx(b[k], rel=1e-9) for k in a
    )


def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines()


def _crashes(run) -> list:  # noqa: ANN001
    return [f for f in run.import_findings if f.kind == FindingKind.CRASH]


def _text_result(path: Path):  # noqa: ANN202
    """The text importer on one file, for logs that hold no step (read_run refuses those)."""
    return TEXT.read(
        Source("text_logs", [path], path.name, path.parent, scope="file"), ReadOptions()
    )


# -- Megatron / Megatron-DeepSpeed SLURM logs -------------------------------------------------
MEGATRON = [
    "meg_ds_3d_gpt2_perf_n16-ds-off.out",
    "meg_ds_3d_gpt2_perf_n16-ds-on.out",
    "meg_gpt2_base_n16_dp1_tp4_pp16-1809577.out",
    "meg_gpt2_base_n4_dp1_tp4_pp4-1809579.out",
    "meg_gpt2_base_n8_dp1_tp4_pp8-1809562.out",
]


def _megatron_expected(path: Path, key: str) -> dict[int, float]:
    out = {}
    for ln in _lines(path):
        m = re.search(r"iteration\s+(\d+)/", ln)
        v = re.search(r"\| " + re.escape(key) + r": *([^ |]+)", ln)
        if m and v and "validation" not in ln:
            out.setdefault(int(m.group(1)), float(v.group(1)))
    return out


@pytest.mark.parametrize("name", MEGATRON)
def test_megatron_slurm_logs(name: str) -> None:
    """Every iteration line's lm loss, learning rate and grad norm, at its iteration."""
    path = shared_path("real_runs", "bigscience-megatron-experiments", name)
    run = read_run(path)
    loss_key = "lm-loss" if "ds-on" in name else "lm loss"
    expected = _megatron_expected(path, loss_key)
    assert 8 <= len(expected) <= 62
    assert _close(_series(run, "loss"), expected)
    assert _close(_series(run, "lr"), _megatron_expected(path, "learning rate"))
    gn = _megatron_expected(path, "grad norm")
    if gn and set(gn.values()) == {0.0}:  # DeepSpeed's placeholder: not a measurement
        assert not run.has("grad_norm")
    elif gn:
        assert _close(_series(run, "grad_norm"), gn)
    cancelled = "base" in name  # the three short perf runs ended with an scancel
    crashes = _crashes(run)
    assert [c.measures["reason"] for c in crashes] == (["cancelled"] if cancelled else [])
    if cancelled:
        assert crashes[0].start_step == max(expected)


def test_megatron_fp16_warmup_and_early_spike() -> None:
    """n16: loss scale 8388608 -> 32768 -> 16384 with skipped iterations; loss 12.5 -> 32.8 at 30,
    then 8.3."""
    path = shared_path(
        "real_runs", "bigscience-megatron-experiments", "meg_gpt2_base_n16_dp1_tp4_pp16-1809577.out"
    )
    run = read_run(path)
    scale = _series(run, "loss_scale")
    assert (scale[10], scale[20], scale[30]) == (8388608.0, 32768.0, 16384.0)
    loss = _series(run, "loss")
    assert loss[20] == pytest.approx(12.49319) and loss[30] == pytest.approx(32.82511)
    assert min(loss.values()) < 8.5
    assert 10 not in loss  # the all-skipped first interval printed no loss


def test_megatron_deepspeed_minus_one_loss_scale_is_not_a_value() -> None:
    """Megatron-DeepSpeed prints 'loss scale: -1' when DeepSpeed owns the scaler: not imported as a
    scale."""
    run = read_run(
        shared_path(
            "real_runs", "bigscience-megatron-experiments", "meg_ds_3d_gpt2_perf_n16-ds-on.out"
        )
    )
    assert not run.has("loss_scale")
    assert any("loss scale" in n and "DeepSpeed" in n for n in run.notes)


def test_megatron_deepspeed_zero_grad_norm_is_not_a_value() -> None:
    """With DeepSpeed running the optimizer step, Megatron-DeepSpeed prints 'grad norm: 0.000'
    on every iteration. Read as values, `compare` said the grad norm of the ds-on run 'parted
    at step 1' from the ds-off run's (67.6). Not imported, with a note; a log whose grad norm
    is 0 on some iterations only keeps every value (the n16 run's early lines print none)."""
    name = "meg_ds_3d_gpt2_perf_n16-ds-on.out"
    path = shared_path("real_runs", "bigscience-megatron-experiments", name)
    assert set(_megatron_expected(path, "grad norm").values()) == {0.0}
    run = read_run(path)
    assert not run.has("grad_norm")
    assert any("'grad norm' printed as 0 on every iteration" in n for n in run.notes)
    off = read_run(path.with_name("meg_ds_3d_gpt2_perf_n16-ds-off.out"))
    assert len(_series(off, "grad_norm")) == 62

    from forensics.compare import compare

    cmp = compare([path.with_name("meg_ds_3d_gpt2_perf_n16-ds-off.out"), path])
    assert cmp.partings.get("grad_norm", [None, None])[1] is None
    assert cmp.why[1] is not None and "the loss parted at step 5" in cmp.why[1]


def test_megatron_validation_lines() -> None:
    """The validation line at iteration 200 gives the val loss."""
    path = shared_path(
        "real_runs", "bigscience-megatron-experiments", "meg_gpt2_base_n4_dp1_tp4_pp4-1809579.out"
    )
    expected = {}
    for ln in _lines(path):
        m = re.search(r"validation loss at iteration (\d+) \| lm loss value: ([^ |]+)", ln)
        if m:
            expected[int(m.group(1))] = float(m.group(2))
    assert expected
    assert _close(_series(read_run(path), "val_loss"), expected)


def test_folder_of_slurm_logs_is_several_jobs() -> None:
    """The bigscience folder holds five SLURM logs: five jobs, never merged."""
    folder = shared_path("real_runs", "bigscience-megatron-experiments")
    assert sorted(discover_jobs(folder)) == sorted(MEGATRON)
    with pytest.raises(MultipleJobsError):
        read_run(folder)


# -- DeepSpeed-Chat -----------------------------------------------------------------------------
def test_deepspeed_reward_model_overflow_events() -> None:
    """Reward model (16 ranks): one overflow row per overflowing iteration, the reduced scale at
    it."""
    path = shared_path(
        "real_runs", "deepspeed-chat-logs", "step2_reward", "opt-350m_globalBatchSize-64.log"
    )
    lines = _lines(path)
    iters = sorted(
        {
            int(m.group(1))
            for ln in lines
            if (m := re.match(r"Grad overflow on iteration (\d+)", ln))
        }
    )
    assert len(iters) == 20
    # the rank-0 summary line of each event follows that event's "Grad overflow" lines
    reduced, current = {}, None
    for ln in lines:
        if m := re.match(r"Grad overflow on iteration (\d+)", ln):
            current = int(m.group(1))
        elif m := re.search(
            r"Overflow detected\. Skipping step\. Attempted loss scale: \S+, reducing to (\S+)", ln
        ):
            reduced[current] = float(m.group(1))
    run = read_run(path)
    assert _series(run, "overflow") == {i: 1.0 for i in iters}
    assert run.frame.filter(run.frame["tag"] == "loss_scale_reduced_to").height == 20
    assert (
        dict(
            run.frame.filter(run.frame["tag"] == "loss_scale_reduced_to")
            .select("step", "value")
            .iter_rows()
        )
        == reduced
    )
    lr = {
        int(m.group(1)): float(m.group(2))
        for ln in lines
        if (m := re.search(r"\[Rank 0\] step=(\d+), skipped=\d+, lr=\[([^,\]]+)", ln))
    }
    assert _close(_series(run, "lr"), lr)
    acc = [
        float(m.group(1))
        for ln in lines
        if (m := re.search(r"acc \(higher is better\) : (\S+)", ln))
    ]
    assert list(_series(run, "eval/acc").values()) == pytest.approx(acc)
    assert not _crashes(run)


def test_deepspeed_rlhf_overflow_and_losses() -> None:
    """RLHF actor/critic: per-step losses and rewards; OVERFLOW lines placed at the step printed
    next."""
    path = shared_path(
        "real_runs",
        "deepspeed-chat-logs",
        "step3_rlhf",
        "actor_opt-1.3b_critic_opt-350m_globalBatchSize64.log",
    )
    lines = _lines(path)
    act = {
        int(m.group(1)): float(m.group(2))
        for ln in lines
        if (m := re.match(r"epoch: \d+\|step: (\d+)\|.*act_loss: ([^|]+)\|", ln))
    }
    assert len(act) == 477
    overflow_steps, pending = set(), False
    for ln in lines:
        if "OVERFLOW!" in ln:
            pending = True
        elif pending and (m := re.match(r"epoch: \d+\|step: (\d+)\|", ln)):
            overflow_steps.add(int(m.group(1)))
            pending = False
    run = read_run(path)
    tagged = run.frame.filter(run.frame["tag"] == "act_loss")
    assert _close(dict(tagged.select("step", "value").iter_rows()), act)
    assert set(_series(run, "overflow")) == overflow_steps and len(overflow_steps) == 11
    assert (
        sum("OVERFLOW!" in ln for ln in lines) == 14
    )  # the actor and critic engines both print at 3 steps


def test_deepspeed_random_ltd_crashed_on_a_cuda_error() -> None:
    """The fp16 token-dropping run died on an illegal memory access before logging a step."""
    res = _text_result(
        shared_path(
            "real_runs", "deepspeed-chat-logs", "random_ltd_gpt_fp16", "train_with_kernel_fp16.log"
        )
    )
    crash = [f for f in res.findings if f.kind == FindingKind.CRASH]
    assert len(crash) == 1 and crash[0].measures["reason"] == "cuda"
    assert "illegal memory access" in crash[0].measures["line"]


# -- llm.c -------------------------------------------------------------------------------------
HECTOR = "llmc-gpt2-124M-hectorfcardenas"


def _llmc_stdout_expected(path: Path) -> tuple[dict[int, float], dict[int, float]]:
    loss, val, last = {}, {}, 0
    for ln in _lines(path):
        if m := re.match(r"step\s+(\d+)/\d+ \| loss\s+(\S+)", ln):
            last = int(m.group(1))
            loss[last] = float(m.group(2))
        elif m := re.match(r"val loss (\S+)", ln):
            val[last] = float(m.group(1))
    return loss, val


def test_llmc_healthy_reference_run() -> None:
    """11685414: 19560 steps, 80 val losses, 79 HellaSwag scores, values as printed."""
    path = shared_path("real_runs", HECTOR, "gpt2_train.11685414.log")
    loss, val = _llmc_stdout_expected(path)
    run = read_run(path)
    assert len(loss) == 19560 and _close(_series(run, "loss"), loss)
    assert len(val) == 80 and _close(_series(run, "val_loss"), val)
    hs = _series(run, "eval/hellaswag")
    assert len(hs) == 79 and hs[19560] == pytest.approx(0.304621)
    assert _series(run, "grad_norm")[1] == pytest.approx(15.0789)
    assert not _crashes(run)


def test_llmc_nan_run_stopped_by_the_time_limit() -> None:
    """11679010: NaN loss and norm from step 1, then SLURM's time limit mid-line at step 100."""
    path = shared_path("real_runs", HECTOR, "gpt2_train.11679010.log")
    run = read_run(path)
    loss = _series(run, "loss")
    assert sorted(loss) == list(range(1, 101)) and all(math.isnan(v) for v in loss.values())
    assert math.isnan(_series(run, "val_loss")[0])
    (crash,) = _crashes(run)
    assert crash.measures["reason"] == "time_limit" and crash.start_step == 100
    assert "DUE TO TIME LIMIT" in crash.measures["line"]


def test_llmc_750_step_run() -> None:
    """11672114: 750 healthy steps, stopped by the time limit during the HellaSwag evaluation."""
    path = shared_path("real_runs", HECTOR, "gpt2_train.11672114.log")
    loss, val = _llmc_stdout_expected(path)
    run = read_run(path)
    assert len(loss) == 750 and _close(_series(run, "loss"), loss)
    assert _close(_series(run, "val_loss"), val)
    assert [c.measures["reason"] for c in _crashes(run)] == ["time_limit"]


@pytest.mark.parametrize(
    "job, reason, text",
    [
        ("11672072", "out_of_memory", "out of memory"),
        ("11672087", "out_of_memory", "out of memory"),
        ("11672096", "out_of_memory", "out of memory"),
        ("11678978", "cuda", "misaligned address"),
        ("11679004", "cuda", "cuBLAS ERROR"),
        ("11673594", "assertion", "Assertion `total_batch_size % tokens_per_fwdbwd == 0' failed"),
    ],
)
def test_llmc_runs_that_never_trained(job: str, reason: str, text: str) -> None:
    """The runs that died before their first step: the crash and its line are found."""
    res = _text_result(shared_path("real_runs", HECTOR, f"gpt2_train.{job}.log"))
    (crash,) = [f for f in res.findings if f.kind == FindingKind.CRASH]
    assert crash.measures["reason"] == reason and text in crash.measures["line"]
    assert crash.start_step == 0 and res.frame.is_empty()


def test_llmc_folder_lists_every_slurm_log_as_a_job() -> None:
    """The nine SLURM logs are nine jobs (the .slurm script is not a log)."""
    jobs = discover_jobs(shared_path("real_runs", HECTOR))
    assert len(jobs) == 9 and all(j.startswith("gpt2_train.") for j in jobs)


def _main_log_expected(path: Path) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {"trl": {}, "tel": {}, "eval": {}, "norm": {}}
    for ln in _lines(path):
        if m := re.match(r"s:(\d+) (trl|tel|eval):(\S+)(?: lr:\S+ norm:(\S+))?", ln):
            out[m.group(2)][int(m.group(1))] = float(m.group(3))
            if m.group(4):
                out["norm"][int(m.group(1))] = float(m.group(4))
    return out


@pytest.mark.parametrize(
    "parts, n_train, n_val",
    [
        (("llmc-gpt2-124M-siddanthemani", "main.log"), 19552, 80),
        (("modded-nanogpt", "2024-10-13_llmc", "main.log"), 19560, 80),
        (
            ("modded-nanogpt", "2024-06-06_AdamW", "f66d43d7-e449-4029-8adf-e8537bab49ea.log"),
            9536,
            76,
        ),
    ],
)
def test_llmc_main_logs(parts: tuple[str, ...], n_train: int, n_val: int) -> None:
    """llm.c main.log files: trl/tel/eval/norm at their steps."""
    path = shared_path("real_runs", *parts)
    exp = _main_log_expected(path)
    run = read_run(path)
    assert len(exp["trl"]) == n_train and _close(_series(run, "loss"), exp["trl"])
    assert len(exp["tel"]) == n_val and _close(_series(run, "val_loss"), exp["tel"])
    if exp["norm"]:
        assert _close(_series(run, "grad_norm"), exp["norm"])
    if exp["eval"]:
        assert _close(_series(run, "eval/hellaswag"), exp["eval"])


def test_modded_nanogpt_muon_record() -> None:
    """Muon record: 6200 train losses and 51 val losses after 585 lines of printed source code."""
    path = shared_path(
        "real_runs", "modded-nanogpt", "2024-10-10_Muon", "eb5659d0-fb6a-49e5-a311-f1f89412f726.txt"
    )
    train, val = {}, {}
    for ln in _lines(path):
        if m := re.match(r"step:(\d+)/\d+ train_loss:(\S+) ", ln):
            train[int(m.group(1))] = float(m.group(2))
        elif m := re.match(r"step:(\d+)/\d+ val_loss:(\S+) ", ln):
            val[int(m.group(1))] = float(m.group(2))
    run = read_run(path)
    assert len(train) == 6200 and _close(_series(run, "loss"), train)
    assert len(val) == 51 and _close(_series(run, "val_loss"), val)
    assert val[6200] == pytest.approx(3.2785)
    # The step time from the training clock: its increase since the line before, or the
    # clock itself where it started over (at step 11); the mean matches the log's own
    # step_avg at the end (216.33 ms over the timed steps).
    clock = {
        int(m.group(1)): float(m.group(2))
        for ln in _lines(path)
        if (m := re.match(r"step:(\d+)/\d+ train_loss:\S+ train_time:(\d+)ms", ln))
    }
    st = _series(run, "step_time")
    assert sorted(st) == list(range(2, 6201))
    assert st[11] == clock[11] and st[2000] == clock[2000] - clock[1999]
    timed = [st[s] for s in range(11, 6201)]
    assert sum(timed) / len(timed) == pytest.approx(216.33, abs=0.05)


# -- Megatron-LM golden values ---------------------------------------------------------------------
GOLDEN = {
    # file: (loss points, last recorded step, end_step)
    ("gpt", "gpt3_15b_8t_release", "golden_values_dev_dgx_h100.json"): (10173, 50860, 51000),
    ("gpt", "gpt3_15b_8t_release", "golden_values_lts_dgx_a100.json"): (10173, 50860, 55000),
    ("bert", "bert_release", "golden_values_dev_dgx_h100.json"): (4001, 20000, 20000),
    ("t5", "t5_release", "golden_values_dev_dgx_h100.json"): (20001, 100000, 100000),
}


@pytest.mark.parametrize("parts", sorted(GOLDEN))
def test_megatron_golden_values(parts: tuple[str, str, str]) -> None:
    """lm loss at every recorded step; trailing "nan" padding is a truncated log, never a NaN
    value."""
    path = shared_path("real_runs", "megatron-lm-golden-values", *parts)
    n, last, end = GOLDEN[parts]
    doc = json.loads(path.read_text())["lm loss"]
    expected = {int(k): float(v) for k, v in doc["values"].items() if v != "nan"}
    run = read_run(path)
    loss = _series(run, "loss")
    assert len(loss) == n and max(loss) == last
    assert _close(loss, expected)
    trunc = [f for f in run.import_findings if f.kind == FindingKind.TRUNCATED_LOG]
    if last < end:
        assert (
            len(trunc) == 1 and trunc[0].start_step == last and trunc[0].measures["end_step"] == end
        )
    else:
        assert not trunc
    assert run.config  # MODEL_ARGS of model_config.yaml


def test_golden_values_folder_is_four_runs() -> None:
    """Four golden-values files (A100 and H100 of one config included) are four jobs."""
    jobs = discover_jobs(shared_path("real_runs", "megatron-lm-golden-values"))
    assert len(jobs) == 4 and all(j.endswith(".json") for j in jobs)


# -- MLPerf ----------------------------------------------------------------------------------------
MLPERF = [
    ("NVIDIA", "dgxh100_n64_nemo", "result_0.txt"),
    ("NVIDIA", "dgxh100_n64_nemo", "result_1.txt"),
    ("NVIDIA", "dgxh100_n64_nemo", "result_2.txt"),
    ("NVIDIA_CoreWeave", "coreweave_hgxh100_n448_ngc23.04_pytorch", "result_0.txt"),
    ("Intel-HabanaLabs", "HLS-Gaudi2-N32-PT", "result_0.txt"),
]


@pytest.mark.parametrize("org, system, name", MLPERF)
def test_mlperf_gpt3_results(org: str, system: str, name: str) -> None:
    """tracked_stats losses and eval log-perplexities at optimizer steps (tokens / (batch x seq
    len))."""
    path = shared_path(
        "real_runs", "mlperf-training-v3.0-gpt3-175b", org, "results", system, "gpt3", name
    )
    events = [json.loads(ln.split(":::MLLOG ", 1)[1]) for ln in _lines(path) if ":::MLLOG " in ln]
    cfg = {
        e["key"]: e["value"]
        for e in events
        if e["key"] in ("global_batch_size", "max_sequence_length")
    }
    per_step = cfg["global_batch_size"] * cfg["max_sequence_length"]
    loss = {
        e["metadata"]["step"] // per_step: e["value"]["reduced_train_loss"]
        for e in events
        if e["key"] == "tracked_stats" and "reduced_train_loss" in e["value"]
    }
    evals = {
        e["metadata"]["epoch_num"] // per_step: e["value"]
        for e in events
        if e["key"] == "eval_accuracy"
    }
    run = read_run(path)
    assert _close(_series(run, "loss"), loss)
    assert _close(_series(run, "val_loss"), evals) and len(evals) >= 22
    assert run.config["global_batch_size"] == cfg["global_batch_size"]
    assert run.metadata["mlperf_status"] == "success"
    if org == "NVIDIA":
        assert sorted(loss) == list(range(1, 289))
