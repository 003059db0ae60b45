"""A stretch of non-finite steps the run got over by itself is not the red light.

Crafted with tensorboardX: 2,000 steps, the grad norm (and in one run the loss too) NaN at
steps 1,200-1,202, then finite again with the loss on its trend for 800 more steps. Three
non-finite points in a row made the finding fatal: "Roll back to the checkpoint at step
1,000 ... Learning rate 10% lower (the red-light rule)". The article's red light is a
divergence that does not recover for N steps; this one did. A stretch that is finite again
after it, with the loss back at its level, is judged as isolated steps are: critical for the
loss (the orange light's NaN), a warning for a grad norm the loss did not follow; its sentence
says the loss is back and there is nothing to roll back. A stretch that runs to the end of the
log, or after which the loss stays higher, stays fatal.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze


def _run(path: Path, *, loss_too: bool, to_end: bool = False, worse: bool = False) -> Path:
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(2)
    w = SummaryWriter(str(path))
    for s in range(2000):
        loss = 2.0 + 6 / (1 + s / 300) + rng.normal(0, 0.02)
        gn = 0.5 + 0.03 * rng.normal()
        if worse and s >= 1203:
            loss += 1.0  # the loss did not come back after the stretch
        if 1200 <= s < (2000 if to_end else 1203):
            gn = float("nan")
            if loss_too:
                loss = float("nan")
        w.add_scalar("train/loss", loss, s)
        w.add_scalar("train/grad_norm", gn, s)
    w.close()
    return path


def _nan(path: Path) -> dict[str, object]:
    d = analyze(path)
    return {f.metric: f for f in d.findings if f.kind is FindingKind.NAN_INF} | {
        "verdict": d.verdict
    }


@pytest.mark.parametrize("loss_too", [False, True])
def test_a_recovered_stretch_is_not_fatal(tmp_path: Path, loss_too: bool) -> None:
    got = _nan(_run(tmp_path / "r", loss_too=loss_too))
    gn = got["grad_norm"]
    assert gn.severity is Severity.WARNING  # type: ignore[attr-defined]
    assert gn.measures["persistent"] is True and gn.measures["loss_back"] is True  # type: ignore[attr-defined]
    assert "the loss is back at its level after it (" in gn.summary  # type: ignore[attr-defined]
    assert "(nothing to roll back)" in gn.summary  # type: ignore[attr-defined]
    if loss_too:
        assert got["loss"].severity is Severity.CRITICAL  # type: ignore[attr-defined]
    assert got["verdict"] == ("critical" if loss_too else "warning")


def test_a_stretch_to_the_end_stays_fatal(tmp_path: Path) -> None:
    got = _nan(_run(tmp_path / "r", loss_too=True, to_end=True))
    assert got["loss"].severity is Severity.FATAL  # type: ignore[attr-defined]
    assert got["verdict"] == "fatal"


def test_a_stretch_the_loss_did_not_get_over_stays_fatal(tmp_path: Path) -> None:
    got = _nan(_run(tmp_path / "r", loss_too=False, worse=True))
    assert got["grad_norm"].severity is Severity.FATAL  # type: ignore[attr-defined]


def test_the_card_does_not_say_the_run_stopped_training(tmp_path: Path) -> None:
    """The card's first line read "non-finite values that persist mean the run is no longer
    training; stop, look, then resume from a checkpoint" above "nothing to roll back"."""
    from forensics.report.render import render_html

    page = render_html(analyze(_run(tmp_path / "r", loss_too=False)), plotlyjs="cdn")
    assert "no longer training" not in page
    assert (
        "Yellow light: non-finite for several steps in a row, then finite again with the loss "
        "back at its level: the run got over it and is still training" in page
    )
