"""The watcher's actions: real hooks in a real shell, webhooks against a real local HTTP server.

The alerts come from a real diagnosis (sample_runs/nan: a fatal NaN loss among yellow lights)
through the real AlertBook.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from forensics.findings import FindingKind, Severity
from forensics.pipeline import analyze
from forensics.watch.actions import (
    HookResult,
    alert_document,
    hook_environment,
    message,
    post_webhook,
    run_hook,
)
from forensics.watch.alerts import Alert, AlertBook, Event

ROOT = Path(__file__).resolve().parents[1]
PY = shlex.quote(sys.executable)
REPORT = Path("/tmp/reports/nan/report.html")

# A hook that writes its FORENSICS_* environment, one inherited variable and its stdin to a file.
RECORDER = """
import json, os, sys
env = {k: v for k, v in os.environ.items() if k.startswith("FORENSICS_")}
with open(sys.argv[1], "w", encoding="utf-8") as fh:
    json.dump({"env": env, "stdin": sys.stdin.read()}, fh)
"""


@pytest.fixture(scope="module")
def alerts() -> list[Alert]:
    diag = analyze(ROOT / "sample_runs" / "nan")
    return AlertBook().update(diag.findings)


@pytest.fixture(scope="module")
def fatal(alerts: list[Alert]) -> Alert:
    # (the nan sample's two red lights: its divergence into the NaN, and the NaN)
    fatal = [a for a in alerts if a.severity is Severity.FATAL]
    assert [a.finding.kind for a in fatal] == [FindingKind.DIVERGENCE, FindingKind.NAN_INF]
    return fatal[1]


def _recorder_cmd(tmp_path: Path) -> tuple[str, Path]:
    script = tmp_path / "recorder.py"
    script.write_text(RECORDER, encoding="utf-8")
    out = tmp_path / "hook output.json"  # a space: the command line must quote it
    return f"{PY} {shlex.quote(str(script))} {shlex.quote(str(out))}", out


# -- hooks -------------------------------------------------------------------------------------
def test_hook_gets_the_finding_in_its_environment_and_as_json_on_stdin(
    fatal: Alert, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORENSICS_INHERITED", "from the watcher")
    cmd, out = _recorder_cmd(tmp_path)
    res = run_hook(cmd, fatal, run_name="nan", report=REPORT)
    assert res.ok, res.detail
    got = json.loads(out.read_text(encoding="utf-8"))
    env = got["env"]
    f = fatal.finding
    assert env["FORENSICS_SEVERITY"] == "fatal"
    assert env["FORENSICS_KIND"] == "nan_inf"
    assert env["FORENSICS_METRIC"] == "loss"
    assert env["FORENSICS_STEP"] == str(f.start_step) == "637"
    assert env["FORENSICS_SUMMARY"] == f.summary
    assert env["FORENSICS_REPORT"] == str(REPORT)
    assert env["FORENSICS_RUN"] == "nan"
    assert env["FORENSICS_EVENT"] == "new"
    assert env["FORENSICS_PREVIOUS"] == ""
    assert env["FORENSICS_INHERITED"] == "from the watcher"
    doc = json.loads(got["stdin"])
    assert doc == {**f.to_dict(), "run": "nan", "event": "new", "key": fatal.key,
                   "previous": None, "report": str(REPORT), "causes": []}  # fmt: skip
    assert env["FORENSICS_CAUSE"] == ""  # (this alert was made without its causes)
    assert doc == json.loads(json.dumps(alert_document(fatal, "nan", REPORT)))


def test_hook_without_a_report_gets_an_empty_report_variable(fatal: Alert, tmp_path: Path) -> None:
    cmd, out = _recorder_cmd(tmp_path)
    assert run_hook(cmd, fatal, run_name="nan", report=None).ok
    got = json.loads(out.read_text(encoding="utf-8"))
    assert got["env"]["FORENSICS_REPORT"] == ""
    assert json.loads(got["stdin"])["report"] is None


def test_hook_is_a_shell_command_line(fatal: Alert, tmp_path: Path) -> None:
    """Pipes, && and $VAR expansion work as the user typed them in a terminal."""
    out = tmp_path / "line.txt"
    cmd = (
        f'printf "%s@%s" "$FORENSICS_KIND" "$FORENSICS_STEP" | tr a-z A-Z > {shlex.quote(str(out))}'
        f" && echo done >> {shlex.quote(str(out))}"
    )
    res = run_hook(cmd, fatal, run_name="nan", report=None)
    assert res.ok, res.detail
    assert out.read_text() == "NAN_INF@637done\n"


def test_escalation_and_end_reach_the_hook(alerts: list[Alert], tmp_path: Path) -> None:
    warning = next(a for a in alerts if a.severity is Severity.WARNING)
    up = Alert(
        Event.ESCALATED,
        dataclasses.replace(warning.finding, severity=Severity.CRITICAL, end_step=700),
        warning.key,
        previous=Severity.WARNING,
    )
    cmd, out = _recorder_cmd(tmp_path)
    assert run_hook(cmd, up, run_name="nan", report=None).ok
    env = json.loads(out.read_text(encoding="utf-8"))["env"]
    assert (env["FORENSICS_EVENT"], env["FORENSICS_SEVERITY"]) == ("escalated", "critical")
    assert (env["FORENSICS_PREVIOUS"], env["FORENSICS_END_STEP"]) == ("warning", "700")


def test_non_zero_exit_is_a_failed_result_with_stderr_on_one_line(fatal: Alert) -> None:
    res = run_hook(
        "echo first line >&2; echo 'pager unreachable' >&2; exit 3",
        fatal,
        run_name="nan",
        report=None,
    )
    assert isinstance(res, HookResult)
    assert not res.ok
    assert "exit 3" in res.detail and "pager unreachable" in res.detail
    assert "\n" not in res.detail


def test_missing_command_is_a_failed_result_not_an_exception(fatal: Alert) -> None:
    res = run_hook("forensics-no-such-pager --page oncall", fatal, run_name="nan", report=None)
    assert not res.ok
    assert "127" in res.detail and "not found" in res.detail


def test_empty_command_and_unstartable_command(fatal: Alert) -> None:
    assert not run_hook("  ", fatal, run_name="nan", report=None).ok
    res = run_hook("echo a\x00b", fatal, run_name="nan", report=None)  # exec refuses a NUL
    assert not res.ok and "could not start" in res.detail


def test_hook_killed_by_a_signal_says_so(fatal: Alert) -> None:
    res = run_hook("kill -9 $$", fatal, run_name="nan", report=None)
    assert not res.ok
    assert "SIGKILL" in res.detail


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper is dead too
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" not in status


@pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX")
def test_timeout_kills_the_hook_and_its_children(fatal: Alert, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # The hook starts a child of its own, then waits: both must die at the timeout.
    cmd = f"sleep 60 & echo $! > {shlex.quote(str(pidfile))}; wait"
    t0 = time.monotonic()
    res = run_hook(cmd, fatal, run_name="nan", report=None, timeout=1.0)
    took = time.monotonic() - t0
    assert not res.ok
    assert "timed out after 1 s" in res.detail
    assert took < 10, took
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the hook's child survived the timeout"


@pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX")
def test_timeout_does_not_wait_for_a_grandchild_that_left_the_group(
    fatal: Alert, tmp_path: Path
) -> None:
    """A daemon the hook started in a session of its own keeps the pipes open: the watcher
    must still come back."""
    pidfile = tmp_path / "daemon.pid"
    daemon = f"{PY} -c 'import os,time; os.setsid(); time.sleep(30)'"
    cmd = f"{daemon} & echo $! > {shlex.quote(str(pidfile))}; sleep 60"
    t0 = time.monotonic()
    res = run_hook(cmd, fatal, run_name="nan", report=None, timeout=1.0)
    assert not res.ok and "timed out" in res.detail
    assert time.monotonic() - t0 < 10
    pid = int(pidfile.read_text())
    if _alive(pid):
        os.kill(pid, 9)


def test_hook_that_ignores_stdin_succeeds(fatal: Alert) -> None:
    res = run_hook("true", fatal, run_name="nan", report=None)
    assert res == HookResult(True, res.detail) and res.ok


def test_untrusted_text_reaches_the_environment_safely(fatal: Alert, tmp_path: Path) -> None:
    """A summary quoting a tag with a NUL byte or a lone surrogate cannot break the hook."""
    odd = Alert(
        fatal.event,
        dataclasses.replace(fatal.finding, summary="tag a\x00b and \ud800; rm -rf / `id` $(id)"),
        fatal.key,
    )
    env = hook_environment(odd, "run\x00x", None)
    assert "\x00" not in env["FORENSICS_SUMMARY"] and "\x00" not in env["FORENSICS_RUN"]
    cmd, out = _recorder_cmd(tmp_path)
    res = run_hook(cmd, odd, run_name="nan", report=None)
    assert res.ok, res.detail
    got = json.loads(out.read_text(encoding="utf-8"))
    assert got["env"]["FORENSICS_SUMMARY"] == "tag a\\x00b and \\ud800; rm -rf / `id` $(id)"
    # The JSON on stdin keeps the summary exactly (JSON escapes what it must).
    assert json.loads(got["stdin"])["summary"] == odd.finding.summary


# -- the message -------------------------------------------------------------------------------
def test_message_is_one_line_with_light_run_kind_step_and_summary(
    fatal: Alert, alerts: list[Alert]
) -> None:
    text = message(fatal, "nan", REPORT)
    assert "\n" not in text
    assert text.startswith("\U0001f534 FATAL (red light) run nan: nan_inf on loss, step 637-1,000")
    assert fatal.finding.summary in text and text.endswith(f"Report: {REPORT}")
    assert "Report" not in message(fatal, "nan", None)
    warning = next(a for a in alerts if a.severity is Severity.WARNING)
    assert message(warning, "nan", None).startswith("\U0001f7e1 WARNING (yellow light)")
    up = Alert(Event.ESCALATED, dataclasses.replace(warning.finding, severity=Severity.CRITICAL),
               warning.key, previous=Severity.WARNING)  # fmt: skip
    assert message(up, "nan", None).startswith("\U0001f7e0 CRITICAL (orange light, was yellow)")
    ended = Alert(Event.ENDED, warning.finding, warning.key, previous=Severity.WARNING)
    assert message(ended, "nan", None).startswith("\u2705 ENDED (yellow light)")


def test_message_shows_control_characters_as_escapes(fatal: Alert) -> None:
    odd = Alert(fatal.event, dataclasses.replace(fatal.finding, summary="a\x1b[2Jb\nc"), fatal.key)
    text = message(odd, "run\x1b]0;x\x07", None)
    assert "\x1b" not in text and "\x07" not in text and "\n" not in text
    assert "\\x1b[2Jb c" in text


# -- webhooks against a real HTTP server -------------------------------------------------------
@dataclasses.dataclass
class Hook:
    """A local chat webhook: what it received, and what it answers."""

    server: ThreadingHTTPServer
    received: list[dict[str, Any]]
    status: int = 200
    answer: bytes = b"ok"
    delay: float = 0.0
    location: str | None = None

    def url(self, path: str = "/services/T0001/B0002/SECRETTOKEN") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"


@pytest.fixture
def hook_server() -> Iterator[Hook]:
    hook: Hook

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            n = int(self.headers.get("Content-Length", 0))
            body = self.rfile.read(n)
            hook.received.append({"path": self.path, "headers": dict(self.headers), "body": body})
            time.sleep(hook.delay)
            self.send_response(hook.status)
            if hook.location:
                self.send_header("Location", hook.location)
            self.send_header("Content-Length", str(len(hook.answer)))
            self.end_headers()
            with contextlib.suppress(OSError):  # the timeout test's client has gone
                self.wfile.write(hook.answer)

        def do_GET(self) -> None:  # noqa: N802
            hook.received.append({"path": self.path, "headers": dict(self.headers), "body": b""})
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    hook = Hook(server, [])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield hook
    server.shutdown()
    server.server_close()


def test_webhook_posts_json_with_a_chat_text_and_the_finding(
    fatal: Alert, hook_server: Hook
) -> None:
    res = post_webhook(hook_server.url(), fatal, run_name="nan", report=REPORT)
    assert res.ok, res.detail
    assert "HTTP 200" in res.detail
    (req,) = hook_server.received
    assert req["path"] == "/services/T0001/B0002/SECRETTOKEN"
    assert req["headers"]["Content-Type"].startswith("application/json")
    doc = json.loads(req["body"].decode("utf-8"))
    text = doc["text"]
    assert isinstance(text, str) and "\n" not in text
    for part in ("\U0001f534", "FATAL", "red light", "run nan", "nan_inf", "loss", "637"):
        assert part in text
    assert doc["forensics"]["kind"] == "nan_inf"
    assert doc["forensics"]["severity"] == "fatal"
    assert doc["forensics"]["start_step"] == 637
    assert doc["forensics"]["run"] == "nan" and doc["forensics"]["event"] == "new"
    assert doc["forensics"]["summary"] == fatal.finding.summary


def test_webhook_text_cannot_ping_a_channel(fatal: Alert, hook_server: Hook) -> None:
    """A tag named <!channel> in a summary must not become a Slack mention."""
    odd = Alert(
        fatal.event, dataclasses.replace(fatal.finding, summary="tag <!channel> & co"), fatal.key
    )
    assert post_webhook(hook_server.url(), odd, run_name="nan", report=None).ok
    doc = json.loads(hook_server.received[0]["body"])
    assert "<!channel>" not in doc["text"]
    assert "&lt;!channel&gt; &amp; co" in doc["text"]
    assert doc["forensics"]["summary"] == "tag <!channel> & co"


def test_webhook_answering_500_is_a_failure_naming_the_host_not_the_token(
    fatal: Alert, hook_server: Hook
) -> None:
    hook_server.status, hook_server.answer = 500, b"internal\nerror"
    res = post_webhook(hook_server.url(), fatal, run_name="nan", report=None)
    assert not res.ok
    assert "HTTP 500" in res.detail and "internal error" in res.detail
    assert "127.0.0.1" in res.detail
    assert "SECRETTOKEN" not in res.detail and "\n" not in res.detail


def test_webhook_redirect_is_not_followed(fatal: Alert, hook_server: Hook) -> None:
    """A redirected POST would arrive as a GET without the message: a failure, not a 200."""
    hook_server.status, hook_server.location = 302, hook_server.url("/elsewhere")
    res = post_webhook(hook_server.url(), fatal, run_name="nan", report=None)
    assert not res.ok and "HTTP 302" in res.detail
    assert [r["path"] for r in hook_server.received] == ["/services/T0001/B0002/SECRETTOKEN"]


def test_webhook_accepts_any_2xx(fatal: Alert, hook_server: Hook) -> None:
    hook_server.status, hook_server.answer = 204, b""
    res = post_webhook(hook_server.url(), fatal, run_name="nan", report=None)
    assert res.ok and "HTTP 204" in res.detail


def test_webhook_to_a_refused_port(fatal: Alert) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Nothing listens there any more: the connection is refused.
    res = post_webhook(f"http://127.0.0.1:{port}/hook", fatal, run_name="nan", report=None)
    assert not res.ok
    assert "unreachable" in res.detail and "refused" in res.detail.lower()


def test_webhook_timeout(fatal: Alert, hook_server: Hook) -> None:
    hook_server.delay = 3.0
    t0 = time.monotonic()
    res = post_webhook(hook_server.url(), fatal, run_name="nan", report=None, timeout=0.5)
    assert not res.ok and "timed out after 0.5 s" in res.detail
    assert time.monotonic() - t0 < 3.0


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://example.org/hook",
        "hooks.slack.com/services/x",
        "http://",
        "http://127.0.0.1:99999/hook",
        "http://[::1/hook",
        "",
    ],
)
def test_webhook_bad_urls_are_failures_not_exceptions(fatal: Alert, url: str) -> None:
    res = post_webhook(url, fatal, run_name="nan", report=None)
    assert not res.ok
    assert res.detail.startswith("webhook") and "\n" not in res.detail
