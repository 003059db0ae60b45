"""Who moved first, within what the log can resolve.

A JSONL metrics log written every 10 steps: from step 12,000 memory grows and throughput
falls. The memory's onset is fitted at step 11,995 (between two logged points), the drop's
at 12,000. The incident read "The memory moved first ... then the throughput 5 steps
later", an order the log cannot show: throughput logged no point between the two onsets.
The sentence now says the memory's onset is the earliest and that the log cannot tell which
moved first. Logged every step, each series has points between the onsets and no order is
doubted.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from forensics.pipeline import analyze


def _write(folder: Path, every: int) -> Path:
    rng = np.random.default_rng(5)
    rows = []
    for s in range(every, 20001, every):
        rows.append(
            {
                "step": s,
                "train/loss": 2.0 + 4 / (1 + s / 1000) + rng.normal(0, 0.02),
                "train/grad_norm": 0.5 + abs(rng.normal(0, 0.03)),
                "train/lr": 3e-4 * min(1, s / 500),
                "perf/tokens_per_sec": 50000
                * (1 + rng.normal(0, 0.01))
                * (0.6 if s >= 12000 else 1),
                "sys/mem_gb": 30.0 + rng.normal(0, 0.05) + max(0, s - 12000) * 0.0015,
            }
        )
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return folder


def test_an_order_the_logging_cannot_resolve_is_not_claimed(tmp_path: Path) -> None:
    diag = analyze(_write(tmp_path / "run", every=10))
    (inc,) = diag.incidents
    mem, tput = inc.timeline.movers
    assert (mem.metric, tput.metric) == ("memory", "throughput")
    assert 0 < tput.step - mem.step < 10 and tput.unordered
    text = inc.timeline.sentence()
    assert "moved first (" not in text
    assert f"The memory's onset is the earliest (step {mem.step:,}, memory_growth)" in text
    assert text.endswith(
        "; the throughput logged no point between the first onset and its own: the log cannot"
        " tell which moved first."
    )
    assert diag.timeline is not None and diag.timeline.sentence() == text


def test_an_order_the_log_shows_is_said(tmp_path: Path) -> None:
    """Logged every step, each series had points between the onsets: no order is doubted."""
    diag = analyze(_write(tmp_path / "run", every=1))
    assert diag.incidents
    for inc in diag.incidents:
        assert not any(m.unordered for m in inc.timeline.movers)
        assert " moved first (onset at step " in inc.timeline.sentence()
