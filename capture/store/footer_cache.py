"""A reader's cache of checked store files: each file's verdict and the rows of small files.

Opening a store checks every file (`capture.store.layout.read_footer`) and reads the rows of the
small stats and structures files; at 100,000 files that is minutes, every time.
Store files are never written again under the same name, so what a check found stays true as
long as the file is the same file. The cache keeps, per table, the verdict of each file
(`FileInfo` or `Skip`) under its *stamp* (`capture.store.layout.list_files`: size and modification
time; on a local disk also inode and change time, which nobody can set back) and, for stats
and structures, the rows of the files that passed. An entry is used only when the listed
file's stamp is exactly the cached one; any other file is read and checked again, so a
changed, replaced or new file never gets an old verdict. The ``capture.replaces`` claims are
verified again at every open (`capture.store.claims`), from the cached verdicts.

The cache lives outside the store, in ``$CAPTURE_CACHE_DIR`` (default
``$XDG_CACHE_HOME/capture`` or ``~/.cache/capture``; ``off`` disables it), written only by this
user's readers: a store is data written by others and is never trusted to say what it holds.
Only stores of at least `MIN_FILES` files in a table are cached (smaller ones open in well
under a second). A cache that cannot be read or written is ignored. On an object store the
stamp is size and modification time (second precision): an object rewritten under the same
name with the same size within the same second would be missed; capture's writers never
reuse a name.

Imports pyarrow only.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.ipc

from capture.store.layout import FileInfo, Skip

__all__ = [
    "FooterCache",
    "MIN_FILES",
    "cache_dir",
    "files_of",
    "split_files",
    "verdict_table",
    "verdicts_of",
]

MIN_FILES = 256
"""Tables with fewer files are not cached."""

_FILE = "_capture_file"
_TOKEN = b"capture.cache_token"
_VERSION = "6"

Verdict = FileInfo | Skip


def cache_dir() -> str | None:
    """The folder of the cache (``$CAPTURE_CACHE_DIR``...), None when disabled."""
    chosen = os.environ.get("CAPTURE_CACHE_DIR")
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "0", "none") else chosen
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "capture")


class FooterCache:
    """The cached verdicts and rows of one store's tables."""

    def __init__(self, fs: pafs.FileSystem, root: str) -> None:
        folder = cache_dir()
        key = hashlib.sha256(f"{_VERSION}\0{fs.type_name}\0{root}".encode()).hexdigest()[:32]
        self.base = os.path.join(folder, key) if folder else None

    def load(self, table: str) -> tuple[dict[str, tuple[str, Verdict]], pa.Table | None]:
        """``{path: (stamp, verdict)}`` and the cached rows (a ``_capture_file`` column).

        Returns empty results when nothing is cached or the cache cannot be read.
        """
        if self.base is None or not os.path.exists(f"{self.base}-{table}.arrow"):
            return {}, None
        try:
            index = _read(f"{self.base}-{table}.arrow")
            token = (index.schema.metadata or {}).get(_TOKEN)
            rows = None
            if os.path.exists(f"{self.base}-{table}-rows.arrow"):
                rows = _read(f"{self.base}-{table}-rows.arrow")
                if (rows.schema.metadata or {}).get(_TOKEN) != token:
                    return {}, None  # written by two readers at once: use neither
            return verdicts_of(index, table), rows
        except Exception:  # a damaged cache is no cache
            return {}, None

    def save(
        self, table: str, entries: dict[str, tuple[str, Verdict]], rows: pa.Table | None
    ) -> None:
        """Replaces the table's cache (best effort: errors are ignored)."""
        if self.base is None:
            return
        token = uuid.uuid4().hex.encode()
        try:
            os.makedirs(os.path.dirname(self.base), exist_ok=True)
            if rows is not None:
                _write(rows.replace_schema_metadata({_TOKEN: token}), f"{self.base}-{table}-rows")
            _write(
                verdict_table(entries).replace_schema_metadata({_TOKEN: token}),
                f"{self.base}-{table}",
            )
        except Exception:  # read-only home, full disk: the next open reads the files again
            pass


def rows_of(rows: pa.Table, paths: list[str], every: bool = False) -> pa.Table:
    """The rows of `paths`, without the file column (`every`: `rows` are those of `paths`)."""
    keep = rows if every else rows.filter(file_mask(rows, paths))
    return keep.drop_columns([_FILE])


def with_files(tables: list[pa.Table], paths: list[str], dictionary: bool = False) -> pa.Table:
    """The rows of `tables` (one per file of `paths`) in one table with the file column
    (`dictionary`: dictionary-encoded, an index per row; for many rows of few files)."""
    first = tables[0].schema
    # files of one version (the usual case) concatenate as they are; others are unified
    same = all(t.schema.equals(first) for t in tables)
    rows = pa.concat_tables(tables, promote_options="none" if same else "permissive")
    rows = rows.combine_chunks()
    index = [i for i, t in enumerate(tables) for _ in range(t.num_rows)]
    at, names = pa.array(index, pa.int32()), pa.array(paths, pa.string())
    files = pa.DictionaryArray.from_arrays(at, names) if dictionary else pc.take(names, at)
    return rows.append_column(_FILE, files)


def _read(path: str) -> pa.Table:
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all()


def _write(table: pa.Table, stem: str) -> None:
    """Arrow IPC (lz4): read back in a fraction of Parquet's time, with no decoding."""
    tmp = f"{stem}.{uuid.uuid4().hex}.tmp"
    try:
        options = pa.ipc.IpcWriteOptions(compression="lz4")
        with pa.OSFile(tmp, "wb") as sink:
            with pa.ipc.new_file(sink, table.schema, options=options) as out:
                out.write_table(table)
        os.replace(tmp, f"{stem}.arrow")
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def verdict_table(entries: dict[str, tuple[str, Verdict]]) -> pa.Table:
    """`entries` (path -> stamp, verdict) as one Arrow table (`verdicts_of` reads it back)."""
    cols: dict[str, list[object]] = {
        k: []
        for k in (
            "path",
            "stamp",
            "reason",
            "rows",
            "size",
            "replaces",
            "lo",
            "hi",
            "exact",
            "rollup",
            "segment",
            "corrupt",
            "columns",
        )
    }
    for path, (stamp, verdict) in entries.items():
        cols["path"].append(path)
        cols["stamp"].append(stamp)
        if isinstance(verdict, Skip):
            cols["reason"].append(verdict.reason)
            cols["corrupt"].append(verdict.corrupt)
            for k in cols:
                if k not in ("path", "stamp", "reason", "corrupt"):
                    cols[k].append(None)
            continue
        cols["reason"].append(None)
        cols["corrupt"].append(None)
        cols["rows"].append(verdict.rows)
        cols["size"].append(verdict.size)
        cols["replaces"].append(json.dumps(verdict.replaces) if verdict.replaces else None)
        lo, hi = verdict.call_ids or (None, None)
        cols["lo"].append(lo)
        cols["hi"].append(hi)
        cols["exact"].append(verdict.exact)
        cols["rollup"].append(verdict.rollup)
        cols["segment"].append(json.dumps(verdict.segment) if verdict.segment else None)
        cols["columns"].append(verdict.columns)
    types = {"rows": pa.int64(), "size": pa.int64(), "lo": pa.int64(), "hi": pa.int64()}
    types["exact"] = types["corrupt"] = pa.bool_()
    return pa.table({k: pa.array(v, types.get(k, pa.string())) for k, v in cols.items()})


def verdicts_of(index: pa.Table, table: str) -> dict[str, tuple[str, Verdict]]:
    """The ``{path: (stamp, verdict)}`` of a `verdict_table` of `table`'s files."""
    cols = [index.column(k).to_pylist() for k in index.column_names]
    out: dict[str, tuple[str, Verdict]] = {}
    for row in zip(*cols, strict=True):
        path, stamp, reason, rows, size, replaces, lo, hi, exact, rollup, segment = row[:11]
        corrupt, names = row[11:]
        verdict: Verdict
        if reason is not None:
            verdict = Skip(path, reason, bool(corrupt))
        else:
            claims = json.loads(replaces) if replaces else {}
            ids = (lo, hi) if lo is not None and hi is not None else None
            days = json.loads(segment) if segment else None
            verdict = FileInfo(
                path, table, rows, size, claims, ids, bool(exact), rollup, days, names
            )
        out[path] = (stamp, verdict)
    return out


def file_mask(rows: pa.Table, paths: list[str]) -> pa.ChunkedArray:
    """Which cached rows belong to `paths`."""
    return pc.is_in(rows.column(_FILE), pa.array(paths, pa.string()))


def files_of(rows: pa.Table) -> list[str]:
    """The distinct files the rows of `rows` come from."""
    files: list[str] = pc.unique(rows.column(_FILE)).to_pylist()
    return files


def split_files(rows: pa.Table) -> dict[str, pa.Table]:
    """The rows of `rows` per file they come from (each with its file column), in order."""
    where: dict[str, list[int]] = {}
    for i, path in enumerate(rows.column(_FILE).to_pylist()):
        where.setdefault(path, []).append(i)
    return {path: rows.take(pa.array(at, pa.int64())) for path, at in where.items()}
