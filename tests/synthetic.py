"""Seeded synthetic series that return the ground truth they injected (ruptures' pw_constant style).

Each generator returns ``(frame, truth)``: a long canonical frame ready for
``run_from_frame`` and a dict of what was injected (steps, kinds). Used to assert that
detectors land within a tolerance of the injected step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from forensics.run import Run
from forensics.schema import add_canonical, conform


def long_frame(series: dict[str, tuple[np.ndarray, np.ndarray]], source: str = "synthetic") -> pl.DataFrame:
    """Build a canonical frame from {tag: (steps, values)}; tags are mapped through the alias table."""
    parts = []
    for tag, (steps, values) in series.items():
        parts.append(pl.DataFrame({"step": np.asarray(steps, dtype=np.int64), "value": np.asarray(values, dtype=np.float64)}).with_columns(pl.lit(tag).alias("tag")))
    f = pl.concat(parts).with_columns(
        pl.lit(source).alias("source"), pl.lit("synthetic").alias("file"), pl.lit(0).alias("file_idx"),
        pl.int_range(pl.len()).alias("record_idx"), pl.lit("step").alias("x_kind"), pl.lit(0).alias("segment"),
        (pl.col("step").cast(pl.Float64) * 0.5 + 1.7e9).alias("wall_time"),
    )
    return add_canonical(conform(f))


def run_from_frame(frame: pl.DataFrame, name: str = "synthetic") -> Run:
    return Run(name=name, path=Path("/nonexistent") / name, format="synthetic", frame=frame)


def healthy_loss(n: int = 3000, seed: int = 0, every: int = 1, noise: float = 0.02) -> tuple[np.ndarray, np.ndarray]:
    """A falling, noisy pre-training loss curve: fast drop at the start, then a slow power law."""
    rng = np.random.default_rng(seed)
    steps = np.arange(0, n, every)
    base = 2.0 + 8.0 / (1.0 + steps / 40.0) ** 0.7
    return steps, base * np.exp(rng.normal(0.0, noise, len(steps)))


def healthy_grad_norm(n: int = 3000, seed: int = 1, every: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    steps = np.arange(0, n, every)
    base = 0.6 + 2.0 * np.exp(-steps / 150.0)
    return steps, base * np.exp(rng.normal(0.0, 0.08, len(steps)))
