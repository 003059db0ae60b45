"""An onset fitted as a bend on binned points carries the steps it cannot be told from.

grad_norm_drift, memory_growth, layer_grad_shift and a param-norm surge place their onset at
the step of one bin's median (a two-piece fit whose knot can only sit there). The fit is
almost as good at a neighbouring bin's step, so the finding's ``onset_range`` spans the
neighbours; the true bend of each crafted series lies inside it. An onset the detector reads
at a logged point (a throughput drop, a spike) has none.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import synthetic as syn

from forensics.causes import CONTRADICTED, SUPPORTED, causes_of
from forensics.detectors import load
from forensics.evidence import Evidence
from forensics.evidence.trend_utils import bend_range
from forensics.findings import Finding, FindingKind, Severity
from forensics.incidents import build_incidents


def test_bend_range_spans_the_neighbouring_bins() -> None:
    xb = np.array([5.0, 15.0, 25.0, 35.0])
    assert bend_range(xb, 25) == (15, 35)
    assert bend_range(xb, 24) == (15, 35)  # (the bin nearest the onset)
    assert bend_range(xb, 5) == (5, 15)  # at an end: its own step bounds that side
    assert bend_range(xb, 35) == (25, 35)
    assert bend_range(np.array([10.5, 20.5, 30.5]), 20) == (10, 31)  # whole steps, outward


def _found(registry: str, frame: pl.DataFrame, kind: FindingKind) -> Finding:
    found = load(registry)().detect(Evidence(syn.run_from_frame(frame)))
    (f,) = [f for f in found if f.kind is kind]
    return f


def _surging_param_norm() -> pl.DataFrame:
    steps = np.arange(0, 10000, 10)
    rng = np.random.default_rng(3)
    pn = 100.0 * (1 + 0.05 * steps / 10000 + np.where(steps > 6000, (steps - 6000) / 4000, 0))
    return syn.long_frame(
        {
            "loss": syn.healthy_loss(10000, 0, 10)[0:2],
            "param_norm": (steps, pn * (1 + rng.normal(0, 2e-4, len(steps)))),
        }
    )


def _leak_from_3000() -> pl.DataFrame:
    steps = np.arange(0, 8000, 10)
    rng = np.random.default_rng(4)
    mem = 20.0 + np.maximum(steps - 3000, 0) * 0.002 + rng.normal(0, 0.02, len(steps))
    return syn.long_frame({"loss": syn.healthy_loss(8000, 0, 10)[0:2], "memory_gb": (steps, mem)})


@pytest.mark.parametrize(
    ("registry", "frame", "kind", "truth"),
    [
        (
            "grad_norm_drift",
            lambda: syn.trend_grad_norm_drift()[0],
            FindingKind.GRAD_NORM_DRIFT,
            6500,
        ),
        ("memory", _leak_from_3000, FindingKind.MEMORY_GROWTH, 3000),
        ("layers", lambda: syn.trend_layer_shift()[0], FindingKind.LAYER_GRAD_SHIFT, 5000),
        ("param_norm", _surging_param_norm, FindingKind.PARAM_NORM_JUMP, 6000),
    ],
)
def test_a_bend_fitted_on_bins_has_its_range(registry, frame, kind, truth) -> None:
    f = _found(registry, frame(), kind)
    assert f.onset_range is not None, f.summary
    lo, hi = f.onset_range
    assert lo < f.start_step < hi
    if truth is not None:
        assert lo <= truth <= hi, (f.onset_range, f.summary)
    assert f.to_dict()["onset_range"] == [lo, hi]


def test_a_climb_from_the_analysed_start_has_none() -> None:
    """Memory growing from the start of what is analysed: no bend was fitted, and the onset
    is the first analysed step."""
    frame, _ = syn.trend_infra(drop=None, leak=1.0)
    f = _found("memory", frame, FindingKind.MEMORY_GROWTH)
    assert f.onset_range is None


def test_an_onset_read_at_a_logged_point_has_none() -> None:
    frame, _ = syn.trend_infra(leak=0.0)
    found = load("throughput")().detect(Evidence(syn.run_from_frame(frame)))
    assert found and all(f.onset_range is None for f in found)
    assert all(f.to_dict()["onset_range"] is None for f in found)


def _lr_jump_at_6000() -> Evidence:
    """A constant LR doubled off schedule at step 6,000 (logged every 10 steps)."""
    steps = np.arange(0, 10000, 10)
    lr = np.where(steps < 300, 3e-4 * steps / 300, 3e-4) * np.where(steps >= 6000, 2.0, 1.0)
    frame = syn.long_frame(
        {
            "loss": syn.healthy_loss(10000, 0, 10)[0:2],
            "lr": (steps, lr),
            "param_norm": (steps, 100.0 + steps * 1e-3),
        }
    )
    return Evidence(syn.run_from_frame(frame))


def _surge(onset_range: tuple[int, int] | None) -> Finding:
    return Finding(
        kind=FindingKind.PARAM_NORM_JUMP,
        severity=Severity.WARNING,
        metric="param_norm",
        start_step=5950,
        end_step=9990,
        onset_range=onset_range,
        summary="(crafted)",
    )


def test_an_lr_change_inside_the_onset_range_is_not_after_it() -> None:
    """A bend fitted at step 5,950 on bins of about 50 steps, the LR doubled at 6,000: the log
    cannot put the change after the onset, so it is the supported cause (it was contradicted,
    "its unexplained change starts later, at step 6,000"), and the incident does not say it
    came after the first sign."""
    ev = _lr_jump_at_6000()
    ranged, exact = _surge((5900, 6010)), _surge(None)
    by_cause = [{c.cause: c for c in cs} for cs in causes_of(ev, [ranged, exact])]
    got = by_cause[0]["lr_change"]
    assert got.status == SUPPORTED, got.evidence
    assert got.evidence.endswith(
        "within the steps the onset is known to (5,900-6,010: a bend fitted at step 5,950 "
        "fits about as well anywhere there), so not after it"
    )
    assert by_cause[1]["lr_change"].status == CONTRADICTED  # a logged onset: the change is later
    assert "starts later, at step 6,000" in by_cause[1]["lr_change"].evidence
    (inc,) = build_incidents([ranged], [list(by_cause[0].values())])
    assert inc.late == {}
    assert [c.cause for c in inc.supported] == ["lr_change"]


def test_a_control_input_inside_the_head_range_is_not_ordered_after_it() -> None:
    """A memory bend fitted at step 11,990 (known to 11,810-12,171) and an LR change logged at
    12,000: the timeline cannot put the change after the memory's onset."""
    from forensics.timeline import Control, build_timeline

    mem = Finding(
        kind=FindingKind.MEMORY_GROWTH,
        severity=Severity.WARNING,
        metric="memory",
        start_step=11990,
        onset_range=(11810, 12171),
        summary="(crafted)",
    )
    t = build_timeline([mem], [Control("lr_change", "lr", 12000, "the LR doubled")])
    head, lr = t.movers
    assert (head.metric, lr.metric) == ("memory", "lr") and lr.unordered_by == ("range",)
    assert not t.order_resolved
    assert "the memory's onset lies anywhere in steps 11,810-12,171" in t.sentence()
    far = build_timeline([mem], [Control("lr_change", "lr", 12500, "the LR doubled")])
    assert far.order_resolved and "cannot tell" not in far.sentence()


def test_the_range_holds_where_the_memory_sample_starts_to_leak() -> None:
    """The memory_growth sample keeps 1 MB of logits a step from step 300; its memory, logged
    every 10 steps, is flat to 368 MB through step 300 and 378 MB at 310. The bend is fitted
    at step 270 on a sawtooth (memory freed twice later): the first version's range, one
    point either side (260-280), said the onset lay before the leak began. The knots whose fit
    is not told apart from the best (a 95% set) reach past step 300."""
    from pathlib import Path

    from forensics.pipeline import analyze

    diag = analyze(Path(__file__).resolve().parents[1] / "sample_runs" / "memory_growth")
    (f,) = [f for f in diag.findings if f.kind is FindingKind.MEMORY_GROWTH]
    assert f.start_step == 270 and f.onset_range is not None
    lo, hi = f.onset_range
    assert lo < 270 and 300 <= hi <= 320, f.onset_range


def test_a_rootless_sign_inside_a_rooted_finding_range_stays_apart() -> None:
    """A layer-share bend at step 640 (590-690) whose incident's root is an LR change, and a
    throughput drop at 670 with no root: the drop is not joined to the LR blow-up because it
    falls inside the fitted range. Two rootless signs would be one incident."""
    from forensics.causes import Cause

    shift = Finding(
        kind=FindingKind.LAYER_GRAD_SHIFT,
        severity=Severity.WARNING,
        metric="grad_norm_layer",
        start_step=640,
        onset_range=(590, 690),
        measures={"layer": 0},
        summary="(crafted)",
    )
    drop = Finding(
        kind=FindingKind.THROUGHPUT_DROP,
        severity=Severity.WARNING,
        metric="throughput",
        start_step=670,
        summary="(crafted)",
    )
    lr = Cause("lr_change", SUPPORTED, "the LR left its schedule", (401, 500), anchor=401)
    assert len(build_incidents([shift, drop], [[lr], []])) == 2
    assert len(build_incidents([shift, drop], [[], []])) == 1


def test_a_lone_fitted_sign_names_its_range() -> None:
    """The memory_growth sample's one sign read "Only one sign: the memory (onset at step 270,
    memory_growth)" in the banner and the incident, while the leak began at step 300: the
    range the timeline table shows under the onset (220-310) was in no sentence."""
    from pathlib import Path

    from forensics.pipeline import analyze

    diag = analyze(Path(__file__).resolve().parents[1] / "sample_runs" / "memory_growth")
    (f,) = [f for f in diag.findings if f.kind is FindingKind.MEMORY_GROWTH]
    assert f.onset_range is not None
    lo, hi = f.onset_range
    assert diag.order_sentence() == (
        f"Only one sign: the memory (onset at step 270, anywhere in {lo:,}-{hi:,}; memory_growth)."
    )
