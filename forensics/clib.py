"""The process's C library, for the few calls made through ``ctypes`` (Linux only).

:mod:`forensics.allocator` gives freed heap pages back with glibc's ``malloc_trim``;
:mod:`forensics.importers.text.search` searches big mapped logs with ``memmem`` and
``memchr``. Each asks for its functions here, with their prototypes.
"""

from __future__ import annotations

import sys
from typing import Any

_lib: Any = None  # the library, once looked up; False where there is none


def c_library(prototypes: dict[str, tuple[Any, list[Any]]]) -> Any:
    """The C library the process runs on (``ctypes.CDLL(None)``) with the prototypes of
    ``prototypes`` set (function name -> (restype, argtypes)); False outside Linux, where
    ``ctypes`` cannot load it, or where one of the functions is missing (musl has no
    ``malloc_trim``)."""
    global _lib
    if _lib is None:
        _lib = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                _lib = ctypes.CDLL(None)
            except OSError:
                pass
    if _lib is False:
        return False
    try:
        for name, (restype, argtypes) in prototypes.items():
            fn = getattr(_lib, name)
            fn.restype, fn.argtypes = restype, argtypes
    except AttributeError:
        return False
    return _lib
