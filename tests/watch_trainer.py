"""A real tiny training job that writes its TensorBoard log while it trains (for watch tests).

Run as a script: ``python tests/watch_trainer.py OUT_DIR [--steps N] [--delay S]
[--nan-at K] [--sleep-at K --sleep-for S]``. A two-layer MLP learns a fixed regression task
on the CPU (one thread, full batch); each step logs loss, grad norm and lr through
tensorboardX and flushes, so a watcher sees the step at once.

- ``--nan-at K`` sets a weight to NaN before step K's forward pass: the loss is NaN from
  step K on, as after an fp16 overflow that poisoned the weights.
- ``--sleep-at K --sleep-for S`` stops logging for S seconds after step K (a hang), then
  goes on.

The script prints ``step K`` on stdout after each logged step.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--delay", type=float, default=0.02)
    ap.add_argument("--nan-at", type=int, default=None)
    ap.add_argument("--sleep-at", type=int, default=None)
    ap.add_argument("--sleep-for", type=float, default=0.0)
    args = ap.parse_args(argv)

    import torch
    from tensorboardX import SummaryWriter

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    # Full-batch gradient descent on a fixed set: a smooth, falling loss, so the only event in
    # the log is the one a test induces.
    x = torch.randn(256, 16, generator=g)
    y = torch.tanh(x @ torch.randn(16, 1, generator=g)) + 0.05 * torch.randn(256, 1, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    writer = SummaryWriter(args.out, flush_secs=1)
    for step in range(1, args.steps + 1):
        xb, yb = x, y
        if args.nan_at is not None and step == args.nan_at:
            with torch.no_grad():
                model[0].weight[0, 0] = float("nan")
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        opt.step()
        writer.add_scalar("train/loss", loss.item(), step)
        writer.add_scalar("train/grad_norm", gn.item(), step)
        writer.add_scalar("train/lr", opt.param_groups[0]["lr"], step)
        writer.flush()
        print(f"step {step}", flush=True)
        if args.sleep_at is not None and step == args.sleep_at:
            time.sleep(args.sleep_for)
        time.sleep(args.delay)
    writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
