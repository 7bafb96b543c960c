"""Store files: which ones a reader sees, and what their Parquet footers say.

Shared by the reader (`capture.store`) and `capture.compaction`; imports pyarrow only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from capture import schema
from capture.errors import SchemaMismatch

__all__ = [
    "METADATA_REPLACES",
    "SIGNATURE_TOTALS",
    "list_files",
    "read_footer",
    "read_footers",
    "replaced_files",
]

METADATA_REPLACES = b"capture.replaces"
"""Parquet metadata key: JSON list of the base names (same folder) a compacted file replaces."""

SIGNATURE_TOTALS = """
    model, in_structure, out_structure, dims, out_dims,
    sum(calls)::BIGINT AS calls, sum(errors)::BIGINT AS errors,
    min(first_ts) AS first_ts, max(last_ts) AS last_ts,
    sum(duration_ns_sum)::BIGINT AS duration_ns_sum,
    min(duration_ns_min) AS duration_ns_min, max(duration_ns_max) AS duration_ns_max
"""
"""How stats rows of one signature merge (SQL select list, to `GROUP BY ALL`): the store's
``signatures`` view and `capture compact` both use it. Integer ranges merge item by item."""


def list_files(fs: pafs.FileSystem, root: str, table: str) -> list[pafs.FileInfo]:
    """The Parquet files of one table, temporary dot-files left out."""
    selector = pafs.FileSelector(f"{root}/{table}", recursive=True, allow_not_found=True)
    return [
        info
        for info in fs.get_file_info(selector)
        if info.type == pafs.FileType.File
        and info.base_name.endswith(".parquet")
        and not info.base_name.startswith(".")
    ]


def read_footer(fs: pafs.FileSystem, path: str) -> pq.FileMetaData | str:
    """The file's Parquet metadata, or why it cannot be read (truncated, not Parquet).

    Raises:
        SchemaMismatch: The file was written with a newer store schema than this library's.
    """
    try:
        with fs.open_input_file(path) as f:
            meta = pq.read_metadata(f)
    except Exception as e:  # truncated, empty, not Parquet: the caller skips it, says which
        return f"{type(e).__name__}: {e}"
    version = (meta.metadata or {}).get(schema.METADATA_SCHEMA_VERSION)
    if version is not None and int(version) > schema.SCHEMA_VERSION:
        raise SchemaMismatch(
            f"{path} was written with store schema v{int(version)}, this library reads "
            f"up to v{schema.SCHEMA_VERSION}; upgrade capture to read this store"
        )
    return meta


T = TypeVar("T")


def footer_threads(fs: pafs.FileSystem) -> int:
    """How many footers to read at once: many on object stores (each read is a round trip)."""
    if isinstance(fs, pafs.LocalFileSystem):
        return min(16, 4 * (os.cpu_count() or 1))
    return 64


def read_footers(
    fs: pafs.FileSystem,
    paths: Sequence[str],
    read: Callable[[pafs.FileSystem, str], T],
) -> list[T]:
    """`read(fs, path)` (e.g. `read_footer`) for every path, in order, many at a time.

    A store of 100,000 files read one footer after the other took minutes (issue 14); pyarrow
    releases the GIL while it reads, so a thread pool overlaps the reads (and the round trips
    of an object store). An exception raised by `read` is raised here.
    """
    if len(paths) < 8:
        return [read(fs, p) for p in paths]
    with ThreadPoolExecutor(footer_threads(fs), thread_name_prefix="capture-footer") as pool:
        return list(pool.map(lambda p: read(fs, p), paths))


def replaced_files(path: str, meta: pq.FileMetaData) -> set[str]:
    """Full paths of the files that the file at `path` replaces (`capture compact`)."""
    raw = (meta.metadata or {}).get(METADATA_REPLACES)
    if not raw:
        return set()
    folder = path.rsplit("/", 1)[0]
    return {f"{folder}/{name}" for name in json.loads(raw) if "/" not in name}
