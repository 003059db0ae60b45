"""The command line's pieces that need no typer, and ``export`` run without it.

``forensics export PATH --to FILE`` is the benchmark's import: typer's import and the building
of its command cost about 0.07 s, a tenth of exporting a 100k-step TensorBoard run. When the
arguments are of the plain forms below, :func:`quick_main` runs the export itself (before
``forensics.cli`` and typer are imported); anything else (help, an unknown or repeated
option, a missing value, ``--`` ...) goes to typer as before, so usage errors and help read
the same. The command's body, its error lines and exit codes are shared with the typer
command (:func:`export_command`, :func:`guarded`).
"""

from __future__ import annotations

import codecs
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from forensics.errors import ForensicsError

if TYPE_CHECKING:
    from collections.abc import Callable

    from forensics.config import Config

T = TypeVar("T")


class Failed(Exception):
    """The command failed and said why on stderr: exit code 2."""


def plain_err(msg: str) -> None:
    """A ``forensics: ...`` line on stderr, as ``typer.echo(..., err=True)`` writes it to a
    UTF-8 stream (:func:`safe` leaves no ANSI code for it to strip)."""
    from forensics.terminal import safe

    sys.stderr.write(f"forensics: {safe(msg)}\n")
    sys.stderr.flush()


def guarded(
    call: Callable[[], T],
    err: Callable[[str], None],
    passthrough: tuple[type[BaseException], ...] = (),
) -> T:
    """``call()`` under the command line's rules: numpy's warnings silenced (unless
    ``FORENSICS_DEBUG``), the project's errors, an unreadable or unwritable file and any
    other exception each one line through ``err``, then :class:`Failed`. ``passthrough``
    exceptions (typer's own exits) go on as they are."""
    import warnings

    debug = bool(os.environ.get("FORENSICS_DEBUG"))
    try:
        with warnings.catch_warnings():
            # stderr holds the project's own lines only: numpy's overflow warnings on
            # absurd values (1e308, signalling NaNs) are not news to the user.
            if not debug:
                warnings.simplefilter("ignore")
            return call()
    except ForensicsError as exc:
        err(f"error: {exc}")
        raise Failed from None
    except passthrough:
        raise
    except OSError as exc:
        if debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        err(f"error: {where}cannot be read or written ({exc.strerror or exc})")
        raise Failed from None
    except Exception as exc:
        if debug or type(exc).__module__.startswith(("click", "typer")):
            raise
        err(
            f"internal error: {type(exc).__name__}: {exc} (set FORENSICS_DEBUG=1 for the traceback)"
        )
        raise Failed from None


def export_command(path: str, to: Path, alias: list[str], err: Callable[[str], None]) -> None:
    """The body of ``forensics export``: read the run, write its canonical long frame."""
    from dataclasses import replace

    from forensics.pipeline import read_options, read_run
    from forensics.run_frame import export_run

    cfg = _config(None, alias, [], None)
    # (the rows as read: the analysis view's series order is no use to a file)
    run = read_run(path, options=replace(read_options(cfg), series_order=False))
    target = _place(to, f"{_safe_name(run.name)}{_EXPORT_SUFFIX}", Path(run.path))
    export_run(run, target)
    err(f"{run.frame.height:,} rows written to {_shown(target)}")


_EXPORT_SUFFIX = ".parquet"  # (an export into a folder: <run>.parquet there)


# --------------------------------------------------------------------- export without typer
_VALUED = ("--to", "--alias")
_FLAGS = ("--no-cache", "--no-stitch")


def parse_export(args: list[str]) -> tuple[str, str, list[str], list[str]] | None:
    """``export PATH --to FILE [--alias A]... [--no-cache] [--no-stitch]`` (options anywhere
    after the command, ``--opt=value`` too) -> (path, file, aliases, flags); None for any
    other form, which typer then parses (and explains when it is wrong)."""
    if not args or args[0] != "export":
        return None
    path: str | None = None
    to: str | None = None
    aliases: list[str] = []
    flags: list[str] = []
    rest = list(args[1:])
    while rest:
        token = rest.pop(0)
        if not token:
            return None
        if token.startswith("-"):
            name, eq, value = token.partition("=")
            if name in _FLAGS and not eq and name not in flags:
                flags.append(name)
                continue
            if name not in _VALUED:
                return None  # help, "--", an unknown option, a flag given a value
            if not eq:
                if not rest:
                    return None
                value = rest.pop(0)
            if not value or value.startswith("-"):
                return None
            if name == "--alias":
                aliases.append(value)
            elif to is None:
                to = value
            else:
                return None  # --to twice: typer's rule (the last wins) is left to typer
            continue
        if path is not None:
            return None  # a second argument: typer's usage error
        path = token
    if path is None or to is None:
        return None
    return path, to, aliases, flags


def _plain_context() -> bool:
    """Nothing typer would do differently before the command: no shell completion asked
    for, a UTF-8-able stderr (click rewraps an ASCII one), a POSIX shell's arguments."""
    if os.name != "posix" or sys.stderr is None:
        return False
    if any(k.endswith("_COMPLETE") for k in os.environ):
        return False
    try:
        return codecs.lookup(sys.stderr.encoding or "ascii").name != "ascii"
    except LookupError:
        return False


def quick_main(args: list[str]) -> bool:
    """Run ``forensics export`` without typer when ``args`` (``sys.argv[1:]``) are of the
    plain forms :func:`parse_export` takes; False (nothing done) otherwise. Exits the process
    when it ran: 0 once the file is written (without the interpreter's teardown, see
    :func:`quick_exit`), 2 after a one-line error, 130 on Ctrl-C, as the typer command."""
    parsed = parse_export(args)
    if parsed is None or not _plain_context():
        return False
    path, to, aliases, flags = parsed
    target = Path(to)
    # typer's Path check: an existing output path it cannot read is a usage error.
    if os.path.exists(target) and not os.access(target, os.R_OK):
        return False
    # What the options' callbacks do (forensics.cli._no_cache, _no_stitch).
    if "--no-cache" in flags:
        os.environ["FORENSICS_NO_CACHE"] = "1"
    if "--no-stitch" in flags:
        os.environ["FORENSICS_NO_STITCH"] = "1"
    try:
        guarded(lambda: export_command(path, target, aliases, plain_err), plain_err)
    except Failed:
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    quick_exit(0)
    return True  # pragma: no cover - quick_exit does not return


def entry() -> None:
    """Console-script and ``python -m forensics`` entry point: a plain export runs here, before
    ``forensics.cli`` (and typer with it) is imported; anything else goes to the typer app."""
    _numpy_with_one_blas_thread(sys.argv[1:])
    if not quick_main(sys.argv[1:]):
        from forensics.cli import main

        main()


_READING = frozenset({"analyze", "metrics", "export", "compare", "sweep", "watch"})
_BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _numpy_with_one_blas_thread(argv: list[str]) -> None:
    """Import numpy with OpenBLAS limited to one thread, for a command that reads runs (it
    imports numpy anyway). OpenBLAS starts a thread per core when numpy loads it, and
    forensics does no linear algebra worth a thread (a few straight-line fits of a few hundred
    points): starting them cost about 0.15 s CPU and 0.06 s of wall time in an export of a
    100k-step TensorBoard run (0.71 -> 0.55 s CPU, 0.56 -> 0.51 s wall). And without
    numpy's requests for huge pages (:data:`_HUGEPAGE`). The variables are removed again at
    once, so that nothing this process starts (a watch hook) inherits them; one the user set
    is left alone. Help goes on without numpy."""
    command = next((a for a in argv if not a.startswith("-")), None)  # (after --no-cache)
    if command not in _READING or "--help" in argv or "-h" in argv:
        return
    if "numpy" in sys.modules:
        return
    added = []
    if not any(v in os.environ for v in _BLAS_THREADS):
        added.append(("OPENBLAS_NUM_THREADS", "1"))
    if _HUGEPAGE not in os.environ:
        added.append((_HUGEPAGE, "0"))
    for k, v in added:
        os.environ[k] = v
    try:
        import numpy  # noqa: F401  (OpenBLAS and numpy read the variables as numpy loads)
    finally:
        for k, _ in added:
            del os.environ[k]


# numpy asks the kernel for transparent huge pages for every array of 4 MiB or more. Where
# the kernel compacts memory on request (THP "madvise", as on these machines), those
# requests cost system time: without them `analyze` of the 1M-step event files took 3.6%
# less wall time and 18% less system time (seven pairs, farm-bench), 5% at 10M steps, and
# `export` 3.5% less. A value the user set is theirs (numpy documents the variable).
_HUGEPAGE = "NUMPY_MADVISE_HUGEPAGE"


def quick_exit(code: int) -> None:
    """Exit without tearing the interpreter down: freeing polars', numpy's and every module's
    objects one by one costs about 0.09 s CPU, a sixth of a whole ``export`` of a 40 MB log.
    atexit handlers still run and the streams are flushed; no thread of ours is left."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


# ------------------------------------------------------------------------------ helpers
def _config(
    config_file: Path | None, aliases: list[str], ignore: list[str], checkpoint_every: int | None
) -> Config:
    from forensics.config import _check_kinds, load, parse_alias

    cfg = load(explicit=config_file)
    cfg.aliases.update(parse_alias(aliases))
    cfg.ignore |= _check_kinds(ignore, "--ignore")
    if checkpoint_every is not None:
        cfg.checkpoint_every = checkpoint_every
    return cfg


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.resolve().relative_to(parent.resolve())
        return True
    except ValueError:
        return False


def _fallback_dirs() -> list[Path]:
    """Where a report goes when reports/ under the current folder lies inside the run: the
    user cache folder, then a per-user folder under the system temporary folder (HOME or
    XDG_CACHE_HOME may themselves lie inside the run)."""
    out: list[Path] = []
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        out.append(Path(xdg) / "forensics" / "reports")
    try:
        out.append(Path.home() / ".cache" / "forensics" / "reports")
    except RuntimeError:  # no HOME and no passwd entry
        pass
    import tempfile

    uid = os.getuid() if hasattr(os, "getuid") else 0
    out.append(Path(tempfile.gettempdir()) / f"forensics-{uid}" / "reports")
    return out


def _place(requested: Path | None, default_name: str, *run_paths: Path) -> Path:
    """Where an output goes: never inside a run folder (it is evidence).

    The default place (reports/ under the current folder) falls back to the user cache
    folder, then to the temporary folder, when it lies inside a run; an explicit path there
    is refused. An explicit path that is an existing folder gets the default file name inside
    it (as ``cp`` does). Links are resolved before the check, so a symlinked reports/ folder
    cannot lead into the run either.
    """
    evidence = [p if p.is_dir() else p.parent for p in (Path(r) for r in run_paths)]

    def inside_run(target: Path) -> Path | None:
        return next((e for e in evidence if _inside(target, e)), None)

    if requested is not None and requested.is_dir():
        requested = requested / Path(default_name).name
    if requested is not None:
        where = inside_run(requested)
        if where is not None:
            raise ForensicsError(
                f"{requested}: refusing to write inside the run folder {where} "
                "(it is evidence); choose another path"
            )
        return requested
    for folder in [Path.cwd() / "reports", *_fallback_dirs()]:
        target = folder / default_name
        if inside_run(target) is None:
            return target
    raise ForensicsError(
        f"every place for {default_name} (reports/, the cache folder, the temporary folder) "
        "lies inside the run folder (it is evidence); choose a path with --out"
    )


def _safe_name(name: str) -> str:
    """A run or job name as a file name (no separators, no leading dot, at most 200 chars)."""
    import re

    return re.sub(r"[^\w.-]+", "_", name).strip("._")[:200] or "run"


def _shown(path: Path) -> Path:
    """A path as the user would write it: relative to the current folder when inside it (the
    default reports/ place), else as given."""
    if not path.is_absolute():
        return path
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path
