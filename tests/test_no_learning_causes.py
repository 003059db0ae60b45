"""A run that never learned: its causes tested against the LR, grad norm and param norm logged.

Crafted with tensorboardX: a loss flat at 7 for 1,500 steps. Before, the ``no_learning``
finding listed all three of the article's causes (an LR of zero or one that never reaches the
optimizer; gradients that never reach the weights; labels that do not match) as untested, "no
series in the log shows this", beside a logged LR of exactly 0 or a grad norm of exactly 0 at
every step. And a flat loss with the LR logged as 0 throughout stopped ``analyze`` with an
internal error (the plateau's sentence divided by an LR peak of 0). Now:

- ``lr_zero`` is supported when the logged LR is exactly 0 at 90% or more of the finding's
  points (a root cause), contradicted when it is not;
- ``no_update`` is supported by a grad norm of exactly 0 there, or by a param norm that does
  not move; contradicted by a nonzero grad norm with a moving param norm; untested (saying
  why) by a nonzero grad norm alone;
- the plateau says the logged LR was 0 at every step (``lr_context: zero``).

A loss that fell while the logged LR was 0 at every step had come out green with no word: the
LR series cannot be the rate the optimizer applied, and the checks that read it judge it all
the same. A note says so now.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from forensics.causes import CONTRADICTED, SUPPORTED, UNTESTED, supported_roots
from forensics.findings import FindingKind
from forensics.pipeline import analyze


def _run(
    path: Path,
    *,
    lr: float = 3e-4,
    grad_norm: float | None = 0.5,
    param_norm: str | None = None,
    falling: bool = False,
) -> Path:
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(3)
    w = SummaryWriter(str(path))
    for s in range(1, 1501):
        loss = 2.0 + 5.0 / (1 + s / 200) if falling else 7.0
        w.add_scalar("train/loss", loss + rng.normal(0, 0.001), s)
        w.add_scalar("train/lr", lr * min(1.0, s / 100) if lr else 0.0, s)
        if grad_norm is not None:
            w.add_scalar(
                "train/grad_norm", grad_norm * (1 + 0.05 * rng.normal()) if grad_norm else 0.0, s
            )
        if param_norm == "still":
            w.add_scalar("train/param_norm", 120.0, s)
        elif param_norm == "moving":
            w.add_scalar("train/param_norm", 120.0 + 0.01 * s, s)
    w.close()
    return path


def _causes(path: Path):  # type: ignore[no-untyped-def]
    d = analyze(path)
    (f,) = [f for f in d.findings if f.kind is FindingKind.NO_LEARNING]
    causes = d.causes_for(f)
    return d, f, {c.cause: c for c in causes}, causes


def test_a_zero_lr_is_the_supported_root(tmp_path: Path) -> None:
    d, f, by, causes = _causes(_run(tmp_path / "r", lr=0.0))
    c = by["lr_zero"]
    assert c.status == SUPPORTED
    assert "the logged LR is 0 at all 1,500 logged points of steps 1-1,500" in c.evidence
    assert [r.cause for r in supported_roots(causes)] == ["lr_zero"]
    # The gradients are there; whether they land, no param norm says.
    assert by["no_update"].status == UNTESTED
    assert "the grad norm is not zero (median 0.5" in by["no_update"].evidence
    # The article's causes the two tests cover are not listed again as untested.
    article = [c.text for c in causes if c.cause == "article"]
    assert not any("is zero" in t or "never reach the weights" in t for t in article)
    assert any("never reaches the optimizer" in t for t in article)
    # The plateau over the same steps: no crash, and it says why.
    (p,) = [g for g in d.findings if g.kind is FindingKind.PLATEAU]
    assert p.measures["lr_context"] == "zero" and p.measures["lr_ratio"] is None
    assert "the logged LR was 0 at every step of the run" in p.summary


def test_a_zero_grad_norm_supports_no_update(tmp_path: Path) -> None:
    _, _, by, _ = _causes(_run(tmp_path / "r", grad_norm=0.0))
    assert by["no_update"].status == SUPPORTED
    assert by["no_update"].evidence.startswith(
        "the grad norm is 0 at all 1,500 logged points of steps 1-1,500"
    )
    assert by["lr_zero"].status == CONTRADICTED
    assert "median 0.0003" in by["lr_zero"].evidence


def test_a_still_param_norm_supports_no_update(tmp_path: Path) -> None:
    _, _, by, _ = _causes(_run(tmp_path / "r", param_norm="still"))
    c = by["no_update"]
    assert c.status == SUPPORTED
    assert "the param norm stays at 120 over steps 1-1,500" in c.evidence


def test_gradients_and_moving_weights_contradict_it(tmp_path: Path) -> None:
    _, _, by, _ = _causes(_run(tmp_path / "r", param_norm="moving"))
    c = by["no_update"]
    assert c.status == CONTRADICTED
    assert "the param norm moves (120 -> 135 over steps 1-1,500)" in c.evidence


def test_nothing_logged_but_the_loss_leaves_them_untested(tmp_path: Path) -> None:
    _, _, by, _ = _causes(_run(tmp_path / "r", grad_norm=None))
    assert by["no_update"].status == UNTESTED
    assert by["no_update"].evidence == "no grad norm or param norm logged over the finding's steps"
    assert by["lr_zero"].status == CONTRADICTED


def test_a_loss_that_fell_under_a_zero_lr_is_noted(tmp_path: Path) -> None:
    d = analyze(_run(tmp_path / "r", lr=0.0, falling=True))
    assert not [f for f in d.findings if f.kind is FindingKind.NO_LEARNING]
    (note,) = [n for n in d.run.notes if n.startswith("no_learning: the loss fell")]
    assert "while the logged learning rate is 0 at all 1,500 of its points" in note
    assert "the logged LR is not the rate the optimizer applied" in note
    # A run whose LR is logged as it ran has no such note.
    d = analyze(_run(tmp_path / "ok", falling=True))
    assert not [n for n in d.run.notes if n.startswith("no_learning: the loss fell")]
