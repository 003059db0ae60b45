"""A log indexed by epoch says so: Keras' TensorBoard callback (epoch_* tags at the epoch's
index, written here with tensorboardX into train/ and validation/ as Keras does) and a
Lightning CSV without a step column."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from rich.console import Console

from forensics.pipeline import analyze
from forensics.report import render_html
from forensics.summary import print_summary


def _keras(tmp_path: Path, tag: str = "epoch_loss", epochs: int = 40) -> Path:
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(0)
    tw = SummaryWriter(str(tmp_path / "train"))
    vw = SummaryWriter(str(tmp_path / "validation"))
    for e in range(epochs):
        tl = 2.0 * np.exp(-e / 10) + 0.3 + 0.01 * rng.standard_normal()
        vl = 2.0 * np.exp(-e / 10) + 0.35 + 2e-4 * max(0, e - 20) ** 2
        tw.add_scalar(tag, tl, e)
        vw.add_scalar(tag, vl, e)
    tw.close()
    vw.close()
    return tmp_path


def _screen(path: Path) -> str:
    console = Console(width=200, record=True, force_terminal=False)
    print_summary(analyze(path), console=console)
    return console.export_text()


def test_keras_epoch_log_counts_epochs(tmp_path: Path) -> None:
    run = _keras(tmp_path / "keras")
    d = analyze(run)
    assert d.run.x_unit == "epoch"
    head, note = _screen(run).splitlines()[:2]
    assert "  epochs 0-39  " in head
    assert note.startswith('This log counts epochs, not optimizer steps: every "step" below')
    assert d.to_document()["run"]["x_unit"] == "epoch"
    html = render_html(d, plotlyjs="cdn")
    assert "epochs 0-39" in html and "This log counts epochs" in html
    # The charts' x axis counts what the log counts.
    from forensics.report.charts import build_panels

    panels = build_panels(d.evidence, d.findings)
    assert {p.figure["layout"]["xaxis"]["title"]["text"] for p in panels} == {"epoch"}


def test_step_logs_keep_steps(tmp_path: Path) -> None:
    """A JSONL of optimizer steps, and a tag named epoch_loss logged at the global step
    (steps 0, 50, 100 ...: not an epoch index): steps."""
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps({"step": s, "loss": 3 - s / 1e4}) + "\n" for s in range(2000)))
    assert analyze(p).run.x_unit == "step"
    assert "  steps 0-1,999  " in _screen(p)
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(tmp_path / "tb"))
    for s in range(0, 5000, 50):
        w.add_scalar("epoch_loss", 3 - s / 1e4, s)
    w.close()
    d = analyze(tmp_path / "tb")
    assert d.run.x_unit == "step" and d.x_unit_note() is None


def test_lightning_csv_by_epoch_counts_epochs(tmp_path: Path) -> None:
    """Lightning's CSVLogger with only epoch-level metrics (no step column)."""
    run = tmp_path / "lightning_logs" / "version_0"
    run.mkdir(parents=True)
    rows = ["epoch,train_loss,val_loss"]
    for e in range(30):
        rows.append(f"{e},{2 * np.exp(-e / 8) + 0.3:.4f},{2 * np.exp(-e / 8) + 0.35:.4f}")
    (run / "metrics.csv").write_text("\n".join(rows) + "\n")
    d = analyze(run)
    assert d.run.x_unit == "epoch", d.run.frame.select("x_kind").unique()


def test_compare_charts_count_what_the_logs_count(tmp_path: Path) -> None:
    """The compare page's charts said "step" for two Keras logs indexed by epoch; beside a
    log of optimizer steps they name both units, since the x values mean different things."""
    from forensics.compare import compare
    from forensics.report.compare_page import compare_figure

    a, b = _keras(tmp_path / "a"), _keras(tmp_path / "b", epochs=30)
    cmp = compare([a, b])
    assert compare_figure(cmp, "loss")["layout"]["xaxis"]["title"]["text"] == "epoch"
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps({"step": s, "loss": 3 - s / 1e4}) + "\n" for s in range(200)))
    mixed = compare([a, p])
    assert compare_figure(mixed, "loss")["layout"]["xaxis"]["title"]["text"] == "epoch / step"
    steps = compare([p, p])
    assert compare_figure(steps, "loss")["layout"]["xaxis"]["title"]["text"] == "step"
