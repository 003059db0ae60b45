"""Issue 18, one-line errors: absurd input gives rows plus counted skips, or one line on
stderr with exit 2; never "internal error", a traceback, a boxed usage message or a warning."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from typer.testing import CliRunner

from forensics.cli import app

runner = CliRunner()


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(cwd / "cache")}
    env.pop("FORENSICS_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "forensics", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def _ours(stderr: str) -> list[str]:
    """stderr's lines, each checked to be the project's own."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert all(ln.startswith("forensics: ") for ln in lines), stderr
    assert not any("internal error" in ln for ln in lines), stderr
    return lines


def _jsonl(n: int = 60, extra: tuple[str, ...] = ()) -> str:
    rows = [json.dumps({"step": i, "loss": 3 - i / 100}) for i in range(n)]
    return "\n".join([*rows, *extra]) + "\n"


def _state(extra_entry: dict | None = None, tail: str = "") -> str:
    hist = [{"step": i, "loss": 2 - i / 100} for i in range(1, 41)]
    text = json.dumps({"global_step": 40, "log_history": hist + ([extra_entry] or [])})
    return text[:-1] + tail + "}" if tail else text


def _nanogpt(extra: str = "") -> str:
    rows = "".join(
        f"iter {i}: loss {3 - i / 100:.4f}, time 10.00ms, mfu 1.00%\n" for i in range(60)
    )
    return rows + extra


CASES = {
    "surrogate-key": ("m.jsonl", _jsonl(extra=('{"\\ud800": 1.0, "step": 99}',))),
    "step-2^63": ("trainer_state.json", _state({"step": 2**63, "loss": 1.0})),
    "400-digit-int": (
        "trainer_state.json",
        _state({"step": int("9" * 400), "loss": int("9" * 400)}, tail=', "x": ' + "7" * 400),
    ),
    "nanogpt-iter-2^63": ("train.log", _nanogpt(f"iter {2**63}: loss 1.0, time 1ms, mfu 1%\n")),
    "jsonl-step-minus-2^63": (
        "m.jsonl",
        _jsonl(extra=(json.dumps({"step": -(2**63), "loss": 1}),)),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_absurd_values_are_read_or_skipped_not_internal_errors(tmp_path: Path, case: str) -> None:
    """Values no trainer writes: the run is read (the absurd entry skipped), stderr stays ours."""
    name, text = CASES[case]
    run = tmp_path / "run"
    run.mkdir()
    (run / name).write_text(text)
    res = runner.invoke(app, ["analyze", str(run), "--no-report", "--format", "json"])
    assert res.exit_code == 0, res.output
    _ours(res.stderr)


def test_deep_nesting_is_one_line(tmp_path: Path) -> None:
    """A trainer_state.json nested 50,000 deep cannot be parsed: one line, exit 2."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer_state.json").write_text(
        '{"global_step": 3, "log_history": [{"step": 1, "loss": 1.0}], "x": '
        + "[" * 50000
        + "]" * 50000
        + "}"
    )
    res = runner.invoke(app, ["analyze", str(run), "--no-report"])
    assert res.exit_code == 2
    assert len(_ours(res.stderr)) == 1


def test_a_path_component_over_255_characters_is_one_line(tmp_path: Path) -> None:
    """ENAMETOOLONG names the path in one line."""
    res = runner.invoke(app, ["analyze", str(tmp_path / ("a" * 300)), "--no-report"])
    assert res.exit_code == 2
    (line,) = _ours(res.stderr)
    assert "too long" in line


@pytest.mark.parametrize(
    "args",
    [["analyze"], ["analyze", ".", "--bogus"], ["analyze", ".", "--format", "xml"], ["nope"]],
)
def test_usage_errors_are_one_line(tmp_path: Path, args: list[str]) -> None:
    """typer's boxed usage errors become one line with exit 2."""
    res = _cli(*args, cwd=tmp_path)
    assert res.returncode == 2
    (line,) = _ours(res.stderr)
    assert "--help" in line or "No such command" in line


def _bits(u: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", u))[0]


def test_numpy_warnings_stay_off_stderr(tmp_path: Path) -> None:
    """Signalling-NaN bit patterns, doubles near 1e308 and a step of -2^63: stderr holds only
    the project's lines (a real subprocess, where warnings print)."""
    run = tmp_path / "run"
    run.mkdir()
    rows = []
    for i in range(300):
        v = (1.7e308 if i % 2 else -1.7e308) if i % 7 else _bits(0x7FF0000000000001)
        rows.append(json.dumps({"step": i, "loss": v, "grad_norm": 1e308 * (i % 3)}))
    rows.append(json.dumps({"step": -(2**63), "loss": 1.0}))
    (run / "m.jsonl").write_text("\n".join(rows) + "\n")
    res = _cli("analyze", str(run), "-o", str(tmp_path / "r.html"), cwd=tmp_path)
    assert res.returncode in (0, 1), res.stderr
    _ours(res.stderr)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file: no permission error")
def test_an_unreadable_log_says_permission_denied(tmp_path: Path) -> None:
    """A chmod-000 log in a folder: "permission denied", not "no training log recognised"."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text(_nanogpt())
    (run / "train.log").chmod(0)
    res = runner.invoke(app, ["analyze", str(run), "--no-report"])
    assert res.exit_code == 2
    (line,) = _ours(res.stderr)
    assert "permission denied" in line.lower()


def test_a_log_with_no_vital_sign_is_an_error_not_a_green_light(tmp_path: Path) -> None:
    """A JSONL whose keys forensics does not know (``foo``, ``acc_top1``) read "HEALTHY (green
    light)" with "the light covers only what was logged." and nothing logged: no check had
    run. It is now one line on stderr and exit 2, naming the series and how to map them; the
    same with --alias passes. With --all, such a job is a reported skip and the others run."""
    run = tmp_path / "run"
    run.mkdir()
    rows = [json.dumps({"step": i, "foo": 3 - i / 100, "acc_top1": i / 100}) for i in range(60)]
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    res = _cli("analyze", str(run), "--no-report", cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    (line,) = _ours(res.stderr)
    assert "no vital sign recognised among its 2 series (acc_top1, foo)" in line, line
    assert f"forensics metrics {run}" in line, line
    assert "HEALTHY" not in res.stdout
    # The library still returns the diagnosis (a notebook shows it), saying it judged nothing.
    import forensics

    blind = forensics.analyze(run).unjudged()
    assert blind is not None and blind.startswith("The light judges nothing: no vital sign"), blind
    ok = _cli("analyze", str(run), "--no-report", "--alias", "foo=loss", cwd=tmp_path)
    assert ok.returncode == 0 and "HEALTHY" in ok.stdout, ok.stderr
    # compare put it beside another run as "HEALTHY" too.
    good = tmp_path / "good"
    good.mkdir()
    (good / "metrics.jsonl").write_text(_jsonl())
    res = _cli("compare", str(good), str(run), "--no-report", cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    (line,) = _ours(res.stderr)
    assert "no vital sign recognised among its 2 series" in line, line
    # Two jobs, one of them blind: the other is analyzed, the blind one skipped and said.
    both = tmp_path / "both"
    (both / "a").mkdir(parents=True)
    (both / "b").mkdir()
    (both / "a" / "metrics.jsonl").write_text(_jsonl())
    (both / "b" / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    res = _cli("analyze", str(both), "--all", "--no-report", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("steps 0-59  HEALTHY") == 1, res.stdout
    skipped = [ln for ln in _ours(res.stderr) if "skipped" in ln]
    assert len(skipped) == 1, res.stderr
    assert "b/metrics.jsonl: skipped: no vital sign recognised" in skipped[0], res.stderr
    assert f"forensics metrics {both}/b/metrics.jsonl" in skipped[0], res.stderr
