"""``loss_climb``: a training loss that climbs and does not come back while the grad norm
does not climb with it (so no divergence). Crafted JSONL logs, written as a trainer writes
them (one JSON object a line)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, loss: np.ndarray, grad: np.ndarray | None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "metrics.jsonl", "w") as fh:
        for i, v in enumerate(loss):
            row = {"step": i + 1, "loss": float(v), "lr": 3e-4}
            if grad is not None:
                row["grad_norm"] = float(grad[i])
            fh.write(json.dumps(row) + "\n")
    return path


def _climb(n: int = 4000, start: int = 3000, rise: float = 0.9, grad_to: float = 1.8):
    """A loss falling to about 2.07 by ``start``, then rising linearly by ``rise`` to the
    end; the grad norm flat at 1, then rising linearly to ``grad_to``."""
    rng = np.random.default_rng(5)
    s = np.arange(1, n + 1)
    base = 3.0 * np.exp(-np.minimum(s, start) / 800) + 2.0
    loss = base + np.where(s > start, rise * (s - start) / (n - start), 0.0)
    grad = 1.0 + np.where(s > start, (grad_to - 1.0) * (s - start) / (n - start), 0.0)
    return loss + rng.normal(0, 0.01, n), grad + np.abs(rng.normal(0, 0.03, n))


def _climbs(path: Path) -> list:
    return [f for f in analyze(path).findings if f.kind is FindingKind.LOSS_CLIMB]


def test_a_loss_climbing_with_a_grad_norm_under_2x_is_a_warning(tmp_path: Path) -> None:
    """The loss climbs from 2.07 to 2.97 over the last 1,000 steps (+43%) and never comes
    back; the grad norm goes 1.0 -> 1.8, under the divergence's 2x. This read HEALTHY: no
    finding at all (only the late checklist's "the loss rose")."""
    loss, grad = _climb()
    d = analyze(_write(tmp_path / "climb", loss, grad))
    assert d.verdict == "warning"
    (f,) = [f for f in d.findings if f.kind is FindingKind.LOSS_CLIMB]
    assert f.severity is Severity.WARNING and f.end_step == 4000
    assert 3000 <= f.start_step <= 3100  # (where the smoothed loss left its running low)
    m = f.measures
    # (levels are medians of the log loss: the finding's numbers are their exponentials)
    before = loss[f.start_step - 1 - m["points_before"] : f.start_step - 1]
    assert m["loss_before"] == pytest.approx(np.exp(np.median(np.log(before))), rel=1e-12)
    after = loss[-m["points_after"] :]
    assert m["loss_after"] == pytest.approx(np.exp(np.median(np.log(after))), rel=1e-12)
    assert m["rise_pct"] > 30 and 1.2 < m["grad_norm_ratio"] < 2.0
    assert not [g for g in d.findings if g.kind is FindingKind.DIVERGENCE]
    assert "under the 2x at which loss and grad norm climbing together" in f.summary
    assert f"+{m['rise_pct']:.1f}%" in f.summary
    assert f"(median of the {m['points_before']:,} points before step {f.start_step:,})" in (
        f.summary
    )
    (plan,) = [r for r in d.rollbacks if r.rollback]
    assert plan.onset_step == f.start_step


def test_the_sentence_says_whether_the_grad_norm_held_or_was_not_logged(
    tmp_path: Path,
) -> None:
    loss, _ = _climb()
    (held,) = _climbs(_write(tmp_path / "held", loss, np.full(len(loss), 1.0)))
    assert "the grad norm held (1.00x its earlier level): the loss rose on its own" in (
        held.summary
    )
    (blind,) = _climbs(_write(tmp_path / "blind", loss, None))
    assert blind.measures["grad_norm_ratio"] is None
    assert "the grad norm was not logged" in blind.summary


def test_a_climb_with_the_grad_norm_at_2x_is_the_divergence(tmp_path: Path) -> None:
    loss, grad = _climb(grad_to=4.0)
    d = analyze(_write(tmp_path / "div", loss, grad))
    kinds = {f.kind for f in d.findings}
    assert FindingKind.DIVERGENCE in kinds and FindingKind.LOSS_CLIMB not in kinds


def test_a_climb_shorter_than_500_steps_is_not_reported_yet(tmp_path: Path) -> None:
    loss, grad = _climb(n=3400, start=3000, rise=0.4)  # 400 steps of climb
    assert _climbs(_write(tmp_path / "short", loss, grad)) == []


@pytest.mark.parametrize("case", ["noisy", "heavy_tail", "drift_5pct", "epochs", "sparse"])
def test_healthy_losses_have_no_climb(tmp_path: Path, case: str) -> None:
    """A noisy loss (30% log-normal noise, a Student-t tail) never stands 10% above a lucky
    low for long in the medians; a loss drifting up 5% is under the 10%; epochs that each
    start lower and creep up 8% come back at each epoch; a sparse log (every 50 steps)."""
    rng = np.random.default_rng(11)
    n = 6000
    s = np.arange(1, n + 1)
    trend = 3 * np.exp(-s / 1000) + 2
    flat = np.ones(n)
    if case == "noisy":
        loss = trend * np.exp(rng.normal(0, 0.3, n))
    elif case == "heavy_tail":
        loss = (trend * (1 + 0.1 * rng.standard_t(2, n).clip(-5, 50))).clip(0.2)
    elif case == "drift_5pct":
        loss = np.where(s < 3000, trend, trend[2999] * (1 + 0.05 * (s - 3000) / 3000))
        loss = loss * np.exp(rng.normal(0, 0.05, n))
    elif case == "epochs":
        phase, epoch = (s - 1) % 2000, (s - 1) // 2000
        loss = (1.5 * np.exp(-0.6 * epoch) + 0.3 + 0.08 * phase / 2000) * np.exp(
            rng.normal(0, 0.04, n)
        )
    else:
        keep = np.arange(0, n, 50)
        loss = trend[keep] * np.exp(rng.normal(0, 0.15, len(keep)))
        path = tmp_path / case
        path.mkdir()
        rows = [
            {"step": int(s[i]), "loss": float(v), "grad_norm": 1.0}
            for i, v in zip(keep, loss, strict=True)
        ]
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert _climbs(path) == []
        return
    assert _climbs(_write(tmp_path / case, loss, flat)) == []


def test_a_spike_the_loss_did_not_come_back_from_keeps_its_own_finding() -> None:
    """The param_norm_jump sample: an LR 50x too high at step 500, a loss spike that settled
    35% above its trend. The climb around it is that spike's aftermath: no second finding
    (a first version reported a loss_climb from step 446, its own incident, before the LR
    change that caused it)."""
    d = analyze(ROOT / "sample_runs" / "param_norm_jump")
    assert not [f for f in d.findings if f.kind is FindingKind.LOSS_CLIMB]
    (spike,) = [f for f in d.findings if f.kind is FindingKind.LOSS_SPIKE and f.start_step == 501]
    assert spike.measures["classification"] == "pathological"


def test_an_lr_raised_off_schedule_is_the_climbs_supported_cause(tmp_path: Path) -> None:
    """The LR quadrupled at step 3,000 (no schedule does that) and the loss climbed 0.5 over
    the next 2,000 steps with the grad norm up 30%: the climb's cause is the LR change, the
    incident starts at it, and the rollback goes back to before it with the LR before it."""
    rng = np.random.default_rng(7)
    s = np.arange(1, 5001)
    lr = np.where(s < 3000, 3e-4, 1.2e-3)
    base = 3.0 * np.exp(-np.minimum(s, 3000) / 800) + 2.0
    loss = base + np.where(s >= 3000, 0.5 * (1 - np.exp(-(s - 3000) / 400)), 0.0)
    grad = 1.0 + np.where(s >= 3000, 0.3, 0.0) + np.abs(rng.normal(0, 0.03, len(s)))
    path = tmp_path / "lrjump"
    path.mkdir()
    rows = [
        {"step": int(a), "loss": float(b + rng.normal(0, 0.01)), "grad_norm": float(c), "lr": d}
        for a, b, c, d in zip(s, loss, grad, lr, strict=True)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = analyze(path)
    (f,) = [f for f in d.findings if f.kind is FindingKind.LOSS_CLIMB]
    (lr_change,) = [c for c in d.causes_for(f) if c.cause == "lr_change"]
    assert lr_change.status == "supported" and "step 3,000" in lr_change.evidence
    (inc,) = d.incidents
    assert inc.timeline.movers[0].metric == "lr" and inc.timeline.movers[0].step == 3000
    (plan,) = [r for r in d.rollbacks if r.rollback]
    assert plan.last_healthy_step == 2999 and plan.lr_cut_from == pytest.approx(3e-4)
