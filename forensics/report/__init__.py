"""The HTML report: Jinja templates and plotly figures (see :mod:`forensics.report.render`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from forensics.diagnosis import Diagnosis

__all__ = ["render_html"]


def render_html(diagnosis: Diagnosis, *, plotlyjs: str = "inline", redact: bool = False) -> str:
    """The report as one HTML page; see :func:`forensics.report.render.render_html`."""
    from forensics.report.render import render_html as _render

    return _render(diagnosis, plotlyjs=plotlyjs, redact=redact)
