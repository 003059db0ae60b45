"""Notebook display (issue 19): a diagnosis shows itself in Jupyter; the frame as polars, pandas."""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest
from conftest import ROOT, write_tb_run

import forensics
from forensics import notebook
from forensics.schema import COLUMNS

SAMPLES = ROOT / "sample_runs"


class _Tree(HTMLParser):
    """Collects what the tests look at: elements with their attributes, texts and scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.text: list[str] = []
        self._script: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))
        if tag == "script":
            self._script = dict(attrs)
            self.scripts.append((self._script, ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._script = None

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)
        else:
            self.text.append(data)

    def find(self, tag: str, **attrs: str) -> list[dict[str, str | None]]:
        return [
            a
            for t, a in self.elements
            if t == tag and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]


def _parse(html: str) -> _Tree:
    tree = _Tree()
    tree.feed(html)
    tree.close()
    return tree


@pytest.fixture
def fresh_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that has not shown plotly.js yet."""
    monkeypatch.setattr(notebook, "_inlined", False)


def test_repr_html_shows_verdict_findings_and_charts(
    fresh_kernel: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """_repr_html_ holds the verdict, every finding worst first, and a drawable chart per panel."""
    monkeypatch.chdir(tmp_path)
    diag = forensics.analyze(SAMPLES / "param_norm_jump")
    html = diag._repr_html_()
    assert list(tmp_path.iterdir()) == []  # no report file written
    tree = _parse(html)
    (verdict,) = tree.find("div", **{"class": "verdict"})
    assert verdict["data-verdict"] == diag.verdict == "critical"
    rows = tree.find("tr")[1:]  # the header row first
    assert [(r["data-kind"], r["data-severity"]) for r in rows] == [
        (f.kind.value, f.severity.value) for f in diag.ranked()
    ]
    text = " ".join(tree.text)
    for f in diag.findings:
        assert f.summary in text
    panels = tree.find("div", **{"class": "panel"})
    assert [p["data-key"] for p in panels][:2] == ["loss", "grad_norm"]
    figures = [json.loads(t) for a, t in tree.scripts if a.get("type") == "application/json"]
    assert len(figures) == len(panels) and all(f["data"] and "layout" in f for f in figures)
    code = [t for a, t in tree.scripts if "type" not in a]
    assert any("plotly.js v" in t for t in code) and any("Plotly.newPlot" in t for t in code)


def test_plotlyjs_once_per_kernel_then_cdn(fresh_kernel: None) -> None:
    """plotly.js is inlined in the first output only; "cdn" references it instead."""
    diag = forensics.analyze(SAMPLES / "bad_batch")
    first, second = diag._repr_html_(), diag._repr_html_()
    assert "plotly.js v" in first and "plotly.js v" not in second
    assert len(second) < 1_000_000
    cdn = _parse(notebook.diagnosis_html(diag, plotlyjs="cdn"))
    assert any((a.get("src") or "").startswith("https://cdn.plot.ly/") for a, _ in cdn.scripts)
    with pytest.raises(ValueError):
        notebook.diagnosis_html(diag, plotlyjs="bogus")


def test_untrusted_names_are_escaped(fresh_kernel: None, tmp_path: Path) -> None:
    """A tag or run name carrying markup is text in the cell, never markup."""
    run = write_tb_run(tmp_path / "<img src=x onerror=alert(1)>", n=300, tag_prefix="<b>x</b>/")
    html = notebook.diagnosis_html(forensics.analyze(run), plotlyjs="cdn")
    assert "<img" not in html and "<b>x</b>" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_frame_as_polars_arrow_and_pandas() -> None:
    """The run's frame: polars as read, Arrow and pandas with the same rows, NaN apart from null."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    diag = forensics.analyze(SAMPLES / "nan")
    frame = diag.frame
    assert isinstance(frame, pl.DataFrame) and frame is diag.run.frame
    table = diag.to_arrow()
    assert table.num_rows == frame.height and table.column_names == COLUMNS
    df = diag.to_pandas()
    assert list(df.columns) == COLUMNS and len(df) == frame.height
    assert all(isinstance(t, pd.ArrowDtype) for t in df.dtypes)
    n_nan = frame.get_column("value").is_nan().sum()
    assert n_nan > 0
    values = df["value"].to_list()
    assert sum(1 for v in values if isinstance(v, float) and math.isnan(v)) == n_nan
    assert int(df["value"].isna().sum()) == frame.get_column("value").null_count()
    assert df["step"].tolist() == frame.get_column("step").to_list()
    assert diag.run.to_pandas().shape == df.shape
