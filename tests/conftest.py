"""Shared fixtures: real TensorBoard runs written with tensorboardX into tmp_path."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
# The shared folder (real logs, format samples): FORENSICS_SHARED, by default ../shared.
SHARED = Path(os.environ.get("FORENSICS_SHARED", str(ROOT.parent / "shared"))).resolve()
REAL_RUNS = SHARED / "real_runs"
# The run cache goes to a folder of this test session, never the user's cache folder: one
# sub-folder per xdist worker (the workers inherit the session folder from the controller), so
# that no test sees entries, evictions or a half-cleared folder of another worker's tests.
_SESSION_CACHE = "FORENSICS_TEST_SESSION_CACHE"
_OWN_CACHE = False
if _SESSION_CACHE in os.environ or "FORENSICS_CACHE_DIR" not in os.environ:
    if _SESSION_CACHE not in os.environ:
        import tempfile

        os.environ[_SESSION_CACHE] = tempfile.mkdtemp(prefix="forensics-test-cache-")
        _OWN_CACHE = True
    os.environ["FORENSICS_CACHE_DIR"] = str(
        Path(os.environ[_SESSION_CACHE]) / os.environ.get("PYTEST_XDIST_WORKER", "main")
    )


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Run the tests on one xdist worker per CPU unless -n is given (-n 0: in this process).

    Set here rather than in addopts so that `pytest -p no:xdist` still works. "logical", not
    "auto": auto counts physical cores, one on a 2-vCPU machine whose vCPUs are a core's two
    hyperthreads (PYTEST_XDIST_AUTO_NUM_WORKERS overrides the count). One test file stays on
    one worker (--dist loadfile): module fixtures are computed once and a file's tests run in
    their written order, as without xdist.
    """
    if not config.pluginmanager.hasplugin("xdist") or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if config.option.numprocesses is None and not config.option.collectonly:
        config.option.numprocesses = "logical"
        if config.option.dist == "no":
            config.option.dist = "loadfile"


def pytest_unconfigure(config: pytest.Config) -> None:
    if _OWN_CACHE:
        import shutil

        shutil.rmtree(os.environ[_SESSION_CACHE], ignore_errors=True)


@pytest.fixture(params=["compiled", "polars"])
def jsonl_reader_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A JSONL reader test twice: plain blocks read by the compiled kernel
    (``forensics/importers/_jsonl.c``), and by polars (the kernel switched off). A test of the
    polars path's own state (its schema, line shapes, null stand-in) is marked
    ``polars_path`` and runs once, without the kernel."""
    from forensics.importers import jsonl_blocks

    if request.param == "polars":
        monkeypatch.setattr(jsonl_blocks, "_jsonl", None)
    elif request.node.get_closest_marker("polars_path"):
        pytest.skip("a test of the polars path's state: run with the kernel switched off")
    elif jsonl_blocks._jsonl is None:
        pytest.skip("the JSONL kernel is not built here (no C compiler at install)")
    return str(request.param)


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or skip the test with a reason when it is absent."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} is absent (../shared is not beside the project)")
    return p


def write_tb_run(
    logdir: Path,
    n: int = 600,
    spike_at: int | None = 300,
    nan_at: int | None = None,
    seed: int = 0,
    tag_prefix: str = "train/",
    suffix: str = "",
) -> Path:
    """A TensorBoard run written by tensorboardX: a falling noisy loss, grad norm, lr; optional
    spike/NaN."""
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(seed)
    w = SummaryWriter(str(logdir), filename_suffix=suffix)
    for s in range(n):
        loss = 2.0 + 6.0 / (1 + s / 30) ** 0.7
        loss *= math.exp(rng.normal(0, 0.02))
        gn = 0.5 + 1.5 * math.exp(-s / 80) + abs(rng.normal(0, 0.03))
        if spike_at is not None and spike_at <= s < spike_at + 3:
            loss *= 3.0
            gn *= 8.0
        if nan_at is not None and s >= nan_at:
            loss = float("nan")
            gn = float("nan")
        w.add_scalar(f"{tag_prefix}loss", loss, s)
        w.add_scalar(f"{tag_prefix}grad_norm", gn, s)
        w.add_scalar(f"{tag_prefix}lr", 3e-4 * min(1.0, (s + 1) / 50), s)
    w.close()
    return logdir


def alerts_poll_by_poll(path: Path, lasts: tuple[int, ...]) -> list[tuple[int, Any]]:
    """The alerts ``forensics watch`` would send reading ``path`` one poll at a time, the log
    cut after each of ``lasts`` in turn: (last step read, alert), as its engine updates the
    alert book (the run's last step and each sign's last finite one)."""
    import polars as pl

    from forensics.pipeline import analyze_run, read_run
    from forensics.watch.alerts import AlertBook, last_steps

    full = read_run(path)
    book = AlertBook()
    out: list[tuple[int, Any]] = []
    for last in lasts:
        cut = read_run(path)
        cut.frame = full.frame.filter(pl.col("step") <= last)
        diag = analyze_run(cut)
        for a in book.update(diag.findings, last_step=cut.last_step, last_steps=last_steps(cut)):
            out.append((last, a))
    return out


def snapshot(folder: Path) -> dict[str, tuple[int, float]]:
    """Every file under folder with its size and mtime, to prove nothing was written there."""
    out = {}
    for dirpath, _, files in os.walk(folder):
        for f in files:
            p = Path(dirpath) / f
            st = p.stat()
            out[str(p.relative_to(folder))] = (st.st_size, st.st_mtime)
    return out


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    """Each test starts from the environment the previous one started from. The CLI's options
    set process-wide variables (--no-cache sets FORENSICS_NO_CACHE, --no-stitch
    FORENSICS_NO_STITCH: right for a command's own process), and a test that invokes it in
    process would otherwise hand them to every later test on its worker, which then depends on
    which tests ran before it."""
    before = dict(os.environ)
    yield
    for k in set(os.environ) - set(before):
        del os.environ[k]
    for k, v in before.items():
        if os.environ.get(k) != v:
            os.environ[k] = v


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run cache of the test's own (FORENSICS_CACHE_DIR), on, under the default cap."""
    d = tmp_path / "cache"
    monkeypatch.setenv("FORENSICS_CACHE_DIR", str(d))
    monkeypatch.delenv("FORENSICS_NO_CACHE", raising=False)
    monkeypatch.delenv("FORENSICS_CACHE_MAX_MB", raising=False)
    return d


@pytest.fixture
def spike_run(tmp_path: Path) -> Path:
    return write_tb_run(tmp_path / "runs" / "exp42")


@pytest.fixture
def findings_schema() -> dict:
    return json.loads((ROOT / "forensics" / "schemas" / "findings.schema.json").read_text())
