"""A val-train gap that "accelerates" only because the held-out loss follows a blow-up of the
train loss is part of that divergence, not an incident of its own.

llm.c main.log lines (the trainer's own format): val every 250 steps, the train loss blows up
at step 6,200 and the val loss with it. The gap's acceleration was confirmed at step 6,500,
on readings taken after the blow-up, and stood as a warning with "no cause the log can show
is supported", a second incident beside the divergence. A widening confirmed before the
blow-up is the article's yellow light and stays a warning.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from synthetic import llmc_line, llmc_val_line, write_llmc_log

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze


def _write_llmc(folder: Path, *, widen_from: int | None) -> Path:
    rng = np.random.default_rng(3)
    lines = []
    for s in range(1, 6501):
        lr = 6e-4 * min(1.0, s / 700)
        base = 3.3 + 7.7 / (1 + s / 300) ** 0.6
        blow = 0.8 + (s - 6200) * 0.004 if s >= 6200 else 0.0
        gn = (0.45 + abs(rng.normal(0, 0.03))) * (4 if s >= 6200 else 1)
        lines.append(llmc_line(s, base + blow + rng.normal(0, 0.03), lr, gn))
        if s % 250 == 0:
            wide = 0.0 if widen_from is None else max(0, s - widen_from) ** 2 * 4e-8
            lines.append(llmc_val_line(s, base + 0.05 + wide + 1.1 * blow))
    return write_llmc_log(folder, lines)


def test_an_acceleration_confirmed_in_the_blow_up_is_part_of_it(tmp_path: Path) -> None:
    diag = analyze(_write_llmc(tmp_path / "run", widen_from=None))
    (div,) = [f for f in diag.findings if f.kind is FindingKind.DIVERGENCE]
    gaps = [f for f in diag.findings if f.kind is FindingKind.GAP_ACCELERATION]
    assert gaps, "the widening the blow-up makes is still shown, as a note"
    for g in gaps:
        assert g.measures["detected_step"] >= div.start_step
        assert g.severity is Severity.INFO
        assert g.measures["divergence_from"] == div.start_step
        assert f"inside the divergence of steps {div.start_step:,}-" in g.summary
    alarming = [i for i in diag.incidents if i.severity is not Severity.INFO]
    assert len(alarming) == 1 and div in alarming[0].findings


def test_an_acceleration_confirmed_before_the_blow_up_stays_a_warning(tmp_path: Path) -> None:
    diag = analyze(_write_llmc(tmp_path / "run", widen_from=3000))
    (div,) = [f for f in diag.findings if f.kind is FindingKind.DIVERGENCE]
    before = [
        f
        for f in diag.findings
        if f.kind is FindingKind.GAP_ACCELERATION and f.measures["detected_step"] < div.start_step
    ]
    assert before, "the widening from step 3,000 is found before the blow-up"
    for g in before:
        assert g.severity is Severity.WARNING and g.measures["divergence_from"] is None
