"""Small real training runs (PyTorch on the CPU, one thread) written as Lightning CSVLogger
folders (``metrics.csv`` + ``hparams.yaml``): for compare and sweep tests.

A two-layer MLP learns a fixed regression task. The data (inputs, targets, order) comes from
``data_seed``; the initialisation from ``seed``. ``bad_batch_at`` corrupts the targets of the
batch at that step (x50): a data-induced spike every seed meets at the same step. ``nan_at``
makes the lr infinite from that step (a broken run).
"""

from __future__ import annotations

from pathlib import Path

import yaml


def train_run(
    folder: Path,
    *,
    seed: int = 0,
    lr: float = 3e-3,
    steps: int = 300,
    batch_size: int = 32,
    bad_batch_at: int | None = None,
    nan_at: int | None = None,
    data_seed: int = 0,
) -> Path:
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(data_seed)
    n = steps * batch_size
    x = torch.randn(n, 16, generator=g)
    w_true = torch.randn(16, 1, generator=g)
    y = torch.tanh(x @ w_true) + 0.1 * torch.randn(n, 1, generator=g)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rows = ["step,train_loss,grad_norm,lr,epoch"]
    for step in range(steps):
        xb = x[step * batch_size : (step + 1) * batch_size]
        yb = y[step * batch_size : (step + 1) * batch_size]
        if bad_batch_at is not None and step == bad_batch_at:
            yb = yb * 50.0
        if nan_at is not None and step >= nan_at:
            for group in opt.param_groups:
                group["lr"] = float("inf")
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        opt.step()
        cur_lr = opt.param_groups[0]["lr"]
        rows.append(f"{step},{loss.item()!r},{gn.item()!r},{cur_lr!r},0")
    out = folder / "lightning_logs" / "version_0"
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.csv").write_text("\n".join(rows) + "\n")
    hp = {"seed": seed, "lr": lr, "batch_size": batch_size, "steps": steps, "data_seed": data_seed}
    (out / "hparams.yaml").write_text(yaml.safe_dump(hp))
    return folder
