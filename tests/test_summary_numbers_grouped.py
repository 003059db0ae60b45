"""Numbers in finding sentences from 1,000 up are whole and grouped, never 9.42e+03.

Crafted with tensorboardX: layer 3's activation absmax climbs from 50 past the article's
10,000. The sentence read "passed 10,000 at step 4,770 and reached 12,791 at step 4,990
(typical before: 9.42e+03)": three ways of writing one scale in one line. The short-number
helper every detector's sentence uses now writes as the grouped one does.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from forensics.evidence.trend_utils import sig
from forensics.findings import FindingKind
from forensics.pipeline import analyze


def test_the_helper() -> None:
    assert [sig(x) for x in (0.000315, 2.346, 912.4, 9423.2, 1.5e12)] == [
        "0.000315",
        "2.35",
        "912",
        "9,423",
        "1.5e+12",
    ]


def test_an_activation_climb_reads_in_one_notation(tmp_path: Path) -> None:
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(0)
    w = SummaryWriter(str(tmp_path / "r"))
    for s in range(0, 5000, 10):
        w.add_scalar("train/loss", 2 + 6 / (1 + s / 300) + rng.normal(0, 0.02), s)
        for layer in range(4):
            v = 50 * math.exp(s / 900) if layer == 3 else 50 * (1 + 0.05 * rng.normal())
            w.add_scalar(f"activations/layers.{layer}.absmax", v, s)
    w.close()
    (f,) = [f for f in analyze(tmp_path / "r").findings if f.kind is FindingKind.ACTIVATION_OUTLIER]
    assert "e+0" not in f.summary
    assert "(typical before: 9,4" in f.summary


def test_a_large_models_param_norm_reads_grouped(tmp_path: Path) -> None:
    """A 7B-scale param norm (about 12,000) that jumps: its sentence read "from 1.2e+04 to
    1.8e+04" (``.4g``); the detectors' sentences now write such values as 12,000."""
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(1)
    w = SummaryWriter(str(tmp_path / "r"))
    pn = 12000.0
    for s in range(3000):
        pn *= 1.000002
        if s == 1500:
            pn *= 1.5
        w.add_scalar("train/loss", 2 + 6 / (1 + s / 300) + rng.normal(0, 0.02), s)
        w.add_scalar("train/param_norm", pn + rng.normal(0, 0.5), s)
    w.close()
    (f,) = [f for f in analyze(tmp_path / "r").findings if f.kind is FindingKind.PARAM_NORM_JUMP]
    assert "e+0" not in f.summary
    assert "Param norm jumped from 12,0" in f.summary


def test_cause_evidence_and_rollback_numbers() -> None:
    """The cause table's and the rollback advice's numbers follow the same rule."""
    from forensics.causes import _g
    from forensics.rollback import _num

    assert [_g(12345.6), _g(0.0003), _g(None)] == ["12,346", "0.0003", "n/a"]
    assert [_num(0.00015), _num(2048.0)] == ["0.00015", "2,048"]


def test_the_watch_panel_groups_too() -> None:
    from forensics.watch.panel import _number

    assert [_number(12000.3), _number(0.5), _number(float("nan"))] == ["12,000", "0.5", "nan"]
