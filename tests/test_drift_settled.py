"""grad_norm_drift judged from where the grad norm settled, when it went on falling after the
baseline window.

llm.c main.log lines (the trainer's own format): after a 700-step warm-up the grad norm keeps
coming down from start-up (0.66 over the baseline window, about 0.43 by step 4,000). A climb
to 3x of that settled level at a constant LR, while the loss falls, is the article's drift;
judged against the early baseline it read 1.8x and the run passed as healthy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synthetic import llmc_line, llmc_val_line, write_llmc_log

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze
from forensics.report.charts import grad_norm_panel


def _gn_settling(s: int) -> float:
    return 0.35 + 3.0 / (1 + s / 100)


def _write_llmc(folder: Path, *, climb: bool, lr_kind: str, n: int = 8000) -> Path:
    rng = np.random.default_rng(7)
    lines = []
    for s in range(1, n + 1):
        if s < 700:
            lr = 6e-4 * s / 700
        elif lr_kind == "const":
            lr = 6e-4
        else:  # cosine to 5%
            lr = 6e-4 * (0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * (s - 700) / (n - 700))))
        loss = 3.3 + 7.7 / (1 + s / 300) ** 0.6 + rng.normal(0, 0.03)
        gn = _gn_settling(s) + abs(rng.normal(0, 0.03))
        if climb and s > 4000:
            gn *= 1 + (s - 4000) / 2000  # 3x of the settled level by step 8,000
        if lr_kind == "cos" and s >= 700:
            gn *= (6e-4 / lr) ** 0.5  # the rise a decaying LR gives with weight decay
        lines.append(llmc_line(s, loss, lr, gn))
        if s % 250 == 0:
            lines.append(llmc_val_line(s, 3.35 + 7.7 / (1 + s / 300) ** 0.6))
    return write_llmc_log(folder, lines)


def test_a_climb_from_where_the_grad_norm_settled_is_a_warning(tmp_path: Path) -> None:
    diag = analyze(_write_llmc(tmp_path / "climb", climb=True, lr_kind="const"))
    (f,) = [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_DRIFT]
    m = f.measures
    assert f.severity is Severity.WARNING
    assert m["baseline_kind"] == "settled"
    # The settled level: the median of 500 steps around the low, where the noise-free level
    # is 0.42-0.44 (the noise adds |N(0, 0.03)|, about 0.024 on average).
    lo, hi = m["baseline_start_step"], m["baseline_end_step"]
    assert 3000 <= lo < hi <= 4000 and hi - lo == 499
    assert _gn_settling(hi) < m["baseline"] < _gn_settling(lo) + 0.05
    assert m["early_baseline"] == pytest.approx(
        np.median([_gn_settling(s) for s in range(700, 1200)]), abs=0.04
    )
    assert m["ratio"] == pytest.approx(m["current"] / m["baseline"])
    assert m["early_ratio"] == pytest.approx(m["current"] / m["early_baseline"])
    assert m["early_ratio"] < 2.0 <= m["ratio"] < 3.0  # (under the early 2x line: the miss)
    assert abs(f.start_step - 4000) <= 100
    assert f.judged_against["baseline"] == m["baseline"]
    assert f.judged_against["warn_at"] == pytest.approx(2 * m["baseline"])
    assert f.judged_against["early_baseline"] == m["early_baseline"]
    assert (
        f"(where it settled: the median of steps {lo:,}-{hi:,}; it was "
        f"{m['early_baseline']:.3g} after the warm-up and went on falling)" in f.summary
    )
    # The chart draws the lines it was judged against over the climb, and says why.
    panel = grad_norm_panel(diag.evidence, [f], 500)
    assert panel is not None
    drawn = {
        t["meta"]["judged"]: t["meta"]["segments"]
        for t in panel.figure["data"]
        if isinstance(t.get("meta"), dict) and "segments" in t["meta"]
    }
    assert drawn["baseline"] == [[f.start_step, f.end_step, m["baseline"]]]
    assert drawn["warn_at"] == [[f.start_step, f.end_step, 2 * m["baseline"]]]
    assert "judged from where it settled" in panel.caption
    (shade,) = [
        sh
        for sh in panel.figure["layout"]["shapes"]
        if sh.get("name") == "settled window (grad_norm_drift)"
    ]
    assert (shade["x0"], shade["x1"]) == (lo, hi)


def test_a_grad_norm_that_settles_and_stays_is_healthy(tmp_path: Path) -> None:
    diag = analyze(_write_llmc(tmp_path / "flat", climb=False, lr_kind="const"))
    assert not [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_DRIFT]
    assert diag.verdict == "healthy"
    # (it fell below 0.8x the baseline, but the level now is not above the levels it held
    # on the way down: not a climb, judged on the early baseline, under it)
    drift = diag.evidence.drift
    assert drift is not None and not drift.flagged
    assert drift.measures["baseline_kind"] == "early"
    assert drift.measures["ratio"] < 0.8


def test_a_rise_the_decaying_lr_explains_stays_a_note(tmp_path: Path) -> None:
    """Judged from the settled level, the envelope is the LR's decay from that window on."""
    diag = analyze(_write_llmc(tmp_path / "cos", climb=False, lr_kind="cos"))
    drifts = [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_DRIFT]
    assert [f.severity for f in drifts] == [Severity.INFO]
    assert drifts[0].measures["schedule_explained"] is True
    assert diag.verdict == "healthy"


@pytest.mark.parametrize(("dip_from", "dip_to"), [(3000, 3600), (6000, 6800), (2000, 5000)])
def test_a_grad_norm_back_from_a_dip_has_not_climbed(
    tmp_path: Path, dip_from: int, dip_to: int
) -> None:
    """A flat grad norm that dips to 0.45x for a while and comes back to the level it held
    (an easier stretch of data, say) did not climb: judged from the dip, the return read as a
    2.2x climb "where it settled ... and went on falling", a warning on a healthy run."""
    rng = np.random.default_rng(9)
    lines = []
    for s in range(1, 8001):
        gn = 0.5 + abs(rng.normal(0, 0.03))
        if dip_from <= s < dip_to:
            gn *= 0.45
        loss = 3.3 + 7.7 / (1 + s / 300) ** 0.6 + rng.normal(0, 0.03)
        lines.append(llmc_line(s, loss, 6e-4 * min(1.0, s / 700), gn))
    diag = analyze(write_llmc_log(tmp_path / "run", lines))
    assert not [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_DRIFT]
    assert diag.verdict == "healthy"
    drift = diag.evidence.drift
    assert drift is not None and drift.measures["baseline_kind"] == "early"
