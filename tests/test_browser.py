"""The report in a real browser: headless Chromium renders every chart with no console error.

Skipped when no Chromium is installed (Debian: ``apt-get update && apt-get install -y chromium``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from test_report import _evil_run, full_run

from forensics.diagnosis import diagnose
from forensics.report import render_html

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.browser


def _checker():
    spec = importlib.util.spec_from_file_location(
        "browser_check", ROOT / "scripts" / "browser_check.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if mod.find_browser() is None:
        pytest.skip(
            "no chromium on PATH; install it with: apt-get update && apt-get install -y chromium"
        )
    return mod


def test_full_report_renders_in_chromium(tmp_path: Path) -> None:
    """Every panel of a full offline report is drawn by plotly, no console message, screenshot
    taken."""
    bc = _checker()
    run, fs = full_run()
    page = tmp_path / "full.html"
    page.write_text(render_html(diagnose(run, fs)), encoding="utf-8")
    shot = tmp_path / "full.png"
    res = bc.check_report(page, shot)
    assert res["console"] == [] and res["page_errors"] == ""
    assert res["charts"] == res["charts_rendered"] == res["plot_containers"] == 11
    assert res["ok"] is True
    assert shot.stat().st_size > 20_000
    from PIL import Image

    colours = Image.open(shot).convert("RGB").resize((64, 64)).getcolors(64 * 64)
    assert colours is not None and len(colours) > 20  # not a blank page


def test_hostile_names_stay_inert_in_chromium(tmp_path: Path) -> None:
    """A report whose tags and names hold script tags runs no injected script in the browser."""
    bc = _checker()
    run, fs = _evil_run()
    page = tmp_path / "evil.html"
    page.write_text(render_html(diagnose(run, fs)), encoding="utf-8")
    res = bc.check_report(page)
    assert res["ok"] is True, (
        res
    )  # an executed alert() would be a console/page event or break rendering


def test_checker_catches_a_broken_page(tmp_path: Path) -> None:
    """The check itself fails on a page that throws, so a pass means something."""
    bc = _checker()
    run, fs = full_run(1200)
    text = render_html(diagnose(run, fs)).replace(
        "</body>", "<script>throw new Error('boom')</script></body>"
    )
    page = tmp_path / "broken.html"
    page.write_text(text, encoding="utf-8")
    res = bc.check_report(page)
    assert res["ok"] is False and "boom" in str(res["page_errors"])


def test_compare_page_renders_in_chromium(tmp_path: Path) -> None:
    """The `forensics compare` page of two sample runs draws one chart per shared vital sign."""
    from forensics.compare import compare
    from forensics.report.compare_page import render_compare_html

    bc = _checker()
    cmp = compare([ROOT / "sample_runs" / "healthy", ROOT / "sample_runs" / "grad_norm_drift"])
    page = tmp_path / "compare.html"
    page.write_text(render_compare_html(cmp), encoding="utf-8")
    res = bc.check_report(page, tmp_path / "compare.png")
    assert res["console"] == [] and res["page_errors"] == ""
    assert res["charts"] == res["charts_rendered"] == len(cmp.vitals) >= 6
    assert res["ok"] is True


def test_sweep_index_keeps_names_on_one_line_in_chromium(tmp_path: Path) -> None:
    """A sweep of sample runs whose configs differ in 18 keys (HF Trainer runs beside a W&B
    run): the index squeezed its run column so that each name broke into a letter a line
    ("di / ver / gen / ce/"). The table now scrolls sideways: in a 1280-pixel window every run
    name and every config key keeps to one line."""
    import shutil

    from typer.testing import CliRunner

    from forensics.cli import app

    bc = _checker()
    root = tmp_path / "runs"
    root.mkdir()
    for name in ("late_overfit", "multi_eval_sets", "overfitting", "divergence", "healthy"):
        shutil.copytree(ROOT / "sample_runs" / name, root / name, symlinks=True)
    out = tmp_path / "index.html"
    res = CliRunner().invoke(app, ["sweep", str(root), "--jobs", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    probe = """<script>
    window.addEventListener('load', () => {
      const lines = el => Math.round(el.getBoundingClientRect().height /
                                     parseFloat(getComputedStyle(el).lineHeight));
      const names = [...document.querySelectorAll('#sweep tr.run td:first-child code')];
      const keys = [...document.querySelectorAll('#sweep th code')];
      document.documentElement.dataset.nameLines = Math.max(...names.map(lines));
      document.documentElement.dataset.keyLines = Math.max(...keys.map(lines));
      document.documentElement.dataset.keys = keys.length;
    });
    </script></body>"""
    page = tmp_path / "probe.html"
    page.write_text(out.read_text().replace("</body>", probe), encoding="utf-8")
    browser = bc.find_browser()
    proc = bc._run(browser, ["--window-size=1280,1000", "--dump-dom", page.as_uri()], 120.0)
    parser = bc._RootAttrs()
    parser.feed(proc.stdout)
    assert int(parser.root["data-keys"]) >= 15
    assert parser.root["data-name-lines"] == "1" and parser.root["data-key-lines"] == "1"
