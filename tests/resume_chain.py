"""A real tiny torch training that checkpoints and resumes in a second job, for the resume
tests: a clean resume loads the model and the optimizer; a bad one loads only the weights
and restarts the LR schedule as a warm-up to 10x the peak LR (a schedule reset), so the
loss degrades from the seam on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def _job(
    log: Path,
    ckpt: Path,
    *,
    start: int,
    stop: int,
    total: int,
    bad_resume: bool = False,
    val_every: int = 0,
    log_lr: bool = True,
) -> None:
    """Noisy linear regression with SGD+momentum and a cosine LR decay over ``total`` steps;
    checkpoint at ``stop``. A bad resume loads only the weights and restarts the schedule as a
    warm-up to 10x the peak LR (a schedule reset): SGD's noise floor rises with the LR.
    ``val_every``: the loss on 256 held-out samples every that many steps (0: none);
    ``log_lr``: the LR logged beside the loss."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1024 + 256, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.5 * torch.randn(1024 + 256, 1, generator=g)
    (x, xv), (y, yv) = x.split([1024, 256]), y.split([1024, 256])
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    peak = 0.02
    if start:
        ck = torch.load(ckpt, weights_only=True)
        model.load_state_dict(ck["model"])
        if not bad_resume:
            opt.load_state_dict(ck["opt"])

    def lr_at(step: int) -> float:
        if bad_resume and start:
            return 10 * peak * (step - start + 1) / (stop - start)
        return float(peak * (0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * step / total))))

    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as fh:
        for step in range(start, stop):
            for grp in opt.param_groups:
                grp["lr"] = lr_at(step)
            idx = torch.randperm(1024, generator=torch.Generator().manual_seed(step))[:16]
            loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            row = {"step": step, "loss": loss.item()}
            if log_lr:
                row["lr"] = lr_at(step)
            if val_every and (step + 1) % val_every == 0:
                with torch.no_grad():
                    row["val_loss"] = torch.nn.functional.mse_loss(model(xv), yv).item()
            fh.write(json.dumps(row) + "\n")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, ckpt)


def torch_chain(tmp_path: Path, bad_resume: bool, val_every: int = 0, log_lr: bool = True) -> Path:
    """The run folder: job_0 trains steps 0-399, job_1 resumes it for 400-799."""
    root, ck = tmp_path / "run", tmp_path / "ck.pt"
    kw = {"val_every": val_every, "log_lr": log_lr}
    _job(root / "job_0" / "metrics.jsonl", ck, start=0, stop=400, total=800, **kw)
    _job(
        root / "job_1" / "metrics.jsonl",
        ck,
        start=400,
        stop=800,
        total=800,
        bad_resume=bad_resume,
        **kw,
    )
    return root
