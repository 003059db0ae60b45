"""Megatron's "number of nan iterations": iterations whose loss was NaN / Inf, which the trainer
skipped and left out of the logged loss (a mean over the iterations it kept). The loss curve
never shows them; the nan_inf detector reads the count.

The logs are written line for line as Megatron-LM's ``training_log`` prints its iteration line
(``megatron/training/training.py``; the layout of the bigscience runs in ``../shared``): when
every iteration of an interval was skipped, the line has no ``lm loss`` and no ``grad norm``.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from forensics import analyze
from forensics.findings import FindingKind, Severity
from forensics.schema import NAN_ITERS


def _line(it: int, total: int, loss: float | None, skipped: int, nan: int) -> str:
    cells = [
        f" iteration {it:8d}/{total:8d} ",
        f" consumed samples: {it * 512:12d} ",
        " elapsed time per iteration (ms): 1234.5 ",
        f" learning rate: {1.5e-4:.3E} ",
        " global batch size:   512 ",
    ]
    if loss is not None:
        cells.append(f" lm loss: {loss:.6E} ")
    cells.append(" loss scale: 1.0 ")
    if loss is not None:
        cells.append(" grad norm: 1.200 ")
    cells += [
        f" number of skipped iterations: {skipped:3d} ",
        f" number of nan iterations: {nan:3d} ",
        "",
    ]
    return "|".join(cells)


def _log(
    path: Path, nan_at: dict[int, int], *, all_nan_from: int | None = None, total: int = 3000
) -> Path:
    rnd = random.Random(0)
    lines = []
    for it in range(10, total + 1, 10):
        if all_nan_from is not None and it >= all_nan_from:
            lines.append(_line(it, total, None, 10, 10))
            continue
        loss = 2.0 + 6.0 * math.exp(-it / 600) + rnd.gauss(0, 0.03)
        lines.append(_line(it, total, loss, nan_at.get(it, 0), nan_at.get(it, 0)))
    path.write_text("\n".join(lines) + "\n")
    return path


def _nan(path: Path):
    d = analyze(path)
    return d, [f for f in d.findings if f.kind is FindingKind.NAN_INF]


def test_a_few_counted_nan_iterations_are_critical_though_the_loss_looks_clean(tmp_path):
    """3 NaN iterations in the intervals ending at 1,200 and 1,210; every logged loss finite.
    Before, the count was an unmapped tag and the run was green."""
    d, (f,) = _nan(_log(tmp_path / "train.log", {1200: 2, 1210: 1}))
    assert f.metric == NAN_ITERS and f.severity is Severity.CRITICAL
    assert (f.start_step, f.end_step) == (1200, 1210)
    m = f.measures
    assert (m["bad_points"], m["bad_runs"], m["first_run_points"]) == (3, 1, 2)
    assert (m["last_finite_step"], m["recovered_step"], m["persistent"]) == (1190, 1220, False)
    assert m["loss_back"] is True
    assert m["bad_fraction"] == 3 / 3000
    assert "The loss was NaN or Inf on 3 iterations in 2 logging intervals" in f.summary
    assert "the logged loss, a mean over the iterations it kept, does not show them" in f.summary
    assert d.verdict == "critical"


def test_every_iteration_counted_to_the_end_is_fatal(tmp_path):
    """From iteration 2,491 on every iteration is NaN (the lines have no lm loss): nothing was
    trained there. Fatal, dated from the first counted iteration (1,200)."""
    d, (f,) = _nan(_log(tmp_path / "train.log", {1200: 2}, all_nan_from=2500))
    assert f.severity is Severity.FATAL
    assert (f.start_step, f.end_step) == (1200, 3000)
    assert (f.measures["persistent_from"], f.measures["bad_points"]) == (2500, 512)
    assert "in the logging intervals ending at steps 2,500 to 3,000 (510 iterations)" in f.summary
    assert "the first in the interval ending at step 1,200" in f.summary
    assert d.verdict == "fatal"


def test_a_zero_count_is_quiet(tmp_path):
    """The count logged as 0 throughout (every healthy Megatron log): nothing to report."""
    d, found = _nan(_log(tmp_path / "train.log", {}))
    assert found == [] and d.verdict == "healthy"


def test_the_finding_is_marked_on_the_loss_chart(tmp_path):
    """The counted iterations are the loss's: the report marks them on the loss panel (they
    had gone to the first panel as a "run-level finding")."""
    from forensics.evidence import Evidence
    from forensics.importers import read_run
    from forensics.report.charts import build_panels
    from forensics.schema import LOSS

    path = _log(tmp_path / "train.log", {1200: 2})
    d = analyze(path)
    (f,) = [f for f in d.findings if f.kind is FindingKind.NAN_INF]
    panels = {p.key: p for p in build_panels(Evidence(read_run(path)), d.findings)}
    assert f in panels[LOSS].findings
    names = [t.get("name") for t in panels[LOSS].figure["data"]]
    assert "run-level findings" not in names


def test_the_startup_checklist_says_the_count_was_read(tmp_path):
    """The start-up check "Any NaN or Inf at some step?" passes on a Megatron log whose count
    stayed at 0, and says the hidden NaNs were counted too; with a count in the phase it fails
    on the finding."""
    from forensics.checklists import PASS

    d = analyze(_log(tmp_path / "clean.log", {}))
    item = next(i for p in d.phases for i in p.items if i.question.startswith("Any NaN"))
    assert item.status == PASS
    assert "the trainer counted no iteration with a NaN loss (nan_iters)" in item.evidence

    d = analyze(_log(tmp_path / "nan.log", {600: 2}))
    item = next(i for p in d.phases for i in p.items if i.question.startswith("Any NaN"))
    assert item.status != PASS and "NaN/Inf at step 600" in item.evidence


def test_the_report_card_does_not_call_isolated_steps_the_end_of_training(tmp_path):
    """The nan_inf card's first line said "non-finite values mean the run is no longer
    training; stop, look, then resume from a checkpoint" above its own prescription "look, but
    do not roll back: the loss came back to its level". The line now follows the measures:
    isolated steps the loss came back from, or a stretch that persists."""
    from forensics.report.render import render_html

    page = render_html(analyze(_log(tmp_path / "iso.log", {1200: 2, 1210: 1})), plotlyjs="cdn")
    assert "no longer training" not in page
    assert (
        "Orange light: isolated non-finite steps, after which the loss came back to its level: "
        "the run is still training" in page
    )
    page = render_html(analyze(_log(tmp_path / "full.log", {}, all_nan_from=2500)), plotlyjs="cdn")
    assert "Red light: non-finite values that persist mean the run is no longer training" in page
