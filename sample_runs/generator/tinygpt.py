"""A tiny byte-level GPT trained on the CPU, logging the article's vital signs.

The text is the Python standard library's own source (document-level train/val split, so
the validation set shares no file with the training set). Each pathology is a switch in
:class:`Config`; the dynamics that follow a switch are whatever real training does.

Mixed precision is emulated honestly: the residual stream is rounded to float16 at every
block boundary (so the backward pass carries fp16 gradients that overflow to inf), and a
dynamic loss scaler works like ``torch.amp.GradScaler``: scaled gradients that are
non-finite or beyond the fp16 maximum (65504) count as an overflow, the step is skipped
and the scale halved; after ``growth_interval`` clean steps the scale doubles.
"""

from __future__ import annotations

import math
import os
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

FP16_MAX = 65504.0


# ----------------------------------------------------------------------------- data


def stdlib_files() -> list[Path]:
    """Top-level .py files of the standard library, sorted (the same on any CPython 3.11+)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.glob("*.py") if p.is_file())


def binary_bytes(limit: int = 2_000_000) -> bytes:
    """Compiled extension modules: the 'corrupt shard' that a sloppy glob lets in."""
    root = Path(sysconfig.get_paths()["stdlib"]) / "lib-dynload"
    out = bytearray()
    for p in sorted(root.glob("*.so")):
        out += p.read_bytes()
        if len(out) >= limit:
            break
    if len(out) < 100_000:  # no lib-dynload on this Python: fall back to seeded noise
        g = torch.Generator().manual_seed(1234)
        out = bytearray(torch.randint(0, 256, (limit,), generator=g, dtype=torch.uint8).numpy().tobytes())
    return bytes(out[:limit])


@dataclass
class Corpus:
    train: torch.Tensor  # uint8 -> long on use
    val: torch.Tensor
    binary: torch.Tensor


def load_corpus(train_bytes: int | None = None, val_every: int = 10) -> Corpus:
    """Every ``val_every``-th file goes to validation; ``train_bytes`` truncates the train set."""
    files = stdlib_files()
    train, val = bytearray(), bytearray()
    for i, p in enumerate(files):
        (val if i % val_every == val_every // 2 else train).extend(p.read_bytes())
    if train_bytes:
        train = train[:train_bytes]
    as_t = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8).clone()  # noqa: E731
    return Corpus(as_t(train), as_t(val[:400_000]), as_t(binary_bytes()))


def windows(stream: torch.Tensor, n: int, ctx: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, len(stream) - ctx - 1, (n,), generator=g)
    chunk = torch.stack([stream[i : i + ctx + 1] for i in idx.tolist()]).long()
    return chunk[:, :-1], chunk[:, 1:]


# ----------------------------------------------------------------------------- model


FP16_ACTIVATIONS = True  # switched per run by Trainer


def fp16_round(x: torch.Tensor) -> torch.Tensor:
    """Store an activation as float16 would (values beyond 65504 become inf, gradients too)."""
    return x.half().float() if FP16_ACTIVATIONS else x


class Block(nn.Module):
    def __init__(self, d: int, n_head: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, n_head, batch_first=True, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, n_layer: int, d: int, n_head: int, ctx: int) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(256, d)
        self.pos_emb = nn.Embedding(ctx, d)
        self.layers = nn.ModuleList(Block(d, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, 256, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((ctx, ctx), float("-inf")), 1), persistent=False)
        self.apply(self._init)
        self.act_stats: dict[int, tuple[float, float, float]] | None = None  # filled when not None
        self.act_keep: dict[int, torch.Tensor] | None = None  # filled when not None

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = fp16_round(self.tok_emb(x) + self.pos_emb.weight[:t])
        for i, block in enumerate(self.layers):
            h = fp16_round(block(h, self.mask[:t, :t]))
            if self.act_stats is not None:
                d = h.detach()
                self.act_stats[i] = (d.mean().item(), d.std().item(), d.abs().max().item())
            if self.act_keep is not None:  # the tensors themselves (histogram logging)
                self.act_keep[i] = h.detach()
        return self.lm_head(self.ln_f(h))


# ----------------------------------------------------------------------------- config


@dataclass
class Config:
    name: str
    steps: int = 1000
    n_layer: int = 4
    d_model: int = 64
    n_head: int = 4
    ctx: int = 64
    batch: int = 16
    lr: float = 3e-3
    warmup: int = 30
    schedule: str = "cosine"  # cosine | constant | exp (geometric decay to min_lr_frac) | wsd
    min_lr_frac: float = 0.0
    decay_frac: float = 0.2  # wsd: the share of the run (at its end) spent decaying linearly to min_lr_frac
    weight_decay: float = 0.0
    # beta2 0.99: with 0.95 the grad norm of this model creeps up even in a healthy run
    betas: tuple[float, float] = (0.9, 0.99)
    clip: float | None = 1.0
    seed: int = 0
    # fp16 dynamic loss scaling (GradScaler semantics; growth interval scaled down from 2000)
    fp16: bool = True  # False: a bf16-style run without loss scaling (no loss_scale logged)
    init_scale: float = 2.0**16
    growth_interval: int = 200
    # cadence (article section 6.1 divided by 50): scalars every step, per-layer norms
    # every 10, activations every 20, validation every 40, throughput/memory every 10.
    every_layer: int = 10
    every_act: int = 20
    every_val: int = 40
    every_sys: int = 10
    val_batches: int = 8
    # pathologies
    train_bytes: int | None = None  # tiny train set -> overfitting
    bad_steps: tuple[int, ...] = ()  # these steps' batches come from the binary shard
    bad_fraction: float = 1.0  # share of a bad batch's rows that are binary
    # (first, last, factor, groups): the lr of these param groups (empty: all) times factor
    lr_windows: tuple[tuple[int, int, float, tuple[str, ...]], ...] = ()
    lr_ramp: tuple[int, int, float] | None = None  # (first, last, factor): geometric lr ramp, then held
    ramp_groups: tuple[str, ...] = ()  # param groups the ramp applies to (empty: all)
    group_lr: dict[str, float] = field(default_factory=dict)  # "emb"/"head"/"layers.i[.mlp]" -> factor
    group_wd: dict[str, float] = field(default_factory=dict)  # weight decay per group prefix ...
    group_wd_ramp: tuple[int, int] = (0, 0)  # ... growing linearly from 0 at first to full at last
    val_transform_from: int | None = None  # the val preprocessing changes at this step
    val_transform_kind: str = "tabs"  # tabs (harder) | spaces8 (easier: indents doubled)
    val_transform_share: float = 1.0  # share of the val batches the new preprocessing reaches
    # a small domain set repeated inside every batch; its held-out files form a second eval set
    domain: str | None = None  # a stdlib package (e.g. "idlelib"): its files are the domain
    domain_train_bytes: int = 8000  # the domain's training text (the rest of its files: eval)
    domain_rows: int = 4  # rows of each batch drawn from the domain's training text
    eval_in_step_time: bool = False  # the validation pass is timed as part of its training step
    leak_from: int | None = None  # keep each step's logits alive from this step on
    slow_data_from: int | None = None  # pure-Python data decoding from this step on
    slow_files: int = 4  # files re-read per batch once the data path is slow
    remap_inputs: tuple[int, int] | None = None  # share of rows with re-encoded inputs: 0 -> 1 over (first, last)
    crash_at: int | None = None  # raise after this step (resume runs)


class Logger(Protocol):
    def scalar(self, tag: str, value: float, step: int) -> None: ...
    def flush(self) -> None: ...


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def val_transform(raw: torch.Tensor, kind: str = "tabs") -> torch.Tensor:
    """The 'reprocessed' validation set: indentation converted from 4 spaces to tabs (a text
    the model has never seen: harder), or doubled to 8 spaces (more easy bytes: easier)."""
    new = {"tabs": b"\t", "spaces8": b" " * 8}[kind]
    text = bytes(raw.numpy()).replace(b"    ", new)
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).clone()


def domain_corpus(package: str, train_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A stdlib package's files: the first ``train_bytes`` of them to train on, files after
    those (none of whose bytes are trained on) to evaluate on."""
    root = Path(sysconfig.get_paths()["stdlib"]) / package
    train, held = bytearray(), bytearray()
    for p in sorted(root.glob("*.py")):
        (train if len(train) < train_bytes else held).extend(p.read_bytes())
    as_t = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8).clone()  # noqa: E731
    return as_t(train[:train_bytes]), as_t(held[:400_000])


# ----------------------------------------------------------------------------- training


class Trainer:
    def __init__(self, cfg: Config, corpus: Corpus | None = None) -> None:
        global FP16_ACTIVATIONS
        torch.set_num_threads(1)
        torch.manual_seed(cfg.seed)
        FP16_ACTIVATIONS = cfg.fp16
        self.cfg = cfg
        self.corpus = corpus or load_corpus(cfg.train_bytes)
        self.model = TinyGPT(cfg.n_layer, cfg.d_model, cfg.n_head, cfg.ctx)
        self.opt = torch.optim.AdamW(self._groups(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        self.scale = cfg.init_scale if cfg.fp16 else 1.0
        self.growth = 0
        self.step = 0
        self.skipped = 0
        self.leak: list[torch.Tensor] = []
        g = torch.Generator().manual_seed(999)
        self.val_sets = {False: [windows(self.corpus.val, cfg.batch, cfg.ctx, g) for _ in range(cfg.val_batches)]}
        if cfg.val_transform_from is not None:
            g = torch.Generator().manual_seed(999)
            changed = val_transform(self.corpus.val, cfg.val_transform_kind)
            new = [windows(changed, cfg.batch, cfg.ctx, g) for _ in range(cfg.val_batches)]
            k = round(cfg.val_transform_share * cfg.val_batches)
            self.val_sets[True] = new[:k] + self.val_sets[False][k:]
        self.domain_sets: list[tuple[torch.Tensor, torch.Tensor]] = []
        if cfg.domain:
            self.domain_train, held = domain_corpus(cfg.domain, cfg.domain_train_bytes)
            g = torch.Generator().manual_seed(998)
            self.domain_sets = [windows(held, cfg.batch, cfg.ctx, g) for _ in range(cfg.val_batches)]

    def _groups(self) -> list[dict]:
        groups: dict[str, list[nn.Parameter]] = {}
        for name, p in self.model.named_parameters():
            if name.startswith(("tok_emb", "pos_emb")):
                key = "emb"
            elif name.startswith("lm_head"):
                key = "head"
            elif name.startswith("layers."):
                key = ".".join(name.split(".")[:3])  # layers.2.mlp, layers.2.attn, layers.2.ln1
            else:
                key = "other"
            groups.setdefault(key, []).append(p)
        return [{"params": ps, "name": k, "lr_factor": self._factor(self.cfg.group_lr, k)} for k, ps in groups.items()]

    @staticmethod
    def _match(prefixes: tuple[str, ...] | dict, name: str) -> bool:
        return any(name == p or name.startswith(p + ".") for p in prefixes)

    @staticmethod
    def _factor(table: dict[str, float], name: str, default: float = 1.0) -> float:
        for p, v in table.items():
            if name == p or name.startswith(p + "."):
                return v
        return default

    def lr_at(self, step: int, ramp: bool = True) -> float:
        c = self.cfg
        if step <= c.warmup:
            lr = c.lr * step / c.warmup
        elif c.schedule == "constant":
            lr = c.lr
        elif c.schedule == "wsd":
            decay_start = c.steps - round(c.decay_frac * c.steps)
            frac = max(0.0, (step - decay_start) / max(1, c.steps - decay_start))
            lr = c.lr * (1 - (1 - c.min_lr_frac) * min(1.0, frac))
        elif c.schedule == "exp":
            lr = c.lr * c.min_lr_frac ** ((step - c.warmup) / max(1, c.steps - c.warmup))
        else:
            frac = (step - c.warmup) / max(1, c.steps - c.warmup)
            lr = c.lr * (c.min_lr_frac + (1 - c.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
        if ramp and c.lr_ramp is not None and step >= c.lr_ramp[0]:
            first, last, factor = c.lr_ramp
            lr *= factor ** (min(1.0, (step - first) / max(1, last - first)))
        return lr

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cfg
        g = torch.Generator().manual_seed(c.seed * 1_000_003 + step)
        x, y = windows(self.corpus.train, c.batch, c.ctx, g)
        if c.domain:
            dx, dy = windows(self.domain_train, c.domain_rows, c.ctx, g)
            x[: c.domain_rows], y[: c.domain_rows] = dx, dy
        if step in c.bad_steps:
            n_bad = max(1, round(c.batch * c.bad_fraction))
            bx, by = windows(self.corpus.binary, n_bad, c.ctx, g)
            x[:n_bad], y[:n_bad] = bx, by
        if c.remap_inputs is not None and step >= c.remap_inputs[0]:
            first, last = c.remap_inputs
            n = round(c.batch * min(1.0, (step - first) / max(1, last - first)))
            x[:n] = (x[:n] + 128) % 256  # a changed input encoding; the targets stay the same
        if c.slow_data_from is not None and step >= c.slow_data_from:
            x = self._slow_reload(x, step)
        return x, y

    def _slow_reload(self, x: torch.Tensor, step: int) -> torch.Tensor:
        """The pre-tokenized cache is gone: source files are read from disk and decoded in Python."""
        files = self._files = getattr(self, "_files", None) or stdlib_files()
        for k in range(self.cfg.slow_files):
            data = files[(step * 7 + k) % len(files)].read_bytes()[:20_000]
            _ = torch.tensor([b for b in data.decode("utf-8", "replace").encode("utf-8")])
        return torch.tensor([[int(v) for v in row.tolist()] for row in x])

    @torch.no_grad()
    def val_loss(self, step: int, batches: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> float:
        changed = self.cfg.val_transform_from is not None and step >= self.cfg.val_transform_from
        self.model.eval()
        sets = self.val_sets[changed] if batches is None else batches
        losses = [F.cross_entropy(self.model(x).flatten(0, 1), y.flatten()).item() for x, y in sets]
        self.model.train()
        return sum(losses) / len(losses)

    def norms(self) -> tuple[float, dict[int, float], dict[int, float]]:
        """Total parameter norm, and per-layer gradient and parameter norms."""
        pn = torch.sqrt(sum(p.detach().float().pow(2).sum() for p in self.model.parameters())).item()
        gl, pl = {}, {}
        for i, layer in enumerate(self.model.layers):
            ps = list(layer.parameters())
            gl[i] = torch.sqrt(sum(p.grad.pow(2).sum() for p in ps if p.grad is not None)).item()
            pl[i] = torch.sqrt(sum(p.detach().pow(2).sum() for p in ps)).item()
        return pn, gl, pl

    def train_step(self, log: Logger) -> None:
        c, m = self.cfg, self.model
        self.step += 1
        s = self.step
        t0 = time.process_time()  # CPU time: the shared machine's other jobs must not show up
        x, y = self.batch(s)
        ramped_lr, base = self.lr_at(s), self.lr_at(s, ramp=False)
        lr = base if c.ramp_groups else ramped_lr  # the logged lr: what the main groups get
        for grp in self.opt.param_groups:
            ramped = not c.ramp_groups or self._match(c.ramp_groups, grp["name"])
            grp["lr"] = (ramped_lr if ramped else base) * grp["lr_factor"]
            for first, last, factor, names in c.lr_windows:
                if first <= s <= last and (not names or self._match(names, grp["name"])):
                    grp["lr"] *= factor
            first, last = c.group_wd_ramp
            ramp = min(1.0, max(0.0, (s - first) / max(1, last - first)))
            wd = self._factor(c.group_wd, grp["name"], -1.0)
            grp["weight_decay"] = c.weight_decay if wd < 0 else c.weight_decay + ramp * (wd - c.weight_decay)
        for first, last, factor, names in c.lr_windows:
            if first <= s <= last and not names:
                lr *= factor
        m.act_stats = {} if s % c.every_act == 0 else None
        logits = m(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        if c.leak_from is not None and s >= c.leak_from:
            self.leak.append(logits.detach().clone())  # the bug: a debugging list that is never cleared
        self.opt.zero_grad(set_to_none=True)
        (loss * self.scale).backward()
        grads = [p.grad for p in m.parameters() if p.grad is not None]
        overflow = c.fp16 and any(
            (~torch.isfinite(gr)).any().item() or gr.abs().max().item() > FP16_MAX for gr in grads
        )
        scale_used = self.scale
        if overflow:
            gnorm = float("inf")
            self.scale /= 2.0
            self.growth = 0
            self.skipped += 1
        else:
            for gr in grads:
                gr.div_(scale_used)
            gnorm = torch.sqrt(sum(gr.pow(2).sum() for gr in grads)).item()  # pre-clip
            if s % c.every_layer == 0:
                _, gl, _ = self.norms()
            if c.clip is not None:
                torch.nn.utils.clip_grad_norm_(m.parameters(), c.clip)
            self.opt.step()
            self.growth += 1
            if c.fp16 and self.growth >= c.growth_interval:
                self.scale *= 2.0
                self.growth = 0
        evals: dict[str, float] = {}
        if s % c.every_val == 0 and c.eval_in_step_time:  # the eval runs inside the timed step
            evals["val/loss"] = self.val_loss(s)
        dt = time.process_time() - t0
        self._times.append((dt, x.numel()))

        lv = loss.item()
        # Private tags (leading "_") feed the writers that print them (Megatron); others drop them.
        log.scalar("_skipped", float(overflow), s)
        log.scalar("_step_ms", dt * 1000.0, s)
        log.scalar("_tokens", float(x.numel()), s)
        log.scalar("train/loss", lv, s)
        if math.isfinite(gnorm):
            log.scalar("train/grad_norm", gnorm, s)
        pn, _, pl = self.norms()
        log.scalar("train/param_norm", pn, s)
        log.scalar("train/lr", lr, s)
        if c.fp16:
            log.scalar("train/loss_scale", scale_used, s)
        if s % c.every_layer == 0:
            if not overflow:
                for i, v in gl.items():
                    log.scalar(f"grad_norm/layers.{i}", v, s)
            for i, v in pl.items():
                log.scalar(f"param_norm/layers.{i}", v, s)
        if m.act_stats:
            for i, (mean, std, amax) in sorted(m.act_stats.items()):
                log.scalar(f"act/mean/block_{i}", mean, s)
                log.scalar(f"act/std/block_{i}", std, s)
                log.scalar(f"act/absmax/block_{i}", amax, s)
        if s % c.every_sys == 0:
            secs = sum(t for t, _ in self._times)
            toks = sum(n for _, n in self._times)
            log.scalar("train/tokens_per_sec", toks / secs, s)
            log.scalar("train/step_time", secs / len(self._times), s)
            log.scalar("memory/rss_mb", rss_mb(), s)
            self._times.clear()
        if s % c.every_val == 0:
            if c.domain:  # several eval sets, each logged under its own name
                log.scalar("val/stdlib/loss", self.val_loss(s), s)
                log.scalar(f"val/{c.domain}/loss", self.val_loss(s, self.domain_sets), s)
            else:
                log.scalar("val/loss", evals["val/loss"] if evals else self.val_loss(s), s)
        if c.crash_at is not None and s == c.crash_at:
            log.flush()
            raise RuntimeError(f"simulated crash after step {s}")

    def run(self, log: Logger, until: int | None = None, on_step: Callable[["Trainer"], None] | None = None) -> None:
        self._times: list[tuple[float, int]] = []
        until = until or self.cfg.steps
        while self.step < until:
            self.train_step(log)
            if on_step:
                on_step(self)
        log.flush()

    # checkpoints (kept outside the run folder: they are not part of the sample)
    def save(self, path: Path) -> None:
        torch.save(
            {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "scale": self.scale,
             "growth": self.growth, "step": self.step, "skipped": self.skipped},
            path,
        )

    def load(self, path: Path) -> None:
        st = torch.load(path, weights_only=False)
        self.model.load_state_dict(st["model"])
        self.opt.load_state_dict(st["opt"])
        self.scale, self.growth, self.step, self.skipped = st["scale"], st["growth"], st["step"], st["skipped"]


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":  # quick speed check
    class _Print:
        def scalar(self, tag: str, value: float, step: int) -> None:
            if tag in ("train/loss", "val/loss", "train/grad_norm", "train/tokens_per_sec") and step % 20 == 0:
                print(step, tag, round(value, 4))

        def flush(self) -> None:
            pass

    t = Trainer(Config("speed", steps=int(os.environ.get("STEPS", "100"))))
    print("params", n_params(t.model), "train bytes", len(t.corpus.train))
    t0 = time.time()
    t.run(_Print())
    print("secs", time.time() - t0)
