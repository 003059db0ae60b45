"""Settings reach the detectors that reuse another detector's analysis."""

from __future__ import annotations

from forensics.detectors import build


def _by_name(dets):
    return {d.name: d for d in dets}


def test_spike_settings_reach_periodicity_and_loss_scale() -> None:
    """[tool.forensics.detectors.spikes] also shapes the spikes periodic_spikes and loss_scale_drop look at."""
    import inspect

    from forensics.detectors.spikes import SpikeDetector

    dets = _by_name(build({}))
    assert dets["periodic"].spike_params == {} and dets["loss_scale"].spike_params == {}

    first = next(p for p in list(inspect.signature(SpikeDetector.__init__).parameters)[1:])
    default = inspect.signature(SpikeDetector.__init__).parameters[first].default
    dets = _by_name(build({"spikes": {first: default}, "grad_norm_drift": {"warn_ratio": 2.5}}))
    assert dets["periodic"].spike_params == {first: default}
    assert dets["loss_scale"].spike_params == {first: default}
    assert dets["eval_regression"].drift_params == {"warn_ratio": 2.5}
    # An explicit setting on the reusing detector wins.
    dets = _by_name(build({"spikes": {first: default}, "periodic": {"spike_params": {}}}))
    assert dets["periodic"].spike_params == {}
