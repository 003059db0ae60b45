"""What every importer shares: the Source a format claims, the result it returns, file I/O."""

from __future__ import annotations

import gzip
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, cast

import polars as pl

from forensics.findings import Finding


@dataclass
class Source:
    """Files one importer will read for one job.

    ``job`` names the training job the files belong to (a path relative to the folder the
    user gave, ``"."`` for the folder itself). ``scope`` is ``"folder"`` when the job is a
    whole folder (TensorBoard dir, HF output dir, W&B run dir) and ``"file"`` when a single
    log file is the job (a SLURM stdout log): file jobs inside a folder job's folder belong
    to that folder job.
    """

    importer: str
    files: list[Path]
    job: str
    root: Path
    scope: str = "folder"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ImportResult:
    """What an importer returns for one Source."""

    frame: pl.DataFrame  # canonical columns; metric/layer may be left null (filled centrally)
    notes: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class ReadOptions:
    verify_crc: bool = False
    aliases: dict[str, str] = field(default_factory=dict)
    batch_size: int | None = None  # samples per optimizer step, to convert sample-indexed x axes
    cache: bool = True  # read an unchanged run back from the user cache (forensics.cache)
    stitch: bool = True  # read a folder's resume chains as one run (forensics.importers.chains)
    # A reader may hand over its rows series after series (the analysis view's order: no move
    # of every row when the view is built) instead of as read; export asks for the order read
    # (the Parquet file of a JSONL log in line order is half the size, and written faster).
    series_order: bool = True


class Importer(Protocol):
    NAME: str

    def discover(self, root: Path, files: list[Path]) -> list[Source]:
        """Claim files (among those not yet claimed) that this format reads."""
        ...

    def read(self, source: Source, options: ReadOptions) -> ImportResult: ...


COMPRESSED = (".gz", ".zst")


def open_bytes(path: Path) -> IO[bytes]:
    """Open a file for binary reading, decompressing .gz and .zst transparently."""
    if path.name.endswith(".gz"):
        return cast(IO[bytes], gzip.open(path, "rb"))
    if path.name.endswith(".zst"):
        import zstandard

        raw = path.open("rb")
        return zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
    return path.open("rb")


def read_bytes(path: Path, *, raw: bool = False) -> bytes:
    """The whole file, decompressed, as UTF-8 text bytes (see :func:`text_bytes`; ``raw``
    skips that). Bad .gz/.zst data is an UnreadableInputError (one line); OS errors
    (permission, I/O) propagate for read_job to name the file."""
    data = _read_bytes(path)
    return data if raw else text_bytes(data)


def _read_bytes(path: Path) -> bytes:
    if path.name.endswith(".gz"):
        return _gunzip(path)
    chunks: list[bytes] = []
    try:
        with open_bytes(path) as fh:
            while chunk := fh.read(1 << 16):  # small reads: a cut stream keeps what came before
                chunks.append(chunk)
        return b"".join(chunks)
    except EOFError:
        # A compressed log cut short (a killed job): what was decompressed is still evidence;
        # the importer sees a last line cut mid-record.
        return b"".join(chunks)
    except Exception as exc:  # noqa: BLE001 - gzip and zstandard raise their own types
        if isinstance(exc, OSError) and exc.errno is not None:
            raise
        from forensics.errors import UnreadableInputError

        raise UnreadableInputError(
            f"{path}: cannot be decompressed ({exc or type(exc).__name__})"
        ) from None


def _gunzip(path: Path) -> bytes:
    """Decompress a .gz file with zlib directly: a stream cut short (a killed job) yields what
    it holds instead of nothing, and several gzip members follow one another."""
    import zlib

    raw = path.read_bytes()
    out: list[bytes] = []
    try:
        while raw:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out.append(d.decompress(raw))
            if not d.eof:
                break  # truncated: keep what came out
            raw = d.unused_data
    except zlib.error as exc:
        if out:
            return b"".join(out)
        from forensics.errors import UnreadableInputError

        raise UnreadableInputError(f"{path}: cannot be decompressed ({exc})") from None
    return b"".join(out)


def as_number(v: Any) -> float | None:
    """A logged value as a float: numbers, bools, and numeric strings ("1.2e-4", "nan", "1,234")."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        try:
            return float(v)
        except OverflowError:  # an int beyond float range
            return math.inf if v > 0 else -math.inf
    if isinstance(v, str):
        try:
            return float(v.strip().replace(",", ""))  # float() accepts "nan", "inf", "Infinity"
        except (ValueError, OverflowError):
            return None
    return None


def not_numbers_note(
    name: str,
    bad: dict[str, list[int]],
    where: str = "line",
    holders: str = "columns that hold numbers in other rows",
) -> str | None:
    """The note for values that are not numbers ("N/A", a list) in a metric that logs numbers
    elsewhere, left out of the run: ``name: left out 3 value(s) that are not numbers, of
    <holders> (train/loss at line 1,602; ...)``. ``bad``: each metric's line (or row) numbers,
    in the order the note names them (at most five metrics, five numbers each). None when
    there are none."""
    if not bad:
        return None
    parts = []
    for tag, at in list(bad.items())[:5]:
        shown = ", ".join(f"{r:,}" for r in at[:5]) + (" ..." if len(at) > 5 else "")
        parts.append(f"{tag} at {where}{'s' if len(at) > 1 else ''} {shown}")
    n = sum(len(v) for v in bad.values())
    return (
        f"{name}: left out {n:,} value(s) that are not numbers, of {holders} ({'; '.join(parts)})"
    )


def utf16_kind(head: bytes) -> str | None:
    """The UTF-16 flavour of a head: "utf-16" (BOM), "utf-16-le" / "utf-16-be" (no BOM: ASCII
    text with every other byte zero), or None."""
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return "utf-16"
    sample = head[:4096]
    if len(sample) < 8:
        return None
    even, odd = sample[0::2], sample[1::2]
    z_even, z_odd = even.count(0) / len(even), odd.count(0) / len(odd)
    if z_odd > 0.4 and z_even < 0.05:
        return "utf-16-le"
    if z_even > 0.4 and z_odd < 0.05:
        return "utf-16-be"
    return None


def text_bytes(data: bytes) -> bytes:
    """A text log as UTF-8 bytes: UTF-16 (with or without BOM) converted, a UTF-8 BOM
    dropped, NUL bytes removed (a NUL line or the zero-filled tail a crash leaves).
    Undecodable bytes (latin-1) stay; readers decode with replacement."""
    if not data:
        return data
    kind = utf16_kind(data)
    if kind is not None:
        if kind != "utf-16" and len(data) % 2:
            data = data[:-1]
        data = data.decode(kind, "replace").encode("utf-8", "replace")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if b"\x00" in data:
        data = data.replace(b"\x00", b"")
    return data


def read_text(path: Path) -> str:
    return read_bytes(path).decode("utf-8", errors="replace")


def split_lines(text: str) -> list[str]:
    """Lines split on newlines only: U+2028, U+2029 and U+0085 are legal inside JSON strings
    (orjson, ensure_ascii=False) and must not split a record as str.splitlines() does."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def read_head(path: Path, n: int = 65536, *, raw: bool = False) -> bytes:
    """The first ``n`` bytes (decompressed), for sniffing, as text bytes (:func:`text_bytes`;
    ``raw`` skips that). Empty on any error; what was read before the end of a cut-short
    compressed file."""
    got = _read_head(path, n)
    return got if raw else text_bytes(got)


def _read_head(path: Path, n: int) -> bytes:
    out = b""
    if path.name.endswith(".gz"):
        import zlib

        try:
            with path.open("rb") as fh:
                return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(fh.read(1 << 20), n)
        except Exception:  # noqa: BLE001 - sniffing must never raise
            return b""
    try:
        with open_bytes(path) as fh:
            while len(out) < n and (chunk := fh.read(min(n - len(out), 8192))):
                out += chunk
        return out
    except Exception:  # noqa: BLE001 - sniffing must never raise
        return out


def head_lines(path: Path, n_lines: int = 200) -> list[str]:
    text = read_head(path).decode("utf-8", errors="replace")
    lines = [ln for ln in split_lines(text) if ln.strip()]
    return lines[:n_lines]


def strip_suffixes(name: str) -> str:
    for suf in COMPRESSED:
        if name.endswith(suf):
            return name[: -len(suf)]
    return name


def rel(path: Path, root: Path) -> str:
    try:
        r = path.relative_to(root).as_posix()
    except ValueError:
        r = path.name
    return r or "."


def binary_junk(head: bytes) -> bool:
    """True when the head of a file looks like binary data rather than text.

    Text survives a few odd bytes: latin-1 characters, a NUL line or a zero-filled tail, UTF-16.
    Binary data is NULs scattered among control characters and invalid UTF-8."""
    if not head:
        return False
    if utf16_kind(head):
        return False
    sample = head[:4096]
    stripped = sample.replace(b"\x00", b"")
    if not stripped.strip():
        return b"\x00" in sample  # nothing but NULs
    text = stripped.decode("utf-8", "replace")
    if len(stripped) == len(sample) and "\ufffd" in text[-2:]:
        text = text[:-2]  # a multi-byte character cut at the end of the window
    bad = sum(
        1 for c in text if c == "\ufffd" or c == "\x7f" or (c < " " and c not in "\t\n\r\x0c\x1b")
    )
    return bad > max(2, len(text) // 20)


def rows_frame(
    columns: dict[str, list[Any]],
    *,
    source: str,
    file: str,
    file_idx: int = 0,
    x_kind: str | None = "step",
) -> pl.DataFrame:
    """An importer's rows (``step``, ``tag``, ``value`` and any other canonical columns, as
    lists) typed as the canonical frame and labelled with where they come from."""
    from forensics.schema import SCHEMA

    labels = [
        pl.lit(source).alias("source"),
        pl.lit(file).alias("file"),
        pl.lit(file_idx).alias("file_idx"),
    ]
    if x_kind is not None:
        labels.append(pl.lit(x_kind).alias("x_kind"))
    frame = pl.DataFrame(columns, schema={k: SCHEMA[k] for k in columns})
    return frame.with_columns(labels)


def convert_x_axis(frame: pl.DataFrame, batch_size: int | None) -> tuple[pl.DataFrame, list[str]]:
    """Steps are optimizer steps. Rows indexed by consumed samples become steps when the batch
    size is known; otherwise (and for token-indexed rows) the run notes say so.

    Returns the frame and the notes to add to the run.
    """
    notes: list[str] = []
    if frame.is_empty() or "x_kind" not in frame.columns:
        return frame, notes
    odd = frame.filter(pl.col("x_kind").is_in(["samples", "tokens"]))
    if odd.is_empty():
        return frame, notes
    for kind, grp in odd.group_by("x_kind", maintain_order=True):
        tags = sorted(grp.get_column("tag").unique().to_list())
        shown = ", ".join(tags[:5]) + (f" and {len(tags) - 5} more" if len(tags) > 5 else "")
        if kind[0] == "samples" and batch_size:
            notes.append(
                f"{shown}: logged against consumed samples; converted to steps with batch size "
                f"{batch_size}"
            )
        else:
            why = (
                "set batch_size to convert them"
                if kind[0] == "samples"
                else "tokens per step are unknown"
            )
            notes.append(
                f"{shown}: logged against consumed {kind[0]}, not optimizer steps ({why}); "
                "windows on these series count logged points"
            )
    if batch_size:
        frame = frame.with_columns(
            pl.when(pl.col("x_kind") == "samples")
            .then(pl.col("step") // batch_size)
            .otherwise(pl.col("step"))
            .alias("step"),
            pl.when(pl.col("x_kind") == "samples")
            .then(pl.lit("step"))
            .otherwise(pl.col("x_kind"))
            .alias("x_kind"),
        )
    return frame, notes
