"""A grad-norm spike that comes back within the transient limit but stood above its alarm line
for many logged points is not one batch: it moved the grad norm's level, and the article's 2x /
3x lines judge it. A run whose LR schedule restarted at step 1,500 and warmed up again to its
peak by step 1,600, where the grad norm held at 4x its baseline for 20 steps, had read "a
grad-norm outlier ... a batch the optimizer absorbed" (info, a green light), with the LR
schedule contradicted ("no warm-up end, restart or step drop within 50 steps"). The metrics
are JSONL lines as a training script's ``json.dumps`` writes them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze


def _write(folder: Path, *, wide: int, at: int = 1_600, single_at: int | None = 2_500) -> Path:
    """3,000 steps, cosine LR warmed up over 100 steps, restarted at 1,500 and warmed up again
    to its peak by 1,600; the grad norm at 2.0 (4x its 0.5) for ``wide`` steps from ``at``,
    and for one step at ``single_at``."""
    rng = np.random.default_rng(11)
    folder.mkdir(parents=True, exist_ok=True)
    peak, total = 3e-4, 3_000
    with open(folder / "metrics.jsonl", "w") as fh:
        for s in range(1, total + 1):
            if s <= 100:
                lr = peak * s / 100
            elif s < 1_500:
                lr = peak * 0.5 * (1 + math.cos(math.pi * (s - 100) / (total - 100)))
            elif s < 1_600:
                lr = peak * (s - 1_500) / 100
            else:
                lr = peak * 0.5 * (1 + math.cos(math.pi * (s - 1_600) / (total - 1_600)))
            loss = 2.0 + 3.0 * math.exp(-s / 300) + rng.normal(0, 0.03)
            gn = 0.5 + rng.normal(0, 0.03)
            if at <= s < at + wide or s == single_at:
                gn += 1.5
            row = {"step": s, "train/loss": round(loss, 4), "train/lr": lr}
            fh.write(json.dumps({**row, "train/grad_norm": round(abs(gn), 4)}) + "\n")
    return folder


def test_twenty_steps_at_4x_are_judged_by_the_lines(tmp_path: Path) -> None:
    diag = analyze(_write(tmp_path / "run", wide=20))
    (spike,) = [f for f in diag.findings if f.kind == FindingKind.GRAD_NORM_SPIKE]
    assert spike.severity == Severity.CRITICAL  # 4x the baseline: the article's orange light
    assert spike.measures["judged_by"] == "band"
    assert spike.measures["transient"] is False
    assert spike.start_step == 1_600
    assert "above its alarm line for 20 logged points: longer than one batch" in spike.summary
    assert "absorbed" not in spike.summary
    assert spike.judged_against["transient_limit_points"] == 3
    # The re-warm-up's end is the schedule event at its onset, and the causes say so.
    causes = {c.cause: c for c in diag.causes_for(spike)}
    assert causes["lr_schedule"].status == "supported"
    assert "the warm-up ended at step 1,600" in causes["lr_schedule"].evidence
    assert "the LR warm-up's end at step 1,600" in spike.summary
    assert "The LR schedule set it off" in diag.prescription_for(spike)
    # The single step at 4x later on is still one batch the optimizer absorbed.
    (outliers,) = [f for f in diag.findings if f.kind == FindingKind.GRAD_NORM_OUTLIERS]
    assert outliers.measures["count"] == 1
    assert outliers.measures["highest_step"] == 2_500
    assert outliers.severity == Severity.INFO


def test_three_points_are_still_one_batch(tmp_path: Path) -> None:
    """At the limit: three logged points above the line, back at once, the loss unmoved."""
    diag = analyze(_write(tmp_path / "run", wide=3, at=2_200, single_at=None))
    assert not [f for f in diag.findings if f.kind == FindingKind.GRAD_NORM_SPIKE]
    (outliers,) = [f for f in diag.findings if f.kind == FindingKind.GRAD_NORM_OUTLIERS]
    assert outliers.measures["highest_step"] in range(2_200, 2_203)
    assert diag.verdict == "healthy"


def _ramp(folder: Path) -> Path:
    """The same run, the grad norm ramping from 0.5 to 2.0 over steps 1,560-1,619 as the LR
    warms up again, then back at 0.5."""
    rng = np.random.default_rng(12)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "metrics.jsonl", "w") as fh:
        for s in range(1, 3_001):
            lr = 3e-4 * min(1.0, s / 100) if s < 1_500 else 3e-4 * min(1.0, (s - 1_500) / 100)
            loss = 2.0 + 3.0 * math.exp(-s / 300) + rng.normal(0, 0.03)
            gn = 0.5 + (1.5 * (s - 1_560) / 60 if 1_560 <= s < 1_620 else 0.0)
            gn += rng.normal(0, 0.03)
            row = {"step": s, "train/loss": round(loss, 4), "train/lr": lr}
            fh.write(json.dumps({**row, "train/grad_norm": round(abs(gn), 4)}) + "\n")
    return folder


def test_a_ramp_to_4x_and_back_is_found(tmp_path: Path) -> None:
    diag = analyze(_ramp(tmp_path / "run"))
    gn = [f for f in diag.findings if f.metric == "grad_norm" and f.severity != Severity.INFO]
    assert gn and max(f.severity.rank for f in gn) >= Severity.CRITICAL.rank
    # Its onset lies in the LR's second warm-up, 60 steps after the restart and 40 before the
    # warm-up's end (the schedule events' reach is 50 steps before an onset): the causes name
    # the re-warm, not "no warm-up end, restart or step drop".
    (surge,) = gn
    assert 1_560 <= surge.start_step < 1_600
    cause = {c.cause: c for c in diag.causes_for(surge)}["lr_schedule"]
    assert cause.status == "supported"
    assert "the LR was warming up again at the onset" in cause.evidence
    assert "from 0 at step 1,500 back to 0.0003 by step 1,600" in cause.evidence
    # ... and the treatment is the schedule's, after the orange light's pause
    text = diag.prescription_for(surge)
    assert text.startswith("Orange light: over 3x the baseline: pause before going on. ")
    assert "The LR schedule set it off" in text and "lengthen the warm-up" in text.lower()


def test_a_spike_in_the_first_warm_up_is_no_re_warm(tmp_path: Path) -> None:
    """Only a warm-up after another one is a re-warm: in the run's first warm-up the LR is
    not climbing back from a restart."""
    from forensics.causes import _rewarming
    from forensics.evidence import Evidence
    from forensics.importers import read_run

    ev = Evidence(read_run(_ramp(tmp_path / "run")))
    assert _rewarming(ev.schedule, 50) is None  # (the first warm-up, steps 1-100)
    assert _rewarming(ev.schedule, 1_000) is None  # (the decay)
    cause = _rewarming(ev.schedule, 1_550)
    assert cause is not None and cause.anchor == 1_500
