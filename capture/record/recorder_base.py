"""The parts of `Recorder` off its hot path: unwrapping, fork, counters, oversized arguments.

Split from `capture.record.recorder` to keep each module small; `Recorder` inherits these methods.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from capture.record.flatten import MAX_ITEMS, MAX_KEY, Oversized, Summary, walk
from capture.record.segment import call_id_base
from capture.record.writer import StoreWriter

__all__ = ["RecorderBase", "STOP_WAIT_SECONDS"]

logger = logging.getLogger(__name__)

STOP_WAIT_SECONDS = 5.0
"""Longest time stop() waits for calls still inside the model to finish and be queued."""

_WRITER_COUNTS = (
    "recorded",
    "dropped",
    "write_errors",
    "written",
    "files",
    "bad_records",
    "store_resets",
    "tmp_removed",
)


_FIX = (
    "run with logging at DEBUG for the traceback (logger 'capture'), and report it; a class "
    "capture cannot read can be registered with capture.register_cache or "
    "torch.utils._pytree.register_pytree_node"
)
_FIXES = {
    "opening the store": "check that the store path or URI exists and is writable",
}


def _count_value(counter: itertools.count[int]) -> int:
    """The next value of an `itertools.count` without consuming it (its repr is 'count(n)')."""
    return int(repr(counter)[6:-1])


class RecorderBase:
    """State and helpers `Recorder` inherits (see there for the attributes' meaning)."""

    model: Any
    method: str
    name: str
    _active: bool
    _original: Callable[..., Any] | None
    _had_instance_attr: bool
    _wrapper: Callable[..., Any] | None
    _writer: StoreWriter | None
    _flight: list[itertools.count[int]]
    _past: dict[str, int]
    _oversized: int
    _unreadable: int
    _errors: int
    _sampled_out: int
    _overflow: int
    _lock: threading.Lock
    _id_base: int
    _seq: itertools.count[int]
    _random: random.Random

    def _warn_once(self, topic: str, msg: str, *args: Any) -> None:
        raise NotImplementedError

    def _unwrap(self) -> None:
        """Puts back the method, unless another wrapper was set on top of ours since.

        Recorders stopped in the order they started (FIFO) would otherwise leave a stale
        wrapper: the first one's restore removed the second's, which then put the first's back
        (issue 12). A wrapper left under another is inactive (it passes calls through) and the
        one on top removes it with itself when it stops.
        """
        attrs = getattr(self.model, "__dict__", {})
        if self.method in attrs and attrs[self.method] is not self._wrapper:
            return  # someone wrapped on top of us: they restore through us
        target, had = self._original, self._had_instance_attr
        while True:  # skip wrappers of recorders stopped while we were on top of them
            below = getattr(target, "_capture_recorder", None)
            below = below() if below is not None else None
            if below is None or below._active:
                break
            target, had = below._original, below._had_instance_attr
        if had:
            setattr(self.model, self.method, target)
        else:
            try:
                delattr(self.model, self.method)
            except AttributeError:
                setattr(self.model, self.method, target)

    def _wait_in_flight(self) -> None:
        deadline = time.monotonic() + STOP_WAIT_SECONDS
        entered, left = self._flight
        while _count_value(entered) > _count_value(left) and time.monotonic() < deadline:
            time.sleep(0.001)

    def after_fork_in_child(self) -> None:
        """A forked child's recorder: new call ids, fresh counters, its own writer (issue 12)."""
        self._lock = threading.Lock()
        self._id_base = call_id_base()
        self._seq = itertools.count()
        self._random = random.Random()
        self._flight[:] = [itertools.count(), itertools.count()]
        self._errors = self._sampled_out = self._overflow = self._oversized = 0
        self._unreadable = 0
        self._past = {}
        if self._writer is not None:
            self._writer.after_fork_in_child()

    def _totals(self) -> dict[str, int]:
        """The writers' counters, this one's plus those of earlier start()/stop() rounds."""
        w = self._writer
        now = self._writer_counts(w) if w is not None else {}
        return {k: self._past.get(k, 0) + now.get(k, 0) for k in _WRITER_COUNTS}

    @staticmethod
    def _writer_counts(w: StoreWriter) -> dict[str, int]:
        return {
            "recorded": w.recorded,
            "dropped": w.dropped,
            "write_errors": w.write_errors,
            "written": w.written_calls,
            "files": w.files_written,
            "bad_records": w.bad_records,
            "store_resets": w.store_resets,
            "tmp_removed": w.tmp_removed,
        }

    def _add_past(self, w: StoreWriter) -> None:
        for k, v in self._writer_counts(w).items():
            self._past[k] = self._past.get(k, 0) + v

    def _output_summary(self, out: Any, error: BaseException) -> tuple[Summary, list[Any]]:
        """An output too large, or that capture cannot read: one opaque leaf, and its key."""
        if isinstance(error, Oversized):
            self._oversized += 1
            summary = self._summary(out)
        else:
            self._unreadable += 1
            summary = self._opaque(out, error)
        return summary, ["out", summary.type_name]

    def _summary(self, obj: Any) -> Summary:
        """An argument too large to record leaf by leaf: counted, warned once (issue 12)."""
        tp = type(obj)
        self._warn_once(
            "oversized",
            "capture: %s receives a %s with more than %d items (or %d leaves in all); such "
            "arguments are recorded as opaque leaves (type name only), counted in "
            "stats()['oversized']",
            self.name,
            tp.__name__,
            MAX_ITEMS,
            MAX_KEY // 2,
        )
        return Summary(f"{tp.__module__}.{tp.__qualname__}")

    def _warn_nothing_recorded(self, what: str, error: BaseException) -> None:
        """Every call so far failed and none was recorded: one loud warning (issue 22)."""
        if self._totals()["recorded"]:
            return
        logger.warning(
            "capture: %s has recorded NO call: its first %d calls all failed while %s "
            "(%s: %s). The model serves as before, but nothing reaches the store. Fix: %s",
            self.name,
            self._errors,
            what,
            type(error).__name__,
            error,
            _FIXES.get(what, _FIX),
        )

    def _opaque(self, obj: Any, error: BaseException) -> Summary:
        """An argument capture cannot flatten: one opaque leaf naming its class (issue 22)."""
        tp = type(obj)
        name = f"{tp.__module__}.{tp.__qualname__}"
        self._warn_once(
            f"unreadable {name}",
            "capture: %s receives a %s that capture cannot flatten (%s: %s); such arguments are "
            "recorded as one opaque leaf naming the class (the call is recorded, counted in "
            "stats()['unreadable'], and replay reports its group not exportable). Fix: register "
            "the class with capture.register_cache (caches and their layers) or "
            "torch.utils._pytree.register_pytree_node",
            self.name,
            name,
            type(error).__name__,
            error,
        )
        return Summary(name)

    def _summarised(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], error: BaseException | None = None
    ) -> tuple[Any, ...]:
        """(args, kwargs, tensors, key) with each argument too large, or that capture cannot
        read (`error` is not `Oversized`), as a `Summary`: the call is still recorded."""
        if error is None or isinstance(error, Oversized):
            self._oversized += 1
        else:
            self._unreadable += 1
        key: list[Any] = []

        def fit(value: Any) -> Any:
            n = len(key)
            try:
                walk(value, [], key)
                if error is not None and not isinstance(error, Oversized):
                    pytree.tree_flatten(value)  # what describe() does: it must read it too
            except Oversized:
                del key[n:]
                return self._summary(value)
            except Exception as e:  # the walker or a flatten function cannot read it
                del key[n:]
                return self._opaque(value, e)
            return value

        args = tuple(fit(a) for a in args)
        kwargs = {k: fit(v) for k, v in kwargs.items()}
        tensors: list[torch.Tensor] = []
        key = [len(args)]
        try:
            walk(args, tensors, key)
            walk(kwargs, tensors, key)
        except Oversized:  # each fits but not all together (a few container tokens more)
            args = tuple(map(self._summary, args))
            kwargs = {k: self._summary(v) for k, v in kwargs.items()}
            tensors, key = [], [len(args)]
            walk(args, tensors, key)
            walk(kwargs, tensors, key)
        key.append(tuple(v.type_name for v in (*args, *kwargs.values()) if type(v) is Summary))
        return args, kwargs, tensors, key
