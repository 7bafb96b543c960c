"""Opening a store: its filesystem and root, checked to be a store's folder, in bounded time.

Shared by the reader, compaction and the payload commands (`capture.store.layout` re-exports
`open_root`). Imports pyarrow only.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pafs

from capture import schema
from capture.errors import StoreNotFound
from capture.store.files import resolve_store

__all__ = ["open_root"]


def open_root(store: str | os.PathLike[str], missing: str) -> tuple[pafs.FileSystem, str]:
    """The store's filesystem and root, checked to be a directory.

    Args:
        store: A directory or a pyarrow filesystem URI.
        missing: The end of the message when nothing is there (what to do next).

    Raises:
        StoreNotFound: The URI cannot be opened (unknown scheme, no network, no credentials)
            or nothing is at `store`; one line.
    """
    text = os.fspath(store)

    def look() -> tuple[pafs.FileSystem, str, pafs.FileType]:
        fs, root = resolve_store(text)
        return fs, root, fs.get_file_info(root).type

    try:
        if "://" in text:  # a remote store answers in bounded time, whatever its client does
            from capture.store.remote import within

            fs, root, kind = within(text, look)
        else:
            fs, root, kind = look()
    except OSError as e:  # unreachable endpoint, access denied, missing bucket
        from capture.store.remote import store_error

        raise store_error(text, e) from None
    except (ValueError, pa.ArrowException) as e:
        raise StoreNotFound(
            f"cannot open the store {text}: {_one_line(str(e))}; check the path or URI, the "
            "network and credentials, or pass another --store"
        ) from None
    if kind == pafs.FileType.File:
        raise StoreNotFound(
            f"{text} is a file, not a store; a store is the folder capture.Recorder writes "
            "(e.g. ./capture-store): pass that folder as --store"
        )
    if kind != pafs.FileType.Directory:
        raise StoreNotFound(f"no store at {text}; {missing}")
    outer = _enclosing_store(fs, root, text)
    if outer is not None:
        raise StoreNotFound(
            f"{text} is inside the store at {outer}, not a store itself; pass the store's "
            f"folder: --store {outer}"
        )
    return fs, root


def _enclosing_store(fs: pafs.FileSystem, root: str, text: str) -> str | None:
    """The store `root` lies inside (``capture-store/calls/model=m``), as the user spelled it;
    None when `root` is not in a table's folder or is itself a store.

    Only a path with a table's name (``calls``, ``stats``, ``structures``) in it is looked at,
    so opening a store costs no extra listing (one stat each on an object store otherwise).
    """
    parts = root.rstrip("/").split("/")
    tables = [i for i, part in enumerate(parts) if part in schema.TABLES and i > 0]
    if not tables:
        return None
    if any(fs.get_file_info(f"{root}/{t}").type == pafs.FileType.Directory for t in schema.TABLES):
        return None  # a store that happens to live in a folder named calls, stats, ...
    i = tables[-1]
    outer = "/".join(parts[:i])
    found = [
        fs.get_file_info(f"{outer}/{t}").type == pafs.FileType.Directory for t in schema.TABLES
    ]
    if sum(found) < 2:  # a store has at least its structures and stats folders
        return None
    depth = len(parts) - i  # as many folders up as the user went down
    spelled = text.rstrip("/")
    for _ in range(depth):
        spelled = spelled.rsplit("/", 1)[0] if "/" in spelled else "."
    return spelled


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 200 else line[:197] + "..."
