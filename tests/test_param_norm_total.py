"""The total param norm rebuilt from per-layer norms (``Evidence.param_norm_total``): the
root of the sum of squares over the layers at each step where every layer was logged.

Read from event files that tensorboardX wrote. A log whose layers share their steps takes
the per-tag path (no group-by); any other shape takes the group-by; both give the total the
numbers say.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from forensics.config import Config
from forensics.evidence import Evidence
from forensics.evidence.baseline import _same_steps
from forensics.pipeline import read_run
from forensics.schema import PARAM_NORM_LAYER


def _write(folder: Path, layers: int, skip: dict[int, int] | None = None) -> np.ndarray:
    """Per-layer param norms every 10 steps (steps 10-600) and a loss; ``skip``: a layer ->
    a step it does not log. Returns the values written, (layers x steps), NaN where skipped."""
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(layers)
    steps = np.arange(10, 601, 10)
    vals = 30.0 + rng.random((layers, len(steps))) * 5.0
    w = SummaryWriter(str(folder))
    for j, s in enumerate(steps):
        w.add_scalar("train/loss", 3.0 - s / 1000.0, int(s))
        for i in range(layers):
            if (skip or {}).get(i) == s:
                vals[i, j] = np.nan
                continue
            w.add_scalar(f"param_norm/layers.{i}", float(vals[i, j]), int(s))
    w.close()
    return vals.astype(np.float32).astype(float)  # (the event file keeps float32)


def _total(folder: Path) -> tuple[np.ndarray, np.ndarray, str, Evidence]:
    ev = Evidence(read_run(folder), Config().params)
    s, source = ev.param_norm_total
    return s.steps, s.values, source, ev


def test_layers_logged_at_the_same_steps_are_summed_tag_by_tag(tmp_path: Path) -> None:
    vals = _write(tmp_path, layers=12)
    steps, total, source, ev = _total(tmp_path)
    assert source == PARAM_NORM_LAYER
    assert steps.tolist() == list(range(10, 601, 10))
    assert total == pytest.approx(np.sqrt((vals**2).sum(axis=0)), rel=1e-12)
    rows = ev.run.metric_rows(PARAM_NORM_LAYER)
    assert _same_steps(rows, 12) is not None  # the per-tag path, not the group-by


def test_a_layer_missing_a_step_leaves_that_step_out(tmp_path: Path) -> None:
    vals = _write(tmp_path, layers=5, skip={3: 200})
    steps, total, _, ev = _total(tmp_path)
    assert _same_steps(ev.run.metric_rows(PARAM_NORM_LAYER), 5) is None  # the group-by
    keep = np.arange(10, 601, 10) != 200
    assert steps.tolist() == [s for s in range(10, 601, 10) if s != 200]
    assert total == pytest.approx(np.sqrt((vals[:, keep] ** 2).sum(axis=0)), rel=1e-12)
