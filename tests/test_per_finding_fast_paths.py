"""The per-finding shortcuts answer as the plain scans they replace (issue 17: thousands of
spikes on a long run, identical output): the spike detector's pairing of grad-norm and loss
spikes, the LR schedule's kinks, and the causes' run facts (the schedule's phase and events,
the loss-scale drops), on the sample runs and on synthetic logs."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from synthetic import healthy_grad_norm, healthy_loss, long_frame, run_from_frame, spike_factor

import forensics.evidence.spike_context as context_mod
from forensics import analyze
from forensics.causes import _Facts, _find_causes, _g, causes_of
from forensics.detectors.spikes import SpikeDetector, _Starts
from forensics.diagnosis import Diagnosis
from forensics.evidence import Evidence, Series
from forensics.evidence.robust import median_interval
from forensics.evidence.spike_context import Kink, lr_kinks, overlaps
from forensics.findings import Finding, FindingKind, Severity
from forensics.schema import LR

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"
# LR changes, restarts, a cooldown, loss-scale drops, spikes of both series, a resume.
RUNS = [
    "bad_batch",
    "param_norm_jump",
    "nan",
    "divergence",
    "loss_scale_collapse",
    "periodic_spikes",
    "healthy_wsd",
    "healthy_cosine_wd",
    "resumed",
]


@cache
def diag(name: str) -> Diagnosis:
    return analyze(SAMPLES / name)


def _many_spikes(n: int = 6000, seed: int = 5) -> Evidence:
    """Loss and grad-norm spikes in numbers: grad-norm spikes alone, with a loss spike at the
    same step, a few steps before one (a lead) or just after, and loss spikes alone."""
    rng = np.random.default_rng(seed)
    steps, loss = healthy_loss(n, seed=seed)
    _, gn = healthy_grad_norm(n, seed=seed + 1)
    for at in range(400, n - 50, 97):
        lead = int(rng.choice([0, 0, 1, 3, 8, 25, -2, 400]))
        gn = gn * spike_factor(
            steps, at, float(rng.uniform(2.0, 6.0)), width=int(rng.integers(1, 4))
        )
        if lead != 400:
            loss = loss * spike_factor(steps, at + lead, float(rng.uniform(0.5, 2.0)))
    return Evidence(
        run_from_frame(long_frame({"train/loss": (steps, loss), "train/grad_norm": (steps, gn)}))
    )


# -- the spike detector's pairing ---------------------------------------------------------------
def _documents(ev: Evidence) -> list[dict[str, Any]]:
    return [f.to_dict() for f in SpikeDetector(ev.params.spikes).detect(ev)]


@pytest.mark.parametrize("name", [*RUNS[:6], "many"])
def test_pairing_by_binary_search_equals_the_plain_scan(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ev = _many_spikes() if name == "many" else diag(name).ev
    fast = _documents(ev)
    monkeypatch.setattr(_Starts, "within", lambda self, lo, hi: self.spikes)  # every pair
    plain = _documents(ev)
    assert fast == plain
    if name == "many":
        kinds = [d["kind"] for d in fast]
        assert kinds.count("grad_norm_spike") > 30 and kinds.count("loss_spike") > 20
        gn = [d["measures"] for d in fast if d["kind"] == "grad_norm_spike"]
        assert any(m["leads_loss_by_steps"] for m in gn)  # paired in the first pass
        assert any(m["loss_response"] and not m["leads_loss_by_steps"] for m in gn)
        # (unpaired: the outliers the optimizer absorbed, one note, and any that stayed up)
        (notes,) = [d for d in fast if d["kind"] == "grad_norm_outliers"]
        assert notes["measures"]["count"] + sum(not m["loss_response"] for m in gn) > 5


def test_starts_within_keeps_the_given_order() -> None:
    class Spike:
        def __init__(self, start: int) -> None:
            self.start_step = start

    rng = np.random.default_rng(3)
    spikes: list[Any] = [Spike(int(s)) for s in rng.integers(0, 200, 80)]
    starts = _Starts(spikes)
    for lo in range(-5, 210, 7):
        for width in (0, 1, 2.5, 30):
            want = [s for s in spikes if lo <= s.start_step <= lo + width]
            assert starts.within(lo, lo + width) == want
    assert starts.within(float("nan"), 3) == spikes


# -- the LR schedule's kinks --------------------------------------------------------------------
def _plain_lr_kinks(
    lr: Series, *, min_strength: float = 3.0, span_frac: float = 0.01
) -> list[Kink]:
    """lr_kinks as written before (index arrays, a scan over the points taken)."""
    t, v = lr.steps, lr.values
    if len(t) < 5:
        return []
    peak = float(np.max(np.abs(v)))
    length = float(t[-1] - t[0])
    if peak <= 0 or length <= 0:
        return []
    k = max(3, int(round(span_frac * length / median_interval(t))))
    k = min(k, max(1, (len(t) - 1) // 2))
    idx = np.arange(k, len(t) - k)
    if len(idx) == 0:
        return []
    before = (v[idx] - v[idx - k]) / (t[idx] - t[idx - k])
    after = (v[idx + k] - v[idx]) / (t[idx + k] - t[idx])
    strength = np.abs(after - before) * length / peak
    jumps = np.flatnonzero(
        (np.diff(v) > 0.2 * peak) & (v[:-1] < 0.9 * np.maximum.accumulate(v)[:-1])
    )
    out: list[Kink] = []
    for j in jumps:
        out.append(Kink(int(t[j + 1]), "restart", float("inf")))
    cand = idx[strength >= min_strength]
    taken: list[int] = []
    for i in cand[np.argsort(-strength[cand - k])]:
        if any(abs(i - j) <= k for j in taken):
            continue
        if any(abs(int(t[i]) - kk.step) <= k * median_interval(t) for kk in out):
            continue
        taken.append(int(i))
        b, a = before[i - k], after[i - k]
        if b > 0 and a <= b * 0.5:
            kind = "warmup_end"
        elif a < b and b <= 0:
            kind = "drop"
        else:
            kind = "slope_change"
        out.append(Kink(int(t[i]), kind, float(strength[i - k])))
    return sorted(out, key=lambda kk: kk.step)


def _schedules() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(11)
    out = []
    for n, every in ((3000, 1), (2000, 10), (300, 1), (9, 1), (5, 1), (40, 3)):
        s = np.arange(0, n * every, every)
        warm = np.minimum(1.0, (s + 1) / (0.05 * s[-1] + 1))
        cos = 0.5 * (1 + np.cos(np.pi * s / s[-1]))
        period = max(1, s[-1] // 4)
        restart = 0.5 * (1 + np.cos(np.pi * (s % period) / period))
        steps_down = 0.3 ** (s // max(1, s[-1] // 3))
        wsd = np.where(s < 0.8 * s[-1], 1.0, np.clip(5 * (1 - s / max(1, s[-1])), 0.0, 1.0))
        for shape in (warm * cos, restart, steps_down, warm * wsd, np.full(len(s), 3e-4)):
            lr = 3e-4 * shape
            out.append((s, lr))
            out.append((s, np.round(lr * 1e7) / 1e7))  # printed with a few digits
            if n <= 300:  # (noise makes many candidates: the plain scan is quadratic)
                out.append((s, lr * np.exp(rng.normal(0, 0.05, len(s)))))
    return out


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 16])
def test_lr_kinks_equal_the_plain_computation(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # (in blocks of any size: the block edges fall inside warm-ups, restarts and drops)
    monkeypatch.setattr(context_mod, "_KINK_BLOCK", block)
    found = 0
    for steps, values in _schedules():
        lr = Series(steps.astype(np.int64), values.astype(np.float64))
        for kw in ({}, {"min_strength": 1.0}, {"span_frac": 0.003}):
            want = _plain_lr_kinks(lr, **kw)  # type: ignore[arg-type]
            assert lr_kinks(lr, **kw) == want  # type: ignore[arg-type]
            found += len(want)
    assert found > 50
    for name in RUNS:
        ev = diag(name).ev
        lr = ev.series(LR)
        assert lr_kinks(lr) == _plain_lr_kinks(lr)


# -- the causes' run facts ----------------------------------------------------------------------
class _PlainFacts(_Facts):
    """The same facts asked by scans, as the causes asked them before their indexes."""

    _segment_ends = None  # type: ignore[assignment]  # phase_at asks Schedule.phase_at

    @property
    def drops(self) -> Callable[[float, float], bool]:  # type: ignore[override]
        return lambda lo, hi: overlaps(self.ev.drop_windows, lo, hi)

    def schedule_event(self, lo: int, hi: int) -> tuple[int, str] | None:
        ev, sched = self.ev, self.ev.schedule
        events: list[tuple[int, str]] = []
        if ev.warmup_end is not None:
            events.append((int(ev.warmup_end), "the warm-up ended"))
        for c in sched.changes:
            if c.kind in ("restart", "step_drop"):
                word = "restarted" if c.kind == "restart" else "dropped a step"
                events.append((c.step, f"the LR {word} ({_g(c.lr_before)} -> {_g(c.lr_after)})"))
        for seg in sched.segments:
            if seg.kind == "cooldown":
                events.append((seg.start_step, "the cooldown began"))
        near = [(s, t) for s, t in events if lo <= s <= hi]
        return max(near) if near else None


def _probes(ev: Evidence) -> list[Finding]:
    """Spike-shaped findings at every step of the log (and a few widths)."""
    first, last = ev.run.first_step, ev.run.last_step
    stride = max(1, (last - first) // 3000)
    return [
        Finding(FindingKind.LOSS_SPIKE, Severity.INFO, "loss", s, "probe", s + w, s + w + 2)
        for s in range(first - 3, last + 4, stride)
        for w in (0, 2, 14)
    ]


@pytest.mark.parametrize("name", RUNS)
def test_the_causes_equal_the_plain_scans(name: str) -> None:
    d = diag(name)
    ev, findings = d.ev, d.findings
    assert causes_of(ev, findings) == d.causes
    plain = _PlainFacts(ev, findings)
    assert [_find_causes(plain, f) for f in findings] == d.causes
    probes = _probes(ev)
    fast = _Facts(ev, findings)
    got = [_find_causes(fast, f) for f in probes]
    assert got == [_find_causes(plain, f) for f in probes]  # (the evidence sentences too)
    statuses = {c.status for cs in got for c in cs}
    assert len(statuses) >= 2, statuses


def test_the_phase_is_the_schedules_at_every_step() -> None:
    for name in RUNS:
        ev = diag(name).ev
        fast = _Facts(ev, [])
        for s in range(ev.run.first_step - 3, ev.run.last_step + 4):
            assert fast.phase_at(s) == ev.schedule.phase_at(s), (name, s)
