"""Titles of the project's issues, for xfail markers on capabilities still being built.

A test for a capability whose issue is open is marked ``xfail(strict=True, reason=TITLE)``;
the issue that delivers the capability removes the marker.
"""

import pytest

SKELETON = (
    "Walking skeleton: `forensics analyze` end to end, the findings contract, README set-up and CI"
)
SAMPLE_RUNS = "sample_runs/: real small training runs with every pathology the article describes"
IMPORTERS_I = (
    "Importers I: TensorBoard (fast, restart-aware), JSONL, HF trainer_state.json, "
    "Lightning CSV, one vocabulary of vital signs"
)
IMPORTERS_II = "Importers II: W&B exports and the text logs big-model trainers actually have"
SPIKES = (
    "Spike forensics: detection, shape, classification, periodicity, divergence, NaN and "
    "loss-scale events"
)
TRENDS = (
    "Trend forensics: grad-norm drift against the loss, eval regression, param norm, "
    "layers, activations, train/val gap, plateau, throughput, stalls, memory"
)
REPORT = (
    "Diagnosis and the HTML report: prescriptions, timeline, checklists, rollback advice, "
    "an offline page for the post-mortem"
)
JUDGEMENT = "Judgement on real runs: schedule-aware, shape-aware, calibrated on healthy runs"


def open_issue(title: str) -> pytest.MarkDecorator:
    """Mark a test as waiting on an open issue (strict: it must start failing-to-xfail once
    fixed)."""
    return pytest.mark.xfail(strict=True, reason=title)
