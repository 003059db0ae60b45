"""End to end: a real tiny torch training job writes its TensorBoard log in one process while
``python -m forensics watch`` watches it from another, as on a cluster.

The trainer is tests/watch_trainer.py (one CPU thread, full-batch gradient descent, each step
flushed). The hooks are real shell commands that append their ``FORENSICS_*`` environment
to a file the test reads. Each watcher's output goes to files (not a terminal: plain lines).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensorboardX")

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ROOT / "tests" / "watch_trainer.py"
TIMEOUT = 90.0  # seconds for any one wait; a loaded 2-core machine imports torch slowly


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["XDG_CACHE_HOME"] = str(tmp / "cache")  # the default state and run cache stay here
    env["FORENSICS_CACHE_DIR"] = str(tmp / "cache" / "runs")
    env.pop("FORENSICS_DEBUG", None)
    return env


class Proc:
    """A subprocess with its stdout and stderr in files."""

    def __init__(self, name: str, args: list[str], tmp: Path) -> None:
        self.out, self.err = tmp / f"{name}.out", tmp / f"{name}.err"
        with self.out.open("wb") as o, self.err.open("wb") as e:
            self.p = subprocess.Popen(args, stdout=o, stderr=e, env=_env(tmp), cwd=tmp)

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM, as a service manager stops a watcher; its exit code."""
        self.p.send_signal(signal.SIGTERM)
        return self.p.wait(timeout=TIMEOUT)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:  # a failed test leaves no process behind
        p.kill()


def _wait(cond: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _trainer(tmp: Path, run: Path, *args: str) -> Proc:
    return Proc("trainer", [sys.executable, str(TRAINER), str(run), *args], tmp)


def _watch(tmp: Path, name: str, run: Path, *args: str) -> Proc:
    cmd = [sys.executable, "-m", "forensics", "watch", str(run), "--interval", "0.3", *args]
    return Proc(name, cmd, tmp)


def _hook(log: Path) -> str:
    """A shell command that appends the FORENSICS_* environment to ``log`` as one JSON line."""
    code = (
        "import json, os; "
        f"open({str(log)!r}, 'a').write(json.dumps({{k: v for k, v in os.environ.items() "
        "if k.startswith('FORENSICS_')}) + '\\n')"
    )
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


def _calls(log: Path) -> list[dict[str, str]]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def _saw_step(proc: Proc, step: int) -> bool:
    """The watcher printed a status line for ``step`` (plain lines: not a terminal)."""
    return any(f" step {step:,}  " in line for line in proc.stdout().splitlines())


def _clean_exit(proc: Proc, code: int) -> None:
    assert code == 0, proc.stderr()
    assert "Traceback" not in proc.stderr() and "internal error" not in proc.stderr()


def test_a_nan_fires_the_fatal_hook_once_at_its_step_and_until_exits_1(
    tmp_path: Path, procs: list[Proc]
) -> None:
    run, hooks = tmp_path / "run", tmp_path / "fatal.jsonl"
    # Both watchers start before the job: no folder yet.
    a = _watch(tmp_path, "a", run, "--on-fatal", _hook(hooks), "--state", "a.json")
    b = _watch(tmp_path, "b", run, "--until", "fatal", "--quiet", "--state", "b.json")
    procs += [a, b]
    trainer = _trainer(tmp_path, run, "--steps", "60", "--nan-at", "40", "--delay", "0.05")
    procs.append(trainer)

    # --until fatal: the watcher exits by itself with the --fail-on code.
    assert b.p.wait(timeout=TIMEOUT) == 1, b.stderr()
    assert "waiting for a training log" in b.stderr()
    assert "the verdict reached fatal (--until fatal)" in b.stderr()
    assert "Traceback" not in b.stderr()
    quiet = b.stdout().splitlines()
    # Alerts only. A poll that catches fewer than persist_points (3) NaN lines sees a NaN not
    # yet known to persist: orange (critical) first, then red (escalated) once it does.
    fatal = re.compile(r" FATAL (new|escalated from critical) nan_inf \(loss\) at step 40:")
    assert quiet and all(re.search(r" (FATAL|CRITICAL) (new|escalated)", x) for x in quiet)
    assert sum(bool(fatal.search(line)) for line in quiet) == 1, quiet

    assert trainer.p.wait(timeout=TIMEOUT) == 0
    _wait(lambda: _saw_step(a, 60), "the watcher to see the last step")
    _clean_exit(a, a.stop())
    assert a.stderr().count("waiting for a training log") == 1

    calls = _calls(hooks)
    assert len(calls) == 1, calls
    call = calls[0]
    assert call["FORENSICS_SEVERITY"] == "fatal"
    assert call["FORENSICS_KIND"] == "nan_inf"
    assert call["FORENSICS_STEP"] == "40"
    # (one NaN at the last step read so far: "nan at step 40, the last step logged")
    assert re.search(r"nan (from|at) step 40\b", call["FORENSICS_SUMMARY"])
    report = Path(call["FORENSICS_REPORT"])
    assert report.is_file() and not report.is_relative_to(run)
    assert sorted(p.name for p in run.iterdir()) == [
        p.name for p in run.iterdir() if p.name.startswith("events.out.tfevents")
    ]
    # The watcher's lines: the healthy steps, the alert, then the NaN steps.
    lines = a.stdout().splitlines()
    assert any("  healthy  " in line for line in lines)
    assert sum(bool(fatal.search(line)) for line in lines) == 1, lines


def test_a_writer_that_sleeps_raises_a_stall_once_and_it_ends(
    tmp_path: Path, procs: list[Proc]
) -> None:
    run, hooks = tmp_path / "run", tmp_path / "warning.jsonl"
    trainer = _trainer(
        tmp_path, run, "--steps", "30", "--sleep-at", "15", "--sleep-for", "8", "--delay", "0.05"
    )
    w = _watch(tmp_path, "w", run, "--stall-after", "3s", "--on-warning", _hook(hooks))
    procs += [trainer, w]
    assert trainer.p.wait(timeout=TIMEOUT) == 0
    _wait(lambda: _saw_step(w, 30), "the watcher to see the last step")
    _clean_exit(w, w.stop())

    # The sleep at step 15: one stall, ended when the steps resumed. (Any other silence over
    # 3 s is a stall too: the job's own end after step 30, or a hiccup of a loaded machine.)
    lines = w.stdout().splitlines()
    stalls = [x for x in lines if " stall " in x and " 15" in x]
    assert len(stalls) == 2, lines
    assert " WARNING new stall at step 15: No new step for " in stalls[0]
    assert " ENDED stall steps 15-16: Steps resumed" in stalls[1]
    calls = [(c["FORENSICS_KIND"], c["FORENSICS_STEP"]) for c in _calls(hooks)]
    assert calls.count(("stall", "15")) == 1
    assert {kind for kind, _ in calls} == {"stall"}


def test_a_watcher_restarted_mid_run_with_its_state_repeats_no_alert(
    tmp_path: Path, procs: list[Proc]
) -> None:
    run, hooks, state = tmp_path / "run", tmp_path / "fatal.jsonl", tmp_path / "state.json"
    trainer = _trainer(tmp_path, run, "--steps", "100", "--nan-at", "20", "--delay", "0.1")
    args = ("--on-fatal", _hook(hooks), "--state", str(state))
    first = _watch(tmp_path, "first", run, *args)
    procs += [trainer, first]
    _wait(lambda: len(_calls(hooks)) == 1, "the fatal hook")
    # Both signs' NaN seen (a step's grad norm can reach the file a poll after its loss).
    # (FATAL new, or escalated from critical where a poll saw fewer than 3 NaN lines first)
    red = r" FATAL (new|escalated from critical) nan_inf \({}\)"
    _wait(lambda: bool(re.search(red.format("grad_norm"), first.stdout())), "the grad norm's NaN")
    _clean_exit(first, first.stop())  # killed mid-run
    assert trainer.p.poll() is None, "the job ended before the watcher was restarted"

    second = _watch(tmp_path, "second", run, *args)
    procs.append(second)
    assert trainer.p.wait(timeout=TIMEOUT) == 0
    _wait(lambda: _saw_step(second, 100), "the restarted watcher to see the last step")
    _clean_exit(second, second.stop())

    assert len(_calls(hooks)) == 1
    assert [x for x in second.stdout().splitlines() if " new " in x or "ENDED" in x] == []
    assert re.search(red.format("loss") + " at step 20:", first.stdout())
    assert "  fatal  " in second.stdout()  # it did judge the run: fatal, already alerted
    assert json.loads(state.read_text())["alerts"]
