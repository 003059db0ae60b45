"""The trainer-independent part of the callbacks: the live run and the judge's pacing."""

from __future__ import annotations

import math
import time
from pathlib import Path

from forensics.integrations.engine import LiveJudge
from forensics.integrations.live_run import LiveRun


def curve(live: LiveRun, lo: int, hi: int) -> None:
    for s in range(lo, hi):
        live.add(
            s, {"loss": 3.0 * s**-0.2 + 0.01 * math.sin(s), "grad_norm": 1.0 + 0.05 * math.cos(s)}
        )


def test_values_that_are_not_numbers_are_counted_not_read(tmp_path: Path) -> None:
    live = LiveRun("r", tmp_path, "hf_trainer_state")
    live.add(1, {"loss": 2.0, "run_name": "abc", "grad_norm": "1.5", "hist": [1, 2], "step": 1})
    run = live.run()
    assert sorted(run.frame.get_column("tag").to_list()) == ["grad_norm", "loss"]
    assert live.skipped == 2
    assert any("2 logged values that are not numbers" in n for n in run.notes)
    assert not list(tmp_path.iterdir())  # the run folder is only read


def test_max_overhead_bounds_the_time_spent_judging(tmp_path: Path) -> None:
    """A judgement costs tens of milliseconds here and a "step" 2 ms: judging every log would
    spend most of the time judging; with max_overhead=0.2 the share stays near 20%."""
    live = LiveRun("r", tmp_path, "hf_trainer_state")
    curve(live, 1, 2000)
    LiveJudge().judge(live)  # the first judgement pays for the imports
    judge = LiveJudge(max_overhead=0.2)
    t0 = time.monotonic()
    logs = 0
    for s in range(2000, 3000):
        time.sleep(0.002)
        curve(live, s, s + 1)
        logs += 1
        if judge.due():
            judge.judge(live)
    share = judge.judging_seconds / (time.monotonic() - t0)
    print(f"judged {judge.judged} of {logs} logs, {share:.0%} of the time")
    assert 1 < judge.judged < logs / 3
    assert share < 0.35, share
    unpaced = LiveJudge()
    assert all(unpaced.due() for _ in range(10))


def test_each_judgement_equals_a_fresh_analysis(tmp_path: Path) -> None:
    """The judge reuses its last judgement's work (the watcher's incremental analysis):
    after every judgement of a growing run, with a spike and a NaN logged on the way, its
    findings equal analyze_run's on the same run from scratch."""
    from forensics.pipeline import analyze_run

    live = LiveRun("r", tmp_path, "hf_trainer_state")
    judge = LiveJudge(stop_at=None)
    curve(live, 1, 600)
    for lo, hi in [(600, 700), (700, 701), (701, 900), (900, 1000), (1000, 1200)]:
        curve(live, lo, hi)
        if lo == 700:
            live.add(700, {"loss": 40.0})  # a spike, logged again at its step
        if lo == 900:
            live.add(950, {"grad_norm": math.nan})
        dec = judge.judge(live)
        fresh = analyze_run(live.run(), judge.config)
        assert [f.to_dict() for f in dec.diagnosis.findings] == [
            f.to_dict() for f in fresh.findings
        ], (lo, hi)
    assert judge._analysis.view.spliced >= 3
