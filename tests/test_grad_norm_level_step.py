"""A grad norm that steps to a new level and holds it is judged by that level.

The article's 2x / 3x lines judge the grad norm's level. A step from 1.0 to 1.9 that held
for 5,000 steps had read as a warning "Grad-norm spike ... 2.05x ... not back 4,993 steps
later" from one point of its noise at 2.05x, with the bad-batch treatment ("usually no
action; find the batches behind them"). A step is now told from a spike by its peak lying
within the new level's own noise: it is judged by the level it held (1.9x: a note; 2.2x: a
warning; 3.2x: critical) and its treatment is to find what changed at that step.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze


def _write(folder: Path, factor: float, spike: float | None = None) -> Path:
    rng = np.random.default_rng(0)
    n = 10_000
    s = np.arange(n)
    loss = 2 + 3 / (1 + s / 500) + rng.normal(0, 0.02, n)
    gn = 1.0 + 0.05 * rng.standard_normal(n)
    gn[n // 2 :] *= factor
    if spike is not None:
        gn[n // 2 : n // 2 + 3] = spike
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        json.dumps({"step": int(i), "loss": loss[i], "grad_norm": gn[i], "lr": 3e-4})
        for i in range(n)
    ]
    (folder / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    return folder


@pytest.mark.parametrize(
    ("factor", "severity", "ratio"),
    [
        (1.9, Severity.INFO, "1.9x"),
        (2.2, Severity.WARNING, "2.2x"),
        (3.2, Severity.CRITICAL, "3.2x"),
    ],
)
def test_a_step_is_judged_by_the_level_it_held(
    tmp_path: Path, factor: float, severity: Severity, ratio: str
) -> None:
    d = analyze(_write(tmp_path / "run", factor))
    (f,) = [f for f in d.findings if f.kind is FindingKind.GRAD_NORM_SPIKE]
    m = f.measures
    assert f.severity is severity
    assert m["judged_by"] == "level"
    assert m["held_level"] == pytest.approx(factor, rel=0.02)
    assert m["held_ratio"] == pytest.approx(m["held_level"] / m["run_baseline"])
    assert m["peak_value"] > m["held_level"]  # (the highest point is above the level held)
    assert f.summary.startswith(f"Grad-norm level step at step {f.start_step:,}: from a local")
    assert f"{ratio} the run's baseline (warning from 2x, critical from 3x)" in f.summary
    assert "held for the 4,99" in f.summary
    rx = d.prescription_for(f)
    assert "a lasting step, not one batch" in rx.lower()
    assert "find the batches behind them" not in rx
    # What to check names what changed at the step, not the batch behind a spike.
    checks = [c.text for inv in d.investigation for c, _ in inv.checks]
    if severity is not Severity.INFO:
        assert any("what changed in the data at the step" in c for c in checks), checks
    assert not any("Match the spike steps to batch contents" in c for c in checks), checks


def test_a_spike_above_the_level_it_left_is_still_a_spike(tmp_path: Path) -> None:
    """A spike to 8 that left the grad norm at 1.5x: its peak is far outside the new level's
    noise, so it is judged by its peak on the 2x / 3x lines, as before."""
    d = analyze(_write(tmp_path / "run", 1.5, spike=8.0))
    gn = [f for f in d.findings if f.kind is FindingKind.GRAD_NORM_SPIKE and f.start_step <= 5000]
    (f,) = [f for f in gn if f.end_step is not None and f.end_step > 5100]
    assert f.measures["judged_by"] == "band"
    assert f.measures["held_level"] is None
    assert f.severity is Severity.CRITICAL
    assert f.summary.startswith("Grad-norm spike at step")


def test_the_report_names_the_step_and_draws_the_level_it_held(tmp_path: Path) -> None:
    from forensics.report import render_html
    from forensics.report.charts import build_panels
    from forensics.schema import GRAD_NORM

    d = analyze(_write(tmp_path / "run", 2.2))
    assert d.evidence is not None
    panel = next(p for p in build_panels(d.evidence, d.findings) if p.key == GRAD_NORM)
    held = [t for t in panel.figure["data"] if t.get("name") == "held at (grad_norm_spike)"]
    assert held, [t.get("name") for t in panel.figure["data"]]
    (f,) = [f for f in d.findings if f.kind is FindingKind.GRAD_NORM_SPIKE]
    assert held[0]["meta"]["segments"][0][2] == pytest.approx(f.measures["held_level"])
    page = render_html(d)
    assert "Gradient-norm level step" in page and "Gradient-norm spike" not in page
