"""The protobuf fallback for TensorBoard records the fast scanner does not decode.

Handles ``simple_value`` with unusual framing, new-style tensor scalars of any dtype
(``float_val``, ``double_val``, ``int_val``, ``int64_val``, ``half_val`` or ``tensor_content``),
histograms (TF1 ``HistogramProto`` and TF2 ``[k, 3]`` bucket tensors), ``SessionLog.START``
purge marks and hparams. Images, audio, text and graphs carry no vital signs and are skipped.

A histogram becomes extra scalar series named ``<tag>/<stat>`` for the stats in
:data:`HIST_STATS`: ``min``, ``max``, ``mean``, ``std``, ``absmax`` (max of |min|, |max|) and
``norm`` (the L2 norm of the logged tensor, sqrt(sum of squares): for a gradient histogram
that is the tensor's gradient norm).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forensics.importers.tb_histograms import norm_bound

HIST_STATS = ("min", "max", "mean", "std", "absmax", "norm")

# TensorProto dtype -> numpy dtype for tensor_content.
_DTYPES = {
    1: "<f4",
    2: "<f8",
    3: "<i4",
    4: "u1",
    5: "<i2",
    6: "i1",
    9: "<i8",
    10: "?",
    19: "<f2",
    17: "<u2",
    22: "<u4",
    23: "<u8",
}
_BFLOAT16 = 14


@dataclass
class ProtoRows:
    rec: list[int] = field(default_factory=list)
    sub: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    tag: list[str] = field(default_factory=list)
    value: list[float] = field(default_factory=list)
    wall_time: list[float] = field(default_factory=list)
    purges: list[tuple[int, int]] = field(
        default_factory=list
    )  # (record, step) of SessionLog.START
    hparams: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)  # ignored value kinds -> count
    # histogram tag -> worst relative error of its norm (0.0: exact, from sum_squares)
    hist: dict[str, float] = field(default_factory=dict)

    def add(self, rec: int, sub: int, step: int, tag: str, value: float, wall: float) -> None:
        self.rec.append(rec)
        self.sub.append(sub)
        self.step.append(step)
        self.tag.append(tag)
        self.value.append(value)
        self.wall_time.append(wall)


def tensor_values(t: Any) -> np.ndarray | None:
    """The numbers of a TensorProto as float64 (None when it holds strings or nothing)."""
    for name in (
        "double_val",
        "float_val",
        "int64_val",
        "int_val",
        "uint64_val",
        "uint32_val",
        "bool_val",
    ):
        vals = getattr(t, name, None)
        if vals is not None and len(vals):
            return np.asarray(list(vals), dtype=np.float64)
    if len(t.half_val):  # float16 / bfloat16 bit patterns stored in an int field
        bits = np.asarray(list(t.half_val), dtype=np.uint16)
        if t.dtype == _BFLOAT16:
            return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return bits.view(np.float16).astype(np.float64)
    if t.tensor_content:
        if t.dtype == _BFLOAT16:
            bits = np.frombuffer(t.tensor_content, dtype="<u2")
            return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        dt = _DTYPES.get(t.dtype)
        if dt is None:
            return None
        return np.frombuffer(t.tensor_content, dtype=dt).astype(np.float64)
    return None


def _hist_stats(mn: float, mx: float, num: float, s: float, ss: float) -> dict[str, float]:
    mean = s / num if num else math.nan
    var = ss / num - mean * mean if num else math.nan
    return {
        "min": mn,
        "max": mx,
        "mean": mean,
        "std": math.sqrt(max(var, 0.0)) if var == var else math.nan,
        "absmax": max(abs(mn), abs(mx)),
        "norm": math.sqrt(max(ss, 0.0)),
    }


def histo_stats(h: Any) -> dict[str, float]:
    """Stats of a TF1 HistogramProto (exact: it stores sum and sum of squares)."""
    return _hist_stats(h.min, h.max, h.num, h.sum, h.sum_squares)


def bucket_stats(arr: np.ndarray) -> dict[str, float] | None:
    """Stats of a TF2 histogram tensor, rows (left, right, count); moments from bucket centres."""
    if arr.size == 0 or arr.size % 3:
        return None
    rows = arr.reshape(-1, 3)
    left, right, count = rows[:, 0], rows[:, 1], rows[:, 2]
    num = float(count.sum())
    if num <= 0:
        return None
    nz = np.flatnonzero(count > 0)
    centre = (left + right) / 2.0
    s = float((count * centre).sum())
    ss = float((count * centre * centre).sum())
    return _hist_stats(float(left[nz[0]]), float(right[nz[-1]]), num, s, ss)


def _hparam_value(v: Any) -> Any:
    kind = v.WhichOneof("kind")
    return getattr(v, kind) if kind else None


def decode_records(
    buf: bytes, starts: np.ndarray, ends: np.ndarray, recs: np.ndarray, plugin_of: dict[str, str]
) -> ProtoRows:
    """Decode the given records with protobuf (ValueError for a record that is not an Event).

    ``plugin_of`` (tag -> plugin) is shared per run because writers may put the plugin
    metadata only on a tag's first value.
    """
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto import event_pb2  # heavy: only when a record needs it

    out = ProtoRows()
    view = memoryview(buf)
    Event = event_pb2.Event
    for rec, a, b in zip(recs.tolist(), starts.tolist(), ends.tolist(), strict=True):
        try:
            ev = Event.FromString(view[a:b])
        except DecodeError:
            raise ValueError(f"record {rec} is not a TensorBoard event") from None
        what = ev.WhichOneof("what")
        if what == "session_log":
            if ev.session_log.status == 1:  # START: readers purge steps >= ev.step
                out.purges.append((rec, int(ev.step)))
            continue
        if what != "summary":
            continue
        step, wall = int(ev.step), float(ev.wall_time)
        sub = 0
        for v in ev.summary.value:
            tag = v.tag
            if v.HasField("metadata") and v.metadata.plugin_data.plugin_name:
                plugin_of[tag] = v.metadata.plugin_data.plugin_name
                if plugin_of[tag] == "hparams":  # the values live in the metadata itself
                    _read_hparams(v.metadata.plugin_data.content, out.hparams)
                    continue
            kind = v.WhichOneof("value")
            if kind == "simple_value":
                out.add(rec, sub, step, tag, float(v.simple_value), wall)
                sub += 1
            elif kind == "histo":
                out.hist.setdefault(tag, 0.0)
                for stat, x in histo_stats(v.histo).items():
                    out.add(rec, sub, step, f"{tag}/{stat}", x, wall)
                    sub += 1
            elif kind == "tensor":
                plugin = plugin_of.get(tag, "")
                if plugin == "scalars":
                    vals = tensor_values(v.tensor)
                    if vals is not None and vals.size >= 1:
                        out.add(rec, sub, step, tag, float(vals.ravel()[0]), wall)
                        sub += 1
                elif plugin == "histograms":
                    vals = tensor_values(v.tensor)
                    stats = bucket_stats(vals) if vals is not None else None
                    if stats:
                        err = norm_bound(vals) if vals is not None else 0.0
                        out.hist[tag] = max(out.hist.get(tag, 0.0), err)
                    for stat, x in (stats or {}).items():
                        out.add(rec, sub, step, f"{tag}/{stat}", x, wall)
                        sub += 1
                else:
                    out.skipped[plugin or "tensor"] = out.skipped.get(plugin or "tensor", 0) + 1
            elif kind is not None:
                out.skipped[kind] = out.skipped.get(kind, 0) + 1
    return out


def _read_hparams(content: bytes, into: dict[str, Any]) -> None:
    try:
        from tensorboard.plugins.hparams import plugin_data_pb2

        data = plugin_data_pb2.HParamsPluginData.FromString(content)
    except Exception:  # noqa: BLE001 - hparams are a nicety; never fail the import for them
        return
    if data.HasField("session_start_info"):
        for k, v in data.session_start_info.hparams.items():
            into[k] = _hparam_value(v)
