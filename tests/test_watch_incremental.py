"""The watcher's incremental analysis (forensics.watch.incremental) finds what a fresh
``analyze_run`` finds, after every poll.

Runs are grown poll by poll, as the watcher sees them while the writer appends (the frame
cut at increasing steps, rows in their file order); at every poll the analysis that carries
the last poll's view, series, trend fits and local filters must equal, to the last bit, an
analysis of the same frame from scratch: every finding's ``to_dict`` (kind, severity, steps,
measures, text) and every spike's measures. Cuts fall before, inside and after spikes, across
a NaN and a restart; a rewritten old value is caught (the mutation check shows the equality
test fails when the prefix checks are switched off).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from forensics.config import Config
from forensics.diagnosis import Diagnosis
from forensics.importers import read_run
from forensics.pipeline import analyze_run, read_options
from forensics.run import Run
from forensics.watch.incremental import IncrementalAnalysis

# The rows in record order, as the watcher's tail reads them (a read for analysis hands a job's
# rows over tag after tag: cuts of it are no prefixes of each other to splice).
_AS_WRITTEN = replace(read_options(Config()), series_order=False)

ROOT = Path(__file__).resolve().parents[1]


def _cut(run: Run, last_step: int) -> Run:
    frame = run.frame.filter(pl.col("step").is_null() | (pl.col("step") <= last_step))
    return _with(run, frame)


def _with(run: Run, frame: pl.DataFrame) -> Run:
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


def _drawn(diag: Diagnosis) -> dict[str, Any]:
    ev = diag.ev
    spikes = {
        m: [
            (s.start_step, s.peak_step, s.end_step, s.alarm_at, dict(s.measures))
            for s in ev.spikes(m)
        ]
        for m in ev.run.metrics()
    }
    return _plain({"findings": [f.to_dict() for f in diag.findings], "spikes": spikes})


def _poll(inc: IncrementalAnalysis, run: Run) -> dict[str, Any]:
    got = _drawn(inc.analyze(run, Config()))
    assert got == _drawn(analyze_run(_with(run, run.frame), Config())), run.frame.height
    return got


def _grow(run: Run, cuts: list[int]) -> IncrementalAnalysis:
    inc = IncrementalAnalysis()
    for cut in cuts:
        _poll(inc, _cut(run, cut))
    return inc


def _even_cuts(run: Run, polls: int) -> list[int]:
    steps = run.frame.get_column("step").drop_nulls()
    lo, hi = int(steps.min()), int(steps.max())  # type: ignore[arg-type]
    return sorted({int(x) for x in np.linspace(lo + (hi - lo) // 3, hi, polls)})


@pytest.mark.parametrize(
    "name", ["periodic_spikes", "bad_batch", "nan", "resumed", "divergence", "healthy"]
)
def test_sample_runs_grown_poll_by_poll(name: str) -> None:
    run = read_run(ROOT / "sample_runs" / name, options=_AS_WRITTEN)
    inc = _grow(run, _even_cuts(run, 6))
    if name != "resumed":  # resumed: rows of its two jobs interleave, cut by step
        assert inc.view.spliced >= 4 and inc.extended > 0


def test_cuts_that_create_extend_and_end_spikes() -> None:
    """Polls that end just before a spike, at its onset, at its peak, inside it, at its
    recovery and after: the spike appears, grows, recovers, exactly as from scratch."""
    run = read_run(ROOT / "sample_runs" / "periodic_spikes", options=_AS_WRITTEN)
    # A copy analyzed: analysis puts a run's frame in view order, the cuts need record order.
    spikes = analyze_run(_with(run, run.frame)).ev.spikes("loss")
    assert len(spikes) >= 2
    window = Config().params.spikes.plateau_window
    cuts: set[int] = set()
    for s in spikes[:2]:
        for step in (s.start_step - 1, s.start_step, s.peak_step, s.peak_step + 1, s.end_step):
            cuts |= {step, step + 3}
        # Around the end of its recovery window and of its plateau window: the last polls
        # before the spike's measures are settled, and the first after.
        cuts |= {s.end_step + 1, s.end_step + 2, s.end_step + window - 1}
        cuts |= {s.end_step + window, s.end_step + window + 1, s.end_step + window + 2}
    inc = _grow(run, sorted(cuts))
    assert inc.memo.local_hits > 0 and inc.extended > 0
    assert inc.memo.measure_hits > 0 and inc.memo.measure_misses > 0


def test_generated_run_cut_at_many_points(tmp_path: Path) -> None:
    from benchmarks.generate import series, write_jsonl

    write_jsonl(tmp_path / "run", series(6000))
    # In line order, as the watcher's tail reads a JSONL log (a read for analysis hands its
    # rows over series after series: cuts of it are no prefixes of each other to splice).
    options = replace(read_options(Config()), series_order=False)
    run = read_run(tmp_path / "run", options=options)
    inc = _grow(run, _even_cuts(run, 10))
    assert inc.memo.hits > 0 and inc.memo.local_hits > 0 and inc.view.spliced >= 8
    assert inc.memo.measure_hits > 0


def test_a_restart_and_a_nan_appended_mid_watch() -> None:
    """A NaN appended (the NaN finding from scratch), then a restart stepping back in a new
    segment (built whole), then appends after it (spliced again)."""
    run = read_run(ROOT / "sample_runs" / "periodic_spikes", options=_AS_WRITTEN)
    f = run.frame
    last = int(f.get_column("step").max())  # type: ignore[arg-type]
    old = f.filter(pl.col("step") <= last - 200)
    inc = IncrementalAnalysis()
    _poll(inc, _with(run, old))
    add = f.filter((pl.col("step") > last - 200) & (pl.col("step") <= last - 100))
    is_loss = (pl.col("metric") == "loss") & (pl.col("step") == last - 150)
    nan = add.with_columns(pl.when(is_loss).then(float("nan")).otherwise("value").alias("value"))
    frame = pl.concat([old, nan])
    got = _poll(inc, _with(run, frame))
    assert any(x["kind"] == "nan_inf" for x in got["findings"])
    resumed = f.filter(pl.col("step") > last - 300).with_columns(pl.col("segment") + 1)
    frame = pl.concat([frame, resumed.filter(pl.col("step") <= last - 50)])
    whole = inc.view.whole
    _poll(inc, _with(run, frame))
    assert inc.view.whole == whole + 1  # stepping back: built whole
    frame = pl.concat([frame, resumed.filter(pl.col("step") > last - 50)])
    _poll(inc, _with(run, frame))
    assert inc.view.whole == whole + 1 and inc.view.added is not None


@pytest.mark.parametrize("check", ["frame", "filters"])
def test_the_checks_catch_a_rewritten_value(check: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Old loss values rewritten between polls (a log file rewritten in place): with the
    prefix checks the poll equals a fresh analysis; with one switched off (the mutation) the
    stale view or filter output makes the comparison fail, so the test has teeth."""
    import forensics.evidence.reuse as reuse
    import forensics.watch.carry as carry

    run = read_run(ROOT / "sample_runs" / "periodic_spikes", options=_AS_WRITTEN)
    f = run.frame
    last = int(f.get_column("step").max())  # type: ignore[arg-type]
    old = f.filter(pl.col("step") <= last - 100)
    # 40 loss values three times as high, well before the new rows.
    hit = (pl.col("metric") == "loss") & pl.col("step").is_between(last - 400, last - 360)
    rewritten = f.with_columns(pl.when(hit).then(pl.col("value") * 3).otherwise("value"))

    def poll_twice() -> None:
        inc = IncrementalAnalysis()
        _poll(inc, _with(run, old))
        _poll(inc, _with(run, rewritten))

    poll_twice()  # the checks see the change: equal to a fresh analysis
    if check == "frame":
        monkeypatch.setattr(carry, "_same_rows", lambda a, b: True)
    else:
        monkeypatch.setattr(reuse, "_common_prefix", lambda a, b: min(len(a), len(b)))
        monkeypatch.setattr(carry, "_same_rows", lambda a, b: False)
    with pytest.raises(AssertionError):
        poll_twice()


def test_a_spike_measured_before_it_settled_is_measured_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mutation check for spike measures: polls inside a spike, then after it recovered;
    with the settling check switched off, the stale measures fail the comparison."""
    import forensics.evidence.reuse as reuse

    run = read_run(ROOT / "sample_runs" / "periodic_spikes", options=_AS_WRITTEN)
    spike = analyze_run(run).ev.spikes("loss")[0]
    cuts = [spike.peak_step + 1, spike.end_step + 300]
    inc = _grow(run, cuts)
    assert inc.memo.measure_misses > 0
    monkeypatch.setattr(reuse, "_settled", lambda *a: True)
    with pytest.raises(AssertionError):
        _grow(run, cuts)


@pytest.mark.parametrize("kind", ["jsonl", "tfevents"])
def test_the_watcher_on_a_log_written_in_chunks(kind: str, tmp_path: Path) -> None:
    """The real path: a log file on disk grown in chunks (cut at record / line boundaries),
    polled by the watcher; after each poll its findings equal ``analyze_run`` of the same
    bytes read from scratch, and the polls after the first reuse the view and the spikes."""
    from benchmarks.generate import series, write_jsonl, write_tfevents
    from benchmarks.watch_poll import _cut_before
    from forensics.watch.engine import Watcher

    n = 3000
    write = write_jsonl if kind == "jsonl" else write_tfevents
    src = write(tmp_path / "src", series(n))
    data = src.read_bytes()
    cuts = [_cut_before(src, kind, n, k) for k in (1200, 700, 300, 1)] + [len(data)]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dst = run_dir / src.name
    watcher = Watcher(run_dir, state_path=tmp_path / "state.json")
    try:
        done = 0
        for cut in cuts:
            with dst.open("ab") as f:  # the writer appends
                f.write(data[done:cut])
            done = cut
            watcher.poll()
            diag = watcher.status.diagnosis
            assert diag is not None
            fresh = analyze_run(read_run(run_dir, options=read_options(Config())))
            assert _drawn(diag) == _drawn(fresh), cut
        inc = watcher.incremental
        assert inc.view.spliced == len(cuts) - 1 and inc.extended > 0
        assert inc.memo.measure_hits > 0
    finally:
        watcher.close()
