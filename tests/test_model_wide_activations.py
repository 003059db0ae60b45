"""An activation maximum logged without a layer index (the whole model's).

Found in a review pass: a run that logged ``act_absmax`` on its own (the vocabulary's own
name) had it left unmapped, and mapped by ``--alias`` it was still judged on nothing (the
check read per-layer series only). The run came out green with the maximum at 20,000, past the
article's 1e4, and a loss spike at that step had its "activations" cause marked contradicted:
"the logged activations stay in their range".
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from forensics.cli import app
from forensics.detectors import detect
from forensics.diagnosis import diagnose
from forensics.evidence import Evidence
from forensics.importers import read_run
from forensics.report.charts import build_panels
from forensics.schema import ACT_ABSMAX, ACT_MEAN, ACT_STD, canonicalize

runner = CliRunner()


def _write(folder: Path, tag: str, *, act_after: float, at: int = 5000, n: int = 10_000) -> Path:
    """A JSONL run: a falling loss with a spike at ``at`` that takes 400 steps to come back,
    and the model's activation maximum at 1,000 up to ``at``, ``act_after`` from there."""
    rng = np.random.default_rng(1)
    s = np.arange(n)
    loss = 2 + 3 / (1 + s / 500) + rng.normal(0, 0.02, n)
    loss[at : at + 400] += np.linspace(1.5, 0, 400)
    gn = 1.0 + 0.05 * rng.standard_normal(n)
    folder.mkdir()
    with open(folder / "metrics.jsonl", "w") as f:
        for i in range(n):
            row = {"step": i, "loss": loss[i], "grad_norm": gn[i], "lr": 3e-4}
            row[tag] = 1e3 if i < at else act_after
            f.write(json.dumps(row) + "\n")
    return folder


@pytest.mark.parametrize(
    ("tag", "metric"),
    [
        ("act_absmax", ACT_ABSMAX),
        ("activations/absmax", ACT_ABSMAX),
        ("train/activation_absmax", ACT_ABSMAX),
        ("model/act/std", ACT_STD),
        ("act_mean", ACT_MEAN),
    ],
)
def test_model_wide_names_map_without_a_layer(tag: str, metric: str) -> None:
    assert canonicalize(tag) == (metric, None)


@pytest.mark.parametrize("tag", ["decoder/act_absmax", "act/embed/absmax", "activations/max"])
def test_other_activation_paths_stay_unmapped(tag: str) -> None:
    # A module's own statistic without a layer index, or a signed maximum: not the model's.
    assert canonicalize(tag)[0] is None


def test_model_wide_absmax_past_the_limit_is_judged(tmp_path: Path) -> None:
    run = read_run(_write(tmp_path / "run", "act_absmax", act_after=2e4))
    ev = Evidence(run)
    diag = diagnose(ev, detect(run, evidence=ev))
    outliers = [f for f in diag.findings if f.kind.value == "activation_outlier"]
    assert len(outliers) == 1
    f = outliers[0]
    assert (f.severity.value, f.start_step, f.measures["layer"]) == ("warning", 5000, None)
    assert f.measures["value"] == 2e4 and f.measures["before"] == 1e3
    assert f.summary.startswith("Model-wide (no layer index logged) activation absmax passed")
    assert diag.verdict == "warning"
    # The loss spike at the same step: the activations left their range there.
    spike = next(f for f in diag.findings if f.kind.value == "loss_spike")
    i = diag.findings.index(spike)
    act = next(c for c in diag.causes[i] if c.cause == "activations")
    assert act.status == "supported"
    assert act.evidence == "activations left their range from step 5,000"
    # Its chart: the series with the limit drawn, the finding marked.
    panel = next(p for p in build_panels(ev, diag.findings) if p.key == ACT_ABSMAX)
    assert panel.title == "Activation maximum (model-wide)"
    limits = [t for t in panel.figure["data"] if (t.get("meta") or {}).get("judged") == "limit"]
    assert [t["y"] for t in limits] == [[1e4, 1e4]]
    assert f in panel.findings
    # The start-up checklist reads the same series (it said "not logged").
    (item,) = [i for ph in diag.phases for i in ph.items if "activation ranges" in i.question]
    assert (item.status, item.evidence) == (
        "pass",
        "model-wide values logged (no layer); largest absolute activation 1000",
    )


def test_model_wide_absmax_under_the_limit_stays_green(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["analyze", str(_write(tmp_path / "run", "act_absmax", act_after=9e3)), "--no-report"]
    )
    assert result.exit_code == 0, result.output
    assert "HEALTHY (green light)" in result.output


def test_alias_to_act_absmax_is_judged(tmp_path: Path) -> None:
    folder = _write(tmp_path / "run", "activations/max", act_after=2e4)
    plain = runner.invoke(app, ["analyze", str(folder), "--no-report", "--format", "json"])
    assert plain.exit_code == 0, plain.output
    # Unmapped (a signed maximum is not the absmax): nothing claims the activations were read.
    doc = json.loads(plain.stdout)
    assert not [f for f in doc["findings"] if f["kind"] == "activation_outlier"]
    spike = next(f for f in doc["findings"] if f["kind"] == "loss_spike")
    act = next(c for c in spike["causes"] if c["cause"] == "activations")
    assert act["status"] == "untested"
    mapped = runner.invoke(
        app,
        [
            "analyze",
            str(folder),
            "--no-report",
            "--format",
            "json",
            "--alias",
            "activations/max=act_absmax",
        ],
    )
    assert mapped.exit_code == 0, mapped.output
    doc = json.loads(mapped.stdout)
    assert doc["verdict"] == "warning"
    (f,) = [f for f in doc["findings"] if f["kind"] == "activation_outlier"]
    assert f["measures"]["layer"] is None and f["start_step"] == 5000


def test_report_words_a_slow_physiological_recovery(tmp_path: Path) -> None:
    # Back after 383 steps: within the 500-step limit but slower than a passing fluctuation;
    # the card said "returned to its trend quickly" beside a summary saying it was slow.
    folder = _write(tmp_path / "run", "act_absmax", act_after=9e3)
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["analyze", str(folder), "--out", str(out)])
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "after 383 steps, slower than a passing fluctuation" in html
    assert "returned to its trend within the 500-step limit, though more slowly" in html
    assert "returned to its trend quickly" not in html


def test_activations_logged_away_from_the_onset_cannot_contradict_it(tmp_path: Path) -> None:
    """Activation statistics logged for the first 1,000 steps only (1,000 at every point): a
    loss spike at step 5,000 had "contradicted: the logged activations stay in their range up
    to step 5,000". Nothing was logged near it: untested, with the steps they cover."""
    rng = np.random.default_rng(1)
    folder = tmp_path / "run"
    folder.mkdir()
    with open(folder / "metrics.jsonl", "w") as f:
        for i in range(10_000):
            loss = 2 + 3 / (1 + i / 500) + rng.normal(0, 0.02)
            if 5000 <= i < 5400:
                loss += 1.5 * (1 - (i - 5000) / 400)
            row: dict[str, float] = {"step": i, "loss": loss}
            if i <= 1000 and i % 50 == 0:
                row["act/absmax/layers.0"] = 1e3
            f.write(json.dumps(row) + "\n")
    run = read_run(folder)
    ev = Evidence(run)
    diag = diagnose(ev, detect(run, evidence=ev))
    spike = next(f for f in diag.findings if f.kind.value == "loss_spike")
    i = diag.findings.index(spike)
    act = next(c for c in diag.causes[i] if c.cause == "activations")
    assert (act.status, act.evidence) == (
        "untested",
        "the activation statistics are logged only at steps 0-1,000",
    )
