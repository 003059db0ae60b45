"""--sarif and --junit (issue 19): validated against the published schemas in tests/data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import jsonschema
import pytest
from conftest import ROOT, snapshot, write_tb_run
from typer.testing import CliRunner

from forensics.cli import app

runner = CliRunner()
DATA = Path(__file__).parent / "data"
SAMPLES = ROOT / "sample_runs"
LEVEL = {"fatal": "error", "critical": "error", "warning": "warning", "info": "note"}


@pytest.fixture(scope="module")
def sarif_schema() -> dict:
    return json.loads((DATA / "sarif-schema-2.1.0.json").read_text())


@pytest.fixture(scope="module")
def junit_schema():  # noqa: ANN201 - xmlschema.XMLSchema
    xmlschema = pytest.importorskip("xmlschema")
    return xmlschema.XMLSchema(str(DATA / "junit-10.xsd"))


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    wd = tmp_path / "work"
    wd.mkdir()
    monkeypatch.chdir(wd)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return wd


def _analyze(*args: str) -> tuple[int, dict]:
    res = runner.invoke(app, ["analyze", *args, "--no-report", "--format", "json"])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout)


def _validate_sarif(doc: dict, schema: dict) -> None:
    jsonschema.Draft4Validator.check_schema(schema)
    jsonschema.Draft4Validator(schema).validate(doc)


def _local(uri: str, base: Path) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    return base / unquote(uri)


@pytest.mark.parametrize(
    ("sample", "needs_line"),
    [("param_norm_jump", False), ("loss_scale_collapse", True), ("throughput_drop", True)],
)
def test_sarif_one_result_per_finding(
    sample: str, needs_line: bool, workdir: Path, sarif_schema: dict
) -> None:
    """Every finding is one SARIF result with its level, its log file and its step; valid 2.1.0."""
    run = SAMPLES / sample
    _, doc = _analyze(str(run), "--sarif", "out.sarif")
    sarif = json.loads((workdir / "out.sarif").read_text())
    _validate_sarif(sarif, sarif_schema)
    assert sarif["version"] == "2.1.0"
    (srun,) = sarif["runs"]
    results = srun["results"]
    assert len(results) == len(doc["findings"]) > 0
    rules = [r["id"] for r in srun["tool"]["driver"]["rules"]]
    for res, f in zip(results, doc["findings"], strict=True):
        assert res["ruleId"] == f["kind"] == rules[res["ruleIndex"]]
        assert res["level"] == LEVEL[f["severity"]]
        assert f"{f['start_step']:,}" in res["message"]["text"]
        assert f["summary"] in res["message"]["text"]
        loc = res["locations"][0]["physicalLocation"]
        path = _local(loc["artifactLocation"]["uri"], workdir)
        assert path.is_file() and run.resolve() in path.resolve().parents
        if needs_line and f["metric"] is not None:
            line = loc["region"]["startLine"]
            assert 1 <= line <= len(path.read_text().splitlines())
    assert len({r["partialFingerprints"]["forensicsFinding/v1"] for r in results}) == len(results)


def test_sarif_relative_uri_inside_the_checkout(tmp_path: Path, monkeypatch, sarif_schema) -> None:
    """A log inside the current folder (a CI checkout) has a relative URI, as GitHub wants."""
    repo = tmp_path / "repo"
    shutil.copytree(SAMPLES / "loss_scale_collapse", repo / "logs" / "run 1")
    monkeypatch.chdir(repo)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _analyze("logs/run 1", "--sarif", str(tmp_path / "out.sarif"))
    sarif = json.loads((tmp_path / "out.sarif").read_text())
    _validate_sarif(sarif, sarif_schema)
    uris = {
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        for r in sarif["runs"][0]["results"]
    }
    assert uris == {"logs/run%201/train.log"}


@pytest.mark.parametrize("fail_on", [None, "warning", "critical", "fatal"])
def test_junit_case_per_vital_sign(fail_on: str | None, workdir: Path, junit_schema) -> None:
    """One case per vital sign; failed when a finding reaches --fail-on (default warning)."""
    from xml.etree import ElementTree as ET

    rank = {"info": 0, "warning": 1, "critical": 2, "fatal": 3}
    args = [str(SAMPLES / "param_norm_jump"), "--junit", "out.xml"]
    if fail_on:
        args += ["--fail-on", fail_on]
    code, doc = _analyze(*args)
    xml = (workdir / "out.xml").read_text()
    junit_schema.validate(xml)
    root = ET.fromstring(xml)
    (suite,) = root.findall("testsuite")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert set(doc["run"]["metrics"]) <= set(cases)
    threshold = rank[fail_on or "warning"]
    expect_failed = {
        f["metric"] or "run" for f in doc["findings"] if rank[f["severity"]] >= threshold
    }
    failed = {n for n, c in cases.items() if c.find("failure") is not None}
    assert failed == expect_failed
    assert int(suite.get("failures")) == len(failed) == int(root.get("failures"))
    assert int(suite.get("tests")) == len(cases)
    # Findings below the threshold are still shown, in the case's output.
    for f in doc["findings"]:
        case = cases[f["metric"] or "run"]
        shown = "".join(e.text or "" for e in case if e.tag in ("failure", "system-out"))
        assert f["summary"] in shown
    assert code == (1 if fail_on and rank.get(doc["verdict"], 0) >= rank[fail_on] else 0)


def test_junit_skips_vital_signs_not_logged(tmp_path: Path, workdir: Path, junit_schema) -> None:
    """A run without a validation loss shows val_loss as a skipped case, not a pass."""
    from xml.etree import ElementTree as ET

    run = write_tb_run(tmp_path / "r", n=200, spike_at=None)
    _analyze(str(run), "--junit", "out.xml")
    xml = (workdir / "out.xml").read_text()
    junit_schema.validate(xml)
    suite = ET.fromstring(xml).find("testsuite")
    skipped = {c.get("name") for c in suite.findall("testcase") if c.find("skipped") is not None}
    assert "val_loss" in skipped
    assert int(suite.get("skipped")) == len(skipped)


def test_all_jobs_go_into_one_file(
    tmp_path: Path, workdir: Path, sarif_schema: dict, junit_schema
) -> None:
    """--all: one SARIF run and one JUnit suite per job, in one file each."""
    root = tmp_path / "lightning_logs"
    write_tb_run(root / "version_0", n=200, spike_at=None)
    write_tb_run(root / "version_1", n=300, spike_at=150, seed=3)
    res = runner.invoke(
        app,
        ["analyze", str(root), "--all", "--no-report", "--sarif", "o.sarif", "--junit", "o.xml"],
    )
    assert res.exit_code == 0, res.output
    sarif = json.loads((workdir / "o.sarif").read_text())
    _validate_sarif(sarif, sarif_schema)
    assert [r["automationDetails"]["id"] for r in sarif["runs"]] == [
        "forensics/version_0/",
        "forensics/version_1/",
    ]
    xml = (workdir / "o.xml").read_text()
    junit_schema.validate(xml)
    assert xml.count("<testsuite ") == 2


def test_outputs_never_inside_the_run_and_atomic(tmp_path: Path, workdir: Path) -> None:
    """A path in the run folder is refused (exit 2); a replaced file leaves no temp file."""
    run = write_tb_run(tmp_path / "runs" / "r", n=200, spike_at=None)
    before = snapshot(run)
    for opt in ("--sarif", "--junit"):
        res = runner.invoke(app, ["analyze", str(run), "--no-report", opt, str(run / "x.out")])
        assert res.exit_code == 2 and "evidence" in res.stderr
    assert snapshot(run) == before
    out = workdir / "ci" / "out.sarif"
    out.parent.mkdir()
    out.write_text("old")
    res = runner.invoke(app, ["analyze", str(run), "--no-report", "--sarif", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["version"] == "2.1.0"
    assert [p.name for p in out.parent.iterdir()] == ["out.sarif"]


def test_untrusted_names_stay_valid_xml(tmp_path: Path, workdir: Path, junit_schema) -> None:
    """Control characters and markup in a run name cannot break the XML."""
    run = write_tb_run(tmp_path / "a<b>&\x01c", n=200, spike_at=120)
    res = runner.invoke(app, ["analyze", str(run), "--no-report", "--junit", "o.xml"])
    assert res.exit_code == 0, res.output
    junit_schema.validate((workdir / "o.xml").read_text())


def test_real_subprocess_writes_both(tmp_path: Path, sarif_schema: dict, junit_schema) -> None:
    """python -m forensics with --sarif and --junit and --fail-on, as a CI job runs it."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "forensics",
            "analyze",
            str(SAMPLES / "loss_scale_collapse"),
            "--no-report",
            "--sarif",
            "f.sarif",
            "--junit",
            "f.xml",
            "--fail-on",
            "warning",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert res.returncode == 1, res.stderr
    _validate_sarif(json.loads((tmp_path / "f.sarif").read_text()), sarif_schema)
    junit_schema.validate((tmp_path / "f.xml").read_text())
    assert "SARIF written to" in res.stderr and "JUnit XML written to" in res.stderr
