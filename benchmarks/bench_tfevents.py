"""Benchmark: the project's TensorBoard reader against tbparse on a 1M-scalar event file.

Not a test (speed is machine-dependent); run it by hand:

    python benchmarks/bench_tfevents.py [--steps 100000] [--tags 10] [--keep DIR]

It writes ``tags x steps`` scalars with tensorboardX (about 50 s for 1M on a small VM; pass
``--keep DIR`` to reuse the file on the next run), then times, in this one process:

* ``forensics``: ``read_run`` (discovery, framing, CRC-checked lengths, decoding, canonical
  names, restart segmentation) -> a polars frame;
* ``forensics --verify-crc``: the same with every record's data CRC checked;
* ``tbparse``: ``SummaryReader(dir, extra_columns={"wall_time"}).scalars`` converted to polars
  (the issue's reference reader).

Both readers are warmed up first on a tiny file (imports are not what is compared); the
project's reader is timed as the best of three runs, tbparse once (it takes half a minute).
It prints seconds, events per second, the machine's load and the ratio tbparse / forensics
(target >= 10).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def write(logdir: Path, n_tags: int, n_steps: int) -> None:
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(logdir), flush_secs=3600, max_queue=10000)
    for s in range(n_steps):
        for t in range(n_tags):
            w.add_scalar(f"train/metric_{t}", (s % 977) * 0.001 + t, s)
    w.close()


def time_forensics(logdir: Path, verify_crc: bool) -> tuple[float, int]:
    from forensics.importers import ReadOptions, read_run

    t0 = time.perf_counter()
    run = read_run(logdir, options=ReadOptions(verify_crc=verify_crc))
    return time.perf_counter() - t0, run.frame.height


def time_tbparse(logdir: Path) -> tuple[float, int]:
    import polars as pl
    from tbparse import SummaryReader

    t0 = time.perf_counter()
    df = SummaryReader(str(logdir), extra_columns={"wall_time"}).scalars
    # pl.from_pandas needs pyarrow; go through numpy columns instead.
    frame = pl.DataFrame({c: df[c].to_numpy() for c in df.columns})
    return time.perf_counter() - t0, frame.height


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--tags", type=int, default=10)
    ap.add_argument("--keep", type=Path, default=None, help="write (or reuse) the event file here")
    args = ap.parse_args()
    n = args.steps * args.tags
    logdir = args.keep or Path(tempfile.mkdtemp(prefix="bench_tfevents_"))
    try:
        if not any(logdir.glob("*tfevents*")):
            logdir.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            write(logdir, args.tags, args.steps)
            dt = time.perf_counter() - t0
            print(f"write (tensorboardX)       {dt:7.2f} s  {n / dt / 1e3:8.1f} k events/s")
        size = sum(p.stat().st_size for p in logdir.glob("*tfevents*"))
        print(f"{n:,} scalars, {size / 1e6:.1f} MB in {logdir}")
        warm = logdir.parent / (logdir.name + "_warmup")
        if not any(warm.glob("*tfevents*")):
            warm.mkdir(parents=True, exist_ok=True)
            write(warm, 2, 10)
        time_forensics(warm, verify_crc=False)
        time_tbparse(warm)
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        ours, rows = min(time_forensics(logdir, verify_crc=False) for _ in range(3))
        print(
            f"forensics read_run         {ours:7.2f} s  {n / ours / 1e3:8.1f} k events/s  "
            f"({rows:,} rows)"
        )
        try:
            crc, _ = time_forensics(logdir, verify_crc=True)
            print(f"forensics --verify-crc     {crc:7.2f} s  {n / crc / 1e3:8.1f} k events/s")
        except Exception as exc:  # noqa: BLE001 - crc32c is optional
            print(f"forensics --verify-crc     skipped ({exc})")
        ref, ref_rows = time_tbparse(logdir)
        print(
            f"tbparse .scalars -> polars {ref:7.2f} s  {n / ref / 1e3:8.1f} k events/s  "
            f"({ref_rows:,} rows)"
        )
        print(f"ratio tbparse / forensics  {ref / ours:7.1f} x  (target >= 10)")
    finally:
        if args.keep is None:
            shutil.rmtree(logdir, ignore_errors=True)
            shutil.rmtree(logdir.parent / (logdir.name + "_warmup"), ignore_errors=True)


if __name__ == "__main__":
    main()
