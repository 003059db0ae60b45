"""Issue 14: Karpathy's build-nanogpt ``log.txt`` and the generic ``STEP NAME VALUE`` lines.

The log is written by a real (tiny) torch training loop with the f-strings of build-nanogpt's
``train_gpt2.py``: ``f"{step} val {val_loss:.4f}"``, ``f"{step} hella {acc_norm:.4f}"``,
``f"{step} train {loss:.6f}"``.
"""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from forensics.cli import app
from forensics.importers import read_run
from forensics.importers.text import sniff

runner = CliRunner()


def _build_nanogpt_log(path: Path, steps: int = 120) -> None:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 32))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.randint(0, 32, (256,))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        pass  # build-nanogpt opens the log with "w" to clear it
    for step in range(steps):
        last_step = step == steps - 1
        if step % 25 == 0 or last_step:
            with torch.no_grad():
                x = data[:-1]
                val_loss = torch.nn.functional.cross_entropy(model(x), data[1:])
            with open(path, "a") as f:
                f.write(f"{step} val {val_loss.item():.4f}\n")
            with open(path, "a") as f:
                f.write(f"{step} hella {0.25 + step * 1e-4:.4f}\n")
        i = (step * 8) % 200
        x, y = data[i : i + 32], data[i + 1 : i + 33]
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with open(path, "a") as f:
            f.write(f"{step} train {loss.item():.6f}\n")


def test_build_nanogpt_log_txt(tmp_path: Path) -> None:
    log = tmp_path / "log" / "log.txt"
    _build_nanogpt_log(log)
    assert sniff(log.read_text()) == ["step_name_value"]
    run = read_run(tmp_path / "log")
    chosen = run.metrics()
    assert chosen["loss"] == "train"
    assert chosen["val_loss"] == "val"
    assert chosen["eval/hellaswag"] == "hella"
    loss = run.series("loss")
    assert loss.height == 120 and loss.get_column("step").to_list() == list(range(120))
    assert run.series("val_loss").get_column("step").to_list() == [0, 25, 50, 75, 100, 119]
    assert any("build-nanogpt" in n for n in run.notes)
    res = runner.invoke(app, ["analyze", str(tmp_path / "log"), "--no-report", "--format", "json"])
    assert res.exit_code in (0, 1), res.output


def test_generic_step_name_value(tmp_path: Path) -> None:
    lines = []
    for s in range(50):
        lines += [f"{s} loss {3.0 - s * 0.01:.4f}", f"{s} grad_norm {0.5 + s * 0.001:.4f}"]
        if s % 10 == 0:
            lines.append(f"{s} my/score {0.1 * s:.2f}")
    (tmp_path / "metrics.txt").write_text("\n".join(lines) + "\n")
    run = read_run(tmp_path / "metrics.txt")
    assert run.metrics()["loss"] == "loss"
    assert run.metrics()["grad_norm"] == "grad_norm"
    assert run.series("loss").height == 50
    assert "my/score" in run.frame.get_column("tag").to_list()
    assert not any("build-nanogpt" in n for n in run.notes)


def test_prose_with_numbers_is_not_step_lines() -> None:
    text = "\n".join(
        ["Epoch 1 started", "3 workers ready", "loading 1000 files", "done", "10 loss 2.0"]
    )
    assert "step_name_value" not in sniff(text)
