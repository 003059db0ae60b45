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
