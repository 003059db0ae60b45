"""``forensics export`` without typer (forensics.cli_quick): the plain argument forms run the
export before typer is imported, with the same file, stderr lines and exit codes as the typer
command; every other form is left to typer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import write_tb_run

from forensics.cli_quick import parse_export

TYPER = "import sys; sys.argv = ['forensics', *sys.argv[1:]]; from forensics.cli import app; app()"


def _run(args: list[str], *, quick: bool, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m forensics ARGS`` (quick) or the typer app alone on the same arguments."""
    head = ["-m", "forensics"] if quick else ["-c", TYPER]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORENSICS_")}
    return subprocess.run(
        [sys.executable, *head, *args], capture_output=True, text=True, env=env, cwd=cwd
    )


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["export", "a", "--to", "x.parquet"], ("a", "x.parquet", [], [])),
        (["export", "--to=x.parquet", "a"], ("a", "x.parquet", [], [])),
        (
            ["export", "a", "--alias", "r=loss", "--to", "x", "--alias=s=lr", "--no-cache"],
            ("a", "x", ["r=loss", "s=lr"], ["--no-cache"]),
        ),
        (
            ["export", "--no-stitch", "a", "--no-cache", "--to", "x"],
            ("a", "x", [], ["--no-stitch", "--no-cache"]),
        ),
    ],
)
def test_plain_forms_are_taken(args: list[str], want: tuple[object, ...]) -> None:
    assert parse_export(args) == want


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["analyze", "a"],
        ["--no-cache", "export", "a", "--to", "x"],
        ["export"],
        ["export", "--help"],
        ["export", "a", "--help", "--to", "x"],
        ["export", "-h", "a", "--to", "x"],
        ["export", "a"],
        ["export", "a", "--to"],
        ["export", "a", "b", "--to", "x"],
        ["export", "a", "--to", "x", "--to", "y"],
        ["export", "a", "--to", "-x"],
        ["export", "a", "--to="],
        ["export", "--", "a", "--to", "x"],
        ["export", "-", "--to", "x"],
        ["export", "", "--to", "x"],
        ["export", "a", "--to", "x", "--no-cache=1"],
        ["export", "a", "--to", "x", "--no-cache", "--no-cache"],
        ["export", "a", "--to", "x", "--alias"],
        ["export", "a", "--to", "x", "--bogus"],
        ["export", "a", "--t", "x"],
    ],
)
def test_other_forms_are_left_to_typer(args: list[str]) -> None:
    assert parse_export(args) is None


def test_aliases_keep_their_order_and_values() -> None:
    got = parse_export(["export", "--alias=a=b", "--to=x", "p", "--alias", "c=d", "--no-cache"])
    assert got == ("p", "x", ["a=b", "c=d"], ["--no-cache"])


def _cases(tmp: Path) -> dict[str, list[str]]:
    run = write_tb_run(tmp / "run", n=200)
    junk = tmp / "junk.log"
    junk.write_bytes(b"\x00\x01\x02 not a log\n" * 10)
    out = str(tmp / "out" / "x.parquet")
    return {
        "plain": ["export", str(run), "--to", out],
        "options": ["export", f"--to={out}", str(run), "--no-cache", "--alias", "a/b=loss"],
        "no-stitch": ["export", str(run), "--no-stitch", "--to", out],
        "inside-run": ["export", str(run), "--to", str(run / "x.parquet")],
        "missing": ["export", str(tmp / "nowhere"), "--to", out],
        "bad-alias": ["export", str(run), "--to", out, "--alias", "x=not_a_vital"],
        "bad-suffix": ["export", str(run), "--to", str(tmp / "x.txt")],
        "unknown-format": ["export", str(junk), "--to", out],
        "no-folder": ["export", str(run), "--to", str(tmp / "none" / "deeper" / "x.parquet")],
    }


@pytest.mark.parametrize(
    "case",
    [
        "plain",
        "options",
        "no-stitch",
        "inside-run",
        "missing",
        "bad-alias",
        "bad-suffix",
        "unknown-format",
        "no-folder",
    ],
)
def test_quick_export_equals_the_typer_command(tmp_path: Path, case: str) -> None:
    """Exit code, stdout, stderr and the written frame: the same either way."""
    (tmp_path / "out").mkdir()
    args = _cases(tmp_path)[case]
    parsed = parse_export(args)
    assert parsed is not None  # the quick path takes it
    out = Path(parsed[1])
    quick = _run(args, quick=True, cwd=tmp_path)
    written = pl.read_parquet(out) if out.exists() else None
    out.unlink(missing_ok=True)
    typed = _run(args, quick=False, cwd=tmp_path)
    assert (quick.returncode, quick.stdout, quick.stderr) == (
        typed.returncode,
        typed.stdout,
        typed.stderr,
    )
    assert quick.returncode in (0, 2), quick.stderr
    if quick.returncode == 0:
        assert written is not None and written.equals(pl.read_parquet(out))
        assert written.height > 0
    else:
        assert quick.stderr.count("\n") == 1 and quick.stderr.startswith("forensics: error")


def test_quick_export_imports_no_typer(tmp_path: Path) -> None:
    """``python -m forensics export ...`` in its plain form never imports typer, and still runs
    atexit handlers and flushes its streams (the quick exit)."""
    run = write_tb_run(tmp_path / "run", n=50)
    out = tmp_path / "x.parquet"
    code = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('typer' in sys.modules))\n"
        f"sys.argv = ['forensics', 'export', {str(run)!r}, '--to', {str(out)!r}]\n"
        "runpy.run_module('forensics', run_name='__main__', alter_sys=True)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"
    assert "rows written to" in res.stderr and out.is_file()


def test_console_script_takes_the_quick_path(tmp_path: Path) -> None:
    """The ``forensics`` console script is the entry ``python -m forensics`` runs: pointed at
    ``forensics.cli:main`` it imported typer (with forensics.cli) before a plain export."""
    import tomllib
    from importlib.metadata import entry_points

    root = Path(__file__).resolve().parents[1]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["forensics"] == "forensics.cli_quick:entry"
    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "forensics"]
    assert ep.value == "forensics.cli_quick:entry"  # (the installed one too)
    run = write_tb_run(tmp_path / "run", n=50)
    out = tmp_path / "x.parquet"
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('typer' in sys.modules))\n"
        f"sys.argv = ['forensics', 'export', {str(run)!r}, '--to', {str(out)!r}]\n"
        f"from importlib.metadata import entry_points\n"
        "(ep,) = [e for e in entry_points(group='console_scripts') if e.name == 'forensics']\n"
        "ep.load()()\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"
    assert "rows written to" in res.stderr and out.is_file()


def test_help_still_comes_from_typer(tmp_path: Path) -> None:
    res = _run(["export", "--help"], quick=True, cwd=tmp_path)
    assert res.returncode == 0 and "--to" in res.stdout
    res = _run(["export", str(tmp_path)], quick=True, cwd=tmp_path)
    assert res.returncode == 2 and "--to" in res.stderr


def test_export_says_its_row_count_with_digits_grouped(tmp_path: Path) -> None:
    """The export's one line writes the count as the rest of the output writes numbers."""
    import polars as pl

    from forensics.cli_quick import export_command

    run = write_tb_run(tmp_path / "run", n=400)
    out = tmp_path / "x.parquet"
    said: list[str] = []
    export_command(str(run), out, [], said.append)
    rows = pl.read_parquet(out).height
    assert rows >= 1000
    assert said == [f"{rows:,} rows written to {out}"]


def _blas_threads_after(argv: list[str], env: dict[str, str]) -> tuple[int, str | None, bool]:
    """In a fresh process with ``env``: the entry's numpy step for ``argv``, then numpy;
    the process's thread count, OPENBLAS_NUM_THREADS as left, and whether numpy was loaded."""
    code = (
        "import os, sys\n"
        "had = 'numpy' in sys.modules\n"
        "from forensics.cli_quick import _numpy_with_one_blas_thread as f\n"
        f"f({argv!r})\n"
        "loaded = 'numpy' in sys.modules\n"
        "import numpy\n"
        "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'),"
        " loaded and not had)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    n, var, loaded = res.stdout.split()
    return int(n), None if var == "None" else var, loaded == "True"


@pytest.mark.skipif(
    not Path("/proc/self/task").is_dir() or (os.cpu_count() or 1) < 2,
    reason="counts threads through /proc, on a machine with two processors or more",
)
def test_a_reading_command_loads_numpy_with_one_blas_thread() -> None:
    """A command that reads runs loads numpy with OpenBLAS on one thread (no thread pool
    started: 17% less CPU for a 100k-step export), and leaves no variable behind for what it
    starts; help loads no numpy, and a thread count the user set is theirs."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    many, _, _ = _blas_threads_after(["--help"], env)  # numpy's own default
    assert many > 1  # (OpenBLAS starts its pool: what the step avoids)
    for argv in (["export", "run", "--to", "x.parquet"], ["--no-cache", "analyze", "run"]):
        assert _blas_threads_after(argv, env) == (1, None, True)
    assert _blas_threads_after(["analyze", "--help"], env)[2] is False
    mine = {**env, "OPENBLAS_NUM_THREADS": "2"}
    # (numpy is still loaded by the step, for its huge pages, with the user's thread count)
    assert _blas_threads_after(["analyze", "run"], mine) == (2, "2", True)


def _hugepages_after(argv: list[str], env: dict[str, str]) -> tuple[str, str | None]:
    """In a fresh process with ``env``: the entry's numpy step for ``argv``, then numpy;
    whether numpy asks for huge pages, and NUMPY_MADVISE_HUGEPAGE as left."""
    code = (
        "import os\n"
        "from forensics.cli_quick import _numpy_with_one_blas_thread as f\n"
        f"f({argv!r})\n"
        "from numpy._core import multiarray\n"
        "print(multiarray._get_madvise_hugepage(), os.environ.get('NUMPY_MADVISE_HUGEPAGE'))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    asks, var = res.stdout.split()
    return asks, None if var == "None" else var


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="numpy's madvise is Linux's")
def test_a_reading_command_asks_for_no_huge_pages() -> None:
    """A command that reads runs loads numpy without its requests for transparent huge pages
    (their compaction cost 18% of a 1M-step analysis' system time), leaves no variable
    behind, and keeps a setting the user made."""
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    assert _hugepages_after(["--help"], env) == ("True", None)  # numpy's own default
    assert _hugepages_after(["analyze", "run"], env) == ("False", None)
    assert _hugepages_after(["export", "run", "--to", "x.parquet"], env) == ("False", None)
    mine = {**env, "NUMPY_MADVISE_HUGEPAGE": "1"}
    assert _hugepages_after(["analyze", "run"], mine) == ("True", "1")
