"""`forensics sweep DIR --scheduler ADDRESS`: the sweep's jobs run on a Dask cluster.

The same function the local pool runs (:func:`forensics.sweep.analyze_job`) is shipped to the
workers by reference, so every worker needs forensics installed; the workers read the runs by
the absolute paths the client found them at. A run a worker cannot see, or that kills its
worker, is an error row in the index like any other broken run; a scheduler that cannot be
reached, has no workers, or whose workers cannot import forensics is a one-line error.

``distributed`` is imported here only, and only when ``--scheduler`` is given (the
``forensics[dask]`` extra). The connect timeout is Dask's own setting
(``distributed.comm.timeouts.connect``, env ``DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from forensics.errors import ForensicsError

if TYPE_CHECKING:
    from distributed import Client

# How long to wait for a worker to join a scheduler that has none yet.
WAIT_FOR_WORKERS_S = 10.0


def _check_address(address: str) -> None:
    """A malformed address as a one-line error, before a Client is built (a Client that fails on
    it leaves a traceback on stderr at exit)."""
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import get_backend

    try:
        scheme, loc = parse_address(address)
        get_backend(scheme)
        if scheme != "inproc":
            parse_host_port(loc)
    except ValueError as exc:
        raise ForensicsError(f"--scheduler {address}: {exc}") from None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Dask's own log lines (connection retries, closing comms) kept off stderr: it carries the
    project's one-line messages only."""
    loggers = [logging.getLogger(n) for n in ("distributed", "tornado", "asyncio")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


@contextlib.contextmanager
def connect(address: str) -> Iterator[Client]:
    """A client of the scheduler at ``address``, closed on exit; one-line errors for a missing
    ``distributed``, a bad address, a scheduler out of reach or without workers."""
    try:
        from distributed import Client
    except ImportError:
        raise ForensicsError(
            "--scheduler needs the Dask distributed client: pip install 'forensics[dask]'"
        ) from None
    _check_address(address)
    with _quiet():
        try:
            client = Client(address, set_as_default=False)
        except (OSError, TimeoutError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ForensicsError(f"cannot reach the Dask scheduler at {address}: {msg}") from None
        try:
            try:
                client.wait_for_workers(1, timeout=WAIT_FOR_WORKERS_S)
            except (TimeoutError, OSError):
                raise ForensicsError(
                    f"the Dask scheduler at {address} has no workers "
                    f"(none joined in {WAIT_FOR_WORKERS_S:g} s)"
                ) from None
            _check_workers(client, address)
            yield client
        finally:
            client.close()


def _worker_version() -> str:
    import forensics

    return forensics.__version__


def _check_workers(client: Client, address: str) -> None:
    """Every worker imports forensics (the jobs are shipped by reference); a version other than
    the client's is refused, as its findings would not be the ones this version reports."""
    import forensics

    try:
        versions: dict[str, str] = client.run(_worker_version)
    except ImportError as exc:
        raise ForensicsError(
            f"the Dask workers of {address} cannot import forensics ({exc}): "
            "install forensics on every worker"
        ) from None
    other = {w: v for w, v in versions.items() if v != forensics.__version__}
    if other:
        worker, version = sorted(other.items())[0]
        raise ForensicsError(
            f"the Dask worker {worker} runs forensics {version}, this is "
            f"{forensics.__version__}: install the same version on every worker"
        )


def analyze_on_cluster(address: str, tasks: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Run :func:`forensics.sweep.analyze_job` for each task on the cluster; the rows in task
    order. A run whose worker died (out of memory, killed) is an error row."""
    from forensics.sweep import analyze_job, error_row

    with connect(address) as client:
        from distributed import KilledWorker

        futures = [client.submit(analyze_job, *task, True, pure=False) for task in tasks]
        rows = []
        with _quiet():
            for task, future in zip(tasks, futures, strict=True):
                root, job = task[0], task[1]
                try:
                    rows.append(future.result())
                except KilledWorker:
                    rows.append(
                        error_row(root, job, "the Dask worker analysing it died (out of memory?)")
                    )
                except ImportError as exc:
                    raise ForensicsError(
                        f"a Dask worker of {address} cannot import forensics ({exc}): "
                        "install forensics on every worker"
                    ) from None
                except (OSError, TimeoutError) as exc:
                    raise ForensicsError(
                        f"lost the Dask scheduler at {address}: {str(exc).splitlines()[0]}"
                    ) from None
        return rows


__all__ = ["analyze_on_cluster", "connect"]
