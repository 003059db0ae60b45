"""The run's last step after a resume is where the resumed job is, not where the earlier
attempt stopped.

A job that logged up to step 5,000 and was resumed from its checkpoint at step 4,000 has,
at step 4,500, its rows from 4,000 on giving way to the resumed job's (TensorBoard's rule,
which the analysis view follows). The header, the findings document and `forensics watch`
had said "steps 0-4,999" from the earlier attempt's rows the analysis no longer reads; a
live job was shown 500 steps ahead of itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from forensics.importers import read_run
from forensics.pipeline import analyze


def _rows(steps: range, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for s in steps:
        loss = 2 + 3 / (1 + s / 500) + rng.normal(0, 0.02)
        gn = 1.0 + 0.05 * rng.standard_normal()
        out.append(json.dumps({"step": s, "loss": loss, "grad_norm": gn, "lr": 3e-4}))
    return out


def _write(folder: Path, first: range, second: range) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = _rows(first, 0) + _rows(second, 1)
    (folder / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def test_a_resume_behind_the_earlier_attempt_ends_at_its_own_step(tmp_path: Path) -> None:
    run_dir = _write(tmp_path / "run", range(0, 5001), range(4000, 4501))
    run = read_run(run_dir)
    assert run.first_step == 0 and run.last_step == 4500
    d = analyze(run_dir)
    assert d.verdict == "healthy"
    doc = d.to_document()
    assert (doc["run"]["first_step"], doc["run"]["last_step"]) == (0, 4500)
    out = subprocess.run(
        [sys.executable, "-m", "forensics", "analyze", str(run_dir), "--no-report"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.splitlines()[0].startswith("run  steps 0-4,500  HEALTHY"), out


def test_a_restart_from_scratch_ends_at_its_own_step(tmp_path: Path) -> None:
    """Two runs appended to one file (the step counter back at 0): the later one is analysed,
    and the run ends where it does."""
    run_dir = _write(tmp_path / "run", range(0, 5000), range(0, 3000))
    d = analyze(run_dir)
    assert (d.run.first_step, d.run.last_step) == (0, 2999)
    (restart,) = [f for f in d.findings if f.kind.value == "restart"]
    assert restart.measures["last_step_before"] == 4999


def test_a_resume_past_the_earlier_attempt_keeps_its_last_step(tmp_path: Path) -> None:
    run_dir = _write(tmp_path / "run", range(0, 5001), range(4000, 6001))
    assert read_run(run_dir).last_step == 6000


def test_the_restart_shading_ends_with_the_chart(tmp_path: Path) -> None:
    """The restart's span (4,000 to the earlier attempt's 5,000) is shaded up to the last step
    drawn, 4,500: shaded to 5,000 it had widened the loss chart's x axis past the run's end,
    beside a grad-norm chart that ended at 4,500."""
    from forensics.report.charts import build_panels

    d = analyze(_write(tmp_path / "run", range(0, 5001), range(4000, 4501)))
    assert d.evidence is not None
    rects = [
        s
        for p in build_panels(d.evidence, d.findings)
        for s in p.figure["layout"].get("shapes", [])
        if s.get("type") == "rect" and s.get("xref") == "x"
    ]
    assert (4000, 4500) in {(s["x0"], s["x1"]) for s in rects}
    assert max(s["x1"] for s in rects) == 4500


def test_the_restart_sentence_says_every_point_given_way_was_logged_again() -> None:
    """The resumed sample (TensorBoard, resumed at step 601 after step 700): each of its 672
    earlier points from step 601 on lies at a step the resumed job logged again. The sentence
    had said "672 earlier points ... give way to the later ones (672 of them at steps logged
    again)"."""
    root = Path(__file__).resolve().parents[1]
    diag = analyze(root / "sample_runs" / "resumed")
    (restart,) = [f for f in diag.findings if f.kind.value == "restart"]
    m = restart.measures
    assert m["points_repeated"] == m["points_replayed"] == 672
    assert restart.summary.endswith(
        "672 earlier points from step 601 on give way to the later ones (every one at a step "
        "logged again)."
    )
