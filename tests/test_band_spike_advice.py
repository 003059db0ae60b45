"""A grad-norm spike over the 3x line that recovered in 22 steps: its orange light says what
to do.

Crafted with tensorboardX: the grad norm rises to 3.7x its baseline at step 3,000 and decays
back over about 22 steps (too long for the transient rule), the loss moves a little with it.
The finding was critical by the article's 3x line, and its prescription said "pause and look
at the batch and the clip threshold", but its spike's shape was classed physiological, and
that class marked it as needing no action: the incident card, the terminal and "What to
check" gave no next step under an orange light. A grad-norm spike judged by the 2x / 3x
lines calls for the look its light asks.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze
from forensics.prescriptions import needs_action


def test_an_orange_grad_norm_spike_says_what_to_do(tmp_path: Path) -> None:
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(0)
    w = SummaryWriter(str(tmp_path / "r"))
    for s in range(6000):
        k = s - 3000
        bump = math.exp(-k / 10) if k >= 0 else 0.0
        w.add_scalar("train/loss", 2 + 6 / (1 + s / 300) + rng.normal(0, 0.02) + bump, s)
        w.add_scalar("train/grad_norm", (0.5 + 0.03 * rng.normal()) * (1 + 3 * bump), s)
    w.close()
    d = analyze(tmp_path / "r")
    (f,) = [g for g in d.findings if g.kind is FindingKind.GRAD_NORM_SPIKE]
    assert f.severity is Severity.CRITICAL and f.measures["judged_by"] == "band"
    assert needs_action(f)
    advice = d.what_to_do([f])
    assert advice is not None
    assert advice.text == (
        "Orange light: over 3x the baseline: pause and look at the batch and the clip threshold "
        "before going on."
    )
    assert d.investigation  # "What to check" lists its checks
