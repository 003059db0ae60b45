"""What a CLI command costs besides its work: start-up and exit (issue 17, export vs tbparse).

* typer >= 0.22 converts every parameter through a pydantic TypeAdapter; the CLI converts plain
  bool / str / list[str] / Path parameters itself so that a command does not import pydantic.
  Every such parameter of every command must get exactly the value typer's adapter gives.
* ``export`` exits without the interpreter's teardown once its file is written: the file, the
  stderr line, the exit code and atexit handlers must be those of a normal exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from enum import Enum
from pathlib import Path

import polars as pl
import pytest
from conftest import ROOT, write_tb_run

from forensics.cli import _plain_coercion, app

coercion = pytest.importorskip("typer._coercion")  # older typer: click converts, nothing to test
build_runtime_param = coercion.build_runtime_param

VALUES = {
    bool: [True, False],
    str: ["run", "", "a b/c", "caf\u00e9", "bad\udcffbyte", "-"],
    Path: ["x.parquet", "", ".", "..", "/", "dir/", "bad\udcffbyte"],
}


def _commands():  # noqa: ANN202
    import typer.main
    from typer._click import Context

    group = typer.main.get_command(app)
    ctx = Context(group)
    yield group, ctx
    for name in group.list_commands(ctx):
        yield group.get_command(ctx, name), ctx


INTS = ["0", "1", "500", "007", "-3", "+4", " 5", "5 ", "1_000", "1e3", "2.0", "", "x", 3, 0]
INTS += ["9" * 18, "9" * 19, "9" * 30, True]


def _samples(annotation: object, tmp: Path) -> list[object]:
    if annotation == list[str]:
        return [[], (), ("a",), ["a=b", "c"], ("x", "bad\udcff")]
    if annotation is int:
        return INTS
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        values = [m.value for m in annotation]
        return [*annotation, *values, *(v.upper() for v in values), "", "nope", " text"]
    extra = [str(tmp), str(tmp / "f.txt")] if annotation is Path else []
    return [*VALUES[annotation], *extra]  # type: ignore[index]


def test_plain_conversion_equals_typer(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("x")
    seen = set()
    for command, ctx in _commands():
        _plain_coercion(command, ctx)
        for param in command.get_params(ctx):
            plain = getattr(param, "_runtime_param", None)
            if plain is None or type(plain).__name__ != "Plain":
                continue
            typer_own = build_runtime_param(param.type_descriptor)
            for value in _samples(param.type_descriptor.annotation, tmp_path):
                want = _outcome(typer_own, value, param, ctx)
                got = _outcome(plain, value, param, ctx)
                assert got == want and type(got) is type(want), (param.name, value)
            a = param.type_descriptor.annotation
            seen.add("list[str]" if a == list[str] else "Enum" if issubclass(a, Enum) else a)
    # every kind is exercised somewhere
    assert seen == {bool, str, Path, int, "Enum", "list[str]"}


def _outcome(runtime: object, value: object, param: object, ctx: object) -> object:
    """The converted value, or the error typer shows for it (type and message)."""
    try:
        return runtime.coerce(value, param=param, ctx=ctx)  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - compared, not handled
        return (type(exc).__name__, str(exc))


def _export_after(run: Path, out: Path, prelude: str) -> subprocess.CompletedProcess[str]:
    """``forensics.cli.main()`` exporting ``run`` in a fresh interpreter after ``prelude``
    (with ``atexit`` and ``sys`` imported)."""
    code = (
        "import atexit, sys\n"
        + prelude
        + f"sys.argv = ['forensics', 'export', {str(run)!r}, '--to', {str(out)!r}, '--no-cache']\n"
        "from forensics.cli import main\n"
        "main()\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ)
    )


def test_export_imports_no_pydantic(tmp_path: Path) -> None:
    """A whole ``forensics export`` (subprocess) never imports pydantic."""
    run = write_tb_run(tmp_path / "run")
    out = tmp_path / "x.parquet"
    res = _export_after(run, out, "atexit.register(lambda: print('pydantic' in sys.modules))\n")
    assert res.returncode == 0, res.stderr
    assert out.is_file()
    assert res.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize("options", [["--no-report"], ["--no-report", "--format", "json"]])
def test_analyze_imports_no_pydantic(tmp_path: Path, options: list[str]) -> None:
    """A whole ``forensics analyze`` (subprocess) converts its options (choices, a number)
    without pydantic too."""
    run = write_tb_run(tmp_path / "run")
    argv = ["forensics", "analyze", str(run), *options, "--checkpoint-every", "100"]
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('pydantic loaded:', 'pydantic' in sys.modules))\n"
        f"sys.argv = {argv!r}\n"
        "from forensics.cli import main\n"
        "main()\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ)
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "pydantic loaded: False"


def test_export_imports_no_detector_parameters(tmp_path: Path) -> None:
    """Without a configuration file, ``forensics export`` never imports forensics.params (the
    detectors' ~20 frozen dataclasses) nor a detector: nothing on its path reads them."""
    run = write_tb_run(tmp_path / "run")
    out = tmp_path / "x.parquet"
    names = ("forensics.params", "forensics.detectors", "forensics.evidence")
    prelude = (
        f"import os; os.chdir({str(tmp_path)!r})\n"  # no pyproject.toml / forensics.toml here
        f"atexit.register(lambda: print([m for m in {names!r} if m in sys.modules]))\n"
    )
    res = _export_after(run, out, prelude)
    assert res.returncode == 0, res.stderr
    assert out.is_file()
    assert res.stdout.strip().splitlines()[-1] == "[]"


def test_config_file_still_checks_detector_parameters(tmp_path: Path) -> None:
    """The lazy import does not skip the check: a bad detector parameter in the configuration
    file is still an error when the file loads."""
    from forensics.config import load
    from forensics.errors import ConfigError

    (tmp_path / "forensics.toml").write_text("[detectors.spikes]\nwindow = 'x'\n")
    with pytest.raises(ConfigError, match="window"):
        load(tmp_path)
    (tmp_path / "forensics.toml").write_text("[detectors.spikes]\nwindow = 30\n")
    assert load(tmp_path).params.spikes.window == 30


def test_export_quick_exit_keeps_output_streams_and_atexit(tmp_path: Path) -> None:
    """A real ``forensics.cli.main()`` export in a subprocess: exit code 0, the stderr line and
    a buffered stdout line arrive, an atexit handler runs, the Parquet file holds the frame."""
    run = write_tb_run(tmp_path / "run")
    out = tmp_path / "x.parquet"
    mark = tmp_path / "atexit.txt"
    prelude = (
        f"atexit.register(lambda: open({str(mark)!r}, 'w').write('ran'))\n"
        "sys.stdout.write('buffered line')\n"
    )
    res = _export_after(run, out, prelude)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "buffered line"
    assert res.stderr.startswith("forensics: ") and "rows written to" in res.stderr
    assert mark.read_text() == "ran"
    from forensics.importers import ReadOptions, read_run

    # (export writes the rows as read; the analysis' read hands them over tag after tag)
    frame = read_run(run, options=ReadOptions(cache=False, series_order=False)).frame
    got = pl.read_parquet(out)
    assert got.drop("run").equals(frame) and got.height == frame.height > 0


def test_export_error_exits_normally_with_code_2(tmp_path: Path) -> None:
    """A failed export (output inside the run folder) is the usual one-line error, exit 2."""
    run = write_tb_run(tmp_path / "run")
    res = subprocess.run(
        [sys.executable, "-m", "forensics", "export", str(run), "--to", str(run / "x.parquet")],
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "inside the run folder" in res.stderr
    assert not (run / "x.parquet").exists()


def _main_with(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[object, str, str]:
    """``forensics.cli.main()`` with ``argv``: (exit code, stdout, stderr)."""
    import forensics.cli as cli

    old = sys.argv
    sys.argv = ["forensics", *argv]
    cli._QUICK_EXIT = False  # an export run earlier in this process (CliRunner) left it set
    try:
        cli.main()
        code: object = None
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.argv = old
    out, err = capsys.readouterr()
    return code, out, err


def _command_names() -> list[str]:
    import typer.main

    group = typer.main.get_command(app)
    return sorted(group.list_commands(None))  # type: ignore[attr-defined,arg-type]


@pytest.mark.parametrize(
    "tail",
    [["--help"], ["--bogus-option"], [], ["a", "b", "c", "d", "--to"]],
    ids=["help", "unknown-option", "missing-argument", "extra-arguments"],
)
def test_only_the_named_command_is_built_and_nothing_changes(
    tail: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each command's help and usage errors (output, exit code) are those of the whole group,
    and the commands typer builds for it are that command alone; the app keeps them all."""
    import contextlib

    import typer.main

    import forensics.cli as cli

    names = _command_names()
    assert len(names) >= 6
    built: list[str] = []
    real = typer.main.get_command_from_info

    def counting(*a, **k):  # noqa: ANN002, ANN003, ANN202
        cmd = real(*a, **k)
        built.append(cmd.name)
        return cmd

    before = list(app.registered_commands)
    for name in names:
        built.clear()
        monkeypatch.setattr(typer.main, "get_command_from_info", counting)
        got = _main_with([name, *tail], capsys)
        assert built == [name]
        assert app.registered_commands == before
        monkeypatch.setattr(cli, "_only_command", lambda _name: contextlib.nullcontext())
        want = _main_with([name, *tail], capsys)
        monkeypatch.undo()
        assert got == want, name
        assert got[0] in (0, 2), (name, got)


def test_group_level_arguments_get_the_whole_group(capsys: pytest.CaptureFixture[str]) -> None:
    """No command named first (the group's help, an unknown command): every command is there
    (listed, suggested)."""
    code, out, _ = _main_with(["--help"], capsys)
    assert code == 0
    assert all(name in out for name in _command_names())
    code, _, err = _main_with(["exprt"], capsys)
    assert code == 2 and "export" in err


def test_the_command_line_asks_polars_to_return_freed_memory_at_once() -> None:
    """main() sets jemalloc's decay options before polars loads for the commands that detect
    (a lower peak for the same CPU), not for export or metrics; a value the user set wins,
    and a process that already loaded polars is left alone."""
    code = (
        "import os, sys\n"
        "from forensics import cli\n"
        "cli._return_freed_memory(sys.argv[1])\n"
        "print(os.environ.get('_RJEM_MALLOC_CONF'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    run = lambda c, e, cmd="analyze": subprocess.run(  # noqa: E731
        [sys.executable, "-c", c, cmd], env=e, capture_output=True, text=True, check=True
    ).stdout.strip()
    for cmd in ("analyze", "compare", "sweep", "watch"):
        assert run(code, env, cmd) == "dirty_decay_ms:0,muzzy_decay_ms:0", cmd
    for cmd in ("export", "metrics", "--help"):  # they detect nothing: the pages stay cached
        assert run(code, env, cmd) == "None", cmd
    assert run(code, {**env, "_RJEM_MALLOC_CONF": "narenas:1"}) == "narenas:1"
    # polars sets its own defaults when it loads (500 ms / 1 s): they stay as they are.
    assert run("import polars\n" + code, env) == "dirty_decay_ms:500,muzzy_decay_ms:1000"


def test_the_detecting_commands_limit_glibc_to_two_arenas() -> None:
    """main() limits glibc's malloc arenas to two for the commands that detect (their work
    split between two threads faulted fewer pages in), not for the others; a
    MALLOC_ARENA_MAX the user set is left to glibc."""
    code = (
        "import sys\n"
        "from forensics import allocator, cli\n"
        "asked = []\n"
        "allocator.limit_arenas = lambda n: asked.append(n) or True\n"
        "cli._fewer_arenas(sys.argv[1])\n"
        "print(asked)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    run = lambda cmd, e=env: subprocess.run(  # noqa: E731
        [sys.executable, "-c", code, cmd], env=e, capture_output=True, text=True, check=True
    ).stdout.strip()
    for cmd in ("analyze", "compare", "sweep", "watch"):
        assert run(cmd) == "[2]", cmd
    for cmd in ("export", "metrics", "--help"):
        assert run(cmd) == "[]", cmd
    assert run("analyze", {**env, "MALLOC_ARENA_MAX": "4"}) == "[]"


def test_the_detecting_commands_collect_cycles_less_often() -> None:
    """analyze, compare, sweep and watch raise the cyclic collector's first threshold (a long
    run's thousands of findings set it off about 500 times); other commands keep Python's."""

    code = (
        "import gc, sys\n"
        "from forensics import cli\n"
        "cli._collect_less(sys.argv[1])\n"
        "print(gc.get_threshold()[0])\n"
    )
    run = lambda cmd: subprocess.run(  # noqa: E731
        [sys.executable, "-c", code, cmd], capture_output=True, text=True, check=True
    ).stdout.strip()
    for cmd in ("analyze", "compare", "sweep", "watch"):
        assert run(cmd) == "50000", cmd
    default = subprocess.run(
        [sys.executable, "-c", "import gc; print(gc.get_threshold()[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert default != "50000"
    for cmd in ("export", "metrics", "--help"):
        assert run(cmd) == default, cmd


def test_analyze_quick_exit_keeps_its_outputs_exit_code_and_atexit(tmp_path: Path) -> None:
    """``analyze`` too leaves without the teardown once its outputs are written: the whole
    findings document on stdout, the report and the --json file on disk, the --fail-on exit
    code, and an atexit handler run."""
    import json

    run = ROOT / "sample_runs" / "bad_batch"
    mark = tmp_path / "atexit.txt"
    page, doc = tmp_path / "r.html", tmp_path / "f.json"
    argv = ["forensics", "analyze", str(run), "--format", "json", "--fail-on", "warning"]
    argv += ["--out", str(page), "--json", str(doc), "--no-cache"]
    code = (
        "import atexit, sys\n"
        f"atexit.register(lambda: open({str(mark)!r}, 'w').write('ran'))\n"
        f"sys.argv = {argv!r}\n"
        "from forensics.cli import main\n"
        "main()\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ)
    )
    assert res.returncode == 1, res.stderr  # a warning verdict at --fail-on warning
    printed = json.loads(res.stdout)
    # (5: its two absorbed grad-norm outliers are one note)
    assert printed["verdict"] == "warning" and len(printed["findings"]) == 5
    assert json.loads(doc.read_text()) == printed
    assert page.read_text().rstrip().endswith("</html>")
    assert mark.read_text() == "ran"
