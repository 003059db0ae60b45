"""s3:// URLs for every command (issue 19), against moto's S3 server started by the tests.

Credentials and the endpoint come from the environment (AWS_* variables), as for a user.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from typer.testing import CliRunner

import forensics
from forensics.cli import app

pytest.importorskip("s3fs", reason="the s3:// tests need s3fs (the s3 extra)")
moto_server = pytest.importorskip("moto.server", reason="the s3:// tests need moto[s3] and flask")

runner = CliRunner()
SAMPLES = ROOT / "sample_runs"
BUCKET = "runs"


class _Requests(logging.Handler):
    """The S3 server's access log: (method, path, status) of every request it answered."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage())  # werkzeug colours codes
        m = re.search(r'"(GET|HEAD|PUT|POST|DELETE) (\S+) HTTP/[\d.]+" (\d+)', text)
        if m:
            self.seen.append((m[1], m[2], int(m[3])))


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - (env, requests, big file)
    """A moto S3 server on a free loopback port, a bucket with sample runs, and its env."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    requests = _Requests()
    logging.getLogger("werkzeug").addHandler(requests)
    logging.getLogger("werkzeug").setLevel(logging.INFO)
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir(BUCKET)
    fs.put(str(SAMPLES / "param_norm_jump"), f"{BUCKET}/exp/param_norm_jump", recursive=True)
    fs.put(str(SAMPLES / "loss_scale_collapse" / "train.log"), f"{BUCKET}/logs/train.log")
    fs.put(str(SAMPLES / "bad_batch"), f"{BUCKET}/exp/bad_batch", recursive=True)
    big = _big_event_file(tmp_path_factory.mktemp("big"))
    fs.put(str(big), f"{BUCKET}/big/{big.name}")
    try:
        yield env, requests, big
    finally:
        logging.getLogger("werkzeug").removeHandler(requests)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()


def _big_event_file(folder: Path) -> Path:
    """A 5-6 MB TensorBoard event file (4,000 steps x 26 scalars) with a loss spike at 2,000."""
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(folder))
    for s in range(4000):
        spike = 3.0 if 2000 <= s < 2003 else 1.0
        w.add_scalar("train/loss", spike * (2.0 + 3.0 / (1 + s / 100)), s)
        w.add_scalar("train/grad_norm", spike * 0.5, s)
        for layer in range(24):
            w.add_scalar(f"grad_norm/layer_{layer}", 0.1 + 0.001 * layer, s)
    w.close()
    (f,) = folder.iterdir()
    return f


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def _findings(doc: dict) -> list[tuple]:
    return [(f["kind"], f["severity"], f["start_step"]) for f in doc["findings"]]


@pytest.mark.parametrize(
    ("url", "local"),
    [
        (f"s3://{BUCKET}/exp/param_norm_jump", SAMPLES / "param_norm_jump"),
        (f"s3://{BUCKET}/exp/param_norm_jump/", SAMPLES / "param_norm_jump"),
        (f"s3://{BUCKET}/logs/train.log", SAMPLES / "loss_scale_collapse" / "train.log"),
    ],
)
def test_analyze_url_as_local(s3, workdir: Path, url: str, local: Path) -> None:
    """A prefix or one object in S3 gives the findings the same run gives on disk."""
    res = runner.invoke(app, ["analyze", url, "--no-report", "--format", "json"])
    assert res.exit_code == 0, res.output
    remote = json.loads(res.stdout)
    res = runner.invoke(app, ["analyze", str(local), "--no-report", "--format", "json"])
    here = json.loads(res.stdout)
    assert _findings(remote) == _findings(here) and remote["verdict"] == here["verdict"]
    assert remote["run"]["name"] == here["run"]["name"]


def test_every_command_takes_a_url(s3, workdir: Path) -> None:
    """metrics, export, compare and analyze --all with --sarif all read s3:// URLs."""
    res = runner.invoke(app, ["metrics", f"s3://{BUCKET}/exp/bad_batch"])
    assert res.exit_code == 0, res.output
    assert "grad_norm" in res.stdout
    res = runner.invoke(app, ["export", f"s3://{BUCKET}/logs/train.log", "--to", "run.parquet"])
    assert res.exit_code == 0, res.output
    import polars as pl

    assert pl.read_parquet(workdir / "run.parquet").height > 1000
    res = runner.invoke(
        app,
        [
            "compare",
            f"s3://{BUCKET}/exp/bad_batch",
            f"s3://{BUCKET}/exp/param_norm_jump",
            "--no-report",
            "--format",
            "json",
        ],
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(
        app,
        ["analyze", f"s3://{BUCKET}/exp", "--all", "--no-report", "--sarif", "ci.sarif"],
    )
    assert res.exit_code == 0, res.output
    sarif = json.loads((workdir / "ci.sarif").read_text())
    assert len(sarif["runs"]) == 2
    uris = {
        loc["physicalLocation"]["artifactLocation"]["uri"]
        for run in sarif["runs"]
        for r in run["results"]
        for loc in r["locations"]
    }
    assert uris and all(u.startswith(f"s3://{BUCKET}/exp/") for u in uris), uris


def test_python_api_keeps_the_url(s3, workdir: Path) -> None:
    """forensics.read_run and forensics.analyze take URLs; the run remembers where it came from."""
    run = forensics.read_run(f"s3://{BUCKET}/exp/bad_batch")
    assert run.metadata["url"] == f"s3://{BUCKET}/exp/bad_batch" and run.has("loss")
    diag = forensics.analyze(f"s3://{BUCKET}/exp/bad_batch")
    assert diag.run.name == "bad_batch"


def test_large_event_file_read_in_ranges(s3, workdir: Path) -> None:
    """A large event file comes in ranged GETs of one block each, never whole in memory."""
    env_extra, requests, big = s3
    size = big.stat().st_size
    block = 256 << 10
    url = f"s3://{BUCKET}/big/{big.name}"
    # The client runs in its own process: the S3 server in this one holds the object in memory.
    # A small object first loads the client (botocore's service models weigh tens of MB);
    # then only what fetching the big one adds is measured.
    code = (
        "import sys, tracemalloc; from pathlib import Path; from forensics.remote import fetch;"
        "tracemalloc.start(); fetch(sys.argv[4], cache=Path(sys.argv[3]));"
        "base = tracemalloc.get_traced_memory()[0]; tracemalloc.reset_peak();"
        "p = fetch(sys.argv[1], block_size=int(sys.argv[2]), cache=Path(sys.argv[3]));"
        "print(p); print(tracemalloc.get_traced_memory()[1] - base)"
    )
    env = {**os.environ, **env_extra, "PYTHONPATH": str(ROOT)}
    small = f"s3://{BUCKET}/logs/train.log"
    cmd = [sys.executable, "-c", code, url, str(block), str(workdir / "mirror"), small]
    requests.seen.clear()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    local, peak = Path(res.stdout.split()[0]), int(res.stdout.split()[1])
    assert local.read_bytes() == big.read_bytes()
    gets = [r for r in requests.seen if r[0] == "GET" and r[1].endswith(big.name)]
    assert len(gets) == -(-size // block) and all(status == 206 for _, _, status in gets)
    assert peak < size / 3, f"peak {peak} bytes for a {size}-byte file"
    # The mirror is reused while the object is unchanged.
    requests.seen.clear()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0 and Path(res.stdout.split()[0]) == local
    assert not [r for r in requests.seen if r[0] == "GET" and r[1].endswith(big.name)]
    diag = forensics.analyze(local)
    assert any(f.kind == "loss_spike" and abs(f.start_step - 2000) <= 3 for f in diag.findings)


def test_missing_object_is_one_line_exit_2(s3, workdir: Path) -> None:
    """A URL that names nothing: exit 2, one line, no traceback; so does an unknown scheme."""
    res = runner.invoke(app, ["analyze", f"s3://{BUCKET}/nope"])
    assert res.exit_code == 2 and "no such object or prefix" in res.stderr
    res = runner.invoke(app, ["analyze", "nosuchproto://x/y"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1


def test_real_subprocess_with_env_credentials(s3, tmp_path: Path) -> None:
    """python -m forensics analyze s3://... with the endpoint and keys only in the environment."""
    env_extra, _, _ = s3
    env = {
        **os.environ,
        **env_extra,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "PYTHONPATH": str(ROOT),
    }
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "forensics",
            "analyze",
            f"s3://{BUCKET}/exp/param_norm_jump",
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
    assert json.loads(res.stdout)["verdict"] == "critical"
