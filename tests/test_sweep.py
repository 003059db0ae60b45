"""`forensics sweep`: a folder of real small trainings analysed in parallel, one index page."""

from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import snapshot
from torch_runs import train_run
from typer.testing import CliRunner

from forensics.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Thirteen jobs: a 3 LR x 3 seed grid, one run that diverges to NaN (an infinite LR from
    step 120), one with a corrupt batch at step 100, one whose only log is a CUDA out-of-memory
    line, and one that died leaving no log at all (a core file)."""
    root = tmp_path_factory.mktemp("sweep")
    for lr in (1e-3, 3e-3, 1e-2):
        for seed in (1, 2, 3):
            train_run(root / f"lr{lr:g}_s{seed}", lr=lr, seed=seed, steps=200)
    train_run(root / "lr0.003_s4_nan", lr=3e-3, seed=4, steps=200, nan_at=120)
    train_run(root / "lr0.003_s5_badbatch", lr=3e-3, seed=5, steps=200, bad_batch_at=100)
    (root / "lr0.003_s6_crashed").mkdir()
    (root / "lr0.003_s6_crashed" / "slurm.err").write_text("CUDA error: out of memory\n")
    (root / "lr0.003_s7_nolog").mkdir()
    (root / "lr0.003_s7_nolog" / "core").write_bytes(bytes(range(256)) * 4)
    return root


class _Rows(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.links: list[str] = []
        self._in_row = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        d = dict(attrs)
        if tag == "tr" and d.get("class") == "run":
            self.rows.append([])
            self._in_row = True
        if tag == "a" and self._in_row:
            self.links.append(d["href"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._in_row = False

    def handle_data(self, data: str) -> None:
        if self._in_row and data.strip():
            self.rows[-1].append(data.strip())


def test_sweep_index_worst_first(
    sweep_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One row per run, worst first (the run with no log, then the NaN run), each analysed run
    linked to its report beside the index; the config columns are the values that vary (lr and
    seed, not the batch size); nothing is written inside the runs."""
    monkeypatch.chdir(tmp_path)
    before = snapshot(sweep_dir)
    res = runner.invoke(app, ["sweep", str(sweep_dir), "--jobs", "4", "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    runs = doc["runs"]
    assert len(runs) == 13
    assert runs[0]["name"] == "lr0.003_s7_nolog" and runs[0]["verdict"] == "error"
    crashed = next(r for r in runs if r["name"].startswith("lr0.003_s6_crashed"))
    assert crashed["verdict"] != "healthy" and crashed["top_findings"][0]["kind"] == "crash"
    assert runs[1]["name"].startswith("lr0.003_s4_nan") and runs[1]["verdict"] == "fatal"
    assert "nan_inf" in {f["kind"] for f in runs[1]["top_findings"]}
    bad = next(r for r in runs if r["name"].startswith("lr0.003_s5_badbatch"))
    assert ("loss_spike", 100) in {(f["kind"], f["step"]) for f in bad["top_findings"]}
    ranks = [
        {"error": 0, "fatal": 1, "critical": 2, "warning": 3, "healthy": 4}[r["verdict"]]
        for r in runs
    ]
    assert ranks == sorted(ranks)
    healthy = [r for r in runs if r["verdict"] == "healthy"]
    assert healthy and all(
        r["final_loss"] <= 1.0 and r["best_loss"] <= r["final_loss"] for r in healthy
    )
    assert set(runs[1]["varying"]) == {"lr", "seed"}
    assert crashed["varying"] == {}
    index = tmp_path / "reports" / f"sweep-{sweep_dir.name}" / "index.html"
    page = _Rows()
    page.feed(index.read_text())
    assert len(page.rows) == 13 and page.rows[0][0] == "lr0.003_s7_nolog"
    assert len(page.links) == 12
    for link in page.links:
        report = (index.parent / link).read_text()
        assert "<html" in report
    assert snapshot(sweep_dir) == before


def test_sweep_refuses_to_write_inside_the_runs(sweep_dir: Path) -> None:
    res = runner.invoke(app, ["sweep", str(sweep_dir), "--out", str(sweep_dir / "index.html")])
    assert res.exit_code != 0 and "refusing to write inside" in res.output


def test_sweep_jobs_one_matches_parallel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rows from one process as from the pool (sample runs, a small folder)."""
    from forensics.sweep import sweep

    root = Path(__file__).resolve().parent.parent / "sample_runs"
    import shutil

    for name in ("healthy", "nan", "bad_batch"):
        shutil.copytree(root / name, tmp_path / "runs" / name)
    one = sweep(tmp_path / "runs", tmp_path / "one", jobs=1)
    many = sweep(tmp_path / "runs", tmp_path / "many", jobs=3)
    assert [(r["name"], r["verdict"], r["findings"]) for r in one] == [
        (r["name"], r["verdict"], r["findings"]) for r in many
    ]
    assert [r["name"] for r in one] == ["nan", "bad_batch", "healthy"]


def test_sweep_lines_leave_out_keys_a_run_does_not_have(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sample runs whose configs share no key (an HF Trainer run and a W&B run): each
    line states its own values and none of the other's as "=None" (the index page shows "–"
    for them)."""
    samples = Path(__file__).resolve().parents[1] / "sample_runs"
    root = tmp_path / "runs"
    root.mkdir()
    for name in ("late_overfit", "divergence"):  # (copies: links out of a folder are not read)
        shutil.copytree(samples / name, root / name, symlinks=True)
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["sweep", str(root), "--jobs", "1"])
    assert res.exit_code == 0, res.output
    lines = {ln.split()[1].split("/")[0]: ln for ln in res.stdout.splitlines() if ln.strip()}
    assert "=None" not in res.stdout
    assert "max_steps=800" in lines["late_overfit"] and "lr=0.003" in lines["divergence"]
    assert "lr=" not in lines["late_overfit"] and "max_steps" not in lines["divergence"]


def test_a_sweep_of_failed_jobs_says_what_ended_each(tmp_path: Path) -> None:
    """hectorfcardenas' llm.c jobs: six that died before their first step (out of memory,
    a failed assertion, CUDA errors) read "crash @ 0" six times, and the NaN run
    "nan_inf @ 1, nan_inf @ 1". Each line now says what tells its findings apart."""
    from conftest import shared_path

    src = shared_path("real_runs", "llmc-gpt2-124M-hectorfcardenas")
    out = tmp_path / "sweep" / "index.html"
    res = runner.invoke(app, ["sweep", str(src), "--out", str(out), "--jobs", "1"])
    assert res.exit_code == 0, res.output
    lines = {ln.split()[1]: ln for ln in res.stdout.splitlines() if ln.strip()}
    assert "crash (out of memory) @ 0" in lines["gpt2_train.11672072.log"]
    assert "crash (assertion) @ 0" in lines["gpt2_train.11673594.log"]
    assert "crash (cuda) @ 0" in lines["gpt2_train.11678978.log"]
    assert "nan_inf (loss) @ 1, nan_inf (grad_norm) @ 1" in lines["gpt2_train.11679010.log"]
    page = out.read_text()
    assert "crash (out of memory) at step" in page and "nan_inf (grad_norm) at step" in page
    res = runner.invoke(
        app, ["sweep", str(src), "--out", str(tmp_path / "j" / "i.html"), "--format", "json"]
    )
    doc = json.loads(res.stdout)
    oom = next(r for r in doc["runs"] if r["name"] == "gpt2_train.11672072.log")
    assert oom["top_findings"][0] == {
        "kind": "crash",
        "severity": "critical",
        "step": 0,
        "metric": None,
        "reason": "out of memory",
    }


def test_sweep_row_of_a_run_with_no_vital_sign_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose series forensics does not know was a green row (nothing judged); it is an
    error row that says why, beside a run that is judged."""
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "sweep"
    for name, key in (("good", "loss"), ("blind", "foo")):
        (root / name).mkdir(parents=True)
        rows = [json.dumps({"step": i, key: 3 - i / 100}) for i in range(60)]
        (root / name / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    res = runner.invoke(app, ["sweep", str(root), "--format", "json"])
    assert res.exit_code == 0, res.output
    by_name = {r["name"].split("/")[0]: r for r in json.loads(res.stdout)["runs"]}
    assert by_name["good"]["verdict"] == "healthy"
    assert by_name["blind"]["verdict"] == "error"
    assert by_name["blind"]["error"].startswith("no vital sign recognised among its 1 series (foo)")


def test_sweep_lines_hold_at_most_eight_config_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs whose configs differ in 20 keys: each terminal line names 7 of them and how many
    more the index page shows (a sweep of different trainers printed a hundred a line); the
    index and the JSON document keep all 20."""
    import csv

    import yaml

    root = tmp_path / "runs"
    for j, name in enumerate(("a", "b")):
        folder = root / name
        folder.mkdir(parents=True)
        rows = [{"step": s, "train_loss": 4.0 - s / 100 + j} for s in range(0, 200, 2)]
        with open(folder / "metrics.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["step", "train_loss"])
            w.writeheader()
            w.writerows(rows)
        hp = {f"key{i:02d}": i + 10 * j for i in range(20)}
        (folder / "hparams.yaml").write_text(yaml.dump(hp))
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["sweep", str(root), "--jobs", "1"])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert len(lines) == 2
    for ln in lines:
        assert ln.endswith("(+13 more in the index)"), ln
        assert ln.count("=") == 7 and "key00=" in ln and "key06=" in ln and "key07=" not in ln
    res = runner.invoke(app, ["sweep", str(root), "--jobs", "1", "--format", "json"])
    assert all(len(r["varying"]) == 20 for r in json.loads(res.stdout)["runs"])


def test_a_row_says_when_its_light_covers_less(tmp_path: Path) -> None:
    """A run with no training loss (only a grad norm, LR and memory logged) reads "healthy"
    in a sweep like any other; its row now says the light covers less, on the terminal line,
    in the index page and in the JSON document."""
    import numpy as np

    rng = np.random.default_rng(0)
    for name, with_loss in (("full", True), ("noloss", False)):
        (tmp_path / "runs" / name).mkdir(parents=True)
        lines = []
        for s in range(1, 501):
            row = {"step": s, "grad_norm": 1 + 0.05 * rng.standard_normal(), "lr": 3e-4}
            if with_loss:
                row["loss"] = 2 + 3 / (1 + s / 100) + 0.02 * rng.standard_normal()
            lines.append(json.dumps(row))
        (tmp_path / "runs" / name / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "index.html"
    res = runner.invoke(app, ["sweep", str(tmp_path / "runs"), "-o", str(out), "-j", "1"])
    assert res.exit_code == 0, res.output
    lines = {ln.split()[1]: ln for ln in res.stdout.splitlines() if ln.startswith("HEALTHY")}
    assert "(light limited: No training loss in the log)" in lines["noloss/metrics.jsonl"]
    assert "light limited" not in lines["full/metrics.jsonl"]
    assert "No training loss in the log: its checks" in out.read_text()
    res = runner.invoke(
        app, ["sweep", str(tmp_path / "runs"), "-o", str(out), "-j", "1", "--format", "json"]
    )
    doc = json.loads(res.stdout)
    by = {r["name"]: r for r in doc["runs"]}
    assert by["noloss/metrics.jsonl"]["unjudged"].startswith("No training loss in the log")
    assert by["full/metrics.jsonl"]["unjudged"] is None
