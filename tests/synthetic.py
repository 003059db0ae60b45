"""Seeded synthetic series that return the ground truth they injected (ruptures' pw_constant style).

Each generator returns ``(frame, truth)``: a long canonical frame ready for
``run_from_frame`` and a dict of what was injected (steps, kinds). Used to assert that
detectors land within a tolerance of the injected step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from forensics.run import Run
from forensics.schema import add_canonical, conform


def long_frame(
    series: dict[str, tuple[np.ndarray, np.ndarray]], source: str = "synthetic"
) -> pl.DataFrame:
    """Build a canonical frame from {tag: (steps, values)}; tags are mapped through the alias
    table."""
    parts = []
    for tag, (steps, values) in series.items():
        parts.append(
            pl.DataFrame(
                {
                    "step": np.asarray(steps, dtype=np.int64),
                    "value": np.asarray(values, dtype=np.float64),
                }
            ).with_columns(pl.lit(tag).alias("tag"))
        )
    f = pl.concat(parts).with_columns(
        pl.lit(source).alias("source"),
        pl.lit("synthetic").alias("file"),
        pl.lit(0).alias("file_idx"),
        pl.int_range(pl.len()).alias("record_idx"),
        pl.lit("step").alias("x_kind"),
        pl.lit(0).alias("segment"),
        (pl.col("step").cast(pl.Float64) * 0.5 + 1.7e9).alias("wall_time"),
    )
    return add_canonical(conform(f))


def run_from_frame(frame: pl.DataFrame, name: str = "synthetic") -> Run:
    return Run(name=name, path=Path("/nonexistent") / name, format="synthetic", frame=frame)


def healthy_loss(
    n: int = 3000, seed: int = 0, every: int = 1, noise: float = 0.02
) -> tuple[np.ndarray, np.ndarray]:
    """A falling, noisy pre-training loss curve: fast drop at the start, then a slow power law."""
    rng = np.random.default_rng(seed)
    steps = np.arange(0, n, every)
    base = 2.0 + 8.0 / (1.0 + steps / 40.0) ** 0.7
    return steps, base * np.exp(rng.normal(0.0, noise, len(steps)))


def healthy_grad_norm(
    n: int = 3000, seed: int = 1, every: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    steps = np.arange(0, n, every)
    base = 0.6 + 2.0 * np.exp(-steps / 150.0)
    return steps, base * np.exp(rng.normal(0.0, 0.08, len(steps)))


# ---------------------------------------------------------------------------------------
# Trend forensics (issue 7): each returns (frame, truth). Names start with ``trend_``.
# ---------------------------------------------------------------------------------------


def _warmup_cosine_lr(
    steps: np.ndarray,
    peak: float = 6e-4,
    warmup: int = 300,
    total: int | None = None,
    floor: float = 0.0,
) -> np.ndarray:
    total = int(steps[-1]) + 1 if total is None else total
    w = np.minimum(1.0, (steps + 1) / warmup)
    prog = np.clip((steps - warmup) / max(1, total - warmup), 0.0, 1.0)
    cos = floor + (1 - floor) * 0.5 * (1 + np.cos(np.pi * prog))
    return peak * np.where(steps < warmup, w, cos)


def _constant_lr(steps: np.ndarray, peak: float = 3e-4, warmup: int = 300) -> np.ndarray:
    return peak * np.minimum(1.0, (steps + 1) / warmup)


def trend_healthy(
    n: int = 10000, every: int = 10, seed: int = 0, val_every: int = 500
) -> tuple[pl.DataFrame, dict]:
    """A healthy pre-training run: falling loss and val loss, flat grad norm, steady param-norm
    growth."""
    rng = np.random.default_rng(seed)
    steps = np.arange(0, n, every)
    loss = 2.0 + 8.0 / (1.0 + steps / 40.0) ** 0.7
    gn = (0.5 + 2.0 * np.exp(-steps / 150.0)) * np.exp(rng.normal(0, 0.08, len(steps)))
    pn = 100.0 * (1 + 0.3 * steps / n) + rng.normal(0, 0.01, len(steps))
    vs = np.arange(val_every, n, val_every)
    val = 2.05 + 8.0 / (1.0 + vs / 40.0) ** 0.7 + rng.normal(0, 0.005, len(vs))
    series = {
        "train/loss": (steps, loss * np.exp(rng.normal(0, 0.02, len(steps)))),
        "grad_norm": (steps, gn),
        "param_norm": (steps, pn),
        "lr": (steps, _warmup_cosine_lr(steps, total=n, floor=0.1)),
        "tokens_per_sec": (steps, 50000 * np.exp(rng.normal(0, 0.03, len(steps)))),
        "memory/max_reserved(GiB)": (
            steps,
            30.0 - 8.0 * np.exp(-steps / 200.0) + rng.normal(0, 0.02, len(steps)),
        ),
        "val/loss": (vs, val),
    }
    return long_frame(series), {}


def trend_grad_norm_drift(
    n: int = 10000,
    onset: int = 6500,
    base: float = 0.8,
    end: float = 2.5,
    every: int = 10,
    seed: int = 0,
    loss_rises: bool = False,
    spikes: int = 5,
) -> tuple[pl.DataFrame, dict]:
    """The article's case: grad norm flat near ``base`` then climbing to ``end`` from ``onset``;
    loss falls smoothly."""
    rng = np.random.default_rng(seed)
    steps = np.arange(0, n, every)
    level = (
        base
        + 1.5 * np.exp(-steps / 100.0)
        + np.where(steps > onset, (end - base) * (steps - onset) / (n - onset), 0.0)
    )
    gn = level * np.exp(rng.normal(0, 0.06, len(steps)))
    spike_at = rng.choice(len(steps), spikes, replace=False)
    gn[spike_at] *= 8.0  # isolated spikes must not count as drift
    loss = 2.0 + 8.0 / (1.0 + steps / 40.0) ** 0.7
    if loss_rises:
        loss = loss + np.where(steps > onset, 1.5 * (steps - onset) / (n - onset), 0.0)
    series = {
        "loss": (steps, loss * np.exp(rng.normal(0, 0.02, len(steps)))),
        "grad_norm": (steps, gn),
        "lr": (steps, _constant_lr(steps)),
    }
    return long_frame(series), {"onset": onset, "baseline": base, "end": end, "ratio": end / base}


def trend_eval_regression(
    n: int = 10000,
    best: int = 6000,
    drop: float = 3.0,
    every: int = 10,
    eval_every: int = 500,
    seed: int = 0,
    name: str = "eval/benchmark",
    lower_better: bool = False,
    with_drift: bool = False,
) -> tuple[pl.DataFrame, dict]:
    """A benchmark that improves until ``best`` then loses ``drop`` points by the end, while the
    loss keeps falling."""
    rng = np.random.default_rng(seed)
    frame, _ = trend_grad_norm_drift(
        n=n, onset=best + 500 if with_drift else n * 10, every=every, seed=seed, spikes=0
    )
    es = np.arange(eval_every, n + 1, eval_every)
    score = 40.0 + 15.0 * (1 - np.exp(-es / 2500.0))
    at_best = 40.0 + 15.0 * (1 - np.exp(-best / 2500.0))
    score = np.where(es <= best, score, at_best - drop * (es - best) / (n - best))
    score = score + rng.normal(0, 0.3, len(es))
    if lower_better:
        score = 100.0 - score
    extra = long_frame({name: (es, score)})
    return pl.concat([frame, extra]), {"best": best, "drop": drop}


def trend_param_norm(
    n: int = 8000,
    every: int = 10,
    jump_at: int | None = 5000,
    jump: float = 0.08,
    growth: float = 0.3,
    seed: int = 0,
) -> tuple[pl.DataFrame, dict]:
    """Param norm growing slowly (``growth`` over the run) with an optional abrupt ``jump``
    (fraction) at ``jump_at``."""
    rng = np.random.default_rng(seed)
    steps = np.arange(0, n, every)
    pn = 120.0 * (1 + growth * steps / n)
    if jump_at is not None:
        pn = pn * np.where(steps >= jump_at, 1 + jump, 1.0)
    pn = pn * (1 + rng.normal(0, 2e-4, len(steps)))
    series = {
        "loss": healthy_loss(n, seed, every)[0:2],
        "param_norm": (steps, pn),
        "lr": (steps, _constant_lr(steps)),
    }
    return long_frame(series), {"jump_at": jump_at, "jump": jump}


def trend_layer_shift(
    n: int = 10000,
    n_layers: int = 12,
    group: tuple[int, ...] = (0, 1, 2, 3),
    before: float = 0.08,
    after: float = 0.20,
    onset: int = 5000,
    every: int = 500,
    seed: int = 0,
    shift: bool = True,
) -> tuple[pl.DataFrame, dict]:
    """Per-layer grad norms whose ``group`` share of the squared total goes from ``before`` to
    ``after`` from ``onset``."""
    rng = np.random.default_rng(seed)
    steps = np.arange(0, n, every)
    prog = np.clip((steps - onset) / max(1, n - onset), 0, 1) if shift else np.zeros(len(steps))
    share_g = before + (after - before) * prog
    others = [i for i in range(n_layers) if i not in group]
    series: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    total_sq = 1.0
    for i in range(n_layers):
        sh = share_g / len(group) if i in group else (1 - share_g) / len(others)
        norm = np.sqrt(sh * total_sq) * np.exp(rng.normal(0, 0.03, len(steps)))
        series[f"grad_norm/layers.{i}"] = (steps, norm)
        growth = 0.6 if (i in group and shift) else 0.15
        series[f"param_norm/layers.{i}"] = (steps, 10.0 * (1 + growth * steps / n))
    series["loss"] = healthy_loss(n, seed, every)
    return long_frame(series), {"onset": onset, "group": list(group)}


def trend_activations(
    n: int = 6000,
    every: int = 100,
    n_layers: int = 6,
    absmax_layer: int | None = 3,
    absmax_at: int = 4000,
    std_layer: int | None = None,
    std_at: int = 3000,
    seed: int = 0,
) -> tuple[pl.DataFrame, dict]:
    """Per-layer activation stats; optional absmax blow-up past 1e4 and an optional std jump."""
    rng = np.random.default_rng(seed)
    steps = np.arange(0, n, every)
    series: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for i in range(n_layers):
        amax = 50.0 * (1 + 0.2 * steps / n) * np.exp(rng.normal(0, 0.05, len(steps)))
        if i == absmax_layer:
            amax = np.where(steps >= absmax_at, 3.0e4 * (1 + (steps - absmax_at) / n), amax)
        std = 1.0 * np.exp(rng.normal(0, 0.03, len(steps)))
        if i == std_layer:
            std = np.where(steps >= std_at, std * 6.0, std)
        series[f"act/absmax/layers.{i}"] = (steps, amax)
        series[f"act/std/layers.{i}"] = (steps, std)
    series["loss"] = healthy_loss(n, seed, 10)
    return long_frame(series), {
        "absmax_layer": absmax_layer,
        "absmax_at": absmax_at,
        "std_layer": std_layer,
        "std_at": std_at,
    }


def trend_train_val(
    case: str = "overfit",
    n: int = 12000,
    every: int = 10,
    val_every: int = 250,
    onset: int = 7000,
    seed: int = 0,
    steps_per_epoch: int | None = None,
    ramp: int = 3000,
) -> tuple[pl.DataFrame, dict]:
    """Train and val loss for ``case`` in {healthy, overfit, accelerate, val_shift}; onset is the
    injected change.

    overfit: val turns up at ``onset`` while train keeps falling. accelerate: train falls faster
    from ``onset`` so the gap widens faster, while val never turns up. val_shift: train flat, val
    jumps 1.95 -> 2.1 over ``ramp`` steps
    from ``onset`` then stays flat (the article's snapshot effect).
    """
    rng = np.random.default_rng(seed)
    steps = np.arange(0, n, every)
    vs = np.arange(val_every, n + 1, val_every)
    if case == "val_shift":
        train = 1.9 + 0.0 * steps
        val = np.full(len(vs), 1.95)
        val = val + 0.15 * np.clip((vs - onset) / max(ramp, 1), 0, 1)
    else:
        train = 1.5 + 2.0 / (1.0 + steps / 500.0) ** 0.6
        val_base = 1.55 + 2.0 / (1.0 + vs / 500.0) ** 0.6
        if case == "overfit":
            val = val_base + np.where(
                vs > onset, 1.2e-4 * (vs - onset) + 4e-9 * (vs - onset) ** 2, 0.0
            )
            # turn val up: the falling base is cancelled and more beyond onset
            val = np.where(
                vs > onset,
                (1.55 + 2.0 / (1.0 + onset / 500.0) ** 0.6)
                + 6e-5 * (vs - onset)
                + 6e-9 * (vs - onset) ** 2,
                val,
            )
        elif case == "accelerate":
            # train starts memorising: it falls faster from onset while val keeps falling slowly
            train = train - np.where(steps > onset, 4.0e-9 * (steps - onset) ** 2, 0.0)
            val = val_base
        else:
            val = val_base
    series = {
        "loss": (steps, train * np.exp(rng.normal(0, 0.01, len(steps)))),
        "val_loss": (vs, val + rng.normal(0, 0.003, len(vs))),
        "lr": (steps, _constant_lr(steps)),
    }
    if steps_per_epoch:
        series["epoch"] = (steps, steps / steps_per_epoch)
    return long_frame(series), {"onset": onset, "case": case}


def trend_plateau(
    n: int = 12000,
    every: int = 10,
    case: str = "stuck",
    seed: int = 0,
) -> tuple[pl.DataFrame, dict]:
    """Loss shapes for the plateau check: ``stuck`` (flat from the start at a constant LR),
    ``cosine_end`` (learning, then flat while the cosine LR decays to ~0), ``learning``
    (healthy)."""
    rng = np.random.default_rng(seed)
    steps = np.arange(0, n, every)
    if case == "stuck":
        loss = np.full(len(steps), 7.6)
        lr = _constant_lr(steps, warmup=200)
    elif case == "cosine_end":
        lr = _warmup_cosine_lr(steps, total=n)
        flat_from = int(0.6 * n)
        curve = 2.0 + 8.0 / (1.0 + np.minimum(steps, flat_from) / 40.0) ** 0.7
        loss = curve
    else:
        lr = _warmup_cosine_lr(steps, total=n, floor=0.1)
        loss = 2.0 + 8.0 / (1.0 + steps / 40.0) ** 0.7
    series = {"loss": (steps, loss * np.exp(rng.normal(0, 0.01, len(steps)))), "lr": (steps, lr)}
    return long_frame(series), {"case": case}


def trend_infra(
    n: int = 6000,
    every: int = 10,
    drop: tuple[int, int] | None = (3000, 3600),
    drop_frac: float = 0.45,
    stall_at: int | None = None,
    stall_seconds: float = 3600.0,
    leak: float = 0.0,
    use_step_time: bool = False,
    seed: int = 0,
) -> tuple[pl.DataFrame, dict]:
    """Throughput (or step time), memory and wall times: optional throughput drop window, a stall, a
    memory leak.

    ``leak`` is GiB per 1000 steps of steady growth after step 500.
    """
    rng = np.random.default_rng(seed)
    steps = np.arange(0, n, every)
    tps = 40000.0 * np.exp(rng.normal(0, 0.03, len(steps)))
    if drop is not None:
        tps = np.where((steps >= drop[0]) & (steps < drop[1]), tps * (1 - drop_frac), tps)
    mem = (
        20.0
        - 4.0 * np.exp(-steps / 100.0)
        + leak * np.maximum(0, steps - 500) / 1000.0
        + rng.normal(0, 0.01, len(steps))
    )
    series = {"loss": healthy_loss(n, seed, every), "memory": (steps, mem)}
    if use_step_time:
        series["step_time"] = (steps, 4096 * 8 / tps)
    else:
        series["tokens_per_sec"] = (steps, tps)
    frame = long_frame(series)
    if stall_at is not None:
        frame = frame.with_columns(
            (
                pl.col("wall_time")
                + pl.when(pl.col("step") >= stall_at).then(stall_seconds).otherwise(0.0)
            ).alias("wall_time")
        )
    return frame, {"drop": drop, "drop_frac": drop_frac, "stall_at": stall_at, "leak": leak}


# -- spikes, NaN, divergence, loss scale (spike forensics) ----------------------------------------
def spike_factor(
    steps: np.ndarray,
    at: int,
    height: float,
    *,
    width: int = 1,
    tau: float = 0.0,
    shift: float = 0.0,
) -> np.ndarray:
    """Multiplicative spike: x(1 + height) for ``width`` steps from ``at``, then an exponential
    return with time constant ``tau`` steps towards a level ``shift`` away from the trend."""
    t = np.asarray(steps, dtype=float)
    f = np.ones_like(t)
    on = t >= at
    f[on] *= 1.0 + shift
    top = on & (t < at + width)
    f[top] *= 1.0 + height
    if tau > 0:
        tail = t >= at + width
        f[tail] *= 1.0 + height * np.exp(-(t[tail] - at - width + 1) / tau)
    return f


def spiky_loss(
    n: int = 3000,
    *,
    spikes: list[dict] | None = None,
    seed: int = 0,
    every: int = 1,
    noise: float = 0.02,
) -> tuple[tuple[np.ndarray, np.ndarray], list[dict]]:
    """healthy_loss with spikes injected; each spike dict is spike_factor's keyword arguments plus
    ``at``. Returns ((steps, values), truth) where truth lists the injected spikes."""
    steps, values = healthy_loss(n, seed=seed, every=every, noise=noise)
    truth = []
    for sp in spikes or []:
        values = values * spike_factor(steps, **sp)
        truth.append(dict(sp))
    return (steps, values), truth


def excerpt(
    steps: np.ndarray, values: np.ndarray, start: int, lines: int
) -> tuple[np.ndarray, np.ndarray]:
    """``lines`` consecutive logged points from index ``start`` (a log excerpt from
    mid-training)."""
    return steps[start : start + lines], values[start : start + lines]


def llmc_line(step: int, loss: float, lr: float, grad_norm: float) -> str:
    """One training line of an llm.c ``main.log``, as its trainer prints it."""
    return f"s:{step} trl:{loss:.4f} lr:{lr:.6f} norm:{grad_norm:.4f}"


def llmc_val_line(step: int, val_loss: float) -> str:
    """One validation line of an llm.c ``main.log``."""
    return f"s:{step} tel:{val_loss:.4f}"


def write_llmc_log(folder: Path, lines: list[str]) -> Path:
    """``folder/main.log`` holding ``lines`` (the folder is made); returns the folder."""
    folder.mkdir(parents=True)
    (folder / "main.log").write_text("\n".join(lines) + "\n")
    return folder


def jsonl_row(step: int, rng: np.random.Generator) -> dict[str, float | int]:
    """One line of a healthy JSONL metrics log: a loss falling from 5 towards 2 with noise,
    a grad norm near 1, a constant LR (two draws from ``rng``: the loss's, then the grad
    norm's)."""
    return {
        "step": step,
        "loss": 2 + 3 / (1 + step / 500) + rng.normal(0, 0.02),
        "grad_norm": 1.0 + 0.05 * rng.standard_normal(),
        "lr": 3e-4,
    }


def drift_cause(folder: Path, cause: str, article_words: str) -> tuple[Any, int, Any]:
    """Analyze ``folder``: its diagnosis, the index of its grad_norm_drift finding and that
    finding's tested ``cause``, checking that the article's cause in ``article_words`` is not
    also listed untested in its own words (the tested cause covers it)."""
    from forensics.findings import FindingKind
    from forensics.pipeline import analyze

    diag = analyze(folder)
    i = next(k for k, f in enumerate(diag.findings) if f.kind is FindingKind.GRAD_NORM_DRIFT)
    (c,) = [c for c in diag.causes[i] if c.cause == cause]
    assert not [
        a for a in diag.causes[i] if a.cause == "article" and a.text.startswith(article_words)
    ]
    return diag, i, c
