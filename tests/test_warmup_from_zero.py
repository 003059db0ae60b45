"""A warm-up that starts from an LR of exactly 0 is a warm-up.

HF's linear warm-up (and many hand-written ones) logs an LR of 0 at step 0. Below the log
floor the schedule reader uses, 0 and the next value (3e-7) read as a flat piece, and the
ramp after it as an LR rising "from 3e-07 ... (x1,000)" that no schedule explains: a loss
spike at step 5 then had "an LR change no schedule explains" as its supported cause, with
the advice to put the LR back on its schedule. The flat start held at or under the ramp's
first value is now part of the warm-up.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from forensics.config import Config
from forensics.evidence import Evidence
from forensics.findings import FindingKind
from forensics.importers import read_run
from forensics.pipeline import analyze


def _write(folder: Path) -> Path:
    rng = np.random.default_rng(30)
    n = 3000
    s = np.arange(n)
    loss = 2 + 3 / (1 + s / 500) + rng.normal(0, 0.02, n)
    gn = 1.0 + 0.05 * rng.standard_normal(n)
    lr = np.minimum(1, s / 1000) * 3e-4  # 0 at step 0
    loss[3:8] += 3.0
    gn[3:8] *= 5
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        json.dumps({"step": int(i), "loss": loss[i], "grad_norm": gn[i], "lr": lr[i]})
        for i in range(n)
    ]
    (folder / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def test_the_ramp_from_zero_is_one_warm_up(tmp_path: Path) -> None:
    ev = Evidence(read_run(_write(tmp_path / "run")), Config().params)
    kinds = [(g.kind, g.start_step, g.end_step) for g in ev.schedule.segments]
    assert kinds == [("warmup", 0, 1000), ("constant", 1001, 2999)]
    assert not ev.schedule.changes


def test_no_lr_cause_for_a_spike_in_the_warm_up(tmp_path: Path) -> None:
    d = analyze(_write(tmp_path / "run"))
    spikes = [f for f in d.findings if f.kind is FindingKind.GRAD_NORM_SPIKE]
    assert spikes and spikes[0].start_step == 3
    for f in d.findings:
        for c in d.causes_for(f):
            assert not (c.cause == "lr_change" and c.status == "supported"), (f.kind, c)
    assert all("schedule" not in d.prescription_for(f) for f in spikes)
