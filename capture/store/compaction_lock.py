"""The lock of `capture.compact`: one compaction at a time per store, stale locks taken over.

``<store>/.compact.lock`` notes host, pid and start time (JSON). Imports pyarrow only.
"""

from __future__ import annotations

import json
import os
import socket
import time

import pyarrow.fs as pafs

from capture.errors import CaptureError

__all__ = ["CompactionLock", "LockHeld", "LOCK_NAME", "STALE_LOCK_S"]

LOCK_NAME = ".compact.lock"
_UNREADABLE = "its note is unreadable"
_UNREADABLE_STALE_S = 60.0

STALE_LOCK_S = float(os.environ.get("CAPTURE_COMPACT_LOCK_TTL", str(6 * 3600)))
"""Age (seconds) after which a lock of another host is taken as left by a dead compaction."""


class LockHeld(CaptureError):
    """Another compaction holds the store's lock."""


def _stale(note: bytes) -> str | None:
    """Why the lock holding `note` is stale (its process is dead, or it is too old), or None.

    A lock of this host is stale when its pid no longer runs (a SIGKILLed compaction);
    another host's pid cannot be checked, so its lock is stale only after `STALE_LOCK_S`.
    An unreadable note (empty: killed while writing it) is stale once a minute old.
    """
    try:
        held = json.loads(note)
        host, pid, since = str(held["host"]), int(held["pid"]), float(held["since"])
    except (ValueError, KeyError, TypeError):
        return _UNREADABLE
    age = time.time() - since
    if host == socket.gethostname():
        if pid == os.getpid():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"process {pid} on {host} is gone"
        except PermissionError:  # runs, as another user
            return None
        return None
    if age > STALE_LOCK_S:
        return f"held by {host} pid {pid} for {age:.0f} s (more than {STALE_LOCK_S:.0f} s)"
    return None


class CompactionLock:
    """``<store>/.compact.lock``, created exclusively (local disks) or checked then created.

    The lock file notes host, pid and time. A stale lock (`_stale`) is taken over: on a local
    disk it is renamed away (atomic: of two compactions taking it over, one wins the rename),
    checked to be the very lock judged stale (else put back), and the lock is created again.
    """

    def __init__(self, fs: pafs.FileSystem, root: str, dry_run: bool) -> None:
        self.fs, self.path, self.dry_run = fs, f"{root}/{LOCK_NAME}", dry_run
        self.took_over: str | None = None
        """Why a stale lock was taken over (None: there was none)."""

    def __enter__(self) -> None:
        if self.dry_run:
            return
        note = json.dumps(
            {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        ).encode()
        for _ in range(2):  # the second round after taking a stale lock over
            try:
                self._create(note)
                return
            except FileExistsError:
                if not self._take_over():
                    break
        raise LockHeld(
            f"another compaction holds {self.path} ({self._describe()}); wait for it to finish"
        ) from None

    def _create(self, note: bytes) -> None:
        if isinstance(self.fs, pafs.LocalFileSystem):
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(note)
            except OSError:  # a full disk: no lock without its note is left behind
                os.unlink(self.path)
                raise
            return
        if self.fs.get_file_info(self.path).type != pafs.FileType.NotFound:
            raise FileExistsError(self.path)
        with self.fs.open_output_stream(self.path) as f:
            f.write(note)

    def _read(self, path: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(path) as f:
                data: bytes = f.read()
                return data
        except (FileNotFoundError, OSError):
            return None

    def _describe(self) -> str:
        note = self._read(self.path)
        try:
            held = json.loads(note or b"")
            age = time.time() - float(held["since"])
            return f"host {held['host']}, pid {held['pid']}, for {age:.0f} s"
        except (ValueError, KeyError, TypeError):
            return "no readable note"

    def _take_over(self) -> bool:
        """Removes the lock if it is stale; whether it did (then the caller creates it again)."""
        note = self._read(self.path)
        if note is None:
            return True  # released meanwhile
        reason = _stale(note)
        if reason == _UNREADABLE:  # maybe being written right now: stale only when old
            modified = self.fs.get_file_info(self.path).mtime
            age = time.time() - modified.timestamp() if modified is not None else 0.0
            reason = reason if age > _UNREADABLE_STALE_S else None
        if reason is None:
            return False
        if not isinstance(self.fs, pafs.LocalFileSystem):
            self.fs.delete_file(self.path)
            self.took_over = reason
            return True
        aside = f"{self.path}.stale-{socket.gethostname()}-{os.getpid()}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return True  # another compaction took it first: race for the new lock
        with open(aside, "rb") as f:
            moved = f.read()
        if moved != note:  # we moved a fresh lock another compaction had just created
            os.rename(aside, self.path)
            return False
        os.unlink(aside)
        self.took_over = reason
        return True

    def __exit__(self, *exc: object) -> None:
        if not self.dry_run:
            try:
                self.fs.delete_file(self.path)
            except FileNotFoundError:  # removed by hand meanwhile: nothing left to release
                pass
