"""The checkpoints a trainer's stdout says it saved (Megatron-LM, DeepSpeed, llm.c, HF
Trainer, Lightning): evidence in the log of where a rollback can go back to, wherever the
checkpoints were written. Before, such a log got "assuming a checkpoint every 500 steps"."""

from __future__ import annotations

from pathlib import Path

from conftest import ROOT, shared_path

from forensics.evidence import Evidence
from forensics.importers import read_run
from forensics.importers.text.checkpoint_lines import saved_steps

MEGATRON = ROOT / "sample_runs" / "loss_scale_collapse" / "train.log"


def test_each_trainers_save_line() -> None:
    lines = {
        "megatron": (
            b"saving checkpoint at iteration     500 to /ckpt\n"
            b"  successfully saved checkpoint from iteration     500 to /ckpt [ t 1/1, p 1/1 ]\n"
            b"  successfully saved checkpoint at iteration    1000 to /ckpt\n"
        ),
        "deepspeed": (
            b"[2023-04-18 03:36:02,682] [INFO] [torch_checkpoint_engine.py:33:commit] [Torch] "
            b"Checkpoint global_step1500 is ready now!\n"
        ),
        "llmc": (
            b"Writing model to log124M/model_00002000.bin\n"
            b"Writing state to log124M/state_00002500_00000.bin\n"
        ),
        "generic": (
            b"[INFO|trainer.py:3705] 2024-05-01 >> Saving model checkpoint to out/checkpoint-3000\n"
            b"Epoch 0, global step 3500: 'val_loss' reached 2.31 (best 2.31), saving model to "
            b"'/ckpt/epoch=0-step=3500.ckpt' as top 1\n"
        ),
    }
    lines["hf_stdout"] = lines["generic"]
    expect = {"megatron": [500, 1000], "deepspeed": [1500], "llmc": [2000, 2500]}
    expect["hf_stdout"] = [3000]
    expect["generic"] = [3000, 3500]
    for family, text in lines.items():
        assert saved_steps(text, [family]) == expect[family], family
    # Only the phrases of the families the log shows are searched for.
    assert saved_steps(lines["megatron"], ["llmc"]) == []


def _with_saves(tmp_path: Path) -> Path:
    """The sample Megatron log with Megatron-LM's save lines after iterations 200-800."""
    out = []
    for line in MEGATRON.read_text().splitlines(keepends=True):
        out.append(line)
        for s in (200, 400, 600, 800):
            if f"iteration {s:8d}/" in line:
                out.append(f"saving checkpoint at iteration {s:7d} to checkpoints\n")
                out.append(
                    f"  successfully saved checkpoint from iteration {s:7d} to checkpoints "
                    "[ t 1/1, p 1/1 ]\n"
                )
    log = tmp_path / "job" / "train.log"
    log.parent.mkdir()
    log.write_text("".join(out))
    return log


def test_a_megatron_log_says_where_it_saved(tmp_path: Path) -> None:
    run = read_run(_with_saves(tmp_path))
    assert run.metadata["checkpoints"] == [200, 400, 600, 800]
    cps = Evidence(run).checkpoints
    assert cps.before(650) == (600, "checkpoints the log says it saved (200, 400, 600, 800)")
    plain = read_run(MEGATRON)
    assert plain.metadata.get("checkpoints") is None
    # The save lines change no series.
    cols = ["step", "tag", "value"]
    assert run.frame.select(cols).equals(plain.frame.select(cols))


def test_the_real_llmc_log_names_its_saves() -> None:
    path = shared_path("real_runs", "llmc-gpt2-124M-hectorfcardenas", "gpt2_train.11685414.log")
    run = read_run(path)
    assert run.metadata["checkpoints"] == [5000, 10000, 15000]
    assert Evidence(run).checkpoints.where() == "checkpoints the log says it saved"


def test_a_log_without_save_lines_names_none() -> None:
    assert saved_steps(MEGATRON.read_bytes(), ["megatron", "deepspeed", "llmc", "generic"]) == []
