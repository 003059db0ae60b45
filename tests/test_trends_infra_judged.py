"""throughput_drop, stall and memory_growth state what they were judged against (issue 11):
the numbers a chart draws for them, consistent with the measures."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import run_from_frame, trend_infra

from forensics.detectors import params_for
from forensics.detectors.memory import MemoryGrowthDetector
from forensics.detectors.stall import StallDetector
from forensics.detectors.throughput import ThroughputDetector
from forensics.evidence import Evidence


@pytest.mark.parametrize("use_step_time", [False, True])
def test_throughput_drop_line(use_step_time: bool) -> None:
    """The 30% line under the frozen baseline, in the source's units (s/step: baseline / 0.7)."""
    frame, _ = trend_infra(use_step_time=use_step_time)
    (f,) = ThroughputDetector().detect(Evidence(run_from_frame(frame)))
    j = f.judged_against
    assert j["baseline"] == f.measures["baseline"] and j["drop_ratio"] == 0.3
    if use_step_time:
        assert j["drop_line"] == pytest.approx(j["baseline"] / 0.7)
        assert f.measures["level"] > j["drop_line"]
    else:
        assert j["drop_line"] == pytest.approx(0.7 * j["baseline"])
        assert f.measures["level"] < j["drop_line"]
    assert j["baseline_points"] == 100


def test_throughput_drop_line_follows_the_configuration() -> None:
    frame, _ = trend_infra()
    det = ThroughputDetector(params_for(ThroughputDetector, {"drop": 0.4}))
    (f,) = det.detect(Evidence(run_from_frame(frame)))
    assert f.judged_against["drop_line"] == pytest.approx(0.6 * f.judged_against["baseline"])


def test_stall_line() -> None:
    """factor x the usual interval (and the minimum silence): the gap is beyond that line."""
    frame, _ = trend_infra(drop=None, stall_at=4000)
    (f,) = StallDetector().detect(Evidence(run_from_frame(frame)))
    j, m = f.judged_against, f.measures
    assert j["factor"] == 20.0 and j["expected_seconds"] == m["expected_seconds"]
    assert j["expected_seconds"] == pytest.approx(m["usual_step_seconds"] * m["steps_between"])
    assert j["stall_line_seconds"] == max(20.0 * m["expected_seconds"], 300.0)
    assert m["gap_seconds"] > j["stall_line_seconds"]
    assert j["usual_pause_seconds"] is None


def test_memory_thresholds() -> None:
    frame, _ = trend_infra(drop=None, leak=1.0)
    (f,) = MemoryGrowthDetector().detect(Evidence(run_from_frame(frame)))
    j, m = f.judged_against, f.measures
    assert j["min_growth_pct"] == 5.0 and m["growth_pct"] > j["min_growth_pct"]
    assert j["level_off"] == 0.5 and m["late_ratio"] > j["level_off"]
    assert j["late_slope_floor_per_1k_steps"] == pytest.approx(0.5 * m["slope_per_1k_steps"])
    assert m["late_slope_per_1k_steps"] > j["late_slope_floor_per_1k_steps"]
    steps = Evidence(run_from_frame(frame)).series("memory").steps
    assert j["analysed_from"] == pytest.approx(steps[0] + 0.1 * np.ptp(steps))
