"""`forensics compare` keeps per-layer findings apart: an activation outlier in layer 0 of one
run and in layer 3 of the other, at the same step, are two findings, not one "in both"."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from synthetic import jsonl_row
from typer.testing import CliRunner

from forensics.cli import app
from forensics.compare import compare

LAYERS = 4


def _run(folder: Path, blown: int) -> Path:
    """A healthy JSONL run logging four layers' activation absmax near 50; layer ``blown``
    passes 1e4 from step 600 on."""
    rng = np.random.default_rng(7)
    folder.mkdir()
    with (folder / "metrics.jsonl").open("w") as fh:
        for step in range(1, 1001):
            row: dict[str, float | int] = dict(jsonl_row(step, rng))
            for layer in range(LAYERS):
                act = 50.0 * (1 + 0.02 * rng.standard_normal())
                if layer == blown and step >= 600:
                    act = 3e4 * (1 + 0.02 * rng.standard_normal())
                row[f"act_absmax/layers.{layer}"] = act
            fh.write(json.dumps(row) + "\n")
    return folder


def test_outliers_in_other_layers_are_not_matched(tmp_path: Path) -> None:
    a, b = _run(tmp_path / "a", blown=0), _run(tmp_path / "b", blown=3)
    cmp = compare([a, b])
    fd = cmp.finding_diff[1]
    outliers = {
        side: [f for f in fd[side] if f["kind"] == "activation_outlier"]
        for side in ("both", "only_reference", "only_other")
    }
    assert outliers["both"] == []
    assert [(f["layer"], f["step"]) for f in outliers["only_reference"]] == [(0, 600)]
    assert [(f["layer"], f["step"]) for f in outliers["only_other"]] == [(3, 600)]
    assert outliers["only_other"][0]["what"] == "activation_outlier (act_absmax, layer 3)"

    # The same layer in both runs is one finding in both.
    same = compare([a, _run(tmp_path / "c", blown=0)]).finding_diff[1]
    assert [f["layer"] for f in same["both"] if f["kind"] == "activation_outlier"] == [0]

    out = CliRunner().invoke(app, ["compare", str(a), str(b), "-o", str(tmp_path / "c.html")])
    assert out.exit_code == 0, out.output
    assert "only in b, warning: activation_outlier (act_absmax, layer 3) @ 600" in out.output
    page = (tmp_path / "c.html").read_text()
    assert "<b>activation_outlier (act_absmax, layer 0)</b> at step 600" in page


def test_loss_scale_axis_ticks_at_powers_of_two() -> None:
    """The compare page's loss-scale chart is labelled at powers of two, as the single-run
    report's is; plotly's own log axis had labelled 200k, 300k ... as "2", "3" beside "100k"."""
    from forensics.report.compare_page import compare_figure

    samples = Path(__file__).resolve().parent.parent / "sample_runs"
    cmp = compare([samples / "healthy", samples / "loss_scale_collapse"])
    axis = compare_figure(cmp, "loss_scale")["layout"]["yaxis"]
    assert axis["type"] == "log"
    assert axis["tickvals"] and all(
        float(v).is_integer() and int(v) & (int(v) - 1) == 0 for v in axis["tickvals"]
    )
    assert len(axis["ticktext"]) == len(axis["tickvals"])


def test_a_layer_group_is_named_by_its_group() -> None:
    """A layer_grad_shift of layers 0-3 is named by the group, not by its first layer."""
    from forensics.compare import _what
    from forensics.findings import Finding, FindingKind, Severity

    def shift(layer: int, layers: str) -> Finding:
        return Finding(
            FindingKind.LAYER_GRAD_SHIFT,
            Severity.WARNING,
            "grad_norm_layer",
            310,
            "s",
            measures={"layer": layer, "layers": layers},
        )

    assert _what(shift(0, "0-3")) == "layer_grad_shift (grad_norm_layer, layers 0-3)"
    assert _what(shift(1, "1")) == "layer_grad_shift (grad_norm_layer, layer 1)"
