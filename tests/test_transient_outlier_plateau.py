"""A grad-norm outlier the optimizer absorbed right after the warm-up's fall: back within one
step, the loss unmoved. Its pre-spike trend is fitted on the 70 steps before it, where the grad
norm fell from 5 to 0.6; extrapolated 500 steps it predicts 0.2, so the level after the outlier
(a steady 0.6) read "+270%" and the spike table said "settled higher or slow" beside a sentence
calling it an outlier the optimizer absorbed.

A transient outlier's shape is its recovery: no plateau is measured for it, its class is
physiological, and the table says "back within 1 step". A grad-norm spike that stays up is
still measured against its trend, plateau and all.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from forensics.findings import FindingKind
from forensics.pipeline import analyze_run, read_run
from forensics.report.render import spike_cell

tbx = pytest.importorskip("tensorboardX")


def _write(folder: Path, *, stays_up: bool) -> Path:
    """1,500 steps written by tensorboardX: the grad norm falls from 5 to 0.6 over the first
    70 steps, then holds at 0.6 with a little noise; an 8x outlier at step 72 (or, with
    ``stays_up``, a jump to 4x at step 700 that stays)."""
    rng = np.random.default_rng(3)
    w = tbx.SummaryWriter(str(folder))
    for s in range(1, 1501):
        loss = 2.5 + 6.0 / (1 + s / 100) + rng.normal(0, 0.01)
        gn = 0.6 + 4.4 * np.exp(-s / 15) + abs(rng.normal(0, 0.03))
        if not stays_up and s == 72:
            gn *= 8
        if stays_up and s >= 700:
            gn *= 4
        w.add_scalar("train/loss", loss, s)
        w.add_scalar("train/grad_norm", gn, s)
        w.add_scalar("train/lr", 3e-4 * min(1.0, s / 30), s)
    w.close()
    return folder


def _gn_spikes(folder: Path, each: bool = False):
    """The grad-norm spike findings; ``each``: absorbed outliers too, as warnings (as notes
    they are one grad_norm_outliers finding)."""
    from forensics.config import Config

    cfg = Config(detectors={"spikes": {"absorbed_gn_severity": "warning"}}) if each else None
    diag = analyze_run(read_run(folder), cfg)
    return [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_SPIKE], diag


def test_an_absorbed_outlier_after_the_warm_up_is_back_on_its_trend(tmp_path: Path) -> None:
    _, notes = _gn_spikes(_write(tmp_path / "run", stays_up=False))
    (o,) = [f for f in notes.findings if f.kind is FindingKind.GRAD_NORM_OUTLIERS]
    assert 72 in (o.events_at or ())
    spikes, _ = _gn_spikes(_write(tmp_path / "each", stays_up=False), each=True)
    (g,) = [f for f in spikes if f.peak_step == 72]
    m = g.measures
    assert m["transient"] is True and m["judged_by"] == "recovery"
    assert m["recovery_steps"] == 1 and m["loss_response"] is False
    assert m["classification"] == "physiological"
    assert m["plateau_shift"] is None and m["plateau_shift_rel"] is None
    assert "an outlier batch the optimizer absorbed" in g.summary
    # The report's spike table names the shape it was judged by.
    assert spike_cell(g, "classification") == "back within 1 step"


def test_a_grad_norm_that_stays_up_keeps_its_plateau(tmp_path: Path) -> None:
    spikes, _ = _gn_spikes(_write(tmp_path / "run", stays_up=True))
    (g,) = [f for f in spikes if f.start_step == 700]
    m = g.measures
    # (a jump that stays: a step judged by the level it held, tests/test_grad_norm_level_step.py)
    assert m["transient"] is False and m["judged_by"] == "level"
    assert m["classification"] == "pathological"
    assert m["recovered"] is False
    assert spike_cell(g, "classification") == "settled higher or slow"
