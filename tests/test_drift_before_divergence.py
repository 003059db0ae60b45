"""A grad norm that climbs for 2,200 steps while the loss falls, then the loss blows up (the
article's story: the climb comes first, nobody looked, then the divergence).

llm.c main.log lines (the trainer's own format). The drift analysis read the stretch from the
climb's onset to the end of the log, saw the loss end higher and left it all to the
divergence: the report said "no cause the log can show is supported" and rolled back to the
checkpoint just before the blow-up, in the middle of the climb. The climb is judged up to the
divergence's onset: a drift of its own, the divergence's supported cause, one incident, and
the rollback goes to the checkpoint before the climb.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synthetic import llmc_line, write_llmc_log

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze


def _write_llmc(folder: Path, *, climb: bool) -> Path:
    rng = np.random.default_rng(11)
    lines = []
    for s in range(1, 6501):
        lr = 6e-4 * min(1.0, s / 700)
        loss = 3.3 + 7.7 / (1 + s / 300) ** 0.6 + rng.normal(0, 0.03)
        gn = 0.45 + abs(rng.normal(0, 0.03))
        if climb and s > 4000:
            gn *= 1 + (s - 4000) / 1200  # 2.8x by step 6,200
        if s >= 6200:
            loss += 0.8 + (s - 6200) * 0.004  # the blow-up: never comes back
            gn *= 4
        lines.append(llmc_line(s, loss, lr, gn))
    return write_llmc_log(folder, lines)


def test_a_climb_that_led_into_a_divergence_is_its_cause(tmp_path: Path) -> None:
    diag = analyze(_write_llmc(tmp_path / "run", climb=True))
    by_kind = {f.kind: f for f in diag.findings}
    div = by_kind[FindingKind.DIVERGENCE]
    drift = by_kind[FindingKind.GRAD_NORM_DRIFT]
    assert div.severity is Severity.CRITICAL and div.start_step == 6200
    assert drift.severity is Severity.WARNING
    assert abs(drift.start_step - 4000) <= 100
    assert drift.end_step == 6199  # the last point before the divergence
    m = drift.measures
    assert m["divergence_step"] == 6200
    assert m["loss_change_pct"] < 0  # up to the blow-up, the loss fell
    assert f"while the loss fell {-m['loss_change_pct']:.1f}%" in drift.summary
    # The level before the blow-up: 0.45 + |N(0, 0.03)| times 2.6-2.8 over the last points
    assert 2.0 <= m["ratio"] < 3.0
    assert "since step" in drift.summary and "up to the divergence at step 6,200" in drift.summary
    # The divergence's cause is the climb, shown by the log; one incident holds both, and the
    # rollback goes back before the climb.
    i = diag.findings.index(div)
    climb = [c for c in diag.causes[i] if c.cause == "grad_norm_climb"]
    assert [c.status for c in climb] == ["supported"]
    (inc,) = [inc for inc in diag.incidents if div in inc.findings]
    assert drift in inc.findings
    assert diag.rollbacks, "no rollback advice"
    target = min(r.checkpoint_step for r in diag.rollbacks if r.checkpoint_step is not None)
    assert target <= drift.start_step


def test_a_divergence_without_a_climb_before_it_has_no_drift(tmp_path: Path) -> None:
    diag = analyze(_write_llmc(tmp_path / "run", climb=False))
    kinds = {f.kind for f in diag.findings}
    assert FindingKind.DIVERGENCE in kinds
    assert FindingKind.GRAD_NORM_DRIFT not in kinds
    drift = diag.evidence.drift
    assert drift is not None and drift.measures["divergence_step"] == 6200
    assert drift.measures["ratio"] == pytest.approx(1.0, abs=0.1)
