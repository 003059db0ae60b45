"""PyTorch Lightning CSVLogger: ``<save_dir>/<name>/version_N/metrics.csv`` + ``hparams.yaml``.

The header is the union of every key ever logged; each row is one logging call, so most
cells are empty (``train_loss_step`` rows, ``val_loss`` rows, ``train_loss_epoch`` rows).
Every non-empty numeric cell except ``step`` becomes one row of the long frame; ``epoch`` is
kept as a series too. Each ``version_N`` folder is its own job: Lightning opens a new one at
every launch, a resumed run included, so a folder with several is refused with the list.
``hparams.yaml`` becomes ``run.config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from forensics.errors import UnreadableInputError
from forensics.importers.base import (
    ImportResult,
    ReadOptions,
    Source,
    head_lines,
    not_numbers_note,
    read_bytes,
    read_text,
    rel,
    strip_suffixes,
)
from forensics.importers.restarts import assign_segments, restart_findings
from forensics.schema import conform

NAME = "lightning_csv"


def _header(path: Path) -> list[str]:
    lines = head_lines(path, 1)
    return [c.strip() for c in lines[0].split(",")] if lines else []


def _load_yaml(path: Path) -> dict[str, Any]:
    import yaml

    class _Loose(yaml.SafeLoader):
        """Safe loading that turns python/object tags into plain values instead of failing."""

    def _any(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_scalar(node)

    _Loose.add_multi_constructor("", _any)
    try:
        data = yaml.load(read_text(path), Loader=_Loose)  # noqa: S506 - a SafeLoader subclass
    except (yaml.YAMLError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


class LightningCsvImporter:
    NAME = NAME

    def discover(self, root: Path, files: list[Path]) -> list[Source]:
        out: list[Source] = []
        present = set(files)  # membership per file: a list would make discovery quadratic
        for f in files:
            if strip_suffixes(f.name) != "metrics.csv":
                continue
            cols = _header(f)
            # "_step" marks a W&B history export saved under this name: not Lightning's.
            if ("step" not in cols and "epoch" not in cols) or "_step" in cols:
                continue
            hp = f.parent / "hparams.yaml"
            extra = [hp] if hp in present else []
            out.append(
                Source(
                    NAME,
                    [f],
                    rel(f.parent, root),
                    root,
                    options={"also_claims": extra, "hparams": hp if extra else None},
                )
            )
        return out

    def read(self, source: Source, options: ReadOptions) -> ImportResult:
        return self.read_raw(source, read_bytes(source.files[0]))

    def read_raw(self, source: Source, raw: bytes) -> ImportResult:
        """The source's file given as its (text) bytes: a tail passes the complete lines."""
        path = source.files[0]
        name = rel(path, source.root)
        notes: list[str] = []
        df: pl.DataFrame | None
        try:
            df = pl.read_csv(raw, infer_schema=False, truncate_ragged_lines=True)
        except pl.exceptions.PolarsError as exc:
            # A job killed mid-write leaves a last line cut short (even inside a quoted field):
            # read the file without it, and say so.
            head, _, last = raw.rstrip(b"\n").rpartition(b"\n")
            try:
                df = (
                    pl.read_csv(head + b"\n", infer_schema=False, truncate_ragged_lines=True)
                    if head
                    else None
                )
            except pl.exceptions.PolarsError:
                df = None
            if df is None:
                raise UnreadableInputError(
                    f"{path}: not a readable CSV ({str(exc).splitlines()[0]}); "
                    "expected Lightning metrics.csv"
                ) from None
            notes.append(f"{name}: the last line is cut short ({last[:60]!r}); it was skipped")
        step_col = "step" if "step" in df.columns else "epoch"
        if step_col == "epoch":
            notes.append(f"{name}: no step column; epochs are used as the x axis")
        df = df.with_row_index("record_idx", offset=2)  # CSV line number (line 1 is the header)
        values = [c for c in df.columns if c not in ("record_idx", step_col)]
        long = (
            df.with_columns(
                pl.col(step_col)
                .cast(pl.Float64, strict=False)
                .cast(pl.Int64, strict=False)
                .alias("_step")
            )
            .unpivot(
                index=["record_idx", "_step"], on=values, variable_name="tag", value_name="raw"
            )
            .with_columns(
                # cast first: a column with no cell at all comes out of the CSV reader typed Null
                pl.col("raw").cast(pl.Utf8).str.strip_chars().alias("raw")
            )
            .with_columns(pl.col("raw").cast(pl.Float64, strict=False).alias("value"))
        )
        unread = _unread(long, name)
        if unread:
            notes.append(unread)
        long = (
            long.filter(
                pl.col("value").is_not_null()
            )  # empty cells of a sparse row; "nan" parses as NaN
            .sort("record_idx", maintain_order=True)
            .select(
                pl.col("_step").alias("step"),
                "tag",
                "value",
                pl.col("record_idx").cast(pl.Int64),
            )
            .with_columns(
                pl.lit(NAME).alias("source"),
                pl.lit(name).alias("file"),
                pl.lit(0).alias("file_idx"),
                pl.lit("step" if step_col == "step" else "epoch").alias("x_kind"),
            )
        )
        frame = assign_segments(conform(long))
        config: dict[str, Any] = {}
        hp = source.options.get("hparams")
        if hp is not None:
            config = _load_yaml(Path(hp))
        meta = {"lightning_version": Path(source.job).name}
        return ImportResult(
            frame=conform(frame),
            notes=notes,
            findings=restart_findings(frame),
            config=config,
            metadata=meta,
        )


def _unread(long: pl.DataFrame, name: str) -> str | None:
    """The note for cells that are not numbers ("N/A") in a column with numbers in other
    rows: left out, counted with their lines (an empty cell is a value not logged; a column
    of text is no metric)."""
    bad = long.filter(
        pl.col("value").is_null()
        & (pl.col("raw").str.len_chars() > 0)
        & pl.col("value").is_not_null().any().over("tag")
    )
    if bad.is_empty():
        return None
    lines = bad.group_by("tag", maintain_order=True).agg(pl.col("record_idx")).rows()
    return not_numbers_note(name, {tag: [int(r) for r in at] for tag, at in lines})


IMPORTER = LightningCsvImporter()
