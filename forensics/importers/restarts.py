"""Restart detection shared by importers: a series' step going backwards starts a new segment.

A job resumed from a checkpoint at step ``c`` logs steps ``c, c+1, ...`` again although the
first attempt had already logged up to some ``last > c``: the same ``(tag, step)`` appears
twice. That is a restart. A new event file (or appended lines) whose steps simply continue
is *not* one: many jobs write several files without ever restarting.

Segments are a job-level idea: when one series goes backwards, every series of the source
from that point on belongs to the new segment (``segment`` 0, 1, 2 ...). Every row is kept;
the analysis view (:func:`forensics.run.analysis_view`) then lets a later segment pre-empt
earlier rows at steps >= its first step, per series (TensorBoard data-server semantics).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import NamedTuple

import numpy as np
import polars as pl

from forensics.findings import Finding, FindingKind, Severity
from forensics.schema import LR, SCHEMA, canonicalize

# (file_idx, record_idx, step) of a TensorBoard SessionLog.START: the writer asked readers to
# purge everything logged at or after ``step`` (torch/tensorboardX ``purge_step=``).
PurgeMark = tuple[int, int, int]


def assign_segments(
    frame: pl.DataFrame,
    order: list[str] | None = None,
    purges: Sequence[PurgeMark] = (),
) -> pl.DataFrame:
    """Number segments: +1 where a restart begins. Returns the frame in record order.

    Rows are taken in ``order`` (default file then record; ties keep the input order). A row
    whose step is smaller than the previous step of the same tag *within the current segment*
    starts a restart. Comparing only within the current segment merges the backward jumps of
    all tags of one replay into one restart. When the backward row sits in a newer file than
    the row it jumps back from, the restart is dated to the start of that file: the resumed
    job opened it, and rows it wrote before the first backward jump belong to it too.
    """
    order = order or ["file_idx", "record_idx"]
    if frame.is_empty():
        return frame.with_columns(pl.lit(0, dtype=SCHEMA["segment"]).alias("segment"))
    if _in_order(frame, order):
        f = frame  # importers emit record order: no sorted copy of the whole frame
    else:
        f = frame.with_row_index("_row").sort([*order, "_row"]).drop("_row")
    steps = f.get_column("step").to_numpy()
    n = len(f)
    tag_ids = f.get_column("tag").cast(pl.Categorical).to_physical().to_numpy()
    files = (
        f.get_column("file_idx").to_numpy()
        if "file_idx" in f.columns
        else np.zeros(n, dtype=np.int64)
    )
    has_step = (
        ~np.isnan(steps.astype(np.float64)) if steps.dtype.kind == "f" else np.ones(n, dtype=bool)
    )
    # Steps compared as floats (a null step is NaN); integer steps that floats hold exactly
    # are compared as they are, without a float copy of the column.
    exact = steps.dtype.kind in "iu" and (
        not n or max(abs(int(steps.min())), abs(int(steps.max()))) < 1 << 53
    )
    s = steps if exact else steps.astype(np.float64)
    # Previous row of the same tag (with a step): sort positions by (tag, pos) and shift.
    # A stable sort by tag keeps positions in order: the same as a lexsort on (tag,
    # position); on 16-bit ids numpy's stable sort is a radix sort. Positions as int32 and
    # no (current, previous) pair arrays for the whole frame: this runs on every row.
    sel = None if has_step.all() else np.flatnonzero(has_step)
    ids = tag_ids if sel is None else tag_ids[sel]
    if len(ids) and int(ids.max()) < 1 << 16:
        ids = ids.astype(np.uint16)
    by_tag = np.argsort(ids, kind="stable")
    if n < 1 << 31:
        by_tag = by_tag.astype(np.int32)
    sorted_ids = ids[by_tag]
    del ids
    if sel is not None:
        by_tag = sel[by_tag]
    same = sorted_ids[1:] == sorted_ids[:-1]
    s_by = s[by_tag]
    back_all = same & (s_by[1:] < s_by[:-1])
    cand_pos, cand_prev = by_tag[1:][back_all], by_tag[:-1][back_all]
    # Two writers sharing one file (ranks interleaving their lines): many small step-backs of
    # the same series, each soon overtaken. No restart.
    shaky: set[int] = set()
    if int(back_all.sum()) >= _INTERLEAVE_MIN_BACKS:
        shaky = _interleaved_tags(
            sorted_ids[1:][same],
            s_by[1:][same].astype(np.float64),
            s_by[:-1][same].astype(np.float64),
        )
    del s_by, back_all, sorted_ids
    if shaky:
        keep = ~np.isin(tag_ids[cand_pos], np.fromiter(shaky, dtype=np.int64))
        cand_pos, cand_prev = cand_pos[keep], cand_prev[keep]
    events: list[tuple[int, int, int]] = [
        (int(p), 0, int(q)) for p, q in zip(cand_pos, cand_prev, strict=True)
    ]
    # Another counter that starts again while the step goes on: epoch, consumed samples or
    # tokens, an elapsed-time field or a relative clock.
    events.extend(_counter_resets(f, tag_ids, by_tag, same))
    if purges:
        rec = f.get_column("record_idx").to_numpy() if "record_idx" in f.columns else np.arange(n)
        key = files.astype(np.int64) * (1 << 32) + rec.astype(np.int64)
        for fi, ri, st in purges:
            p = int(np.searchsorted(key, fi * (1 << 32) + ri, side="left"))
            if p < n:
                events.append((p, 1, int(st)))
    events.sort()
    file_start = {}
    for fi in np.unique(files):
        file_start[int(fi)] = int(np.argmax(files == fi))
    cuts: list[int] = []
    current = 0
    for p, is_purge, other in events:
        if is_purge:
            # A purge is a restart only when it throws something away.
            if (
                p > current
                and np.nanmax(np.where(has_step[current:p], s[current:p], -np.inf)) >= other
            ):
                cuts.append(p)
                current = p
            continue
        if other < current:
            continue  # jumps back across the current cut: part of that restart
        cut = p
        if files[p] != files[other]:
            cut = max(file_start[int(files[p])], current + 1)
        if cut > current:
            cuts.append(cut)
            current = cut
    # Segment of a row = the number of cuts at or before it (cuts are increasing positions).
    bounds = np.array([0, *cuts, n], dtype=np.int64)
    lengths = bounds[1:] - bounds[:-1]
    seg = np.repeat(np.arange(len(cuts) + 1, dtype=np.int64), lengths)
    return f.with_columns(pl.Series("segment", seg).cast(SCHEMA["segment"]))


# Counters that only grow within one job: a drop to less than half is a new job's count.
COUNTER_TAG = re.compile(
    r"^(?:train_|trainer_)?epoch$"
    r"|(?:^|_)(?:(?:consumed|seen|global|cumulative)_(?:samples|tokens)"
    r"|(?:samples|tokens)_(?:seen|consumed|processed)|consumed_train_samples"
    r"|elapsed(?:_time)?|time_elapsed)$"
)
_RELATIVE_CLOCK = 1e9  # wall times below this are seconds since the job started
_MIN_CLOCK_S = 60.0
_INTERLEAVE_MIN_BACKS = 4
_INTERLEAVE_SHARE = 0.1


def counter_tags(tags: Sequence[str]) -> list[str]:
    """The tags among ``tags`` that are counters (epoch, consumed samples/tokens, elapsed)."""
    from forensics.schema import normalize_tag

    return [t for t in tags if COUNTER_TAG.search(normalize_tag(t))]


def _counter_resets(
    f: pl.DataFrame, tag_ids: np.ndarray, by_tag: np.ndarray, same: np.ndarray
) -> list[tuple[int, int, int]]:
    """(position, 0, previous position) of each counter that falls to less than half."""
    out: list[tuple[int, int, int]] = []
    tag_col = f.get_column("tag")
    counters = counter_tags(tag_col.unique().to_list())
    if counters:
        vals = f.get_column("value").to_numpy().astype(np.float64, copy=False)
        row_is_counter = tag_col.is_in(counters).to_numpy()
        is_counter = row_is_counter[by_tag[1:]] & same
        c, p = by_tag[1:][is_counter], by_tag[:-1][is_counter]
        drop = (vals[p] > 0) & (vals[c] < 0.5 * vals[p])
        out += [(int(a), 0, int(b)) for a, b in zip(c[drop], p[drop], strict=True)]
    if "wall_time" in f.columns:
        w = f.get_column("wall_time").to_numpy().astype(np.float64, copy=False)
        ok = np.isfinite(w) & (w >= 0)
        # The largest clock value first: the row list is only needed for a relative clock.
        if int(ok.sum()) > 1 and np.max(w, where=ok, initial=-np.inf) < _RELATIVE_CLOCK:
            rows = np.flatnonzero(ok)
            c, p = rows[1:], rows[:-1]
            drop = (w[p] >= _MIN_CLOCK_S) & (w[c] < 0.5 * w[p])
            out += [(int(a), 0, int(b)) for a, b in zip(c[drop], p[drop], strict=True)]
    return out


_EPOCH_TAG = re.compile(r"^(?:train_|trainer_)?epoch$")


def epoch_local_steps(frame: pl.DataFrame, where: str) -> tuple[pl.DataFrame, str | None]:
    """Steps counted from 0 again in each epoch (``{"epoch": 1, "step": 0, ...}``, the
    ``enumerate(loader)`` of a hand-written loop): made one continuous count, with a note.

    Read as restarts, each epoch replaced the one before it: a three-epoch log kept only its
    last epoch. It is taken as epoch-local when, in line order, every step that goes back
    goes back to less than half of the step before it on a line whose epoch is higher, and
    the epoch never falls (a resume goes back within an epoch, or to an epoch again). Each
    epoch then continues from the last step of the one before, one logging interval on.
    ``frame``: one file's rows in line order. The frame is returned as it was otherwise."""
    if frame.is_empty() or "record_idx" not in frame.columns:
        return frame, None
    from forensics.evidence.robust import median_interval
    from forensics.schema import normalize_tag

    tag = pl.col("tag").cast(pl.String)
    names = frame.select(tag.unique()).to_series().to_list()
    epochs = [t for t in names if t is not None and _EPOCH_TAG.search(normalize_tag(t))]
    rec = frame.get_column("record_idx")
    if not epochs or rec.null_count() or not rec.is_sorted():
        return frame, None
    lines = (
        frame.filter(pl.col("step").is_not_null())
        .group_by("record_idx", maintain_order=True)
        .agg(pl.col("step").first())
        .join(
            frame.filter(tag == epochs[0]).select("record_idx", pl.col("value").alias("epoch")),
            on="record_idx",
            how="left",
        )
        .with_columns(pl.col("epoch").forward_fill())
    )
    s = lines.get_column("step").to_numpy().astype(np.int64)
    e = lines.get_column("epoch").to_numpy().astype(np.float64)
    back = np.flatnonzero(s[1:] < s[:-1]) + 1
    if not len(back):
        return frame, None
    known = e[np.isfinite(e)]
    if (
        not np.isfinite(e[back]).all()
        or not np.isfinite(e[back - 1]).all()
        or not (e[back] > e[back - 1]).all()
        or bool(np.any(np.diff(known) < 0))
        or not (2 * s[back] < s[back - 1]).all()
    ):
        return frame, None
    bounds = [0, *back.tolist(), len(s)]
    interval = max(1, int(median_interval(s)))  # (the step-backs are not intervals)
    offsets = np.zeros(len(s), dtype=np.int64)
    off = 0
    for k in range(1, len(bounds) - 1):
        prev, cur = s[bounds[k - 1] : bounds[k]], s[bounds[k] : bounds[k + 1]]
        off += int(prev.max()) + interval - int(cur.min())
        offsets[bounds[k] : bounds[k + 1]] = off
    shift = pl.DataFrame(
        {"record_idx": lines.get_column("record_idx"), "_off": offsets},
        schema_overrides={"record_idx": rec.dtype},
    )
    out = (
        frame.join(shift, on="record_idx", how="left", maintain_order="left")
        .with_columns((pl.col("step") + pl.col("_off").fill_null(0)).cast(frame.schema["step"]))
        .drop("_off")
    )
    firsts = ", ".join(
        f"epoch {e[b]:g} from step {int(s[b] + offsets[b]):,}" for b in back[:3].tolist()
    ) + (" ..." if len(back) > 3 else "")
    note = (
        f"{where}: the step counts from {int(s[back[0]]):,} again at each new epoch "
        f"({len(back):,} time(s)); read as one run, each epoch continuing from the last step "
        f"of the one before ({firsts}), not as restarts"
    )
    return out, note


def _interleaved_tags(ids: np.ndarray, cur: np.ndarray, prev: np.ndarray) -> set[int]:
    """Tag ids whose step goes back often and by little: lines of two writers interleaved."""
    out: set[int] = set()
    back = cur < prev
    if int(back.sum()) < _INTERLEAVE_MIN_BACKS:
        return out
    # Only tags that step back often enough are looked at (per-layer runs hold thousands).
    tags, counts = np.unique(ids[back], return_counts=True)
    for t in tags[counts >= _INTERLEAVE_MIN_BACKS]:
        m = ids == t
        d = cur[m] - prev[m]
        backs = d[d < 0]
        if len(backs) < _INTERLEAVE_MIN_BACKS or len(backs) < _INTERLEAVE_SHARE * len(d):
            continue
        fwd = d[d > 0]
        span = float(np.nanmax(cur[m]) - np.nanmin(cur[m])) if len(d) else 0.0
        # Small: each step-back is a small part of the series' range.
        if len(fwd) and float(np.max(-backs)) <= max(0.05 * span, 3 * float(np.median(fwd))):
            out.add(int(t))
    return out


def interleaved_note(frame: pl.DataFrame, where: str) -> str | None:
    """A note when some series of ``frame`` (record order) look like two writers' lines."""
    if frame.is_empty():
        return None
    f = frame.filter(pl.col("step").is_not_null())
    names = f.get_column("tag").unique(maintain_order=True).to_list()
    index = {n: i for i, n in enumerate(names)}
    tags = f.get_column("tag").replace_strict(index, return_dtype=pl.Int64).to_numpy()
    order = np.argsort(tags, kind="stable")
    s = f.get_column("step").to_numpy().astype(np.float64)[order]
    t = tags[order]
    same = t[1:] == t[:-1]
    shaky = _interleaved_tags(t[1:][same], s[1:][same], s[:-1][same])
    if not shaky:
        return None
    shown = ", ".join(sorted(names[int(i)] for i in shaky)[:3])
    return (
        f"{where}: the steps of {shown} go back and forth by a little, often: two writers "
        "(ranks) interleave their lines in one file; read as one job, not as restarts"
    )


def _segment_rows(f: pl.DataFrame) -> Callable[[int], pl.DataFrame]:
    """The rows of one segment: a slice where the segments follow each other in the frame (an
    importer's record order: no copy, no pass over the rest), else a filter."""
    seg = f.get_column("segment").to_numpy()
    if len(seg) and bool((seg[1:] >= seg[:-1]).all()):
        # (every segment's first row at once: a search per call cast the whole column)
        at = np.searchsorted(seg, np.arange(int(seg[-1]) + 2, dtype=seg.dtype)).tolist()
        return lambda k: f.slice(at[k], at[k + 1] - at[k]) if 0 <= k < len(at) - 1 else f.clear()
    return lambda k: f.filter(pl.col("segment") == k)


def _restart_counter(a: pl.DataFrame, b: pl.DataFrame) -> str:
    """What started again at segment ``b`` (after segment ``a``, their rows): "step", or the
    counter that fell back."""
    sa = a.filter(pl.col("step").is_not_null()).group_by("tag").agg(pl.col("step").max())
    sb = b.filter(pl.col("step").is_not_null()).group_by("tag").agg(pl.col("step").min())
    j = sa.join(sb, on="tag", suffix="_b")
    if j.filter(pl.col("step_b") <= pl.col("step")).height:
        return "step"
    tags = counter_tags(list(set(a.get_column("tag").to_list()) & set(b.get_column("tag"))))
    for t in sorted(tags):
        last = a.filter(pl.col("tag") == t).get_column("value").drop_nulls()
        first = b.filter(pl.col("tag") == t).get_column("value").drop_nulls()
        if len(last) and len(first) and first[0] < last[-1]:
            return t
    wa, wb = a.get_column("wall_time").drop_nulls(), b.get_column("wall_time").drop_nulls()
    if len(wa) and len(wb) and wb[0] < wa[-1]:
        return "elapsed time"
    return "step"


def _in_order(frame: pl.DataFrame, order: list[str]) -> bool:
    """Are the rows already sorted by ``order`` (stable sort would keep them as they are)?"""
    if any(c not in frame.columns for c in order):
        return False
    cols = [frame.get_column(c) for c in order]
    if any(c.null_count() for c in cols):
        return False
    if len(cols) == 1:
        return cols[0].is_sorted()
    if len(cols) != 2 or not cols[0].is_sorted():
        return False
    a, b = cols[0].to_numpy(), cols[1].to_numpy()
    if a.dtype.kind not in "iu" or b.dtype.kind not in "iu" or len(a) < 2:
        return len(a) < 2
    same = a[1:] == a[:-1]
    return bool(np.all(b[1:][same] >= b[:-1][same]))


def restart_findings(frame: pl.DataFrame) -> list[Finding]:
    """One ``restart`` finding per segment boundary of a frame from :func:`assign_segments`:
    info, or a warning when the resumed job logs another LR than the earlier attempt at the
    same steps (its schedule did not continue: ``lr_step`` and the measures after it).

    Measures: ``resumed_from_step`` (first step of the new segment), ``last_step_before``,
    ``steps_replayed`` (width of the step range logged twice, inclusive), ``points_replayed``
    (rows the later segment pre-empts), ``wall_clock_gap_s`` (first time stamp after the
    restart minus the last one before it; negative means skewed clocks), ``file`` and
    ``segment``.
    """
    out: list[Finding] = []
    if frame.is_empty() or not (frame.get_column("segment").max() or 0):
        return out
    f = frame.with_row_index("_i")
    per = (
        f.group_by("segment")
        .agg(
            pl.col("step").min().alias("first"),
            pl.col("step").max().alias("last"),
            pl.col("wall_time").drop_nulls().first().alias("t_first"),
            pl.col("wall_time").drop_nulls().last().alias("t_last"),
            pl.col("file").first().alias("file"),
        )
        .sort("segment")
        .to_dicts()
    )
    # Every boundary's counts and LR comparison at once: a pass over the earlier segments'
    # rows at each boundary made a job resumed 200 times take 7 s to read (600k points).
    # (the three columns these counts read: a filter of the whole frame copied every column)
    stepped = f.select("tag", "step", "segment").filter(pl.col("step").is_not_null())
    blocks = (
        stepped.group_by("tag", "segment")
        .agg(
            pl.col("step").min().alias("lo"),
            pl.col("step").max().alias("hi"),
            pl.col("step").sort().alias("steps"),
        )
        .sort("tag", "segment")
    )
    points_at = _points_replayed(blocks)
    # The boundaries where some tag's step went back from the segment before: the step
    # counter restarted there (the first test of _restart_counter, for all at once).
    went_back = set(
        blocks.join(
            blocks.select(
                "tag", (pl.col("segment") + 1).alias("segment"), pl.col("hi").alias("hi_before")
            ),
            on=["tag", "segment"],
        )
        .filter(pl.col("lo") <= pl.col("hi_before"))
        .get_column("segment")
        .to_list()
    )
    repeats_at = _points_repeated(stepped)
    lr_rows = _lr_rows(f)
    lr_off_at = _lr_off_schedules(lr_rows) if lr_rows is not None else {}
    rows_of = _segment_rows(f)
    for prev, cur in pairwise(per):
        if cur["first"] is None or prev["last"] is None:
            continue
        k = int(cur["segment"])
        resumed, last = int(cur["first"]), int(prev["last"])
        # Rows of earlier segments at steps >= this segment's first step of the same tag.
        points = points_at.get(k, 0)
        # Of those, the ones whose (tag, step) the new segment logs again: a true replay.
        repeats = repeats_at.get(k, 0)
        gap = None
        if prev["t_last"] is not None and cur["t_first"] is not None:
            gap = float(cur["t_first"]) - float(prev["t_last"])
        replayed = max(0, last - resumed + 1)
        counter = "step" if k in went_back else _restart_counter(rows_of(k - 1), rows_of(k))
        gap_text = _gap_text(gap)
        lr_off = lr_off_at.get(k) if counter == "step" else None
        out.append(
            Finding(
                kind=FindingKind.RESTART,
                severity=Severity.WARNING if lr_off and lr_off.reshaped else Severity.INFO,
                metric=None,
                start_step=resumed,
                end_step=last,
                measures={
                    "resumed_from_step": resumed,
                    "last_step_before": last,
                    "steps_replayed": replayed,
                    "points_replayed": points,
                    "points_repeated": repeats,
                    "wall_clock_gap_s": gap,
                    "file": cur["file"],
                    "segment": k,
                    "counter": counter,
                    "lr_step": lr_off.step if lr_off else None,
                    "lr_before": lr_off.before if lr_off else None,
                    "lr_after": lr_off.after if lr_off else None,
                    "lr_max_ratio": lr_off.max_ratio if lr_off else None,
                    "lr_reshaped": lr_off.reshaped if lr_off else None,
                },
                summary=(
                    f"The job was resumed at step {resumed:,} after it had logged up to "
                    f"step {last:,}{gap_text}; {points:,} earlier points from step "
                    f"{resumed:,} on give way to the later ones"
                    + (
                        " (every one at a step logged again)."
                        if repeats == points
                        else f" ({repeats:,} of them at steps logged again)."
                        if repeats
                        else ": no step was logged twice, so two writers may have shared the "
                        "folder rather than a restart."
                    )
                    if counter == "step"
                    else f"The job started again at step {resumed:,} (after step {last:,}"
                    f"{gap_text}): its {counter} counter went back while the step went on."
                )
                + (_lr_off_text(lr_off) if lr_off else ""),
            )
        )
    return out


class _LrOff(NamedTuple):
    """How the resumed job's LR differs from the earlier attempt's at the steps both logged."""

    step: int  # the first such step differing by more than LR_MATCH
    before: float  # the earlier attempt's LR there
    after: float  # the resumed job's
    max_ratio: float  # the largest ratio of the two at one step, either way (>= 1)
    reshaped: bool  # their ratio varies over those steps: another schedule, not a factor


def _lr_rows(f: pl.DataFrame) -> pl.DataFrame | None:
    """The frame's LR rows (the importer's frame: its tags, not yet canonicalized), or None."""
    tags = [t for t in f.get_column("tag").unique().to_list() if t and _is_lr(t)]
    return f.filter(pl.col("tag").is_in(tags)) if tags else None


def _lr_off_schedules(lr: pl.DataFrame) -> dict[int, _LrOff]:
    """For each segment ``k`` that logs the LR (``lr``: :func:`_lr_rows`) again at steps an
    earlier segment logged it, where the two differ by more than :data:`LR_MATCH` at some
    step: how. The earlier value at a (tag, step) is the last one logged there before segment
    ``k``; the resumed job's, its first there.

    The LR is a function of the step: a resumed job that restored its scheduler logs the
    same LR at the same step. One factor at every step is a changed LR (lowering it 20-50%
    after a rollback is the article's own treatment); a ratio that varies by more than
    :data:`LR_SHAPE` is another schedule (a scheduler state not restored: a fresh warm-up, a
    cosine from its peak again). Segments where they agree, or no step has both, are left
    out."""
    # Within each (tag, step), each segment's first value beside the last value of the
    # segments before it (rows in record order, so in segment order).
    lr = lr.filter(pl.col("step").is_not_null())
    order, key, seg = _by_key(lr)
    new_key, new_group = _starts(key, seg)
    first = np.flatnonzero(new_group)
    last = np.append(first[1:] - 1, len(key) - 1)
    again = np.flatnonzero(~new_key[first])  # groups with an earlier segment's before them
    value = lr.get_column("value").to_numpy()[order]
    rows = order[first[again]]
    both = (
        pl.DataFrame(
            {
                "segment": seg[first[again]],
                "step": lr.get_column("step").to_numpy()[rows],
                "tag": lr.get_column("tag").gather(rows),
                "a": value[last[again - 1]],
                "b": value[first[again]],
            }
        )
        .filter(pl.col("a").is_not_nan() & pl.col("b").is_not_nan())
        .sort("segment", "step", "tag")
    )
    out: dict[int, _LrOff] = {}
    for (k,), part in both.partition_by("segment", as_dict=True).items():
        a, b = part.get_column("a").to_numpy(), part.get_column("b").to_numpy()
        ok = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
        if not ok.any():
            continue
        steps = part.get_column("step").to_numpy()[ok]
        a, b = a[ok], b[ok]
        ratio = np.maximum(a / b, b / a)
        off = np.flatnonzero(ratio > LR_MATCH)
        if not len(off):
            continue
        i = int(off[0])
        r = b / a
        reshaped = bool(r.max() / r.min() > LR_SHAPE)
        out[int(k)] = _LrOff(int(steps[i]), float(a[i]), float(b[i]), float(ratio.max()), reshaped)
    return out


def _points_replayed(blocks: pl.DataFrame) -> dict[int, int]:
    """For each segment ``k``: the rows of earlier segments at steps at or after ``k``'s first
    step of the same tag, the points ``k`` takes the place of (``blocks``: per tag and
    segment, sorted by both, the first and last step and the sorted steps).

    Per tag, only the earlier segments that reach that first step are searched (most end
    before it): for each such pair, a search in the earlier segment's sorted steps."""
    out: dict[int, int] = {}
    for part in blocks.partition_by("tag"):
        seg = part.get_column("segment").to_numpy()
        lo, hi = part.get_column("lo").to_numpy(), part.get_column("hi").to_numpy()
        # (earlier segment i reaches later segment j's first step: hi[i] >= lo[j], i < j)
        i, j = np.nonzero(np.triu(hi[:, None] >= lo[None, :], 1))
        if not len(i):
            continue
        steps = part.get_column("steps")
        for a, b in zip(i.tolist(), j.tolist(), strict=True):
            s = steps[a].to_numpy()
            k = int(seg[b])
            out[k] = out.get(k, 0) + len(s) - int(np.searchsorted(s, lo[b]))
    return out


def _points_repeated(f: pl.DataFrame) -> dict[int, int]:
    """For each segment ``k``: the rows of earlier segments (``f``: the rows with a step) at a
    (tag, step) that ``k`` logs again."""
    _, key, seg = _by_key(f)
    if not len(key):
        return {}
    # For each (tag, step, segment) group: the rows of its (tag, step) before it, the earlier
    # segments' (a grouping and a window expression over 5M rows took 2.3 s)
    new_key, new_group = _starts(key, seg)
    at = np.arange(len(key))
    key_start = np.maximum.accumulate(np.where(new_key, at, 0))
    before = (at - key_start)[new_group]
    sums = np.bincount(seg[new_group], weights=before)
    return {k: int(v) for k, v in enumerate(sums.tolist()) if v}


def _by_key(f: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of ``f`` (each with a step) ordered by tag, step and segment, ties in row
    order: that order, and each row's (tag, step) key and segment in it. The three are one
    64-bit number where they fit (one sort), else sorted as three keys."""
    tags = f.get_column("tag")
    if tags.dtype not in (pl.Categorical, pl.Enum):  # (codes to sort by: any will do)
        tags = tags.cast(pl.Categorical)
    tag = tags.to_physical().to_numpy().astype(np.int64)
    step = f.get_column("step").to_numpy().astype(np.int64)
    seg = f.get_column("segment").to_numpy().astype(np.int64)
    if not len(step):
        return step, step, seg
    lo = int(step.min())
    span, n_seg = int(step.max()) - lo + 1, int(seg.max()) + 1
    if (int(tag.max()) + 1) * span * n_seg < 1 << 62:
        key = tag * span + (step - lo)
        order = np.argsort(key * n_seg + seg, kind="stable")
    else:
        order = np.lexsort((seg, step, tag))
        key = np.unique(np.stack([tag, step]), axis=1, return_inverse=True)[1].ravel()
    return order, key[order], seg[order]


def _starts(key: np.ndarray, seg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where a new (tag, step) begins, and where a new (tag, step, segment) begins, in rows
    ordered by :func:`_by_key`."""
    new_key = np.ones(len(key), dtype=bool)
    new_key[1:] = key[1:] != key[:-1]
    new_group = new_key.copy()
    new_group[1:] |= seg[1:] != seg[:-1]
    return new_key, new_group


LR_MATCH = 1.1  # the LR at one step in two attempts: within 10% is the same (rounded prints)
LR_SHAPE = 1.05  # their ratio over the common steps: within 5% is one factor


def _is_lr(tag: str) -> bool:
    return canonicalize(str(tag))[0] == LR


def _lr_off_text(off: _LrOff) -> str:
    if not off.reshaped:
        factor = off.after / off.before
        return (
            f" The resumed job runs the LR at {factor:.2g}x the earlier attempt's at the same "
            f"steps ({off.before:.4g} -> {off.after:.4g} at step {off.step:,}): a changed LR, "
            "the same schedule."
        )
    return (
        f" At the steps logged in both, the LR follows another schedule: {off.before:.4g} at "
        f"step {off.step:,} before the restart, {off.after:.4g} after it (up to "
        f"{off.max_ratio:,.3g}x apart, by a factor that changes from step to step): the "
        "resumed job did not continue the LR schedule where it left off (a scheduler state "
        "not restored, or a changed schedule)."
    )


def _gap_text(gap: float | None) -> str:
    """The restart's wall-clock gap as a clause: how long after the last record before it
    the first new one was written; a clock that went back is said so (not "-3.0 min")."""
    if gap is None or math.isnan(gap):
        return ""
    if gap < 0:
        return f", its first record stamped {duration_text(-gap)} before the last record before it"
    return f", {duration_text(gap)} after the last record before it"


def duration_text(seconds: float) -> str:
    """A non-negative span of wall-clock time in words: "under a second", "45 s", "12 min",
    "3.5 h"."""
    if seconds < 1:
        return "under a second"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:,.1f} h"
