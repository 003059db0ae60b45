"""The canonical long frame and the one vocabulary of vital signs.

Every importer produces rows with :data:`COLUMNS`. ``tag`` is the raw name as the log
wrote it; ``metric`` is the canonical vital sign from :func:`canonicalize` (null when
unknown: the raw tag is kept, never dropped). Per-layer series carry a ``layer`` index.
"""

from __future__ import annotations

import re
from functools import lru_cache

import polars as pl

# Column order of the canonical long frame.
SCHEMA: dict[str, pl.DataType] = {
    "source": pl.Utf8,  # importer name: tfevents, jsonl, hf_trainer_state, ...
    "file": pl.Utf8,  # path relative to the run folder
    "file_idx": pl.Int32,  # name order of the file within the run
    "record_idx": pl.Int64,  # record / line number within the file
    "step": pl.Int64,  # optimizer step (x axis); see x_kind
    "x_kind": pl.Utf8,  # step | samples | tokens | epoch | iteration | points
    "tag": pl.Utf8,  # raw metric name as written
    "metric": pl.Utf8,  # canonical vital sign, null if unknown
    "layer": pl.Int32,  # layer index for per-layer series, else null
    "value": pl.Float64,  # NaN / inf kept: they are evidence
    "wall_time": pl.Float64,  # unix seconds, nullable
    "segment": pl.Int32,  # +1 at each detected restart
}
COLUMNS = list(SCHEMA)

# Canonical vital signs. Per-layer series use the *_layer names with a layer index.
LOSS = "loss"
VAL_LOSS = "val_loss"
GRAD_NORM = "grad_norm"
GRAD_NORM_CLIPPED = "grad_norm_clipped"
PARAM_NORM = "param_norm"
LR = "lr"
LOSS_SCALE = "loss_scale"
THROUGHPUT = "throughput"
STEP_TIME = "step_time"
MEMORY = "memory"
EPOCH = "epoch"
OVERFLOW = "overflow"  # 1 at each step skipped for an fp16 overflow (DeepSpeed / Megatron lines)
GRAD_NORM_LAYER = "grad_norm_layer"
PARAM_NORM_LAYER = "param_norm_layer"
ACT_MEAN = "act_mean"
ACT_STD = "act_std"
ACT_ABSMAX = "act_absmax"
EVAL_PREFIX = "eval/"  # eval metrics: eval/accuracy, eval/hellaswag, eval/wer ...

PER_LAYER = (GRAD_NORM_LAYER, PARAM_NORM_LAYER, ACT_MEAN, ACT_STD, ACT_ABSMAX)

CORE_VITALS = (LOSS, VAL_LOSS, GRAD_NORM, PARAM_NORM, LR, LOSS_SCALE, THROUGHPUT, MEMORY)


def empty_frame() -> pl.DataFrame:
    return pl.DataFrame(schema=SCHEMA)


def normalize_tag(tag: str) -> str:
    """Lower-case, unify separators (/ . - _ space), drop unit suffixes in parentheses."""
    t = tag.strip().lower()
    t = re.sub(r"\s*\([^)]*\)\s*$", "", t)
    t = re.sub(r"[\s./\-_]+", "_", t)
    return t.strip("_")


_ALIASES: dict[str, list[str]] = {
    LOSS: [
        "loss", "train/loss", "train_loss", "training_loss", "lm loss", "lm_loss", "Loss/train",
        "loss/train", "loss/train/total", "train/train_loss", "Train/Samples/train_loss",
        "reduced_train_loss", "loss_metrics/global_avg_loss", "train/CrossEntropyLoss",
        "learning/loss", "batch_loss", "train_loss_step", "train/loss_step",
    ],
    VAL_LOSS: [
        "val_loss", "val/loss", "eval_loss", "eval/loss", "valid_loss", "valid/loss",
        "validation_loss", "validation loss", "validation/loss", "validation_metrics/loss",
        "Loss/val", "loss/val", "lm loss validation", "eval/avg_loss", "val_loss_epoch",
        "metrics/eval/LanguageCrossEntropy", "lm loss value",
    ],
    GRAD_NORM: [
        "grad_norm", "gnorm", "grad-norm", "grad norm", "gradient_norm", "gradient norm",
        "train/grad_norm", "optim/grad_norm", "optim/total_grad_norm", "total_grad_norm",
        "learning/raw_grad_norm", "l2_norm/grad/global", "grad_2.0_norm_total",
        "train/gnorm", "grad_norm/total",
    ],
    GRAD_NORM_CLIPPED: ["learning/grad_norm", "grad_norm_clipped", "clipped_grad_norm"],
    PARAM_NORM: [
        "param_norm", "params-norm", "params norm", "parameter_norm", "weight_norm",
        "optim/weight_norm", "learning/param_norm", "l2_norm/param/global",
        "param_2.0_norm_total", "params/norm/total", "train/param_norm", "param_norm/total",
    ],
    LR: [
        "lr", "learning_rate", "learning-rate", "learning rate", "train/lr",
        "train/learning_rate", "optim/learning_rate", "optim/learning_rate_group0",
        "learning/current_learning_rate", "Train/Samples/lr", "epoch_learning_rate",
    ],
    LOSS_SCALE: [
        "loss_scale", "loss-scale", "loss scale", "scaler", "grad_scale",
        "Train/Samples/loss_scale", "optim/loss_scale", "train/loss_scale",
    ],
    THROUGHPUT: [
        "tokens/s", "tok/s", "tokens_per_sec", "tokens_per_second",
        "throughput/tokens_per_sec", "throughput/tokens_per_second",
        "throughput/device/tokens_per_second", "throughput(tps)", "tps", "wps",
        "tokens_per_second_per_gpu", "perf/per_device_tokens_per_sec", "train/tokens_per_sec",
        "train/throughput",
    ],
    MEMORY: [
        "memory", "memory/max_reserved(GiB)", "memory/max_active(GiB)",
        "memory/peak_allocated_mem", "memory/current_allocated_gigabytes",
        "mem-allocated-bytes", "mem-reserved-bytes", "peak_memory_alloc",
        "peak_memory_reserved", "peak_memory_gb", "System/Peak GPU Memory (MB)",
        "memory/rss_mb", "train/memory", "mem_mb",
    ],
    STEP_TIME: [
        "elapsed time per iteration (ms)", "iteration-time", "time_metrics/end_to_end(s)",
        "perf/step_time_seconds", "throughput/duration", "train_step_timing in s",
        "step_time", "train/step_time",
    ],
    EPOCH: ["epoch", "train/epoch", "trainer/epoch"],
}

# Aliases that only hold for one source (llm.c's terse keys would be ambiguous elsewhere).
_SOURCE_ALIASES: dict[str, dict[str, str]] = {
    "llmc": {"trl": LOSS, "tel": VAL_LOSS, "norm": GRAD_NORM, "eval": "eval/hellaswag"},
    "fairseq": {"loss": LOSS, "valid_loss": VAL_LOSS},
}

_EXACT: dict[str, str] = {}
for _canon, _names in _ALIASES.items():
    for _n in _names:
        _EXACT.setdefault(normalize_tag(_n), _canon)

# Per-layer patterns: (regex on the raw tag, canonical per-layer metric).
_LAYER_INDEX = r"(?:layers?|blocks?|h|block)[._/]?(?P<layer>\d+)"
_LAYER_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^(?:grad_norm|grad/norm|l2_norm/grad|optim/grad|gradients?)[/._].*" + _LAYER_INDEX, re.I), GRAD_NORM_LAYER),
    (re.compile(_LAYER_INDEX + r".*[/._](?:grad_norm|grad)$", re.I), GRAD_NORM_LAYER),
    (re.compile(r"^(?:param_norm|params?/norm|l2_norm/param|optim/param|weight_norm)[/._].*" + _LAYER_INDEX, re.I), PARAM_NORM_LAYER),
    (re.compile(_LAYER_INDEX + r".*[/._](?:param_norm|weight_norm)$", re.I), PARAM_NORM_LAYER),
    (re.compile(r"^(?:act(?:ivations?)?)[/._](?:mean)[/._].*?" + _LAYER_INDEX, re.I), ACT_MEAN),
    (re.compile(r"^(?:act(?:ivations?)?)[/._](?:std)[/._].*?" + _LAYER_INDEX, re.I), ACT_STD),
    (re.compile(r"^(?:act(?:ivations?)?)[/._](?:absmax|max_abs|amax)[/._].*?" + _LAYER_INDEX, re.I), ACT_ABSMAX),
    (re.compile(r"^(?:act(?:ivations?)?)[/._].*?" + _LAYER_INDEX + r".*[/._]mean$", re.I), ACT_MEAN),
    (re.compile(r"^(?:act(?:ivations?)?)[/._].*?" + _LAYER_INDEX + r".*[/._]std$", re.I), ACT_STD),
    (re.compile(r"^(?:act(?:ivations?)?)[/._].*?" + _LAYER_INDEX + r".*[/._](?:absmax|max_abs|amax)$", re.I), ACT_ABSMAX),
]

# Eval metrics: a benchmark or accuracy-like score. Direction matters for regressions.
_EVAL_PATTERN = re.compile(
    r"^(?:eval|evaluation|val|valid|validation|test|benchmark|bench|metrics/eval)[/_ .-]"
    r"(?P<name>(?!loss$|runtime$|samples_per_second$|steps_per_second$).+)$"
    r"|^(?P<bare>hellaswag|mmlu|arc_[a-z]+|winogrande|piqa|accuracy|acc|wer|cer|bleu|rouge\w*)$",
    re.I,
)
LOWER_IS_BETTER = re.compile(r"(?:wer|cer|loss|perplexity|ppl|error|err)$", re.I)


@lru_cache(maxsize=4096)
def canonicalize(tag: str, source: str | None = None, extra: tuple[tuple[str, str], ...] = ()) -> tuple[str | None, int | None]:
    """Map a raw tag to ``(canonical metric, layer index)``; ``(None, None)`` if unknown.

    Order: user aliases -> source-scoped aliases -> exact aliases -> per-layer patterns ->
    eval-metric pattern.
    """
    for raw, canon in extra:
        if tag == raw or normalize_tag(tag) == normalize_tag(raw):
            return canon, None
    if source and source in _SOURCE_ALIASES and tag in _SOURCE_ALIASES[source]:
        return _SOURCE_ALIASES[source][tag], None
    norm = normalize_tag(tag)
    if norm in _EXACT:
        return _EXACT[norm], None
    for pattern, canon in _LAYER_PATTERNS:
        m = pattern.search(tag)
        if m:
            return canon, int(m.group("layer"))
    m = _EVAL_PATTERN.match(tag)
    if m:
        name = m.group("name") or m.group("bare")
        return EVAL_PREFIX + normalize_tag(name), None
    return None, None


def lower_is_better(metric: str) -> bool:
    """For eval metrics: True when a smaller value is better (WER, perplexity...)."""
    return bool(LOWER_IS_BETTER.search(metric))


def add_canonical(frame: pl.DataFrame, source: str | None = None, aliases: dict[str, str] | None = None) -> pl.DataFrame:
    """Fill ``metric`` and ``layer`` from ``tag`` (vectorised over unique tags)."""
    extra = tuple(sorted((aliases or {}).items()))
    tags = frame.get_column("tag").unique().to_list()
    mapping = {t: canonicalize(t, source, extra) for t in tags}
    lut = pl.DataFrame(
        {
            "tag": list(mapping),
            "metric": [m for m, _ in mapping.values()],
            "layer": [l for _, l in mapping.values()],
        },
        schema={"tag": pl.Utf8, "metric": pl.Utf8, "layer": pl.Int32},
    )
    return frame.drop("metric", "layer", strict=False).join(lut, on="tag", how="left").select(COLUMNS)


def conform(frame: pl.DataFrame) -> pl.DataFrame:
    """Add missing canonical columns as nulls and cast to the canonical schema."""
    for name, dtype in SCHEMA.items():
        if name not in frame.columns:
            frame = frame.with_columns(pl.lit(None, dtype=dtype).alias(name))
    return frame.select([pl.col(n).cast(t) for n, t in SCHEMA.items()])
