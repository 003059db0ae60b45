"""The watcher's reused spike trend fits (forensics.evidence.reuse) change no finding.

Each run is grown poll by poll (its frame cut at increasing steps, as the watcher sees it
while the writer appends); at every poll the analysis made with the watcher's memo (kept
across the polls) must equal, to the last bit, an analysis without it: every finding's
``to_dict`` and every spike's measures (what the report draws).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from forensics.config import Config
from forensics.evidence.reuse import TrendMemo
from forensics.importers import read_run
from forensics.pipeline import analyze_run, read_options
from forensics.run import Run

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ["periodic_spikes", "bad_batch", "loss_scale_collapse", "divergence", "healthy"]


def _cut(run: Run, last_step: int) -> Run:
    frame = run.frame.filter(pl.col("step").is_null() | (pl.col("step") <= last_step))
    return Run(run.name, run.path, run.format, frame, config=dict(run.config))


def _plain(v: Any) -> Any:
    """Values compared exactly; NaN equal to NaN (bitwise the same computation)."""
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _drawn(run: Run, memo: TrendMemo | None) -> dict[str, Any]:
    config = Config()
    if memo is None:
        diag = analyze_run(run, config)
    else:
        with memo.active():
            diag = analyze_run(run, config)
    ev = diag.ev
    spikes = {
        m: [
            (s.start_step, s.peak_step, s.end_step, s.alarm_at, dict(s.measures))
            for s in ev.spikes(m)
        ]
        for m in ev.run.metrics()
    }
    return _plain({"findings": [f.to_dict() for f in diag.findings], "spikes": spikes})


def _grow(run: Run, polls: int) -> TrendMemo:
    steps = run.frame.get_column("step").drop_nulls()
    lo, hi = int(steps.min()), int(steps.max())
    memo = TrendMemo()
    cuts = sorted({int(x) for x in np.linspace(lo + (hi - lo) // 3, hi, polls)})
    for cut in cuts:
        part = _cut(run, cut)
        assert _drawn(part, memo) == _drawn(part, None), f"{run.name} cut at step {cut}"
    return memo


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_runs_grown_poll_by_poll(name: str) -> None:
    run = read_run(ROOT / "sample_runs" / name, options=read_options(Config()))
    memo = _grow(run, 6)
    if name != "healthy":
        # Spikes before the new data are reused, not refitted: the memo is doing its job.
        assert memo.hits > 0


def test_generated_run_cut_at_many_points(tmp_path: Path) -> None:
    from benchmarks.generate import series, write_jsonl

    write_jsonl(tmp_path / "run", series(6000))
    run = read_run(tmp_path / "run", options=read_options(Config()))
    memo = _grow(run, 12)
    assert memo.hits > 0 and memo.misses > 0


def test_changed_inputs_are_refitted() -> None:
    """A spike whose points before the onset changed is a miss, not a stale reuse."""
    from forensics.evidence.reuse import fit_trend_reusing
    from forensics.evidence.spike_shape import ShapeParams, fit_trend

    p = ShapeParams(
        trend_window=200, band_k=3.0, recover_steps=500, plateau_window=200, plateau_tol=0.1
    )
    steps = np.arange(100, dtype=np.int64)
    y = np.log1p(np.linspace(5.0, 2.0, 100)) + np.sin(np.arange(100)) * 0.01
    memo = TrendMemo()
    with memo.active():
        first = fit_trend_reusing(steps, y, 90, 1.0, 0.01, p)
        again = fit_trend_reusing(steps, y.copy(), 90, 1.0, 0.01, p)
        y2 = y.copy()
        y2[50] += 0.5
        changed = fit_trend_reusing(steps, y2, 90, 1.0, 0.01, p)
    assert (memo.hits, memo.misses) == (1, 2)
    assert first == again == fit_trend(steps, y, 90, 1.0, 0.01, p)
    assert changed == fit_trend(steps, y2, 90, 1.0, 0.01, p) != first


def test_the_watcher_keeps_its_memo_between_polls(tmp_path: Path) -> None:
    """The watcher's analysis goes through its memo: a poll after an append reuses fits."""
    from benchmarks.generate import series, write_jsonl
    from forensics.watch.engine import Watcher

    log = write_jsonl(tmp_path / "run", series(4000))
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-300]))
    watcher = Watcher(tmp_path / "run")
    try:
        watcher.poll()
        assert len(watcher.trend_memo) > 0 and watcher.trend_memo.hits == 0
        with log.open("ab") as f:
            f.write(b"".join(lines[-300:]))
        watcher.poll()
        assert watcher.trend_memo.hits > 0
        assert watcher.status.diagnosis is not None
        assert watcher.status.run is not None and watcher.status.run.last_step == 3999
    finally:
        watcher.close()


def _filters() -> dict[str, Any]:
    from forensics.evidence import robust
    from forensics.evidence.trend_utils import rolling_median

    return {
        "centered 25": lambda v: rolling_median(v, 25),
        "centered 4": lambda v: rolling_median(v, 4),
        "trailing 7": lambda v: rolling_median(v, 7, center=False),
        "noise scale": lambda v: robust.noise_scale(v, 20),
        "score": lambda v: robust.score(np.arange(len(v)), v, window=20).to_numpy(),
    }


@pytest.mark.parametrize("name", list(_filters()))
def test_local_filters_on_their_tail_equal_the_whole(name: str) -> None:
    """Series grown by appends, by appends that also rewrite the last points (the despike's
    deviations from a median whose last values moved), with ties and long flat stretches:
    the memo's tail computation equals the whole computation bit for bit, and a series that
    changed early is computed whole."""
    f = _filters()[name]
    rng = np.random.default_rng(7)
    full = np.exp(np.round(rng.normal(size=3000), 2)) + np.repeat(rng.random(30), 100)
    full[1000:1300] = 2.0  # a flat stretch: ties everywhere
    memo = TrendMemo()
    for n in (400, 401, 700, 1500, 1500, 2600, 3000):
        with memo.active():
            v = full[:n].copy()
            v[-5:] *= 1.01  # the last points differ from what the last poll saw
            got = f(v)
        assert np.array_equal(np.asarray(got), np.asarray(f(v)), equal_nan=True), n
    assert memo.local_hits >= 5
    hits = memo.local_hits
    v = full.copy()
    v[3] += 1.0  # changed at the start: nothing to reuse
    with memo.active():
        got = f(v)
    assert np.array_equal(np.asarray(got), np.asarray(f(v)), equal_nan=True)
    assert memo.local_hits == hits


def test_a_series_with_a_nan_is_computed_whole() -> None:
    from forensics.evidence.trend_utils import rolling_median

    v = np.linspace(1.0, 2.0, 500)
    memo = TrendMemo()
    with memo.active():
        rolling_median(v[:400], 9)
    v[450] = np.nan
    with memo.active():
        got = rolling_median(v, 9)
    assert memo.local_hits == 0
    assert np.array_equal(got, rolling_median(v, 9), equal_nan=True)


def test_resolution_merges_the_distinct_values_of_the_appended_points() -> None:
    """The printing resolution (robust.resolution) of a grown series, through the memo, from
    the last poll's distinct values and the appended points': equal to the whole computation
    (values printed with few decimals, zeros of both signs, values re-logged later); a series
    rewritten before its end (the mutation check) is computed whole and still equal."""
    from forensics.evidence import robust

    rng = np.random.default_rng(11)
    full = np.round(rng.normal(size=4000), 2)
    full[::97] = 0.0
    full[::89] = -0.0
    full[3000:] = np.round(rng.normal(size=1000), 3)  # a finer tail: the resolution moves
    memo = TrendMemo()
    for n in (300, 301, 1000, 1000, 2999, 3001, 4000):
        with memo.active():
            got = robust.resolution(full[:n])
        assert got == robust.resolution(full[:n]) and got > 0, n
    assert memo.distinct_hits >= 5
    hits = memo.distinct_hits
    v = full.copy()
    v[20:1500] = np.round(rng.normal(size=1480), 4)  # rewritten finer: another resolution
    with memo.active():
        got = robust.resolution(v)
    assert got == robust.resolution(v) != robust.resolution(full)
    assert memo.distinct_hits == hits
