"""Spike settings reach every detector that judges spikes, and spikes are found once per run."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import long_frame, run_from_frame, spiky_loss

import forensics.evidence.spikes as evidence_spikes
from forensics.detectors import detect
from forensics.findings import FindingKind
from forensics.params import resolve
from forensics.run import Run

SPIKES_AT = [1000, 1700, 2400, 3100, 3800]


def _run() -> Run:
    """Five 1.8x loss spikes every 700 steps, the fp16 loss scale halving at the third, and a
    grad norm with nothing in it."""
    (s, v), _ = spiky_loss(5000, spikes=[dict(at=a, height=0.8, tau=10) for a in SPIKES_AT])
    scale = np.where(s >= 2400, 2.0**15, 2.0**16)
    gn = 1.0 + 0.05 * np.random.default_rng(1).standard_normal(len(s))
    return run_from_frame(
        long_frame({"train/loss": (s, v), "loss_scale": (s, scale), "train/grad_norm": (s, gn)})
    )


def _kinds(findings) -> dict[FindingKind, list]:
    out: dict[FindingKind, list] = {}
    for f in findings:
        out.setdefault(f.kind, []).append(f)
    return out


def test_spike_settings_reach_periodicity_and_loss_scale() -> None:
    """[tool.forensics.detectors.spikes] shapes the spikes periodic_spikes and loss_scale_drop
    judge: with the defaults the five spikes recur and one coincides with the scale drop; with a
    height ratio above theirs, none is a spike for any of the three detectors."""
    found = _kinds(detect(_run(), {}))
    assert [f.start_step for f in found[FindingKind.LOSS_SPIKE]] == SPIKES_AT
    (periodic,) = found[FindingKind.PERIODIC_SPIKES]
    assert periodic.measures["count"] == 5
    (drop,) = found[FindingKind.LOSS_SCALE_DROP]
    assert drop.measures["coincides_with_spike"] is True and drop.measures["spike_step"] == 2400

    run = _run()
    found = _kinds(detect(run, {"spikes": {"loss_min_ratio": 3.0, "loss_gross_ratio": 3.0}}))
    assert FindingKind.LOSS_SPIKE not in found
    assert FindingKind.PERIODIC_SPIKES not in found
    # Without a spike in its steps the one halving is ordinary scaling: noted, not reported.
    assert FindingKind.LOSS_SCALE_DROP not in found
    assert any("single loss-scale halving" in n for n in run.notes)


@pytest.mark.parametrize("raw", [{}, {"spikes": {"z_threshold": 5.0}}], ids=["default", "set"])
def test_spikes_are_found_once_per_metric_per_analysis(
    raw: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spike, periodicity and loss-scale detectors share one computation of each series'
    spikes: find_spikes runs once for the loss and once for the grad norm."""
    calls: list[str] = []
    real = evidence_spikes.find_spikes

    def counting(ev, metric):
        calls.append(metric)
        return real(ev, metric)

    monkeypatch.setattr(evidence_spikes, "find_spikes", counting)
    found = detect(_run(), resolve(raw))
    assert FindingKind.PERIODIC_SPIKES in {f.kind for f in found}
    assert sorted(calls) == ["grad_norm", "loss"]
