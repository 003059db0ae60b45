"""Build the README's measures reference from the tables in the detector and findings docstrings.

Every module that produces findings documents, in its docstring, the ``measures`` keys of its
kinds as Markdown tables (``| key | meaning |``) introduced by a line naming the kind in double
backticks. This script collects them in FindingKind order; `tests/test_readme.py` checks that
the README holds exactly this text, so the reference cannot drift from the code.

    python scripts/measures_reference.py          # print the section
    python scripts/measures_reference.py --write  # update README.md between the markers
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

BEGIN, END = "<!-- MEASURES:BEGIN -->", "<!-- MEASURES:END -->"
ROOT = Path(__file__).resolve().parents[1]
_KIND = re.compile(r"``([a-z_]+)``")


def _modules() -> list[str]:
    from forensics.detectors import REGISTRY

    return ["forensics.findings"] + [
        f"forensics.detectors.{v.split(':')[0]}" for v in REGISTRY.values()
    ]


def collect() -> dict[str, list[tuple[str, str]]]:
    """kind -> [(key, meaning)] from every module's docstring tables."""
    from forensics.findings import FindingKind

    kinds = {k.value for k in FindingKind}
    out: dict[str, list[tuple[str, str]]] = {}
    for name in dict.fromkeys(_modules()):
        doc = importlib.import_module(name).__doc__ or ""
        lines = doc.splitlines()
        i = 0
        while i < len(lines):
            if re.match(r"^\|\s*key\s*\|\s*meaning\s*\|", lines[i]):
                # The kind: the first known kind named on the nearest line above that names one.
                kind = None
                for j in range(i - 1, -1, -1):
                    named = [k for k in _KIND.findall(lines[j]) if k in kinds]
                    if named:
                        kind = named[0]
                        break
                rows = []
                i += 1
                while i < len(lines) and lines[i].startswith("|"):
                    cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                    if len(cells) >= 2 and not set(cells[0]) <= {"-", ":", " "}:
                        rows.append((cells[0].strip("`"), " | ".join(cells[1:])))
                    i += 1
                if kind is None:
                    raise SystemExit(f"{name}: a measures table names no finding kind above it")
                if kind == "loss_spike":  # rows marked *gn* belong to grad_norm_spike only
                    out.setdefault("loss_spike", []).extend(r for r in rows if "*gn*" not in r[1])
                    out.setdefault("grad_norm_spike", []).extend(
                        (k, m.replace("*gn*: ", "").replace("*gn*", ""))
                        for k, m in rows
                        if not m.startswith("loss only")
                    )
                else:
                    out.setdefault(kind, []).extend(rows)
            else:
                i += 1
    return out


def render() -> str:
    from forensics.findings import FindingKind

    tables = collect()
    parts = [BEGIN, ""]
    for kind in FindingKind:
        rows = tables.get(kind.value)
        parts.append(f"#### `{kind.value}`")
        parts.append("")
        if not rows:
            parts.append("(no measures documented)")
        else:
            parts.append("| key | meaning |")
            parts.append("|---|---|")
            seen = set()
            for k, m in rows:
                if k in seen:
                    continue
                seen.add(k)
                parts.append(f"| `{k}` | {m} |")
        parts.append("")
    parts.append(END)
    return "\n".join(parts)


def readme_section(text: str) -> str:
    a, b = text.index(BEGIN), text.index(END) + len(END)
    return text[a:b]


if __name__ == "__main__":
    section = render()
    if "--write" in sys.argv:
        readme = ROOT / "README.md"
        text = readme.read_text(encoding="utf-8")
        readme.write_text(text.replace(readme_section(text), section), encoding="utf-8")
    else:
        print(section)
