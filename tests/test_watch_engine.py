"""The watcher's engine driven in-process, poll by poll, on logs a real writer appends to.

The TensorBoard files are written by tensorboardX (with explicit wall times, so the usual pace
between steps is known); the JSONL file is appended line by line as JSONL loggers do. The
engine's clock is a counter the test moves, so a stall of minutes takes no time.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest

from forensics.config import Config
from forensics.findings import Severity
from forensics.watch.alerts import AlertBook, Event
from forensics.watch.engine import Watcher, WatchSettings
from forensics.watch.panel import LinePanel

tensorboardX = pytest.importorskip("tensorboardX")

T0 = 1_790_000_000.0  # wall time of step 1 (seconds): one logged step a second


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Writer:
    """A real tensorboardX writer logging loss, grad norm and lr at one step a second."""

    def __init__(self, folder: Path) -> None:
        self.w = tensorboardX.SummaryWriter(str(folder), flush_secs=1)
        self.rng = np.random.default_rng(0)
        self.step = 0

    def steps(self, n: int, *, nan: bool = False) -> None:
        for _ in range(n):
            self.step += 1
            s = self.step
            wall = T0 + s
            noise = 1.0 + 0.01 * self.rng.standard_normal()
            loss = math.nan if nan else (0.5 + 2.0 * math.exp(-s / 200)) * noise
            gn = math.nan if nan else 1.0 * noise
            self.w.add_scalar("train/loss", loss, s, walltime=wall)
            self.w.add_scalar("train/grad_norm", gn, s, walltime=wall)
            self.w.add_scalar("train/lr", 1e-3, s, walltime=wall)
        self.w.flush()

    def close(self) -> None:
        self.w.close()


class Recorder(LinePanel):
    """The plain-lines panel, keeping what it was given."""

    def __init__(self) -> None:
        super().__init__(quiet=True)
        self.alerts: list = []
        self.said: list[str] = []
        self.results: list = []

    def alert(self, alert) -> None:  # noqa: ANN001
        self.alerts.append(alert)
        super().alert(alert)

    def say(self, text: str) -> None:
        self.said.append(text)

    def action(self, result) -> None:  # noqa: ANN001
        self.results.append(result)


def _hook(log: Path) -> str:
    """A hook command appending its FORENSICS_* environment and stdin's kind to ``log``."""
    code = (
        "import json, os, sys; d = json.load(sys.stdin); "
        f"open({str(log)!r}, 'a').write(json.dumps({{'env': {{k: v for k, v in os.environ.items()"
        " if k.startswith('FORENSICS_')}, 'stdin_kind': d['kind']}) + '\\n')"
    )
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


def settle(w: Watcher, writer: Writer) -> None:
    """Poll until the watcher sees the writer's last step: tensorboardX writes from a
    background thread, so a flushed step reaches the file a moment later (as in a real job)."""
    import time

    for _ in range(200):
        w.poll()
        if w.status.run is not None and w.status.run.last_step == writer.step:
            return
        time.sleep(0.05)
    raise AssertionError(f"step {writer.step} never reached the file")


def _lines(log: Path) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def _watcher(run: Path, tmp: Path, clock: Clock, **kw) -> tuple[Watcher, Recorder]:  # noqa: ANN003
    panel = Recorder()
    config = kw.pop("config", None)
    settings = WatchSettings(interval=0.01, **kw)
    w = Watcher(
        run,
        config=config,
        settings=settings,
        state_path=tmp / "state.json",
        report_place=lambda r: tmp / "reports" / f"{r.name}.html",
        panel=panel,
        clock=clock,
    )
    return w, panel


def test_waits_for_the_run_then_alerts_a_nan_once_and_acts(tmp_path: Path) -> None:
    run, clock, hooklog = tmp_path / "run", Clock(), tmp_path / "hook.jsonl"
    w, panel = _watcher(
        run,
        tmp_path,
        clock,
        hooks={Severity.FATAL: _hook(hooklog), Severity.WARNING: _hook(tmp_path / "warn.jsonl")},
    )
    # No folder yet, then a folder with no log: waited for, said once.
    for _ in range(3):
        assert w.poll() is None
    run.mkdir()
    assert w.poll() is None
    assert len(panel.said) == 1 and "waiting for a training log" in panel.said[0]

    writer = Writer(run)
    writer.steps(80)
    settle(w, writer)
    assert panel.alerts == []  # a healthy run: nothing to say
    assert w.status.run is not None and w.status.run.last_step == 80
    assert not (tmp_path / "reports").exists()  # the report is written on an alert

    writer.steps(5, nan=True)
    settle(w, writer)
    nan_alerts = [a for a in panel.alerts if a.finding.kind.value == "nan_inf"]
    assert {(a.finding.metric, a.event, a.finding.start_step) for a in nan_alerts} == {
        ("loss", Event.NEW, 81),
        ("grad_norm", Event.NEW, 81),
    }
    assert all(a.severity is Severity.FATAL for a in nan_alerts)
    # One fatal hook for the poll, with the finding in its environment and on stdin.
    calls = _lines(hooklog)
    assert len(calls) == 1
    env = calls[0]["env"]
    assert env["FORENSICS_SEVERITY"] == "fatal" and env["FORENSICS_KIND"] == "nan_inf"
    assert env["FORENSICS_STEP"] == "81" and calls[0]["stdin_kind"] == "nan_inf"
    report = Path(env["FORENSICS_REPORT"])
    assert report == tmp_path / "reports" / "run.html" and report.stat().st_size > 10_000
    assert not list(run.glob("*.html"))  # nothing written into the run folder
    assert not (tmp_path / "warn.jsonl").exists()

    # More NaN steps: the same findings, no new alert, no new hook.
    n = len(panel.alerts)
    for _ in range(3):
        writer.steps(3, nan=True)
        settle(w, writer)
    assert len(panel.alerts) == n and len(_lines(hooklog)) == 1
    writer.close()

    # The state file carries the alerts over to a new watcher: nothing repeated.
    w.close()
    saved = json.loads((tmp_path / "state.json").read_text())
    assert {a["kind"] for a in saved["alerts"]} == {"nan_inf"}
    w2, panel2 = _watcher(run, tmp_path, clock, hooks={Severity.FATAL: _hook(hooklog)})
    w2.poll()
    assert panel2.alerts == [] and len(_lines(hooklog)) == 1
    assert w2.status.diagnosis is not None and w2.status.diagnosis.verdict == "fatal"


def test_until_returns_the_fail_on_code_when_the_level_is_reached(tmp_path: Path) -> None:
    run, clock = tmp_path / "run", Clock()
    writer = Writer(run)
    writer.steps(60)
    w, _ = _watcher(run, tmp_path, clock, until=Severity.FATAL)
    settle(w, writer)
    writer.steps(4, nan=True)
    writer.close()
    assert w.poll() == 1
    # run() stops at once on a run already past the level, and saves the state.
    w2, _ = _watcher(run, tmp_path, clock, until=Severity.CRITICAL)
    assert w2.run() == 1
    assert (tmp_path / "state.json").exists()


def test_stall_from_the_logged_pace_alerted_once_and_ended_when_steps_resume(
    tmp_path: Path,
) -> None:
    run, clock, hooklog = tmp_path / "run", Clock(), tmp_path / "warn.jsonl"
    config = Config(detectors={"stall": {"min_seconds": 5.0, "factor": 20.0}})
    writer = Writer(run)
    writer.steps(60)
    w, panel = _watcher(
        run, tmp_path, clock, config=config, hooks={Severity.WARNING: _hook(hooklog)}
    )
    settle(w, writer)
    # The log shows one step a second: a stall is 20 s without a new step.
    assert w.stall_limit(w.tail.run) == pytest.approx(20.0)  # type: ignore[arg-type]
    clock.now += 15
    w.poll()
    assert panel.alerts == []
    clock.now += 10  # 25 s of silence
    w.poll()
    clock.now += 100
    w.poll()
    stalls = [a for a in panel.alerts if a.finding.kind.value == "stall"]
    assert [(a.event, a.finding.start_step, a.severity) for a in stalls] == [
        (Event.NEW, 60, Severity.WARNING)
    ]
    assert stalls[0].finding.measures["source"] == "watch"
    calls = _lines(hooklog)
    assert [(c["env"]["FORENSICS_KIND"], c["env"]["FORENSICS_STEP"]) for c in calls] == [
        ("stall", "60")
    ]
    # Steps resume: the stall ends, once.
    writer.steps(3)
    settle(w, writer)
    ended = [a for a in panel.alerts if a.event is Event.ENDED]
    assert [(a.finding.kind.value, a.finding.start_step, a.finding.end_step) for a in ended] == [
        ("stall", 60, 61)
    ]
    assert len(_lines(hooklog)) == 1  # an end runs no hook
    writer.close()


def test_stall_after_and_the_observed_pace_without_wall_times(tmp_path: Path) -> None:
    """A JSONL log without time stamps: the pace is what the watcher saw (or --stall-after)."""
    run, clock = tmp_path / "run", Clock()
    run.mkdir()
    log = run / "metrics.jsonl"
    config = Config(detectors={"stall": {"min_seconds": 1.0, "factor": 10.0}})
    w, panel = _watcher(run, tmp_path, clock, config=config)
    step = 0
    with log.open("a") as fh:
        for _ in range(6):  # a poll every 2 s, each finding 5 new steps
            for _ in range(5):
                step += 1
                fh.write(json.dumps({"step": step, "loss": 2.0 - step / 100}) + "\n")
            fh.flush()
            w.poll()
            clock.now += 2.0
    assert w.stall_limit(w.tail.run) == pytest.approx(20.0)  # type: ignore[arg-type]
    clock.now += 25
    w.poll()
    assert [a.finding.start_step for a in panel.alerts if a.finding.kind.value == "stall"] == [30]

    # --stall-after overrides the pace.
    (tmp_path / "state.json").unlink()
    w2, panel2 = _watcher(run, tmp_path, clock, stall_after=3.0)
    w2.poll()
    assert w2.stall_limit(w2.tail.run) == 3.0  # type: ignore[arg-type]
    clock.now += 2
    w2.poll()
    assert panel2.alerts == []
    clock.now += 2
    w2.poll()
    assert [a.finding.start_step for a in panel2.alerts] == [30]
    assert "3.0 s by the --stall-after" in panel2.alerts[0].finding.summary


def test_a_failing_hook_is_said_and_the_watcher_goes_on(tmp_path: Path) -> None:
    run, clock = tmp_path / "run", Clock()
    writer = Writer(run)
    writer.steps(60)
    writer.steps(3, nan=True)
    writer.close()
    w, panel = _watcher(run, tmp_path, clock, hooks={Severity.FATAL: "exit 3"})
    w.poll()
    assert [r.ok for r in panel.results] == [False]
    assert w.poll() is None  # still watching
    assert AlertBook.load(tmp_path / "state.json").tracked  # the alerts were saved


def test_quiet_prints_alert_lines_only(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run, clock = tmp_path / "run", Clock()
    writer = Writer(run)
    writer.steps(60)
    writer.steps(3, nan=True)
    writer.close()
    w = Watcher(run, settings=WatchSettings(), panel=LinePanel(quiet=True), clock=clock)
    w.poll()
    w.poll()
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2
    assert all(" FATAL new nan_inf (" in line and "at step 61:" in line for line in out)

    w = Watcher(run, settings=WatchSettings(), panel=LinePanel(quiet=False), clock=clock)
    w.poll()
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and "step 63  fatal  grad_norm nan  loss nan  lr 0.001" in out[-1]


def test_the_webhook_gets_every_alert_as_a_chat_message(tmp_path: Path) -> None:
    """A local HTTP server stands in for Slack: one POST per alert, ``text`` in the body."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    bodies: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run, clock = tmp_path / "run", Clock()
        writer = Writer(run)
        writer.steps(60)
        writer.steps(3, nan=True)
        writer.close()
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        w, panel = _watcher(run, tmp_path, clock, webhook=url)
        w.poll()
        w.poll()
    finally:
        server.shutdown()
        server.server_close()
    assert len(panel.alerts) == 2 and [r.ok for r in panel.results] == [True, True]
    assert len(bodies) == 2
    assert all("FATAL" in b["text"] and "nan_inf" in b["text"] for b in bodies)


def test_an_alert_names_its_supported_cause(tmp_path: Path) -> None:
    """A job resumed from step 1,000 with the LR typed 10x: the loss and the grad norm spike
    at the resume. The alerts had said what happened and not why; the report and `analyze`
    showed the cause the log supports. The alert line, the hook's FORENSICS_CAUSE and its JSON
    now carry it."""
    run, clock, hooklog = tmp_path / "run", Clock(), tmp_path / "hook.jsonl"
    run.mkdir()
    rng = np.random.default_rng(2)

    def line(step: int, lr: float, bump: float = 0.0) -> str:
        loss = 2 + 3 / (1 + step / 300) + rng.normal(0, 0.02) + bump
        gn = 1.0 + 0.05 * rng.standard_normal() + 4 * bump
        return json.dumps({"step": step, "loss": loss, "grad_norm": gn, "lr": lr}) + "\n"

    with (run / "metrics.jsonl").open("w") as fh:
        fh.writelines(line(s, 3e-4) for s in range(1, 1201))
        fh.writelines(line(s, 3e-3, 1.5 * math.exp(-(s - 1001) / 150)) for s in range(1001, 1601))
    w, panel = _watcher(run, tmp_path, clock, hooks={Severity.CRITICAL: _hook(hooklog)})
    w.poll()
    spikes = [a for a in panel.alerts if a.finding.kind.value.endswith("spike")]
    assert spikes and all(a.severity is Severity.CRITICAL for a in spikes)
    from forensics.watch.panel import alert_line

    for a in spikes:
        assert a.causes, a.finding.kind
        assert (
            " Cause (supported): An LR change no schedule explains: the LR left its schedule"
            in alert_line(a)
        )
        assert "(also supported: resume)" in alert_line(a)
    got = _lines(hooklog)
    assert got and all(
        g["env"]["FORENSICS_CAUSE"].startswith("Cause (supported): An LR change") for g in got
    )
