"""Text logs of big-model trainers: every family, rank copies, loss-scale events, crashes, jobs.

The logs here are written line for line in the shapes the trainers print (the printing code
is cited in forensics/importers/text/*.py); the real logs under ../shared are checked in
tests/test_real_runs_importers_ii.py.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import polars as pl
import pytest

from forensics.errors import MultipleJobsError, UnknownFormatError
from forensics.findings import FindingKind, Severity
from forensics.importers import ReadOptions, discover, discover_jobs, read_run
from forensics.importers.text import IMPORTER as TEXT
from forensics.importers.text import parse_text

PREAMBLE = "using world size: 8\n" + "".join(f"  arg_{i} ........ {i}\n" for i in range(40))


def _meg_line(
    it: int,
    loss: float | None = None,
    gn: float | None = 1.5,
    scale: float = 65536.0,
    date: bool = True,
    total: int = 1000,
) -> str:
    head = f" [2024-05-01 12:00:{it % 60:02d}]" if date else ""
    parts = [
        f"{head} iteration {it:8d}/{total:8d} ",
        f" consumed samples: {it * 8:12d} ",
        f" elapsed time per iteration (ms): {1200 + it:.1f} ",
        " learning rate: 1.500000E-04 ",
        " global batch size:     8 ",
    ]
    if loss is not None:
        parts.append(f" lm loss: {loss:.6E} ")
    parts.append(f" loss scale: {scale:.1f} ")
    if gn is not None:
        parts.append(f" grad norm: {gn:.3f} ")
    parts += [" number of skipped iterations:   0 ", " number of nan iterations:   0 "]
    return "|".join(parts) + "|\n"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _series(run, metric: str) -> dict[int, float]:  # noqa: ANN001
    return dict(run.series(metric).select("step", "value").iter_rows())


def test_megatron_iteration_and_validation_lines(tmp_path: Path) -> None:
    """Megatron iteration lines (old layout first, full layout later) and validation lines import
    with steps and values."""
    text = PREAMBLE
    text += "".join(_meg_line(i, None, None, 2.0**23) for i in (10,))  # fp16 warm-up: no loss yet
    text += "".join(
        _meg_line(i, 10.0 - i / 100, None if i < 30 else 2.5 - i / 1000) for i in range(20, 210, 10)
    )
    text += (
        "-" * 60
        + (
            "\n validation loss at iteration 200 | lm loss value: 7.487306E+00 |"
            " lm loss PPL: 1.785236E+03 | \n"
        )
        + "-" * 60
        + "\n"
    )
    run = read_run(_write(tmp_path / "slurm-1809579.out", text))
    assert run.format == "text_logs"
    loss = _series(run, "loss")
    assert sorted(loss) == list(range(20, 210, 10))
    assert loss[100] == pytest.approx(9.0)
    assert _series(run, "val_loss") == {200: pytest.approx(7.487306)}
    gn = _series(run, "grad_norm")
    assert min(gn) == 30 and gn[200] == pytest.approx(2.3)
    assert _series(run, "loss_scale")[10] == 2.0**23
    assert _series(run, "step_time")[50] == pytest.approx(1250.0)
    wt = run.series("loss").get_column("wall_time")
    assert wt.null_count() == 0 and wt[0] == pytest.approx(1714564820.0)  # 2024-05-01 12:00:20 UTC


def test_megatron_rank_copies_are_one_row(tmp_path: Path) -> None:
    """The same iteration printed by several ranks (srun --label prefixes) gives one row per
    step."""
    lines = []
    for i in range(1, 51):
        for rank in (0, 1, 2, 3):
            lines.append(f"{rank}: " + _meg_line(i, 5.0 - i / 100, 1.0, date=False))
    run = read_run(_write(tmp_path / "train.log", PREAMBLE + "".join(lines)))
    s = run.series("loss")
    assert s.height == 50
    assert run.frame.filter(pl.col("metric") == "loss").height == 50


def test_megatron_resumed_in_one_log_is_a_restart(tmp_path: Path) -> None:
    """A job resumed into the same log replays steps: both copies are kept and a restart is
    reported."""
    first = "".join(_meg_line(i, 4.0 - i / 1000) for i in range(1, 31))
    second = "".join(_meg_line(i, 3.0 - i / 1000) for i in range(21, 41))
    run = read_run(
        _write(
            tmp_path / "train.log",
            PREAMBLE + first + "resuming from checkpoint at iteration 20\n" + second,
        )
    )
    restarts = [f for f in run.import_findings if f.kind == FindingKind.RESTART]
    assert len(restarts) == 1 and restarts[0].start_step == 21
    assert run.frame.filter(pl.col("metric") == "loss").height == 50
    assert _series(run, "loss")[25] == pytest.approx(3.0 - 0.025)  # the later segment wins


def test_megatron_bad_line_is_skipped_and_counted(tmp_path: Path) -> None:
    """A garbled iteration line is skipped and counted in the notes; the rest of the file
    imports."""
    text = PREAMBLE + "".join(_meg_line(i, 3.0) for i in range(1, 11))
    text += " iteration       11/    1000 | consumed samples: ### | lm loss: ??? |\n"
    text += "".join(_meg_line(i, 3.0) for i in range(12, 21))
    run = read_run(_write(tmp_path / "train.log", text))
    assert run.series("loss").height == 19
    assert any("skipped 1 malformed" in n for n in run.notes)


DS_REWARD = """***** Running training *****
Beginning of Epoch 1/1, Total Micro Batches 1840
{overflow}[2023-04-18 03:36:02,682] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, \
skipped=3, lr=[5e-05, 5e-05], mom=[(0.9, 0.95), (0.9, 0.95)]
[2023-04-18 03:36:02,683] [INFO] [timer.py:199:stop] epoch=0/micro_step=10/global_step=10, \
RunningAvgSamplesPerSec=265.3, CurrSamplesPerSec=265.4, MemAllocated=4.34GB, MaxMemAllocated=12.81GB
[2023-04-18 03:36:05,686] [INFO] [logging.py:96:log_dist] [Rank 0] step=20, skipped=3, \
lr=[4.9e-05, 4.9e-05], mom=[(0.9, 0.95), (0.9, 0.95)]
"""


def _ds_overflow_block(iteration: int, old: float, new: float, ranks: int = 4) -> str:
    out = []
    for _ in range(ranks):
        out.append("[2023-04-18 03:36:00,502] [INFO] [fused_optimizer.py:362:_update_scale] \n")
        out.append(f"Grad overflow on iteration {iteration}\n")
        out.append(
            "[2023-04-18 03:36:00,502] [INFO] [fused_optimizer.py:363:_update_scale] Reducing "
            f"dynamic loss scale from {old} to {new}\n"
        )
    out.insert(
        2,
        "[2023-04-18 03:36:00,502] [INFO] [logging.py:96:log_dist] [Rank 0] Overflow "
        f"detected. Skipping step. Attempted loss scale: {old}, reducing to {new}\n",
    )
    return "".join(out)


def test_deepspeed_overflow_lines_become_loss_scale_events(tmp_path: Path) -> None:
    """'Grad overflow on iteration N' (4 ranks) gives one overflow row at N and the new scale at
    N."""
    blocks = (
        _ds_overflow_block(0, 65536, 32768.0)
        + _ds_overflow_block(1, 32768.0, 16384.0)
        + _ds_overflow_block(4, 16384.0, 8192.0)
    )
    run = read_run(_write(tmp_path / "ds.log", DS_REWARD.format(overflow=blocks)))
    assert _series(run, "overflow") == {0: 1.0, 1: 1.0, 4: 1.0}
    assert _series(run, "loss_scale") == {0: 32768.0, 1: 16384.0, 4: 8192.0}
    assert _series(run, "lr") == {10: 5e-05, 20: 4.9e-05}
    assert run.metrics()["overflow"] == "overflow"
    assert run.metrics()["loss_scale"] == "loss_scale_reduced_to"


def test_deepspeed_overflow_without_iteration_takes_the_step_printed_next(tmp_path: Path) -> None:
    """DeepSpeed-Chat prints OVERFLOW lines before the step line that reports that step."""
    text = ""
    for step in range(6):
        if step in (2, 4):
            for _engine in ("actor", "critic"):  # two engines, same step: one event row
                text += (
                    "[2023-04-18 08:48:05,282] [INFO] [loss_scaler.py:181:update_scale] "
                    "[deepspeed] OVERFLOW! Rank 0 "
                    f"Skipping step. Attempted loss scale: {2 ** (17 - step)}, reducing to "
                    f"{2 ** (16 - step)}\n"
                )
        if step == 3:
            text += (
                "[2023-04-18 08:48:01,543] [INFO] [loss_scaler.py:188:update_scale] "
                "[deepspeed] OVERFLOW! Rank 0 "
                "Skipping step. Attempted loss scale: 16384, but hysteresis is 2. Reducing "
                "hysteresis to 1\n"
            )
        text += (
            f"epoch: 0|step: {step}|ppo_ep: 1|act_loss: {0.2 + step / 100}|cri_loss: "
            "0.12|unsuper_loss: 0.0\n"
        )
        text += f"average reward score: {step / 10}\n"
    run = read_run(_write(tmp_path / "rlhf.log", text))
    assert _series(run, "overflow") == {2: 1.0, 3: 1.0, 4: 1.0}
    assert _series(run, "loss_scale") == {2: 2.0**14, 4: 2.0**12}
    raw = run.frame.filter(pl.col("tag") == "act_loss")
    assert dict(raw.select("step", "value").iter_rows())[5] == pytest.approx(0.25)
    assert dict(run.frame.filter(pl.col("tag") == "reward").select("step", "value").iter_rows())[
        3
    ] == pytest.approx(0.3)


def test_deepspeed_overflow_in_order_when_the_log_has_no_step(tmp_path: Path) -> None:
    """Only overflow lines (rank copies included): events numbered in order, x axis said to be
    points."""
    text = ""
    for old in (65536, 32768, 16384):
        for _ in range(3):
            text += (
                "[2023-04-18 03:36:00,502] [INFO] [logging.py:96:log_dist] [Rank 0] "
                f"Overflow detected. Skipping step. Attempted loss scale: {old}, reducing "
                f"to {old // 2}\n"
            )
        text += "some other output\n"
    log = parse_text(text.encode(), "x.log")
    f = log.frame
    scale = dict(
        f.filter(pl.col("tag") == "loss_scale_reduced_to").select("step", "value").iter_rows()
    )
    assert scale == {0: 32768.0, 1: 16384.0, 2: 8192.0}
    assert sorted(f.filter(pl.col("tag") == "overflow").get_column("step").to_list()) == [0, 1, 2]
    assert log.x_kind == "points"
    assert any("no step numbers" in n for n in log.notes)


@pytest.mark.parametrize(
    "line, scale",
    [
        (
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing "
            "to 32768",
            32768.0,
        ),
        (
            "[Rank 0] Overflow detected. Skipping step. Attempted loss scale: 128.0, reducing "
            "to 64.0",
            64.0,
        ),
        (
            "[deepspeed] fp16 dynamic loss scale overflow! Rank 0 Skipping step. Attempted "
            "loss scale: 4294967296, reducing to 2147483648",
            2147483648.0,
        ),
        (
            "[INFO] [fused_optimizer.py:363:_update_scale] Reducing dynamic loss scale from "
            "2048.0 to 1024.0",
            1024.0,
        ),
    ],
)
def test_deepspeed_loss_scale_spellings(line: str, scale: float) -> None:
    """Each spelling DeepSpeed versions print gives the new scale at the step printed next."""
    before = "".join(f"step {s} | loss: 2.5 | lr: 1e-4\n" for s in (7, 8, 9))
    text = (
        before + f"[2023-04-18 03:36:00,502] [INFO] {line}\n" + "step 10 | loss: 2.4 | lr: 1e-4\n"
    )
    f = parse_text(text.encode(), "x.log").frame
    assert dict(
        f.filter(pl.col("tag") == "loss_scale_reduced_to").select("step", "value").iter_rows()
    ) == {10: scale}


LLMC_STDOUT = """+-----------------------+----------------------------------------------------+
| num_heads NH          | 12                                                 |
+-----------------------+----------------------------------------------------+
val loss 11.007921
step    1/19560 | loss 11.009662 (+nanz)| norm 15.0789 (+nanz)| lr 8.57e-07 | 4230.95 ms | \
31.9% bf16 MFU | 123917 tok/s
step    2/19560 | loss 10.956554 (+nanz)| norm 15.2427 (+nanz)| lr 1.71e-06 | 4385.98 ms | \
30.8% bf16 MFU | 119537 tok/s
val loss 10.5
evaluating HellaSwag: 0/1256evaluating HellaSwag: 10/1256HellaSwag: 2493/10042 = 0.248257
step    3/19560 | loss     nan (+nanz)| norm    nan (+nanz)| lr 2.57e-06 | 4401.95 ms | 30.7% \
bf16 MFU | 119315 tok/s
"""


def test_llmc_stdout(tmp_path: Path) -> None:
    """llm.c stdout: loss, norm, lr, ms, tok/s per step; val loss and HellaSwag at the step printed
    above."""
    run = read_run(_write(tmp_path / "gpt2_train.1.log", LLMC_STDOUT))
    loss = _series(run, "loss")
    assert loss[1] == pytest.approx(11.009662) and math.isnan(loss[3])
    assert _series(run, "grad_norm")[2] == pytest.approx(15.2427)
    assert _series(run, "throughput")[1] == 123917
    assert _series(run, "step_time")[2] == pytest.approx(4385.98)
    assert _series(run, "val_loss") == {0: pytest.approx(11.007921), 2: pytest.approx(10.5)}
    assert _series(run, "eval/hellaswag") == {2: pytest.approx(0.248257)}
    # the table of hyper-parameters at the top is not metric data
    assert run.frame.filter(pl.col("tag").cast(pl.Utf8).str.contains("num_heads")).is_empty()


def test_llmc_main_log(tmp_path: Path) -> None:
    """llm.c main.log: trl/tel/norm/eval keys map to loss, val_loss, grad_norm and HellaSwag."""
    text = (
        "s:0 tel:11.0095\ns:0 trl:11.0116 lr:0.000001 norm:14.96\n"
        "s:1 trl:10.9586 lr:0.000002 norm:15.18\ns:250 tel:6.1565\ns:250 eval:0.2437\n"
    )
    run = read_run(_write(tmp_path / "log124M" / "main.log", text))
    assert _series(run, "loss") == {0: pytest.approx(11.0116), 1: pytest.approx(10.9586)}
    assert _series(run, "val_loss") == {0: pytest.approx(11.0095), 250: pytest.approx(6.1565)}
    assert _series(run, "grad_norm")[1] == pytest.approx(15.18)
    assert _series(run, "eval/hellaswag") == {250: pytest.approx(0.2437)}
    assert run.metrics()["loss"] == "trl"


def test_llmc_main_log_appended_after_a_resume_is_a_restart(tmp_path: Path) -> None:
    """llm.c appends to main.log when it resumes: steps going back are a restart, both copies
    kept."""
    first = "".join(f"s:{s} trl:{5 - s / 100:.4f} lr:0.000100 norm:1.00\n" for s in range(0, 60))
    second = "".join(f"s:{s} trl:{4 - s / 100:.4f} lr:0.000100 norm:1.00\n" for s in range(40, 80))
    run = read_run(_write(tmp_path / "main.log", first + second))
    (restart,) = [f for f in run.import_findings if f.kind == FindingKind.RESTART]
    assert restart.start_step == 40
    assert _series(run, "loss")[50] == pytest.approx(3.5)
    assert run.frame.filter(pl.col("metric") == "loss").height == 100


def test_nanogpt_and_modded_nanogpt(tmp_path: Path) -> None:
    """nanoGPT iter/eval lines and modded-nanogpt step:N/M lines (after the script source it
    prints)."""
    nano = (
        "step 0: train loss 10.9876, val loss 10.9901\n"
        "iter 0: loss 10.9812, time 2345.67ms, mfu -100.00%\n"
        "iter 10: loss 9.1234, time 123.45ms, mfu 35.12%\n"
        "step 250: train loss 3.9876, val loss 4.0123\n"
    )
    run = read_run(_write(tmp_path / "a" / "train.log", nano))
    assert _series(run, "loss") == {0: pytest.approx(10.9812), 10: pytest.approx(9.1234)}
    assert _series(run, "val_loss") == {0: pytest.approx(10.9901), 250: pytest.approx(4.0123)}
    source = (
        "import torch\nprint(f'step:{step}/{args.num_iterations} val_loss:{val_loss:.4f}')\n"
        + "=" * 40
        + "\n"
    )
    modded = source + (
        "step:0/20 val_loss:10.9264 train_time:285ms step_avg:nanms\n"
        "step:1/20 train_loss:10.9184 train_time:74701ms step_avg:nanms\n"
        "step:2/20 train_loss:8.6834 train_time:75965ms step_avg:37982.50ms\n"
    )
    run = read_run(_write(tmp_path / "b" / "log.txt", modded))
    assert _series(run, "loss") == {1: pytest.approx(10.9184), 2: pytest.approx(8.6834)}
    assert _series(run, "val_loss") == {0: pytest.approx(10.9264)}


def _modded_lines(times: list[float]) -> str:
    """modded-nanogpt lines for steps 1.. whose clock reads ``times`` (ms), a val line at 0."""
    out = ["step:0/99 val_loss:10.9264 train_time:285ms step_avg:nanms\n"]
    for s, t in enumerate(times, start=1):
        out.append(
            f"step:{s}/99 train_loss:{10 - s / 10:.4f} train_time:{t:.0f}ms step_avg:nanms\n"
        )
        if s == 5:  # (a val line between two training lines: the clock is not running in it)
            out.append(f"step:5/99 val_loss:9.5 train_time:{t + 2:.0f}ms step_avg:nanms\n")
    return "".join(out)


def test_modded_nanogpt_step_time_from_its_training_clock(tmp_path: Path) -> None:
    """train_time is a clock summed over the run: a step's time is its increase since the
    training line before; the clock's restart after the warm-up steps (a value lower than the
    one before) counts from zero; the first training line has nothing to measure from."""
    times = [74701, 75965, 76178, 76393, 76607, 76822, 77034, 77248, 77462, 77676, 214, 428]
    run = read_run(_write(tmp_path / "m" / "log.txt", _modded_lines(times)))
    got = _series(run, "step_time")
    assert sorted(got) == list(range(2, 13))
    assert got[2] == pytest.approx(1264)
    assert got[6] == pytest.approx(76822 - 76607)  # (the val line at step 5 is not a step)
    assert got[11] == pytest.approx(214)  # the restart: the clock counts from zero again
    assert got[12] == pytest.approx(214)
    assert run.unit("step_time") == "ms"


def test_modded_nanogpt_slowdown_is_a_throughput_drop(tmp_path: Path) -> None:
    """A modded-nanogpt run whose steps take 2.5x as long from step 1,500 on: found from the
    training clock alone (the log has no other timing)."""
    from forensics.pipeline import analyze_run

    t, times = 0.0, []
    for s in range(1, 3001):
        t += 214 + (s % 3) if s < 1500 else 535 + (s % 3)
        times.append(t)
    run = read_run(_write(tmp_path / "slow" / "log.txt", _modded_lines(times)))
    diag = analyze_run(run)
    drops = [f for f in diag.findings if f.kind.value == "throughput_drop"]
    assert len(drops) == 1 and drops[0].start_step == 1500, [f.summary for f in diag.findings]


def test_torchtitan_ansi_colours_and_thousands_separators(tmp_path: Path) -> None:
    """torchtitan lines with ANSI colours, units and '6,123' thousands separators."""
    c = "\x1b[31m", "\x1b[32m", "\x1b[39m"
    lines = "".join(
        f"[rank0]:[titan] 2025-01-01 12:00:{s:02d},000 - root - INFO - {c[0]}step: {s:2d}  "
        f"{c[1]}loss: {8.0 - s / 10:7.4f}  "
        f"{c[0]}grad_norm: {1.2 + s / 100:7.4f}  memory: 30.12GiB(38.02%)  tps: "
        f"6,{100 + s:03d}  tflops: 311.20  mfu: 31.46%{c[2]}\n"
        for s in range(1, 11)
    )
    run = read_run(_write(tmp_path / "titan.log", "Starting job: llama3 8B\n" + lines))
    assert _series(run, "loss")[5] == pytest.approx(7.5)
    assert _series(run, "grad_norm")[10] == pytest.approx(1.3)
    assert _series(run, "throughput")[3] == 6103
    assert _series(run, "memory")[1] == pytest.approx(30.12)


def test_fairseq_json_progress_values_as_strings(tmp_path: Path) -> None:
    """fairseq --log-format json: string values, num_updates as the x axis, valid_ keys as
    validation."""

    def inner(u: int) -> str:
        d = {
            "epoch": 1,
            "update": round(u / 1000, 3),
            "loss": f"{9.876 - u / 1000:.3f}",
            "nll_loss": "9.876",
            "ppl": "939.12",
            "wps": "12345.6",
            "ups": "3.01",
            "num_updates": str(u),
            "lr": "0.0001",
            "gnorm": "1.234",
            "loss_scale": "128",
            "train_wall": "33",
        }
        return f"2021-03-01 12:00:00 | INFO | train_inner | {json.dumps(d)}\n"

    valid = {"epoch": 1, "valid_loss": "9.1", "valid_ppl": "550.2", "valid_num_updates": "300"}
    text = (
        "".join(inner(u) for u in (100, 200, 300))
        + f"2021-03-01 12:30:00 | INFO | valid | {json.dumps(valid)}\n"
    )
    run = read_run(_write(tmp_path / "train.log", text))
    assert _series(run, "loss") == {
        100: pytest.approx(9.776),
        200: pytest.approx(9.676),
        300: pytest.approx(9.576),
    }
    assert _series(run, "grad_norm")[200] == pytest.approx(1.234)
    assert _series(run, "val_loss") == {300: pytest.approx(9.1)}
    assert _series(run, "loss_scale")[100] == 128


def test_composer_file_logger(tmp_path: Path) -> None:
    """Composer FileLogger: [metric][batch=N] lines per metric; hyper-parameters go to the
    config."""
    text = "[hyperparameter]: lr: 0.0006 \n[hyperparameter]: run_name: mpt-125m \n"
    text += "".join(
        f"[metric][batch={b}]: loss/train/total: {3.0 - b / 100} \n[metric][batch={b}]: "
        "throughput/tokens_per_sec: 12345.5 \n"
        for b in range(1, 6)
    )
    text += "[metric][batch=5]: metrics/eval/LanguageCrossEntropy: 2.9 \n"
    run = read_run(_write(tmp_path / "logs-rank0.txt", text))
    assert _series(run, "loss")[3] == pytest.approx(2.97)
    assert _series(run, "throughput")[1] == pytest.approx(12345.5)
    assert _series(run, "val_loss") == {5: pytest.approx(2.9)}
    assert run.config["lr"] == pytest.approx(0.0006) and run.config["run_name"] == "mpt-125m"


def test_olmo_console_blocks(tmp_path: Path) -> None:
    """OLMo prints a [step=N/M] header, then one indented name=value line per metric."""
    text = "".join(
        f"[step={s}/739328]\n"
        f"    train/CrossEntropyLoss={3.0 - s / 100:.4f}\n    "
        f"optim/total_grad_norm={0.5 + s / 1000:.4f}\n"
        f"    throughput/device/tokens_per_second=9,{870 + s:03d}\n"
        for s in range(10, 60, 10)
    )
    run = read_run(_write(tmp_path / "olmo.log", text))
    assert _series(run, "loss") == {s: pytest.approx(3.0 - s / 100) for s in range(10, 60, 10)}
    assert _series(run, "grad_norm")[30] == pytest.approx(0.53)
    assert _series(run, "throughput")[20] == 9890


def _mllog(key: str, value, **meta) -> str:  # noqa: ANN001
    return (
        ":::MLLOG "
        + json.dumps(
            {
                "namespace": "",
                "time_ms": 1684040000000,
                "event_type": "POINT_IN_TIME",
                "key": key,
                "value": value,
                "metadata": {"file": "x.py", "lineno": 1, **meta},
            }
        )
        + "\n"
    )


def test_mlperf_lines(tmp_path: Path) -> None:
    """MLPerf :::MLLOG lines: token counts become optimizer steps; gpt3 eval_accuracy is a
    validation loss."""
    text = (
        _mllog("submission_benchmark", "gpt3")
        + _mllog("global_batch_size", 4)
        + _mllog("max_sequence_length", 8)
    )
    text += "".join(
        _mllog(
            "tracked_stats",
            {"train_step_timing": 12.1, "reduced_train_loss": 2.8 - s / 100},
            step=s * 32,
        )
        for s in range(1, 7)
    )
    text += _mllog("eval_accuracy", 2.75, epoch_num=6 * 32) + _mllog(
        "run_stop", None, status="success"
    )
    run = read_run(_write(tmp_path / "result_0.txt", text))
    assert _series(run, "loss") == {s: pytest.approx(2.8 - s / 100) for s in range(1, 7)}
    assert _series(run, "val_loss") == {6: pytest.approx(2.75)}
    assert run.config["global_batch_size"] == 4
    assert run.metadata["mlperf_status"] == "success"


GENERIC = """Loading model...
step 100 | loss: 2.31 | lr 3e-4 | norm: 0.41 | tok/s 12,345
step 110 | loss: 2.29 | lr 3e-4 | norm: 0.40 | tok/s 12,400
Saving checkpoint at step 110 to /ckpt
step 120 | loss: 2.27 | lr 3e-4 | norm: 0.43 | tok/s 12,390
"""


@pytest.mark.parametrize(
    "text, step, loss",
    [
        (GENERIC, 120, 2.27),
        (
            "".join(
                f"Step {s} | loss:{1.5 - s / 1000} lr:2e-05 tokens_per_second_per_gpu:1234.5 "
                "peak_memory_alloc:20.1\n"
                for s in (10, 20, 30)
            ),
            20,
            1.48,
        ),
        (
            "".join(
                f"[it {s}] loss={2.0 - s / 1000}, grad_norm=0.8, lr=1e-4\n" for s in (100, 200, 300)
            ),
            300,
            1.7,
        ),
    ],
)
def test_generic_key_value_fallback(tmp_path: Path, text: str, step: int, loss: float) -> None:
    """A format nobody listed still imports when it prints one step per line with key-value
    pairs."""
    run = read_run(_write(tmp_path / "custom.log", text))
    assert _series(run, "loss")[step] == pytest.approx(loss)
    assert run.has("lr")


def test_generic_issue_example_maps_norm_and_throughput(tmp_path: Path) -> None:
    """`norm` and `tok/s` in a generic step line are grad norm and throughput; prose lines are
    ignored."""
    run = read_run(_write(tmp_path / "custom.log", GENERIC))
    assert _series(run, "grad_norm") == {100: 0.41, 110: 0.40, 120: 0.43}
    assert _series(run, "throughput")[110] == 12400


CRASH_TAILS = {
    "out_of_memory": (
        'Traceback (most recent call last):\n  File "train.py", line 10, in <module>\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    ),
    "nccl": (
        "[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation"
        " timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 600000 milliseconds before"
        " timing out.\n"
    ),
    "cuda": "RuntimeError: CUDA error: an illegal memory access was encountered\n",
    "assertion": (
        'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n'
        "AssertionError: batch size must divide the number of tokens\n"
    ),
    "time_limit": (
        "slurmstepd: error: *** JOB 11679010 ON g002 CANCELLED AT 2024-10-10T18:59:58"
        " DUE TO TIME LIMIT ***\n"
    ),
    "cancelled": (
        "slurmstepd: error: *** JOB 1809579 ON r8i3n1 CANCELLED AT 2021-05-23T08:45:57 ***\n"
    ),
    "killed": (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "  exitcode  : -9 (pid: 4242)\n  traceback : Signal 9 (SIGKILL) received by PID 4242\n"
    ),
    "traceback": (
        'Traceback (most recent call last):\n  File "train.py", line 99, in <module>\n'
        "    main()\nValueError: could not convert string to float: 'abc'\n"
    ),
}
# Ended from outside (the scheduler's limit, a cancel): the run is unfinished, not failed.
STOPPED_FROM_OUTSIDE = {"time_limit", "cancelled"}


@pytest.mark.parametrize("reason", sorted(CRASH_TAILS))
def test_crash_at_the_end_of_a_log(tmp_path: Path, reason: str) -> None:
    """The end of the log says how the job ended: a crash finding at the last logged step,
    critical for an error or a kill, a warning for a time limit or a cancel (which says the
    job was ended from outside: no error, an unfinished run)."""
    text = PREAMBLE + "".join(_meg_line(i, 3.0) for i in range(1, 21)) + CRASH_TAILS[reason]
    run = read_run(_write(tmp_path / "train.log", text))
    crashes = [f for f in run.import_findings if f.kind == FindingKind.CRASH]
    assert len(crashes) == 1
    f = crashes[0]
    outside = reason in STOPPED_FROM_OUTSIDE
    assert f.severity == (Severity.WARNING if outside else Severity.CRITICAL)
    assert f.metric is None and f.start_step == 20
    assert ("not an error: it was ended from outside" in f.summary) == outside
    assert f.measures["reason"] == reason
    assert (
        f.measures["line"] in CRASH_TAILS[reason].replace("\n", " ")
        or f.measures["line"] in CRASH_TAILS[reason]
    )
    assert len(f.measures["line"]) <= 200
    assert "after step 20" in f.summary


def test_crash_step_is_written_with_digits_grouped(tmp_path: Path) -> None:
    """The crash sentence writes the last step as the report writes steps (1,200)."""
    text = PREAMBLE + "".join(_meg_line(i, 3.0) for i in range(1, 1201)) + CRASH_TAILS["nccl"]
    run = read_run(_write(tmp_path / "train.log", text))
    (f,) = [f for f in run.import_findings if f.kind == FindingKind.CRASH]
    assert f.start_step == 1200 and "after step 1,200" in f.summary


def test_no_crash_when_the_job_ends_cleanly_or_survived_an_error(tmp_path: Path) -> None:
    """A traceback printed mid-run and survived is not how the job ended; a clean end has no
    crash."""
    text = PREAMBLE + "".join(_meg_line(i, 3.0) for i in range(1, 11)) + CRASH_TAILS["traceback"]
    text += (
        "".join(_meg_line(i, 3.0) for i in range(11, 21))
        + "[after training is done] exiting program\n"
    )
    run = read_run(_write(tmp_path / "train.log", text))
    assert not [f for f in run.import_findings if f.kind == FindingKind.CRASH]


def test_each_log_file_is_its_own_job(tmp_path: Path) -> None:
    """A folder of SLURM logs holds several jobs: listed, never merged."""
    for job in (101, 102):
        _write(
            tmp_path / f"slurm-{job}.out",
            PREAMBLE + "".join(_meg_line(i, 3.0) for i in range(1, 11)),
        )
    jobs = discover_jobs(tmp_path)
    assert sorted(jobs) == ["slurm-101.out", "slurm-102.out"]
    with pytest.raises(MultipleJobsError):
        read_run(tmp_path)


def test_text_log_inside_a_tensorboard_folder_joins_its_job(tmp_path: Path) -> None:
    """A stdout log beside the TensorBoard files of the same job is part of that job."""
    from conftest import write_tb_run

    write_tb_run(tmp_path / "runs", n=50, spike_at=None)
    _write(
        tmp_path / "runs" / "stdout.log",
        PREAMBLE + "".join(_meg_line(i, 3.0, scale=1024.0) for i in range(1, 11)),
    )
    jobs = discover_jobs(tmp_path)
    assert len(jobs) == 1
    run = read_run(tmp_path)
    assert {"tfevents", "text_logs"} <= set(run.format.split("+"))
    assert run.has("loss_scale")


def test_compressed_log_is_read(tmp_path: Path) -> None:
    """A gzip-compressed text log reads like the plain one."""
    p = tmp_path / "train.log.gz"
    p.write_bytes(
        gzip.compress(
            (PREAMBLE + "".join(_meg_line(i, 3.0 - i / 100) for i in range(1, 11))).encode()
        )
    )
    run = read_run(p)
    assert _series(run, "loss")[10] == pytest.approx(2.9)


def test_prose_text_is_not_a_training_log(tmp_path: Path) -> None:
    """A text file without metric lines is not claimed by the text importer."""
    p = _write(
        tmp_path / "notes.txt",
        "We trained the model for 3 epochs.\nThe step size was tuned by hand.\n",
    )
    assert not TEXT.discover(tmp_path, [p])
    with pytest.raises(UnknownFormatError):
        read_run(p)


def test_importer_never_writes_into_the_run_folder(tmp_path: Path) -> None:
    """Reading a text log leaves its folder untouched."""
    from conftest import snapshot

    _write(tmp_path / "train.log", PREAMBLE + "".join(_meg_line(i, 3.0) for i in range(1, 11)))
    before = snapshot(tmp_path)
    read_run(tmp_path)
    assert snapshot(tmp_path) == before


def _golden(tmp_path: Path, n_steps: int, recorded: int, sparse_every: int = 10) -> Path:
    steps = list(range(1, n_steps + 1, 5))
    loss = {str(s): (round(10.0 - s / 1000, 5) if s <= recorded else "nan") for s in steps}
    it_time = {
        str(s): (0.3 if (i % sparse_every == 0 and s <= recorded) else "nan")
        for i, s in enumerate(steps)
    }
    doc = {
        "lm loss": {"start_step": 1, "end_step": n_steps, "step_interval": 5, "values": loss},
        "iteration-time": {
            "start_step": 1,
            "end_step": n_steps,
            "step_interval": 5,
            "values": it_time,
        },
    }
    p = tmp_path / "golden_values_dev_dgx_h100.json"
    p.write_text(json.dumps(doc, indent=4))
    (tmp_path / "model_config.yaml").write_text(
        "MODEL_ARGS:\n  --micro-batch-size: 4\n  --lr: 0.0003\n"
    )
    return p


def test_golden_values_trailing_nan_is_a_truncated_log(tmp_path: Path) -> None:
    """Golden values: trailing "nan" padding is missing data (truncated_log), not NaN losses."""
    p = _golden(tmp_path, 1000, 800)
    assert [s.importer for s in discover(tmp_path)] == ["megatron_golden"]
    run = read_run(p)
    loss = run.series("loss")
    assert loss.get_column("step").max() == 796 and not loss.get_column("value").is_nan().any()
    trunc = [f for f in run.import_findings if f.kind == FindingKind.TRUNCATED_LOG]
    assert len(trunc) == 1 and trunc[0].start_step == 796 and trunc[0].measures["end_step"] == 1000
    assert run.series("step_time").height == 16  # the sparse metric keeps only its recorded points
    assert run.config["micro-batch-size"] == 4


def test_golden_values_complete_file_has_no_truncation(tmp_path: Path) -> None:
    """A golden-values file recorded to its end_step is not truncated."""
    run = read_run(_golden(tmp_path, 1001, 1001))
    assert not [f for f in run.import_findings if f.kind == FindingKind.TRUNCATED_LOG]
    assert run.series("loss").height == 201


def test_user_aliases_apply_to_text_logs(tmp_path: Path) -> None:
    """A user alias maps a text-log key the vocabulary does not know."""
    p = _write(tmp_path / "train.log", PREAMBLE + "".join(_meg_line(i, 3.0) for i in range(1, 6)))
    run = read_run(
        p, options=ReadOptions(verify_crc=True, aliases={"global batch size": "eval/batch_size"})
    )
    assert _series(run, "eval/batch_size") == {i: 8.0 for i in range(1, 6)}
