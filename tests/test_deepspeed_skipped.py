"""DeepSpeed's step line counts the steps it skipped since the start (``[Rank 0] step=120,
skipped=7, lr=[...]``): an fp16 overflow skips the update. The count was kept only as the raw
``skipped_steps``; it is now also read per logging interval as ``skipped_iters`` (Megatron's
"number of skipped iterations"), so the loss-scale finding says how many updates after a
collapse never reached the weights. Lines are written as DeepSpeed's logger writes them."""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np

from forensics.findings import FindingKind
from forensics.pipeline import analyze, read_run
from forensics.schema import SKIPPED_ITERS

_T0 = datetime.datetime(2024, 3, 1, 12, 0, 0)


def _ts(i: int) -> str:
    return "[" + (_T0 + datetime.timedelta(seconds=i)).strftime("%Y-%m-%d %H:%M:%S") + ",000]"


def _step_line(i: int, step: int, skipped: int) -> str:
    return (
        f"{_ts(i)} [INFO] [logging.py:96:log_dist] [Rank 0] step={step}, skipped={skipped}, "
        "lr=[0.0001], mom=[(0.9, 0.95)]"
    )


def _write(folder: Path, counts: list[tuple[int, int]]) -> Path:
    folder.mkdir()
    lines = [_step_line(i, s, k) for i, (s, k) in enumerate(counts)]
    (folder / "train.log").write_text("\n".join(lines) + "\n")
    return folder


def _skipped(run_dir: Path) -> dict[int, float]:
    rows = read_run(run_dir).metric_rows(SKIPPED_ITERS)
    return dict(zip(rows["step"].to_list(), rows["value"].to_list(), strict=True))


def test_the_running_count_becomes_a_count_per_interval(tmp_path: Path) -> None:
    run = _write(tmp_path / "run", [(10, 0), (20, 0), (30, 3), (40, 3), (50, 7), (50, 7)])
    assert _skipped(run) == {10: 0.0, 20: 0.0, 30: 3.0, 40: 0.0, 50: 4.0}


def test_a_count_that_started_before_the_log_or_went_down_is_unknown(tmp_path: Path) -> None:
    """A resumed job's first line carries steps skipped before the log; a job restarted
    without its state counts from zero again: neither interval's count is known."""
    run = _write(tmp_path / "run", [(1000, 12), (1010, 13), (1020, 2), (1030, 2)])
    assert _skipped(run) == {1010: 1.0, 1030: 0.0}


def test_skips_after_a_collapse_are_counted(tmp_path: Path) -> None:
    """The scale halves eight times over steps 2,000-2,080 and every step after that
    overflows: the loss-scale finding counts the skipped updates after the cascade."""
    rng = np.random.default_rng(3)
    folder = tmp_path / "run"
    folder.mkdir()
    lines, skipped, scale, i = [], 0, 65536.0, 0
    for s in range(1, 3001):
        collapse = s >= 2000 and (s - 2000) % 10 == 0 and scale > 256
        if collapse or s > 2080:
            skipped += 1
            new = scale / 2 if collapse else scale
            lines.append(
                f"{_ts(i)} [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank "
                f"0 Skipping step. Attempted loss scale: {scale:g}, reducing to {new:g}"
            )
            scale = new
        if s % 10 == 0:
            lines.append(_step_line(i, s, skipped))
            loss = 2.0 + 3.0 * np.exp(-s / 300) + rng.normal(0, 0.02)
            lines.append(f"{_ts(i)} step {s} | loss: {loss:.4f}")
        i += 1
    (folder / "train.log").write_text("\n".join(lines) + "\n")
    diag = analyze(folder)
    counts = _skipped(folder)
    assert sum(counts.values()) == skipped  # (the first line's interval starts at 0)
    drops = [f for f in diag.findings if f.kind == FindingKind.LOSS_SCALE_DROP]
    assert drops, [f.summary for f in diag.findings]
    after = [f for f in drops if f.measures.get("skipped_after")]
    assert after, [f.summary for f in drops]
    (f,) = after
    end = f.end_step if f.end_step is not None else f.start_step
    assert f.measures["skipped_after"] == sum(v for k, v in counts.items() if k > end)
    assert "after it the trainer skipped" in f.summary
