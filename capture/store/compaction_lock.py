"""The lock of `capture.compact`: one compaction at a time per store, stale locks taken over.

``<store>/.compact.lock`` notes host, pid and start time (JSON). The store is data written by
others, so on a local disk the lock is only ever opened without following a link and without
blocking (``O_NOFOLLOW | O_NONBLOCK | O_NOCTTY``), checked to be a regular file on the open
descriptor (`BadLock` names anything else: a link, a FIFO, a folder, a device), and read for at
most `MAX_NOTE` bytes: a FIFO cannot hang the compaction, a link cannot make it read outside
the store, a huge (sparse) file is not read whole. Imports pyarrow only.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import stat
import time

import pyarrow.fs as pafs

from capture import untrusted
from capture.errors import CaptureError

__all__ = ["CompactionLock", "LockHeld", "BadLock", "LOCK_NAME", "STALE_LOCK_S", "MAX_NOTE"]

LOCK_NAME = ".compact.lock"
_UNREADABLE = "its note is unreadable"
_UNREADABLE_STALE_S = 60.0

STALE_LOCK_S = float(os.environ.get("CAPTURE_COMPACT_LOCK_TTL", str(6 * 3600)))
"""Age (seconds) after which a lock of another host is taken as left by a dead compaction."""

MAX_NOTE = 4096
"""Bytes of a lock's note read at most (a note is about 80); a longer one is unreadable."""

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class LockHeld(CaptureError):
    """Another compaction holds the store's lock."""


class BadLock(CaptureError):
    """Something that is not a lock file (a link, a FIFO, a folder, a device) sits at the
    lock's path; the message names it and the fix."""


def _bad_lock(path: str, kind: str) -> BadLock:
    return BadLock(
        f"{path} is {kind}, not a lock file capture writes (compaction follows no link and "
        f"waits on nothing in a store); remove it (rm -r {shlex.quote(path)}) and compact again"
    )


def read_note(path: str) -> bytes | None:
    """The first `MAX_NOTE` bytes + 1 of the local lock file at `path` (None: there is none).

    Raises:
        BadLock: `path` is a symbolic link or not a regular file.

    Example:
        >>> read_note("/nonexistent/.compact.lock") is None
        True
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError:
        if os.path.islink(path):  # O_NOFOLLOW: ELOOP (EMLINK on some systems)
            raise _bad_lock(path, "a symbolic link") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise _bad_lock(path, kind)
        chunks: list[bytes] = []
        left = MAX_NOTE + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _stale(note: bytes) -> str | None:
    """Why the lock holding `note` is stale (its process is dead, or it is too old), or None.

    A lock of this host is stale when its pid no longer runs (a SIGKILLed compaction);
    another host's pid cannot be checked, so its lock is stale only after `STALE_LOCK_S`.
    An unreadable note (empty: killed while writing it) is stale once a minute old.
    """
    try:
        if len(note) > MAX_NOTE:
            raise ValueError("longer than a note")
        held = untrusted.loads(note)
        host, pid, since = str(held["host"])[:255], int(held["pid"]), float(held["since"])
    except (ValueError, KeyError, TypeError, OverflowError):
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
            # O_EXCL: anything at the path (a link too, even a dangling one) is not ours
            flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_NOCTTY
            fd = os.open(self.path, flags, 0o644)
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
        """The lock's note (`read_note` on a local disk), None when it cannot be read.

        Raises:
            BadLock: Not a regular file (local disks).
        """
        if isinstance(self.fs, pafs.LocalFileSystem):
            try:
                return read_note(path)
            except BadLock:
                raise
            except OSError:
                return None
        try:
            with self.fs.open_input_stream(path) as f:
                data: bytes = f.read(MAX_NOTE + 1)
                return data
        except (FileNotFoundError, OSError):
            return None

    def _describe(self) -> str:
        note = self._read(self.path)
        try:
            if note is None or len(note) > MAX_NOTE:
                raise ValueError("no note")
            held = untrusted.loads(note)
            age = time.time() - float(held["since"])
            return f"host {str(held['host'])[:255]}, pid {str(held['pid'])[:20]}, for {age:.0f} s"
        except (ValueError, KeyError, TypeError, OverflowError):
            return "no readable note"

    def _take_over(self) -> bool:
        """Removes the lock if it is stale; whether it did (then the caller creates it again)."""
        note = self._read(self.path)
        if note is None:
            return True  # released meanwhile
        reason = _stale(note)
        if reason == _UNREADABLE:  # maybe being written right now: stale only when old
            if isinstance(self.fs, pafs.LocalFileSystem):  # the lock itself, not a link's target
                try:
                    age = time.time() - os.lstat(self.path).st_mtime
                except FileNotFoundError:
                    return True  # released meanwhile
            else:
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
        moved = read_note(aside)
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
