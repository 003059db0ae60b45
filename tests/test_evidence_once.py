"""Every evidence signal is computed once per run (issue 11).

``analyze_run`` builds one :class:`~forensics.evidence.Evidence`; the detectors, the diagnosis
(checklists, rollback advice) and the report's charts all read it. Here the functions behind
the evidence's signals are wrapped with counters, a sample run is analysed and its report
rendered, and no signal may have been computed twice.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import forensics.detectors.drift as drift_mod
import forensics.evidence as evidence_mod
import forensics.evidence.baseline as baseline_mod
import forensics.evidence.checkpoints as checkpoints_mod
import forensics.evidence.gap as gap_mod
import forensics.evidence.schedule as schedule_mod
import forensics.evidence.spike_context as context_mod
import forensics.evidence.spikes as spikes_mod
from forensics.pipeline import analyze_run, read_options, read_run
from forensics.report.render import render_html
from forensics.run import Run

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted(
    p.name for p in (ROOT / "sample_runs").iterdir() if p.is_dir() and p.name != "generator"
)

# module, function, what tells two calls apart (a signal per metric is one signal per metric)
SIGNALS: list[tuple[Any, str, Callable[[tuple[Any, ...]], tuple[Any, ...]]]] = [
    (gap_mod, "train_val_gap", lambda a: a[1:2]),  # one gap per held-out loss
    (baseline_mod, "warmup_end", lambda a: ()),
    (baseline_mod, "grad_norm_baseline", lambda a: ()),
    (baseline_mod, "param_norm_baseline", lambda a: ()),
    (drift_mod, "analyze_drift", lambda a: ()),
    (spikes_mod, "find_spikes", lambda a: (a[1],)),
    (schedule_mod, "lr_schedule", lambda a: ()),
    (context_mod, "lr_kinks", lambda a: ()),
    (context_mod, "scale_cascades", lambda a: ()),
    (context_mod, "drop_windows", lambda a: ()),
    (context_mod, "revealed_periods", lambda a: ()),
    (checkpoints_mod, "known_checkpoints", lambda a: ()),
]


def _count(
    monkeypatch: pytest.MonkeyPatch, attempts: collections.Counter[tuple[Any, ...]] | None = None
) -> collections.Counter[tuple[Any, ...]]:
    """Counters of the run's signals. A replaced attempt (forensics.replaced) is a run of its
    own with its own evidence: what its analysis computes is counted in ``attempts``, per
    attempt judged (key ``("judged",)``), apart from the run's."""
    counts: collections.Counter[tuple[Any, ...]] = collections.Counter()
    inside = [False]
    for mod, name, key in SIGNALS:
        f = getattr(mod, name)

        def counted(*a: Any, _f: Any = f, _name: str = name, _key: Any = key, **k: Any) -> Any:
            if inside[0] and attempts is not None:
                attempts[(_name, *_key(a))] += 1
            else:
                counts[(_name, *_key(a))] += 1
            return _f(*a, **k)

        monkeypatch.setattr(mod, name, functools.wraps(f)(counted))
    import forensics.replaced as replaced_mod

    judge = replaced_mod._judge

    def judged(*a: Any, **k: Any) -> Any:
        inside[0] = True
        if attempts is not None:
            attempts[("judged",)] += 1
        try:
            return judge(*a, **k)
        finally:
            inside[0] = False

    monkeypatch.setattr(replaced_mod, "_judge", judged)
    return counts


def _analyse(name: str) -> None:
    run = read_run(ROOT / "sample_runs" / name, options=read_options(None, False))
    render_html(analyze_run(run))


@pytest.mark.parametrize("name", SAMPLES)
def test_each_signal_computed_once(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Detecting, diagnosing and rendering one run computes each evidence signal once."""
    attempts: collections.Counter[tuple[Any, ...]] = collections.Counter()
    counts = _count(monkeypatch, attempts)
    _analyse(name)
    # the counters are in the path: every run has a loss, so these are asked for
    for signal in [("warmup_end",), ("find_spikes", "loss"), ("revealed_periods",)]:
        assert counts[signal] == 1, (signal, dict(counts))
    twice = {k: v for k, v in counts.items() if v > 1}
    assert not twice, f"computed more than once: {twice}"
    # Each replaced attempt's own evidence computes each of its signals once, too.
    n = attempts.pop(("judged",), 0)
    assert all(v <= n for v in attempts.values()), (n, dict(attempts))


def test_train_val_signals_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run with train and val loss: the gap is computed once for the detector, the
    checklists and the chart."""
    counts = _count(monkeypatch)
    _analyse("overfitting")
    assert counts[("train_val_gap", "val_loss")] == 1


@pytest.mark.parametrize("name", ["healthy", "overfitting"])
def test_each_series_read_from_the_run_once(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every canonical series is read from the run once: all later reads go through the
    evidence's cached arrays (and each derived helper runs once)."""
    counts: collections.Counter[tuple[Any, ...]] = collections.Counter()
    series = Run.series

    def counted(self: Run, metric: str, layer: int | None = None) -> Any:
        counts[(metric, layer)] += 1
        return series(self, metric, layer)

    # The evidence also reads a series straight from the view when it is one row per step
    # (evidence._one_row_per_step): a read from the run too.
    direct = evidence_mod._one_row_per_step

    def counted_direct(run: Run, metric: str, layer: int | None) -> Any:
        got = direct(run, metric, layer)
        if got is not None:
            counts[(metric, layer)] += 1
        return got

    run = read_run(ROOT / "sample_runs" / name, options=read_options(None, False))
    monkeypatch.setattr(Run, "series", counted)
    monkeypatch.setattr(evidence_mod, "_one_row_per_step", counted_direct)
    f = context_mod.epoch_boundaries

    def boundaries(*a: Any, **k: Any) -> Any:
        counts[("epoch_boundaries",)] += 1
        return f(*a, **k)

    monkeypatch.setattr(context_mod, "epoch_boundaries", boundaries)
    render_html(analyze_run(run))
    assert counts[("loss", None)] == 1
    twice = {k: v for k, v in counts.items() if v > 1}
    assert not twice, f"read more than once: {twice}"


def test_baseline_says_its_window_with_digits_grouped() -> None:
    """The baseline's description (shown beside every chart) writes its count and steps as
    the rest of the report does: 1,000 and 12,000-12,499."""
    from forensics.evidence.baseline import series_baseline

    steps = np.arange(12_000, 20_000, 0.5).astype(np.int64)  # two points a step
    b = series_baseline(steps, np.ones(len(steps)), window=500)
    assert b is not None and b.n_points == 1000
    assert b.how == "median of 1,000 points, steps 12,000-12,499"
