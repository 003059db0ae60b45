"""A param-norm jump's "abnormal gradient" cause, tested against the log.

Crafted with tensorboardX: at step 3,000 the grad norm reads 45 (65x its level) and the param
norm jumps 8% and holds, with a loss spike back in 85 steps. The param-norm jump's only
article cause, "Weight updates were too large, or abnormal gradients got through", was listed
as untested, "no series in the log shows this", beside a grad-norm spike the log shows in that
very update; and the terminal's advice (the incident's root, a bad batch) said "nothing to
roll back" without a word about the clip the article's row for a param-norm jump asks to
check. Now the cause ``large_gradient`` is tested: supported by a grad-norm spike peaking in
the updates that moved the param norm (a consequence of the bad batch or LR change behind
it), contradicted when the grad norm logged those steps without one, untested when it logged
nothing there.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from forensics.findings import FindingKind
from forensics.pipeline import analyze


def _run(path: Path, *, grad_spike: bool = True, grad_norm: bool = True) -> Path:
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(5)
    w = SummaryWriter(str(path))
    pn = 100.0
    for s in range(1, 6001):
        loss = 2.5 + 2 * math.exp(-s / 1200) + rng.normal(0, 0.015)
        gn = 0.7 + rng.normal(0, 0.03)
        pn *= 1.00002
        if s == 3000:
            pn *= 1.08
            if grad_spike:
                gn, loss = 45.0, loss + 0.4
        if grad_spike and 3000 < s < 3200:
            loss += 0.4 * math.exp(-(s - 3000) / 40)
        w.add_scalar("train/loss", loss, s)
        if grad_norm:
            w.add_scalar("train/grad_norm", gn, s)
        w.add_scalar("train/param_norm", pn + rng.normal(0, 0.01), s)
        w.add_scalar("train/lr", 1e-4, s)
    w.close()
    return path


def _cause(d, cause: str):  # type: ignore[no-untyped-def]
    (jump,) = [f for f in d.findings if f.kind is FindingKind.PARAM_NORM_JUMP]
    causes = d.causes_for(jump)
    return jump, causes, next((c for c in causes if c.cause == cause), None)


def test_a_gradient_spike_in_the_jump_supports_it(tmp_path: Path) -> None:
    d = analyze(_run(tmp_path / "run"))
    jump, causes, c = _cause(d, "large_gradient")
    assert jump.start_step == 3000
    assert c is not None and c.status == "supported", causes
    assert c.evidence == (
        "grad norm 45 at step 3,000 against a local baseline of 0.6942 (64.82x), in the updates "
        "that moved the param norm (step 3,000)"
    )
    assert c.consequence_of == "bad_batch"  # the batch behind it is the root
    # The article's untested wording of the same cause is gone: the log answered it.
    assert not [c for c in causes if c.cause == "article"], causes


def test_the_terminal_advice_names_the_clip(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from forensics.cli import app

    res = CliRunner().invoke(app, ["analyze", str(_run(tmp_path / "run")), "--no-report"])
    assert res.exit_code == 0, res.output
    advice = next(line for line in res.stdout.splitlines() if line.startswith("What to do"))
    assert "find that batch" in advice
    assert "check the gradient-clipping threshold" in advice, advice


def test_a_jump_without_a_gradient_spike_contradicts_it(tmp_path: Path) -> None:
    d = analyze(_run(tmp_path / "run", grad_spike=False))
    _, causes, c = _cause(d, "large_gradient")
    assert c is not None and c.status == "contradicted", causes
    assert c.evidence.startswith("the grad norm had no spike at step 3,000 (at most 0.7")


def test_without_a_grad_norm_it_is_untested(tmp_path: Path) -> None:
    d = analyze(_run(tmp_path / "run", grad_norm=False))
    _, causes, c = _cause(d, "large_gradient")
    assert c is not None and c.status == "untested" and c.evidence == "no grad norm in the log"
