"""The recorder's structure cache: a call's key -> its `Structure`, matched by guards, bounded.

A part of `capture.record.recorder.Recorder` with its own state: the recorder hands it each
walked call (`StructureCache.lookup`, bound once into the recorder so the hot path pays no
extra attribute lookup) and the writer and signature of each start(). A container key seen
before is matched by its guards (dtypes, devices and ranks checked in C++); a new key is
described once (`flatten.describe`), handed to the writer, and cached, up to `max_structures`
structures and `_MAX_HELD_TOKENS` key tokens: beyond, calls with new structures are dropped and
counted (`overflow`).
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from collections.abc import Callable
from itertools import chain
from typing import Any, cast

import torch
import torch.utils._pytree as pytree

from capture.record.accounting import OnceLog
from capture.record.flatten import (
    Structure,
    describe,
    in_keyword_order,
    metadata_guard,
    shapes_of,
    tensor_key,
)
from capture.record.writer import StoreWriter
from capture.signature import Signature

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
    """Structures of one recorder's calls, by key.

    Args:
        name: The recorder's model name (in warnings).
        max_structures: Distinct structures kept (`capture.Recorder`'s option).
        value_ranges: Which integer tensors get a value range: 'cpu', 'all' or 'none'.
        log: Where warnings go, once per topic.
    """

    def __init__(self, name: str, max_structures: int, value_ranges: str, log: OnceLog) -> None:
        self.name = name
        self.max_structures = max_structures
        self.value_ranges = value_ranges
        self._log = log
        self._lock = threading.Lock()
        self._writer: StoreWriter | None = None
        self._signature = Signature()
        self._special_ids: tuple[int, ...] = ()
        self.overflow = 0
        """Calls dropped because their structure was one too many."""
        self._held_tokens = 0
        # key -> Structure, or None for a key refused (max_structures reached).
        self._structures: dict[tuple[Any, ...], Structure | None] = {}
        # Fast path: container key -> ((guard, Structure), ...), see `flatten.metadata_guard`.
        self._guarded: dict[tuple[Any, ...], tuple[tuple[Callable[..., bool], Structure], ...]]
        self._guarded = {}

    def start(
        self, writer: StoreWriter | None, signature: Signature, special_ids: tuple[int, ...] = ()
    ) -> None:
        """The writer new structures go to, the recorded method's signature and the token ids
        whose counts are recorded (`capture.record.tokens`), at each start()."""
        self._writer = writer
        self._signature = signature
        self._special_ids = special_ids

    def after_fork_in_child(self) -> None:
        """A forked child's cache: a fresh lock (another thread may have held it); the known
        structures stay (the child's writer writes them again), its overflow count restarts."""
        self._lock = threading.Lock()
        self.overflow = 0

    def count(self) -> int:
        """How many distinct structures are known (refused keys aside)."""
        return sum(1 for s in self._structures.values() if s is not None)

    def lookup(
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
                if known.order is not None:  # keywords passed in another order
                    tensors[:] = [tensors[i] for i in known.order]
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
            if st.keywords is not None:
                obj = (obj[0], {name: obj[1][name] for name in st.keywords})
            tensors[:] = [t for t in pytree.tree_leaves(obj) if isinstance(t, torch.Tensor)]
            return st, tuple(_chain(shapes_of(tensors)))
        if not st.nested:  # a nested tensor's sizes are read with shapes_of: no guard
            self._add_guard(containers, tensors, st)  # on the tensors as the call passed them
        if st.order is not None:
            tensors[:] = [tensors[i] for i in st.order]
            shapes = [shapes[i] for i in st.order]
        if st.nested:  # sizes as ints (a jagged tensor's ragged size is a SymInt)
            shapes = shapes_of(tensors)
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
                self.overflow += 1
                self._log.warn(
                    "max_structures",
                    "capture: %s has more than %d distinct call structures (a scalar argument "
                    "that changes on every call?); calls with new structures are dropped",
                    self.name,
                    self.max_structures,
                )
                return None
            moved = in_keyword_order(obj, self._signature) if root == "inputs" else None
            if moved is not None:  # described in the structure's keyword order
                obj, order = moved
                tensors = [tensors[i] for i in order]
            st = describe(
                obj,
                tensors,
                root=root,
                signature=self._signature if root == "inputs" else Signature(),
                track_ranges=self._track_ranges if root == "inputs" else _never,
                strict=True,
                special_ids=self._special_ids if root == "inputs" else (),
            )
            if st.opaque:
                self._log.warn(
                    "opaque",
                    "capture: %s receives values the flattener does not know; they are recorded "
                    "as opaque leaves (type names only): %s",
                    self.name,
                    ", ".join(st.opaque[:5]),
                )
            if self._writer is not None:
                self._writer.add_structure(st)
            if moved is not None:  # this key's calls reorder their tensors (`lookup`)
                st = dataclasses.replace(st, keywords=tuple(obj[1]), order=moved[1])
            self._structures[key] = st
            self._held_tokens += tokens
            return st

    def _track_ranges(self, t: torch.Tensor) -> bool:
        if self.value_ranges == "none":
            return False
        return self.value_ranges == "all" or t.device.type == "cpu"
