"""``json.dumps(doc, indent=2, allow_nan=False)``, the same text, several times faster.

With an indent, the standard library encodes in Python through a chain of generators (its C
encoder takes no indent before Python 3.14): a 1M-step run's findings document (about
4,800 grad-norm notes, 22 MB) took 2-4 s, as long as the whole analysis.

The document is written a part at a time: its top level and any long list are walked here,
and each part (a finding, an incident) is encoded by orjson with a two-space indent (0.07 s
for that document against 0.27 s for the walk in Python below). orjson's text is the standard
encoder's but for three things, the first two put right or avoided here: a float between 1e-5 and
1e-4 (orjson ``0.0000704``, Python ``7.04e-05``) or below 1e-5 with a one-digit exponent
(``1.2e-6`` against ``1.2e-06``) is written again by its ``repr`` (the same double: both
write the shortest text that reads back to it); a part with a non-ASCII character or DEL
(orjson writes them as they are, the standard encoder as ``\\uXXXX``) is walked in Python.
The third is kept: a NaN or an infinity is written as ``null``, where the standard encoder
raises (the text stays strict JSON; a findings document never holds one, as the tests check
against the standard encoder).

Anything orjson refuses (an integer beyond 64 bits, a key that is not a string, a numpy
scalar, a set, a circular reference) is walked in Python, by a recursive function that
appends each item (separator, key and value) as one piece, strings escaped by the standard
library's C function and numbers written by their own ``repr``, as the standard encoder
writes them. What the walk leaves in turn (a key that is not a string, a type the standard
encoder does not know, a circular reference) goes to the standard encoder, so its text and
its errors stay the reference. ``tests/test_json_text.py`` compares both on real documents
and on edge cases.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from itertools import repeat
from json.encoder import encode_basestring_ascii
from typing import Any, TextIO

import orjson

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
        _parts(doc, 0, pieces, set())
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

    def flush_text(self) -> None:
        """After a part of orjson's text (a few kB each): joined every few dozen."""
        if len(self) >= self._PARTS:
            self.done()

    _PARTS = 64

    def done(self) -> None:
        text = "".join(self)
        self.clear()
        if text:
            self.sink(text)
            self.written += len(text)


# orjson: an Enum by its value as the standard encoder writes it; a datetime, a dataclass or
# a subclass of str, int, dict or list left to the walk (its own text, or its error).
_ORJSON = (
    orjson.OPT_INDENT_2
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)
_LONG = 64  # a list or dict with more items than this is split into parts at any depth


def _parts(o: Any, level: int, out: _Pieces, seen: set[int]) -> None:
    """``o``'s text: its top level, the containers in it and any long container walked here,
    everything else encoded a part at a time (:func:`_part`)."""
    t = type(o)
    if (t is dict or t is list) and o and (level < 2 or len(o) > _LONG):
        is_dict = t is dict
        if is_dict and not all(type(k) is str for k in o):
            _container(o, level, out, seen)  # (the walk's key rules, or the standard's)
            return
        key = id(o)
        if key in seen:
            raise _Fallback  # circular: the standard encoder's error
        seen.add(key)
        inner = _line(level + 1)
        lead = ("{" if is_dict else "[") + inner
        for k, v in o.items() if is_dict else zip(repeat(None), o):
            out.append(lead + _key_text(k) if is_dict else lead)
            _parts(v, level + 1, out, seen)
            lead = "," + inner
        out.append(_line(level) + ("}" if is_dict else "]"))
        seen.discard(key)
        return
    text = _part(o)
    if text is None:
        _write(o, level, out, seen)
    else:
        if level and "\n" in text:
            text = text.replace("\n", _line(level))
        out.append(text)
    out.flush_text()


def _part(o: Any) -> str | None:
    """``o``'s text at level 0 by orjson, made the standard encoder's (see the module text);
    None when orjson refuses it or it holds a character the standard encoder escapes."""
    try:
        raw = orjson.dumps(o, option=_ORJSON)
    except TypeError:  # (orjson.JSONEncodeError)
        return None
    if not raw.isascii() or b"\x7f" in raw:
        return None
    text = raw.decode("ascii")
    if "e-" in text or "0.0000" in text:
        text = _SMALL.sub(_small_repr, text)
    return text


# A float orjson writes otherwise than repr: below 1e-4 in decimal, or with a one-digit
# negative exponent. With the indent every scalar ends its line (after "key": , or after the
# indent in a list); a string never does (its closing quote ends it), so nothing inside one
# matches.
_SMALL = re.compile(r"(?m)(^ *|\": )(-?(?:0\.0000[1-9]\d*|\d(?:\.\d+)?e-[1-9]))(,?)$")


def _small_repr(m: re.Match[str]) -> str:
    return m.group(1) + _float_repr(float(m.group(2))) + m.group(3)


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
    inner = _line(level + 1)
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
    append(_line(level) + ("}" if is_dict else "]"))
    seen.discard(key)
    if level <= 2:  # (a finding, or a part of one: often enough to bound the pieces)
        out.flush()


_INF = float("inf")
_INNER = tuple("\n" + _INDENT * i for i in range(32))  # a line break and each level's indent


def _line(level: int) -> str:
    """A line break and the indent of ``level``."""
    return _INNER[level] if level < len(_INNER) else "\n" + _INDENT * level


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
