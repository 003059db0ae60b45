"""Text from logs made safe for a terminal.

Folder, file and tag names are untrusted: an ESC sequence in a tag could retitle the window,
clear the screen or hide lines. Control characters (C0 but tab and newline, DEL, C1), the
bidirectional overrides and lone surrogates are shown as visible escapes instead.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _show(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def safe(text: object) -> str:
    """``text`` with every control character shown as an escape (``\\x1b``)."""
    s = str(text)
    return _UNSAFE.sub(_show, s)


def escape(text: object) -> str:
    """:func:`safe`, then rich's markup escape (``[bold]`` in a tag must not style text)."""
    from rich.markup import escape as markup_escape

    return markup_escape(safe(text))
