"""Grad-norm surges above the band that the spike search's local baseline follows.

A grad norm that ramps from its level to 4x its baseline over 60 steps and drops back is no
outlier against its 20-point neighbourhood, and too short for the drift detector; the
article's lines (2x / 3x a 500-step baseline) still judge its level.
:mod:`forensics.evidence.surges` finds such stretches; the spike detector judges them by the
band. A level that rose over thousands of steps and crosses the line back and forth (the
real LoRA run below) is not a surge at every crossing. The metrics are JSONL lines as a
training script's ``json.dumps`` writes them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_path

from forensics.config import Config
from forensics.evidence import Evidence
from forensics.evidence.surges import _runs, band_surges, heights
from forensics.findings import FindingKind, Severity
from forensics.importers import read_run
from forensics.measures import problems
from forensics.pipeline import analyze


def _write(folder: Path, *, top: float, lr_decays: bool = False) -> Path:
    """3,000 steps of a constant LR (after a 100-step warm-up), the grad norm at 0.5 except a
    ramp to ``top`` over steps 1,560-1,619, then back at 0.5."""
    rng = np.random.default_rng(5)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "metrics.jsonl", "w") as fh:
        for s in range(1, 3_001):
            lr = 3e-4 * min(1.0, s / 100)
            loss = 2.0 + 3.0 * math.exp(-s / 300) + rng.normal(0, 0.03)
            ramp = (top - 0.5) * (s - 1_560) / 59 if 1_560 <= s < 1_620 else 0.0
            gn = abs(0.5 + ramp + rng.normal(0, 0.02))
            row = {"step": s, "train/loss": round(loss, 4), "train/lr": lr}
            fh.write(json.dumps({**row, "train/grad_norm": round(gn, 4)}) + "\n")
    return folder


def _surge(run_dir: Path):  # noqa: ANN202
    diag = analyze(run_dir)
    gn = [f for f in diag.findings if f.kind == FindingKind.GRAD_NORM_SPIKE]
    return diag, gn


def test_a_ramp_to_4x_is_critical_with_its_numbers(tmp_path: Path) -> None:
    diag, gn = _surge(_write(tmp_path / "run", top=2.0))
    assert len(gn) == 1, [f.summary for f in diag.findings]
    (f,) = gn
    m = f.measures
    assert f.severity == Severity.CRITICAL and diag.verdict == "critical"
    assert m["judged_by"] == "band"
    assert m["peak_value"] == pytest.approx(2.0, abs=0.08)
    assert m["ratio_to_run_baseline"] == pytest.approx(4.0, rel=0.05)
    assert 1_560 <= f.start_step <= 1_585  # (where it left its level)
    assert f.peak_step is not None and 1_615 <= f.peak_step <= 1_619
    assert m["baseline"] == pytest.approx(0.5, rel=0.1)  # the level before the ramp
    assert problems(f.kind, m) == []
    # Its points above the line, counted in the file itself (a constant LR: the plain line)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    warn_at = f.judged_against["warn_at"]
    above = [r["step"] for r in rows if r["train/grad_norm"] > warn_at and r["step"] > 1_000]
    assert m["points"] == len(above) and 30 <= len(above) <= 45
    ratio = m["ratio_to_run_baseline"]
    assert f.summary.startswith(f"Grad-norm surge from step {f.start_step:,}: up to ")
    assert f"above the warning line for {m['points']} logged points: longer than one batch" in (
        f.summary
    )
    assert f"{ratio:.1f}x the run's baseline" in f.summary


def test_a_ramp_to_2_5x_is_a_warning(tmp_path: Path) -> None:
    diag, gn = _surge(_write(tmp_path / "run", top=1.25))
    assert [f.severity for f in gn] == [Severity.WARNING], [f.summary for f in diag.findings]
    assert gn[0].measures["ratio_to_run_baseline"] == pytest.approx(2.5, rel=0.06)


def test_a_ramp_under_the_warning_line_is_no_finding(tmp_path: Path) -> None:
    diag, gn = _surge(_write(tmp_path / "run", top=0.9))
    assert gn == [] and diag.verdict == "healthy"


def test_stretches_are_held_by_two_of_three_points() -> None:
    above = np.array([0, 1, 1, 0, 1, 1, 1, 0, 0, 1, 0, 0, 1, 1, 1, 1], dtype=bool)
    # one dip (index 3) does not split 1-6; a lone point (9) makes nothing; the last stretch
    # runs to the end of the series, its ends points above
    assert _runs(above, 3) == [(1, 6), (12, 15)]
    assert _runs(above, 4) == [(1, 6)]  # (five points above in 1-6, four in 12-15)
    assert _runs(above, 5) == []
    assert _runs(np.zeros(2, dtype=bool), 0) == []
    assert _runs(np.ones(2, dtype=bool), 1) == [(0, 1)]


def test_a_level_risen_over_thousands_of_steps_is_not_a_surge_per_crossing() -> None:
    """The LoRA run's grad norm rose from 0.45 to about 1.2 (2.7x) over steps 1,100-4,000 and
    fell back; the drift detector judges the level at the end of the log (0.9x). Its many
    crossings of the 2x line are no surge out of the level before them."""
    run = read_run(shared_path("real_runs", "hf-trainer-baize-tcm-lora"))
    ev = Evidence(run, Config().params)
    band = ev.grad_norm_band
    assert band is not None
    values = ev.series("grad_norm").values
    assert (values > band.warn_at).sum() > 1_000  # (the line is crossed, many times)
    assert band_surges(ev, "grad_norm", ev.spikes("grad_norm")) == []
    # Its stretches' heights over the levels they left (the calibration's surge row): under
    # the 2x a surge needs, whatever covers them
    tops = [h for h in heights(ev, "grad_norm") if h == h]
    assert tops and max(tops) < 2.0
