"""Detector parameters a configuration file sets are checked for what they can mean, one line
per problem, and a fitted onset whose range is its own step alone reads as an exact onset.

A configuration with ``warn_ratio = 0.5`` had been taken: every grad norm above half its
baseline became a warning ("Grad norm rose from 0.496 to 0.79 (1.6x)", a green sample run
turned yellow), and the drift's onset read "anywhere in 32-32"."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from forensics.cli import app
from forensics.errors import ConfigError
from forensics.findings import Finding, FindingKind, Severity, onset_at
from forensics.params import resolve

SAMPLES = Path(__file__).resolve().parent.parent / "sample_runs"


@pytest.mark.parametrize(
    ("detector", "key", "value", "message"),
    [
        ("grad_norm_drift", "warn_ratio", 0.5, "warn_ratio = 0.5 must be above 1"),
        ("spikes", "grad_norm_min_ratio", 1.0, "grad_norm_min_ratio = 1.0 must be above 1"),
        ("train_val", "accel_ratio", 0.9, "accel_ratio = 0.9 must be above 1"),
        ("throughput", "drop", 30, "drop = 30.0 must be between 0 and 1"),
        ("grad_norm_drift", "warn_ratio", 4.0, "warn_ratio = 4.0 is above crit_ratio = 3.0"),
    ],
)
def test_values_a_parameter_cannot_mean_are_refused(
    detector: str, key: str, value: float, message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        resolve({detector: {key: value}})


def test_fractions_and_ordered_lines_that_make_sense_are_kept() -> None:
    p = resolve(
        {
            "grad_norm_drift": {"warn_ratio": 1.5, "crit_ratio": 1.5},
            "periodic": {"shrink_ratio": 0.5},  # a fraction, not a multiple of a baseline
            "throughput": {"drop": 0.25},
        }
    )
    assert p.grad_norm_drift.warn_ratio == p.grad_norm_drift.crit_ratio == 1.5
    assert p.throughput.drop == 0.25


def test_the_command_line_says_it_in_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "f.toml"
    cfg.write_text("[detectors.grad_norm_drift]\nwarn_ratio = 0.5\n")
    res = CliRunner().invoke(
        app, ["analyze", str(SAMPLES / "healthy"), "--no-report", "--config", str(cfg)]
    )
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        f"forensics: error: {cfg}: detector grad_norm_drift: warn_ratio = 0.5 must be above 1 "
        "(a multiple of the baseline; default 2.0)"
    ]


def test_a_range_of_one_step_is_an_exact_onset() -> None:
    f = Finding(
        FindingKind.GRAD_NORM_DRIFT, Severity.WARNING, "grad_norm", 32, "s", onset_range=(32, 32)
    )
    assert f.onset_range is None and onset_at(f.start_step, f.onset_range) == "32"
    g = Finding(
        FindingKind.GRAD_NORM_DRIFT, Severity.WARNING, "grad_norm", 32, "s", onset_range=(30, 32)
    )
    assert g.onset_range == (30, 32)
