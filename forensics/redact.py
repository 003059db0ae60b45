"""``--redact``: no host name, user name or home path anywhere in the HTML and JSON.

The renderer leaves paths and sensitive metadata keys out; that alone misses what the log
itself repeats: host names inside event-file names (in notes, finding summaries and measures),
``/home/<user>`` in crash lines, user names in W&B ``args``. So the terms that identify
machines and people are first collected from the whole diagnosis (event-file names, W&B
metadata, home paths), then every string of a copy of the diagnosis is scrubbed of them and
of absolute paths before anything is rendered; a last pass scrubs the page outside the
inlined plotly.js bundle.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
from collections.abc import Callable, Iterable
from enum import Enum
from pathlib import PurePath
from typing import Any

# Absolute paths (POSIX, home-relative, Windows); paths relative to the run folder stay readable.
_PATHLIKE = re.compile(r"(?<![\w.])(?:[A-Za-z]:[\\/]|~[\\/]|/)[^\s'\"<>,;\]\)]*")
# TensorBoard names event files events.out.tfevents.<time>.<host name>[.<pid>.<n>][suffix].
_TFEVENTS = re.compile(
    r"events\.out\.tfevents\.\d+\.([A-Za-z0-9][A-Za-z0-9_-]*(?:\.[A-Za-z][A-Za-z0-9_-]*)*)"
)
_HOME = re.compile(r"(?:/home/|/Users/|/u/|[A-Za-z]:\\Users\\)([A-Za-z0-9._-]+)")
_EMAIL = re.compile(r"([A-Za-z0-9._%+-]+)@([A-Za-z0-9.-]+\.[A-Za-z]{2,})")
# Metadata and config keys whose values name a machine or a person.
_IDENTITY_KEY = re.compile(r"host|node_?name|username|user\b|^user|email|entity|owner", re.I)
# Words too common to be replaced as names (a user called "data" or "root" would mangle text).
_COMMON = {
    "root",
    "user",
    "users",
    "home",
    "data",
    "admin",
    "ubuntu",
    "localhost",
    "none",
    "null",
    "node",
    "gpu",
    "main",
    "master",
    "worker",
    "train",
    "test",
    "local",
    "true",
    "false",
}


def _strings(obj: Any, seen: set[int] | None = None, key: str = "") -> Iterable[tuple[str, str]]:
    """Every (key, string) reachable from obj: dataclasses, objects, dicts, lists, frames."""
    seen = set() if seen is None else seen
    if type(obj) is str:
        yield key, obj
        return
    if obj is None or isinstance(obj, (bool, int, float, Enum, PurePath)) or id(obj) in seen:
        return
    seen.add(id(obj))
    import polars as pl

    if isinstance(obj, pl.DataFrame):
        for name in ("file", "tag", "source"):
            if name in obj.columns:
                for v in obj.get_column(name).unique().drop_nulls().to_list():
                    yield name, v
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if type(k) is str:
                yield "", k
            yield from _strings(v, seen, str(k))
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            yield from _strings(v, seen, key)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for k, v in vars(obj).items():
            yield from _strings(v, seen, k)


def identity_terms(diagnosis: Any) -> set[str]:
    """Host names, user names and e-mail addresses the diagnosis mentions."""
    terms: set[str] = set()
    for key, text in _strings(diagnosis):
        for m in _TFEVENTS.finditer(text):
            host = m.group(1)
            terms.add(host)
            terms.add(host.split(".")[0])
        for m in _HOME.finditer(text):
            terms.add(m.group(1))
        for m in _EMAIL.finditer(text):
            terms.update((m.group(0), m.group(1)))
        if key and _IDENTITY_KEY.search(key) and 0 < len(text) <= 100:
            terms.add(text.strip())
    return {t for t in terms if len(t) >= 3 and t.lower() not in _COMMON}


class Scrubber:
    """Replaces absolute paths, event-file host names and the identity terms in text."""

    def __init__(self, terms: set[str]) -> None:
        ordered = sorted(terms, key=len, reverse=True)  # a full host name before its label
        self.words = (
            re.compile(r"(?<![\w])(?:" + "|".join(re.escape(t) for t in ordered) + r")(?![\w])")
            if ordered
            else None
        )
        self._cache: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        out = self._cache.get(text)
        if out is None:
            out = self._cache[text] = self._scrub(text)
        return out

    def _scrub(self, text: str) -> str:
        out = _TFEVENTS.sub(lambda m: m.group(0).replace(m.group(1), "[host]"), text)
        out = _PATHLIKE.sub("[path]", out)
        return self.terms_only(out)

    def terms_only(self, text: str) -> str:
        """Only the identity terms (safe on markup and scripts, where "/" is no path)."""
        return self.words.sub("[redacted]", text) if self.words is not None else text


def _copy_scrubbed(obj: Any, fn: Callable[[str], str], memo: dict[int, Any]) -> Any:
    if type(obj) is str:
        return fn(obj)
    if obj is None or isinstance(obj, (bool, int, float, Enum, PurePath, type)):
        return obj
    if id(obj) in memo:
        return memo[id(obj)]
    import numpy as np
    import polars as pl

    if isinstance(obj, np.ndarray):
        return obj
    if isinstance(obj, pl.DataFrame):
        cols = [
            pl.col(c).replace_strict(
                (u := obj.get_column(c).unique().drop_nulls().to_list()),
                [fn(v) for v in u],
                default=pl.col(c),
            )
            for c in obj.columns
            if obj.schema[c] == pl.Utf8
        ]
        out_df = obj.with_columns(cols) if cols else obj
        memo[id(obj)] = out_df
        return out_df
    if isinstance(obj, dict):
        new: Any = type(obj)() if type(obj) is not dict else {}
        memo[id(obj)] = new
        for k, v in obj.items():
            new[_copy_scrubbed(k, fn, memo)] = _copy_scrubbed(v, fn, memo)
        return new
    if isinstance(obj, list):
        new_list: list[Any] = []
        memo[id(obj)] = new_list
        new_list.extend(_copy_scrubbed(v, fn, memo) for v in obj)
        return new_list
    if isinstance(obj, (tuple, set, frozenset)):
        items = [_copy_scrubbed(v, fn, memo) for v in obj]
        out_seq = type(obj)(items) if not hasattr(obj, "_fields") else type(obj)(*items)
        memo[id(obj)] = out_seq
        return out_seq
    if hasattr(obj, "__dict__"):
        new_obj = copy.copy(obj)
        memo[id(obj)] = new_obj
        cls = type(obj)
        for k, v in list(vars(obj).items()):
            if isinstance(getattr(cls, k, None), functools.cached_property):
                del new_obj.__dict__[k]  # recomputed from the scrubbed fields (keyed by id)
                continue
            object.__setattr__(new_obj, k, _copy_scrubbed(v, fn, memo))
        return new_obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # slotted dataclasses
        return dataclasses.replace(
            obj,
            **{
                f.name: _copy_scrubbed(getattr(obj, f.name), fn, memo)
                for f in dataclasses.fields(obj)
                if f.init
            },
        )
    return obj


def redact_diagnosis(diagnosis: Any) -> tuple[Any, Scrubber]:
    """A copy of the diagnosis with every host, user and absolute path replaced, and the
    scrubbing function (for the rendered page and the findings document)."""
    fn = Scrubber(identity_terms(diagnosis))
    return _copy_scrubbed(diagnosis, fn, {}), fn


def redact_document(doc: Any, fn: Callable[[str], str]) -> Any:
    """The findings document (plain JSON data) with every string scrubbed."""
    if type(doc) is str:
        return fn(doc)
    if isinstance(doc, dict):
        return {redact_document(k, fn): redact_document(v, fn) for k, v in doc.items()}
    if isinstance(doc, list):
        return [redact_document(v, fn) for v in doc]
    return doc


def redact_page(html: str, fn: Scrubber) -> str:
    """The page scrubbed of the identity terms outside the inlined plotly.js bundle (left as
    it is: replacing words inside it could break it, and it holds nothing from the log)."""
    from forensics.report.render import _plotly_inline

    bundle = _plotly_inline()
    parts = html.split(bundle) if bundle in html else [html]
    return bundle.join(fn.terms_only(p) for p in parts)
