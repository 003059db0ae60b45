"""Build the README's measures reference from forensics/measures.py.

One table per finding kind, in FindingKind order: key, type (with null and the fixed values
where there are any) and meaning. `tests/test_readme.py` checks that the README holds exactly
this text between the markers, so the reference cannot drift from the declaration.

    python scripts/measures_reference.py          # print the section
    python scripts/measures_reference.py --write  # update README.md between the markers
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- MEASURES:BEGIN -->", "<!-- MEASURES:END -->"
ROOT = Path(__file__).resolve().parents[1]


def type_text(m: Any) -> str:
    """`int`, `float or null`, `str: a, b`: the type column of one measure."""
    text = m.type.__name__
    if m.null:
        text += " or null"
    if m.values:
        text += ": " + ", ".join(f"`{v}`" for v in m.values)
    return text


def render() -> str:
    from forensics.findings import FindingKind
    from forensics.measures import MEASURES

    parts = [BEGIN, ""]
    for kind in FindingKind:
        parts += [f"#### `{kind.value}`", "", "| key | type | meaning |", "|---|---|---|"]
        parts += [f"| `{m.key}` | {type_text(m)} | {m.meaning} |" for m in MEASURES[kind.value]]
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
