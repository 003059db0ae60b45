"""The command line: parse options, call the pipeline, print, map errors to exit codes.

Exit codes follow linters (ruff, mypy): 0 done, 1 the verdict reached --fail-on, 2 usage
errors and unreadable or unknown input (one line on stderr, no traceback).
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typer.core import TyperGroup

from forensics.cli_quick import (
    Failed,
    _config,
    _fallback_dirs,
    _inside,
    _place,
    _safe_name,
    _shown,
    export_command,
    guarded,
    quick_exit,
)
from forensics.errors import ForensicsError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from rich.console import Console

    from forensics.diagnosis import Diagnosis


class _Group(TyperGroup):
    """Maps the project's own errors to one stderr line and exit code 2, for every command."""

    def get_command(self, ctx, cmd_name):  # noqa: ANN001, ANN201
        command = super().get_command(ctx, cmd_name)
        _plain_arguments(command)
        _plain_coercion(command, ctx)
        return command

    def parse_args(self, ctx, args):  # noqa: ANN001, ANN201
        _plain_coercion(self, ctx)
        return super().parse_args(ctx, args)

    def main(self, *args, standalone_mode: bool = True, **kwargs):  # noqa: ANN002, ANN003, ANN201
        """Usage errors as one line (click's own format boxed by rich is 5-6 lines)."""
        try:
            from typer._click import exceptions as click  # typer >= 0.20 vendors click
        except ImportError:  # pragma: no cover - older typer
            from click import exceptions as click  # type: ignore[no-redef]

        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[misc]
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[misc]
        except click.NoArgsIsHelpError as exc:
            exc.show()  # the help text, as asked for by giving no argument
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            cmd = exc.ctx.command_path if exc.ctx is not None else "forensics"
            hint = f" (see {cmd} --help)" if exc.ctx is not None else ""
            _err(f"error: {_one_line(exc.format_message())}{hint}")
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            _err(f"error: {_one_line(exc.format_message())}")
            sys.exit(exc.exit_code)
        except typer.Abort:
            _err("aborted")
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx):  # noqa: ANN001, ANN201
        try:
            return guarded(lambda: super(_Group, self).invoke(ctx), _err, (typer.Exit, typer.Abort))
        except Failed:
            raise typer.Exit(code=2) from None


def _plain_arguments(command: object) -> None:
    """Arguments shown by their metavar alone: no ``<str>`` type label, no ``{PATH}`` braces."""
    from typer.core import TyperArgument

    for param in getattr(command, "params", ()):
        if isinstance(param, TyperArgument) and param.metavar:
            # Per instance: typer has no option for either (its own help shows both).
            vars(param)["display_type_rich"] = _no_type_label
            vars(param)["_usage_display_name"] = partial(str, param.metavar)


def _plain_coercion(command: object, ctx: object) -> None:
    """Plain ``bool``, ``str``, ``list[str]``, ``Path``, ``int`` and choice (Enum) parameters
    converted without pydantic.

    typer >= 0.22 converts every parameter through a pydantic TypeAdapter; importing pydantic
    costs about 0.1 s CPU, a quarter of a whole ``export`` of a 40 MB log. These types
    get the value typer's adapter gives (tests/test_cli_startup.py compares them); anything
    else, and any other typer, is left to typer."""
    try:
        from typer._coercion import RuntimeParam, build_runtime_param
        from typer._param_types import coerce_cli_choice, coerce_cli_path
    except ImportError:  # an older typer: click converts, no pydantic
        return
    import inspect

    # typer's private hook: used only while it has the shape this code was written against;
    # any other typer converts its own way (slower, same values).
    hook = getattr(RuntimeParam, "_coerce_value", None)
    if hook is None or list(inspect.signature(hook).parameters) != [
        "self",
        "value",
        "param",
        "ctx",
    ]:
        return

    class Plain(RuntimeParam):
        def _coerce_value(self, value, param, ctx):  # noqa: ANN001, ANN202
            if self.annotation is str and isinstance(value, str):
                return value
            if self.annotation is bool and isinstance(value, bool):
                return value
            if self.annotation == list[str] and isinstance(value, list | tuple):
                if all(isinstance(v, str) for v in value):
                    return list(value)
            info = self.parameter_info
            if self.annotation is Path and isinstance(value, str):
                return coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)
            if _is_enum(self.annotation) and isinstance(value, str):
                # typer's own choice check (its adapter calls it); a miss goes on to typer
                # for its error message
                with contextlib.suppress(ValueError):
                    return coerce_cli_choice(
                        value,
                        choices=tuple(self.annotation),
                        case_sensitive=info.case_sensitive,
                        ctx=ctx,
                    )
            if self.annotation is int and _plain_int(value, info):
                return int(value)
            return build_runtime_param(param.type_descriptor)._coerce_value(value, param, ctx)

    get_params = getattr(command, "get_params", None)
    for param in get_params(ctx) if get_params is not None else ():  # the help option too
        desc = getattr(param, "type_descriptor", None)
        if desc is None or getattr(param, "_runtime_param", True) is not None:
            continue
        info = getattr(desc, "parameter_info", None)
        if info is None or getattr(info, "parser", 1) is not None:
            continue
        if getattr(desc, "file_annotation", 1) is not None:
            continue
        if desc.annotation is Path and info.path_type is not None:
            continue
        plain = desc.annotation in (bool, str, Path, int) or desc.annotation == list[str]
        if plain or _is_enum(desc.annotation):
            param._runtime_param = Plain(parameter_info=info, annotation=desc.annotation)


def _is_enum(annotation: object) -> bool:
    from enum import Enum

    return isinstance(annotation, type) and issubclass(annotation, Enum)


def _plain_int(value: object, info: object) -> bool:
    """A whole number written plainly ("500"), or an int, within the option's bounds and not
    clamped: what typer's adapter returns as ``int(value)``. Any other form (a sign, spaces,
    leading zeros, underscores, out of bounds) is left to typer and its messages."""
    if isinstance(value, bool) or getattr(info, "clamp", False):
        return False
    if isinstance(value, str):
        if not re.fullmatch(r"0|[1-9][0-9]{0,17}", value):
            return False
    elif not isinstance(value, int):
        return False
    lo, hi = getattr(info, "min", None), getattr(info, "max", None)
    return (lo is None or int(value) >= lo) and (hi is None or int(value) <= hi)


def _no_type_label(ctx: object) -> None:
    return None


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


app = typer.Typer(
    cls=_Group,
    name="forensics",
    help="Offline forensics for training logs: the vital signs the loss hides.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: rich markup would eat "[default: ...]" as a tag and box the text at 80 columns.
    rich_markup_mode=None,
)


class OutputFormat(StrEnum):
    text = "text"
    json = "json"


class FailOn(StrEnum):
    warning = "warning"
    critical = "critical"
    fatal = "fatal"


class PlotlyJs(StrEnum):
    inline = "inline"
    cdn = "cdn"


def _err(msg: str) -> None:
    from forensics.terminal import safe

    typer.echo(f"forensics: {safe(msg)}", err=True)


def _version(value: bool) -> None:
    if value:
        from forensics import __version__

        typer.echo(f"forensics {__version__}")
        raise typer.Exit()


def _no_cache(value: bool) -> bool:
    """--no-cache: parse the logs again instead of reading the run cache (forensics.cache)."""
    if value:
        os.environ["FORENSICS_NO_CACHE"] = "1"
    return value


def _no_stitch(value: bool) -> bool:
    """--no-stitch: a job that resumes another stays its own run (forensics.importers.chains)."""
    if value:
        os.environ["FORENSICS_NO_STITCH"] = "1"
    return value


# Options several commands share, declared once.
AliasOpt = Annotated[
    list[str],
    typer.Option(
        "--alias", metavar="RAW=CANONICAL", help="Map a raw tag to a vital sign (repeatable)."
    ),
]
IgnoreOpt = Annotated[
    list[str],
    typer.Option("--ignore", metavar="KIND", help="Drop a finding kind (repeatable)."),
]
NoCache = Annotated[
    bool,
    typer.Option(
        "--no-cache",
        callback=_no_cache,
        help="Parse the logs again; do not read or write the run cache in the user cache folder.",
    ),
]

NoStitch = Annotated[
    bool,
    typer.Option(
        "--no-stitch",
        callback=_no_stitch,
        help="Keep a folder's jobs apart even when one resumes another (a resume chain).",
    ),
]


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
    no_cache: NoCache = False,
) -> None:
    """Offline forensics for training logs: the vital signs the loss hides."""


# ---------------------------------------------------------------------------- helpers
def _cache_dir() -> Path:
    return _fallback_dirs()[0]


def _is_url(path: str) -> bool:
    from forensics.remote import is_url

    return is_url(path)


def _input(path: str | Path) -> Path:
    """A run path as given, or an s3:// / gs:// / fsspec URL fetched (see forensics.remote)."""
    from forensics.remote import local_path

    return local_path(path)


def _write(path: Path, text: str) -> None:
    """Write an output atomically: complete or absent, never written through a link."""
    from forensics.atomic import write_atomic

    write_atomic(path, text)


def _emit(
    diag: Diagnosis,
    *,
    out: Path | None,
    json_out: Path | None,
    fmt: OutputFormat,
    no_report: bool,
    plotlyjs: PlotlyJs,
    redact: bool,
    name: str,
    print_json: bool = True,
    read_notes: int = 0,
) -> dict | None:
    run_path = Path(diag.run.path)
    shown, scrub = diag, None
    # The findings document only where it is written or printed: on a long run it is tens
    # of thousands of dicts (about 20 MB at 1M steps) that the text summary never reads.
    doc: dict | None = None
    wanted = json_out is not None or fmt is OutputFormat.json
    if redact:
        # Hosts, users and home paths out of every string of the page and the document.
        from forensics.redact import redact_diagnosis, redact_document

        shown, scrub = redact_diagnosis(diag)
        if wanted:
            doc = redact_document(shown.to_document(), scrub)
    elif wanted:
        doc = diag.to_document()
    if json_out is not None:
        assert doc is not None
        jpath = _place(json_out, f"{name}.json", run_path)
        _write(jpath, _json_text(doc) + "\n")
        _err(f"findings written to {_shown(jpath)}")
    report_path: Path | None = None
    if not no_report:
        from forensics.report import render_html

        report_path = _place(out, f"{name}.html", run_path)
        html = render_html(shown, plotlyjs=plotlyjs.value, redact=redact)
        if scrub is not None:
            from forensics.redact import redact_page

            html = redact_page(html, scrub)
        _write(report_path, html)
        _err(f"report written to {_shown(report_path)}")
    if fmt is OutputFormat.json:
        assert doc is not None
        if print_json:
            _echo_json(doc)
    else:
        from forensics.summary import print_summary

        shown_path = _shown(report_path) if report_path is not None else None
        _to_stdout(
            lambda console: print_summary(
                shown, report_path=shown_path, console=console, read_notes=read_notes
            )
        )
    return doc


def _json_text(doc: object) -> str:
    """``json.dumps(doc, indent=2, allow_nan=False)``: the same text, faster (see
    :mod:`forensics.outputs.json_text`)."""
    from forensics.outputs.json_text import dumps_indented

    return dumps_indented(doc)


def _echo_json(doc: dict) -> None:
    """``typer.echo(_json_text(doc))`` without the whole text as one string (and echo's
    copies of it: 22 MB each for a 1M-step run). The text is ASCII with every control
    character escaped, so echo's removal of terminal colour codes would change nothing."""
    from forensics.outputs.json_text import write_indented

    out = sys.stdout
    write_indented(doc, out)
    out.write("\n")
    out.flush()


def _to_stdout(draw: Callable[[Console], None]) -> None:
    """Print rich output: on a terminal at its width; elsewhere (a pipe, a file, CI) with no
    wrapping at all, so a path or a sentence stays on one line for grep and for the reader."""
    from rich.console import Console

    if sys.stdout.isatty():
        draw(Console())
        return
    import io

    buf = io.StringIO()
    draw(Console(file=buf, width=100_000, soft_wrap=True, color_system=None))
    lines = (ln.rstrip() for ln in buf.getvalue().splitlines())
    sys.stdout.write("".join(ln + "\n" for ln in lines))
    sys.stdout.flush()


def _gate(verdicts: list[str], fail_on: str | None) -> None:
    from forensics.findings import look  # the one table of severity order

    if fail_on and any(look(v).rank >= look(fail_on).rank for v in verdicts):
        raise typer.Exit(code=1)


# ---------------------------------------------------------------------------- commands
@app.command(short_help="Find what the loss hides: a verdict and an HTML report.")
def analyze(
    path: Annotated[
        str,
        typer.Argument(
            metavar="PATH",
            help="A run folder, a single log file or an s3:// / gs:// URL; the format is detected.",
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            metavar="REPORT.html",
            help="HTML report path, or a folder for <run>.html [default: reports/<run>.html].",
        ),
    ] = None,
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json",
            metavar="FINDINGS.json",
            help="Also write the findings document (JSON) here (a folder: <run>.json in it).",
        ),
    ] = None,
    fmt: Annotated[
        OutputFormat,
        typer.Option("--format", metavar="[text|json]", help="What to print on stdout."),
    ] = OutputFormat.text,
    fail_on: Annotated[
        FailOn | None,
        typer.Option(
            "--fail-on",
            metavar="[warning|critical|fatal]",
            help="Exit 1 when the verdict is at or above this.",
        ),
    ] = None,
    ignore: IgnoreOpt = [],  # noqa: B006
    all_jobs: Annotated[
        bool,
        typer.Option("--all", help="PATH holds several jobs: analyze each into its own report."),
    ] = False,
    no_report: Annotated[
        bool, typer.Option("--no-report", help="Do not write the HTML report.")
    ] = False,
    plotlyjs: Annotated[
        PlotlyJs,
        typer.Option(
            "--plotlyjs",
            metavar="[inline|cdn]",
            help="Inline plotly.js (offline) or load it from a CDN (small file).",
        ),
    ] = PlotlyJs.inline,
    redact: Annotated[
        bool,
        typer.Option(
            "--redact", help="Leave paths, host names and config values out of the report."
        ),
    ] = False,
    checkpoint_every: Annotated[
        int | None,
        typer.Option(
            "--checkpoint-every",
            min=1,
            metavar="N",
            help=(
                "Checkpoint interval for rollback advice when the log does not say [default: 500]."
            ),
        ),
    ] = None,
    alias: Annotated[
        list[str],
        typer.Option(
            "--alias",
            metavar="RAW=CANONICAL",
            help="Map a raw tag to a canonical vital sign (repeatable).",
        ),
    ] = [],  # noqa: B006
    verify_crc: Annotated[
        bool,
        typer.Option(
            "--verify-crc", help="Check TensorBoard record CRCs (needs the crc32c package)."
        ),
    ] = False,
    config_file: Annotated[
        Path | None,
        typer.Option("--config", metavar="FILE.toml", help="Read settings from this TOML file."),
    ] = None,
    sarif_out: Annotated[
        Path | None,
        typer.Option(
            "--sarif",
            metavar="FINDINGS.sarif",
            help="Also write the findings as SARIF 2.1.0 (code scanning; a folder: "
            "forensics.sarif in it).",
        ),
    ] = None,
    junit_out: Annotated[
        Path | None,
        typer.Option(
            "--junit",
            metavar="VITALS.xml",
            help="Also write JUnit XML: a test case per vital sign, failed at --fail-on (a "
            "folder: forensics-junit.xml in it).",
        ),
    ] = None,
    no_cache: NoCache = False,
    no_stitch: NoStitch = False,
) -> None:
    """Read a run's logs, find what the loss hides, print a verdict and write an HTML report."""
    from forensics.allocator import reusing_freed_pages
    from forensics.importers import discover_jobs, read_job
    from forensics.importers.chains import stitch_jobs
    from forensics.pipeline import analyze_run, no_vital_sign, read_options

    cfg = _config(config_file, alias, ignore, checkpoint_every)
    options = read_options(cfg, verify_crc)
    root = _input(path)
    jobs = stitch_jobs(root, discover_jobs(root), options)
    if len(jobs) > 1 and not all_jobs:
        from forensics.errors import MultipleJobsError
        from forensics.importers import jobs_in_one_file

        one = jobs_in_one_file(Path(root), jobs)
        raise MultipleJobsError(str(path), sorted(jobs), one_file=one)
    files = [(o, p) for o, p in (("--out", out), ("--json", json_out)) if p and not p.is_dir()]
    if all_jobs and len(jobs) > 1 and files:
        # (a name without a suffix that does not exist yet was most likely meant as a folder)
        unmade = [p for _, p in files if not p.exists() and not p.suffix]
        named = " and ".join(
            f"{o} ({p}) names " + ("a folder that does not exist" if p in unmade else "one file")
            for o, p in files
        )
        raise ForensicsError(
            f"{named}, but {len(jobs)} jobs were found: with --all each job's report and "
            "findings go to reports/<job>.html and .json, or to <job>.html and .json in the "
            "folders --out and --json name" + (" (create it first)" if unmade else "")
        )
    verdicts: list[str] = []
    docs: list[dict | None] = []
    gate = fail_on.value if fail_on else cfg.fail_on
    ci = _CiOutputs(sarif_out, junit_out, gate)
    multi = all_jobs and len(jobs) > 1
    for job, sources in sorted(jobs.items()):
        run = read_job(root, job, sources, options=options, only_job=len(jobs) == 1)
        blind = no_vital_sign(run, path if not multi else f"{path.rstrip('/')}/{job}")
        if blind is not None:
            # Nothing the checks read: a green light would judge nothing.
            if not multi:
                raise ForensicsError(f"{path}: {blind}")
            _err(f"{job}: skipped: {blind}")
            continue
        read_notes = len(run.notes)  # what reading the logs noted (a skipped line, a copy unused)
        if _is_url(path):
            run.metadata["url"] = path if job == "." else f"{path.rstrip('/')}/{job}"
        elif len(jobs) == 1:
            from forensics import resumed_beside

            beside = resumed_beside.hint(root, run, options)
            if beside is not None:  # (the report's notes, and said here before the summary)
                run.note(beside)
                _err(beside)
        with reusing_freed_pages(run.frame.height):  # (a long run's: see forensics.allocator)
            diag = analyze_run(run, cfg)
        ci.add(diag)
        name = _safe_name(job if multi and job != "." else run.name)
        jout = json_out
        if multi:
            # Each job's findings beside its report: in the folder --out names when --json
            # names none (before, they went to reports/ under the current folder). With
            # --no-report and no --json, no file at all: --all --no-report had written every
            # job's findings into reports/ under the current folder.
            report_dir = out if json_out is None and out is not None and out.is_dir() else None
            if json_out is None and no_report:
                jout = None
            else:
                jout = _place(json_out or report_dir, f"{name}.json", Path(run.path))
            _err(f"== {job}")
        docs.append(
            _emit(
                diag,
                out=out,
                json_out=jout,
                fmt=fmt,
                no_report=no_report,
                plotlyjs=plotlyjs,
                redact=redact,
                name=name,
                print_json=not multi,
                read_notes=read_notes,
            )
        )
        verdicts.append(diag.verdict)
    if fmt is OutputFormat.json and len(docs) > 1:
        typer.echo(_json_text(docs))  # --all: one JSON array, a document per job
    ci.write()
    global _QUICK_EXIT
    _QUICK_EXIT = True  # every output is written: the run's frames and findings need no teardown
    _gate(verdicts, gate)


class _CiOutputs:
    """--sarif and --junit: one part per analysed job, one file for all (see forensics.outputs)."""

    def __init__(self, sarif: Path | None, junit: Path | None, fail_on: str | None) -> None:
        self.sarif, self.junit, self.fail_on = sarif, junit, fail_on
        self.runs: list[dict] = []
        self.suites: list = []
        self.paths: list[Path] = []

    def add(self, diag: Diagnosis) -> None:
        if self.sarif is not None:
            from forensics.outputs.sarif import sarif_run

            self.runs.append(sarif_run(diag))
        if self.junit is not None:
            from forensics.outputs.junit import junit_suite

            self.suites.append(junit_suite(diag, fail_on=self.fail_on))
        self.paths.append(Path(diag.run.path))

    def write(self) -> None:
        from forensics.outputs import atomic_write_text

        if self.sarif is not None:
            from forensics.outputs.sarif import sarif_text

            target = _place(self.sarif, "forensics.sarif", *self.paths)
            atomic_write_text(target, sarif_text(self.runs))
            _err(f"SARIF written to {_shown(target)}")
        if self.junit is not None:
            from forensics.outputs.junit import junit_text

            target = _place(self.junit, "forensics-junit.xml", *self.paths)
            atomic_write_text(target, junit_text(self.suites))
            _err(f"JUnit XML written to {_shown(target)}")


@app.command(short_help="List every raw tag with its canonical vital sign.")
def metrics(
    path: Annotated[
        str, typer.Argument(metavar="PATH", help="A run folder, a single log file or a URL.")
    ],
    alias: AliasOpt = [],  # noqa: B006
    no_stitch: NoStitch = False,
) -> None:
    """List every raw tag with its canonical vital sign, points and step range."""
    import polars as pl

    from forensics.pipeline import read_options, read_run
    from forensics.run_frame import metrics_table, unmapped_tags
    from forensics.schema import alias_line

    cfg = _config(None, alias, [], None)
    run = read_run(path, options=read_options(cfg))
    table = metrics_table(run)
    units = run.metadata.get("units", {})
    # Every unmapped tag: what it is, or the nearest vital sign and the --alias line that
    # would map it. Histogram statistics, module series, counters, clocks (offered as
    # step_time, a growing clock would read as ever slower steps) and values logged once get
    # no alias.
    said = {
        "histogram_stat": "(histogram statistic)",
        "not_vital": "(not a vital sign)",
        "clock": "(a clock or an epoch's time, not a step time)",
        "once": "(logged once)",
    }
    kinds = unmapped_tags(table)
    near = {t: c for t, (kind, c) in kinds.items() if kind == "near"}
    # A vital sign the run already reads from another tag is not offered again: that tag is
    # something else of the same name (HF's train_loss: the run's mean loss, one point).
    chosen = run.metrics()
    nearest = {t: c for t, c in near.items() if c is not None and c not in chosen}
    labels: dict[str, str] = {}
    for tag, (kind, c) in kinds.items():
        if kind == "module":
            labels[tag] = f"({c} of a module without a layer number: not read)"
        elif kind != "near":
            labels[tag] = said[kind]
        elif c is None:
            labels[tag] = "(none close)"
        else:
            labels[tag] = f"({c} is read from {chosen[c]})" if c in chosen else c
    table = table.with_columns(
        pl.col("tag").replace_strict(units, default=None, return_dtype=pl.Utf8).alias("unit"),
        pl.col("tag").replace_strict(labels, default=None, return_dtype=pl.Utf8).alias("nearest"),
        pl.col("tag")
        .replace_strict(
            {t: alias_line(t, c) for t, c in nearest.items()}, default=None, return_dtype=pl.Utf8
        )
        .alias("alias"),
    )
    from rich.table import Table

    from forensics.terminal import escape

    t = Table(title=f"{escape(run.name)} ({run.format})")
    for col in table.columns:
        t.add_column(col, overflow="fold")
    for row in table.iter_rows():  # tags are untrusted text: no markup, no control characters
        t.add_row(*["" if v is None else escape(v) for v in row])
    _to_stdout(lambda console: console.print(t))


@app.command(short_help="Write the run's canonical long frame (.parquet or .csv).")
def export(
    path: Annotated[
        str, typer.Argument(metavar="PATH", help="A run folder, a single log file or a URL.")
    ],
    to: Annotated[
        Path,
        typer.Option(
            "--to", metavar="FILE", help="Output file: .parquet or .csv (a folder: <run>.parquet)."
        ),
    ],
    alias: AliasOpt = [],  # noqa: B006
    no_cache: NoCache = False,
    no_stitch: NoStitch = False,
) -> None:
    """Write the run's canonical long frame (every row, restarts included) for a notebook."""
    export_command(path, to, alias, _err)
    global _QUICK_EXIT
    _QUICK_EXIT = True  # the export is written and closed: nothing is left for the teardown


@app.command(short_help="Put runs side by side.")
def compare(
    paths: Annotated[
        list[str],
        typer.Argument(
            metavar="RUN...",
            help="Two or more run folders, log files or URLs; the first is the reference.",
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            metavar="PAGE.html",
            help="HTML page, or a folder for it [default: reports/compare-<a>-vs-<b>.html].",
        ),
    ] = None,
    fmt: Annotated[
        OutputFormat,
        typer.Option("--format", metavar="[text|json]", help="What to print on stdout."),
    ] = OutputFormat.text,
    no_report: Annotated[
        bool, typer.Option("--no-report", help="Do not write the HTML page.")
    ] = False,
    plotlyjs: Annotated[
        PlotlyJs,
        typer.Option(
            "--plotlyjs",
            metavar="[inline|cdn]",
            help="Inline plotly.js (offline) or load it from a CDN.",
        ),
    ] = PlotlyJs.inline,
    ignore: IgnoreOpt = [],  # noqa: B006
    alias: AliasOpt = [],  # noqa: B006
    reference: Annotated[
        str | None,
        typer.Option(
            "--reference",
            metavar="RUN",
            help="The run the others are judged against (one of RUN...) [default: the first].",
        ),
    ] = None,
    align: Annotated[
        str,
        typer.Option(
            "--align",
            metavar="[step|tokens|samples|time]",
            help="Line the runs up by step, or by tokens, samples or wall time when logged.",
        ),
    ] = "step",
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json",
            metavar="FILE",
            help="Also write the JSON document to FILE (a folder: compare.json in it).",
        ),
    ] = None,
    no_cache: NoCache = False,
    no_stitch: NoStitch = False,
) -> None:
    """Put runs side by side: where they part, what findings they share, how configs differ."""
    from forensics.compare import compare as do_compare
    from forensics.compare import print_comparison
    from forensics.report.compare_page import render_compare_html

    if not paths:
        raise ForensicsError("compare needs at least two runs")
    # (one path may hold several runs, a W&B export of a panel: compare counts them)
    cfg = _config(None, alias, ignore, None)
    ref = 0
    if reference is not None:
        if reference in paths:
            ref = paths.index(reference)
        else:
            # The reference may be given again as a path (not among RUN...): add it first.
            paths = [reference, *paths]
    runs: list[str | os.PathLike[str]] = [_input(p) for p in paths]
    cmp = do_compare(runs, cfg, reference=ref, align=align)
    if json_out is not None:
        jtarget = _place(json_out, "compare.json", *[Path(d.run.path) for d in cmp.diagnoses])
        _write(jtarget, _json_text(cmp.to_document()))
        _err(f"comparison JSON written to {_shown(jtarget)}")
    if not no_report:
        name = _safe_name("compare-" + "-vs-".join(cmp.labels))[:120] + ".html"
        target = _place(out, name, *[Path(d.run.path) for d in cmp.diagnoses])
        _write(target, render_compare_html(cmp, plotlyjs=plotlyjs.value))
        _err(f"comparison written to {_shown(target)}")
    if fmt is OutputFormat.json:
        typer.echo(_json_text(cmp.to_document()))
    else:
        _to_stdout(lambda console: print_comparison(cmp, console))


@app.command()
def sweep(
    folder: Annotated[
        str, typer.Argument(metavar="DIR", help="A folder of runs (a sweep, a night of jobs).")
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            metavar="index.html",
            help="Index page, or a folder for index.html [default: "
            "reports/sweep-<DIR>/index.html]; the runs' reports go to a folder beside it.",
        ),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option("--jobs", "-j", metavar="N", min=1, help="Worker processes [default: cores]."),
    ] = None,
    scheduler: Annotated[
        str | None,
        typer.Option(
            "--scheduler",
            metavar="ADDRESS",
            help="Run the jobs on the Dask cluster of this scheduler (tcp://HOST:PORT; needs "
            "forensics[dask], and forensics on the workers). The workers read the runs by path: "
            "DIR must be at the same absolute path on every worker.",
        ),
    ] = None,
    fmt: Annotated[
        OutputFormat,
        typer.Option("--format", metavar="[text|json]", help="What to print on stdout."),
    ] = OutputFormat.text,
    plotlyjs: Annotated[
        PlotlyJs,
        typer.Option(
            "--plotlyjs",
            metavar="[inline|cdn]",
            help="Inline plotly.js in each report (offline) or load it from a CDN.",
        ),
    ] = PlotlyJs.inline,
    ignore: IgnoreOpt = [],  # noqa: B006
    alias: AliasOpt = [],  # noqa: B006
    no_stitch: NoStitch = False,
) -> None:
    """Analyze every run under a folder in parallel: an index page, worst run first."""
    from forensics.sweep import limited, render_sweep_html, to_document, top_text
    from forensics.sweep import sweep as do_sweep

    cfg = _config(None, alias, ignore, None)
    root = _input(folder)
    index = _place(out, f"sweep-{_safe_name(Path(root).resolve().name)}/index.html", root)
    reports = index.parent / f"{index.stem}-runs"
    _place(reports / "x.html", "x.html", root)  # refused inside the runs, like the index
    rows = do_sweep(
        root, reports, jobs=jobs, config=cfg, plotlyjs=plotlyjs.value, scheduler=scheduler
    )
    _write(index, render_sweep_html(str(folder), rows, reports.name))
    _err(f"sweep index written to {_shown(index)}")
    if fmt is OutputFormat.json:
        typer.echo(_json_text(to_document(str(folder), rows)))
        return
    for r in rows:
        top = r.get("error") or top_text(r["top_findings"])
        # (a key this run's config lacks is left out, as the index page shows "–" for it)
        pairs = [f"{k}={v}" for k, v in r.get("varying", {}).items() if v is not None]
        # A line a run: runs of different trainers differ in every key (a Megatron config
        # has a hundred); the index page has them all.
        if len(pairs) > _SWEEP_LINE_KEYS:
            more = len(pairs) - _SWEEP_LINE_KEYS + 1
            pairs = [*pairs[: _SWEEP_LINE_KEYS - 1], f"(+{more} more in the index)"]
        vary = " ".join(pairs)
        head = f"{r['verdict'].upper():9} {r['name']}{limited(r.get('unjudged'))}"
        typer.echo(f"{head}  {top or 'no findings'}  {vary}".rstrip())


_SWEEP_LINE_KEYS = 8  # config values on a sweep's terminal line, at most


class Until(StrEnum):
    critical = "critical"
    fatal = "fatal"


def _duration(text: str | None) -> float | None:
    from forensics.watch.options import parse_duration

    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _watch_state(requested: Path | None, root: Path) -> Path:
    """The state file: as given (never inside the run), else in the user cache folder."""
    from forensics.watch.options import state_name

    if requested is not None:
        return _outside_run(requested, root)
    evidence = root if not root.is_file() else root.parent
    for folder in _fallback_dirs():
        target = folder.parent / "watch" / state_name(root)
        if not _inside(target, evidence):
            return target
    raise ForensicsError("every place for the watch state lies inside the run; use --state")


def _outside_run(target: Path, root: Path) -> Path:
    """``target`` unless it lies inside the run (a run that does not exist yet is a folder)."""
    evidence = root if not root.is_file() else root.parent
    if _inside(target, evidence):
        raise ForensicsError(
            f"{target}: refusing to write inside the run folder {evidence} (it is evidence); "
            "choose another path"
        )
    return target


@app.command(short_help="Watch a running job: alerts, hooks and a live panel.")
def watch(
    path: Annotated[
        str,
        typer.Argument(
            metavar="PATH", help="A run folder or log file; it may not exist yet (waited for)."
        ),
    ],
    interval: Annotated[
        str, typer.Option("--interval", metavar="DURATION", help="Time between polls.")
    ] = "30s",
    on_warning: Annotated[
        str | None,
        typer.Option("--on-warning", metavar="CMD", help="Shell command run on a yellow alert."),
    ] = None,
    on_critical: Annotated[
        str | None,
        typer.Option("--on-critical", metavar="CMD", help="Shell command run on an orange alert."),
    ] = None,
    on_fatal: Annotated[
        str | None,
        typer.Option("--on-fatal", metavar="CMD", help="Shell command run on a red alert."),
    ] = None,
    webhook: Annotated[
        str | None,
        typer.Option("--webhook", metavar="URL", help="Post each alert here (Slack, Teams)."),
    ] = None,
    stall_after: Annotated[
        str | None,
        typer.Option(
            "--stall-after",
            metavar="DURATION",
            help="No new step for this long is a stall [default: 20x the usual step gap, "
            "at least 5 minutes].",
        ),
    ] = None,
    until: Annotated[
        Until | None,
        typer.Option(
            "--until",
            metavar="[critical|fatal]",
            help="Exit 1 (the --fail-on code) when the verdict reaches this.",
        ),
    ] = None,
    state: Annotated[
        Path | None,
        typer.Option(
            "--state",
            metavar="FILE",
            help="Alerts sent so far; a restarted watcher repeats none [default: in the user "
            "cache folder, per run path].",
        ),
    ] = None,
    prometheus: Annotated[
        str | None,
        typer.Option(
            "--prometheus",
            metavar="FILE|:PORT",
            help="Vital signs and lights for Prometheus: a textfile-collector file or a port.",
        ),
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print only the alerts, one line each.")
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            metavar="REPORT.html",
            help="HTML report (or a folder for <run>.html), rewritten on each alert [default: "
            "reports/<run>.html].",
        ),
    ] = None,
    ignore: IgnoreOpt = [],  # noqa: B006
    alias: AliasOpt = [],  # noqa: B006
    config_file: Annotated[
        Path | None,
        typer.Option("--config", metavar="FILE.toml", help="Read settings from this TOML file."),
    ] = None,
) -> None:
    """Watch a run while it trains: the same detectors as analyze on every poll, each finding
    alerted once (again when it escalates), hooks per level, a stall when the log stops."""
    import signal

    from forensics.findings import Severity
    from forensics.watch.engine import Watcher, WatchSettings
    from forensics.watch.panel import make_panel

    every = _duration(interval)
    assert every is not None
    cfg = _config(config_file, alias, ignore, None)
    root = Path(path)
    hooks = {
        level: cmd
        for level, cmd in (
            (Severity.WARNING, on_warning),
            (Severity.CRITICAL, on_critical),
            (Severity.FATAL, on_fatal),
        )
        if cmd
    }
    settings = WatchSettings(
        interval=every,
        stall_after=_duration(stall_after),
        until=Severity(until.value) if until else None,
        hooks=hooks,
        webhook=webhook,
    )
    if out is not None:
        _outside_run(out, root)  # refused now, not at the first alert
    sinks = [_prometheus(prometheus, root)] if prometheus else []
    watcher = Watcher(
        root,
        config=cfg,
        settings=settings,
        state_path=_watch_state(state, root),
        report_place=lambda run: _place(out, f"{_safe_name(run.name)}.html", Path(run.path)),
        panel=make_panel(str(path), quiet=quiet),
        sinks=sinks,
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: watcher.stop())
    raise typer.Exit(code=watcher.run())


def _prometheus(target: str, root: Path):  # noqa: ANN202
    """``FILE.prom`` (node_exporter's textfile collector; never inside the run) or ``:PORT``."""
    from forensics.watch.prometheus import open_prometheus

    if target.endswith(".prom"):
        _outside_run(Path(target), root)
    return open_prometheus(target)


# Set by a command once its output is written and closed: main() then skips the teardown.
_QUICK_EXIT = False


def main() -> None:
    """The typer app's entry point (the console script reaches it through
    :func:`forensics.cli_quick.entry`, which runs a plain export first)."""
    global _QUICK_EXIT
    _QUICK_EXIT = False  # (a command run earlier in this process through the app set it)
    command = sys.argv[1] if len(sys.argv) > 1 else None
    _return_freed_memory(command)
    _fewer_arenas(command)
    _collect_less(command)
    try:
        with _only_command(command):
            app()
    except SystemExit as exc:
        if _QUICK_EXIT and (exc.code is None or isinstance(exc.code, int)):
            quick_exit(exc.code or 0)
        raise


# polars' allocator (jemalloc, its options under this name) keeps freed pages resident for
# 0.5 s, then 1 s more, by polars' defaults (which polars puts first: later options win): a
# command's large temporaries (a frame reordered, a column gathered) then stay resident into
# the next stage and add up in the peak. Returned at once instead, the peak of `analyze` on a
# 1M-step JSONL run fell from 602 to 548 MB for about the same CPU time (more system time,
# less user time). Not for `export` and `metrics`, which detect nothing: there the pages
# given back and faulted in again cost about 0.5 s of system time at 1M steps and nothing is
# saved (their peak is the frame). Only the command line sets it, before polars loads, and a
# value the user set wins; a library caller's process is left as it is.
_POLARS_ALLOCATOR = ("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")
_DETECTING = frozenset({"analyze", "compare", "sweep", "watch"})


def _return_freed_memory(command: str | None) -> None:
    if command in _DETECTING and "polars" not in sys.modules:
        os.environ.setdefault(*_POLARS_ALLOCATOR)


def _fewer_arenas(command: str | None) -> None:
    """glibc held to two malloc arenas for the commands that detect (see
    :func:`forensics.allocator.limit_arenas`); a MALLOC_ARENA_MAX the user set wins."""
    if command in _DETECTING and "MALLOC_ARENA_MAX" not in os.environ:
        from forensics.allocator import limit_arenas

        limit_arenas(2)  # (the caller's thread and one more: in_parts' most)


def _collect_less(command: str | None) -> None:
    if command in _DETECTING:
        # Python's cyclic collector runs its youngest generation every 700 new objects: the
        # findings, causes and documents of a long run (thousands of each) set it off about
        # 500 times with 4 full passes, 0.3 s CPU of a 1M-step analysis. Every 50,000 it runs
        # a few times (0.05 s); the frames and arrays live outside its reach anyway.
        gc.set_threshold(50_000, 20, 100)


@contextlib.contextmanager
def _only_command(name: str | None) -> Iterator[None]:
    """While ``app()`` runs: only the command named ``name`` registered, when the first
    argument names one exactly (else every command, as typer has them).

    typer builds every registered command's parameters (type hints evaluated, signatures
    read) before it looks at the arguments: the five commands not asked for cost about
    10 ms CPU of every command line. The group stays a group (the root callback keeps it
    one), so the command's parsing, help, usage errors and exit codes are the same; an
    option or an unknown name before any command gets the whole group (help, suggestions)."""
    commands = app.registered_commands
    chosen = [
        c
        for c in commands
        if c.callback is not None
        and (c.name or c.callback.__name__.lower().replace("_", "-")) == name
    ]
    if len(chosen) != 1 or app.registered_callback is None:
        yield
        return
    app.registered_commands = chosen
    try:
        yield
    finally:
        app.registered_commands = commands
