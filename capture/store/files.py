"""Store files: how a store URI becomes a filesystem, safe file names, complete Parquet files.

The writer (`capture.record.writer`), the readers (`capture.store.reader`, `capture.store.layout`,
`capture.store.compaction`, `capture.store.payload_files`) and the CLI share these helpers; this
module imports pyarrow only, so no reader imports the recording module.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from capture import schema

__all__ = [
    "OBJECT_STORES",
    "library_version",
    "model_folder",
    "resolve_store",
    "safe_name",
    "vanished",
    "write_parquet",
]

_MAX_NAME = 200  # bytes of a file-name component; most file systems allow 255


def library_version() -> str:
    """The installed version of this package ('0+unknown' from a source tree)."""
    try:
        from importlib.metadata import version

        return version("capture")
    except Exception:  # not installed (running from a checkout)
        return "0+unknown"


def resolve_store(
    store: str | os.PathLike[str], filesystem: pafs.FileSystem | None = None
) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and root path for a local directory or a filesystem URI.

    Args:
        store: A directory, a URI such as ``s3://bucket/prefix``, or (with `filesystem`) the
            store's path on that filesystem.
        filesystem: A `pyarrow.fs.FileSystem` already configured by the caller (endpoint,
            credentials); `store` is then a path on it, used as given.

    Returns:
        ``(filesystem, root)``; the root has no trailing slash.

    Raises:
        StoreNotFound: The URI cannot be opened (unknown scheme, bad option); one line.
    """
    text = os.fspath(store)
    if filesystem is not None:
        if isinstance(filesystem, pafs.LocalFileSystem):
            return filesystem, os.path.abspath(text)
        return filesystem, text.rstrip("/")
    if "://" in text:
        from capture.store.remote import bounded, invalid_uri, store_error

        try:
            fs, root = pafs.FileSystem.from_uri(text)
        except pa.ArrowInvalid as e:  # pyarrow's type for a URI it cannot parse (#14)
            raise invalid_uri(text, e) from None
        except OSError as e:  # the filesystem behind the URI cannot be set up
            raise store_error(text, e) from None
        return bounded(fs), root.rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(text)


def vanished(fs: pafs.FileSystem, path: str, error: BaseException) -> bool:
    """Whether `error`, met reading `path`, means the file is gone (deleted since it was listed).

    Decided from facts, not from the message: a `FileNotFoundError`, or any other `OSError`
    after which the filesystem finds nothing at `path` (an S3 object deleted after it was
    opened fails its read with a plain `OSError`). A file still there, or a
    filesystem that cannot answer, means the error is something else.

    Args:
        fs: The store's filesystem.
        path: The file that was being read.
        error: What reading it raised.

    Returns:
        True when the file no longer exists.

    Example:
        >>> vanished(pafs.LocalFileSystem(), "/no/such/file", FileNotFoundError())
        True
    """
    if isinstance(error, FileNotFoundError):
        return True
    if not isinstance(error, OSError):
        return False
    try:
        return bool(fs.get_file_info(path).type == pafs.FileType.NotFound)
    except OSError:  # the filesystem cannot say (unreachable): not known to be gone
        return False


OBJECT_STORES = frozenset({"s3", "gcs"})
"""pyarrow filesystem types whose objects become visible only once completely uploaded."""


def write_parquet(
    fs: pafs.FileSystem,
    folder: str,
    name: str,
    table: pa.Table | Iterable[pa.Table],
    kind: str,
    extra_metadata: dict[bytes, bytes] | None = None,
) -> str:
    """Writes `table` as ``folder/name`` through a temporary dot-file and a rename.

    `table` may be an iterable of tables of the `kind`'s schema, written one row group (or
    more) each, so a merged file never needs all its rows in memory at once.
    """
    meta = {
        schema.METADATA_SCHEMA_VERSION: str(schema.SCHEMA_VERSION).encode(),
        schema.METADATA_LIBRARY_VERSION: library_version().encode(),
        schema.METADATA_KIND: kind.encode(),
        **(extra_metadata or {}),
    }
    final = f"{folder}/{name}"

    def write(sink: Any) -> None:
        if isinstance(table, pa.Table):
            pq.write_table(table.replace_schema_metadata(meta), sink, compression="zstd")
        else:
            target = schema.SCHEMAS[kind].with_metadata(meta)
            with pq.ParquetWriter(sink, target, compression="zstd") as out:
                for part in table:
                    out.write_table(part.cast(target))

    if fs.type_name in OBJECT_STORES:
        # An object appears whole when its upload completes, and a rename there is a copy then
        # a delete (twice the traffic, and a window with both names): the complete file is built
        # in memory and written under its final name in one upload.
        buffer = pa.BufferOutputStream()
        write(buffer)
        with fs.open_output_stream(final) as sink:
            sink.write(buffer.getvalue())
        return final
    fs.create_dir(folder, recursive=True)
    tmp = f"{folder}/.{name}.tmp"
    try:
        with fs.open_output_stream(tmp) as sink:
            write(sink)
        fs.move(tmp, final)
    except BaseException:
        try:
            fs.delete_file(tmp)
        except Exception:  # the temporary file may not exist; the original error matters
            pass
        raise
    return final


def safe_name(value: str) -> str:
    """`value` safe as a directory or file name part (hive partition values, host names).

    A long value is cut and ends with a hash of the whole of it, so that it stays distinct and
    within file systems' 255-byte limit (a 300-character model name dropped every call).
    """
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in value)
    if len(safe.encode()) > _MAX_NAME:
        digest = hashlib.sha256(value.encode(errors="surrogatepass")).hexdigest()[:16]
        safe = safe.encode()[: _MAX_NAME - 17].decode(errors="ignore") + "-" + digest
    return safe or "_"


def model_folder(model_name: str) -> str:
    """The ``model=<m>`` folder name of a model (the full name stays in the `model` column)."""
    return f"model={safe_name(model_name)}"
