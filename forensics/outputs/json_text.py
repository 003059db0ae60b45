"""``json.dumps(doc, indent=2, allow_nan=False)``, the same text, several times faster.

With an indent, the standard library encodes in Python through a chain of generators (its C
encoder takes no indent before Python 3.14): a 1M-step run's findings document (about
4,800 grad-norm notes, 22 MB) took 2-4 s, as long as the whole analysis. Here the walk is
one recursive function appending to a list, strings are escaped by the standard library's C
function and numbers are written by their own ``repr``, as the standard encoder writes them.
Anything else (a key that is not a string, a type the standard encoder does not know, a
circular reference) goes to the standard encoder, so its text and its errors stay the
reference. ``tests/test_json_text.py`` compares both on real documents and on edge cases.
"""

from __future__ import annotations

import io
import json
from itertools import repeat
from json.encoder import encode_basestring_ascii
from typing import Any, TextIO

_INDENT = "  "


class _Fallback(Exception):
    """Something the fast path does not write: the standard encoder takes the document."""


def dumps_indented(doc: Any) -> str:
    """``json.dumps(doc, indent=2, allow_nan=False)``."""
    return "".join(_parts(doc))


def write_indented(doc: Any, out: TextIO) -> None:
    """``out.write(json.dumps(doc, indent=2, allow_nan=False))`` in parts of about 100 kB:
    the whole text (22 MB for a 1M-step run) is never made as one string, nor copied by the
    writer. Nothing is written when the document cannot be encoded (its error is raised)."""
    for part in _parts(doc):
        out.write(part)


def _parts(doc: Any) -> list[str]:
    """The document's text in consecutive parts."""
    pieces = _Pieces()
    try:
        _write(doc, 0, pieces, set())
    except (_Fallback, RecursionError):
        del pieces
        # (streamed into a buffer: ``dumps`` would hold every piece in a list at once)
        buf = io.StringIO()
        for chunk in json.JSONEncoder(indent=2, allow_nan=False).iterencode(doc):
            buf.write(chunk)
        return [buf.getvalue()]
    return pieces.done()


class _Pieces(list[str]):
    """The text's pieces, joined into a part every few thousand: a list of every piece of a
    22 MB document would hold about two million small strings (over 100 MB) at once."""

    _EVERY = 1 << 14

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []

    def flush(self) -> None:
        if len(self) >= self._EVERY:
            self.parts.append("".join(self))
            self.clear()

    def done(self) -> list[str]:
        self.parts.append("".join(self))
        self.clear()
        return self.parts


_float_repr = float.__repr__
_int_repr = int.__repr__


def _scalar(o: Any) -> str | None:
    """The text of a scalar as the standard encoder writes it; None for a container."""
    t = type(o)
    if t is str:
        return encode_basestring_ascii(o)
    if o is None:
        return "null"
    if o is True:
        return "true"
    if o is False:
        return "false"
    if t is int:
        return _int_repr(o)
    if t is float:
        return _float_text(o)
    if t is dict or t is list or t is tuple:
        return None
    # Subclasses (a str-valued Enum such as a spike's classification, an IntEnum), in the
    # standard encoder's order: a string's characters, an integer's or a float's own repr.
    if isinstance(o, str):
        return encode_basestring_ascii(o)
    if isinstance(o, int):
        return _int_repr(o)
    if isinstance(o, float):
        return _float_text(o)
    raise _Fallback  # another type (or a container subclass): the standard encoder's rules


def _float_text(o: float) -> str:
    if o != o or o in (float("inf"), float("-inf")):
        raise _Fallback  # (the standard encoder raises its own ValueError)
    return _float_repr(o)


def _write(o: Any, level: int, out: _Pieces, seen: set[int]) -> None:
    s = _scalar(o)
    if s is not None:
        out.append(s)
        return
    is_dict = type(o) is dict
    if not o:
        out.append("{}" if is_dict else "[]")
        return
    key = id(o)
    if key in seen:
        raise _Fallback  # circular: the standard encoder's error
    seen.add(key)
    inner = "\n" + _INDENT * (level + 1)
    sep = "," + inner
    out.append(("{" if is_dict else "[") + inner)
    first = True
    for k, v in o.items() if is_dict else zip(repeat(None), o):
        if not first:
            out.append(sep)
        first = False
        if is_dict:
            if not isinstance(k, str):
                raise _Fallback  # (keys of other types are converted by the standard rules)
            out.append(encode_basestring_ascii(k))
            out.append(": ")
        vs = _scalar(v)
        if vs is not None:
            out.append(vs)
        else:
            _write(v, level + 1, out, seen)
    out.append("\n" + _INDENT * level + ("}" if is_dict else "]"))
    seen.discard(key)
    if level <= 2:  # (a finding, or a part of one: often enough to bound the pieces)
        out.flush()
