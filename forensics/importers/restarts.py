"""Restart detection shared by importers: a step going backwards within a series."""

from __future__ import annotations

import polars as pl

from forensics.findings import Finding, FindingKind, Severity


def assign_segments(frame: pl.DataFrame, order: list[str] | None = None) -> pl.DataFrame:
    """Number segments per job: +1 each time the step goes backwards in any series.

    A resumed job replays steps it had already logged, usually in a new file. We find,
    in record order, the points where a series' step drops below the previous step of the
    same series, and cut *all* series of the job there (the restart is a job-level event).
    """
    if frame.is_empty():
        return frame.with_columns(pl.lit(0, dtype=pl.Int32).alias("segment"))
    order = order or ["file_idx", "record_idx"]
    f = frame.with_row_index("_row").sort(order + ["_row"])
    prev = pl.col("step").shift(1).over("tag")
    f = f.with_columns((pl.col("step") < prev).fill_null(False).alias("_back"))
    # A restart's position is the record index of the first backwards row; later backwards
    # rows of other tags at the same replay belong to the same restart, so we collapse
    # backwards flags into record positions and count unique cut points (in order).
    cut = f.with_columns(pl.int_range(pl.len()).alias("_pos"))
    back_pos = cut.filter(pl.col("_back")).get_column("_pos").to_list()
    if not back_pos:
        return f.drop("_row", "_back").with_columns(pl.lit(0, dtype=pl.Int32).alias("segment"))
    # Merge cut points that are part of one replay: a cut is new only if some series had
    # moved forward past its replayed steps in between. Approximation: cuts closer than the
    # number of distinct tags are one restart.
    n_tags = f.get_column("tag").n_unique()
    cuts: list[int] = []
    for p in back_pos:
        if not cuts or p - cuts[-1] > n_tags:
            cuts.append(p)
    seg = cut.with_columns(
        pl.col("_pos").map_batches(
            lambda s: pl.Series([sum(1 for c in cuts if c <= x) for x in s.to_list()], dtype=pl.Int32)
        ).alias("segment")
    )
    return seg.drop("_row", "_back", "_pos")


def restart_findings(frame: pl.DataFrame) -> list[Finding]:
    """One ``restart`` info finding per segment boundary."""
    out: list[Finding] = []
    if frame.is_empty() or frame.get_column("segment").max() in (None, 0):
        return out
    segs = (
        frame.filter(pl.col("step").is_not_null())
        .group_by("segment")
        .agg(
            pl.col("step").min().alias("first"),
            pl.col("step").max().alias("last"),
            pl.col("wall_time").min().alias("t0"),
            pl.col("wall_time").max().alias("t1"),
        )
        .sort("segment")
    )
    rows = segs.to_dicts()
    for prev, cur in zip(rows, rows[1:]):
        replayed = max(0, int(prev["last"]) - int(cur["first"]) + 1)
        gap = None
        if prev["t1"] is not None and cur["t0"] is not None:
            gap = float(cur["t0"]) - float(prev["t1"])
        out.append(
            Finding(
                kind=FindingKind.RESTART,
                severity=Severity.INFO,
                metric=None,
                start_step=int(cur["first"]),
                end_step=int(prev["last"]),
                measures={
                    "resumed_from_step": int(cur["first"]),
                    "last_step_before": int(prev["last"]),
                    "steps_replayed": replayed,
                    "wall_clock_gap_s": gap,
                    "segment": int(cur["segment"]),
                },
                summary=(
                    f"The job restarted at step {int(cur['first'])} after reaching step "
                    f"{int(prev['last'])}: {replayed} steps were logged twice; the later values are used."
                ),
            )
        )
    return out
