"""Generate the sample runs under sample_runs/<name>/ by real training on the CPU.

    python sample_runs/generator/make_samples.py                  # every run
    python sample_runs/generator/make_samples.py --only bad_batch # one run (repeatable)

Needs the ``samples`` extra (torch CPU, tensorboardX) and wandb for the W&B run. Each run
trains a 236k-parameter byte-level GPT for 800-1300 steps on one core (about a minute).
A run's folder is deleted and written again. What each run induces is in
sample_runs/README.md.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from tinygpt import Config, Trainer  # noqa: E402
from writers import (  # noqa: E402
    HFTrainerLog,
    JsonlLog,
    MegatronLog,
    TensorBoardHistogramLog,
    TensorBoardLog,
    WandbLog,
)

OUT = HERE.parent


def fresh(name: str) -> Path:
    d = OUT / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def tb(cfg: Config) -> Path:
    d = fresh(cfg.name)
    log = TensorBoardLog(d)
    Trainer(cfg).run(log)
    log.close()
    return d


def jsonl(cfg: Config) -> Path:
    d = fresh(cfg.name)
    log = JsonlLog(d / "metrics.jsonl")
    Trainer(cfg).run(log)
    log.close()
    return d


# ----------------------------------------------------------------------------- the runs


def healthy() -> Path:
    """No switch: cosine schedule, AdamW beta2 0.99, clip 1.0, fp16 loss scaling."""
    return tb(Config("healthy"))


def bad_batch() -> Path:
    """Half of the batches at steps 300 and 650 are bytes of compiled extension modules."""
    return tb(Config("bad_batch", bad_steps=(300, 650), bad_fraction=0.5))


def periodic_spikes() -> Path:
    """A corrupt shard comes round every 125 steps (the loader cycles through its shards)."""
    return tb(Config("periodic_spikes", bad_steps=tuple(range(125, 1001, 125))))


def divergence() -> Path:
    """bf16-style run (no loss scaling); from step 400 the lr grows geometrically, x1e4 by 1000."""
    cfg = Config("divergence", steps=1300, fp16=False, lr_ramp=(400, 1000, 1e4))
    d = fresh(cfg.name)
    log = WandbLog(d, cfg.name, {"lr": cfg.lr, "batch": cfg.batch, "n_layer": cfg.n_layer, "d_model": cfg.d_model,
                                 "ctx": cfg.ctx, "warmup": cfg.warmup, "lr_ramp": list(cfg.lr_ramp or ())})
    Trainer(cfg).run(log)
    log.close()
    for junk in d.glob("wandb/*/tmp"):
        shutil.rmtree(junk, ignore_errors=True)
    return d


def grad_norm_drift() -> Path:
    """AdamW beta2 0.95 + weight decay 0.1 + a low lr: the loss falls, the grad norm climbs."""
    return tb(Config("grad_norm_drift", batch=32, lr=1e-3, min_lr_frac=0.1, betas=(0.9, 0.95), weight_decay=0.1))


def overfitting() -> Path:
    """bf16 fine-tune on 8 KB of text, constant lr: train loss falls to ~0.4, eval loss turns up."""
    cfg = Config("overfitting", train_bytes=8000, schedule="constant", fp16=False)
    d = fresh(cfg.name)
    t = Trainer(cfg)
    log = HFTrainerLog(d, max_steps=cfg.steps, batch=cfg.batch, train_tokens=len(t.corpus.train),
                       tokens_per_step=cfg.batch * cfg.ctx)
    t.run(log)
    log.close()
    return d


def val_shift() -> Path:
    """At step 500 the validation text is re-processed (4-space indents become tabs)."""
    return jsonl(Config("val_shift", val_transform_from=500))


def loss_scale_collapse() -> Path:
    """fp16 from a 2^32 initial scale; ten consecutive corrupt batches at 600-609."""
    cfg = Config("loss_scale_collapse", init_scale=2.0**32, bad_steps=tuple(range(600, 610)))
    d = fresh(cfg.name)
    log = MegatronLog(d / "train.log", max_steps=cfg.steps, batch=cfg.batch, init_scale=cfg.init_scale)
    Trainer(cfg).run(log)
    log.close()
    return d


def nan() -> Path:
    """No gradient clipping; the lr climbs x300 over steps 500-600; fp16 activations overflow."""
    return tb(Config("nan", clip=None, lr_ramp=(500, 600, 300.0)))


def resumed() -> Path:
    """Crash after step 700, restart from the step-600 checkpoint into a new event file."""
    cfg = Config("resumed", crash_at=700)
    d = fresh(cfg.name)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt-600.pt"
        t = Trainer(cfg)
        log = TensorBoardLog(d)
        try:
            t.run(log, on_step=lambda tr: tr.save(ckpt) if tr.step == 600 else None)
        except RuntimeError:
            pass  # the job died; its writer is never closed
        time.sleep(1.5)  # event file names carry the second: the restart's must sort after
        cfg2 = Config("resumed")
        t2 = Trainer(cfg2, corpus=t.corpus)
        t2.load(ckpt)
        log2 = TensorBoardLog(d)
        t2.run(log2)
        log2.close()
    return d


def truncated_log() -> Path:
    """A job killed while writing: the event file ends inside its last record."""
    d = tb(Config("truncated_log", steps=800, seed=1))
    (f,) = list(d.glob("events.out.tfevents.*"))
    data = f.read_bytes()
    f.write_bytes(data[:-9])  # the last record's data CRC and a few bytes of its payload are gone
    return d


def throughput_drop() -> Path:
    """From step 500 every batch is re-read from the source files and decoded in Python."""
    return jsonl(Config("throughput_drop", slow_data_from=500, slow_files=12))


def memory_growth() -> Path:
    """From step 300 each step's logits are appended to a list that is never cleared."""
    return tb(Config("memory_growth", leak_from=300))


def layer_grad_shift() -> Path:
    """Weight decay on blocks 2-3 ramps 0 -> 40 over steps 500-1000: block 1 takes over their gradient."""
    return tb(Config("layer_grad_shift", steps=1200, batch=32, group_wd={"layers.2": 40.0, "layers.3": 40.0},
                     group_wd_ramp=(500, 1000)))


def activation_outlier() -> Path:
    """Block 2's MLP gets 1000x the lr for steps 500-504: its output reaches ~1e4."""
    return tb(Config("activation_outlier", lr_windows=((500, 504, 1000.0, ("layers.2.mlp",)),)))


def param_norm_jump() -> Path:
    """The lr of every group is 50x for steps 500-509 (a scheduler bug): the weights jump."""
    return tb(Config("param_norm_jump", lr_windows=((500, 509, 50.0, ()),)))


def histogram_layers() -> Path:
    """Block 2's MLP gets 1000x the lr for steps 300-304, as in activation_outlier, but the
    per-layer vital signs are logged only with add_histogram: every block parameter and its
    gradient every 50 steps, each block's output every 10; scalars are loss, lr, grad norm,
    loss scale, throughput, memory and val loss."""
    cfg = Config("histogram_layers", steps=600, lr_windows=((300, 304, 1000.0, ("layers.2.mlp",)),))
    d = fresh(cfg.name)
    log = TensorBoardHistogramLog(d)
    t = Trainer(cfg)
    every_w, every_act = 50, 10

    def before(tr: Trainer) -> None:  # the next step keeps its block outputs when due
        tr.model.act_keep = {} if (tr.step + 1) % every_act == 0 else None

    def on_step(tr: Trainer) -> None:
        s, m = tr.step, tr.model
        if m.act_keep:
            # np.histogram refuses inf/NaN (an fp16 overflow): such a tensor is not logged
            acts = {f"activations/layers.{i}": a for i, a in m.act_keep.items() if bool(a.isfinite().all())}
            log.histograms(acts, s)
        if s % every_w == 0:
            named = {n: p.detach() for n, p in m.named_parameters() if n.startswith("layers.")}
            grads = {
                f"{n}.grad": p.grad for n, p in m.named_parameters()
                if n.startswith("layers.") and p.grad is not None and bool(p.grad.isfinite().all())
            }
            log.histograms({**named, **grads}, s)
        before(tr)

    before(t)
    t.run(log, on_step=on_step)
    log.close()
    return d


def hf(cfg: Config) -> Path:
    d = fresh(cfg.name)
    t = Trainer(cfg)
    log = HFTrainerLog(d, max_steps=cfg.steps, batch=cfg.batch, train_tokens=len(t.corpus.train),
                       tokens_per_step=cfg.batch * cfg.ctx)
    t.run(log)
    log.close()
    return d


# Issue 13's runs: judgement that needs the schedule, the shape of the val curve, or calibration.


def healthy_cosine_wd() -> Path:
    """1200 steps, cosine decay to zero, weight decay 0.1: the grad norm rises as the lr decays."""
    return tb(Config("healthy_cosine_wd", steps=1200, weight_decay=0.1))


def healthy_wsd() -> Path:
    """Warm-up, stable lr, then a short linear decay to zero over the last 15% of 800 steps."""
    return jsonl(Config("healthy_wsd", steps=800, schedule="wsd", decay_frac=0.15, weight_decay=0.1))


def val_swap_harder() -> Path:
    """At step 400 of 600 half of the validation batches are re-processed (indents become tabs)."""
    return jsonl(Config("val_swap_harder", steps=600, val_transform_from=400, val_transform_share=0.5))


def val_swap_easier() -> Path:
    """At step 360 of 600 the validation text is re-processed with doubled indents (more easy bytes)."""
    return jsonl(Config("val_swap_easier", steps=600, val_transform_from=360, val_transform_kind="spaces8"))


def late_overfit() -> Path:
    """A 20 KB train subset repeated for ~40 epochs under a cosine decay: val turns up a little."""
    return hf(Config("late_overfit", steps=800, train_bytes=20_000))


def multi_eval_sets() -> Path:
    """Twelve rows of every batch come from 2 KB of idlelib, constant lr; held-out idlelib files
    and the stdlib validation set are evaluated as two eval sets."""
    return hf(Config("multi_eval_sets", steps=600, schedule="constant", domain="idlelib",
                     domain_train_bytes=2000, domain_rows=12))


def slow_eval_steps() -> Path:
    """The validation pass (12 batches) is timed inside its step; throughput logged every step."""
    return jsonl(Config("slow_eval_steps", steps=400, eval_in_step_time=True, every_sys=1, val_batches=12))


RUNS: dict[str, Callable[[], Path]] = {f.__name__: f for f in (
    healthy, bad_batch, periodic_spikes, divergence, grad_norm_drift, overfitting, val_shift,
    loss_scale_collapse, nan, resumed, truncated_log, throughput_drop, memory_growth,
    layer_grad_shift, activation_outlier, param_norm_jump,
    healthy_cosine_wd, healthy_wsd, val_swap_harder, val_swap_easier, late_overfit, multi_eval_sets,
    slow_eval_steps, histogram_layers,
)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", choices=sorted(RUNS), help="generate only this run (repeatable)")
    args = ap.parse_args()
    for name in args.only or list(RUNS):
        t0 = time.time()
        path = RUNS[name]()
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        print(f"{name}: {time.time() - t0:.0f} s, {size / 1024:.0f} KiB -> {path.relative_to(OUT.parent)}", flush=True)


if __name__ == "__main__":
    main()
