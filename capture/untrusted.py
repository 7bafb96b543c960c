"""Text from a store, a payload file or an artifact: read with a depth limit, shown escaped.

Such text is written by others (docs/trust.md), so two rules hold wherever it is read or shown:

- JSON is parsed only after its nesting is measured (`loads`, `too_deep`): a value nested
  deeper than `MAX_JSON_DEPTH` is refused with a `JsonTooDeep` (a `ValueError`, which each
  reader turns into its own one-line error naming the file), never parsed into a value that
  Python's recursion limit stops in the middle of a reader, a ``repr`` or a ``json.dumps``;
- a string reaches a terminal only escaped (`printable`): C0 and C1 controls, DEL, and the
  bidirectional overrides and isolates are shown as ``\\xNN`` / ``\\uNNNN`` (newline, carriage
  return and tab as ``\\n``, ``\\r``, ``\\t``), so a stored name cannot set a window title,
  write the clipboard (OSC 52), clear the screen, move the cursor or reorder what is shown.
  `printable_lines` keeps the newlines of a multi-line report; `terminal_data` escapes a data
  format (JSON, Python source) for a terminal in a form that format reads back as the same
  characters (``\\uNNNN``).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = [
    "MAX_JSON_DEPTH",
    "JsonTooDeep",
    "too_deep",
    "loads",
    "printable",
    "printable_lines",
    "terminal_data",
]

MAX_JSON_DEPTH = 200
"""Deepest nesting of lists and objects read from stored JSON. A treespec nests two levels per
tree level (its own limit of 64 levels makes about 130); readers of a value recurse one to three
frames per level, so 200 stays well inside Python's limit of 1,000 frames."""

_KEPT = bytes(c for c in range(256) if c not in b'[]{}"')
"""Every byte but brackets and quotes (deleted before the brackets are counted)."""
_SAME_BRACKETS = bytes.maketrans(b"{}", b"[]")
_ESCAPE = re.compile(rb"\\.", re.DOTALL)


class JsonTooDeep(ValueError):
    """Stored JSON nests lists and objects deeper than the reader's limit."""


def too_deep(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON `text` nests lists and objects deeper than `limit`, found without
    parsing it and without recursion: strings are cut out, then the innermost bracket pairs
    are removed once per level, at most `limit` times (byte operations only: about half the
    time `json.loads` takes on a program's graph); text that is not JSON is left to the parser.

    Example:
        >>> too_deep("[[1], {}]", 2), too_deep("[[[1]]]", 2), too_deep('["[[[["]', 2)
        (False, True, False)
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if data.count(b"[") + data.count(b"{") <= limit:
        return False  # fewer openings than the limit: no need to look further
    # Escapes out first (``\\\\``, ``\\"``, ...): every quote left opens or closes a string.
    data = _ESCAPE.sub(b"", data).translate(None, _KEPT)
    data = data.replace(b'""', b"")  # the strings holding no bracket
    if b'"' in data:
        data = b"".join(data.split(b'"')[::2])
    brackets = data.translate(_SAME_BRACKETS)
    for level in range(limit):
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):  # unbalanced (``]]][[``): not JSON; the parser would
            return level + inner.count(b"[") > limit  # recurse into the openings it meets
        brackets = inner
    return len(brackets) > 0


def loads(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads` of stored JSON, refused when nested deeper than `limit`.

    Raises:
        JsonTooDeep: Nested deeper than `limit`.
        ValueError: Not JSON, or bytes that are not UTF-8 (``json.JSONDecodeError``,
            ``UnicodeDecodeError``).

    Example:
        >>> loads('{"a": [1]}')
        {'a': [1]}
    """
    if too_deep(text, limit):
        raise JsonTooDeep(f"JSON nested deeper than {limit} levels")
    return json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)


def _escape(code: int, short: bool) -> str:
    named = {0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
    if short and code in named:
        return named[code]
    if short and code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


_UNSAFE = [
    *range(0x00, 0x20),
    *range(0x7F, 0xA0),  # DEL and the C1 controls (0x9B is a one-byte CSI on some terminals)
    0x061C,  # arabic letter mark
    0x200E,  # left-to-right and right-to-left marks
    0x200F,
    0x2028,  # line and paragraph separators
    0x2029,
    *range(0x202A, 0x202F),  # bidirectional embeddings and overrides (RLO is U+202E)
    *range(0x2066, 0x206A),  # bidirectional isolates
]
_SHOWN = {code: _escape(code, True) for code in _UNSAFE}
_SHOWN_LINES = {code: text for code, text in _SHOWN.items() if code != 0x0A}
_DATA = {code: _escape(code, False) for code in _UNSAFE if code != 0x0A}


def printable(text: str) -> str:
    """`text` with every control, DEL and bidirectional override escaped (module docstring).

    Example:
        >>> printable("llama\\x1b]0;pwned\\x07\\u202e")
        'llama\\\\x1b]0;pwned\\\\x07\\\\u202e'
    """
    return text if text.isprintable() else text.translate(_SHOWN)


def printable_lines(text: str) -> str:
    """`printable`, keeping the newlines (a report of several lines).

    Example:
        >>> printable_lines("a\\rb\\nc")
        'a\\\\rb\\nc'
    """
    return text if text.isprintable() else text.translate(_SHOWN_LINES)


def terminal_data(text: str) -> str:
    """A data format's text (JSON, Python source, CSV) for a terminal: every character
    `printable` escapes written ``\\uNNNN`` (inside a JSON or Python string, the same
    character), newlines kept.

    Example:
        >>> terminal_data('["\\u202e"]')
        '["\\\\u202e"]'
    """
    return text if text.isprintable() else text.translate(_DATA)
