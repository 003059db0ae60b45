"""The canonical long frame and the one vocabulary of vital signs.

Every importer produces rows with :data:`COLUMNS`. ``tag`` is the raw name as the log
wrote it; ``metric`` is the canonical vital sign from :func:`canonicalize` (null when
unknown: the raw tag is kept, never dropped). Per-layer series carry a ``layer`` index.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import polars as pl

# Column order of the canonical long frame. The string columns are categorical: a few distinct
# values repeated on millions of rows (4 bytes a row instead of the string; a 1M-step run's
# file names alone took 40 bytes a row). Comparisons with string literals work as on strings;
# string functions need ``.cast(pl.Utf8)`` first. The integer columns are the narrowest that
# hold what a run can log (at most 20,000 files, 2^31 records a file, 32,767 layers or
# restarts): 64 -> 54 bytes a row with the floats and steps unchanged.
# What a frame's step counts. A closed set, so the column is an Enum of one byte a row (polars
# compares an Enum with string literals, unlike a one-byte Categorical).
X_KINDS = ("step", "samples", "tokens", "epoch", "iteration", "points")

# The importer names, the files of a run and the canonical vital signs are few (about 30
# importers; at most 32,767 files, as file_idx; the vocabulary plus the eval/ metrics a run
# names): their categories are one or two bytes a row instead of four, 49 MB less on a
# 1M-step run's 7.3M rows. (polars frees a category no live column holds, so a long
# process does not pile them up.) Expressions compare them with string literals; a Series of
# them has no ``==`` (use ``pl.col`` or ``cast(pl.Utf8)``). Tags keep four bytes: a run
# can name more than 65,535.
SOURCE_DTYPE = pl.Categorical(pl.Categories("forensics.source", physical=pl.UInt8))
FILE_DTYPE = pl.Categorical(pl.Categories("forensics.file", physical=pl.UInt16))
METRIC_DTYPE = pl.Categorical(pl.Categories("forensics.metric", physical=pl.UInt16))

SCHEMA: dict[str, pl.DataType] = {
    "source": SOURCE_DTYPE,  # importer name: tfevents, jsonl, hf_trainer_state, ...
    "file": FILE_DTYPE,  # path relative to the run folder
    "file_idx": pl.Int16(),  # name order of the file within the run
    "record_idx": pl.Int32(),  # record / line number within the file
    "step": pl.Int64(),  # optimizer step (x axis); see x_kind
    "x_kind": pl.Enum(X_KINDS),  # what the step counts: one byte a row (a closed set)
    "tag": pl.Categorical(),  # raw metric name as written
    "metric": METRIC_DTYPE,  # canonical vital sign, null if unknown
    "layer": pl.Int16(),  # layer index for per-layer series, else null
    "value": pl.Float64(),  # NaN / inf kept: they are evidence
    "wall_time": pl.Float64(),  # unix seconds, nullable
    "segment": pl.Int16(),  # +1 at each detected restart
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
# Iterations whose loss was NaN / Inf in the logging interval ending at the step (Megatron's
# "number of nan iterations"): skipped, so the logged loss, a mean of the others, hides them.
NAN_ITERS = "nan_iters"
# Iterations the trainer skipped in the logging interval ending at the step (Megatron's "number of
# skipped iterations"): an fp16 overflow skips the update, so none of them moved the weights.
SKIPPED_ITERS = "skipped_iters"
GRAD_NORM_LAYER = "grad_norm_layer"
# The grad norms of the token embedding and of the output head, logged by name without a layer
# number (grad_norm/model.embed_tokens, grad_norm/lm_head): the article's first suspects when
# the grad norm climbs under a falling loss (their gradients run an order of magnitude larger).
GRAD_NORM_EMBED = "grad_norm_embed"
GRAD_NORM_HEAD = "grad_norm_head"
PARAM_NORM_LAYER = "param_norm_layer"
ACT_MEAN = "act_mean"
ACT_STD = "act_std"
ACT_ABSMAX = "act_absmax"
EVAL_PREFIX = "eval/"  # eval metrics: eval/accuracy, eval/hellaswag, eval/wer ...

PER_LAYER = (GRAD_NORM_LAYER, PARAM_NORM_LAYER, ACT_MEAN, ACT_STD, ACT_ABSMAX)


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
        "loss",
        "train/loss",
        "train_loss",
        "training_loss",
        "lm loss",
        "lm_loss",
        "Loss/train",
        "loss/train",
        "loss/train/total",
        "Train/Samples/train_loss",
        "reduced_train_loss",
        "loss_metrics/global_avg_loss",
        "train/CrossEntropyLoss",
        "learning/loss",
        "batch_loss",
        "train_loss_step",
        "train/loss_step",
        "epoch_loss",
        "train/epoch_loss",
        "train/batch_loss",  # Keras (train/ sub-run)
        # Not "train/train_loss": HF's callbacks write it once, the mean over the whole run.
    ],
    VAL_LOSS: [
        "val_loss",
        "val/loss",
        "eval_loss",
        "eval/loss",
        "valid_loss",
        "valid/loss",
        "validation_loss",
        "validation loss",
        "validation/loss",
        "validation_metrics/loss",
        "Loss/val",
        "loss/val",
        "lm loss validation",
        "eval/avg_loss",
        "val_loss_epoch",
        "metrics/eval/LanguageCrossEntropy",
        "lm loss value",
        "validation/epoch_loss",
        "val/epoch_loss",
        "Loss/validation",
        "loss/validation",
        "loss/valid",
    ],
    GRAD_NORM: [
        "grad_norm",
        "gnorm",
        "grad-norm",
        "grad norm",
        "gradient_norm",
        "gradient norm",
        "train/grad_norm",
        "optim/grad_norm",
        "optim/total_grad_norm",
        "total_grad_norm",
        "learning/raw_grad_norm",
        "l2_norm/grad/global",
        "grad_2.0_norm_total",
        "train/gnorm",
        "grad_norm/total",
        "grad/norm/total",
        "train/gradient_norm",
    ],
    GRAD_NORM_CLIPPED: ["learning/grad_norm", "grad_norm_clipped", "clipped_grad_norm"],
    PARAM_NORM: [
        "param_norm",
        "params-norm",
        "params norm",
        "parameter_norm",
        "weight_norm",
        "optim/weight_norm",
        "learning/param_norm",
        "l2_norm/param/global",
        "param_2.0_norm_total",
        "params/norm/total",
        "train/param_norm",
        "param_norm/total",
    ],
    LR: [
        "lr",
        "learning_rate",
        "learning-rate",
        "learning rate",
        "train/lr",
        "train/learning_rate",
        "optim/learning_rate",
        "optim/learning_rate_group0",
        "learning/current_learning_rate",
        "Train/Samples/lr",
        "epoch_learning_rate",
        "train/epoch_learning_rate",
    ],
    LOSS_SCALE: [
        "loss_scale",
        "loss-scale",
        "loss scale",
        "scaler",
        "grad_scale",
        "Train/Samples/loss_scale",
        "optim/loss_scale",
        "train/loss_scale",
    ],
    THROUGHPUT: [
        "tokens/s",
        "tok/s",
        "tokens_per_sec",
        "tokens_per_second",
        "throughput/tokens_per_sec",
        "throughput/tokens_per_second",
        "throughput/device/tokens_per_second",
        "throughput(tps)",
        "tps",
        "wps",
        "tokens_per_second_per_gpu",
        "perf/per_device_tokens_per_sec",
        "train/tokens_per_sec",
        "train/tokens_per_second",
        "train/throughput",
    ],
    MEMORY: [
        "memory",
        "memory/max_reserved(GiB)",
        "memory/max_active(GiB)",
        "memory/peak_allocated_mem",
        "memory/current_allocated_gigabytes",
        "mem-allocated-bytes",
        "mem-reserved-bytes",
        "peak_memory_alloc",
        "peak_memory_reserved",
        "peak_memory_gb",
        "System/Peak GPU Memory (MB)",
        "memory/rss_mb",
        "train/memory",
        "mem_mb",
        "mem-max-allocated-bytes",
        "system.gpu.0.memoryAllocated",
    ],
    STEP_TIME: [
        "elapsed time per iteration (ms)",
        "iteration-time",
        "time_metrics/end_to_end(s)",
        "perf/step_time_seconds",
        "throughput/duration",
        "train_step_timing in s",
        "step_time",
        "train/step_time",
        "train_step_timing",
    ],
    EPOCH: ["epoch", "train/epoch", "trainer/epoch"],
    NAN_ITERS: ["number of nan iterations", "nan_iters", "nan iterations", "nan-iterations"],
    SKIPPED_ITERS: [
        "number of skipped iterations",
        "skipped_iters",
        "skipped iterations",
        "skipped-iterations",
    ],
}

# Aliases that only hold for one source (terse keys would be ambiguous elsewhere). ``None``
# keeps a tag unmapped on purpose.
_SOURCE_ALIASES: dict[str, dict[str, str | None]] = {
    "llmc": {"trl": LOSS, "tel": VAL_LOSS, "norm": GRAD_NORM, "eval": "eval/hellaswag"},
    "fairseq": {"loss": LOSS, "valid_loss": VAL_LOSS},
    # HF's end-of-training entry: the mean loss over the whole run, not a point of the curve.
    "hf_trainer_state": {"train_loss": None},
    # Text logs (forensics/importers/text): llm.c's terse keys, DeepSpeed's loss-scale events,
    # MLPerf's gpt3 eval_accuracy (a log-perplexity) and timings that are not eval scores.
    "text_logs": {
        "trl": LOSS,
        "tel": VAL_LOSS,
        "norm": GRAD_NORM,
        "overflow": OVERFLOW,
        "loss_scale_reduced_to": LOSS_SCALE,
        "loss_scale_increased_to": LOSS_SCALE,
        "eval_accuracy (log perplexity)": VAL_LOSS,
        # build-nanogpt log.txt ("STEP train|val|hella VALUE")
        "train": LOSS,
        "val": VAL_LOSS,
        "hella": "eval/hellaswag",
        "eval_train_loss": None,
        "validation_step_timing": None,
        "validation_epoch_timing": None,
        # DeepSpeed's timer line ("CurrSamplesPerSec=31.2, MemAllocated=4.34GB,
        # MaxMemAllocated=12.81GB"): the allocated memory now and the speed of the last
        # interval. Its running maximum and running average are not the signs themselves.
        "MemAllocated": MEMORY,
        "CurrSamplesPerSec": THROUGHPUT,
    },
}

_EXACT: dict[str, str] = {}
for _canon, _names in _ALIASES.items():
    for _n in _names:
        _EXACT.setdefault(normalize_tag(_n), _canon)

# Spellings that need a pattern rather than a list (optimizer names, param-group numbers).
_REGEX_ALIASES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^lr-[A-Za-z]\w*(?:/(?:pg|group)\d+)?$"), LR),  # Lightning LearningRateMonitor
    (re.compile(r"^optim/learning_rate_group\d+$"), LR),
]

# Throughput, step time and memory under any namespace (perf/, system/, my_project/...) and
# the common spellings; matched on the normalised tag (separators are "_"), end-anchored.
_NS = r"(?:^|_)"
_UNIT_SUFFIX = r"(?:_(?:mb|mib|gb|gib|kb|kib|bytes|b|megabytes|gigabytes))?"
_TIME_SUFFIX = r"(?:_(?:s|sec|secs|seconds|ms|msec|millis|milliseconds))?"
_VOCAB_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(
            _NS + r"(?:tokens?|toks?|samples?|seqs?|sequences?|examples?|imgs?|images?|it|iters?"
            # a rate needs its "per second" spelled: tokens_s (tokens/s), tokens_per_sec,
            # tokenspersec; a bare plural (tokens, consumed samples, skipped iterations) is a
            # counter, not a throughput
            r"|iterations?|steps?|batch(?:es)?|words?)(?:_|_?per_?)(?:s|secs?|seconds?)"
            r"(?:_per_(?:gpu|device|rank))?$"
        ),
        THROUGHPUT,
    ),
    (re.compile(_NS + r"(?:tps|wps|ups|tokens_throughput|tok_throughput)$"), THROUGHPUT),
    (
        re.compile(
            _NS + r"(?:(?:train_)?step|iter|iteration|batch|update)_?(?:time|timing|duration"
            r"|latency)" + _TIME_SUFFIX + r"$"
        ),
        STEP_TIME,
    ),
    (re.compile(_NS + r"time_per_(?:step|iter|iteration|batch)" + _TIME_SUFFIX + r"$"), STEP_TIME),
    (
        re.compile(
            _NS + r"(?:(?:max|peak|cur|current)_)?(?:gpu_|cuda_|cpu_|host_|device_)?"
            # memory/max_allocated_mb: a max or peak, then what it counts
            r"(?:rss|mem|memory)(?:_(?:max|peak))?(?:_(?:allocated|alloc|reserved|active|used"
            r"|usage))?" + _UNIT_SUFFIX + r"$"
        ),
        MEMORY,
    ),
    (
        re.compile(
            _NS
            + r"(?:max_)?(?:memory|mem)_(?:allocated|reserved|alloc)_?(?:memory|mem)?"
            + _UNIT_SUFFIX
            + r"$"
        ),
        MEMORY,
    ),
]
# Names the patterns above would catch by mistake: HF's whole-run summaries, eval-time speeds,
# W&B's system GPU "memory" (a utilisation percentage), free memory (the inverse).
_NOT_VOCAB = re.compile(
    r"(?:^|_)(?:train_(?:samples|steps)_per_second|train_runtime)$"
    r"|^(?:eval|evaluation|val|valid|validation|test)_"
    r"|^system_(?!.*(?:allocated|rss|mem_used|memory_used))"
    r"|(?:^|_)(?:free|avail|available|total)(?:_|$)"
)

# Where a layer index sits in a parameter path: model.layers.3.mlp, transformer.h.3.attn,
# transformer.blocks.3.att_proj, decoder.layers.3, layer_3, block3, Levanter's stacked.3.
_LAYER_INDEX = re.compile(
    r"(?:^|(?<=[._/\-]))(?:layers?|blocks?|h|stacked)[._/\-]?(?P<layer>\d+)(?=$|[._/\-])", re.I
)
# A per-parameter statistic that is not a norm (OLMo's .min/.max/.avg, histogram stats).
_STAT_SUFFIX = re.compile(r"[._/](?:min|max|mean|avg|std|absmax)$", re.I)
_ACT_STAT = r"(?P<stat>mean|std|absmax|max_abs|amax)"
_ACT = r"act(?:ivation)?s?"

# (regex capturing the parameter path, canonical per-layer metric); the path must hold a
# layer index.
_LAYER_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^l2_norm/grad/(?P<p>.+)$", re.I), GRAD_NORM_LAYER),  # Composer, NeMo
    (re.compile(r"^optim/grad/(?P<p>.+)\.norm$", re.I), GRAD_NORM_LAYER),  # OLMo
    (re.compile(r"^grad/norm/(?P<p>.+)$", re.I), GRAD_NORM_LAYER),  # Levanter watch
    (
        re.compile(r"^grad_(?:[\d.]+|inf)_norm[/_.](?P<p>.+)$", re.I),
        GRAD_NORM_LAYER,
    ),  # Lightning grad_norm()
    (re.compile(r"^grad(?:ient)?s?/(?P<p>.+)/norm$", re.I), GRAD_NORM_LAYER),  # gradient histograms
    (re.compile(r"^grad_norms?[/_.](?P<p>.+)$", re.I), GRAD_NORM_LAYER),
    (re.compile(r"^(?P<p>.+)[/_.]grad_norm$", re.I), GRAD_NORM_LAYER),
    (re.compile(r"^l2_norm/param/(?P<p>.+)$", re.I), PARAM_NORM_LAYER),
    (re.compile(r"^optim/param/(?P<p>.+)\.norm$", re.I), PARAM_NORM_LAYER),
    (re.compile(r"^params?/norm/(?P<p>.+)$", re.I), PARAM_NORM_LAYER),
    (
        re.compile(r"^(?:parameters|params|weights)/(?P<p>.+)/norm$", re.I),
        PARAM_NORM_LAYER,
    ),  # histograms
    (re.compile(r"^(?:param|weight)_norms?[/_.](?P<p>.+)$", re.I), PARAM_NORM_LAYER),
    (re.compile(r"^(?P<p>.+)[/_.](?:param|weight)_norm$", re.I), PARAM_NORM_LAYER),
]
_ACT_PATTERNS: list[re.Pattern[str]] = [
    re.compile(rf"^{_ACT}[/_.]{_ACT_STAT}[/_.](?P<p>.+)$", re.I),  # act/absmax/layers.3
    re.compile(rf"^{_ACT}[/_.](?P<p>.+)[/_.]{_ACT_STAT}$", re.I),  # act/layers.3/mean, histograms
    re.compile(rf"^(?P<p>.+)[/_.]{_ACT}[/_.]{_ACT_STAT}$", re.I),  # layers.3/act/std
]
# The whole model's activation statistic, logged without a layer (act_absmax, activations/std,
# train/activation_absmax, model/act/std): a series of its own, judged when no layer is logged (see
# forensics.detectors.activations). A path in between (act/layers.3/absmax) is a layer's.
_ACT_MODEL = re.compile(rf"^(?:train/|model/)?{_ACT}[/_.]{_ACT_STAT}$", re.I)
_ACT_CANON = {
    "mean": ACT_MEAN,
    "std": ACT_STD,
    "absmax": ACT_ABSMAX,
    "max_abs": ACT_ABSMAX,
    "amax": ACT_ABSMAX,
}

# Eval metrics: a benchmark or accuracy-like score. Direction matters for regressions.
_EVAL_PATTERN = re.compile(
    r"^(?:eval|evaluation|val|valid|validation|test|benchmark|bench|metrics/eval)[/_ .-]"
    r"(?P<name>(?!(?:loss|runtime|samples|steps|epoch|.*_per_second)$).+)$"
    r"|^(?P<bare>hellaswag|mmlu|arc_[a-z]+|winogrande|piqa|accuracy|acc|wer|cer|bleu|rouge\w*)$",
    re.I,
)
LOWER_IS_BETTER = re.compile(r"(?:wer|cer|loss|perplexity|ppl|error|err)$", re.I)

# The x axis a tag is indexed by, when it is not optimizer steps (formats.md 5.3).
# tensorboardX turns the spaces into underscores ("lm_loss_vs_samples").
_X_SAMPLES = re.compile(r"(?:[\s_]+vs[\s_]+samples$|^Train/Samples/)", re.I)
_X_TOKENS = re.compile(r"[\s_]+vs[\s_]+tokens$", re.I)
# Keras' TensorBoard callback logs epoch_loss, epoch_learning_rate ... at the epoch's index.
_X_EPOCHS = re.compile(r"(?:^|/)epoch_[^/]+$")
_X_SUFFIX = re.compile(r"[\s_]+vs[\s_]+(?:samples|tokens|steps|iterations?)$", re.I)

# Tags whose numbers mean something other than their canonical name suggests.
FLAGS: dict[str, str] = {
    "grad/norm/total": "grad_norm is Levanter's grad/norm/total, the sum of per-parameter L2 norms "
    "rather than the global L2 norm: its level is not comparable with other runs' grad_norm",
}

# Every canonical name a user alias may target (plus any "eval/<name>").
KNOWN_METRICS = (
    LOSS,
    VAL_LOSS,
    GRAD_NORM,
    GRAD_NORM_CLIPPED,
    PARAM_NORM,
    LR,
    LOSS_SCALE,
    THROUGHPUT,
    STEP_TIME,
    MEMORY,
    EPOCH,
    OVERFLOW,
    NAN_ITERS,
    SKIPPED_ITERS,
    GRAD_NORM_EMBED,
    GRAD_NORM_HEAD,
    *PER_LAYER,
)


def x_kind_of(tag: str) -> str:
    """``samples`` / ``tokens`` for tags indexed by consumed samples or tokens, ``epoch`` for
    Keras' per-epoch tags, else ``step``."""
    if _X_SAMPLES.search(tag):
        return "samples"
    if _X_TOKENS.search(tag):
        return "tokens"
    if _X_EPOCHS.search(tag):
        return "epoch"
    return "step"


def layer_of(tag: str) -> int | None:
    """The layer index in a parameter path (``model.layers.3.mlp`` -> 3), None without one."""
    m = _LAYER_INDEX.search(tag)
    return int(m.group("layer")) if m else None


# A parameter path without a layer number that names the token embedding or the output head
# (GPT-2's wte and lm_head, Llama's embed_tokens / tok_embeddings and output, GPT-NeoX's
# embed_in and embed_out). Position embeddings (wpe) are embeddings too.
_EMBED_PATH = re.compile(
    r"(?:^|[._/])(?:embed_tokens|tok_embeddings|word_embeddings|wte|wpe|embed_in|embeddings?"
    r"|embed|emb)(?:$|[._/])",
    re.I,
)
_HEAD_PATH = re.compile(
    r"(?:^|[._/])(?:lm_head|embed_out|output_layer|head)(?:$|[._/])|^(?:model[._/])?output"
    r"(?:[._/]weight)?$",
    re.I,
)


def module_of(path: str) -> str | None:
    """``grad_norm_embed`` / ``grad_norm_head`` for a parameter path without a layer number
    that names the token embedding or the output head, else None (a path with a layer index
    is that layer's, whatever module of it it names)."""
    if _LAYER_INDEX.search(path):
        return None
    if _HEAD_PATH.search(path):
        return GRAD_NORM_HEAD
    if _EMBED_PATH.search(path):
        return GRAD_NORM_EMBED
    return None


def check_aliases(aliases: dict[str, str]) -> None:
    """Raise ConfigError for a user alias whose target is not a canonical vital sign."""
    from forensics.errors import ConfigError

    bad = [
        f"{raw}={canon}"
        for raw, canon in aliases.items()
        if canon not in KNOWN_METRICS
        and not (canon.startswith(EVAL_PREFIX) and len(canon) > len(EVAL_PREFIX))
    ]
    if bad:
        raise ConfigError(
            f"alias {', '.join(bad)}: unknown canonical name; use one of "
            f"{', '.join(KNOWN_METRICS)} or eval/<name>"
        )


@lru_cache(maxsize=8192)
def canonicalize(
    tag: str, source: str | None = None, extra: tuple[tuple[str, str], ...] = ()
) -> tuple[str | None, int | None]:
    """Map a raw tag to ``(canonical metric, layer index)``; ``(None, None)`` if unknown.

    Order: user aliases -> source-scoped aliases -> exact aliases (after normalisation, and
    with an x-axis suffix such as `` vs samples`` removed) -> spelling patterns -> per-layer
    patterns (a layer index is required) -> eval-metric pattern.
    """
    norm = normalize_tag(tag)
    for raw, canon in extra:
        if tag == raw or norm == normalize_tag(raw):
            return canon, (layer_of(tag) if canon in PER_LAYER else None)
    if source and source in _SOURCE_ALIASES and tag in _SOURCE_ALIASES[source]:
        return _SOURCE_ALIASES[source][tag], None
    base = _X_SUFFIX.sub("", tag)
    nb = normalize_tag(base)
    if nb in _EXACT:
        return _EXACT[nb], None
    for pattern, canon in _REGEX_ALIASES:
        if pattern.match(base):
            return canon, None
    if not _NOT_VOCAB.search(nb):
        for pattern, canon in _VOCAB_PATTERNS:
            if pattern.search(nb):
                return canon, None
    for pattern, canon in _LAYER_PATTERNS:
        m = pattern.match(base)
        if m and not _STAT_SUFFIX.search(m.group("p")):
            layer = layer_of(m.group("p"))
            if layer is not None:
                return canon, layer
        if m and canon == GRAD_NORM_LAYER and not _STAT_SUFFIX.search(m.group("p")):
            module = module_of(m.group("p"))
            if module is not None:
                return module, None
    for pattern in _ACT_PATTERNS:
        m = pattern.match(base)
        if m:
            layer = layer_of(m.group("p"))
            if layer is not None:
                return _ACT_CANON[m.group("stat").lower()], layer
    m = _ACT_MODEL.match(base)
    if m:
        return _ACT_CANON[m.group("stat").lower()], None
    m = _EVAL_PATTERN.match(base)
    if m:
        name = m.group("name") or m.group("bare")
        return EVAL_PREFIX + normalize_tag(name), None
    return None, None


# A held-out loss of one eval set, canonical eval/<set>_loss (eval_<set>_loss, val/<set>/loss,
# validation/<set>_loss ...) or eval/loss_<set> (val_loss/<set>). Not a train loss computed at
# eval time (eval/train_loss) nor a per-batch one (eval/loss_step).
_HELD_OUT_LOSS = re.compile(r"^(?:(?P<pre>.+)_)?loss(?:_(?P<post>.+))?$")
_NOT_AN_EVAL_SET = re.compile(r"(?:^|_)(?:train\w*|step|steps|runtime|samples)$")


def held_out_set(metric: str) -> str | None:
    """The eval set a held-out loss is about: "" for ``val_loss``, ``wiki`` for
    ``eval/wiki_loss`` (from ``eval_wiki_loss``, ``val/wiki/loss`` ...); None for any metric
    that is not a held-out loss (scores such as accuracy, BLEU or WER, perplexities, timings).

    Held-out losses are judged by the train/val checks (overfitting, val_shift,
    gap_acceleration); the other eval metrics by eval_regression.
    """
    if metric == VAL_LOSS:
        return ""
    if not metric.startswith(EVAL_PREFIX):
        return None
    m = _HELD_OUT_LOSS.match(metric[len(EVAL_PREFIX) :])
    if m is None:
        return None
    pre, post = m.group("pre"), m.group("post")
    if post is not None and post.endswith("epoch"):  # Lightning's <name>_epoch aggregate
        post = post[: -len("epoch")].rstrip("_") or None
    name = "_".join(p for p in (pre, post) if p)
    if not name or _NOT_AN_EVAL_SET.search(name):
        return None
    return name


def lower_is_better(metric: str) -> bool:
    """For eval metrics: True when a smaller value is better (WER, perplexity...)."""
    return bool(LOWER_IS_BETTER.search(metric))


def add_canonical(
    frame: pl.DataFrame, source: str | None = None, aliases: dict[str, str] | None = None
) -> pl.DataFrame:
    """Fill ``metric`` and ``layer`` from ``tag`` (vectorised over unique tags)."""
    extra = tuple(sorted((aliases or {}).items()))
    col = frame.get_column("tag")
    if col.dtype != SCHEMA["tag"]:
        col = col.cast(pl.Utf8).cast(SCHEMA["tag"])
        frame = frame.with_columns(col)
    codes, tags = _present_tags(col)
    mapping = {t: canonicalize(t, source, extra) for t in tags}
    # Two new columns from the tag alone (a join would copy every column of the frame): each
    # row's tag code picks its entry in a table indexed by tag code (a null tag gathers a
    # null). One column at a time: polars copies the gather's indices (4 bytes a row), and
    # two gathers at once held two copies beside a per-row table position (about 100 MiB
    # at the peak for a 1M-step run instead of 70). A column whose every tag gives the same
    # value (no per-layer tag: every layer null) is a constant, never made per row.
    k = len(mapping)
    lut = np.full(int(codes.max()) + 1 if k else 0, k, dtype=np.uint32)  # code -> entry
    lut[codes] = np.arange(k, dtype=np.uint32)
    at = pl.Series(lut)
    has_null = col.null_count() > 0
    for name, pos in (("metric", 0), ("layer", 1)):
        values = [v[pos] for v in mapping.values()]
        distinct = set(values)
        if not distinct or (len(distinct) == 1 and (values[0] is None or not has_null)):
            value = values[0] if values else None
            frame = frame.with_columns(pl.lit(value, dtype=SCHEMA[name]).alias(name))
            continue
        # entry k, null, for codes of no tag here
        by_code = pl.Series(name, [*values, None], dtype=SCHEMA[name]).gather(at)
        # (the tag column's physical codes, zero-copy, made again for each gather so that
        # nothing per row outlives it; a null code gathers a null)
        frame = frame.with_columns(by_code.gather(col.to_physical()))
    return frame.select(COLUMNS)


def _present_tags(col: pl.Series) -> tuple[np.ndarray, list[str]]:
    """The physical codes a categorical column holds (nulls left out) and their strings, in
    the same order.

    The same set as ``col.unique()`` for about half its CPU: instead of a hash of every row
    (0.05-0.07 s for the 7.3M rows of a 1M-step run), each row's code is marked in a table as
    long as the largest code (the categories are the process's: a few hundred strings, tags,
    files and sources), and only the codes found are looked up as strings."""
    categories = getattr(col.dtype, "categories", None)  # polars >= 1.32
    if categories is None:
        return _unique_tags(col)
    phys = col.to_physical()
    if phys.null_count():
        phys = phys.drop_nulls()
    if phys.is_empty():
        return np.zeros(0, dtype=np.uint32), []
    rows = phys.to_numpy()  # zero-copy for one chunk without nulls
    seen = np.zeros(int(rows.max()) + 1, dtype=bool)
    seen[rows] = True  # numpy casts the indices a buffer at a time: no per-row copy
    codes = np.flatnonzero(seen).astype(np.uint32)
    # (every string of the categories, at the index of its code)
    names = categories.to_series().gather(pl.Series(codes))
    return codes, names.to_list()


def _unique_tags(col: pl.Series) -> tuple[np.ndarray, list[str]]:
    """:func:`_present_tags` by a hash of every row (a polars without ``dtype.categories``)."""
    unique = col.unique().drop_nulls()
    return unique.to_physical().to_numpy().astype(np.uint32), unique.to_list()


def conform(frame: pl.DataFrame) -> pl.DataFrame:
    """Add missing canonical columns as nulls and cast to the canonical schema."""
    for name, dtype in SCHEMA.items():
        if name not in frame.columns:
            frame = frame.with_columns(pl.lit(None, dtype=dtype).alias(name))
    return frame.select([pl.col(n).cast(t) for n, t in SCHEMA.items()])


# -- units taken from the name ----------------------------------------------------------
_UNIT_WORDS: dict[str, str] = {
    "bytes": "bytes",
    "b": "bytes",
    "kb": "KB",
    "kib": "KiB",
    "mb": "MB",
    "megabytes": "MB",
    "mib": "MiB",
    "gb": "GB",
    "gigabytes": "GB",
    "gib": "GiB",
    "ms": "ms",
    "msec": "ms",
    "millis": "ms",
    "milliseconds": "ms",
    "s": "s",
    "sec": "s",
    "secs": "s",
    "seconds": "s",
    "%": "%",
    "pct": "%",
    "percent": "%",
}
_PAREN_UNIT = re.compile(r"\(\s*([^)]*?)\s*\)\s*$")
_IN_UNIT = re.compile(r"\bin\s+(\w+)\s*$", re.I)
_RATE_OF = re.compile(
    r"(?:^|_)(?P<what>tokens?|toks?|samples?|seqs?|sequences?|examples?|imgs?|images?|it|iters?"
    r"|iterations?|steps?|batch(?:es)?|words?)_?(?:per_)?(?:s|sec|second)(?:_|$)"
)
_RATE_UNIT = {
    "tok": "tokens/s",
    "sam": "samples/s",
    "seq": "samples/s",
    "exa": "samples/s",
    "img": "samples/s",
    "ima": "samples/s",
    "it": "it/s",
    "ite": "it/s",
    "ste": "it/s",
    "bat": "it/s",
    "wor": "words/s",
}
# Units that belong with a vital sign: anything else read from a name is ignored.
_UNITS_FOR = {
    MEMORY: {"bytes", "KB", "KiB", "MB", "MiB", "GB", "GiB", "%"},
    STEP_TIME: {"ms", "s"},
    THROUGHPUT: {"tokens/s", "samples/s", "it/s", "words/s"},
}
_DEFAULT_UNIT = {STEP_TIME: "s"}
_KNOWN_TAG_UNITS = {
    "tps": "tokens/s",
    "wps": "words/s",
    "ups": "it/s",
    "system_gpu_0_memoryallocated": "%",
    "memory_current_allocated_gigabytes": "GB",
    "memory_max_reserved": "GiB",
    "memory_max_active": "GiB",
    "peak_memory_gb": "GB",
    "memallocated": "GB",  # DeepSpeed's timer line prints MemAllocated=4.34GB
    "currsamplespersec": "samples/s",
}


def unit_of(tag: str, metric: str | None = None) -> str | None:
    """The unit a tag's name states (``mem_gb`` -> GB, ``iter_time_ms`` -> ms,
    ``System/Peak GPU Memory (MB)`` -> MB, ``tok/s`` -> tokens/s), None when the name says none.

    With ``metric``, only a unit that fits that vital sign is returned.
    """
    unit = None
    m = _PAREN_UNIT.search(tag) or _IN_UNIT.search(tag)
    if m:
        word = m.group(1).strip().lower()
        unit = _UNIT_WORDS.get(word) or (
            "tokens/s" if word in ("tps", "tokens/s", "tok/s") else None
        )
    nb = normalize_tag(tag)
    if unit is None:
        unit = _KNOWN_TAG_UNITS.get(nb)
    if unit is None:
        r = _RATE_OF.search(nb)
        if r:
            unit = _RATE_UNIT.get(r.group("what")[:3]) or _RATE_UNIT.get(r.group("what")[:2])
    if unit is None:
        last = nb.rsplit("_", 1)[-1]
        if last != nb or metric is not None:
            unit = _UNIT_WORDS.get(last)
    if metric is None:
        return unit
    if unit is not None and unit in _UNITS_FOR.get(metric, ()):
        return unit
    return _DEFAULT_UNIT.get(metric) if unit is None and metric == STEP_TIME else None


def tag_units(frame: pl.DataFrame) -> dict[str, str]:
    """``{raw tag: unit}`` for every mapped throughput / step-time / memory tag whose name
    states a unit (step times without one are seconds)."""
    if frame.is_empty():
        return {}
    pairs = (
        frame.lazy()  # lazy: only the two columns are filtered, not a copy of every row
        .filter(pl.col("metric").is_in(list(_UNITS_FOR)))
        .select("tag", "metric")
        .unique()
        .collect()
        .iter_rows()
    )
    out: dict[str, str] = {}
    # unique() has no order: sorted, so that the report's units table reads the same each time
    for tag, metric in sorted(pairs, key=lambda p: (str(p[1]), str(p[0]))):
        u = unit_of(tag, metric)
        if u is not None:
            out[tag] = u
    return out


# -- the nearest canonical name of an unmapped tag --------------------------------------
# Names that are no vital sign under another spelling: counters, batch sizes, perplexities
# and scores. ``forensics metrics`` proposes no alias for them (mapping "global batch size" to
# the loss because the strings look alike would be nonsense).
_NOT_A_VITAL = re.compile(
    r"(?:^|_)(?:ppl|perplexity|batch_size|bs|acc|accuracy|f1|bleu|rouge\w*|wer|cer|epoch"
    r"|samples|tokens|iterations|iters|steps|count|seen|consumed|runtime)$"
    r"|^(?:num|number_of|n|consumed|total|global_batch)_"
    # The speed of an evaluation pass (HF's eval_samples_per_second, NeMo's
    # validation_step_timing) is not the training's.
    r"|^(?:eval|val|valid|validation|test|predict)_\w*(?:per_sec(?:ond)?|tim(?:e|ing))$"
)


def is_not_a_vital(tag: str) -> bool:
    """True for names that are clearly no vital sign (counters, sizes, scores, perplexities)."""
    return bool(_NOT_A_VITAL.search(normalize_tag(_X_SUFFIX.sub("", tag))))


# A clock that only grows (modded-nanogpt's train_time, a run's elapsed time) or an epoch's
# duration: named like a step time, but read as one it makes every step look slower.
_CLOCK = re.compile(
    r"(?:^|_)(?:train|training|epoch|elapsed|total|wall|run)_?time(?:_(?:s|sec|seconds|ms))?$"
    r"|(?:^|_)time_elapsed$"
)


def is_clock(tag: str) -> bool:
    """True for a running clock or an epoch's duration (``train_time``, ``elapsed_time``,
    ``epoch_time``): no step time, though the name is close to one."""
    return bool(_CLOCK.search(normalize_tag(tag)))


NEAREST_MIN = 0.6  # below this similarity no vital sign is near (see nearest_canonical)


_HELD_OUT_WORDS = frozenset({"val", "valid", "validation", "eval", "evaluation", "test", "dev"})


# A module the per-layer patterns name without a layer number: the embedding, the output head,
# a final norm, or a parameter path (``.weight``, ``.bias``).
_MODULE = re.compile(
    r"(?:^|[._/])(?:embed\w*|emb|wte|wpe|tok_embeddings|word_embeddings|lm_head|head|output"
    r"|classifier|pooler|ln_f|final_layer_?norm|norm|weight|bias)(?:$|[._/])",
    re.I,
)


def module_series(tag: str) -> str | None:
    """The per-layer family (``grad_norm_layer``, ``param_norm_layer``, ``act_*``) of a tag
    that names a module without a layer number (``grad_norm/lm_head``,
    ``gradients/model.embed_tokens.weight/norm``), else None. Such a series is not read:
    per-layer series are told apart by their layer index. ``forensics metrics`` says so
    instead of offering an alias to a model-wide sign (``grad_norm/lm_head`` had been
    offered ``--alias grad_norm/lm_head=grad_norm_clipped``, which would judge the head's
    norm as the whole model's)."""
    if _STAT_SUFFIX.search(tag):
        return None
    for pattern, canon in _LAYER_PATTERNS:
        m = pattern.match(tag)
        if m and not _LAYER_INDEX.search(m["p"]) and _MODULE.search(m["p"]):
            return canon
    for pattern in _ACT_PATTERNS:
        m = pattern.match(tag)
        if m and not _LAYER_INDEX.search(m["p"]) and _MODULE.search(m["p"]):
            return f"act_{m['stat'].lower().replace('max_abs', 'absmax').replace('amax', 'absmax')}"
    return None


def nearest_canonical(tag: str) -> str | None:
    """The canonical vital sign whose known spellings are closest to ``tag`` (for the
    ``--alias`` hint of ``forensics metrics``), or None when none is close: a similarity
    ratio under :data:`NEAREST_MIN`. DeepSpeed's ``CurrSamplesPerSec`` and an RLHF log's
    ``reward`` were offered ``--alias ...=lr`` (0.55 and 0.43, against 0.7 and more for real
    misspellings such as ``MemAllocated`` -> memory). Callers skip the names
    :func:`is_not_a_vital` recognises."""
    import difflib

    nb = normalize_tag(_X_SUFFIX.sub("", tag))
    parts = nb.split("_")
    tails = {"_".join(parts[i:]) for i in range(len(parts))} | {nb}
    # Signs that a similar string is not enough for: the held-out loss needs a word that says
    # held-out, the loss scale the word scale ("loss_avg" read like "loss_val", and
    # "loss_smoothed" like "loss_scale").
    words = set(parts)
    ruled_out = set()
    if not words & _HELD_OUT_WORDS:
        ruled_out.add(VAL_LOSS)
    if not words & {"scale", "scaler", "lossscale"}:
        ruled_out.add(LOSS_SCALE)
    best, best_score = LOSS, -1.0
    for alias, canon in _EXACT.items():
        if canon in ruled_out:
            continue
        for t in tails:
            score = difflib.SequenceMatcher(None, t, alias).ratio()
            if t == nb:
                score += 0.01  # the whole name beats a fragment on a tie
            if score > best_score:
                best, best_score = canon, score
    for canon in KNOWN_METRICS:
        if canon in ruled_out:
            continue
        for t in tails:
            score = difflib.SequenceMatcher(None, t, canon).ratio()
            if score > best_score:
                best, best_score = canon, score
    return best if best_score >= NEAREST_MIN else None


def alias_line(tag: str, canonical: str) -> str:
    """The ``--alias`` option that maps ``tag`` to ``canonical``, quoted for a POSIX shell."""
    import shlex

    return f"--alias {shlex.quote(f'{tag}={canonical}')}"
