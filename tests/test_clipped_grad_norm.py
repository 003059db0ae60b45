"""A grad norm logged after clipping: it climbs into the clip threshold and sits there.

JSONL runs: the true grad norm doubles from step 1,500 on and goes on climbing, but the log
holds the clipped norm, pinned at exactly 1.0 from about step 1,900. No check of the grad norm
can see the climb above the ceiling, and the run read "HEALTHY" with nothing said about it.
A note now says the series looks clipped; the same climb logged unclipped, a noisy grad norm
that never repeats its maximum and a constant placeholder get no such note.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from forensics.pipeline import analyze


def _run(folder: Path, grad_norm: np.ndarray) -> Path:
    rng = np.random.default_rng(0)
    folder.mkdir()
    with (folder / "metrics.jsonl").open("w") as fh:
        for s, g in enumerate(grad_norm, start=1):
            loss = 2 + 3 / (1 + s / 300) + rng.normal(0, 0.02)
            fh.write(json.dumps({"step": s, "loss": loss, "grad_norm": float(g), "lr": 3e-4}))
            fh.write("\n")
    return folder


def _true_norm() -> np.ndarray:
    rng = np.random.default_rng(1)
    s = np.arange(1, 4001)
    return (0.5 + np.maximum(0, s - 1500) / 800) * (1 + 0.05 * rng.standard_normal(len(s)))


def _ceiling_notes(folder: Path) -> list[str]:
    return [n for n in analyze(folder).run.notes if "after clipping" in n]


def test_a_clipped_grad_norm_is_noted(tmp_path: Path) -> None:
    true = _true_norm()
    (note,) = _ceiling_notes(_run(tmp_path / "clipped", np.minimum(true, 1.0)))
    k = int((np.minimum(true, 1.0) == 1.0).sum())
    first = int(np.argmax(true >= 1.0)) + 1
    assert f"the grad norm is exactly 1, its highest value, at {k:,} of 4,000 points" in note
    assert f"(from step {first:,} on)" in note
    assert "log the norm before clipping" in note


def test_no_ceiling_note_without_a_ceiling(tmp_path: Path) -> None:
    assert _ceiling_notes(_run(tmp_path / "unclipped", _true_norm())) == []
    assert _ceiling_notes(_run(tmp_path / "constant", np.full(4000, 0.75))) == []
    # Printed to two decimals, a noisy grad norm repeats values, but not its maximum at a
    # tenth of its points.
    rounded = np.round(0.5 * (1 + 0.05 * np.random.default_rng(2).standard_normal(4000)), 2)
    assert _ceiling_notes(_run(tmp_path / "rounded", rounded)) == []


def test_the_light_says_it_does_not_cover_the_climb(tmp_path: Path) -> None:
    """The green light of a run with a clipped grad norm says what it cannot cover, on the
    terminal, in the findings document and at the top of the report."""
    from typer.testing import CliRunner

    from forensics.cli import app

    run = _run(tmp_path / "clipped", np.minimum(_true_norm(), 1.0))
    diag = analyze(run)
    assert diag.verdict == "healthy"
    said = diag.unjudged()
    assert said is not None and said.startswith("The grad norm looks clipped: it is exactly 1,")
    assert said.endswith("so a climb above 1 cannot show and the light does not cover one.")
    doc = diag.to_document()
    assert said in json.dumps(doc)
    out = CliRunner().invoke(
        app, ["analyze", str(run), "-o", str(tmp_path / "r.html")], env={"COLUMNS": "400"}
    )
    assert out.exit_code == 0, out.output
    assert "The grad norm looks clipped" in out.output
    assert "The grad norm looks clipped" in (tmp_path / "r.html").read_text()
    assert analyze(_run(tmp_path / "unclipped", _true_norm())).unjudged() is None
