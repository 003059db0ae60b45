"""Print how today's findings differ from tests/golden/findings.json, one line per change.

python scripts/golden_diff.py [TARGET_SUBSTRING ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import golden_findings  # noqa: E402


def _key(f: dict) -> tuple:
    return (f.get("kind"), f.get("metric"), (f.get("steps") or [None])[0])


def main(filters: list[str]) -> int:
    golden = json.loads((ROOT / "tests" / "golden" / "findings.json").read_text())
    changes = 0
    for name, path in golden_findings.targets():
        if filters and not any(x in name for x in filters):
            continue
        now = json.loads(json.dumps(golden_findings.job_findings(path)))
        before = golden.get(name, {})
        for job in sorted(set(now) | set(before)):
            a = {_key(f): f for f in before.get(job, [])}
            b = {_key(f): f for f in now.get(job, [])}
            where = name if job == "." else f"{name}/{job}"
            for k in sorted(set(a) | set(b), key=str):
                fa, fb = a.get(k), b.get(k)
                if fa == fb:
                    continue
                changes += 1
                if fa is None or fb is None:
                    sign, f = ("+", fb) if fa is None else ("-", fa)
                    print(
                        f"{sign} {where}: {f.get('kind')} {f.get('severity')}"
                        f" steps {f.get('steps')}"
                    )
                    continue
                diffs = [
                    f"{k2}: {fa[k2]} -> {fb[k2]}"
                    for k2 in ("severity", "steps")
                    if fa[k2] != fb[k2]
                ]
                ma, mb = fa["measures"], fb["measures"]
                diffs += [
                    f"{m}: {ma.get(m)} -> {mb.get(m)}"
                    for m in sorted(set(ma) | set(mb))
                    if ma.get(m) != mb.get(m)
                ]
                print(f"~ {where}: {fa['kind']} at {fa['steps'][0]}: " + "; ".join(diffs))
    print(f"{changes} change(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
