"""Progress of long commands on stderr: a live line on a terminal, a log line elsewhere.

A command that takes seconds (``capture report``, ``export``, ``compact``) says what it is doing
on one self-overwriting stderr line with the elapsed time, and erases that line when done. When
stderr is not a terminal (a pipe, a log file, a cron job) a command that runs longer than
`LOG_EVERY_S` writes one plain line per `LOG_EVERY_S` (what it does, the elapsed time), so a
20-minute compaction in a nightly job shows where it is; short runs write nothing, so captured
output stays clean. stdout is never touched.

    with Progress("report") as progress:
        progress.phase("reading the store")
        ...
        for i, group in enumerate(groups):
            progress.phase("plotting", i + 1, len(groups))
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

__all__ = ["Progress", "LOG_EVERY_S"]

_REFRESH_S = 0.25
LOG_EVERY_S = 30.0
"""Off a terminal: the seconds between two plain progress lines (none before the first)."""


class Progress:
    """One stderr status line, redrawn while a phase runs; off a terminal, a line now and then.

    Args:
        label: What runs (``report``, ``export``), shown first on the line.
        stream: Where to write; default `sys.stderr` at entry.
        enabled: Force the live line on or off; default: whether `stream` is a terminal.
        log_every: Off a terminal, seconds between plain lines (default `LOG_EVERY_S`; None:
            never).

    Example:
        >>> with Progress("compact", enabled=False) as progress:
        ...     progress.phase("merging calls files", 3, 10)
    """

    def __init__(
        self,
        label: str,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        log_every: float | None = LOG_EVERY_S,
    ):
        self.label = label
        self._log_every = log_every
        self._logged = 0.0
        self._stream = stream
        self._enabled = enabled
        self._message = ""
        self._start = 0.0
        self._width = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        """Whether the live (terminal) line is drawn."""
        return bool(self._enabled)

    def __enter__(self) -> Progress:
        stream = self._stream if self._stream is not None else sys.stderr
        self._stream = stream
        if self._enabled is None:
            isatty = getattr(stream, "isatty", None)
            self._enabled = bool(isatty and isatty())
        self._start = time.monotonic()
        self._logged = self._start
        if self._enabled or self._log_every is not None:
            # A thread keeps the elapsed time moving while one long call runs (an export).
            self._thread = threading.Thread(target=self._tick, name="capture-progress", daemon=True)
            self._thread.start()
        return self

    def phase(self, message: str, done: int | None = None, total: int | None = None) -> None:
        """Shows what runs now, with ``done/total`` when given.

        Args:
            message: What the command does now (``reading the store``).
            done: Items finished so far.
            total: Items in all.
        """
        if done is not None and total:
            message = f"{message} {done}/{total}"
        with self._lock:
            self._message = message
        self._draw()

    def _tick(self) -> None:
        while not self._stop.wait(_REFRESH_S):
            self._draw()

    def _draw(self) -> None:
        if not self._enabled:
            self._log()
            return
        if self._stream is None:
            return
        with self._lock:
            elapsed = time.monotonic() - self._start
            text = f"{self.label}: {self._message} ({elapsed:.1f} s)"
            pad = max(0, self._width - len(text))
            self._width = len(text)
            try:
                self._stream.write("\r" + text + " " * pad)
                self._stream.flush()
            except (OSError, ValueError):  # a closed terminal must not fail the command
                self._enabled = False

    def _log(self) -> None:
        """Off a terminal: one plain line when `log_every` seconds passed since the last one."""
        if self._log_every is None or self._stream is None:
            return
        with self._lock:
            now = time.monotonic()
            if now - self._logged < self._log_every:
                return
            self._logged = now
            try:
                self._stream.write(f"{self.label}: {self._message} ({now - self._start:.0f} s)\n")
                self._stream.flush()
            except (OSError, ValueError):  # a closed log must not fail the command
                self._log_every = None

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._enabled and self._stream is not None:
            with self._lock:
                try:
                    self._stream.write("\r" + " " * self._width + "\r")
                    self._stream.flush()
                except (OSError, ValueError):
                    pass
