"""One item made ahead by a thread: a reader's next block read (and scanned, parsed) while the
caller works on this one. The file reads, numpy's passes and polars' work release the GIL, so
the two overlap on a second core."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")
_NAME = "forensics-ahead"


def one_ahead(items: Iterator[T]) -> Iterator[T]:
    """The items of ``items``, each next one made (``next(items)``) by a thread while the
    caller works on the one before: one item is held ahead, no more. An exception the
    iterator raises is raised in the caller's thread; a caller that stops early (``close``,
    an exception) lets the thread end."""
    out: queue.SimpleQueue[tuple[T] | BaseException | None] = queue.SimpleQueue()
    turn = threading.Semaphore(1)  # the thread makes an item once the caller took the last
    stop = threading.Event()

    def work() -> None:
        try:
            while True:
                while not turn.acquire(timeout=0.1):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                for item in items:
                    out.put((item,))
                    del item
                    break
                else:
                    break
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            out.put(exc)
            return
        out.put(None)

    thread = threading.Thread(target=work, name=_NAME, daemon=True)
    thread.start()
    try:
        while (got := out.get()) is not None:
            if isinstance(got, BaseException):
                raise got
            turn.release()
            yield got[0]
            del got
    finally:
        stop.set()
        thread.join()
