"""forensics: offline log forensics for large-model training runs.

The pipeline, usable without the CLI::

    import forensics
    run = forensics.read_run("runs/exp42")          # importers -> Run
    findings = forensics.detect(run)                # detectors -> list[Finding]
    diagnosis = forensics.diagnose(run, findings)   # verdict, prescriptions, timeline
    html = forensics.render_html(diagnosis)         # one offline HTML page

or all at once: ``forensics.analyze("runs/exp42")``.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = [
    "Finding",
    "FindingKind",
    "ForensicsError",
    "Run",
    "Severity",
    "analyze",
    "detect",
    "diagnose",
    "read_run",
    "render_html",
]


def __getattr__(name: str) -> Any:
    # Lazy: `import forensics` and `forensics --help` stay fast (polars, plotly load on use).
    if name in ("analyze", "read_run"):
        from forensics import pipeline

        return getattr(pipeline, name)
    if name == "detect":
        from forensics.detectors import detect

        return detect
    if name == "diagnose":
        from forensics.diagnosis import diagnose

        return diagnose
    if name == "render_html":
        from forensics.report import render_html

        return render_html
    if name in ("Finding", "FindingKind", "Severity"):
        from forensics import findings

        return getattr(findings, name)
    if name == "Run":
        from forensics.run import Run

        return Run
    if name == "ForensicsError":
        from forensics.errors import ForensicsError

        return ForensicsError
    raise AttributeError(f"module 'forensics' has no attribute {name!r}")
