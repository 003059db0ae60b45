"""MLPerf Training result logs: ``:::MLLOG {json}`` lines (mlperf_logging).

``tracked_stats`` carry training values with ``metadata.step``; ``eval_accuracy`` carries
``metadata.epoch_num``. Both count samples (for the LLM benchmarks, tokens: samples x
sequence length), so they are converted to optimizer steps with ``global_batch_size``
(x ``max_sequence_length`` when that is what divides them). For gpt3 and llama2_70b_lora
``eval_accuracy`` is a validation log-perplexity (lower is better), so its tag says so.
Hyper-parameters (``opt_*``, ``global_batch_size``, ``seed`` ...) go to the run config.
"""

from __future__ import annotations

import json
import re

import polars as pl

from forensics.importers.text.engine import Ctx, conform_rows, empty_rows

NAME = "mlperf"
SNIFF = re.compile(r":::MLLOG \{")
LOSS_LIKE_EVAL = {"gpt3", "llama2_70b_lora"}
EVAL_LOSS_TAG = "eval_accuracy (log perplexity)"
_CONFIG_KEYS = re.compile(
    r"^(?:opt_|global_batch_size|gradient_accumulation_steps|max_sequence_length|seed|"
    r"submission_|init_checkpoint_step|train_samples|eval_samples|trained_samples|"
    r"max_steps|warmup|sequence_length)"
)


def sniff(sample: str) -> bool:
    return bool(SNIFF.search(sample))


def parse(ctx: Ctx) -> pl.DataFrame:
    lines = ctx.lines.filter(pl.col("line").str.contains(":::MLLOG {", literal=True))
    ln_out: list[int] = []
    x_out: list[int] = []
    tags: list[str] = []
    vals: list[float] = []
    times: list[float | None] = []
    bad = 0
    # MLLOG values mix scalars, dicts and null from line to line, which defeats a columnar
    # JSON decode; the logs hold thousands of lines, not millions.
    for ln, text in lines.iter_rows():
        try:
            ev = json.loads(text[text.index(":::MLLOG ") + 9 :])
        except (ValueError, RecursionError):
            bad += 1
            continue
        key, value, meta = ev.get("key"), ev.get("value"), ev.get("metadata") or {}
        t = ev.get("time_ms")
        if key == "run_stop":
            ctx.metadata["mlperf_status"] = meta.get("status")
        if _CONFIG_KEYS.match(str(key)) and not isinstance(value, dict):
            ctx.config[key] = value
            continue
        x = meta.get("step", meta.get("epoch_num"))
        if x is None or not isinstance(x, (int, float)):
            continue
        items = value.items() if isinstance(value, dict) else [(key, value)]
        for k, v in items:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            ln_out.append(ln)
            x_out.append(int(x))
            tags.append(str(k))
            vals.append(float(v))
            times.append(t / 1000.0 if isinstance(t, (int, float)) else None)
    ctx.bad_lines += bad
    if not ln_out:
        return empty_rows()
    bench = str(ctx.config.get("submission_benchmark", "")).lower()
    if bench in LOSS_LIKE_EVAL:
        tags = [EVAL_LOSS_TAG if t == "eval_accuracy" else t for t in tags]
    steps = _to_steps(x_out, ctx)
    return conform_rows(
        pl.DataFrame(
            {"ln": ln_out, "step": steps, "tag": tags, "value": vals, "wall_time": times},
            schema_overrides={"wall_time": pl.Float64},
        )
    )


def _to_steps(xs: list[int], ctx: Ctx) -> list[int]:
    gbs = ctx.config.get("global_batch_size")
    seq = ctx.config.get("max_sequence_length")
    nonzero = [x for x in xs if x]
    for unit, what in (
        (
            gbs * seq if isinstance(gbs, int) and isinstance(seq, int) else None,
            "global_batch_size x max_sequence_length tokens",
        ),
        (gbs if isinstance(gbs, int) else None, "global_batch_size samples"),
    ):
        if unit and nonzero and all(x % unit == 0 for x in nonzero):
            ctx.notes.append(
                f"{ctx.name}: MLPerf counts samples; converted to optimizer steps ({what} per step)"
            )
            return [x // unit for x in xs]
    ctx.x_kind = "samples"
    ctx.notes.append(
        f"{ctx.name}: MLPerf counts samples and the batch size does not divide them; "
        "the x axis is samples, so windows are in logged points"
    )
    return xs
