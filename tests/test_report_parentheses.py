"""A report's sentences never nest a parenthesis in another: a caption or an evidence text
that wraps a part already in parentheses writes it after a comma or a semicolon instead. The
grad-norm chart had read "Baseline 0.4996 (median of 259 points, steps 30-288 (after the LR
warm-up), shaded)", an LR-change cause "(from 0.002414 at step 400 the LR rose to 3.944
(x1,634))", a throughput drop "(... 6,492 tokens/s (tokens/s assumed: ...))". Calls in code
(``.item()``, ``state_dict()``, ``sqrt(lr_baseline / lr)``) are not sentences' parentheses."""

from __future__ import annotations

import html
import re

import pytest
from conftest import ROOT

from forensics.pipeline import analyze
from forensics.report import render_html

_CALL = re.compile(r"\w\(")  # (a call's parenthesis follows a name)


def _nested(text: str) -> list[str]:
    """The stretches of ``text`` where a sentence's parenthesis opens inside another."""
    out: list[str] = []
    stack: list[tuple[bool, int]] = []  # (a call's parenthesis?, where it opened)
    for i, ch in enumerate(text):
        if ch == "(":
            call = i > 0 and bool(_CALL.match(text, i - 1))
            if not call and any(not c for c, _ in stack):
                outer = next(at for c, at in stack if not c)
                out.append(text[max(0, outer - 40) : i + 40])
            stack.append((call, i))
        elif ch == ")" and stack:
            stack.pop()
    return out


@pytest.mark.parametrize("name", ["divergence", "nan", "grad_norm_drift", "memory_growth"])
def test_no_nested_parentheses_in_a_report(name: str) -> None:
    page = render_html(analyze(ROOT / "sample_runs" / name), plotlyjs="cdn")
    page = re.sub(r"<script.*?</script>|<style.*?</style>", " ", page, flags=re.S)
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())
    assert _nested(text) == []


def test_the_check_reads_nesting() -> None:
    assert _nested("a (b (c) d)") == ["a (b (c) d)"]
    assert _nested("a (b, c) d (e)") == []
    assert _nested("(losses kept without .item()), and sqrt(x / y) (a b)") == []
