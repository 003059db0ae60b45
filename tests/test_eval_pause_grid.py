"""A nanoGPT text log (its ``iter N: loss ..., time ...ms, mfu ...%`` lines, evals every 500
iterations): the step time rises 60% from iteration 3,000. Lasting 600 iterations, the
slowdown was "supported" as an eval or checkpoint pause because 3,000 is on the eval grid:
a pause slows a step or two, not a stretch longer than the interval. Such a slowdown's
onset on the grid is now a coincidence (the cause contradicted, and why); a short one on the
grid keeps the pause as its cause."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from forensics.findings import FindingKind
from forensics.pipeline import analyze_run, read_run


def _write(path: Path, span: int) -> Path:
    rng = np.random.default_rng(1)
    lines = []
    for it in range(0, 5000, 10):
        loss = 2.5 + 6 / (1 + it / 300) + rng.normal(0, 0.02)
        t, mfu = 120.0 * (1 + rng.normal(0, 0.02)), 30.0 * (1 + rng.normal(0, 0.01))
        if 3000 <= it < 3000 + span:
            t, mfu = t * 1.6, mfu / 1.6
        lines.append(f"iter {it}: loss {loss:.4f}, time {t:.2f}ms, mfu {mfu:.2f}%")
        if it % 500 == 0 and it > 0:
            lines.append(f"step {it}: train loss {loss:.4f}, val loss {loss + 0.05:.4f}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("span", "status"), [(600, "contradicted"), (60, "supported")])
def test_a_pause_explains_a_short_slowdown_on_its_grid_only(
    tmp_path: Path, span: int, status: str
) -> None:
    diag = analyze_run(read_run(_write(tmp_path / "train.log", span)))
    (drop,) = [f for f in diag.findings if f.kind is FindingKind.THROUGHPUT_DROP]
    assert drop.start_step == 3000
    (pause,) = [c for c in diag.causes_for(drop) if c.cause == "eval_pause"]
    assert pause.status == status, pause.evidence
    if status == "contradicted":
        assert "step 3,000 is on the grid (eval every 500 steps), but the slowdown lasts" in (
            pause.evidence
        )
    else:  # the evidence says how long it lasted, for the reader to weigh
        assert pause.evidence == (
            f"step 3,000 is on the eval grid (every 500 steps); the slowdown lasts "
            f"{drop.end_step - drop.start_step:,} steps"
        )


def _jsonl_with_pauses(path: Path, drop_from: int | None) -> Path:
    """Throughput logged every 10 steps, val every 1,000; the step after every 5,000th is a
    checkpoint save (12.5x slower); from ``drop_from`` on, throughput 38% lower for good."""
    import json

    rng = np.random.default_rng(5)
    with path.open("w") as fh:
        for s in range(10, 40001, 10):
            tps = 32000 * np.exp(rng.normal(0, 0.03))
            if s % 1000 == 10:
                tps *= 0.4
            if s % 5000 == 10:
                tps *= 0.2
            if drop_from is not None and s >= drop_from:
                tps *= 0.62
            loss = 2.0 + 6.0 / (1 + s / 500) ** 0.7 + rng.normal(0, 0.02)
            row = {"step": s, "loss": loss, "tokens_per_sec": tps, "lr": 3e-4}
            if s % 1000 == 0:
                row["val_loss"] = loss + 0.05
            fh.write(json.dumps(row) + "\n")
    return path


@pytest.mark.parametrize("drop_from", [30_010, 27_500])
def test_pauses_spread_over_the_run_do_not_explain_a_lasting_drop(
    tmp_path: Path, drop_from: int
) -> None:
    """A checkpoint save every 5,000 steps makes one slow step each (a stall note spanning
    steps 5,010-35,010); throughput falls 38% for good from ``drop_from``. The drop's cause
    read "supported: the job stalled at step 5,010": the stall note's span overlapped the
    drop, 25,000 steps before it began. A 10,000-step slowdown is longer than the 5,000 steps
    between the pauses, on their grid (30,010) or off it (27,500)."""
    diag = analyze_run(read_run(_jsonl_with_pauses(tmp_path / "metrics.jsonl", drop_from)))
    (stall,) = [f for f in diag.findings if f.kind is FindingKind.STALL]
    assert (stall.start_step, stall.end_step, stall.measures["slow_steps"]) == (5010, 35010, 7)
    (drop,) = [f for f in diag.findings if f.kind is FindingKind.THROUGHPUT_DROP]
    assert abs(drop.start_step - drop_from) <= 20
    (pause,) = [c for c in diag.causes_for(drop) if c.cause == "eval_pause"]
    assert pause.status == "contradicted", pause.evidence
    assert (
        f"the slowdown lasts {drop.end_step - drop.start_step:,} steps, longer than the 5,000 "
        "steps between the job's pauses (7 slow steps from step 5,010 to 35,010)"
    ) in pause.evidence, pause.evidence


def test_one_hang_does_not_explain_the_slower_run_after_it(tmp_path: Path) -> None:
    """Nothing logged for 30 minutes at step 20,000 (a hang or a pre-emption), then 40% lower
    throughput to the end of the log. The drop's cause read "supported: An eval or checkpoint
    pause: the job stalled at step 20,000": a pause slows a step or two, not the 20,000 steps
    after it. The stall and the drop stay one incident; the pause is contradicted, with why."""
    import json

    rng = np.random.default_rng(5)
    t = 1.7e9
    with (tmp_path / "metrics.jsonl").open("w") as fh:
        for s in range(10, 40001, 10):
            tps = 32000 * np.exp(rng.normal(0, 0.03)) * (0.6 if s > 20000 else 1.0)
            t += 10 * 4096 / tps + (1800 if s == 20010 else 0)
            loss = 2.0 + 6.0 / (1 + s / 500) ** 0.7 + rng.normal(0, 0.02)
            row = {"step": s, "loss": loss, "tokens_per_sec": tps, "lr": 3e-4, "_timestamp": t}
            fh.write(json.dumps(row) + "\n")
    diag = analyze_run(read_run(tmp_path))
    (stall,) = [f for f in diag.findings if f.kind is FindingKind.STALL]
    (drop,) = [f for f in diag.findings if f.kind is FindingKind.THROUGHPUT_DROP]
    assert stall.start_step == 20000 and drop.start_step == 20010
    assert diag.incident_of(stall) is diag.incident_of(drop)
    (pause,) = [c for c in diag.causes_for(drop) if c.cause == "eval_pause"]
    assert pause.status == "contradicted", pause.evidence
    assert (
        f"the job stalled at step 20,000, but the slowdown lasts "
        f"{drop.end_step - drop.start_step:,} steps after it: a pause slows a step or two"
    ) in pause.evidence, pause.evidence
