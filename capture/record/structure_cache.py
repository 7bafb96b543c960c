"""The recorder's structure cache: a call's key -> its `Structure`, matched by guards, bounded.

Split from `capture.record.recorder` (the wrapper and its lifecycle); `Recorder` inherits these
methods, so the hot path pays no extra attribute lookup. A container key seen before is matched
by its guards (dtypes, devices and ranks checked in C++); a new key is described once
(`flatten.describe`), handed to the writer, and cached, up to `max_structures` structures and
`_MAX_HELD_TOKENS` key tokens: beyond, calls with new structures are dropped and counted.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from itertools import chain
from typing import Any, cast

import torch
import torch.utils._pytree as pytree

from capture.record.flatten import Param, Structure, describe, metadata_guard, shapes_of, tensor_key
from capture.record.writer import StoreWriter

__all__ = ["StructureCache"]

_UNSEEN: Any = object()
_chain = chain.from_iterable
_shape = operator.attrgetter("shape")
# Guards kept per container key: one per dtype/device/rank/requires_grad combination seen,
# up to this many; beyond, calls take the Python key (`tensor_key`), which is always right.
_MAX_GUARDS = 4
# Key tokens held by all the structures of one recorder together (about two per leaf): with
# `flatten.MAX_KEY` per call this bounds the memory of many large distinct structures.
_MAX_HELD_TOKENS = 2_000_000


def _never(t: torch.Tensor) -> bool:
    return False


class StructureCache:
    """Structures of one recorder's calls, by key (see `Recorder` for the attributes)."""

    name: str
    max_structures: int
    value_ranges: str
    _lock: threading.Lock
    _writer: StoreWriter | None
    _signature: tuple[Param, ...]
    _special_ids: tuple[int, ...]
    _overflow: int
    _held_tokens: int
    # key -> Structure, or None for a key refused (max_structures reached).
    _structures: dict[tuple[Any, ...], Structure | None]
    # Fast path: container key -> ((guard, Structure), ...), see `flatten.metadata_guard`.
    _guarded: dict[tuple[Any, ...], tuple[tuple[Callable[..., bool], Structure], ...]]

    def _warn_once(self, topic: str, msg: str, *args: Any) -> None:
        raise NotImplementedError

    def _structure(
        self, obj: Any, tensors: list[torch.Tensor], key: list[Any], root: str
    ) -> tuple[Structure, tuple[int, ...]] | None:
        """The structure of a walked `obj` and its tensors' sizes, flat (None: not recorded).

        The sizes are one flat tuple of ints: the GC does not track it, so records waiting in
        the writer's queue do not trigger full collections (torch.Size lists did; measured in
        docs/benchmarks.md).

        A container key seen before is matched by its guards (dtypes, devices and ranks checked
        in C++); otherwise the full key is built in Python and looked up. Output keys leave
        device indices out: outputs follow the inputs' devices, and the structure still
        records the device seen first.
        """
        containers = tuple(key)
        for guard, known in self._guarded.get(containers, ()):
            if guard(*tensors):
                return known, tuple(_chain(map(_shape, tensors)))
        try:
            k, shapes = tensor_key(containers, tensors, devices=root == "inputs")
        except RuntimeError:  # a strided nested tensor has no sizes: ragged dimensions are -1
            k, shapes = tensor_key(containers, tensors, root == "inputs", shapes_of(tensors))
        found = self._structures.get(k, _UNSEEN)
        st = (
            self._new_structure(k, obj, tensors, root)
            if found is _UNSEEN
            else cast(Structure | None, found)
        )
        if st is None:
            return None
        if st.slow:  # walk() and torch's pytree disagree on this structure: trust pytree
            tensors[:] = [t for t in pytree.tree_leaves(obj) if isinstance(t, torch.Tensor)]
            shapes = shapes_of(tensors)
        elif st.nested:  # sizes as ints (a jagged tensor's ragged size is a SymInt); no guard
            shapes = shapes_of(tensors)
        else:
            self._add_guard(containers, tensors, st)
        return st, tuple(_chain(shapes))

    def _add_guard(
        self, containers: tuple[Any, ...], tensors: list[torch.Tensor], st: Structure
    ) -> None:
        with self._lock:
            guarded = self._guarded.get(containers, ())
            if len(guarded) >= _MAX_GUARDS:
                return
            guard = metadata_guard(tensors)
            if guard is not None:  # a new tuple: readers iterate the old one without the lock
                self._guarded[containers] = (*guarded, (guard, st))

    def _new_structure(
        self, key: tuple[Any, ...], obj: Any, tensors: list[torch.Tensor], root: str
    ) -> Structure | None:
        with self._lock:
            if key in self._structures:
                return self._structures[key]
            tokens = len(key[0])
            if (
                len(self._structures) >= self.max_structures
                or self._held_tokens + tokens > _MAX_HELD_TOKENS
            ):
                self._overflow += 1
                self._warn_once(
                    "max_structures",
                    "capture: %s has more than %d distinct call structures (a scalar argument "
                    "that changes on every call?); calls with new structures are dropped",
                    self.name,
                    self.max_structures,
                )
                return None
            st = describe(
                obj,
                tensors,
                root=root,
                signature=self._signature if root == "inputs" else (),
                track_ranges=self._track_ranges if root == "inputs" else _never,
                strict=True,
                special_ids=self._special_ids if root == "inputs" else (),
            )
            if st.opaque:
                self._warn_once(
                    "opaque",
                    "capture: %s receives values the flattener does not know; they are recorded "
                    "as opaque leaves (type names only): %s",
                    self.name,
                    ", ".join(st.opaque[:5]),
                )
            if self._writer is not None:
                self._writer.add_structure(st)
            self._structures[key] = st
            self._held_tokens += tokens
            return st

    def _track_ranges(self, t: torch.Tensor) -> bool:
        if self.value_ranges == "none":
            return False
        return self.value_ranges == "all" or t.device.type == "cpu"
