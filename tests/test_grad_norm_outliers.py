"""Absorbed grad-norm outliers are one note (``grad_norm_outliers``), not a finding each.

A long run has thousands of one-batch grad-norm outliers the optimizer absorbs (4,812 in the
1M-step benchmark run, 30 in a real 20k-step llm.c run). As a finding each, they made a
100k-step run's report a scroll of 429 identical cards and cost every command a tenth of its
time. The note keeps what a reader needs of them: the count, the rate, the highest, each
one's step (``events_at``: the chart's markers, ``compare``'s shared steps).
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from synthetic import healthy_grad_norm, healthy_loss, long_frame, run_from_frame

from forensics.compare import shared_spikes
from forensics.config import Config
from forensics.detectors.spikes import SpikeDetector
from forensics.evidence import Evidence
from forensics.findings import FindingKind, Severity
from forensics.params import SpikesParams
from forensics.pipeline import analyze_run
from forensics.report.charts import build_panels
from forensics.schema import GRAD_NORM

# One-step outliers at uneven steps (no period), 2.5x to 4.5x the grad norm there.
AT = (700, 1_130, 1_610, 2_260, 2_400, 3_340, 4_020, 4_100, 5_150, 5_900)
HEIGHTS = (2.5, 3.0, 4.5, 2.8, 3.2, 2.6, 3.9, 2.7, 3.1, 2.9)


def _run(seed: int = 1, at: tuple[int, ...] = AT, nan_at: int | None = None):
    s, loss = healthy_loss(6_000, seed=seed)
    _, gn = healthy_grad_norm(6_000, seed=seed + 10)
    gn = gn.copy()
    for step, h in zip(at, HEIGHTS, strict=False):
        gn[step] *= h
    if nan_at is not None:
        gn[nan_at] = np.nan
    return run_from_frame(long_frame({"loss": (s, loss), "grad_norm": (s, gn)}))


def _notes(findings):
    (n,) = [f for f in findings if f.kind is FindingKind.GRAD_NORM_OUTLIERS]
    return n


def test_the_note_states_what_each_outlier_showed() -> None:
    """Its numbers are the outliers' own, as the detector measured each one (configured to
    warnings, each is a finding of its own with the same measures)."""
    ev = Evidence(_run())
    each = [
        f
        for f in SpikeDetector(SpikesParams(absorbed_gn_severity="warning")).detect(ev)
        if f.kind is FindingKind.GRAD_NORM_SPIKE
    ]
    assert [f.peak_step for f in each] == list(AT)
    found = SpikeDetector().detect(ev)
    assert not [f for f in found if f.kind is FindingKind.GRAD_NORM_SPIKE]
    notes = _notes(found)
    m = notes.measures
    ratios = [f.measures["height_ratio"] for f in each]
    top = each[int(np.argmax(ratios))]
    assert notes.severity is Severity.INFO and notes.metric == GRAD_NORM
    assert notes.events_at == AT and m["count"] == len(AT)
    assert (notes.start_step, notes.peak_step) == (each[0].start_step, top.peak_step)
    assert top.peak_step == 1_610
    assert notes.end_step == max(f.end_step for f in each)
    assert m["highest_ratio"] == max(ratios) and m["highest_step"] == 1_610
    assert m["highest_value"] == top.measures["peak_value"]
    assert m["highest_baseline"] == top.measures["baseline"]
    assert m["median_ratio"] == pytest.approx(float(np.median(ratios)))
    assert m["longest_recovery_steps"] == max(f.measures["recovery_steps"] for f in each)
    assert m["per_1k_steps"] == pytest.approx(len(AT) * 1000 / 5_999)
    second = sorted(each, key=lambda f: -f.measures["height_ratio"])[1]
    # The text's range is the finding's steps (the report's steps column): the first one's
    # onset to the step the last one was back (after its peak at 5,900), not to that peak.
    assert notes.start_step == 700 and 5_900 < notes.end_step <= 5_900 + 10
    assert notes.summary.startswith(
        f"10 grad-norm outliers from step 700 to {notes.end_step:,} (1.7 per 1,000 steps), "
        f"each back within {m['longest_recovery_steps']} step"
    ), notes.summary
    assert f"at step 1,610; then steps {second.peak_step:,} (" in notes.summary, notes.summary
    assert "judged by their recovery, not by the 2x / 3x lines" in notes.summary


def test_the_document_carries_each_step_and_validates(findings_schema: dict) -> None:
    diag = analyze_run(_run())
    doc = json.loads(json.dumps(diag.to_document()))
    jsonschema.validate(doc, findings_schema)
    (notes,) = [f for f in doc["findings"] if f["kind"] == "grad_norm_outliers"]
    assert notes["events_at"] == list(AT)
    assert all(f["events_at"] is None for f in doc["findings"] if f is not notes)
    # (one hypothesis the log cannot test, and the article's cause in its words)
    assert {c["cause"] for c in notes["causes"]} == {"shared_data", "article"}
    assert all(c["status"] == "untested" for c in notes["causes"])
    assert notes["prescription"].startswith("No action")


def test_an_outlier_with_a_cause_in_the_log_is_a_finding_of_its_own() -> None:
    """An outlier at the step the loss scale fell is an overflow (the log shows a cause):
    its own finding with its causes, not one of the notes."""
    s, loss = healthy_loss(6_000)
    _, gn = healthy_grad_norm(6_000, seed=11)
    gn = gn.copy()
    for step, h in zip(AT, HEIGHTS, strict=False):
        gn[step] *= h
    scale = np.where(s < 3_340, 65536.0, 32768.0)
    run = run_from_frame(
        long_frame({"loss": (s, loss), "grad_norm": (s, gn), "loss_scale": (s, scale)})
    )
    found = SpikeDetector().detect(Evidence(run))
    (own,) = [f for f in found if f.kind is FindingKind.GRAD_NORM_SPIKE]
    assert own.peak_step == 3_340 and own.measures["cause"] == "numeric_overflow"
    assert _notes(found).events_at == tuple(a for a in AT if a != 3_340)


def test_the_chart_marks_each_outlier_and_shades_no_span() -> None:
    diag = analyze_run(_run())
    notes = _notes(diag.findings)
    (gn,) = [p for p in build_panels(diag.ev, diag.findings) if p.key == GRAD_NORM]
    (trace,) = [t for t in gn.figure["data"] if t.get("name") == "grad norm outliers"]
    assert trace["x"] == list(AT)
    series = diag.ev.series(GRAD_NORM)
    want = [float(f"{series.values[series.steps == a][0]:.6g}") for a in AT]
    assert trace["y"] == want
    # No shaded rectangle from its first outlier to its last: only its highest is marked.
    shapes = gn.figure["layout"].get("shapes", [])
    assert not [
        sh for sh in shapes if sh.get("x0") == notes.start_step and sh.get("x1") == notes.end_step
    ]
    (marks,) = [t for t in gn.figure["data"] if t.get("name") == "findings"]
    assert marks["x"] == [1_610]


def test_compare_finds_outliers_at_the_same_steps_in_two_runs() -> None:
    """Two seeds on one data order with outliers at the same steps: the batches behind them.
    The steps come from the note's events."""
    a, b = analyze_run(_run(seed=1)), analyze_run(_run(seed=2, at=AT[:5]))
    shared = shared_spikes([a, b], ["a", "b"])
    assert [(g["kind"], g["step"]) for g in shared] == [("grad_norm_spike", s) for s in AT[:5]]


def test_the_note_joins_no_incident_by_its_first_step() -> None:
    """Its first outlier is no onset of anything: the warning of spikes recurring every 50
    steps from step 500 is an incident of its own, not one with the note that begins at the
    same step."""
    s, loss = healthy_loss(6_000)
    _, gn = healthy_grad_norm(6_000, seed=11)
    gn = gn.copy()
    gn[500::50] *= 3.0
    diag = analyze_run(run_from_frame(long_frame({"loss": (s, loss), "grad_norm": (s, gn)})))
    notes = _notes(diag.findings)
    (periodic,) = [f for f in diag.findings if f.kind is FindingKind.PERIODIC_SPIKES]
    assert notes.start_step == periodic.start_step == 500
    (inc,) = diag.incidents
    assert inc.findings == [periodic]


def test_configured_to_warnings_there_is_no_note() -> None:
    cfg = Config(detectors={"spikes": {"absorbed_gn_severity": "warning"}})
    diag = analyze_run(_run(), cfg)
    assert not [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_OUTLIERS]
    gn = [f for f in diag.findings if f.kind is FindingKind.GRAD_NORM_SPIKE]
    assert [f.peak_step for f in gn] == list(AT)
    assert all(f.severity is Severity.WARNING for f in gn)


def test_the_spike_table_says_where_the_outliers_are() -> None:
    """The report's spike table lists the spikes with a shape to read; it says that the
    absorbed outliers are a note, and with no other spike it does not say "No spike found"."""
    import re

    from forensics.report import render_html

    page = render_html(analyze_run(_run()), plotlyjs="cdn")
    section = page[page.index('<section id="spikes">') :]
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", section[: section.index("</section>")]))
    assert "Not in this table: 10 grad-norm outliers the optimizer absorbed" in text, text
    assert "No other spike found." in text and "No spike found." not in text


def test_compare_has_the_note_in_both_runs_wherever_the_first_outlier_is() -> None:
    """Both runs had absorbed outliers, the first at step 700 in one and 1,130 in the other:
    "in both", not one "only in" each side."""
    from forensics.compare import finding_diff

    a, b = analyze_run(_run(seed=1)), analyze_run(_run(seed=2, at=AT[1:]))
    diff = finding_diff(a, b)
    assert [(d["kind"], d["step"], d["other_step"]) for d in diff["both"]] == [
        ("grad_norm_outliers", 700, 1_130)
    ]
    assert diff["only_reference"] == diff["only_other"] == []
