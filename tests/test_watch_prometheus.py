"""Prometheus output: parsed back with a strict parser of the text format, the endpoint scraped
over HTTP, and the lights checked against a real run's findings."""

from __future__ import annotations

import math
import os
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from forensics.diagnosis import Diagnosis
from forensics.errors import ForensicsError
from forensics.findings import Severity
from forensics.pipeline import analyze
from forensics.schema import PER_LAYER
from forensics.watch.prometheus import (
    CONTENT_TYPE,
    FAMILIES,
    Exposition,
    PrometheusServer,
    PrometheusTextfile,
    format_value,
    open_prometheus,
)

ROOT = Path(__file__).resolve().parents[1]

Series = tuple[str, frozenset[tuple[str, str]]]
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_VALUE = re.compile(r"[+-]?(?:Inf|NaN|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)")


def _labels(text: str, i: int) -> tuple[dict[str, str], int]:
    """Labels from ``text[i]`` (just after ``{``) to the closing brace; strict about escapes."""
    out: dict[str, str] = {}
    while True:
        if text[i] == "}":
            return out, i + 1
        m = _LABEL.match(text, i)
        assert m, f"bad label name at {text[i:]!r}"
        name, i = m.group(), m.end()
        assert text[i : i + 2] == '="', f'expected =" after {name}'
        i += 2
        value = []
        while text[i] != '"':
            if text[i] == "\\":
                nxt = text[i + 1]
                assert nxt in '\\"n', f"bad escape \\{nxt}"
                value.append("\n" if nxt == "n" else nxt)
                i += 2
            else:
                assert text[i] != "\n"
                value.append(text[i])
                i += 1
        i += 1
        assert name not in out, f"label {name} twice"
        out[name] = "".join(value)
        if text[i] == ",":
            i += 1


def parse(text: str) -> tuple[dict[Series, float], dict[str, tuple[str, str]]]:
    """Samples and {family: (help, type)}; asserts the text format's rules on the way:
    HELP and TYPE once each and before the family's samples, a family's samples in one
    group, no series twice, values as the format spells them."""
    assert text.endswith("\n")
    samples: dict[Series, float] = {}
    meta: dict[str, dict[str, str]] = {}
    done: set[str] = set()  # families whose group has ended
    current: str | None = None
    for line in text[:-1].split("\n"):
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                assert _NAME.fullmatch(name)
                assert name not in done and name not in {s[0] for s in samples}, (
                    f"{parts[1]} of {name} after its samples"
                )
                assert parts[1] not in meta.setdefault(name, {}), f"{parts[1]} {name} twice"
                meta[name][parts[1]] = parts[3] if len(parts) > 3 else ""
                if parts[1] == "TYPE":
                    assert meta[name]["TYPE"] in ("gauge", "counter", "untyped")
            continue
        m = _NAME.match(line)
        assert m, line
        name, i = m.group(), m.end()
        labels: dict[str, str] = {}
        if line[i] == "{":
            labels, i = _labels(line, i + 1)
        assert line[i] == " ", line
        fields = line[i + 1 :].split(" ")
        assert 1 <= len(fields) <= 2 and _VALUE.fullmatch(fields[0]), line
        if name != current:
            assert name not in done, f"{name}: samples not in one group"
            if current is not None:
                done.add(current)
            current = name
        key = (name, frozenset(labels.items()))
        assert key not in samples, f"series twice: {line}"
        samples[key] = float(fields[0])
    return samples, {n: (d.get("HELP", ""), d.get("TYPE", "")) for n, d in meta.items()}


def family(samples: dict[Series, float], name: str, run: str, key: str) -> dict[str, float]:
    """One family's samples of one run, by the value of label ``key``."""
    out = {}
    for (n, labels), v in samples.items():
        d = dict(labels)
        if n == name and d["run"] == run:
            out[d[key]] = v
    return out


def value(samples: dict[Series, float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


@pytest.mark.parametrize(
    "bad",
    [
        'a{run="x"} 1\na{run="x"} 2\n',  # a series twice
        "a 1\nb 1\na 2\n",  # a family in two groups
        'a{run="x\\q"} 1\n',  # an escape the format does not have
        "a 1\n# TYPE a gauge\n",  # TYPE after the samples
        "a one\n",  # not a number
        "a 1",  # no final newline
    ],
)
def test_the_parser_is_strict(bad: str) -> None:
    with pytest.raises(AssertionError):
        parse(bad)


@pytest.fixture(scope="module")
def nan_diag() -> Diagnosis:
    return analyze(ROOT / "sample_runs" / "nan")


@pytest.fixture(scope="module")
def jump_diag() -> Diagnosis:
    return analyze(ROOT / "sample_runs" / "param_norm_jump")


def _expected_lights(diag: Diagnosis) -> dict[str, int]:
    """Each sign's light computed here from the findings, independently of the module."""
    lights: dict[str, int] = {}
    for f in diag.findings:
        signs = [f.metric or "job"]
        m = f.measures
        if f.kind.value == "divergence" and (
            m["grad_norm_ratio"] is not None or m["grad_norm_late_ratio"] is not None
        ):
            signs.append("grad_norm")  # (the loss and the grad norm climbing together)
        rank = {"info": 0, "warning": 1, "critical": 2, "fatal": 3}[f.severity.value]
        for sign in signs:
            lights[sign] = max(lights.get(sign, 0), rank)
    return lights


@pytest.mark.parametrize("which", ["nan", "param_norm_jump", "truncated_log", "healthy"])
def test_lights_and_vitals_of_a_real_run_match_its_findings(
    which: str, nan_diag: Diagnosis, jump_diag: Diagnosis
) -> None:
    # truncated_log: a run-level note (no metric) lights the "job" sign green.
    others = {"nan": nan_diag, "param_norm_jump": jump_diag}
    diag = others.get(which) or analyze(ROOT / "sample_runs" / which)
    samples, meta = parse(Exposition().update(which, diag))
    assert set(meta) == set(FAMILIES)
    assert all(t == "gauge" and h for h, t in meta.values())
    assert value(samples, "forensics_up", run=which) == 1
    assert value(samples, "forensics_last_step", run=which) == diag.run.last_step
    verdict = {"healthy": 0, "warning": 1, "critical": 2, "fatal": 3}[diag.verdict]
    assert value(samples, "forensics_verdict", run=which) == verdict

    lights = family(samples, "forensics_light", which, "sign")
    expected = _expected_lights(diag)
    assert {s: lights[s] for s in expected} == expected
    assert all(v == 0 for s, v in lights.items() if s not in expected)

    vitals = family(samples, "forensics_vital", which, "sign")
    steps = family(samples, "forensics_vital_step", which, "sign")
    logged = {m for m in diag.run.metrics() if m not in PER_LAYER}
    assert set(vitals) == set(steps) == logged
    assert set(vitals) <= set(lights)  # every vital sign has a light, green when no finding
    for sign in logged:
        s = diag.run.series(sign)
        last = s.get_column("value").to_list()[-1]
        assert steps[sign] == s.get_column("step").to_list()[-1]
        assert (math.isnan(last) and math.isnan(vitals[sign])) or vitals[sign] == last

    if which == "truncated_log":
        assert lights["job"] == 0
    if which == "healthy":
        assert diag.verdict == "healthy" and set(lights.values()) == {0}

    counts = family(samples, "forensics_findings", which, "severity")
    assert counts == {
        sev.value: float(sum(f.severity is sev for f in diag.findings)) for sev in Severity
    }


def test_nan_run_shows_a_red_loss_and_a_nan_value(nan_diag: Diagnosis) -> None:
    samples, _ = parse(Exposition().update("nan", nan_diag))
    assert value(samples, "forensics_light", run="nan", sign="loss") == 3
    assert math.isnan(value(samples, "forensics_vital", run="nan", sign="loss"))
    # Red: the divergence into the NaN is the loss and the grad norm climbing together.
    assert value(samples, "forensics_light", run="nan", sign="grad_norm") == 3
    assert value(samples, "forensics_light", run="nan", sign="lr") == 0


def test_param_norm_jump_lights_param_norm(jump_diag: Diagnosis) -> None:
    samples, _ = parse(Exposition().update("jump", jump_diag))
    worst = max(
        (f.severity.rank for f in jump_diag.findings if f.metric == "param_norm"), default=None
    )
    assert worst is not None and worst >= 1
    assert value(samples, "forensics_light", run="jump", sign="param_norm") == worst


def test_several_runs_share_each_family_once(nan_diag: Diagnosis, jump_diag: Diagnosis) -> None:
    expo = Exposition()
    expo.update("b-run", nan_diag)
    expo.update("a-run", jump_diag)
    text = expo.update("b-run", nan_diag)  # an update replaces the run's samples
    samples, meta = parse(text)
    assert text.count("# TYPE forensics_light gauge") == 1
    assert {dict(k[1])["run"] for k in samples} == {"a-run", "b-run"}
    assert value(samples, "forensics_light", run="b-run", sign="loss") == 3


def test_label_values_are_escaped_and_parse_back(nan_diag: Diagnosis) -> None:
    name = 'runs/exp "7" \\ retry\nsecond line'
    samples, _ = parse(Exposition().update(name, nan_diag))
    assert value(samples, "forensics_up", run=name) == 1
    assert value(samples, "forensics_light", run=name, sign="loss") == 3


def test_run_without_a_diagnosis_is_down() -> None:
    samples, meta = parse(Exposition().update("waiting", None))
    assert value(samples, "forensics_up", run="waiting") == 0
    assert set(meta) == {"forensics_up", "forensics_updated_timestamp_seconds"}


def test_values_are_spelled_as_the_format_wants() -> None:
    assert [format_value(v) for v in (3.0, 0.5, -2.0, float("nan"))] == ["3", "0.5", "-2", "NaN"]
    assert format_value(float("inf")) == "+Inf" and format_value(float("-inf")) == "-Inf"
    assert format_value(1e-12) == "1e-12" and float(format_value(1 / 3)) == 1 / 3
    assert format_value(2.0**60) == str(2.0**60)


# -- the textfile collector's file ---------------------------------------------------------------
def test_textfile_is_written_atomically_and_replaced(tmp_path: Path, nan_diag: Diagnosis) -> None:
    path = tmp_path / "textfile" / "forensics.prom"
    out = PrometheusTextfile(path)
    out.update("nan", None)
    first, _ = parse(path.read_text(encoding="utf-8"))
    assert value(first, "forensics_up", run="nan") == 0
    out.update("nan", nan_diag)
    samples, _ = parse(path.read_text(encoding="utf-8"))
    assert value(samples, "forensics_up", run="nan") == 1
    assert value(samples, "forensics_light", run="nan", sign="loss") == 3
    assert os.listdir(path.parent) == ["forensics.prom"]  # no temporary file left behind


def test_textfile_must_be_a_prom_file(tmp_path: Path) -> None:
    with pytest.raises(ForensicsError, match=r"only \*\.prom files"):
        PrometheusTextfile(tmp_path / "metrics.txt")


def test_textfile_in_an_unwritable_place_is_a_one_line_error(
    tmp_path: Path, nan_diag: Diagnosis
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = PrometheusTextfile(blocker / "forensics.prom")  # its folder is a file
    with pytest.raises(ForensicsError, match="cannot write"):
        out.update("nan", nan_diag)


# -- the HTTP endpoint ----------------------------------------------------------------------------
def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.headers["Content-Type"], resp.read().decode("utf-8")


def test_server_serves_metrics_and_swaps_them(nan_diag: Diagnosis, jump_diag: Diagnosis) -> None:
    with PrometheusServer(0) as server:
        assert server.port > 0
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        status, ctype, body = _get(server.url)
        assert (status, ctype, body) == (200, CONTENT_TYPE, "")  # nothing updated yet
        server.update("nan", nan_diag)
        status, ctype, body = _get(server.url)
        samples, _ = parse(body)
        assert value(samples, "forensics_light", run="nan", sign="loss") == 3
        server.update("nan", jump_diag)  # the same run, polled again: the text is swapped
        samples, _ = parse(_get(server.url + "?x=1")[2])
        expected = _expected_lights(jump_diag)
        assert value(samples, "forensics_light", run="nan", sign="loss") == expected.get("loss", 0)
        with pytest.raises(urllib.error.HTTPError) as err:
            _get(f"http://127.0.0.1:{server.port}/other")
        assert err.value.code == 404
        req = urllib.request.Request(server.url, method="HEAD")
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200 and resp.read() == b""
            assert int(resp.headers["Content-Length"]) > 0
    # Closed: the port is released and nothing answers.
    with pytest.raises(urllib.error.URLError):
        _get(server.url)
    server.close()  # twice is fine


def test_server_survives_a_scraper_that_hangs_up(nan_diag: Diagnosis) -> None:
    with PrometheusServer(0) as server:
        server.update("nan", nan_diag)
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(b"GET /metr")  # half a request, then gone
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(b"garbage\r\n\r\n")
            s.recv(1024)
        assert _get(server.url)[0] == 200


def test_server_port_in_use_is_a_one_line_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ForensicsError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            PrometheusServer(port)
    with pytest.raises(ForensicsError, match="cannot serve metrics"):
        PrometheusServer(70000)


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6")
def test_server_on_ipv6_loopback(nan_diag: Diagnosis) -> None:
    try:
        server = PrometheusServer(0, host="::1")
    except ForensicsError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    with server:
        server.update("nan", nan_diag)
        assert server.url.startswith("http://[::1]:")
        assert _get(server.url)[0] == 200


# -- --prometheus FILE|:PORT -------------------------------------------------------------------
def test_open_prometheus_picks_the_output(tmp_path: Path, nan_diag: Diagnosis) -> None:
    out = open_prometheus(str(tmp_path / "watch.prom"))
    assert isinstance(out, PrometheusTextfile)
    out.update("nan", nan_diag)
    out.close()
    assert (tmp_path / "watch.prom").exists()
    with socket.socket() as s:  # a port that is free now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for spec in (f":{port}", f"127.0.0.1:{port}"):
        server = open_prometheus(spec)
        try:
            assert isinstance(server, PrometheusServer)
            assert (server.host, server.port) == ("127.0.0.1", port)
            server.update("nan", nan_diag)
            samples, _ = parse(_get(server.url)[2])
            assert value(samples, "forensics_up", run="nan") == 1
        finally:
            server.close()


@pytest.mark.parametrize("spec", ["metrics.txt", "9100", ":", ":99999", "host:port", "a:b:9100"])
def test_open_prometheus_refuses_other_specs(spec: str) -> None:
    with pytest.raises(ForensicsError, match="--prometheus"):
        open_prometheus(spec)
