"""Arguments not recorded leaf by leaf: summarised as opaque leaves of their type.

Two causes, one remedy. `capture.record.flatten.walk` raises `Oversized` past `MAX_ITEMS` items
in one container or `MAX_KEY` key tokens in one call; and an argument capture cannot flatten
(an unregistered class, a flatten function that raises, a cache layer the registry refuses)
makes the walk or torch's pytree fail. The recorder then walks each argument alone and replaces
those that do not fit, or cannot be read, by an `OpaqueArgument` (their type name only); when
each fits but not all together, every argument is summarised. The call is still recorded, with the
summarised arguments as opaque leaves, and counted (``stats()["oversized"]`` or
``stats()["unreadable"]``): a recorder never records nothing.

`Summaries` is the recorder's part that does it: it counts each call so recorded (in the
recorder's `capture.record.accounting.Counters`) and warns once per cause and class.

Example:
    >>> args, kwargs, tensors, key, summarised = summarise(([0] * 2_000,), {"n": 1})
    >>> args, kwargs, summarised
    ((OpaqueArgument(type_name='builtins.list'),), {'n': 1}, ['builtins.list'])
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from capture.record.accounting import Counters, OnceLog
from capture.record.flatten import MAX_ITEMS, MAX_KEY, OpaqueArgument, Oversized, walk

__all__ = ["summary_of", "summarise", "Summaries"]


def summary_of(obj: Any) -> OpaqueArgument:
    """The opaque leaf standing for `obj` (its type's full name)."""
    tp = type(obj)
    return OpaqueArgument(f"{tp.__module__}.{tp.__qualname__}")


def summarise(
    args: tuple[Any, ...], kwargs: dict[str, Any], unreadable: bool = False
) -> tuple[tuple[Any, ...], dict[str, Any], list[torch.Tensor], list[Any], list[str]]:
    """A call with each argument too large to walk, or unreadable, replaced by its `OpaqueArgument`.

    Args:
        args: The call's positional arguments.
        kwargs: Its keyword arguments.
        unreadable: The call failed otherwise than by its size: each argument is also
            flattened with torch's pytree (what `describe` does), and one that fails there is
            summarised too.

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
            if unreadable:
                pytree.tree_flatten(value)
        except Exception:  # too large (Oversized), or capture cannot read it
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
    summarised = [v.type_name for v in (*args, *kwargs.values()) if type(v) is OpaqueArgument]
    key.append(tuple(summarised))
    return args, kwargs, tensors, key, summarised


class Summaries:
    """The recorder's part for calls it cannot record leaf by leaf: summarised, counted, warned.

    Args:
        name: The recorder's model name (in warnings).
        counts: The recorder's counters (``oversized``, ``unreadable``).
        log: Where warnings go, once per topic.
    """

    def __init__(self, name: str, counts: Counters, log: OnceLog) -> None:
        self.name = name
        self._counts = counts
        self._log = log

    def inputs(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], error: BaseException
    ) -> tuple[tuple[Any, ...], dict[str, Any], list[torch.Tensor], list[Any]]:
        """(args, kwargs, tensors, key) of a call whose walk or description raised `error`:
        each argument too large, or that capture cannot read, as an opaque leaf of its type."""
        unreadable = not isinstance(error, Oversized)
        args, kwargs, tensors, key, summarised = summarise(args, kwargs, unreadable)
        if unreadable:
            self._counts.unreadable += 1
            self._warn_unreadable(summarised, error)
        else:
            self._counts.oversized += 1
            self._warn_oversized(summarised[0] if summarised else "argument")
        return args, kwargs, tensors, key

    def output(self, out: Any, error: BaseException) -> tuple[OpaqueArgument, list[Any]]:
        """An output too large or unreadable: one opaque leaf, and its structure key."""
        summary = summary_of(out)
        if isinstance(error, Oversized):
            self._counts.oversized += 1
            self._warn_oversized(summary.type_name)
        else:
            self._counts.unreadable += 1
            self._warn_unreadable([summary.type_name], error)
        return summary, ["out", summary.type_name]

    def _warn_unreadable(self, type_names: list[str], error: BaseException) -> None:
        names = ", ".join(type_names) or "an argument"
        self._log.warn(
            f"unreadable {names}",
            "capture: %s receives a %s that capture cannot flatten (%s: %s); such arguments are "
            "recorded as one opaque leaf naming the class (the call is recorded, counted in "
            "stats()['unreadable'], and replay reports its group not exportable). Fix: register "
            "the class with capture.register_cache (caches and their layers) or "
            "torch.utils._pytree.register_pytree_node",
            self.name,
            names,
            type(error).__name__,
            error,
        )

    def _warn_oversized(self, type_name: str) -> None:
        self._log.warn(
            "oversized",
            "capture: %s receives a %s with more than %d items (or %d leaves in all); such "
            "arguments are recorded as opaque leaves (type name only), counted in "
            "stats()['oversized']",
            self.name,
            type_name.rsplit(".", 1)[-1],
            MAX_ITEMS,
            MAX_KEY // 2,
        )
