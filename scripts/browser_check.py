#!/usr/bin/env python3
"""Load forensics HTML reports in headless Chromium: every chart rendered, no console errors.

Usage:
    python scripts/browser_check.py REPORT.html [REPORT2.html ...] [--screenshot OUT.png]
        [--install]

Needs the Debian package ``chromium`` (``apt-get update && apt-get install -y chromium``);
``--install`` runs that command first when no browser is found (as root, e.g. in CI).
Each report is loaded twice from a fresh profile: once with ``--dump-dom`` (the page writes
``data-charts-rendered`` / ``data-charts-total`` / ``data-chart-errors`` on <html> once plotly
has drawn), with console messages logged to stderr; once to take a screenshot. Exit code 0
when every report passes, 1 when one fails, 2 when no browser is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Flags for a quiet, network-free headless run; --no-sandbox is required as root.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--hide-scrollbars",
    "--mute-audio",
    "--virtual-time-budget=20000",
    "--enable-unsafe-swiftshader",
]
_CONSOLE = re.compile(r"CONSOLE\(\d+\)\]|:CONSOLE:|Uncaught ", re.I)
# The software GL of a GPU-less headless browser reports its own slow paths on WebGL charts
# (plotly draws long series with WebGL): notices of the machine, not messages of the page.
# (--enable-unsafe-swiftshader above opts in to that software GL without its deprecation
# notice.)
_GL_NOTICE = re.compile(r"GL Driver Message \(OpenGL, Performance")


def find_browser() -> str | None:
    """The first Chromium-like executable on PATH (or $CHROMIUM), None when there is none."""
    env = os.environ.get("CHROMIUM")
    if env and shutil.which(env):
        return shutil.which(env)
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def install() -> None:
    """Install Debian's chromium package (needs root and the network)."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["apt-get", "install", "-y", "chromium"], check=True, env=env, stdout=subprocess.DEVNULL
    )


class _RootAttrs(HTMLParser):
    """Read the data-* attributes of <html> and count chart containers that plotly filled."""

    def __init__(self) -> None:
        super().__init__()
        self.root: dict[str, str] = {}
        self.charts = 0
        self.plotted = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "html":
            self.root = a
        cls = a.get("class", "").split()
        if tag == "div" and "chart" in cls:
            self.charts += 1
        if tag == "div" and "plot-container" in cls:
            self.plotted += 1


def _run(browser: str, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="forensics-chromium-") as profile:
        cmd = [browser, *FLAGS, f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def check_report(
    report: Path,
    screenshot: Path | None = None,
    *,
    browser: str | None = None,
    timeout: float = 120.0,
) -> dict[str, object]:
    """Load one report; return what was seen (``ok`` is the verdict)."""
    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError(
            "no chromium found; install it with: apt-get update && apt-get install -y chromium"
        )
    url = report.resolve().as_uri()
    proc = _run(browser, ["--enable-logging=stderr", "--v=0", "--dump-dom", url], timeout)
    parser = _RootAttrs()
    parser.feed(proc.stdout)
    console = [
        line.strip()
        for line in proc.stderr.splitlines()
        if _CONSOLE.search(line) and not _GL_NOTICE.search(line)
    ]
    total = int(parser.root.get("data-charts-total", "-1") or -1)
    rendered = int(parser.root.get("data-charts-rendered", "-1") or -1)
    errors = parser.root.get("data-chart-errors", "")
    result: dict[str, object] = {
        "report": str(report),
        "charts": parser.charts,
        "charts_total": total,
        "charts_rendered": rendered,
        "plot_containers": parser.plotted,
        "page_errors": errors,
        "console": console,
        "returncode": proc.returncode,
    }
    if screenshot is not None:
        shot = _run(
            browser,
            ["--window-size=1280,2400", f"--screenshot={screenshot.resolve()}", url],
            timeout,
        )
        result["screenshot"] = (
            str(screenshot) if screenshot.exists() else f"failed: {shot.stderr[-300:]}"
        )
    result["ok"] = bool(
        proc.returncode == 0
        and parser.charts > 0
        and total == parser.charts
        and rendered == total
        and parser.plotted == total
        and not errors
        and not console
    )
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument(
        "--screenshot", type=Path, help="PNG of the first report (first screenful of 1280x2400)"
    )
    ap.add_argument(
        "--install", action="store_true", help="apt-get install chromium when it is missing"
    )
    ns = ap.parse_args(argv)
    if find_browser() is None and ns.install:
        install()
    if find_browser() is None:
        print(
            "browser_check: no chromium on PATH; apt-get update && apt-get install -y chromium",
            file=sys.stderr,
        )
        return 2
    ok = True
    for i, rep in enumerate(ns.reports):
        res = check_report(rep, ns.screenshot if i == 0 else None)
        print(json.dumps(res, indent=2))
        ok = ok and bool(res["ok"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
