"""Synthetic LLM-shaped training logs for the benchmark suite (written outside git).

Per step: loss, lr, grad norm, loss scale, tokens/s, memory; every 50 steps the grad and
param norm of each of 32 layers; every 500 steps the validation loss. A 1M-step run is about
7.3M logged points. The same numbers are written as TensorBoard event files (a direct
record writer, byte-compatible with tensorboardX's scalar records), JSONL and a Megatron-LM
stdout log (with the same fields as JSONL, for the polars reference); a wide run logs 96
layers x 2 norms every 10 steps.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

LAYER_EVERY = 50
VAL_EVERY = 500
T0 = 1.7e9  # wall time of step 0 (unix seconds)

PER_STEP = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "loss_scale": "train/loss_scale",
    "tokens_per_sec": "train/tokens_per_sec",
    "memory": "train/memory",
}


@dataclass
class Series:
    """The numbers of one synthetic run (float32-exact, so every format holds the same)."""

    steps: np.ndarray
    wall: np.ndarray
    per_step: dict[str, np.ndarray]  # key of PER_STEP -> value per step
    layer_steps: np.ndarray
    layers: dict[str, np.ndarray]  # tag -> value at each layer step
    val_steps: np.ndarray
    val: np.ndarray

    @property
    def points(self) -> int:
        return (
            len(self.steps) * len(self.per_step)
            + len(self.layer_steps) * len(self.layers)
            + len(self.val_steps)
        )


def series(
    n_steps: int, *, n_layers: int = 32, layer_every: int = LAYER_EVERY, seed: int = 0
) -> Series:
    """A pre-training run: decaying loss with noise and a few spikes, warm-up + cosine LR,
    fp16 loss scale with rare overflows, steady throughput with checkpoint dips."""
    rng = np.random.default_rng(seed)
    s = np.arange(n_steps, dtype=np.int64)
    x = s.astype(np.float64)
    loss = 2.0 + 8.0 / (1.0 + x / 2000.0) + rng.normal(0, 0.02, n_steps)
    for at in rng.integers(n_steps // 10, max(n_steps // 10 + 1, n_steps - 10), 3):
        loss[at : at + 5] += np.array([1.5, 0.8, 0.4, 0.2, 0.1])[: len(loss[at : at + 5])]
    warm = max(1, min(2000, n_steps // 20))
    lr = np.where(
        s < warm,
        3e-4 * (x + 1) / warm,
        3e-5 + 0.5 * (3e-4 - 3e-5) * (1 + np.cos(np.pi * (x - warm) / max(1, n_steps - warm))),
    )
    gn = 0.3 + 0.05 * rng.standard_normal(n_steps) ** 2 + 2.0 / (1.0 + x / 500.0)
    scale = np.full(n_steps, 65536.0)
    for at in rng.integers(1, max(2, n_steps - 1), max(1, n_steps // 200_000)):
        scale[at : at + 1000] = 32768.0
    tps = 1.2e5 * (1 + 0.01 * rng.standard_normal(n_steps))
    tps[::1000] *= 0.7  # checkpoint saves
    mem = 61.25 + 0.01 * rng.standard_normal(n_steps)
    dt = 0.5 * 1.2e5 / tps
    wall = T0 + np.cumsum(dt)
    ls = s[::layer_every]
    layers: dict[str, np.ndarray] = {}
    for i in range(n_layers):
        base = 0.05 + 0.01 * i / n_layers
        layers[f"grad_norm/layers.{i}"] = base + 0.002 * rng.standard_normal(len(ls))
        layers[f"param_norm/layers.{i}"] = 40.0 + 0.00001 * ls + 0.01 * rng.standard_normal(len(ls))
    vs = s[::VAL_EVERY]
    val = 2.05 + 8.0 / (1.0 + vs / 2000.0) + rng.normal(0, 0.005, len(vs))
    f32 = lambda a: a.astype(np.float32).astype(np.float64)  # noqa: E731
    return Series(
        steps=s,
        wall=wall,
        per_step={
            "loss": f32(loss),
            "lr": f32(lr),
            "grad_norm": f32(gn),
            "loss_scale": f32(scale),
            "tokens_per_sec": f32(tps),
            "memory": f32(mem),
        },
        layer_steps=ls,
        layers={k: f32(v) for k, v in layers.items()},
        val_steps=vs,
        val=f32(val),
    )


# ------------------------------------------------------------------- TensorBoard records
def _crc_fn():  # noqa: ANN202
    try:
        from crc32c import crc32c

        return crc32c
    except ImportError:  # pragma: no cover - crc32c ships with the test extra
        from tensorboardX.crc32c import crc32c

        return crc32c


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


class EventWriter:
    """Writes TensorBoard records as tensorboardX does for ``add_scalar`` (event fields in
    number order, step omitted at 0 as proto3 does, masked CRC-32C on length and data)."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("wb")
        self._crc = _crc_fn()
        self._tag_cache: dict[str, bytes] = {}
        self._buf: list[bytes] = []
        self._record(b"\x09" + struct.pack("<d", T0) + b"\x1a\x0dbrain.Event:2")

    def _record(self, data: bytes) -> None:
        head = struct.pack("<Q", len(data))
        crc = self._crc
        self._buf.append(
            head
            + struct.pack("<I", _masked(crc(head)))
            + data
            + struct.pack("<I", _masked(crc(data)))
        )
        if len(self._buf) >= 65536:
            self._f.write(b"".join(self._buf))
            self._buf.clear()

    def scalar(self, tag: str, value: float, step: int, wall_time: float) -> None:
        t = self._tag_cache.get(tag)
        if t is None:
            tb = tag.encode()
            t = self._tag_cache[tag] = b"\x0a" + _varint(len(tb)) + tb + b"\x15"
        inner = t + struct.pack("<f", value)
        val = b"\x0a" + _varint(len(inner)) + inner
        summ = b"\x2a" + _varint(len(val)) + val
        step_b = b"\x10" + _varint(step) if step else b""
        self._record(b"\x09" + struct.pack("<d", wall_time) + step_b + summ)

    def close(self) -> None:
        self._f.write(b"".join(self._buf))
        self._buf.clear()
        self._f.close()


def _rows(ser: Series):  # noqa: ANN202 - yields (step, wall, [(tag, value)]) in log order
    keys = list(PER_STEP)
    cols = [ser.per_step[k].tolist() for k in keys]
    tags = [PER_STEP[k] for k in keys]
    layer_at = {int(s): i for i, s in enumerate(ser.layer_steps.tolist())}
    layer_cols = [(t, v.tolist()) for t, v in ser.layers.items()]
    val_at = {int(s): i for i, s in enumerate(ser.val_steps.tolist())}
    val = ser.val.tolist()
    for j, (s, w) in enumerate(zip(ser.steps.tolist(), ser.wall.tolist(), strict=True)):
        items = [(tags[k], cols[k][j]) for k in range(len(keys))]
        li = layer_at.get(s)
        if li is not None:
            items.extend((t, v[li]) for t, v in layer_cols)
        vi = val_at.get(s)
        if vi is not None:
            items.append(("val/loss", val[vi]))
        yield s, w, items


def write_tfevents(folder: Path, ser: Series) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "events.out.tfevents.1700000000.bench.1.0"
    w = EventWriter(path)
    for s, wt, items in _rows(ser):
        for tag, v in items:
            w.scalar(tag, v, s, wt)
    w.close()
    return path


def write_jsonl(folder: Path, ser: Series) -> Path:
    """One object per step: ``step``, ``_timestamp`` and every tag logged at that step."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "metrics.jsonl"
    with path.open("w") as f:
        buf: list[str] = []
        for s, wt, items in _rows(ser):
            d = {"step": s, "_timestamp": wt}
            d.update(items)
            buf.append(json.dumps(d))
            if len(buf) >= 50_000:
                f.write("\n".join(buf) + "\n")
                buf.clear()
        if buf:
            f.write("\n".join(buf) + "\n")
    return path


def write_megatron(folder: Path, ser: Series) -> tuple[Path, Path]:
    """A Megatron-LM stdout log (dated iteration lines, a preamble) and the same numbers as
    JSONL (the reference polars reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    log, ref = folder / "megatron.out", folder / "megatron_same_numbers.jsonl"
    n = len(ser.steps)
    p = ser.per_step
    loss, lr, gn, scale = (p[k].tolist() for k in ("loss", "lr", "grad_norm", "loss_scale"))
    ms = (1000 * np.diff(ser.wall, prepend=ser.wall[0] - 0.5)).tolist()
    tflops = (p["tokens_per_sec"] / 1e3).tolist()
    wall = ser.wall.tolist()
    import datetime as _dt

    with log.open("w") as f, ref.open("w") as g:
        f.write("using world size: 64, data-parallel size: 8, tensor-model-parallel size: 8\n")
        for i in range(50):
            f.write(f"  arg_{i:03d} ........................................ {i}\n")
        fb: list[str] = []
        gb: list[str] = []
        for j in range(n):
            it = j + 1
            when = _dt.datetime.fromtimestamp(wall[j], _dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
            fb.append(
                f" [{when}] iteration {it:8d}/ {n:8d} | consumed samples: {it * 512:12d} | "
                f"elapsed time per iteration (ms): {ms[j]:.1f} | throughput per GPU (TFLOP/s/GPU): {tflops[j]:.1f} | "  # noqa: E501
                f"learning rate: {lr[j]:.6E} | global batch size:   512 | lm loss: {loss[j]:.6E} | "
                f"loss scale: {scale[j]:.1f} | grad norm: {gn[j]:.3f} | number of skipped iterations:   0 | "  # noqa: E501
                f"number of nan iterations:   0 |\n"
            )
            gb.append(
                f'{{"iteration": {it}, "consumed samples": {it * 512}, '
                f'"elapsed time per iteration (ms)": {ms[j]:.1f}, '
                f'"throughput per GPU (TFLOP/s/GPU)": {tflops[j]:.1f}, "learning rate": {lr[j]:.6E}, '  # noqa: E501
                f'"global batch size": 512, "lm loss": {loss[j]:.6E}, "loss scale": {scale[j]:.1f}, '  # noqa: E501
                f'"grad norm": {gn[j]:.3f}, "number of skipped iterations": 0, '
                f'"number of nan iterations": 0}}\n'
            )
            if len(fb) >= 50_000:
                f.write("".join(fb))
                g.write("".join(gb))
                fb.clear()
                gb.clear()
        f.write("".join(fb))
        g.write("".join(gb))
    return log, ref


def build(root: Path, kind: str, n_steps: int) -> Path:
    """The run folder for (kind, size) under root, written once and reused."""
    folder = root / f"{kind}_{n_steps}"
    done = folder / ".complete"
    if done.exists():
        return folder
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    if kind == "wide":
        ser = series(n_steps, n_layers=96, layer_every=10)
    else:
        ser = series(n_steps)
    if kind in ("tfevents", "wide"):
        write_tfevents(folder / "run", ser)
    elif kind == "jsonl":
        write_jsonl(folder / "run", ser)
    elif kind == "megatron":
        log, ref = write_megatron(folder / "run", ser)
        ref.replace(folder / ref.name)  # the reference JSONL stays out of the run folder
    else:
        raise ValueError(kind)
    (folder / "points").write_text(str(ser.points if kind != "megatron" else n_steps * 11))
    done.write_text("")
    return folder
