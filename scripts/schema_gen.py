"""Generate the per-kind ``measures`` of the findings JSON Schema from forensics/measures.py.

The rest of forensics/schemas/findings.schema.json is written by hand; this script replaces
``properties.findings.items.allOf`` with one ``if kind == ... then measures ...`` clause per
finding kind: the declared keys with their types, nothing else (``additionalProperties``
false). `tests/test_findings.py` checks that the file holds exactly what this prints.

    python scripts/schema_gen.py          # print the schema
    python scripts/schema_gen.py --write  # update the schema file
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "forensics" / "schemas" / "findings.schema.json"
_JSON_TYPE = {float: "number", int: "integer", str: "string", bool: "boolean"}


def measure_schema(m: Any) -> dict[str, Any]:
    """The JSON Schema of one declared measure."""
    out: dict[str, Any] = {"description": m.meaning}
    if m.values:
        out["enum"] = [*m.values, None] if m.null else list(m.values)
    else:
        t = _JSON_TYPE[m.type]
        out["type"] = [t, "null"] if m.null else t
    return out


def kind_clauses() -> list[dict[str, Any]]:
    """One if/then clause per finding kind, in FindingKind order."""
    from forensics.findings import FindingKind
    from forensics.measures import MEASURES

    clauses = []
    for kind in FindingKind:
        ms = MEASURES[kind.value]
        measures: dict[str, Any] = {
            "type": "object",
            "properties": {m.key: measure_schema(m) for m in ms},
            "additionalProperties": False,
        }
        required = [m.key for m in ms if m.required]
        if required:
            measures["required"] = required
        clauses.append(
            {
                "if": {"properties": {"kind": {"const": kind.value}}},
                "then": {"properties": {"measures": measures}},
            }
        )
    return clauses


def render(current: str | None = None) -> str:
    """The schema file's text with the generated clauses."""
    from forensics.causes import CAUSES
    from forensics.findings import FindingKind

    doc = json.loads(current if current is not None else SCHEMA.read_text(encoding="utf-8"))
    doc["properties"]["findings"]["items"]["allOf"] = kind_clauses()
    # The kinds and cause ids the tool emits: kept from the code, so that a new kind or cause
    # cannot make the published schema reject a document the tool writes.
    doc["properties"]["findings"]["items"]["properties"]["kind"]["enum"] = [
        k.value for k in FindingKind
    ]
    doc["$defs"]["cause"]["properties"]["cause"]["enum"] = list(CAUSES)
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    text = render()
    if "--write" in sys.argv:
        SCHEMA.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
