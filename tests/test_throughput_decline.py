"""A slow throughput decline (the article's "persistently low throughput", 7.1): the rate ends
30% or more below its early level without any single drop that deep, so the rolling baseline
of the drop check follows it down and never sees it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from synthetic import long_frame, run_from_frame

from forensics.detectors.throughput import ThroughputDetector
from forensics.evidence import Evidence
from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze


def _write(path: Path, n: int, rate: np.ndarray, *, step_time: bool = False) -> Path:
    """A JSONL log: a healthy loss, a flat grad norm, and the rate (tokens/s, or the step
    time in seconds for 4,096 tokens a step)."""
    rng = np.random.default_rng(0)
    path.mkdir(parents=True, exist_ok=True)
    with (path / "metrics.jsonl").open("w") as fh:
        for i in range(n):
            s = i + 1
            row = {
                "step": s,
                "loss": 2 + 3 * np.exp(-s / 2000) + 0.03 * rng.standard_normal(),
                "lr": 3e-4,
                "grad_norm": abs(0.5 + 0.05 * rng.standard_normal()),
            }
            if step_time:
                row["step_time"] = 4096 / rate[i]
            else:
                row["tokens_per_sec"] = rate[i]
            fh.write(json.dumps(row) + "\n")
    return path


def _decline(n: int, start: int, lost: float, seed: int = 1, noise: float = 0.02) -> np.ndarray:
    """30,000 tokens/s, falling linearly from ``start`` to ``lost`` of it lost at the end."""
    rng = np.random.default_rng(seed)
    s = np.arange(1, n + 1)
    frac = np.clip((s - start) / (n - start), 0, 1) * lost
    return 30_000 * (1 - frac) * (1 + noise * rng.standard_normal(n))


@pytest.mark.parametrize("step_time", [False, True])
def test_a_slow_decline_to_40_percent_lower_is_a_warning(tmp_path: Path, step_time: bool) -> None:
    """20,000 steps; from step 5,000 the rate falls linearly to 40% below its level. It read
    HEALTHY: every point sits within 30% of the 100 points before it."""
    n = 20_000
    run = _write(tmp_path / "run", n, _decline(n, 5_000, 0.4), step_time=step_time)
    d = analyze(run)
    (f,) = [g for g in d.findings if g.kind is FindingKind.THROUGHPUT_DROP]
    assert f.severity is Severity.WARNING
    assert f.measures["shape"] == "gradual" and f.measures["recovered"] is False
    # the last 2,000 points sit around step 19,000: 14,000 of the 15,000 declining steps
    assert f.measures["drop_pct"] == pytest.approx(40 * 14 / 15, abs=1.5)
    assert abs(f.start_step - 5_000) <= 600, f.start_step
    assert f.onset_range is not None and f.onset_range[0] <= 5_000 <= f.onset_range[1]
    assert f.end_step == n
    if step_time:
        assert f.summary.startswith("Step time rose slowly from 0.1365 s/step to"), f.summary
    else:
        assert f.summary.startswith("Throughput declined slowly to 37% below its early level"), (
            f.summary
        )
    assert "over steps 1,001-3,000" in f.summary and "steps 18,001-20,000" in f.summary
    assert d.verdict != "healthy"


def test_the_levels_in_the_sentence_are_the_medians_of_the_windows_it_names(
    tmp_path: Path,
) -> None:
    n = 20_000
    rate = _decline(n, 5_000, 0.4)
    d = analyze(_write(tmp_path / "run", n, rate))
    (f,) = [g for g in d.findings if g.kind is FindingKind.THROUGHPUT_DROP]
    assert f.measures["baseline"] == pytest.approx(float(np.median(rate[1_000:3_000])))
    assert f.measures["level"] == pytest.approx(float(np.median(rate[-2_000:])))
    assert f"{f.measures['baseline']:,.0f} tokens/s over steps 1,001-3,000" in f.summary


def _detect(rate: np.ndarray) -> list:  # noqa: ANN001
    s = np.arange(1, len(rate) + 1)
    return ThroughputDetector().detect(
        Evidence(run_from_frame(long_frame({"tokens_per_sec": (s, rate)})))
    )


@pytest.mark.parametrize("lost", [0.0, 0.2, 0.28])
def test_a_decline_under_the_30_percent_line_is_quiet(lost: float) -> None:
    assert _detect(_decline(20_000, 5_000, lost)) == []


def test_a_slow_dip_that_comes_back_is_quiet() -> None:
    """Down 40% by the middle, back by the end: it ends at its early level."""
    n = 20_000
    rng = np.random.default_rng(3)
    s = np.arange(1, n + 1)
    frac = 0.4 * (1 - np.abs(s - n / 2) / (n / 2))
    assert _detect(30_000 * (1 - frac) * (1 + 0.02 * rng.standard_normal(n))) == []


def test_a_noisy_flat_rate_is_quiet() -> None:
    """10% noise a point and a slow wander of +-10%: no trend to the end."""
    n = 20_000
    rng = np.random.default_rng(5)
    s = np.arange(1, n + 1)
    wander = 0.1 * np.sin(2 * np.pi * s / 7_000)
    assert _detect(30_000 * (1 + wander) * (1 + 0.1 * rng.standard_normal(n))) == []


def test_a_sudden_drop_to_the_end_is_reported_once() -> None:
    """A 45% step down at 12,000 that stays down: the drop check's unrecovered finding, not a
    second, gradual one."""
    n = 20_000
    rng = np.random.default_rng(2)
    s = np.arange(1, n + 1)
    rate = 30_000 * np.where(s >= 12_000, 0.55, 1.0) * (1 + 0.02 * rng.standard_normal(n))
    (f,) = _detect(rate)
    assert f.measures["shape"] == "sudden" and f.start_step == 12_000
