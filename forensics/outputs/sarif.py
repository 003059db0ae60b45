"""SARIF 2.1.0 for code scanning (GitHub, GitLab, Azure DevOps read it).

One SARIF run per analysed job, one result per finding. The rule is the finding kind (its
help is the prescription table's entry), the level follows the severity (fatal and critical
are ``error``, warning is ``warning``, info is ``note``), the location is the log file that
holds the series the finding is about, and the message starts with the step. With a line
number where the format has one (text logs, JSONL, Lightning CSV), the location points at
the logged line.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import polars as pl

from forensics.outputs import log_file_for

if TYPE_CHECKING:
    from forensics.diagnosis import Diagnosis
    from forensics.findings import Finding

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = (
    "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
)
LEVELS = {"fatal": "error", "critical": "error", "warning": "warning", "info": "note"}
# Sources whose record_idx is a line number of the file (text logs are "<family>_text").
_LINE_NUMBERED = {"jsonl", "lightning_csv"}


def _line_numbered(source: str) -> bool:
    return source in _LINE_NUMBERED or source.endswith("_text")


def _uri(path: Path, base: Path, run: object = None) -> str:
    """A relative URI when the file lies under ``base`` (the repository checkout in CI), the
    object's URL for a run read from object storage, else an absolute file URI."""
    path = path.resolve()
    url = getattr(run, "metadata", {}).get("url")
    if isinstance(url, str):
        root = Path(getattr(run, "path", path)).resolve()
        if root.is_file():
            return url if root == path else f"{url.rsplit('/', 1)[0]}/{quote(path.name)}"
        try:
            return f"{url.rstrip('/')}/{quote(path.relative_to(root).as_posix())}"
        except ValueError:
            pass
    try:
        return quote(path.relative_to(base.resolve()).as_posix())
    except ValueError:
        return path.as_uri()


def _where(diag: Diagnosis, f: Finding) -> tuple[str | None, int | None]:
    """(file relative to the run's root, line) of the series a finding is about."""
    run = diag.run
    measured = f.measures.get("file")
    if isinstance(measured, str) and measured:
        line = f.measures.get("line")
        return measured, line if isinstance(line, int) and not isinstance(line, bool) else None
    if f.metric is None:
        return None, None
    # The full frame: the analysis view keeps only the columns the detectors read.
    rows = run.frame.filter(pl.col("metric") == f.metric)
    tag = run.metrics().get(f.metric)
    if tag is not None and rows.filter(pl.col("tag") == tag).height:
        rows = rows.filter(pl.col("tag") == tag)
    if rows.is_empty():
        return None, None
    rows = rows.with_columns((pl.col("step") - f.start_step).abs().alias("_d")).sort("_d")
    row = rows.row(0, named=True)
    line = row["record_idx"] if _line_numbered(row["source"]) else None
    return row["file"], int(line) if line is not None else None


def _default_file(diag: Diagnosis) -> str | None:
    sources = diag.run.metadata.get("sources") or {}
    for files in sources.values():
        if files:
            return str(files[0])
    return None


def _fingerprint(run_name: str, f: Finding) -> str:
    key = f"{run_name}\0{f.kind.value}\0{f.metric}\0{f.start_step}\0{f.measures.get('layer')}"
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def _rule(kind: str) -> dict[str, Any]:
    """A reporting descriptor for a finding kind, worded from the prescription table."""
    from forensics.findings import FindingKind
    from forensics.prescriptions import TABLE

    entry = TABLE.get(FindingKind(kind))
    symptom = getattr(entry, "symptom", None)
    causes = getattr(entry, "causes", ()) or ()
    treatment = getattr(entry, "treatment", None)
    rule: dict[str, Any] = {
        "id": kind,
        "name": "".join(p.capitalize() for p in kind.split("_")),
        "shortDescription": {"text": kind.replace("_", " ")},
        "properties": {"tags": ["training-run", "forensics"]},
    }
    if symptom:
        rule["fullDescription"] = {"text": str(symptom)}
    help_parts = []
    if causes:
        help_parts.append("Likely causes: " + " ".join(str(c) for c in causes))
    if treatment:
        help_parts.append("Treatment: " + str(treatment))
    if help_parts:
        rule["help"] = {"text": "\n".join(help_parts)}
    return rule


def sarif_run(diag: Diagnosis, *, base: Path | None = None) -> dict[str, Any]:
    """One SARIF ``run`` object for a diagnosis (every finding, info notes included)."""
    from forensics import __version__

    base = base or Path.cwd()
    run = diag.run
    kinds = list(dict.fromkeys(f.kind.value for f in diag.findings))
    fallback = _default_file(diag)
    results = []
    artifacts: dict[str, int] = {}
    for f, rx in zip(diag.findings, diag.prescriptions, strict=False):
        rel_file, line = _where(diag, f)
        # Code scanning wants a location on every result: the run's own path at worst.
        path = log_file_for(run, rel_file or fallback) or Path(run.path)
        step = f"step {f.start_step:,}"
        if f.end_step is not None and f.end_step != f.start_step:
            step = f"steps {f.start_step:,}-{f.end_step:,}"
        text = f"{run.name}, {step}: {f.summary}"
        if rx:
            text += f" Prescription: {rx}"
        result: dict[str, Any] = {
            "ruleId": f.kind.value,
            "ruleIndex": kinds.index(f.kind.value),
            "level": LEVELS[f.severity.value],
            "message": {"text": text},
            "partialFingerprints": {"forensicsFinding/v1": _fingerprint(run.name, f)},
            "properties": {
                "severity": f.severity.value,
                "run": run.name,
                "metric": f.metric,
                "start_step": f.start_step,
                "peak_step": f.peak_step,
                "end_step": f.end_step,
                "measures": dict(f.measures),
            },
        }
        if path is not None:
            uri = _uri(path, base, run)
            idx = artifacts.setdefault(uri, len(artifacts))
            physical: dict[str, Any] = {"artifactLocation": {"uri": uri, "index": idx}}
            if line is not None and line >= 1:
                physical["region"] = {"startLine": line}
            result["locations"] = [
                {
                    "physicalLocation": physical,
                    "logicalLocations": [
                        {
                            "name": f.metric or "run",
                            "fullyQualifiedName": f"{run.name}/{f.metric or 'run'}",
                        }
                    ],
                }
            ]
        results.append(result)
    out: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "forensics",
                "version": __version__,
                "semanticVersion": __version__,
                "rules": [_rule(k) for k in kinds],
            }
        },
        "automationDetails": {"id": f"forensics/{run.name}/"},
        "artifacts": [{"location": {"uri": uri}, "roles": ["analysisTarget"]} for uri in artifacts],
        "results": results,
        "properties": {
            "verdict": diag.verdict,
            "format": run.format,
            "first_step": run.first_step,
            "last_step": run.last_step,
        },
    }
    return out


def sarif_log(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The SARIF log around one or more runs."""
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": runs}


def sarif_text(runs: list[dict[str, Any]]) -> str:
    from forensics.outputs.json_text import dumps_indented

    return dumps_indented(sarif_log(runs)) + "\n"
