"""What the watcher does with an alert: run the user's hook, post to a chat webhook.

Both take an :class:`~forensics.watch.alerts.Alert` and return a :class:`HookResult`; neither
ever raises: a hook that fails, hangs or is missing, or a webhook that refuses, is one line
for the watcher to log before it goes on watching (the run matters more than the alert).

Hooks (``--on-warning CMD`` ...) are shell command lines, as the user types them in a
terminal: ``run_hook`` runs ``CMD`` with ``/bin/sh -c`` (``cmd.exe /c`` on Windows), so
pipes, ``&&``, quoting and ``$VAR`` expansion work. The hook gets, on top of the watcher's
own environment:

==========================  ===================================================================
``FORENSICS_SEVERITY``      ``warning``, ``critical`` or ``fatal`` (``info`` for a note)
``FORENSICS_EVENT``         ``new``, ``escalated``, ``recurred`` or ``ended``
``FORENSICS_KIND``          the finding kind (``nan_inf``, ``grad_norm_spike`` ...)
``FORENSICS_METRIC``        the vital sign (``grad_norm``); empty for run-level findings
``FORENSICS_STEP``          the onset step of the finding
``FORENSICS_END_STEP``      the step it ended at; empty while it goes on
``FORENSICS_PREVIOUS``      the severity before an escalation or an end; empty for a new one
``FORENSICS_SUMMARY``       the finding's one-sentence summary
``FORENSICS_CAUSE``         its first supported cause with the evidence (``Cause (supported):
                            ...``, or ``Mechanism (supported): ...``); empty when none is
``FORENSICS_REPORT``        the report's path; empty when no report is written
``FORENSICS_RUN``           the run's name
==========================  ===================================================================

and the finding as JSON on stdin (:meth:`Finding.to_dict` plus ``run``, ``event``, ``key``,
``previous``, ``report`` and its tested ``causes``). A hook that runs longer than its timeout
is killed with its whole process group (a ``sh -c 'a | b'`` pipeline included).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from forensics.findings import finding_steps
from forensics.terminal import safe
from forensics.watch.alerts import Alert, Event

DETAIL_CHARS = 300  # a detail is one log line: the end of a long stderr is cut
BODY_CHARS = 200  # what of a webhook's error answer is quoted

# The article's lights (6.3) as the emoji chat clients show in colour.
LIGHT_EMOJI = {
    "green": "\U0001f7e2",  # green circle
    "blue": "\U0001f535",  # blue circle
    "yellow": "\U0001f7e1",  # yellow circle
    "orange": "\U0001f7e0",  # orange circle
    "red": "\U0001f534",  # red circle
}
ENDED_EMOJI = "\u2705"  # white heavy check mark


@dataclass
class HookResult:
    """What became of one action: ``ok`` and a one-line ``detail`` for the watcher's log."""

    ok: bool
    detail: str


def _one_line(text: str, limit: int = DETAIL_CHARS) -> str:
    """``text`` on one line: control characters shown as escapes, whitespace runs collapsed."""
    flat = re.sub(r"\s+", " ", safe(text)).strip()
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def message(alert: Alert, run_name: str, report: Path | None) -> str:
    """The one-line human text of an alert, for the terminal, the webhook and the log.

    ``<light> <SEVERITY> (<light> light) run <name>: <kind> on <sign>, step <steps>: <summary>``
    with ``was <light>`` for an escalation, ``again, <n> times now`` for a finding of many
    like events that counts more of them, ``ENDED`` for a finding that recovered, and the
    report's path at the end when there is one.
    """
    f = alert.finding
    light = f.severity.light
    prev = alert.previous.light if alert.previous is not None else None
    if alert.event is Event.ENDED:
        head = f"{ENDED_EMOJI} ENDED ({light} light)"
    elif alert.event is Event.ESCALATED and prev is not None:
        head = f"{LIGHT_EMOJI[light]} {f.severity.value.upper()} ({light} light, was {prev})"
    elif alert.event is Event.RECURRED:
        times = f", {len(f.events_at):,} times now" if f.events_at else ""
        head = f"{LIGHT_EMOJI[light]} {f.severity.value.upper()} ({light} light, again{times})"
    else:
        head = f"{LIGHT_EMOJI[light]} {f.severity.value.upper()} ({light} light)"
    where = f"{f.kind.value} on {f.metric}" if f.metric else f.kind.value
    text = (
        f"{head} run {run_name}: {where}, step {finding_steps(f)}: {f.summary}{alert.cause_text()}"
    )
    if report is not None:
        text += f" Report: {report}"
    return _one_line(text, limit=2000)


def alert_document(alert: Alert, run_name: str, report: Path | None) -> dict[str, Any]:
    """The finding as JSON for hooks and webhooks: ``Finding.to_dict`` plus the alert's context."""
    return {
        **alert.finding.to_dict(),
        "run": run_name,
        "event": alert.event.value,
        "key": alert.key,
        "previous": alert.previous.value if alert.previous is not None else None,
        "report": str(report) if report is not None else None,
        "causes": [c.to_dict() for c in alert.causes],
    }


def _env_value(value: object) -> str:
    """A string an environment can hold: no NUL byte, no lone surrogate."""
    text = str(value).replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def hook_environment(alert: Alert, run_name: str, report: Path | None) -> dict[str, str]:
    """The ``FORENSICS_*`` variables a hook gets (see the module's table)."""
    f = alert.finding
    values = {
        "FORENSICS_SEVERITY": f.severity.value,
        "FORENSICS_EVENT": alert.event.value,
        "FORENSICS_KIND": f.kind.value,
        "FORENSICS_METRIC": f.metric or "",
        "FORENSICS_STEP": str(f.start_step),
        "FORENSICS_END_STEP": "" if f.end_step is None else str(f.end_step),
        "FORENSICS_PREVIOUS": alert.previous.value if alert.previous is not None else "",
        "FORENSICS_SUMMARY": f.summary,
        "FORENSICS_CAUSE": alert.cause_text().strip(),
        "FORENSICS_REPORT": "" if report is None else str(report),
        "FORENSICS_RUN": run_name,
    }
    return {k: _env_value(v) for k, v in values.items()}


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the hook and everything it started (it leads its own process group)."""
    try:
        if sys.platform == "win32":
            proc.kill()
        else:
            os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def _last_line(data: bytes | None) -> str:
    lines = [ln for ln in (data or b"").decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def run_hook(
    cmd: str, alert: Alert, *, run_name: str, report: Path | None, timeout: float = 60.0
) -> HookResult:
    """Run the user's hook command for ``alert`` (see the module's docstring).

    ``cmd`` is one shell command line. Its stdout and stderr are captured (they would tear
    the watcher's terminal panel); the last line of stderr is quoted when it fails. A
    non-zero exit, a command the shell cannot find (exit 127), a hook killed at ``timeout``
    seconds or one that cannot be started at all is ``ok=False`` with a one-line detail.
    """
    if not cmd.strip():
        return HookResult(False, "empty hook command")
    env = {**os.environ, **hook_environment(alert, run_name, report)}
    payload = json.dumps(alert_document(alert, run_name, report)).encode("utf-8")
    t0 = time.monotonic()
    try:
        if sys.platform == "win32":
            proc = subprocess.Popen(
                cmd,
                shell=True,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                creationflags=subprocess.CREATE_NEW_PROCESS_GROUP,  # type: ignore[attr-defined,unused-ignore]
            )
        else:
            proc = subprocess.Popen(
                cmd,
                shell=True,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: a timeout kills all of it
            )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return HookResult(False, _one_line(f"hook could not start: {exc}"))
    try:
        _out, err = proc.communicate(payload, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            # A grandchild that left the group may hold the pipes open: do not wait for it.
            proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            proc.wait()
        return HookResult(False, f"hook timed out after {timeout:g} s and was killed")
    except OSError as exc:
        _kill_group(proc)
        proc.wait()
        return HookResult(False, _one_line(f"hook failed: {exc}"))
    took = time.monotonic() - t0
    if proc.returncode != 0:
        last = _last_line(err)
        detail = f"hook {_exit_text(proc.returncode)} after {took:.1f} s"
        return HookResult(False, _one_line(f"{detail}: {last}" if last else detail))
    return HookResult(True, f"hook ran in {took:.1f} s")


# -- webhooks ---------------------------------------------------------------------------------
def _slack_escape(text: str) -> str:
    """Slack reads ``<...>`` as links and mentions (``<!channel>``): a tag from the log must not
    ping a channel. ``&``, ``<`` and ``>`` are the three characters Slack asks to escape."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def webhook_body(alert: Alert, run_name: str, report: Path | None) -> dict[str, Any]:
    """The JSON posted: ``text`` for the chat, the structured finding under ``forensics``."""
    return {
        "text": _slack_escape(message(alert, run_name, report)),
        "forensics": alert_document(alert, run_name, report),
    }


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirected POST would come back as a GET without the message: refuse it instead."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None


def _where(url: str) -> str:
    """The scheme and host of a webhook URL, never its path: a webhook's path is its secret."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}" + (f":{parts.port}" if parts.port else "")


def post_webhook(
    url: str, alert: Alert, *, run_name: str, report: Path | None, timeout: float = 10.0
) -> HookResult:
    """POST the alert to a chat webhook as JSON (see :func:`webhook_body`).

    The ``text`` field is what Slack incoming webhooks, Mattermost, Rocket.Chat, Google Chat
    and Teams' Office 365 connectors post. Only ``http`` and ``https`` URLs are accepted;
    redirects are not followed. Any 2xx answer is success; a refused connection, a timeout,
    a non-2xx answer or a malformed URL is ``ok=False`` with one line that names the host but
    not the URL's path (webhook URLs carry their token there).
    """
    try:
        parts = urlsplit(url)
        scheme, host = parts.scheme.lower(), parts.hostname
        parts.port  # noqa: B018 -- raises ValueError for a port out of range
    except ValueError as exc:
        return HookResult(False, _one_line(f"webhook: bad URL ({exc})"))
    if scheme not in ("http", "https") or not host:
        return HookResult(False, "webhook: not an http(s) URL with a host")
    where = _where(url)
    data = json.dumps(webhook_body(alert, run_name, report)).encode("utf-8")
    req = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json; charset=utf-8", "User-Agent": "forensics"},
    )
    opener = urllib.request.build_opener(_NoRedirect)
    t0 = time.monotonic()
    try:
        with opener.open(req, timeout=timeout) as resp:
            status = resp.status
            body = resp.read(BODY_CHARS * 4)
    except urllib.error.HTTPError as exc:
        body = b""
        try:
            body = exc.read(BODY_CHARS * 4)
        except OSError:
            pass
        answer = _one_line(body.decode("utf-8", "replace"), BODY_CHARS)
        tail = f": {answer}" if answer else ""
        return HookResult(False, _one_line(f"webhook {where} answered HTTP {exc.code}{tail}"))
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            return HookResult(False, f"webhook {where} timed out after {timeout:g} s")
        return HookResult(False, _one_line(f"webhook {where} unreachable: {exc.reason}"))
    except TimeoutError:
        return HookResult(False, f"webhook {where} timed out after {timeout:g} s")
    except (OSError, ValueError) as exc:
        return HookResult(False, _one_line(f"webhook {where} failed: {exc}"))
    except Exception as exc:  # http.client's protocol errors: the watcher must go on
        return HookResult(False, _one_line(f"webhook {where} failed: {type(exc).__name__}: {exc}"))
    if not 200 <= status < 300:
        answer = _one_line(body.decode("utf-8", "replace"), BODY_CHARS)
        return HookResult(False, _one_line(f"webhook {where} answered HTTP {status}: {answer}"))
    took = time.monotonic() - t0
    return HookResult(True, f"webhook {where} answered HTTP {status} in {took:.1f} s")
