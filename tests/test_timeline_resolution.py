"""Who moved first, within what the log can resolve.

A JSONL metrics log written every 10 steps: from step 12,000 memory grows and throughput
falls. The memory's onset is fitted at step 11,995 (between two logged points), the drop's
at 12,000. The incident read "The memory moved first ... then the throughput 5 steps
later", an order the log cannot show: throughput logged no point between the two onsets.
The sentence now says the memory's onset is the earliest and that the log cannot tell which
moved first.

Logged every step, the same run was two incidents, "the memory moved first (onset at step
11,990)": but that onset is a bend fitted on 100 bins of about 180 steps, known only to about
a bin either side, and the drop at 12,000 lies inside that range. Such onsets now carry their
range (``Finding.onset_range``), the two findings are one incident and no order is claimed.
A drop well outside the range is ordered.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from forensics.pipeline import analyze


def _write(folder: Path, every: int, drop_at: int = 12000) -> Path:
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
                * (0.6 if s >= drop_at else 1),
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


def test_an_onset_fitted_on_bins_is_not_ordered_inside_its_range(tmp_path: Path) -> None:
    """Logged every step: each series has points between the onsets, but the memory's onset is
    a bend fitted on bins whose range holds the drop's onset."""
    diag = analyze(_write(tmp_path / "run", every=1))
    (inc,) = diag.incidents  # (two incidents before)
    mem, tput = inc.timeline.movers
    assert (mem.metric, tput.metric) == ("memory", "throughput")
    assert mem.onset_range is not None and mem.onset_range[0] < 12000 <= mem.onset_range[1]
    assert mem.onset_range[1] - mem.onset_range[0] < 500  # about two bins of ~180 steps
    assert tput.onset_range is None and tput.step == 12000
    assert tput.unordered_by == ("range",)
    lo, hi = mem.onset_range
    text = inc.timeline.sentence()
    assert "moved first (" not in text
    assert text.endswith(
        f"; the memory's onset lies anywhere in steps {lo:,}-{hi:,} (a fitted bend: it fits about "
        "as well anywhere there): the log cannot tell which moved first."
    )
    doc = diag.to_document()
    (di,) = doc["incidents"]
    assert di["order_resolved"] is False
    (f_mem,) = [f for f in doc["findings"] if f["kind"] == "memory_growth"]
    assert f_mem["onset_range"] == [lo, hi]
    (f_tput,) = [f for f in doc["findings"] if f["kind"] == "throughput_drop"]
    assert f_tput["onset_range"] is None


def test_an_order_the_log_shows_is_said(tmp_path: Path) -> None:
    """The drop 3,000 steps after the memory's bend, far outside its range: ordered."""
    diag = analyze(_write(tmp_path / "run", every=1, drop_at=15000))
    assert len(diag.incidents) == 2
    for inc in diag.incidents:
        assert inc.timeline.order_resolved
    assert diag.timeline is not None
    mem, tput = diag.timeline.movers
    assert (mem.metric, tput.metric) == ("memory", "throughput")
    assert not tput.unordered
    text = diag.timeline.sentence()
    assert text.startswith(f"The memory moved first (onset at step {mem.step:,}, memory_growth)")
    assert "cannot tell" not in text


def _bad_batch_at(folder: Path, step: int) -> Path:
    """Loss and grad norm logged every step; one bad batch at ``step`` moves both there."""
    rng = np.random.default_rng(1)
    rows = []
    for s in range(1, 3001):
        loss = 4 * np.exp(-s / 800) + 2 + rng.normal(0, 0.02)
        g = 1.0 + rng.normal(0, 0.03)
        if s == step:
            loss, g = loss * 1.8, g * 6
        rows.append({"step": s, "loss": loss, "lr": 3e-4, "grad_norm": g})
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_signs_that_moved_at_the_same_step_are_not_ordered(tmp_path: Path) -> None:
    """A bad batch at step 1,500 moves the grad norm and the loss at that logged step. The
    incident read "The gradient norm moved first (onset at step 1,500, ...); then the training
    loss at the same step": a first the log does not show (the grad norm came first by the
    causal convention for equal steps only). Now both are named as moving at that step, the
    order is not resolved, and the report's table says so. (A control input at a sign's step,
    an LR restart say, is still first: tests/test_lr_restart.py.)"""
    from forensics.report import render_html

    d = analyze(_bad_batch_at(tmp_path / "run", 1500))
    (inc,) = d.incidents
    tl = inc.timeline
    assert [(m.metric, m.step) for m in tl.movers] == [("grad_norm", 1500), ("loss", 1500)]
    sentence = tl.sentence()
    assert "moved first (" not in sentence and "then" not in sentence, sentence
    assert sentence == (
        "The gradient norm (grad_norm_spike) and the training loss (loss_spike) moved at the "
        "same step, 1,500: the log cannot tell which moved first."
    )
    assert not tl.order_resolved and inc.to_dict()["order_resolved"] is False
    page = render_html(d, plotlyjs="cdn")
    assert "same step as the next" in page
