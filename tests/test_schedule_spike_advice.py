"""Cosine with warm restarts (SGDR), written by tensorboardX: at each restart the LR jumps
from 1e-4 back to 1e-3 and the grad norm rises 2.5x for about 160 steps, then settles. The
spikes follow the restarts (their supported cause), and their advice said "find the batches
behind them and fix the sampler or the data". The article (4.4) reads such spikes as the
schedule's, not a disease, and when every restart brings one, the LR climbs too fast there:
lengthen the warm-up at each restart. A spike with no schedule event keeps the batch advice.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from forensics.findings import FindingKind
from forensics.pipeline import analyze_run, read_run

tbx = pytest.importorskip("tensorboardX")

PERIOD = 3000


def _write(folder: Path, *, restarts: bool) -> Path:
    rng = np.random.default_rng(11)
    w = tbx.SummaryWriter(str(folder))
    for s in range(1, 4 * PERIOD + 1):
        c = (s - 1) % PERIOD if restarts else s - 1
        lr = 1e-4 + 0.45e-3 * (
            1 + np.cos(np.pi * min(c, 4 * PERIOD) / (4 * PERIOD if not restarts else PERIOD))
        )
        loss = 2.2 + 5 / (1 + s / 400) + rng.normal(0, 0.015)
        gn = 0.4 + rng.gamma(2, 0.02)
        if s > PERIOD and (restarts or s in range(6001, 6400)):
            gn += 0.6 * np.exp(-c / 100) if restarts else 0.6 * np.exp(-(s - 6001) / 100)
        w.add_scalar("train/loss", loss, s)
        w.add_scalar("train/lr", lr, s)
        w.add_scalar("train/grad_norm", gn, s)
    w.close()
    return folder


def test_a_spike_at_each_restart_gets_the_schedule_advice(tmp_path: Path) -> None:
    diag = analyze_run(read_run(_write(tmp_path / "run", restarts=True)))
    spikes = [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_SPIKE]
    at_restart = [f for f in spikes if (f.start_step - 1) % PERIOD == 0]
    assert [f.start_step for f in at_restart] == [3001, 6001, 9001]
    for f in at_restart:
        assert f.measures["cause"] == "schedule_induced"
        assert f.measures["classification"] == "physiological"
        rx = diag.prescription_for(f)
        assert "lengthen the warm-up at each restart" in rx
        assert "sampler" not in rx


def test_a_spike_without_a_schedule_event_keeps_the_batch_advice(tmp_path: Path) -> None:
    diag = analyze_run(read_run(_write(tmp_path / "run", restarts=False)))
    (f,) = [
        g for g in diag.findings if g.kind is FindingKind.GRAD_NORM_SPIKE and g.start_step > 5900
    ]
    assert f.measures["cause"] is None
    assert "warm-up" not in diag.prescription_for(f)
