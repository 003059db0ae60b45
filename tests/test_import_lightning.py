"""Lightning CSVLogger metrics.csv: sparse rows, version folders as jobs, hparams.yaml as config.

Lightning is not a dependency, so the files are written the way its CSVLogger writes them
(csv.DictWriter over the sorted union of keys, empty cells for keys a row lacks, hparams via
yaml); the real files under ../shared are covered in test_real_runs_importers_i.py.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import polars as pl
import pytest
import yaml

from forensics.errors import MultipleJobsError
from forensics.importers import ReadOptions, discover_jobs, read_run


def _write_version(folder: Path, rows: list[dict], hparams: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for r in rows for k in r})
    with (folder / "metrics.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    if hparams is not None:
        (folder / "hparams.yaml").write_text(yaml.dump(hparams))
    return folder


def _rows(first_step: int, n: int, epoch: int = 0, val_every: int = 10) -> list[dict]:
    rows: list[dict] = []
    for i in range(n):
        s = first_step + i * 50
        rows.append(
            {"train_loss_step": 5.0 - i * 0.01, "lr-AdamW": 3e-4, "epoch": epoch, "step": s}
        )
        if (i + 1) % val_every == 0:
            rows.append(
                {
                    "val_loss": 4.5 - i * 0.01,
                    "val_perplexity": math.exp(4.5 - i * 0.01),
                    "epoch": epoch,
                    "step": s,
                }
            )
    rows.append({"train_loss_epoch": 4.9, "epoch": epoch, "step": first_step + (n - 1) * 50})
    return rows


def test_sparse_columns_become_series(tmp_path: Path) -> None:
    """Each non-empty cell is one point; empty cells are not zeros; hparams.yaml is the config."""
    v = _write_version(
        tmp_path / "lightning_logs" / "version_0", _rows(49, 40), {"lr": 3e-4, "num_layers": 12}
    )
    run = read_run(v)
    assert run.format == "lightning_csv"
    assert run.series("loss").height == 40 and run.metrics()["loss"] == "train_loss_step"
    assert run.series("val_loss").get_column("step").to_list() == [
        49 + 50 * i for i in (9, 19, 29, 39)
    ]
    assert run.metrics()["lr"] == "lr-AdamW"
    assert run.metrics()["eval/perplexity"] == "val_perplexity"
    assert run.frame.filter(pl.col("tag") == "epoch").height == 40 + 4 + 1
    assert run.config == {"lr": 3e-4, "num_layers": 12}
    assert run.frame.get_column("record_idx").min() == 2  # CSV line numbers


def test_nan_cells_are_kept(tmp_path: Path) -> None:
    """A 'nan' cell is a NaN point (evidence), not an empty cell."""
    rows = [
        {"train_loss_step": 1.0, "epoch": 0, "step": 1},
        {"train_loss_step": float("nan"), "epoch": 0, "step": 2},
    ]
    run = read_run(_write_version(tmp_path / "version_0", rows))
    vals = run.series("loss").get_column("value").to_list()
    assert vals[0] == 1.0 and math.isnan(vals[1])


def test_each_version_folder_is_its_own_job(tmp_path: Path) -> None:
    """Several version_N folders: MultipleJobsError listing them; each reads alone. (These two
    are a resume chain, version_1 going on at step 1,049 after 999: read as one run unless
    stitching is off, see tests/test_chains.py.)"""
    logs = tmp_path / "lightning_logs"
    _write_version(logs / "version_0", _rows(49, 20), {"num_epochs": 10})
    _write_version(logs / "version_1", _rows(1049, 20, epoch=1), {"num_epochs": 20})
    with pytest.raises(MultipleJobsError) as err:
        read_run(tmp_path, options=ReadOptions(stitch=False))
    assert err.value.jobs == ["lightning_logs/version_0", "lightning_logs/version_1"]
    assert read_run(tmp_path).metadata["jobs"] == err.value.jobs
    assert sorted(discover_jobs(logs)) == ["version_0", "version_1"]
    assert read_run(logs / "version_1").config == {"num_epochs": 20}


def test_hparams_with_python_tags_still_load(tmp_path: Path) -> None:
    """hparams.yaml with python object tags (as save_hyperparameters can write) does not fail the
    import."""
    v = _write_version(tmp_path / "version_0", _rows(0, 3))
    (v / "hparams.yaml").write_text(
        "lr: 0.001\noptimizer: !!python/name:torch.optim.AdamW ''\n"
        "betas: !!python/tuple\n- 0.9\n- 0.95\n"
    )
    cfg = read_run(v).config
    assert cfg["lr"] == 0.001 and cfg["betas"] == [0.9, 0.95]
