"""JUnit XML for CI test tabs (GitLab, Jenkins, Azure DevOps, GitHub test reporters).

One ``<testsuite>`` per analysed job and one ``<testcase>`` per vital sign the run logged
(``loss``, ``grad_norm``, ``val_loss``...), plus ``run`` for run-level findings (restart,
crash, stall, truncated log). A test case fails when one of its findings is at or above the
``--fail-on`` threshold (``warning`` when none is set); findings below it are listed in the
case's ``system-out``. The article's vital signs the run did not log are skipped cases, so a
CI tab shows what was not checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from xml.etree import ElementTree as ET

if TYPE_CHECKING:
    from forensics.diagnosis import Diagnosis
    from forensics.findings import Finding

RANK = {"info": 0, "warning": 1, "critical": 2, "fatal": 3}
RUN_CASE = "run"
DEFAULT_FAIL_ON = "warning"


def _line(f: Finding) -> str:
    span = f"step {f.start_step:,}"
    if f.end_step is not None and f.end_step != f.start_step:
        span = f"steps {f.start_step:,}-{f.end_step:,}"
    return f"[{f.severity.value}] {f.kind.value} at {span}: {f.summary}"


def _xml_text(text: str) -> str:
    """Strip the characters XML 1.0 cannot hold (a log file can contain anything)."""
    return "".join(
        ch
        for ch in text
        if ch in "\t\n\r"
        or 0x20 <= ord(ch) <= 0xD7FF
        or 0xE000 <= ord(ch) <= 0xFFFD
        or 0x10000 <= ord(ch) <= 0x10FFFF
    )


def junit_suite(diag: Diagnosis, *, fail_on: str | None = None) -> ET.Element:
    """One ``<testsuite>`` for a diagnosis."""
    threshold = RANK[fail_on or DEFAULT_FAIL_ON]
    run = diag.run
    by_sign: dict[str, list[Finding]] = {}
    for sign in run.metrics():
        by_sign[sign] = []
    for f in diag.findings:
        by_sign.setdefault(f.metric or RUN_CASE, []).append(f)
    by_sign.setdefault(RUN_CASE, [])
    not_logged = [m for c in diag.coverage if not c.logged for m in c.metrics if m not in by_sign]
    suite = ET.Element("testsuite", name=_xml_text(run.name))
    props = ET.SubElement(suite, "properties")
    for key, value in (
        ("verdict", diag.verdict),
        ("format", run.format),
        ("path", str(run.path)),
        ("first_step", str(run.first_step)),
        ("last_step", str(run.last_step)),
        ("fail_on", fail_on or DEFAULT_FAIL_ON),
    ):
        ET.SubElement(props, "property", name=key, value=_xml_text(value))
    classname = f"forensics.{_xml_text(run.name)}"
    failures = skipped = 0
    for sign, findings in by_sign.items():
        case = ET.SubElement(suite, "testcase", name=_xml_text(sign), classname=classname)
        failing = [f for f in findings if RANK[f.severity.value] >= threshold]
        if failing:
            failures += 1
            worst = max(failing, key=lambda f: RANK[f.severity.value])
            fail = ET.SubElement(
                case,
                "failure",
                type=worst.kind.value,
                message=_xml_text(f"{worst.severity.value}: {worst.summary}"),
            )
            fail.text = _xml_text("\n".join(_line(f) for f in failing))
        rest = [f for f in findings if f not in failing]
        if rest:
            out = ET.SubElement(case, "system-out")
            out.text = _xml_text("\n".join(_line(f) for f in rest))
    for sign in dict.fromkeys(not_logged):
        case = ET.SubElement(suite, "testcase", name=_xml_text(sign), classname=classname)
        ET.SubElement(case, "skipped", message="not logged by this run")
        skipped += 1
    suite.set("tests", str(len(by_sign) + skipped))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", str(skipped))
    return suite


def junit_text(suites: list[ET.Element]) -> str:
    """The JUnit document: ``<testsuites>`` around every job's suite."""
    root = ET.Element("testsuites", name="forensics")
    for key in ("tests", "failures", "errors"):
        root.set(key, str(sum(int(s.get(key, "0")) for s in suites)))
    root.extend(suites)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
