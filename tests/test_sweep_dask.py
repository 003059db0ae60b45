"""`forensics sweep DIR --scheduler ADDRESS`: the sweep's jobs on a real local Dask cluster
(``distributed.LocalCluster``, worker processes), compared with the local process pool."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, snapshot
from torch_runs import train_run
from typer.testing import CliRunner

from forensics.cli import app

distributed = pytest.importorskip("distributed")
runner = CliRunner()
# A second scheduler in the session finds the first one's HTTP port taken and says so.
pytestmark = pytest.mark.filterwarnings("ignore:Port \\d+ is already in use")


def _env(**extra: str) -> dict[str, str]:
    """The subprocess runs this checkout's forensics (not an installed copy elsewhere)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five jobs: two learning rates, a run that diverges to NaN, one with a corrupt batch at
    step 60, and a sub-folder with no training log."""
    root = tmp_path_factory.mktemp("dasksweep")
    train_run(root / "lr0.001", lr=1e-3, seed=1, steps=120)
    train_run(root / "lr0.01", lr=1e-2, seed=1, steps=120)
    train_run(root / "lr0.003_nan", lr=3e-3, seed=2, steps=120, nan_at=80)
    train_run(root / "lr0.003_badbatch", lr=3e-3, seed=3, steps=120, bad_batch_at=60)
    (root / "nolog").mkdir()
    (root / "nolog" / "core").write_bytes(bytes(range(256)))
    return root


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """Two single-threaded worker processes on the loopback; yields the scheduler's address."""
    with distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
    ) as c:
        yield c.scheduler_address


def test_cluster_rows_match_the_local_pool(
    sweep_dir: Path, cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m forensics sweep` against the cluster gives the local pool's rows, value for
    value (verdicts, findings, losses, varying config, report names). DIR is given relative to
    a working directory the workers do not share; nothing is written inside the runs; stderr
    holds the one line naming the index."""
    before = snapshot(sweep_dir)
    monkeypatch.chdir(tmp_path)
    local = runner.invoke(
        app,
        ["sweep", str(sweep_dir), "--jobs", "2", "--format", "json", "--out", "local/index.html"],
    )
    assert local.exit_code == 0, local.output
    remote = subprocess.run(
        [
            sys.executable,
            "-m",
            "forensics",
            "sweep",
            sweep_dir.name,
            "--scheduler",
            cluster,
            "--format",
            "json",
            "--out",
            str(tmp_path / "dask" / "index.html"),
        ],
        cwd=sweep_dir.parent,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert remote.returncode == 0, remote.stderr
    [line] = remote.stderr.strip().splitlines()
    assert line.startswith("forensics: sweep index written to ") and line.endswith("index.html")
    assert (tmp_path / "dask" / "index.html").is_file()
    rows = json.loads(remote.stdout)["runs"]
    assert rows == json.loads(local.stdout)["runs"]
    by_name = {r["name"].split("/")[0]: r for r in rows}
    assert [r["name"].split("/")[0] for r in rows][:2] == ["nolog", "lr0.003_nan"]
    assert by_name["nolog"]["verdict"] == "error"
    assert by_name["lr0.003_nan"]["verdict"] == "fatal"
    assert ("loss_spike", 60) in {
        (f["kind"], f["step"]) for f in by_name["lr0.003_badbatch"]["top_findings"]
    }
    assert by_name["lr0.001"]["varying"]["lr"] == 0.001
    for r in rows:
        if r["report"]:
            assert "<html" in (tmp_path / "dask" / "index-runs" / r["report"]).read_text()
    assert snapshot(sweep_dir) == before


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_scheduler_is_one_line(sweep_dir: Path, tmp_path: Path) -> None:
    """Nothing listens at the address: after Dask's connect timeout, one line and exit code 2,
    no traceback, no index written."""
    address = f"tcp://127.0.0.1:{_free_port()}"
    res = subprocess.run(
        [sys.executable, "-m", "forensics", "sweep", str(sweep_dir), "--scheduler", address],
        cwd=tmp_path,
        env=_env(DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT="2s"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"forensics: error: cannot reach the Dask scheduler at {address}: "
        f"Timed out trying to connect to {address} after 2 s"
    ]
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("localhost", "--scheduler localhost: missing port number in address 'localhost'"),
        ("http://127.0.0.1:8786", "--scheduler http://127.0.0.1:8786: unknown address scheme"),
    ],
)
def test_malformed_address_is_one_line(sweep_dir: Path, address: str, message: str) -> None:
    res = runner.invoke(app, ["sweep", str(sweep_dir), "--scheduler", address])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"forensics: error: {message}")


def test_distributed_not_installed(sweep_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the distributed package (an import that fails), the install line to run."""
    monkeypatch.setitem(sys.modules, "distributed", None)
    res = runner.invoke(app, ["sweep", str(sweep_dir), "--scheduler", "tcp://127.0.0.1:8786"])
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        "forensics: error: --scheduler needs the Dask distributed client: "
        "pip install 'forensics[dask]'"
    ]


def _can_hide_folders() -> bool:
    """A private mount namespace (unshare) in which a tmpfs can hide a folder."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _can_hide_folders(), reason="no unprivileged mount namespaces here")
def test_worker_that_cannot_see_the_runs(
    sweep_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real `dask worker` in its own mount namespace where a tmpfs hides the sweep folder (a
    worker on a machine without the team's shared disk): every run is an error row saying the
    worker cannot see it, with the worker's host; the sweep itself completes."""
    monkeypatch.chdir(tmp_path)
    with distributed.LocalCluster(
        n_workers=0, processes=True, host="127.0.0.1", dashboard_address=None
    ) as c:
        worker = subprocess.Popen(
            [
                "unshare",
                "--user",
                "--map-root-user",
                "--mount",
                "sh",
                "-c",
                f'mount -t tmpfs none "{sweep_dir}" && exec "$0" -m distributed.cli.dask_worker '
                f'"$1" --nthreads 1 --no-nanny --no-dashboard --local-directory "$2"',
                sys.executable,
                c.scheduler_address,
                str(tmp_path / "worker"),
            ],
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            res = runner.invoke(
                app,
                ["sweep", str(sweep_dir), "--scheduler", c.scheduler_address, "--format", "json"],
            )
        finally:
            worker.terminate()
            worker.wait(timeout=30)
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["runs"]
    assert len(rows) == 5 and {r["verdict"] for r in rows} == {"error"}
    host = socket.gethostname()
    for r in rows:
        assert r["error"] == (
            f"{sweep_dir / r['job']}: not found on the Dask worker on {host} (workers read "
            "the runs by path: the folder must be at the same path on every worker)"
        )
