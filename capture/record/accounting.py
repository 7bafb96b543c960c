"""What a recorder accounts for: calls in flight, call ids, what was lost and why, warnings given.

Parts of `capture.record.recorder.Recorder`, each with its own state, renewed in a forked child
(`capture.record.lifecycle`). The hot path touches `InFlight` and `CallIds` on every call, so
both count with ``itertools.count``: ``next()`` on it is one C call holding the GIL, an atomic
increment with no lock, cheaper than any Python-level counter.

Example:
    >>> flight = InFlight()
    >>> _ = flight.enter()
    >>> flight.wait(0.01)  # a call is still inside: waits the 10 ms, then gives up
    False
    >>> _ = flight.leave()
    >>> flight.wait(0.01)
    True
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import TYPE_CHECKING, Any

from capture.record.segment import call_id_base

if TYPE_CHECKING:
    from capture.record.writer import StoreWriter

__all__ = ["InFlight", "CallIds", "Counters", "OnceLog", "WRITER_COUNTS"]

WRITER_COUNTS = (
    "recorded",
    "dropped",
    "write_errors",
    "written",
    "files",
    "bad_records",
    "store_resets",
    "tmp_removed",
)
"""The counters a `StoreWriter` keeps, as `Recorder.stats()` names them."""


class InFlight:
    """Calls that entered the recording part of the wrapper and have not left it yet.

    `Recorder.stop()` waits (bounded) until every call that entered has left, so a call still
    inside the model at stop() is written too.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Zero calls in flight (a forked child: the parent's calls are not its own)."""
        self._entered = itertools.count()
        self._left = itertools.count()
        self.enter = self._entered.__next__
        """Counts a call in (the wrapper's hot path; the returned number is meaningless)."""
        self.leave = self._left.__next__
        """Counts a call out."""

    def wait(self, seconds: float) -> bool:
        """Waits until every call that entered has left, at most `seconds`.

        A count has no public read, so each check takes one more number from both counts:
        the two offsets are equal and cancel. `left` is read first, so a call entering between
        the two reads makes the check wait once more, never pass too early.

        Returns:
            True when no call was in flight, False when the time ran out first.
        """
        deadline = time.monotonic() + seconds
        while True:
            left = next(self._left)
            if next(self._entered) <= left:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)


class CallIds:
    """Call ids of one process: a random base in the high bits, a sequence number below.

    The hot path reads `base` and `seq` directly (``ids.base | next(ids.seq)``): a method call
    would cost more than the id itself.
    """

    def __init__(self) -> None:
        self.renew()

    def renew(self) -> None:
        """A new random base and sequence (a forked child must not reuse its parent's ids)."""
        self.base = call_id_base()
        self.seq = itertools.count()


class Counters:
    """What a recorder lost or changed, and why: counted, summed over start()/stop() rounds."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Every counter back to zero (a forked child counts its own calls)."""
        self.errors = 0
        """Failures of the recording itself (the model's call went on)."""
        self.sampled_out = 0
        """Calls left out by ``sample``."""
        self.oversized = 0
        """Calls with an argument too large to record leaf by leaf (summarised)."""
        self.unreadable = 0
        """Calls with an argument capture cannot flatten (an opaque leaf of its class)."""
        self._past: dict[str, int] = {}

    def retire(self, writer: StoreWriter) -> None:
        """Keeps a writer's counters before a new start() replaces it."""
        for name, value in _writer_counts(writer).items():
            self._past[name] = self._past.get(name, 0) + value

    def totals(self, writer: StoreWriter | None) -> dict[str, int]:
        """The writers' counters (`WRITER_COUNTS`): the current one's plus the retired ones'."""
        now = _writer_counts(writer) if writer is not None else {}
        return {k: self._past.get(k, 0) + now.get(k, 0) for k in WRITER_COUNTS}


def _writer_counts(w: StoreWriter) -> dict[str, int]:
    values = (
        w.recorded,
        w.dropped,
        w.write_errors,
        w.written_calls,
        w.files_written,
        w.bad_records,
        w.store_resets,
        w.tmp_removed,
    )
    return dict(zip(WRITER_COUNTS, values, strict=True))


class OnceLog:
    """Warnings given once per topic: a recorder in a server must not flood its log."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.topics: set[str] = set()

    def warn(self, topic: str, msg: str, *args: Any) -> None:
        """Logs `msg` (%-formatted with `args`) the first time `topic` comes up."""
        if topic not in self.topics:
            self.topics.add(topic)
            self.logger.warning(msg, *args)
