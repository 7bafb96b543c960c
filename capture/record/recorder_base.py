"""The parts of `Recorder` off its hot path: unwrapping, fork, counters, oversized arguments.

Split from `capture.record.recorder` to keep each module small; `Recorder` inherits these methods.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from capture.record.flatten import MAX_ITEMS, MAX_KEY, Oversized, Summary, walk
from capture.record.segment import call_id_base
from capture.record.writer import StoreWriter

__all__ = ["RecorderBase", "STOP_WAIT_SECONDS"]

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

    def _summarised(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """(args, kwargs, tensors, key) with each argument too large to walk as a `Summary`."""
        self._oversized += 1
        key: list[Any] = []

        def fit(value: Any) -> Any:
            n = len(key)
            try:
                walk(value, [], key)
            except Oversized:
                del key[n:]
                return self._summary(value)
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
