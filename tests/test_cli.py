"""The CLI contract of `forensics analyze` (issue 2 item 7), through CliRunner and a real
subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from conftest import snapshot, write_tb_run
from typer.testing import CliRunner

from forensics.cli import app

runner = CliRunner()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    wd = tmp_path / "work"
    wd.mkdir()
    monkeypatch.chdir(wd)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return wd


def test_analyze_prints_verdict_and_writes_report(spike_run: Path, workdir: Path) -> None:
    """The default: a text summary on stdout, the HTML report in reports/<run>.html, its place on
    stderr."""
    before = snapshot(spike_run)
    res = runner.invoke(app, ["analyze", str(spike_run)])
    assert res.exit_code == 0, res.output
    report = workdir / "reports" / "exp42.html"
    assert report.is_file() and report.stat().st_size > 1000
    # The place as the user would type it (relative to the current folder), not resolved.
    assert "report written to reports/exp42.html" in res.stderr
    assert "Report: reports/exp42.html" in res.stdout
    assert any(w in res.stdout.lower() for w in ("healthy", "warning", "critical", "fatal"))
    assert snapshot(spike_run) == before  # nothing written into the evidence


def test_format_json_matches_schema(spike_run: Path, workdir: Path, findings_schema: dict) -> None:
    """--format json prints the findings document; it validates against the shipped JSON Schema."""
    res = runner.invoke(app, ["analyze", str(spike_run), "--format", "json", "--no-report"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, findings_schema)
    assert doc["run"]["name"] == "exp42"
    assert doc["run"]["path"] == str(spike_run)  # the path as given
    assert doc["run"]["format"] == "tfevents"
    assert (doc["run"]["first_step"], doc["run"]["last_step"]) == (0, 599)
    assert doc["run"]["metrics"]["loss"] == "train/loss"
    assert not (workdir / "reports").exists()  # --no-report


def test_spike_is_found_at_its_step(spike_run: Path, workdir: Path) -> None:
    """The loss spike injected at step 300 is reported with its onset there."""
    res = runner.invoke(app, ["analyze", str(spike_run), "--format", "json", "--no-report"])
    doc = json.loads(res.stdout)
    spikes = [f for f in doc["findings"] if f["kind"] == "loss_spike"]
    assert len(spikes) == 1 and abs(spikes[0]["start_step"] - 300) <= 2


def test_json_file_and_fail_on(tmp_path: Path, workdir: Path, findings_schema: dict) -> None:
    """--json writes the document; --fail-on warning exits 1 on a run whose loss turns NaN."""
    run = write_tb_run(tmp_path / "nanrun", spike_at=None, nan_at=400)
    out = tmp_path / "out" / "f.json"
    res = runner.invoke(
        app, ["analyze", str(run), "--json", str(out), "--no-report", "--fail-on", "warning"]
    )
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, findings_schema)
    assert doc["verdict"] in ("critical", "fatal")
    assert res.exit_code == 1
    ok = runner.invoke(
        app,
        [
            "analyze",
            str(run),
            "--no-report",
            "--fail-on",
            "fatal",
            "--ignore",
            "nan_inf",
            "--ignore",
            "divergence",
        ],
    )
    assert ok.exit_code == 0, ok.output


def test_report_never_lands_in_run_folder(
    spike_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run from inside the run folder: the report goes to the user cache folder instead."""
    monkeypatch.chdir(spike_run)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    before = snapshot(spike_run)
    res = runner.invoke(app, ["analyze", "."])
    assert res.exit_code == 0, res.output
    assert snapshot(spike_run) == before
    assert (tmp_path / "cache" / "forensics" / "reports").is_dir()
    bad = runner.invoke(app, ["analyze", ".", "--out", str(spike_run / "r.html")])
    assert bad.exit_code == 2 and "evidence" in bad.stderr
    assert snapshot(spike_run) == before


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda p: p.mkdir(), "empty"),
        (lambda p: (p.mkdir(), (p / "notes.md").write_text("hello\n")), "no training log"),
        (lambda p: p.write_bytes(os.urandom(4096)), "expected"),
        (lambda p: None, "no such file"),
    ],
    ids=["empty-folder", "unknown-folder", "binary-junk", "missing"],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, workdir: Path, make, needle: str) -> None:
    """Bad input: exit 2, one line on stderr naming the path, no traceback."""
    target = tmp_path / "bad"
    make(target)
    res = runner.invoke(app, ["analyze", str(target)])
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert needle in lines[0] and str(target) in lines[0]
    assert "Traceback" not in res.output


def test_usage_error_exit_2(workdir: Path) -> None:
    """typer's own usage errors keep exit code 2."""
    assert runner.invoke(app, ["analyze"]).exit_code == 2
    assert runner.invoke(app, ["analyze", ".", "--format", "xml"]).exit_code == 2
    res = runner.invoke(app, ["analyze", ".", "--ignore", "nonsense"])
    assert res.exit_code == 2 and "nonsense" in res.stderr


def test_several_jobs_are_listed_then_all(tmp_path: Path, workdir: Path) -> None:
    """A folder with two Lightning-style version_N TensorBoard jobs: exit 2 listing them; --all
    reports each."""
    root = tmp_path / "lightning_logs"
    write_tb_run(root / "version_0", n=200, spike_at=None)
    write_tb_run(root / "version_1", n=200, spike_at=None, seed=3)
    res = runner.invoke(app, ["analyze", str(root)])
    assert res.exit_code == 2
    assert "version_0" in res.stderr and "version_1" in res.stderr and "--all" in res.stderr
    res = runner.invoke(app, ["analyze", str(root), "--all"])
    assert res.exit_code == 0, res.output
    for job in ("version_0", "version_1"):
        assert (workdir / "reports" / f"{job}.html").is_file()
        assert json.loads((workdir / "reports" / f"{job}.json").read_text())["schema_version"] == 2


def test_config_ignore_from_pyproject(tmp_path: Path, workdir: Path) -> None:
    """[tool.forensics] ignore in the current folder's pyproject.toml drops that kind; a bad key is
    exit 2."""
    run = write_tb_run(tmp_path / "r", n=300, spike_at=None, nan_at=200)
    (workdir / "pyproject.toml").write_text(
        '[tool.forensics]\nignore = ["nan_inf", "divergence", "loss_spike", "grad_norm_spike"]\n'
    )
    res = runner.invoke(app, ["analyze", str(run), "--format", "json", "--no-report"])
    assert res.exit_code == 0, res.output
    kinds = {f["kind"] for f in json.loads(res.stdout)["findings"]}
    assert not kinds & {"nan_inf", "divergence", "loss_spike", "grad_norm_spike"}
    (workdir / "pyproject.toml").write_text("[tool.forensics]\nfrobnicate = 1\n")
    res = runner.invoke(app, ["analyze", str(run)])
    assert res.exit_code == 2 and "frobnicate" in res.stderr


def test_real_subprocess(spike_run: Path, tmp_path: Path) -> None:
    """The installed entry point, as a user runs it: python -m forensics and exit codes."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "forensics",
            "analyze",
            str(spike_run),
            "--format",
            "json",
            "--no-report",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["schema_version"] == 2
    res = subprocess.run(
        [sys.executable, "-m", "forensics", "analyze", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


def test_metrics_export_and_alias(tmp_path: Path, workdir: Path) -> None:
    """`metrics` lists tags with canonical names; `export` writes the frame; --alias maps an odd
    tag."""
    import polars as pl
    from tensorboardX import SummaryWriter

    run = tmp_path / "odd"
    w = SummaryWriter(str(run))
    for s in range(100):
        w.add_scalar("my/strange_objective", 3.0 - s * 0.01, s)
    w.close()
    res = runner.invoke(app, ["metrics", str(run)])
    assert res.exit_code == 0 and "my/strange_objective" in res.stdout
    res = runner.invoke(
        app,
        [
            "analyze",
            str(run),
            "--format",
            "json",
            "--no-report",
            "--alias",
            "my/strange_objective=loss",
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["run"]["metrics"] == {"loss": "my/strange_objective"}
    out = tmp_path / "frame.parquet"
    res = runner.invoke(app, ["export", str(run), "--to", str(out)])
    assert res.exit_code == 0, res.output
    frame = pl.read_parquet(out)
    assert frame.height == 100 and {"step", "tag", "metric", "value", "segment"} <= set(
        frame.columns
    )
    bad = runner.invoke(app, ["analyze", str(run), "--alias", "x=not_a_vital"])
    assert bad.exit_code == 2 and "not_a_vital" in bad.stderr


def test_job_that_crashed_before_its_first_step(workdir: Path) -> None:
    """A real llm.c log that ran out of memory before step 1 still gets a verdict: the crash,
    critical."""
    from conftest import shared_path

    log = shared_path("real_runs", "llmc-gpt2-124M-hectorfcardenas", "gpt2_train.11672072.log")
    res = runner.invoke(app, ["analyze", str(log), "--format", "json", "--fail-on", "critical"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert doc["run"]["name"] == "gpt2_train.11672072"
    assert doc["verdict"] == "critical"
    (crash,) = [f for f in doc["findings"] if f["kind"] == "crash"]
    assert crash["measures"]["reason"] == "out_of_memory"
    assert (workdir / "reports" / "gpt2_train.11672072.html").is_file()


def test_all_on_a_folder_of_text_logs(workdir: Path) -> None:
    """--all over a folder of SLURM logs: one report and findings file per log, each named after its
    file."""
    from conftest import shared_path

    folder = shared_path("real_runs", "llmc-gpt2-124M-hectorfcardenas")
    logs = sorted(p.name for p in folder.glob("*.log"))
    # The folder as a user types it from the current folder (relative): run.path keeps it so,
    # wherever the clone and the shared folder sit.
    given = os.path.relpath(folder, workdir)
    res = runner.invoke(app, ["analyze", given, "--all"])
    assert res.exit_code == 0, res.output
    names = set()
    for log in logs:
        doc = json.loads((workdir / "reports" / f"{log}.json").read_text())
        assert doc["run"]["path"] == str(Path(given) / log)
        names.add(doc["run"]["name"])
        assert (workdir / "reports" / f"{log}.html").is_file()
    assert names == {log.removesuffix(".log") for log in logs}


def test_report_options_reach_the_page(spike_run: Path, workdir: Path) -> None:
    """--plotlyjs cdn makes a small page that loads plotly.js by URL; --redact leaves the run's path
    out."""
    full = runner.invoke(app, ["analyze", str(spike_run), "--out", str(workdir / "full.html")])
    small = runner.invoke(
        app,
        [
            "analyze",
            str(spike_run),
            "--out",
            str(workdir / "small.html"),
            "--plotlyjs",
            "cdn",
            "--redact",
        ],
    )
    assert full.exit_code == 0 and small.exit_code == 0, small.output
    f, s = (workdir / "full.html").read_text(), (workdir / "small.html").read_text()
    assert len(s) < len(f) / 3 and "cdn.plot.ly" in s
    assert str(spike_run) in f and str(spike_run) not in s


# -- the terminal and file output (issue 12) ----------------------------------------------

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"


def _commands() -> dict[str, object]:
    import typer

    group = typer.main.get_command(app)
    return {"": group, **group.commands}  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", ["", "analyze", "metrics", "export", "compare"])
def test_help_is_clean(command: str) -> None:
    """--help: no rich markup eating "[default: ...]" (a stray space before a full stop), no
    <bool>/<str> type labels, arguments by name."""
    res = runner.invoke(app, [*([command] if command else []), "--help"])
    assert res.exit_code == 0, res.output
    text = res.output
    assert "<bool>" not in text and "<str>" not in text and "<list[str]>" not in text
    assert not re.search(r" [.,](\s|$)", text) and "{" not in text  # "path ." from "[...]"
    assert "╭" not in text  # no boxes: one column layout a pipe can read
    if command == "analyze":
        flat = " ".join(text.split())
        assert "[default: reports/<run>.html]" in flat and "[default: 500]" in flat
        assert "Usage: forensics analyze [OPTIONS] PATH" in text


def test_readme_usage_lists_every_option() -> None:
    """The README's usage block names every option of every command (and nothing else)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Usage", 1)[1].split("```", 2)[1]
    documented: dict[str, set[str]] = {}
    current = None
    for line in block.splitlines():
        m = re.match(r"forensics(?: ([a-z]+))?", line)
        if m:
            current = m.group(1) or ""
        if current is None:
            continue
        documented.setdefault(current, set()).update(re.findall(r"(--[a-z][a-z-]*)", line))
    for name, cmd in _commands().items():
        options = {
            o
            for p in cmd.params  # type: ignore[attr-defined]
            for o in p.opts
            if o.startswith("--") and o != "--help"
        }
        assert documented.get(name, set()) == options, name or "forensics"


def test_output_is_not_wrapped_and_paths_are_as_given(workdir: Path) -> None:
    """Piped output: every sentence on one line (a path is never cut), and the report's place
    as the user would type it."""
    given = os.path.relpath(SAMPLES / "nan", workdir)
    res = runner.invoke(app, ["analyze", given, "--json", "out/nan.json"])
    assert res.exit_code == 0, res.output
    assert "findings written to out/nan.json" in res.stderr
    assert "report written to reports/nan.html" in res.stderr
    lines = res.stdout.splitlines()
    assert lines[-1] == "Report: reports/nan.html"
    roll = [ln for ln in lines if ln.startswith("Roll back")]
    assert len(roll) == 1 and roll[0].endswith("keep the data position.")  # one line
    assert any(len(ln) > 120 for ln in lines)  # not cut at 80 columns
    assert all(ln == ln.rstrip() for ln in lines)  # no padding to a terminal width
    doc = json.loads((workdir / "out" / "nan.json").read_text())
    assert doc["run"]["path"] == given


def test_from_another_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from a folder outside the project: the run's path is kept as given (relative)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    given = os.path.relpath(SAMPLES / "healthy", elsewhere)
    res = runner.invoke(app, ["analyze", given, "--format", "json", "--no-report"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["run"]["path"] == given and doc["run"]["name"] == "healthy"


def test_wandb_offline_run_is_named_after_the_run(workdir: Path) -> None:
    """A W&B offline run folder is named after the W&B run (its display name in the .wandb
    file), not offline-run-<date>-<id>; the report goes to reports/<that name>.html."""
    res = runner.invoke(app, ["analyze", str(SAMPLES / "divergence"), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["run"]["name"] == "divergence"
    assert (workdir / "reports" / "divergence.html").is_file()
    assert "offline-run" not in res.stderr


def test_metrics_suggests_no_alias_for_a_histograms_other_statistics(workdir: Path) -> None:
    """A histogram's min/max/mean are no misspelt vital sign (it once suggested
    `--alias activations/layers.0/min=val_loss`)."""
    run = Path(__file__).parent.parent / "sample_runs" / "histogram_layers"
    res = runner.invoke(app, ["metrics", str(run)], terminal_width=400)
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if "activations/layers.0/min" in ln]
    assert len(lines) == 1 and "histogram statistic" in lines[0] and "--alias" not in lines[0]
