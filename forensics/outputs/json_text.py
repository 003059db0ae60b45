"""``json.dumps(doc, indent=2, allow_nan=False)``, the same text, several times faster.

With an indent, the standard library encodes in Python through a chain of generators (its C
encoder takes no indent before Python 3.14): a 1M-step run's findings document (about
4,800 grad-norm notes, 22 MB) took 2-4 s, as long as the whole analysis. Here the walk is
a recursive function that appends each item (separator, key and value) as one piece, the
common value types written without a further call and each key's text kept once made;
strings are escaped by the standard library's C function and numbers are written by their
own ``repr``, as the standard encoder writes them (0.27-0.29 s for that document).
Anything else (a key that is not a string, a type the standard encoder does not know, a
circular reference) goes to the standard encoder, so its text and its errors stay the
reference. ``tests/test_json_text.py`` compares both on real documents and on edge cases.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import repeat
from json.encoder import encode_basestring_ascii
from typing import Any, TextIO

_INDENT = "  "


class _Fallback(Exception):
    """Something the fast path does not write: the standard encoder takes the document."""


def dumps_indented(doc: Any) -> str:
    """``json.dumps(doc, indent=2, allow_nan=False)``."""
    parts: list[str] = []
    _encode(doc, parts.append)
    return "".join(parts)


def write_indented(doc: Any, out: TextIO) -> None:
    """``json.dump(doc, out, indent=2, allow_nan=False)``: the text written in parts of about
    100 kB as they are made, so the whole text (22 MB for a 1M-step run) is never held; it
    was the command's peak memory, on top of the analysis. As ``json.dump``, a document that
    cannot be encoded raises its error after the text before the offending value was
    written (a findings document always can: ``tests/test_json_text.py``)."""
    _encode(doc, out.write)


def _encode(doc: Any, sink: Callable[[str], object]) -> None:
    """The document's text to ``sink`` in consecutive parts. Where the walk meets something it
    leaves to the standard encoder, the standard encoder's text takes over from the end of
    the parts already given: the walk's text is the same as the standard's, so what was
    given is a prefix of it."""
    pieces = _Pieces(sink)
    try:
        _write(doc, 0, pieces, set())
    except (_Fallback, RecursionError):
        skip = pieces.written
        pieces.clear()  # (made but not given: the standard encoder makes them again)
        for chunk in json.JSONEncoder(indent=2, allow_nan=False).iterencode(doc):
            if skip:
                if len(chunk) <= skip:
                    skip -= len(chunk)
                    continue
                chunk, skip = chunk[skip:], 0
            pieces.append(chunk)
            pieces.flush()
    pieces.done()


class _Pieces(list[str]):
    """The text's pieces, joined and given to ``sink`` every few thousand: a list of every
    piece of a 22 MB document would hold about two million small strings (over 100 MB) at
    once. ``written``: the characters given so far."""

    _EVERY = 1 << 14

    def __init__(self, sink: Callable[[str], object]) -> None:
        super().__init__()
        self.sink = sink
        self.written = 0

    def flush(self) -> None:
        if len(self) >= self._EVERY:
            self.done()

    def done(self) -> None:
        text = "".join(self)
        self.clear()
        if text:
            self.sink(text)
            self.written += len(text)


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
    else:
        _container(o, level, out, seen)


def _container(o: Any, level: int, out: _Pieces, seen: set[int]) -> None:
    """A dict, list or tuple's text (``o`` is one of them)."""
    is_dict = type(o) is dict
    if not o:
        out.append("{}" if is_dict else "[]")
        return
    key = id(o)
    if key in seen:
        raise _Fallback  # circular: the standard encoder's error
    seen.add(key)
    inner = _INNER[level + 1] if level + 1 < len(_INNER) else "\n" + _INDENT * (level + 1)
    sep = "," + inner
    append = out.append
    # Each item's text in one piece (separator, key, value), the common values written here
    # without a call: a findings document holds about 480,000 of them in 96,000 containers.
    lead = ("{" if is_dict else "[") + inner
    for k, v in o.items() if is_dict else zip(repeat(None), o):
        if is_dict:
            head = _KEYS.get(k) if type(k) is str else None
            lead += _key_text(k) if head is None else head
        t = type(v)
        if t is str:
            append(lead + encode_basestring_ascii(v))
        elif t is float:
            if v != v or v == _INF or v == -_INF:
                raise _Fallback  # (the standard encoder raises its own ValueError)
            append(lead + _float_repr(v))
        elif t is int:
            append(lead + _int_repr(v))
        elif v is None:
            append(lead + "null")
        elif v is True:
            append(lead + "true")
        elif v is False:
            append(lead + "false")
        elif t is dict or t is list:
            append(lead)
            _container(v, level + 1, out, seen)
        else:
            append(lead)
            _write(v, level + 1, out, seen)
        lead = sep
    append(
        (_INNER[level] if level < len(_INNER) else "\n" + _INDENT * level)
        + ("}" if is_dict else "]")
    )
    seen.discard(key)
    if level <= 2:  # (a finding, or a part of one: often enough to bound the pieces)
        out.flush()


_INF = float("inf")
_INNER = tuple("\n" + _INDENT * i for i in range(32))  # a line break and each level's indent


_KEYS: dict[str, str] = {}  # a key's text with its separator, for the keys seen (a findings
# document repeats a few hundred keys thousands of times)
_MAX_KEYS = 1 << 12


def _key_text(k: Any) -> str:
    if not isinstance(k, str):
        raise _Fallback  # (keys of other types are converted by the standard rules)
    text = encode_basestring_ascii(k) + ": "
    if type(k) is str and len(_KEYS) < _MAX_KEYS:
        _KEYS[k] = text
    return text
