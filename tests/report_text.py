"""Read a rendered report as its reader does: a finding's card as plain text."""

from __future__ import annotations

import html
import re

from forensics.diagnosis import Diagnosis


def card_texts(diag: Diagnosis, kind: str) -> list[str]:
    """The text of each card of finding ``kind`` in the report of ``diag`` (tags stripped,
    entities read, whitespace collapsed), in page order."""
    from forensics.report import render_html

    page = render_html(diag, plotlyjs="cdn")
    cards = re.findall(
        rf'<article class="card finding [^"]*"[^>]*data-kind="{kind}".*?</article>', page, re.S
    )
    return [html.unescape(" ".join(re.sub(r"<[^>]+>", " ", c).split())) for c in cards]
