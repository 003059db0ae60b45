"""The watched runs' vital signs and lights as Prometheus metrics (the article's 6.4).

Written in the Prometheus text exposition format (version 0.0.4) with the standard library:

==========================================  =================================================
``forensics_up{run}``                        1 when the last poll read and diagnosed the run,
                                             0 while it has no diagnosis (no log yet)
``forensics_last_step{run}``                 the last step in the log
``forensics_verdict{run}``                   the run's light: 0 green, 1 yellow, 2 orange, 3 red
``forensics_vital{run,sign}``                each vital sign's last logged value (NaN and Inf
                                             kept: they are evidence)
``forensics_vital_step{run,sign}``           the step of that value (signs are logged at
                                             different intervals)
``forensics_light{run,sign}``                the worst finding on the sign so far: 0 green or
                                             a note, 1 yellow, 2 orange, 3 red; run-level
                                             findings (crash, stall, restart) under ``job``;
                                             a divergence lights the loss and the grad norm
``forensics_findings{run,severity}``         findings per severity
``forensics_updated_timestamp_seconds{run}`` when the watcher last updated the run
==========================================  =================================================

Per-layer series (``grad_norm_layer`` ...) are not exported as values (one series per layer
would swamp a dashboard), but a finding on them lights their sign.

:class:`PrometheusTextfile` writes a ``.prom`` file for node_exporter's textfile collector,
atomically (the collector never reads half a file); :class:`PrometheusServer` serves
``/metrics`` itself from a background thread. :func:`open_prometheus` turns the command
line's ``--prometheus FILE|:PORT`` into one of them.
"""

from __future__ import annotations

import math
import re
import socket
import socketserver
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from forensics.atomic import write_atomic
from forensics.errors import ForensicsError
from forensics.findings import Finding, FindingKind, Severity
from forensics.schema import GRAD_NORM, PER_LAYER

if TYPE_CHECKING:
    from forensics.diagnosis import Diagnosis

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JOB_SIGN = "job"  # the sign of run-level findings (no metric), as the timeline names it

# name -> (help, labels besides run); the order of the exposition.
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "forensics_up": ("1 when the last poll read and diagnosed the run, else 0.", ()),
    "forensics_last_step": ("The last step in the run's log.", ()),
    "forensics_verdict": (
        "The run's light: 0 green, 1 yellow (warning), 2 orange (critical), 3 red (fatal).",
        (),
    ),
    "forensics_vital": ("The last logged value of each vital sign.", ("sign",)),
    "forensics_vital_step": ("The step of the last logged value of each vital sign.", ("sign",)),
    "forensics_light": (
        "Each vital sign's light from its worst finding: 0 green, 1 yellow, 2 orange, 3 red.",
        ("sign",),
    ),
    "forensics_findings": ("Findings of the run per severity.", ("severity",)),
    "forensics_updated_timestamp_seconds": (
        "Unix time of the watcher's last update of the run.",
        (),
    ),
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the host's FQDN: a DNS query the metrics do not need.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a scraper that hung up: no traceback across the watcher's terminal


class _Server6(_Server):
    address_family = socket.AF_INET6


Sample = tuple[str, tuple[tuple[str, str], ...], float]  # family, labels, value


def escape_label(value: str) -> str:
    """A label value as the text format wants it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """HELP text: backslash and newline escaped (quotes stay as they are)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """A sample value: integers without a decimal point, ``NaN``, ``+Inf`` and ``-Inf``."""
    v = float(value)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v.is_integer() and abs(v) < 2**53:
        return str(int(v))
    return repr(v)


def light_of(severity: Severity | None) -> int:
    """0 green (none or a note), 1 yellow, 2 orange, 3 red: the severity's rank."""
    return 0 if severity is None else severity.rank


def signs_of(finding: Finding) -> tuple[str, ...]:
    """The signs a finding lights: its metric's; a divergence (the loss and the grad norm
    climbing together) lights the grad norm too when it was judged on a logged one."""
    sign = finding.metric or JOB_SIGN
    m = finding.measures
    if finding.kind is FindingKind.DIVERGENCE and (
        m.get("grad_norm_ratio") is not None or m.get("grad_norm_late_ratio") is not None
    ):
        return (sign, GRAD_NORM)
    return (sign,)


def sign_lights(findings: Iterable[Finding]) -> dict[str, int]:
    """Each sign with a finding and the light of its worst finding."""
    out: dict[str, int] = {}
    for f in findings:
        for s in signs_of(f):
            out[s] = max(out.get(s, 0), light_of(f.severity))
    return out


def vital_signs(diagnosis: Diagnosis) -> dict[str, tuple[int, float]]:
    """Each vital sign the run logged (per-layer series aside): (last step, last value)."""
    out: dict[str, tuple[int, float]] = {}
    for sign in sorted(diagnosis.run.metrics()):
        if sign in PER_LAYER:
            continue
        logged = diagnosis.ev.logged(sign)
        if len(logged) == 0:
            continue
        out[sign] = (int(logged.steps[-1]), float(logged.values[-1]))
    return out


def run_samples(run: str, diagnosis: Diagnosis | None, now: float | None = None) -> list[Sample]:
    """The samples of one run (every family but its HELP and TYPE lines)."""
    r = (("run", run),)
    now = time.time() if now is None else now
    samples: list[Sample] = [
        ("forensics_up", r, 0.0 if diagnosis is None else 1.0),
        ("forensics_updated_timestamp_seconds", r, round(now, 3)),
    ]
    if diagnosis is None:
        return samples
    findings = diagnosis.findings
    worst = max((f.severity for f in findings), key=lambda s: s.rank, default=None)
    samples += [
        ("forensics_last_step", r, float(diagnosis.run.last_step)),
        ("forensics_verdict", r, float(light_of(worst))),
    ]
    vitals = vital_signs(diagnosis)
    for sign, (step, value) in vitals.items():
        samples.append(("forensics_vital", (*r, ("sign", sign)), value))
        samples.append(("forensics_vital_step", (*r, ("sign", sign)), float(step)))
    lights = dict.fromkeys(vitals, 0) | sign_lights(findings)
    for sign in sorted(lights):
        samples.append(("forensics_light", (*r, ("sign", sign)), float(lights[sign])))
    for sev in Severity:
        n = sum(1 for f in findings if f.severity is sev)
        samples.append(("forensics_findings", (*r, ("severity", sev.value)), float(n)))
    return samples


def render(samples: Iterable[Sample]) -> str:
    """The exposition text: each family once, with its HELP and TYPE lines, in FAMILIES order."""
    by_family: dict[str, list[Sample]] = {name: [] for name in FAMILIES}
    for s in samples:
        by_family[s[0]].append(s)
    lines: list[str] = []
    for name, (help_text, _labels) in FAMILIES.items():
        if not by_family[name]:
            continue
        lines.append(f"# HELP {name} {escape_help(help_text)}")
        lines.append(f"# TYPE {name} gauge")
        for _, labels, value in by_family[name]:
            inner = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels)
            lines.append(f"{name}{{{inner}}} {format_value(value)}")
    return "\n".join(lines) + "\n" if lines else ""


@dataclass
class Exposition:
    """The latest samples of every run updated so far; one text for all of them."""

    runs: dict[str, list[Sample]] = field(default_factory=dict)

    def update(self, run: str, diagnosis: Diagnosis | None) -> str:
        self.runs[run] = run_samples(run, diagnosis)
        return self.text()

    def text(self) -> str:
        return render(s for run in sorted(self.runs) for s in self.runs[run])


class PrometheusTextfile:
    """A ``.prom`` file for node_exporter's textfile collector, rewritten on each update.

    The file is replaced in one rename (:mod:`forensics.atomic`); the temporary file starts
    with a dot and ends in ``.tmp``, which the collector ignores.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.suffix != ".prom":
            raise ForensicsError(
                f"{self.path}: node_exporter's textfile collector reads only *.prom files"
            )
        self._exposition = Exposition()

    def update(self, run: str, diagnosis: Diagnosis | None) -> None:
        write_atomic(self.path, self._exposition.update(run, diagnosis))

    def close(self) -> None:
        """Nothing to release: the last file stays for the collector (its mtime says how old)."""


class PrometheusServer:
    """``/metrics`` served from a background thread until :meth:`close`.

    ``port=0`` picks a free port (read it from :attr:`port`). The default host is the
    loopback: serving the metrics to the network is a choice (``host="0.0.0.0"``).
    """

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self._exposition = Exposition()
        self._lock = threading.Lock()
        self._text = ""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "forensics-watch"

            def _answer(self, body: bool) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    data, ctype, code = owner.text().encode("utf-8"), CONTENT_TYPE, 200
                elif path == "/":
                    data = b"forensics watch: metrics at /metrics\n"
                    ctype, code = "text/plain; charset=utf-8", 200
                else:
                    data, ctype, code = b"not found\n", "text/plain; charset=utf-8", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 -- http.server's naming
                self._answer(body=True)

            def do_HEAD(self) -> None:  # noqa: N802
                self._answer(body=False)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass  # scrapes every 15 s would flood the watcher's terminal

        try:
            server_class = _Server6 if ":" in host else _Server
            self._server: _Server = server_class((host, port), Handler)
        except (OSError, OverflowError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            raise ForensicsError(f"cannot serve metrics on {host}:{port} ({reason})") from None
        self.host = host
        self.port: int = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},  # how long close() waits for the loop at most
            name="forensics-prometheus",
            daemon=True,
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def text(self) -> str:
        with self._lock:
            return self._text

    def update(self, run: str, diagnosis: Diagnosis | None) -> None:
        text = self._exposition.update(run, diagnosis)
        with self._lock:
            self._text = text

    def close(self) -> None:
        """Stop serving and release the port (safe to call twice)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5.0)
        self._server.server_close()

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MetricsOutput(Protocol):
    """What the watcher needs of either output."""

    def update(self, run: str, diagnosis: Diagnosis | None) -> None: ...

    def close(self) -> None: ...


_LISTEN = re.compile(r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:/\\\[\]]*)):(?P<port>\d{1,5})")
USAGE = (
    "a .prom file for node_exporter's textfile collector, or :PORT (HOST:PORT, [V6]:PORT) "
    "to serve /metrics"
)


def open_prometheus(spec: str) -> MetricsOutput:
    """``--prometheus FILE|:PORT``: a ``*.prom`` path is a textfile, ``:9100`` serves on the
    loopback, ``0.0.0.0:9100`` or ``[::]:9100`` on that address. Anything else is a one-line
    :class:`ForensicsError`."""
    if spec.endswith(".prom"):
        return PrometheusTextfile(spec)
    m = _LISTEN.fullmatch(spec)
    if m is None or int(m["port"]) > 65535:
        raise ForensicsError(f"--prometheus {spec!r}: expected {USAGE}")
    host = m["v6"] or m["host"] or "127.0.0.1"
    return PrometheusServer(int(m["port"]), host=host)
