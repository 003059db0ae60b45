"""Event-dense runs: does any stage's cost grow faster than the points it reads?

``python -m benchmarks.stress [--sizes 100k,1M] [--kinds ...] [--data DIR]``

The suite's runs are calm: a handful of spikes, dips and overflows. A search that scans the
rest of a series at each event costs nothing there and grows with the square of the events
on a run full of them. Each kind below repeats one event all through a JSONL run, at a fixed
interval, so ten times the steps is ten times the events; the import, every detector and
the diagnosis are timed in one process each (CPU seconds, ``benchmarks.probe stages``), and
the exponent of each stage's cost over the sizes is printed. One above
:data:`STEEP` is flagged: 1 is linear.

Kinds:

* ``lr_restarts``: the LR restarts every 300 steps (a cosine with warm restarts)
* ``dips``: throughput falls by half for 20 steps every 250
* ``coupled_spikes``: the grad norm spikes with the loss every 150 steps (a warning each)
* ``loss_spikes``: the loss spikes every 200 steps and comes back
* ``resumes``: the job resumes 100 steps back every 1,000 steps (steps are logged again)
* ``overflows``: the loss scale halves every 100 steps and grows back
* ``stalls``: nothing is logged for 10 minutes every 300 steps (half a second a step; one
  finding of recurring stalls names each)
* ``pauses``: the same with pauses of 2 minutes, each short of a stall (one finding sums them)
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.measure import exponent

STEEP = 1.25  # an exponent above this is flagged
KINDS = (
    "lr_restarts",
    "dips",
    "coupled_spikes",
    "loss_spikes",
    "resumes",
    "overflows",
    "stalls",
    "pauses",
)


def write(folder: Path, kind: str, n: int, seed: int = 0) -> Path:
    """A JSONL run of ``n`` logged steps of one event-dense kind."""
    rng = np.random.default_rng(seed)
    s = np.arange(n)
    loss = 4.0 * (1 + s / 2000) ** -0.3 + 0.01 * rng.standard_normal(n)
    gn = 1.0 + 0.05 * rng.standard_normal(n)
    lr = np.full(n, 3e-4)
    scale = np.full(n, 65536.0)
    tps = 30000 + 300 * rng.standard_normal(n)
    step = s.copy()
    wall = None
    if kind == "lr_restarts":
        lr = 3e-4 * 0.5 * (1 + np.cos(np.pi * (s % 300) / 300))
    elif kind == "dips":
        for k in range(500, n, 250):
            tps[k : k + 20] *= 0.5
    elif kind == "coupled_spikes":
        for k in range(500, n, 150):
            gn[k : k + 5] *= 6
            loss[k + 1 : k + 30] *= 1.3
    elif kind == "loss_spikes":
        for k in range(1000, n, 200):
            loss[k : k + 40] *= 1.6
    elif kind == "resumes":  # row i is logged at step i - 100 * (i // 1000)
        step = s - 100 * (s // 1000)
    elif kind == "overflows":
        for k in range(200, n, 100):
            scale[k:] /= 2
            scale[k + 50 :] *= 2
    elif kind == "stalls":
        wall = 1.7e9 + 0.5 * s + 600.0 * (s // 300)
    elif kind == "pauses":
        wall = 1.7e9 + 0.5 * s + 120.0 * (s // 300)
    else:
        raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "metrics.jsonl"
    with open(path, "w") as fh:
        for i in range(n):
            row = {
                "step": int(step[i]),
                "loss": float(loss[i]),
                "grad_norm": float(gn[i]),
                "lr": float(lr[i]),
                "loss_scale": float(scale[i]),
                "tokens_per_sec": float(tps[i]),
            }
            if wall is not None:
                row["_timestamp"] = float(wall[i])
            fh.write(json.dumps(row) + "\n")
    return folder


def stages(run: Path) -> dict[str, float]:
    """CPU seconds per stage in a fresh process (``benchmarks.probe stages``)."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.probe", "stages", str(run)],
        capture_output=True,
        text=True,
        check=True,
        env=None,
    ).stdout
    return {k: float(v) for k, v in json.loads(out).items()}


def _size(text: str) -> int:
    return int(float(text.lower().replace("k", "e3").replace("m", "e6")))


def main(argv: list[str] | None = None) -> list[dict[str, object]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100k,1M")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--data", help="where the runs are written (default: a temporary folder)")
    args = ap.parse_args(argv)
    sizes = [_size(x) for x in args.sizes.split(",")]
    root = Path(args.data) if args.data else Path(tempfile.mkdtemp(prefix="forensics-stress-"))
    rows: list[dict[str, object]] = []
    for kind in args.kinds.split(","):
        timed = [stages(write(root / f"{kind}_{n}", kind, n)) for n in sizes]
        points = [t["points"] for t in timed]
        keys = ["import", *(k for k in timed[0] if k.startswith("detector:")), "diagnose"]
        print(f"{kind}: {' / '.join(f'{p:,.0f}' for p in points)} points", flush=True)
        for key in keys:
            cpu = [t.get(key, math.nan) for t in timed]
            # (stages under 10 ms at the largest size are start-up noise: not judged)
            exp = exponent(points, cpu) if len(sizes) > 1 and max(cpu) >= 0.01 else math.nan
            steep = exp > STEEP
            rows.append({"kind": kind, "stage": key, "cpu": cpu, "exponent": exp, "steep": steep})
            if max(cpu) >= 0.05 or steep:
                print(
                    f"   {key:32s} {' / '.join(f'{c:7.3f}' for c in cpu)} s"
                    f"   exponent {exp:5.2f}{'   STEEPER THAN LINEAR' if steep else ''}",
                    flush=True,
                )
    return rows


if __name__ == "__main__":
    main()
