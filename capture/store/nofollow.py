"""Local store files listed, opened and deleted without following a symbolic link.

A store is data written by others (DESIGN §5b): a link planted under it must not make a reader
read, or `capture payloads --delete-all` delete, a file outside it (the recursive
`pyarrow.fs.FileSelector` follows links). Three operations, for local disks (object stores
have no links):

- `walk`: the regular files under a folder, by ``os.scandir`` without following any link;
  every link met is reported, never entered;
- `open_under` and `unlink_under`: a file inside a root opened or deleted through a chain of
  directory descriptors, each folder below the root opened with ``O_NOFOLLOW`` and the file
  itself with ``O_NOFOLLOW`` (a link swapped in after the listing fails instead of being
  followed). The root is the caller's choice and may itself be a link.

Imports the standard library only.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Walk", "walk", "open_under", "unlink_under", "LINK_REASON"]

LINK_REASON = "a symbolic link; a store is read without following links"

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted as a file must not block the open
_DIR_FD = os.open in os.supports_dir_fd and os.unlink in os.supports_dir_fd and _NOFOLLOW != 0


@dataclass
class Walk:
    """What `walk` found under a folder."""

    files: list[tuple[str, os.stat_result]] = field(default_factory=list)
    """Regular files kept by the filter, with their ``lstat``, sorted by path."""
    links: list[str] = field(default_factory=list)
    """Symbolic links met (files or folders), never followed."""
    unlistable: list[tuple[str, str]] = field(default_factory=list)
    """Folders that could not be listed, and why."""


def walk(top: str, keep: Callable[[str], bool]) -> Walk:
    """The regular files under `top` whose name `keep` accepts; links reported, not followed.

    Args:
        top: The folder to walk (a missing one holds nothing).
        keep: Takes a file's base name, says whether it is wanted.

    Returns:
        A `Walk`.

    Example:
        >>> walk("/no/such/folder", lambda name: True).files
        []
    """
    found = Walk()
    if os.path.islink(top):
        found.links.append(top)
        return found
    pending = [top]
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            found.unlistable.append((folder, f"cannot be listed ({type(e).__name__})"))
            continue
        for entry in entries:
            path = f"{folder}/{entry.name}"
            if entry.is_symlink():
                found.links.append(path)
            elif entry.is_dir(follow_symlinks=False):
                pending.append(path)
            elif entry.is_file(follow_symlinks=False) and keep(entry.name):
                try:
                    found.files.append((path, entry.stat(follow_symlinks=False)))
                except FileNotFoundError:  # deleted since the folder was read
                    continue
    found.files.sort(key=lambda item: item[0])
    return found


def _inside(root: str, path: str) -> list[str]:
    """The components of `path` below `root`; raises when it is not strictly inside."""
    rel = os.path.relpath(path, root)
    parts = rel.split(os.sep)
    if os.path.isabs(rel) or any(p in ("", ".", "..") for p in parts):
        raise PermissionError(f"{path} is not inside {root}")
    return parts


def _parent(root: str, parts: list[str]) -> int:
    """A descriptor of the folder holding ``root/parts...``, no link followed below `root`."""
    fd = os.open(root, os.O_RDONLY | _DIRECTORY)
    try:
        for part in parts[:-1]:
            below = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd


def _no_link_on_the_way(root: str, parts: list[str]) -> None:
    """Without descriptor-relative calls (not POSIX): each component checked with ``lstat``."""
    path = root
    for part in parts:
        path = os.path.join(path, part)
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise PermissionError(f"{path}: {LINK_REASON}")


def open_under(root: str, path: str) -> io.BufferedReader:
    """Opens the regular file `path`, inside `root`, for reading; no link below `root` followed.

    Args:
        root: The store's root (trusted: the caller's choice).
        path: A file inside it.

    Returns:
        A binary file object (the caller closes it).

    Raises:
        OSError: The file is missing, is or lies behind a symbolic link, is not a regular
            file, or is not inside `root`.

    Example:
        >>> open_under("/tmp", "/etc/passwd")  # doctest: +SKIP
        Traceback (most recent call last):
        PermissionError: /etc/passwd is not inside /tmp
    """
    parts = _inside(root, path)
    if _DIR_FD:
        parent = _parent(root, parts)
        try:
            fd = os.open(parts[-1], os.O_RDONLY | _NOFOLLOW | _NONBLOCK, dir_fd=parent)
        finally:
            os.close(parent)
    else:
        _no_link_on_the_way(root, parts)
        fd = os.open(path, os.O_RDONLY | _NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PermissionError(f"{path} is not a regular file")
    return os.fdopen(fd, "rb")


def unlink_under(root: str, path: str) -> None:
    """Deletes `path`, inside `root`, through no link (a link itself is never deleted either).

    Args:
        root: The store's root.
        path: A file inside it.

    Raises:
        OSError: The file is missing, is or lies behind a symbolic link, or is not inside
            `root`.

    Example:
        >>> unlink_under("/tmp", "/tmp/../etc/passwd")  # doctest: +SKIP
        Traceback (most recent call last):
        PermissionError: /tmp/../etc/passwd is not inside /tmp
    """
    parts = _inside(root, path)
    if not _DIR_FD:
        _no_link_on_the_way(root, parts)
        os.unlink(path)
        return
    parent = _parent(root, parts)
    try:
        if not stat.S_ISREG(os.lstat(parts[-1], dir_fd=parent).st_mode):
            raise PermissionError(f"{path} is not a regular file")
        os.unlink(parts[-1], dir_fd=parent)
    finally:
        os.close(parent)
