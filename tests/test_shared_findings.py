"""The divergence detector computes its findings once per evidence (the spike detector reads
the diverged stretches first): every call answers as a fresh computation, with its own
copies."""

from __future__ import annotations

from test_nan_divergence import _diverging, _run

from forensics.detectors.divergence import DivergenceDetector
from forensics.evidence import Evidence
from forensics.params import DivergenceParams


def test_divergence_findings_are_shared_and_copied() -> None:
    s, v, g = _diverging(seed=1)
    run = _run(train__loss=(s, v), train__grad_norm=(s, g))
    fresh = DivergenceDetector()._detect(Evidence(run))
    assert fresh
    ev = Evidence(run)
    stretches = ev.diverged  # computes the findings first
    assert stretches == [(f.start_step, f.end_step) for f in fresh]
    det = DivergenceDetector(ev.params["divergence"])
    first, second = det.detect(ev), det.detect(ev)
    assert first == fresh and second == fresh
    pairs = zip(first, second, strict=True)
    assert all(a is not b and a.measures is not b.measures for a, b in pairs)
    # other parameters: computed on their own
    other = DivergenceParams(loss_rise=0.9)
    assert DivergenceDetector(other).detect(ev) == DivergenceDetector(other)._detect(Evidence(run))
