"""Generate the sample runs under sample_runs/<name>/ by real training on the CPU.

    python sample_runs/generator/make_samples.py            # every run
    python sample_runs/generator/make_samples.py --only bad_batch

Needs the ``samples`` extra (torch CPU, tensorboardX; wandb for the W&B run). Each run
takes well under two minutes on one core. Existing output of a run is replaced.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from tinygpt import Config, Trainer  # noqa: E402
from writers import TensorBoardLog  # noqa: E402

OUT = HERE.parent


def fresh(name: str) -> Path:
    d = OUT / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def tb_run(cfg: Config) -> Path:
    d = fresh(cfg.name)
    log = TensorBoardLog(d)
    Trainer(cfg).run(log)
    log.close()
    return d


def bad_batch() -> Path:
    """One batch of compiled-extension bytes at step 250: a spike that recovers."""
    return tb_run(Config("bad_batch", steps=500, batch=32, bad_steps=(250,)))


RUNS = {
    "bad_batch": bad_batch,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", choices=sorted(RUNS), help="generate only this run (repeatable)")
    args = ap.parse_args()
    for name in args.only or list(RUNS):
        t0 = time.time()
        path = RUNS[name]()
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        print(f"{name}: {time.time() - t0:.0f} s, {size / 1024:.0f} KiB -> {path.relative_to(OUT.parent)}")


if __name__ == "__main__":
    main()
