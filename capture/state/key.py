"""A call's state key: the state its answer depends on besides its arguments, as one short string.

A peft model's answer depends on its active adapter(s) and on whether adapters are disabled; any
module's on ``training`` (dropout); a user's model on what the user declares
(``Recorder(..., state=fn)``). The key is the canonical JSON of those items (sorted keys, no
spaces): ``{"adapter":"b"}``, ``{"adapters_disabled":true}``, ``{"tenant":"x","training":true}``.
The default state (no adapter, eval mode, nothing declared) has no key: None in Python, null in
the store, ``""`` where a string is needed (`DEFAULT`), so a store recorded before states read the
same way.

This module is the one home of the format (recording writes it, analysis names groups after it,
replay parses it to enter a state, the runner matches it); it imports nothing but the standard
library, so store readers and the runtime use it without torch.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from capture.errors import StateError

__all__ = [
    "ADAPTER",
    "ADAPTERS_DISABLED",
    "TRAINING",
    "RESERVED",
    "DEFAULT",
    "MAX_ITEMS",
    "state_key",
    "declared_items",
    "parse_key",
    "state_label",
]

ADAPTER = "adapter"
"""The active peft adapter: its name, or the list of names when several are active."""
ADAPTERS_DISABLED = "adapters_disabled"
"""True when peft's adapters are disabled (``disable_adapter()``): the base model's answer."""
TRAINING = "training"
"""True when the recorded module was in training mode (absent: eval mode)."""
RESERVED = frozenset({ADAPTER, ADAPTERS_DISABLED, TRAINING})
"""Item names the recorder sets itself; a user's ``state=`` callable may not return them."""

DEFAULT = ""
"""The default state's key where a string is needed (a group's `state`, a manifest entry)."""

MAX_ITEMS = 16
"""Most items a user's ``state=`` callable may return."""
MAX_TEXT = 200
"""Longest item name or string value."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.,+=-]")


def state_key(items: Mapping[str, Any]) -> str | None:
    """The canonical key of a state's items (None for no item: the default state).

    Example:
        >>> state_key({"training": True, "adapter": "b"})
        '{"adapter":"b","training":true}'
        >>> state_key({}) is None
        True
    """
    if not items:
        return None
    return json.dumps(dict(items), sort_keys=True, separators=(",", ":"), allow_nan=False)


def declared_items(value: Any) -> dict[str, bool | int | float | str]:
    """A user's ``state=`` callable's return value, checked: a dict of a few scalars.

    Raises:
        StateError: Not a dict, too many items, a name that is not an identifier or that the
            recorder sets itself (`RESERVED`), a value that is not a bool, int, finite float
            or short string.
    """
    if not isinstance(value, Mapping):
        raise StateError(
            f"the state= callable returned {type(value).__name__}; it must return a dict of "
            "a few scalars (str -> bool, int, float or str)"
        )
    if len(value) > MAX_ITEMS:
        raise StateError(f"the state= callable returned {len(value)} items; at most {MAX_ITEMS}")
    out: dict[str, bool | int | float | str] = {}
    for name, item in value.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise StateError(f"state item name {str(name)[:40]!r} is not an identifier")
        if name in RESERVED:
            raise StateError(
                f"state item {name!r} is set by the recorder itself; name it otherwise"
            )
        short = not isinstance(item, str) or len(item) <= MAX_TEXT
        if isinstance(item, bool | int | str) and short:
            out[name] = item
        elif isinstance(item, float) and math.isfinite(item):
            out[name] = item
        else:
            raise StateError(
                f"state item {name!r} is {type(item).__name__} {str(item)[:40]!r}; use a bool, "
                f"an int, a finite float or a string of at most {MAX_TEXT} characters"
            )
    return out


def parse_key(key: str | None) -> dict[str, Any]:
    """The items of a state key (empty for the default state).

    Raises:
        StateError: Not a key `state_key` writes.

    Example:
        >>> parse_key('{"adapter":"b"}')
        {'adapter': 'b'}
    """
    if not key:
        return {}
    try:
        items = json.loads(key)
    except ValueError as e:
        raise StateError(f"state key {key[:60]!r} is not JSON ({e})") from e
    if not isinstance(items, dict) or state_key(items) != key:
        raise StateError(f"state key {key[:60]!r} is not a canonical state key")
    return items


def state_label(key: str | None) -> str:
    """A short readable name of a state, safe in group and file names (``adapter=b``,
    ``adapters_disabled``, ``training``; ``default`` for the default state).

    Example:
        >>> state_label('{"adapter":"b","training":true}')
        'adapter=b,training'
        >>> state_label(None)
        'default'
    """
    items = parse_key(key)
    if not items:
        return "default"
    parts = []
    for name, value in sorted(items.items()):
        if value is True:
            parts.append(name)
        elif isinstance(value, list):
            parts.append(f"{name}={'+'.join(str(v) for v in value)}")
        else:
            parts.append(f"{name}={value}")
    return _LABEL_UNSAFE.sub("_", ",".join(parts))[:120]
