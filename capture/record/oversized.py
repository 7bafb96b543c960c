"""Arguments too large to record leaf by leaf: summarised as opaque leaves of their type (issue 12).

`capture.record.flatten.walk` raises `Oversized` past `MAX_ITEMS` items in one container or
`MAX_KEY` key tokens in one call. The recorder then walks each argument alone and replaces
those that do not fit by a `Summary` (their type name only); when each fits but not all together,
every argument is summarised. The call is still recorded, with the summarised arguments as
opaque leaves, and counted (``stats()["oversized"]``).

Example:
    >>> args, kwargs, tensors, key, summarised = summarise(([0] * 2_000,), {"n": 1})
    >>> args, kwargs, summarised
    ((Summary(type_name='builtins.list'),), {'n': 1}, ['builtins.list'])
"""

from __future__ import annotations

from typing import Any

import torch

from capture.record.flatten import Oversized, Summary, walk

__all__ = ["summary_of", "summarise"]


def summary_of(obj: Any) -> Summary:
    """The opaque leaf standing for `obj` (its type's full name)."""
    tp = type(obj)
    return Summary(f"{tp.__module__}.{tp.__qualname__}")


def summarise(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], list[torch.Tensor], list[Any], list[str]]:
    """A call with each argument too large to walk replaced by its `Summary`.

    Returns:
        ``(args, kwargs, tensors, key, summarised)``: the call as it will be recorded, its
        tensors and structure key (as `walk` builds them, plus the summarised type names), and
        the type names of the arguments summarised.
    """
    key: list[Any] = []

    def fit(value: Any) -> Any:
        n = len(key)
        try:
            walk(value, [], key)
        except Oversized:
            del key[n:]
            return summary_of(value)
        return value

    args = tuple(fit(a) for a in args)
    kwargs = {k: fit(v) for k, v in kwargs.items()}
    tensors: list[torch.Tensor] = []
    key = [len(args)]
    try:
        walk(args, tensors, key)
        walk(kwargs, tensors, key)
    except Oversized:  # each fits but not all together (a few container tokens more)
        args = tuple(map(summary_of, args))
        kwargs = {k: summary_of(v) for k, v in kwargs.items()}
        tensors, key = [], [len(args)]
        walk(args, tensors, key)
        walk(kwargs, tensors, key)
    summarised = [v.type_name for v in (*args, *kwargs.values()) if type(v) is Summary]
    key.append(tuple(summarised))
    return args, kwargs, tensors, key, summarised
