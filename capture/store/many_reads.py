"""Reading many store files at once: one thread on a local disk until reads wait on it, a
thread pool on object stores (each read a round trip). Imports pyarrow only."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pyarrow.fs as pafs

__all__ = ["footer_threads", "read_footers"]

T = TypeVar("T")


def footer_threads(fs: pafs.FileSystem) -> int:
    """How many files to read at once when reads wait: many on object stores (each read is a
    round trip), a few on a local disk whose files are not in memory."""
    if isinstance(fs, pafs.LocalFileSystem):
        return min(16, 4 * (os.cpu_count() or 1))
    return 64


def read_footers(
    fs: pafs.FileSystem,
    paths: Sequence[str],
    read: Callable[[pafs.FileSystem, str], T],
    decodes: bool = False,
) -> list[T]:
    """`read(fs, path)` (e.g. `read_footer`) for every path, in order.

    On an object store, many at a time (a thread pool overlaps the round trips). On a local
    disk a footer's check is mostly Python holding the GIL: threads contend for it and cost
    more than they save (10,000 footers from the page cache: 0.21 ms a file in one thread,
    0.27 ms of wall and 0.37 ms of CPU in two), so the files are read in this thread, one block
    at a time, until a block shows its reads waiting on the disk (wall time over
    `_WAITING` times this thread's CPU time); the rest then goes to the pool. Reads that
    `decodes` rows (pyarrow decodes without the GIL) use one thread per core.
    An exception raised by `read` is raised here.
    """
    if len(paths) < 8:
        return [read(fs, p) for p in paths]
    done: list[T] = []
    threads = footer_threads(fs)
    if isinstance(fs, pafs.LocalFileSystem):
        if decodes:
            threads = os.cpu_count() or 1
        else:
            while len(done) < len(paths):
                block = paths[len(done) : len(done) + _BLOCK]
                wall, cpu = time.perf_counter(), time.thread_time()
                done.extend(read(fs, p) for p in block)
                if time.perf_counter() - wall > _WAITING * (time.thread_time() - cpu):
                    break
    rest = paths[len(done) :]
    if len(rest) < 8 or threads == 1:
        return done + [read(fs, p) for p in rest]
    # a few files per task: a future per file cost as much as a small file's check
    step = max(1, min(_PER_TASK, len(rest) // (4 * threads)))
    chunks = [rest[i : i + step] for i in range(0, len(rest), step)]
    with ThreadPoolExecutor(threads, thread_name_prefix="capture-footer") as pool:
        read_chunks = pool.map(lambda chunk: [read(fs, p) for p in chunk], chunks)
        return done + [one for chunk in read_chunks for one in chunk]


_PER_TASK = 32
"""Most files one task of `read_footers` reads."""
_BLOCK = 512
"""Files a local read takes in this thread before it checks whether they waited on the disk."""
_WAITING = 2.0
"""A local block waited on the disk when its wall time passed this many times its CPU time."""
