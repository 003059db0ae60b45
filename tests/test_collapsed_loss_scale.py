"""A loss scale that fell to its floor and stayed there is the overflow behind a later NaN.

Found in a review pass: the fp16 loss scale fell from 65,536 to 1 over steps 6,000-6,300 and
stayed at 1; the loss went NaN at step 6,400. The NaN's loss-scale cause read "contradicted:
the loss scale held from step 6,399 to 6,401": it held at 1, the bottom of a collapse, which
is the article's "loss scale anomaly under fp16" behind a NaN, not evidence against it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from forensics.pipeline import analyze


def _write(folder: Path, scale_after: list[float], *, nan_at: int = 6400, n: int = 8000) -> Path:
    """A falling loss that goes NaN at ``nan_at``; the loss scale 65,536, then from step
    6,000 the values of ``scale_after`` for 20 steps each, the last one held to the end."""
    rng = np.random.default_rng(9)
    folder.mkdir()
    with open(folder / "metrics.jsonl", "w") as f:
        for i in range(n):
            k = (i - 6000) // 20
            scale = 65536.0 if i < 6000 else scale_after[min(k, len(scale_after) - 1)]
            loss = 2 + 3 / (1 + i / 500) + rng.normal(0, 0.02) if i < nan_at else float("nan")
            row = {"step": i, "loss": loss, "loss_scale": scale}
            f.write(json.dumps(row) + "\n")
    return folder


def _overflow_cause(d, kind: str):  # noqa: ANN001, ANN202
    f = next(f for f in d.findings if f.kind.value == kind)
    i = d.findings.index(f)
    return next(c for c in d.causes[i] if c.cause == "loss_scale_overflow")


def test_a_nan_after_the_scale_collapsed_to_one(tmp_path: Path) -> None:
    halvings = [65536.0 / 2**k for k in range(1, 17)]  # 32,768 ... 1 by step 6,300
    d = analyze(_write(tmp_path / "run", halvings))
    c = _overflow_cause(d, "nan_inf")
    assert c.status == "supported"
    assert c.evidence == (
        "the loss scale had fallen from 65,536 at step 5,999 to 1 by step 6,300 (16 halvings) "
        "and was still there at the onset (step 6,400): overflowing at every scale it tried"
    )
    assert c.steps == (6000, 6300) and c.anchor == 6000


def test_a_scale_that_fell_to_zero(tmp_path: Path) -> None:
    d = analyze(_write(tmp_path / "run", [1024.0, 1.0, 0.0]))
    c = _overflow_cause(d, "nan_inf")
    assert c.status == "supported"
    assert c.evidence.startswith("the loss scale had fallen from 65,536 at step 5,999 to 0 by ")
    assert "halvings" not in c.evidence


def test_a_scale_a_few_halvings_down_is_no_collapse(tmp_path: Path) -> None:
    # 65,536 -> 1,024 (6 halvings), back to normal ranges long before the NaN: it held there.
    d = analyze(_write(tmp_path / "run", [32768.0, 4096.0, 1024.0]))
    c = _overflow_cause(d, "nan_inf")
    assert c.status == "contradicted"
    assert c.evidence == "the loss scale held from step 6,399 to 6,401"


def test_a_healthy_scale_still_contradicts_an_overflow(tmp_path: Path) -> None:
    d = analyze(_write(tmp_path / "run", [65536.0]))
    c = _overflow_cause(d, "nan_inf")
    assert c.status == "contradicted"
