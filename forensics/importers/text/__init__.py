"""Text logs big-model trainers print (Megatron, DeepSpeed, llm.c, nanoGPT, torchtitan,
fairseq, Composer, MLPerf, OLMo, and a generic per-step key-value fallback).

One small module per family; this package's importer (format ``text_logs``) claims the
files and builds the canonical frame. :func:`sniff` names the families a file's head and
tail show; :func:`parse_text` runs them, gives a step to rows printed without one, merges
the copies several ranks print, and reads the end of the log for how the job ended
(:mod:`crash`). Each log file is its own job (a folder of SLURM logs is several jobs); a log
inside a TensorBoard or HF output folder joins that folder's job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import polars as pl

from forensics.findings import Finding
from forensics.importers.base import (
    ImportResult,
    ReadOptions,
    Source,
    binary_junk,
    open_bytes,
    read_bytes,
    rel,
    strip_suffixes,
    text_bytes,
)
from forensics.importers.restarts import (
    assign_segments,
    counter_tags,
    interleaved_note,
    restart_findings,
)
from forensics.importers.text import (
    composer,
    crash,
    deepspeed,
    fairseq,
    generic,
    hf_stdout,
    layout,
    llmc,
    megatron,
    mlperf,
    nanogpt,
    olmo,
    step_lines,
    torchtitan,
)
from forensics.importers.text.checkpoint_lines import saved_steps
from forensics.importers.text.engine import (
    ROWS,
    Ctx,
    Text,
    WideRows,
    clean,
    drop_rank_repeats,
    empty_rows,
    map_text,
    sample_text,
)
from forensics.schema import SCHEMA, conform

NAME = "text_logs"
SUFFIXES = (".log", ".txt", ".out", ".err", ".stdout", ".stderr")
CRASH_ONLY_SUFFIXES = (".log", ".out", ".err", ".stdout", ".stderr")
SNIFF_BYTES = 262144

# Specific families, each recognised by its own line shapes. Several may apply to one file
# (Megatron-DeepSpeed prints Megatron iteration lines and DeepSpeed overflow lines).
FAMILIES: list[ModuleType] = [
    megatron,
    llmc,
    nanogpt,
    torchtitan,
    fairseq,
    composer,
    mlperf,
    olmo,
    hf_stdout,
    step_lines,
    deepspeed,
]
CRASH_TAIL_BYTES = 131072


@dataclass
class TextLog:
    frame: pl.DataFrame  # ROWS columns with steps resolved
    families: list[str]
    x_kind: str = "step"
    may_restart: bool = True  # False when no series ever steps backwards (no segments needed)
    notes: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    # Rows a family kept wide (see WideRows); ``frame`` holds the others.
    wide: WideRows | None = None


def sniff(sample: str) -> list[str]:
    """Names of the families whose lines appear in ``sample`` (generic when none does)."""
    found = [f.NAME for f in FAMILIES if f.sniff(sample)]
    if not found and generic.sniff(sample):
        found = [generic.NAME]
    return found


def looks_crashed(sample_tail: str) -> bool:
    return crash.find_crash(sample_tail.splitlines()[-crash.TAIL_LINES :]) is not None


def parse_text(raw: bytes, name: str) -> TextLog:
    """The log's rows (``frame``, every row), how it ended and what it says about itself."""
    log = _parse(raw, name)
    _materialize(log)
    return log


def _materialize(log: TextLog) -> None:
    """Put the wide rows into ``frame``, where the family that read them put its rows."""
    if log.wide is not None:
        log.frame = pl.concat([log.wide.blocks(), log.frame])
        log.wide = None


def _parse(raw: Text, name: str) -> TextLog:
    """Like :func:`parse_text`, but rows a family kept wide stay in ``wide``."""
    raw = clean(raw)
    ctx = Ctx(raw=raw, sample=sample_text(raw), name=name)
    names = sniff(ctx.sample)
    mods = [f for f in FAMILIES if f.NAME in names and f is not deepspeed]
    parts = [(f, f.parse(ctx)) for f in mods]
    wide = ctx.wide
    wide_stats = _wide_stats(wide)
    # DeepSpeed overflow lines may sit anywhere: checked after the other families, which
    # may already have looked at every line.
    if deepspeed.NAME in names or deepspeed.applies(ctx):
        parts.append((deepspeed, deepspeed.parse(ctx)))
    if (
        wide_stats is None
        and not any(_has_steps(p) for _, p in parts)
        and generic.sniff(ctx.sample)
    ):
        parts.append((generic, generic.parse(ctx)))
    anchors = _anchors(parts, ctx)
    done = []
    for fam, part in parts:
        if fam is megatron and wide is not None and part.get_column("step").null_count():
            # Rows placed by their neighbours are sorted in among the family's other rows.
            part = pl.concat([wide.blocks(), part])
            wide, wide_stats = None, None
        part = resolve_steps(part, anchors, ctx)
        if not getattr(fam, "DEDUPED", False):
            part = drop_rank_repeats(
                part.filter(~pl.col("tag").is_in(deepspeed.EVENT_TAGS))
            ).vstack(part.filter(pl.col("tag").is_in(deepspeed.EVENT_TAGS)))
        if fam is deepspeed:
            part = deepspeed.dedupe_events(part)
        done.append((fam, part))
    rows = pl.concat([p for _, p in done]) if done else empty_rows()
    last_ln = max((_last_metric_ln(f, p) for f, p in done), default=None)
    if ctx.bad_lines:
        ctx.notes.append(f"{name}: skipped {ctx.bad_lines} malformed metric line(s)")
    findings = []
    steps: list[int] = []
    if rows.height:
        steps.append(int(rows.get_column("step").max()))  # type: ignore[arg-type]
    if wide_stats is not None:
        last_ln = max(last_ln if last_ln is not None else -1, wide_stats[0])
        steps.append(wide_stats[1])
    last = max(steps) if steps else None
    found = crash.crash_finding(_tail_after(raw, last_ln, ctx), last, where=name)
    if found is not None:
        findings.append(found)
    saved = saved_steps(raw, [f.NAME for f, _ in done])
    if saved:  # the checkpoints the log says it saved (the rollback advice's)
        ctx.metadata["checkpoints"] = saved
        ctx.metadata["checkpoints_said"] = True  # (said by the log, not found beside it)
    return TextLog(
        frame=rows,
        families=[f.NAME for f, _ in done],
        x_kind=ctx.x_kind,
        may_restart=_may_restart(done, ctx),
        notes=ctx.notes,
        findings=findings,
        config=ctx.config,
        metadata=ctx.metadata,
        wide=wide,
    )


def _wide_stats(wide: WideRows | None) -> tuple[int, int] | None:
    """(last line, last step) of the wide rows; None when there is none."""
    if wide is None:
        return None
    has = wide.has_rows()
    ln, step = wide.frame.select(
        pl.col("ln").filter(has).max(), pl.col("step").filter(has).max()
    ).row(0)
    return None if ln is None else (int(ln), int(step))


def _has_steps(part: pl.DataFrame) -> bool:
    return part.get_column("step").null_count() < part.height  # no scan: null counts are cached


def _last_metric_ln(fam: ModuleType, part: pl.DataFrame) -> int:
    if fam is deepspeed:
        part = part.filter(~pl.col("tag").is_in(deepspeed.EVENT_TAGS))
    last = part.get_column("ln").max() if part.height else None
    return -1 if last is None else int(last)  # type: ignore[arg-type]


def _anchors(parts: list[tuple[ModuleType, pl.DataFrame]], ctx: Ctx) -> pl.DataFrame:
    """(ln, step) of every line that printed a step, for rows printed without one."""
    if not any(p.get_column("step").null_count() for _, p in parts):
        return pl.DataFrame(schema={"ln": pl.Int64, "step": pl.Int64})
    out = []
    for fam, part in parts:
        if getattr(fam, "DEDUPED", False) and ctx.line_steps is not None:
            out.append(ctx.line_steps)
        else:
            known = part.filter(
                pl.col("step").is_not_null() & ~pl.col("tag").is_in(deepspeed.EVENT_TAGS)
            )
            out.append(known.group_by("ln").agg(pl.col("step").first()))
    return (
        pl.concat(out).unique("ln").sort("ln")
        if out
        else pl.DataFrame(schema={"ln": pl.Int64, "step": pl.Int64})
    )


def resolve_steps(rows: pl.DataFrame, anchors: pl.DataFrame, ctx: Ctx) -> pl.DataFrame:
    """Give rows printed without a step the step of a neighbouring metric line."""
    if not rows.get_column("step").null_count():
        return rows
    pending = rows.filter(pl.col("step").is_null())
    known = rows.filter(pl.col("step").is_not_null())
    if anchors.is_empty():
        # No step anywhere (e.g. only DeepSpeed overflow lines): number events in order.
        ctx.x_kind = "points"
        ctx.notes.append(
            f"{ctx.name}: the log prints no step numbers; its events are numbered in the order "
            "they appear"
        )
        return pl.concat([known, _number_in_order(pending)])
    pending = pending.sort("ln")
    prev = pending.join_asof(anchors.rename({"step": "_prev"}), on="ln", strategy="backward")
    both = prev.join_asof(anchors.rename({"step": "_next"}), on="ln", strategy="forward")
    fill = pl.col("fill")
    step = (
        pl.when(fill == "next")
        .then(pl.coalesce("_next", "_prev"))
        .when(fill == "prev0")
        .then(pl.coalesce("_prev", pl.lit(0, dtype=pl.Int64)))
        .otherwise(pl.coalesce("_prev", "_next"))
    )
    resolved = both.with_columns(step.alias("step")).select(list(ROWS))
    return pl.concat([known, resolved]).sort("ln", maintain_order=True)


def _may_restart(parts: list[tuple[ModuleType, pl.DataFrame]], ctx: Ctx) -> bool:
    """Does any series step backwards in line order? If not, there is no restart to number
    (this spares the job-level segmentation on logs of millions of rows)."""
    for fam, part in parts:
        if getattr(fam, "DEDUPED", False) and ctx.line_steps is not None:
            back = ctx.line_steps.select((pl.col("step").diff() < 0).any()).item()
        else:
            # Loss-scale events are left out: their steps are placed, not printed.
            series = part.filter(~pl.col("tag").is_in(deepspeed.EVENT_TAGS)).sort("tag", "ln")
            back = series.select(
                ((pl.col("step").diff() < 0) & (pl.col("tag") == pl.col("tag").shift(1))).any()
            ).item()
        if back:
            return True
    return False


def _collapse_copies(events: pl.DataFrame, window: int = 40) -> pl.DataFrame:
    """Without steps, rank copies of one event are the same tag and value a few lines apart."""
    events = events.sort("ln")
    prev_v = pl.col("value").shift(1).over("tag")
    prev_ln = pl.col("ln").shift(1).over("tag")
    same = (pl.col("value") == prev_v) & ((pl.col("ln") - prev_ln) <= window)
    return events.filter(~same.fill_null(False))


def _number_in_order(pending: pl.DataFrame) -> pl.DataFrame:
    """Loss-scale events numbered 0, 1, 2... in file order; each overflow line takes the
    number of the scale event it belongs to (the one printed with or right after it)."""
    is_scale = pl.col("tag").is_in([deepspeed.SCALE_TAG, deepspeed.SCALE_UP_TAG])
    scale = _collapse_copies(pending.filter(is_scale))
    scale = scale.with_columns(pl.int_range(pl.len()).cast(pl.Int64, strict=False).alias("step"))
    rest = pending.filter(~is_scale).sort("ln")
    if scale.is_empty():
        rest = _collapse_copies(rest)
        return rest.with_columns(
            pl.int_range(pl.len()).over("tag").cast(pl.Int64, strict=False).alias("step")
        ).select(list(ROWS))
    lut = scale.select("ln", pl.col("step").alias("_n"))
    rest = rest.join_asof(lut, on="ln", strategy="forward").join_asof(
        lut.rename({"_n": "_p"}), on="ln", strategy="backward"
    )
    rest = rest.with_columns(pl.coalesce("_n", "_p").alias("step")).select(list(ROWS))
    return pl.concat([scale.select(list(ROWS)), rest]).sort("ln", maintain_order=True)


def _tail_after(raw: Text, last_ln: int | None, ctx: Ctx) -> str:
    """The end of the log after its last metric line (bounded), where a crash would show."""
    tail = raw[-CRASH_TAIL_BYTES:]
    if last_ln is None or last_ln < 0:
        return tail.decode("utf-8", "replace")
    if ctx.n_lines is not None:
        # Newlines before the tail = all newlines - those in the tail (no full-file count).
        total_nl = ctx.n_lines - (0 if raw.endswith(b"\n") else 1)
        lines_before_tail = total_nl - tail.count(b"\n")
    else:
        lines_before_tail = raw.count(b"\n", 0, len(raw) - len(tail))
    text = tail.decode("utf-8", "replace").split("\n")
    skip = last_ln - lines_before_tail  # index of the last metric line within the tail
    if skip >= 0:
        text = text[skip:]  # keep the last metric line itself: a crash can share its line
    return "\n".join(text)


# -- the importer ------------------------------------------------------------------------
def _is_candidate(p: Path) -> bool:
    base = strip_suffixes(p.name).lower()
    return base.endswith(SUFFIXES) or ".log." in base or base.startswith("slurm-")


def head_and_tail(path: Path, n: int = SNIFF_BYTES) -> tuple[bytes, bytes]:
    """First and last ``n`` bytes (compressed files: the head only)."""
    try:
        with open_bytes(path) as fh:
            head = fh.read(n)
            if path.name.endswith((".gz", ".zst")):
                return head, b""
            size = path.stat().st_size
            if size <= n:
                return head, b""
            fh.seek(max(n, size - n))
            return head, fh.read(n)
    except Exception:  # noqa: BLE001 - sniffing never raises (corrupt .gz/.zst, permissions)
        return b"", b""


# A text log's elapsed-time field (seconds since the job started unless the name says ms/min):
# the clock of lines that carry no date. Not a per-iteration time ("elapsed time per iteration").
_ELAPSED_TAG = re.compile(
    r"^(?:time[ _/.-]?)?(?:elapsed|wall(?:[ _-]?clock)?|total[ _-]time|time[ _-]elapsed|runtime)"
    r"(?:[ _-]?time)?"
    r"(?:[ _-]?(?:\(?(?P<unit>s|sec|secs|seconds|ms|min|mins|minutes|h|hours)\)?))?$",
    re.I,
)
_ELAPSED_SCALE = {"ms": 1e-3, "min": 60.0, "mins": 60.0, "minutes": 60.0, "h": 3600.0}
_ELAPSED_SCALE["hours"] = 3600.0


def _elapsed_as_wall_time(frame: pl.DataFrame, name: str) -> tuple[pl.DataFrame, str | None]:
    """Fill a null ``wall_time`` from the line's elapsed-time field (relative seconds)."""
    if frame.is_empty() or frame.get_column("wall_time").null_count() < frame.height:
        return frame, None
    tags = [t for t in frame.get_column("tag").unique().to_list() if _ELAPSED_TAG.match(t)]
    if not tags:
        return frame, None
    tag = tags[0]
    unit = (_ELAPSED_TAG.match(tag).group("unit") or "s").lower()  # type: ignore[union-attr]
    scale = _ELAPSED_SCALE.get(unit, 1.0)
    clock = (
        frame.filter(pl.col("tag") == tag)
        .group_by("record_idx")
        .agg((pl.col("value").first() * scale).alias("_clock"))
    )
    out = (
        frame.join(clock, on="record_idx", how="left", maintain_order="left")
        .with_columns(pl.coalesce("wall_time", "_clock").alias("wall_time"))
        .drop("_clock")
    )
    return out, f"{name}: times are the log's {tag} field, seconds since the job started"


class TextLogsImporter:
    NAME = NAME

    def discover(self, root: Path, files: list[Path]) -> list[Source]:
        out: list[Source] = []
        for f in files:
            if not _is_candidate(f):
                continue
            head, tail = head_and_tail(f)
            if not head or binary_junk(head):
                continue
            head, tail = text_bytes(head), text_bytes(tail)
            sample = (
                clean(head).decode("utf-8", "replace")
                + "\n"
                + clean(tail).decode("utf-8", "replace")
            )
            families = sniff(sample)
            if not families:
                end = (tail or head).decode("utf-8", "replace")
                if not (
                    strip_suffixes(f.name).lower().endswith(CRASH_ONLY_SUFFIXES)
                    and looks_crashed(end)
                ):
                    continue
            out.append(
                Source(NAME, [f], rel(f, root), root, scope="file", options={"families": families})
            )
        return out

    def read(self, source: Source, options: ReadOptions) -> ImportResult:
        # The bytes go straight into the parse: only the parse holds them (no copy kept
        # while the frame is built).
        log = _parse(_read_log(source.files[0]), self._name(source))
        return self._result(source, log, options.series_order)

    def read_raw(self, source: Source, raw: bytes, series_order: bool = False) -> ImportResult:
        """The source's file given as its (text) bytes: a tail passes the complete lines
        (rows in line order unless ``series_order``, see ReadOptions)."""
        return self._result(source, _parse(raw, self._name(source)), series_order)

    @staticmethod
    def _name(source: Source) -> str:
        return rel(source.files[0], source.root)

    def _result(self, source: Source, log: TextLog, series_order: bool) -> ImportResult:
        name = self._name(source)
        family = log.families[0] if log.families else "text"
        if log.wide is not None and not layout.fits(log.wide, log.frame, _ELAPSED_TAG):
            _materialize(log)
        quiet = False
        if log.wide is None:
            frame = layout.canonical(log.frame, family, name, log.x_kind)
            frame, elapsed_note = _elapsed_as_wall_time(frame, name)
            counters = counter_tags(frame.get_column("tag").unique().to_list())
            if log.may_restart or counters or elapsed_note:
                frame = assign_segments(conform(frame))
        else:
            # Rows laid out once, in the order the steps above would leave them in.
            elapsed_note = None
            counters = counter_tags(layout.tags(log.wide, log.frame))
            by_line = log.may_restart or bool(counters)
            rows, quiet = layout.lay_out(log.wide, log.frame, by_line, counters, series_order)
            log.wide = None
            frame = layout.canonical(rows, family, name, log.x_kind)
            del rows
            if by_line and not quiet:
                frame = assign_segments(conform(frame))
        notes = list(log.notes)
        if elapsed_note:
            notes.append(elapsed_note)
        if not quiet and (shared := interleaved_note(frame, name)) is not None:
            notes.append(shared)
        metadata = dict(log.metadata)
        if log.families:
            # Which trainer's lines were read: a fact about the log for the report's run
            # section (not a data-quality note: nothing was left out).
            metadata["text_log"] = " + ".join(log.families)
        if frame.is_empty():
            notes.append(f"{name}: no metric line found")
        findings = restart_findings(frame) + log.findings
        return ImportResult(
            frame=frame if frame.schema == SCHEMA else conform(frame),
            notes=notes,
            findings=findings,
            config=log.config,
            metadata=metadata,
        )


def _read_log(path: Path) -> Text:
    """The file's text bytes (as ``read_bytes``; a plain file in one read, no second copy),
    or a big plain log mapped (:func:`engine.map_text`: the same bytes, never read whole)."""
    if path.name.endswith((".gz", ".zst")):
        return read_bytes(path)
    mapped = map_text(path)
    if mapped is not None:
        return mapped
    return text_bytes(path.read_bytes())


IMPORTER = TextLogsImporter()
