"""Output paths checked before the work that fills them; write errors said in one line.

A command that exports for minutes and then cannot write its result has wasted those minutes.
`check_file` (an artifact, a page) and `check_folder` (a store to record into or rewrite) look
at the place first: the folder exists and is a folder, a new file can be created there (one is
written and removed, so a read-only mount, an immutable folder and missing permissions are
met exactly as the real write would meet them, root included), and its filesystem has room for
the bytes the caller expects to write. `writing` turns an `OSError` met while writing anyway
(the disk filled up meanwhile) into the same kind of one-line error.

Every message names the path as the user gave it (``--out nowhere/x.pt2``) and the fix; the
error type is `capture.errors.OutputNotWritable`, which the CLI prints as one ``Error:`` line.
Only local paths are checked: a filesystem URI (``s3://...``) is left to its writer.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from capture.errors import OutputNotWritable

__all__ = ["check_file", "check_folder", "writing", "write_error", "is_local", "PROBE_BYTES"]

PROBE_BYTES = 64 * 1024
"""Bytes the check writes (and removes): a full filesystem fails on them as the real write would."""

_READ_ONLY = (errno.EROFS,)
_DENIED = (errno.EACCES, errno.EPERM)
_FULL = (errno.ENOSPC, errno.EDQUOT)


def is_local(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a local path (not a filesystem URI such as ``s3://bucket/x``).

    Example:
        >>> is_local("runs/prod"), is_local("s3://bucket/capture")
        (True, False)
    """
    return "://" not in os.fspath(path)


def _size(n: int) -> str:
    if n < 1024:
        return f"{n:,} bytes"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:,.1f} {unit}"


def _name(path: str, option: str | None) -> str:
    return f"{option} {path}" if option else f"cannot write {path}"


def _why(error: OSError, folder: str, name: str, what: str, in_place: bool = False) -> str:
    """One line for an `OSError` met writing into `folder`; `in_place`: the writer changes
    what is there (a store being compacted), so "elsewhere" is no fix."""
    code = error.errno
    other = " first" if in_place else f" or write the {what} elsewhere"
    alone = f"make it writable{other}" if in_place else f"write the {what} elsewhere"
    if code in _READ_ONLY:
        return f"{name}: {folder} is on a read-only filesystem; {alone}"
    if code in _DENIED:
        reason = os.strerror(code).lower() if code is not None else "not permitted"
        return f"{name}: the folder {folder} is not writable ({reason}); make it writable{other}"
    if code in _FULL:
        return f"{name}: no space left on the filesystem of {folder}; free some space{other}"
    if code == errno.ENOENT:
        return (
            f"{name}: the folder {folder} does not exist; create the folder first or write "
            f"the {what} elsewhere"
        )
    if code == errno.ENOTDIR:
        return f"{name}: part of {folder} is a file, not a folder; write the {what} elsewhere"
    reason = error.strerror or str(error)
    return f"{name}: cannot write in {folder} ({reason}); {alone}"


def _probe(folder: str, name: str, what: str, need: int, in_place: bool = False) -> None:
    """Creates, fills and removes one hidden file in `folder`; raises what the write would meet."""
    try:
        stat = os.statvfs(folder)
    except OSError:  # no statvfs here (another platform): the probe file still tells
        stat = None
    if stat is not None and need > 0:
        free = stat.f_bavail * stat.f_frsize
        if free < need:
            raise OutputNotWritable(
                f"{name}: the filesystem of {folder} has {_size(free)} free, the {what} needs "
                f"about {_size(need)}; free some space or write the {what} elsewhere"
            )
    fd = -1
    probe = None
    try:
        fd, probe = tempfile.mkstemp(prefix=".capture-write-check-", dir=folder)
        block = b"\0" * PROBE_BYTES
        os.write(fd, block)
    except OSError as e:
        raise OutputNotWritable(_why(e, folder, name, what, in_place)) from None
    finally:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
        if probe is not None:
            with contextlib.suppress(OSError):
                os.unlink(probe)


def _nearest_existing(path: Path) -> Path:
    """`path` or its nearest ancestor that exists (a file or a folder)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(os.sep)  # pragma: no cover - the root always exists


def check_file(
    path: str | os.PathLike[str],
    *,
    option: str | None = None,
    what: str = "file",
    example: str = "out",
    need: int = 0,
) -> str:
    """Checks that a file can be written at `path` (replacing one there), before any work.

    Args:
        path: The file to write.
        option: How the user gave it (``"--out"``), named in the message; default: the
            message says ``cannot write PATH``.
        what: What the file is, for the message (``"artifact"``, ``"page"``).
        example: A file name to suggest when `path` is a folder (``"model.pt2"``).
        need: Bytes the write is expected to take; the filesystem must have them free.

    Returns:
        The path, as given (a string).

    Raises:
        OutputNotWritable: `path` is a folder; its folder is missing, is a file, is read-only
            or immutable; or its filesystem is full (or has less than `need` bytes free).

    Example:
        >>> check_file("report.html", option="--out", what="page")
        'report.html'
    """
    text = os.fspath(path)
    if not is_local(text):
        return text
    name = _name(text, option)
    target = Path(text)
    if target.is_dir():
        suggestion = f"{option} {target / example}" if option else str(target / example)
        given = f"{option} {text}" if option else text
        raise OutputNotWritable(f"{given} is a folder; name the {what} to write, e.g. {suggestion}")
    folder = target.parent
    if not folder.is_dir():
        existing = _nearest_existing(folder)
        if existing.is_dir():
            raise OutputNotWritable(
                f"{name}: the folder {folder} does not exist; create the folder first or write "
                f"the {what} elsewhere"
            )
        raise OutputNotWritable(
            f"{name}: {existing} is a file, not a folder; write the {what} elsewhere"
        )
    _probe(str(folder), name, what, need)
    return text


def check_folder(
    path: str | os.PathLike[str],
    *,
    option: str | None = None,
    what: str = "store",
    created: bool = True,
) -> str:
    """Checks that files can be written in the folder `path`, created with its parents if missing.

    Args:
        path: The folder (a store) to write into.
        option: How the user gave it (``"--store"``), named in the message.
        what: What the folder is, for the message.
        created: The writer creates a missing folder (with its parents): it is checked at its
            nearest existing ancestor. False: the writer changes what is there (compaction):
            a missing folder is not checked (its reader says "no store at ..."), and the fix
            is to make the folder writable or free space first, not to write elsewhere.

    Returns:
        The path, as given.

    Raises:
        OutputNotWritable: `path` (or one of its parents) is a file, or the folder that would
            hold the new files is read-only, immutable or on a full filesystem.

    Example:
        >>> check_folder(".", option="--store")
        '.'
    """
    text = os.fspath(path)
    if not is_local(text):
        return text
    name = _name(text, option)
    existing = _nearest_existing(Path(text))
    if not created and existing != Path(text):
        return text
    if not existing.is_dir():
        if existing == Path(text):
            raise OutputNotWritable(f"{text} is a file, not a {what}; pass a folder as {option}")
        raise OutputNotWritable(
            f"{name}: {existing} is a file, not a folder; write the {what} elsewhere"
        )
    _probe(str(existing), name, what, 0, in_place=not created)
    return text


def write_error(
    error: OSError, path: str | os.PathLike[str], *, option: str | None = None, what: str = "file"
) -> OutputNotWritable:
    """The one-line `OutputNotWritable` for an `OSError` met writing `path` (to raise ``from``
    the error).

    Example:
        >>> import errno
        >>> str(write_error(OSError(errno.EROFS, "Read-only file system"), "/mnt/x.pt2"))
        'cannot write /mnt/x.pt2: /mnt is on a read-only filesystem; write the file elsewhere'
    """
    text = os.fspath(path)
    return OutputNotWritable(_why(error, str(Path(text).parent), _name(text, option), what))


@contextlib.contextmanager
def writing(
    path: str | os.PathLike[str], *, option: str | None = None, what: str = "file"
) -> Iterator[None]:
    """Turns an `OSError` raised while writing `path` into `OutputNotWritable` (one line).

    Example:
        >>> with writing("notes.txt", what="notes"):
        ...     _ = Path("notes.txt").write_text("seen")
        >>> Path("notes.txt").unlink()
    """
    try:
        yield
    except OSError as e:
        raise write_error(e, path, option=option, what=what) from e
