"""The overfitting onset is known to the steps between its lowest eval and the next.

The val loss turned up after its lowest eval and by the next one: the evals are all the log
has of the turn. eval_regression already carried that range; overfitting pinned its onset to
the lowest eval alone, so a control input logged between the two evals read as "after" it.
One rule says which kind a range is (:func:`forensics.findings.turned_between`), for the
timeline, the causes and `compare`.
"""

from __future__ import annotations

from pathlib import Path

from forensics.findings import FindingKind, onset_at, turned_between
from forensics.pipeline import analyze

ROOT = Path(__file__).resolve().parents[1]


def test_the_late_overfit_onset_spans_to_the_next_eval() -> None:
    d = analyze(ROOT / "sample_runs" / "late_overfit")
    (f,) = [f for f in d.findings if f.kind is FindingKind.OVERFITTING]
    assert (f.start_step, f.onset_range) == (360, (360, 400))
    assert turned_between(f.start_step, f.onset_range)
    assert "onset at step 360, turned after it and by step 400; overfitting" in (d.order_sentence())


def test_the_range_words() -> None:
    assert onset_at(360, (360, 400)) == "360 (turned after it, by 400)"
    assert onset_at(2995, (2940, 3050)) == "2,995 (anywhere in 2,940-3,050)"
    assert onset_at(2995) == "2,995"
    assert not turned_between(360, (360, 360)) and not turned_between(360, None)
