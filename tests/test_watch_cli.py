"""The ``watch`` command's options: durations, the state file's place, Prometheus, the panel.

The command runs in a subprocess (``python -m forensics watch``) where it must stop by itself
(``--until``) or on a signal; on a finished sample run ``--until critical`` stops it after the
first poll, which is enough to see what it wrote.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forensics.pipeline import analyze_run, read_run
from forensics.watch.alerts import AlertBook
from forensics.watch.engine import Status
from forensics.watch.options import parse_duration, state_name
from forensics.watch.panel import LivePanel

ROOT = Path(__file__).resolve().parents[1]
NAN = ROOT / "sample_runs" / "nan"


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["XDG_CACHE_HOME"] = str(tmp / "cache")
    env["FORENSICS_CACHE_DIR"] = str(tmp / "cache" / "runs")
    return env


def _watch(tmp: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "forensics", "watch", *args],
        capture_output=True,
        text=True,
        env=_env(tmp),
        cwd=tmp,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("0.5", 0.5), ("250ms", 0.25), ("2min", 120)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5q", "-1s", "0", "nan", "1e999", "s"])
def test_a_bad_duration_is_one_line_and_exit_2(tmp_path: Path, text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)
    res = _watch(tmp_path, str(NAN), "--interval", text)
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "not a duration" in res.stderr
    assert "Traceback" not in res.stderr


def test_until_on_a_finished_run_and_the_default_state_in_the_cache(tmp_path: Path) -> None:
    run = tmp_path / "nan"
    shutil.copytree(NAN, run)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    prom = tmp_path / "vitals.prom"
    res = _watch(tmp_path, str(run), "--until", "critical", "--quiet", "--prometheus", str(prom))
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert all(
        line.split(" ", 3)[2] in {"FATAL", "WARNING", "CRITICAL"}
        for line in res.stdout.splitlines()
    )
    assert "FATAL new nan_inf (loss) at step 637:" in res.stdout
    # Nothing written into the run; the state in the user cache folder, keyed by the run path.
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    state = tmp_path / "cache" / "forensics" / "watch" / state_name(run)
    assert AlertBook.load(state).tracked
    assert (tmp_path / "reports" / "nan.html").is_file()
    text = prom.read_text()
    assert "nan_inf" in text or "loss" in text
    # Again with the same state: nothing repeated, and still the --until exit.
    res = _watch(tmp_path, str(run), "--until", "fatal", "--quiet")
    assert res.returncode == 1 and res.stdout == ""


def test_outputs_inside_the_run_are_refused(tmp_path: Path) -> None:
    run = tmp_path / "nan"
    shutil.copytree(NAN, run)
    for opt, name in (("--state", "s.json"), ("--prometheus", "v.prom"), ("--out", "r.html")):
        res = _watch(tmp_path, str(run), "--until", "fatal", opt, str(run / name))
        assert res.returncode == 2, (opt, res.stderr)
        assert "refusing to write inside the run folder" in res.stderr
        assert not (run / name).exists()


def test_a_run_folder_that_does_not_exist_yet_is_waited_for_and_sigterm_exits_0(
    tmp_path: Path,
) -> None:
    err_file = tmp_path / "err.txt"
    with err_file.open("w") as err_fh:
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "forensics",
                "watch",
                str(tmp_path / "later"),
                "--interval",
                "0.2",
            ],
            stdout=subprocess.PIPE,
            stderr=err_fh,
            text=True,
            env=_env(tmp_path),
            cwd=tmp_path,
        )
        end = time.monotonic() + 60
        while "waiting" not in err_file.read_text() and time.monotonic() < end:
            time.sleep(0.1)
        time.sleep(1.0)  # a few more polls: said once
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
    err = err_file.read_text()
    assert p.returncode == 0, err
    assert err.count("waiting for a training log") == 1 and "Traceback" not in err
    assert out == ""
    assert not (tmp_path / "later").exists()


def test_the_live_panel_shows_each_vital_sign_with_its_light() -> None:
    from rich.console import Console

    run = read_run(NAN)
    diag = analyze_run(run)
    buf = io.StringIO()
    panel = LivePanel("nan", Console(file=buf, force_terminal=True, color_system=None, width=120))
    alerts = AlertBook().update(diag.findings, last_step=run.last_step)
    for a in alerts:
        panel.alert(a)
    panel.show(Status(run=run, diagnosis=diag, last_alert=alerts[0], polls=1))
    panel.close()
    text = buf.getvalue()
    assert "FATAL (red light)" in text
    for sign in ("loss", "grad_norm", "lr", "param_norm", "throughput"):
        assert f" {sign} " in text
    assert "red" in text and "yellow" in text and "green" in text
    assert "nan at step 1,000" in text  # the loss's last value
    assert "last alert:" in text


def test_a_folder_of_several_jobs_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for job in ("a", "b"):
        shutil.copytree(NAN, tmp_path / "jobs" / job)
    res = _watch(tmp_path, str(tmp_path / "jobs"), "--interval", "0.2")
    assert res.returncode == 2
    assert res.stderr.strip().endswith(
        "holds 2 separate training jobs (a, b); point watch at one of them"
    )
    assert len(res.stderr.strip().splitlines()) == 1


def test_panel_values_carry_the_units_their_names_state() -> None:
    from forensics.pipeline import read_run
    from forensics.watch.panel import vitals

    run = read_run(Path(__file__).parent.parent / "sample_runs" / "nan")
    shown = {sign: value for sign, _, value in vitals(run, None)}
    assert shown["memory"].split(" at step")[0].endswith(" MB")
    assert shown["throughput"].split(" at step")[0].endswith(" tokens/s")
    assert not shown["loss"].split(" at step")[0].endswith(("MB", "s"))


def test_a_run_with_no_vital_sign_is_not_shown_healthy(tmp_path: Path) -> None:
    """Watching a JSONL whose keys forensics does not know printed "step 59  healthy" on every
    poll (no check had run). The line and the live panel say no vital sign is recognised yet,
    name the series and the --alias option."""
    import json

    from rich.console import Console

    from forensics.watch.panel import status_line

    (tmp_path / "metrics.jsonl").write_text(
        "\n".join(json.dumps({"step": i, "foo": 3 - i / 100}) for i in range(60)) + "\n"
    )
    run = read_run(tmp_path)
    status = Status(run=run, diagnosis=analyze_run(run), polls=1)
    line = status_line(status)
    assert "healthy" not in line, line
    assert line.startswith("step 59  no vital sign recognised yet (foo)"), line
    assert "--alias RAW=CANONICAL" in line, line
    buf = io.StringIO()
    panel = LivePanel("run", Console(file=buf, force_terminal=True, color_system=None, width=160))
    panel.show(status)
    panel.close()
    text = buf.getvalue()
    assert "HEALTHY" not in text and "NO VITAL SIGN" in text, text


def test_the_live_panel_says_what_the_light_does_not_cover(tmp_path: Path) -> None:
    """A grad norm logged after clipping (pinned at 1.0 for the second half): the live panel
    under its green light says a climb above the clip cannot show, as `analyze` does."""
    import json

    import numpy as np
    from rich.console import Console

    rng = np.random.default_rng(0)
    lines = []
    for s in range(1, 2001):
        gn = min(1.0, 0.5 + max(0, s - 800) / 400) * (1 + 0.05 * rng.standard_normal())
        lines.append(
            json.dumps({"step": s, "loss": 2 + 3 / (1 + s / 300), "grad_norm": min(gn, 1.0)})
        )
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    run = read_run(tmp_path)
    diag = analyze_run(run)
    buf = io.StringIO()
    panel = LivePanel("run", Console(file=buf, force_terminal=True, color_system=None, width=400))
    panel.show(Status(run=run, diagnosis=diag, polls=1))
    panel.close()
    text = buf.getvalue()
    assert "HEALTHY (green light)" in text
    assert "The grad norm looks clipped: it is exactly 1, its highest value" in text, text
