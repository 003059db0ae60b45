"""Cached read against a fresh parse, alone: ``python -m benchmarks.cache_read --data DIR``.

Whole processes (``benchmarks.probe read RUN`` with a filled cache / with ``--no-cache``, in
turns, CPU seconds) and in one process (``read_run`` from the cache / fresh, in turns, after
a warm-up that pays the imports), per format and size. Uses already generated runs only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.measure import pair, run

PY = sys.executable

INPROC = r"""
import sys, time
from forensics.importers import ReadOptions, read_run
path, repeat = sys.argv[1], int(sys.argv[2])
read_run(path, options=ReadOptions(cache=True))  # imports paid, cache filled or warm
def cpu(cache):
    t = time.process_time()
    read_run(path, options=ReadOptions(cache=cache))
    return time.process_time() - t
c, f = [], []
for k in range(max(repeat, _ENOUGH)):
    c.append(cpu(True))
    f.append(cpu(False))
    if k + 1 >= repeat and sum(f) > _BUDGET:
        break
print(min(c), min(f))
"""
# (a pair of reads of a small run takes milliseconds: the minimum of three of them moved by
# 20% with the machine's load; pairs are added, in turn, until _BUDGET seconds of fresh reads
# or _ENOUGH pairs, so a small run's minimum is that of 20, a 1M-step run's of `repeat`)
INPROC = INPROC.replace("_ENOUGH", "20").replace("_BUDGET", "0.5")


def _label(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--sizes", default="100k,1M")
    ap.add_argument("--formats", default="tfevents,jsonl,megatron")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(s.replace("k", "000").replace("M", "000000")) for s in args.sizes.split(",")]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    for kind in args.formats.split(","):
        for steps in sizes:
            run_dir = Path(args.data) / f"{kind}_{steps}" / "run"
            cache = Path(tempfile.mkdtemp(prefix="forensics-cache-bench-"))
            withcache = {
                "FORENSICS_CACHE_DIR": str(cache),
                "FORENSICS_NO_CACHE": "0",  # (whatever the calling shell says: see __main__)
                "PYTHONPATH": env["PYTHONPATH"],
            }
            read = [PY, "-m", "benchmarks.probe", "read", str(run_dir)]
            try:
                run(read, withcache)  # fills the cache
                tc, tn, ratio = pair(
                    read, read + ["--no-cache"], args.repeat, withcache, withcache, warmup=False
                )
                assert tn is not None
                out = subprocess.run(
                    [PY, "-c", INPROC, str(run_dir), str(args.repeat)],
                    env={**env, **withcache},
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
                ci, fi = float(out[0]), float(out[1])
                print(
                    f"{kind:9s} {_label(steps):>4s}: process cached {tc.cpu:6.3f} s fresh "
                    f"{tn.cpu:6.3f} s ratio {ratio['cpu']:.3f} | in process cached {ci:6.3f} s "
                    f"fresh {fi:6.3f} s ratio {ci / fi:.3f}",
                    flush=True,
                )
            finally:
                shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
