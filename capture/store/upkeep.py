"""Upkeep: the compaction a recording process runs in the background, so no store needs an operator.

A store written by a fleet keeps a bounded number of files this way.

Every writer (`capture.record.writer.StoreWriter`) calls `after_flush` once a segment is in the
store. Once per `interval()` seconds (``CAPTURE_AUTO_COMPACT``, default 900; ``0`` or ``off``
turns it off) that starts, in a daemon thread of the process, the compaction `capture compact`
runs (`capture.store.compaction.compact_root`), under the same lock (``<store>/.compact.lock``):
of N processes recording into one store, one compacts at a time and the others find the lock
held and skip their turn. Each process's turns are spread at random over 0.8-1.2 intervals (its
first after 0.5-1 interval), so a fleet started at once does not list the store all together.

Everything compaction promises holds (DESIGN §5; `capture.store.compaction`): merged files are
complete before they are renamed into place, they claim the files they replace (readers count
each call once at any moment), and a process killed mid-way leaves a store the next compaction
finishes. The writer thread never waits for it: a flush only starts the thread.

What the store holds then, for N processes flushing every F seconds into one model: per day
folder, the merged calls files (up to 1,000,000 calls each) plus the flushes since the last
compaction (about N x interval / F) and each live writer's latest segment; one merged stats file
plus each live writer's rollup; one merged structures file plus the few written since. That is
O(N) files, not O(N x flushes). A calls row is rewritten at most once per turn until its merged
file holds 1,000,000 rows.

Imports pyarrow only (duckdb when a compaction merges stats rows).
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import shlex
import threading
import time

import pyarrow.fs as pafs

from capture.errors import CaptureError

__all__ = [
    "Upkeep",
    "after_flush",
    "compact_hint",
    "interval",
    "DEFAULT_INTERVAL_S",
    "EXIT_WAIT_S",
]

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 900.0
"""Seconds between a process's compactions of its store, unless ``CAPTURE_AUTO_COMPACT`` says."""

EXIT_WAIT_S = 10.0
"""Seconds a process that exits waits for a compaction it runs (then it is cut: crash-safe)."""


def interval() -> float | None:
    """Seconds between compactions (``CAPTURE_AUTO_COMPACT``), None when turned off.

    Raises:
        CaptureError: The variable is neither a number of seconds nor ``off``.

    Example:
        >>> interval() is None or interval() > 0
        True
    """
    text = os.environ.get("CAPTURE_AUTO_COMPACT", str(DEFAULT_INTERVAL_S)).strip().lower()
    if text in ("off", "0", "no", "false", ""):
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise CaptureError(
            f"CAPTURE_AUTO_COMPACT={text!r} is neither a number of seconds nor 'off'"
        ) from None
    return seconds if seconds > 0 else None


class Upkeep:
    """The background compactions of one store by this process."""

    def __init__(self, fs: pafs.FileSystem, root: str, every: float) -> None:
        self.fs, self.root, self.every = fs, root, every
        self.next_at = time.monotonic() + random.uniform(0.5, 1.0) * every
        self.thread: threading.Thread | None = None
        self.runs = 0
        """Compactions this process ran to the end."""
        self.skipped = 0
        """Turns given up because another process held the lock."""
        self.failures = 0
        self._warned = False

    def poke(self, now: float | None = None) -> bool:
        """Starts a compaction when one is due and none runs; whether it started one."""
        now = time.monotonic() if now is None else now
        if now < self.next_at or (self.thread is not None and self.thread.is_alive()):
            return False
        self.next_at = now + random.uniform(0.8, 1.2) * self.every
        self.thread = threading.Thread(target=self.run, name="capture-upkeep", daemon=True)
        self.thread.start()
        return True

    def run(self) -> None:
        """One compaction of the store (in the calling thread); never raises."""
        from capture.store.compaction import compact_root
        from capture.store.compaction_lock import LockHeld

        try:
            compact_root(self.fs, self.root, self.root)
            self.runs += 1
        except LockHeld:  # another process compacts now: this turn is its
            self.skipped += 1
        except Exception as e:  # a full disk, a broken file: the recording goes on
            self.failures += 1
            if not self._warned:
                self._warned = True
                logger.warning(
                    "capture: the background compaction of %s failed (%s); recording goes on, "
                    "later turns try again (run capture compact to see more)",
                    self.root,
                    " ".join(str(e).split())[:300],
                )

    def wait(self, seconds: float) -> None:
        """Waits at most `seconds` for a running compaction."""
        if self.thread is not None:
            self.thread.join(seconds)


_upkeeps: dict[tuple[str, str], Upkeep] = {}
_lock = threading.Lock()


def after_flush(fs: pafs.FileSystem, root: str) -> Upkeep | None:
    """Called by a writer after each segment: starts the store's compaction when it is due.

    Returns:
        The store's `Upkeep` in this process (None when turned off).
    """
    every = interval()
    if every is None:
        return None
    key = (fs.type_name, root)
    with _lock:
        upkeep = _upkeeps.get(key)
        if upkeep is None:
            upkeep = _upkeeps[key] = Upkeep(fs, root, every)
    upkeep.poke()
    return upkeep


def _at_exit() -> None:
    for upkeep in list(_upkeeps.values()):
        upkeep.wait(EXIT_WAIT_S)


def _forget_in_child() -> None:
    """A forked child runs no compaction of its parent's (its thread is not there)."""
    _upkeeps.clear()
    global _lock
    _lock = threading.Lock()


atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


_HINT_FILES = 1_000
_HINT_RATIO = 10
"""A table of at least `_HINT_FILES` files, `_HINT_RATIO` times what a compaction would leave,
gets the hint to compact (`compact_hint`)."""


def compact_hint(path: str, table: str, folders: dict[str, tuple[int, int]]) -> None:
    """Says, once per table on stderr (a log warning), when the table has many more files
    than a compaction would leave: every query pays for each file, `capture compact` once."""
    from capture.store.compaction import DEFAULT_TARGET_ROWS

    files = sum(n for n, _ in folders.values())
    leave = sum(max(1, -(-rows // DEFAULT_TARGET_ROWS)) for _, rows in folders.values())
    if files < _HINT_FILES or files < _HINT_RATIO * leave:
        return
    logger.warning(
        "capture: the store at %s holds %s %s files where a compaction would leave about "
        "%s; every first read opens each one: run `capture --store %s compact` once",
        path,
        f"{files:,}",
        table,
        f"{leave:,}",
        shlex.quote(path),
    )
