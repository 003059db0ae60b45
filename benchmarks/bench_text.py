"""Benchmark: importing a Megatron-LM text log against polars reading the same metrics as JSONL.

Not a test (speed is machine-dependent); run it by hand:

    python benchmarks/bench_text.py [--lines 1000000] [--keep DIR]
    python benchmarks/bench_text.py --data /work/bench-data/megatron_1000000   # the suite's files

It writes a Megatron-LM stdout log of ``--lines`` iteration lines (dated, 11 fields each,
with a preamble like the real thing; as in real bf16 runs, batch size, loss scale and the
skipped/nan counters print the same text on every line) and the same numbers as one JSON object per
line, then
times, in this one process:

* ``forensics``: the text importer's ``read`` on the log (family sniffing, line table,
  column-wise field parsing, rank de-duplication, crash scan, canonical frame, restart
  segmentation);
* ``polars``: ``pl.read_ndjson`` on the JSONL (the reference: the same metrics from a
  format that needs no parsing of free text).

Each side runs ``--repeat`` times, alternating, and the best time counts (the machine is
shared, so single timings are noisy). It prints both times, CPU seconds (all threads) and
wall, and the CPU ratio forensics / polars (the suite's target, whole processes: <= 3).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polars as pl  # noqa: E402

from forensics.importers.base import ReadOptions, Source  # noqa: E402
from forensics.importers.text import IMPORTER  # noqa: E402


def write_logs(folder: Path, n: int) -> tuple[Path, Path]:
    rng = random.Random(0)
    log, jsonl = folder / "megatron.out", folder / "megatron.jsonl"
    with log.open("w") as f, jsonl.open("w") as g:
        f.write("using world size: 64, data-parallel size: 8, tensor-model-parallel size: 8\n")
        for i in range(200):
            f.write(f"  arg_{i:03d} ........................................ {i}\n")
        import json

        for it in range(1, n + 1):
            loss = 2.0 + 8.0 / (1.0 + it / 1000.0) + rng.random() * 0.01
            gn = 1.0 + rng.random()
            ms = 1234.5 + rng.random()
            lr = 1.5e-4 * min(1.0, it / 2000.0)
            tflops = 150.0 + rng.random()
            f.write(
                f" [2024-05-01 12:{(it // 60) % 60:02d}:{it % 60:02d}] iteration {it:8d}/ "
                f"{n:8d} | consumed samples: {it * 512:12d} | "
                f"elapsed time per iteration (ms): {ms:.1f} | throughput per GPU "
                f"(TFLOP/s/GPU): {tflops:.1f} | "
                f"learning rate: {lr:.6E} | global batch size:   512 | lm loss: {loss:.6E} | "
                "loss scale: 1.0 | "
                f"grad norm: {gn:.3f} | number of skipped iterations:   0 | number of nan "
                "iterations:   0 |\n"
            )
            g.write(
                json.dumps(
                    {
                        "iteration": it,
                        "consumed samples": it * 512,
                        "elapsed time per iteration (ms)": round(ms, 1),
                        "throughput per GPU (TFLOP/s/GPU)": round(tflops, 1),
                        "learning rate": float(f"{lr:.6E}"),
                        "global batch size": 512,
                        "lm loss": float(f"{loss:.6E}"),
                        "loss scale": 1.0,
                        "grad norm": round(gn, 3),
                        "number of skipped iterations": 0,
                        "number of nan iterations": 0,
                    }
                )
                + "\n"
            )
    return log, jsonl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument(
        "--keep", type=Path, default=None, help="folder to keep (and reuse) the generated files"
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--data",
        type=Path,
        default=None,
        help="a folder of the suite (run/megatron.out, megatron_same_numbers.jsonl): read, kept",
    )
    args = ap.parse_args()
    if args.data is not None:
        folder = args.data / "run"
        log, jsonl = folder / "megatron.out", args.data / "megatron_same_numbers.jsonl"
        args.keep = args.data  # never removed, never written
        if not (log.exists() and jsonl.exists()):
            sys.exit(f"{args.data}: no run/megatron.out and megatron_same_numbers.jsonl")
    else:
        folder = args.keep or Path(tempfile.mkdtemp(prefix="bench_text_"))
        folder.mkdir(parents=True, exist_ok=True)
        log, jsonl = folder / "megatron.out", folder / "megatron.jsonl"
    try:
        if not (log.exists() and jsonl.exists()):
            t = time.perf_counter()
            write_logs(folder, args.lines)
            print(
                f"wrote {args.lines:,} lines in {time.perf_counter() - t:.1f} s "
                f"({log.stat().st_size / 1e6:.0f} MB log)"
            )
        src = Source("text_logs", [log], log.name, folder, scope="file")
        # One untimed warm-up of each (imports, page cache), then the timed runs.
        IMPORTER.read(src, ReadOptions())
        pl.read_ndjson(jsonl)
        t_ours = t_ref = c_ours = c_ref = float("inf")
        for _ in range(args.repeat):
            t, c = time.perf_counter(), time.process_time()
            res = IMPORTER.read(src, ReadOptions(cache=False))
            t_ours = min(t_ours, time.perf_counter() - t)
            c_ours = min(c_ours, time.process_time() - c)
            t, c = time.perf_counter(), time.process_time()
            ref = pl.read_ndjson(jsonl)
            t_ref = min(t_ref, time.perf_counter() - t)
            c_ref = min(c_ref, time.process_time() - c)
        print(
            f"forensics text import: {c_ours:6.2f} s cpu {t_ours:6.2f} s wall  "
            f"({res.frame.height:,} rows, {res.frame.get_column('step').n_unique():,} steps)"
        )
        print(
            f"polars read_ndjson:    {c_ref:6.2f} s cpu {t_ref:6.2f} s wall  "
            f"({ref.height:,} rows x {ref.width} columns)"
        )
        print(f"ratio forensics / polars (cpu, in process) = {c_ours / c_ref:.2f}")
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
