"""Store files: which ones a reader sees, and what their Parquet footers say.

Shared by the reader (`capture.store.reader`) and `capture.store.compaction`; imports pyarrow only.

A store is data written by others (DESIGN §5, README "Trust boundary"), so every file is checked
before it joins a view: `read_footer` returns a `FileInfo` only for a capture file of the
table's schema whose sizes are plausible, else a `Skip` saying why (foreign, wrong schema,
truncated, a decompression bomb). It reads one footer and touches nothing else, so callers may
map it over a thread pool. `list_files` never follows a symbolic link (no reading out of the
store, no loops): each link it meets is reported as a `Skip`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyarrow._parquet import ParquetReader

from capture import schema
from capture.store import footer_schema
from capture.store.files import vanished
from capture.store.nofollow import LINK_REASON, walk
from capture.store.opening import open_root
from capture.store.small_rows import read_rows
from capture.store.values import CORRUPT, calls_problem, rows_problem
from capture.untrusted import JsonTooDeep, loads

__all__ = [
    "FileInfo",
    "Skip",
    "METADATA_REPLACES",
    "METADATA_REPLACES_ROWS",
    "MAX_INFLATION",
    "MAX_UNCOMPRESSED",
    "VANISHED",
    "list_files",
    "open_root",
    "read_columns",
    "read_footer",
    "read_with_rows",
]

METADATA_REPLACES = b"capture.replaces"
"""Parquet metadata key: JSON list of the base names (same folder) a compacted file replaces.

A claim, not a fact: `capture.store.claims` hides a listed file only after checking that the
claiming file holds its rows."""

METADATA_REPLACES_ROWS = b"capture.replaces_rows"
"""Parquet metadata key: JSON ``{name: row count}`` of the files a compacted file replaces."""

MAX_UNCOMPRESSED = 8 << 30
"""Largest uncompressed size (bytes) a store file may declare; bigger ones are skipped."""

MAX_INFLATION = 2_000
"""Largest ratio of declared uncompressed size to file size beyond 64 MiB (a zip bomb)."""

_SMALL = 64 << 20

VANISHED = "deleted after it was listed"
"""The reason of a `Skip` for a file gone between listing and reading (a writer's replaced
rollup, a compacted file's source): not a problem to report, a reason to list again."""


@dataclass(frozen=True)
class FileInfo:
    """A store file that passed `read_footer`'s checks."""

    path: str
    table: str
    rows: int
    size: int
    replaces: dict[str, int | None]
    """Base names (same folder) this file claims to replace -> claimed row count (None: not
    recorded, files compacted by an older version)."""
    call_ids: tuple[int, int] | None = None
    """Smallest and largest call_id (calls files, from the footer's statistics)."""
    exact: bool = False
    """The file has exactly the table's columns, in order (no column of another version)."""
    rollup: str | None = None
    """Stats files: ``open`` or ``closed`` for a writer's rollup (`schema.METADATA_ROLLUP`)."""
    segment: dict[str, int] | None = None
    """Stats rollups: the calls files of the segment the rollup adds, day -> rows
    (`schema.METADATA_SEGMENT_CALLS`; `capture.store.commits`); None when it names none."""
    columns: str | None = None
    """The file's column names, comma-separated, when not `exact` (None: exactly the table's)."""

    @property
    def folder(self) -> str:
        """The partition folder holding the file."""
        return self.path.rsplit("/", 1)[0]

    @property
    def name(self) -> str:
        """The file's base name."""
        return self.path.rsplit("/", 1)[1]


@dataclass(frozen=True)
class Skip:
    """A store file left out of every view, and why (one line)."""

    path: str
    reason: str
    corrupt: bool = False
    """A capture file whose values no writer writes (`capture.store.values`): readers stop with
    an error naming it instead of leaving its recorded calls out unseen."""


def list_files(
    fs: pafs.FileSystem,
    root: str,
    table: str,
    skipped: list[Skip] | None = None,
    stamps: dict[str, str] | None = None,
) -> list[pafs.FileInfo]:
    """The Parquet files of one table, temporary dot-files left out; links never followed.

    Args:
        fs: The store's filesystem.
        root: The store's root path on `fs`.
        table: ``structures``, ``calls`` or ``stats``.
        skipped: Receives a `Skip` for each symbolic link met (local filesystems only).
        stamps: Receives, per file, what changes when the file is written again (size and
            modification time; on a local disk also inode and change time, which no one can
            set back): the key of `capture.store.footer_cache`.
    """
    if isinstance(fs, pafs.LocalFileSystem):
        return _list_local(root, table, skipped if skipped is not None else [], stamps)
    selector = pafs.FileSelector(f"{root}/{table}", recursive=True, allow_not_found=True)
    out = [
        info
        for info in fs.get_file_info(selector)
        if info.type == pafs.FileType.File
        and info.base_name.endswith(".parquet")
        and not info.base_name.startswith(".")
    ]
    if stamps is not None:
        for info in out:
            stamps[info.path] = f"{info.size}:{info.mtime_ns}"
    return out


def _list_local(
    root: str, table: str, skipped: list[Skip], stamps: dict[str, str] | None
) -> list[pafs.FileInfo]:
    """Walks ``root/table`` without following any link (`capture.store.nofollow.walk`)."""
    found = walk(f"{root}/{table}", lambda name: name.endswith(".parquet") and name[0] != ".")
    skipped.extend(Skip(path, LINK_REASON) for path in found.links)
    skipped.extend(Skip(path, reason) for path, reason in found.unlistable)
    out: list[pafs.FileInfo] = []
    for path, st in found.files:
        out.append(pafs.FileInfo(path, pafs.FileType.File, size=st.st_size))
        if stamps is not None:
            stamps[path] = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:{st.st_dev}"
    return out


def read_footer(fs: pafs.FileSystem, path: str, table: str | None = None) -> FileInfo | Skip:
    """Reads and checks one file's footer: a `FileInfo`, or a `Skip` saying why not.

    Skipped: unreadable (truncated, empty, not Parquet), without capture's metadata (a foreign
    file), of another kind or schema than `table`, or declaring an implausible uncompressed
    size (`MAX_UNCOMPRESSED`, `MAX_INFLATION`). Safe to call from many threads at once.

    Args:
        fs: The store's filesystem.
        path: The file.
        table: The table the file's folder belongs to; None takes it from the path.

    Returns:
        `FileInfo` or `Skip`.
    """
    if table is None:
        table = next((t for t in schema.TABLES if f"/{t}/" in path), "")
    return read_columns(fs, path, table, None)[0]


def read_columns(
    fs: pafs.FileSystem, path: str, table: str, columns: Sequence[str] | None
) -> tuple[FileInfo | Skip, pa.Table | None]:
    """`read_footer`'s verdict and, when the file passes, the rows of those of `columns` it
    has (None: no rows read), decoded from the same read as the footer (a small file is
    fetched in one request). Rows that cannot be decoded leave the verdict as it is, with no
    rows: whoever reads the file later meets the same fault."""
    named = _name_problem(path, table)
    if named is not None:
        return named, None
    try:
        with fs.open_input_file(path) as f:
            size = int(f.size())
            one = columns is not None and size <= _ONE_READ
            reader = ParquetReader()
            reader.open(pa.BufferReader(f.read()) if one else f)
            meta = reader.metadata
            verdict, sizes = _checked_footer(meta, path, table, size)
            if isinstance(verdict, FileInfo) and table == schema.CALLS:
                problem = calls_problem(fs, path, sizes)
                if problem is not None:
                    return Skip(path, problem, corrupt=True), None
            if columns is None or isinstance(verdict, Skip):
                return verdict, None
            try:
                return verdict, _columns(reader, meta, verdict, columns)
            except Exception:  # corrupt pages: not this check's to judge (the footer's is)
                return verdict, None
    except Exception as e:  # truncated, empty, not Parquet, a footer pyarrow cannot walk
        return _unreadable(fs, path, e), None


def _columns(
    reader: ParquetReader, meta: pq.FileMetaData, verdict: FileInfo, columns: Sequence[str]
) -> pa.Table:
    """The rows of `columns` of a checked file, in that order; a column the file lacks (added
    by a later store version) is all nulls, as the table's view reads it. Each column is read
    by its field index (`read_column`: no table of the file's schema is built)."""
    fields = footer_schema.checked_facts(meta, verdict.table).fields
    base = schema.SCHEMAS[verdict.table]
    found = [
        reader.read_column(fields[c]) if c in fields else pa.nulls(verdict.rows, base.field(c).type)
        for c in columns
    ]
    return pa.table(found, names=list(columns))


def _footer(source: pa.NativeFile) -> pq.FileMetaData:
    """The Parquet footer of `source`, parsed and nothing more.

    pyarrow's own reader: ``pq.read_metadata`` wraps it in a `pq.ParquetFile`, which also
    indexes the nested column names in Python (about a tenth of a footer's check).
    """
    reader = ParquetReader()
    reader.open(source)
    return reader.metadata


def _unreadable(fs: pafs.FileSystem, path: str, error: Exception) -> Skip:
    """The `Skip` of a file whose read failed: `VANISHED` when it is gone (list again)."""
    if vanished(fs, path, error):
        return Skip(path, VANISHED)
    return Skip(path, _one_line(f"{type(error).__name__}: {error}"))


_ONE_READ = 4 << 20
"""Files up to this size are read in one request: footer and rows from the same bytes."""


def read_with_rows(
    fs: pafs.FileSystem, path: str, table: str, check_values: bool = True
) -> tuple[FileInfo | Skip, pa.Table | None]:
    """`read_footer`'s verdict on one file and, when it passes, the file's rows.

    A small file (stats, structures: a few rows per segment) is fetched once, its footer
    checked and its rows decoded from the same bytes, instead of a footer read now and a
    second read of the whole file by DuckDB later. Rows are decoded only after
    the footer passed (bombs, foreign and wrong-schema files are never decoded).

    Args:
        fs: The store's filesystem.
        path: The file.
        table: The table the file's folder belongs to.
        check_values: Check the rows' values here (`capture.store.values.rows_problem`);
            False when the caller checks the rows of many files at once.

    Returns:
        ``(FileInfo, rows)``, or ``(Skip, None)``.
    """
    named = _name_problem(path, table)
    if named is not None:
        return named, None
    try:
        with fs.open_input_file(path) as f:
            size = int(f.size())
            # Python bytes, not an Arrow buffer: freed at once (the pool kept them)
            source = pa.BufferReader(f.read()) if size <= _ONE_READ else f
            parquet = ParquetReader()
            parquet.open(source)
            verdict = _verdict(parquet.metadata, path, table, size)
            if isinstance(verdict, Skip):
                return verdict, None
            known = footer_schema.checked_facts(parquet.metadata, table)
            rows = read_rows(parquet, known.pinnable)  # one thread: callers read many files
            problem = rows_problem(table, rows) if check_values else None
            if problem is not None:
                return Skip(path, problem, corrupt=True), None
            return verdict, rows
    except Exception as e:  # truncated, empty, not Parquet, corrupt pages: skipped, said why
        return _unreadable(fs, path, e), None


def _name_problem(path: str, table: str) -> Skip | None:
    inside = path.rsplit(f"/{table}/", 1)[-1]
    if any(c in inside for c in _GLOB) or not inside.isprintable():
        # DuckDB's read_parquet expands such names as patterns: they could pull in other files
        return Skip(path, "its name holds glob or control characters")
    return None


def _verdict(meta: pq.FileMetaData, path: str, table: str, size: int) -> FileInfo | Skip:
    """The checks of `read_footer` on a footer already read (the sizes' values aside)."""
    return _checked_footer(meta, path, table, size)[0]


def _checked_footer(
    meta: pq.FileMetaData, path: str, table: str, size: int
) -> tuple[FileInfo | Skip, dict[str, list[pq.Statistics | None]]]:
    """`_verdict`, and the statistics of the sizes' list elements per row group (calls files:
    what `calls_problem` reads; empty when the file is skipped)."""
    kv = meta.metadata or {}
    version = kv.get(schema.METADATA_SCHEMA_VERSION)
    if version is None:
        return Skip(path, "not a capture file (no capture.schema_version in its footer)"), {}
    try:
        number = int(version)
    except ValueError:
        return Skip(path, f"capture.schema_version {version[:20]!r} is not a number"), {}
    if number > schema.SCHEMA_VERSION:
        # Skipped, not an error: one planted file must not make the store unreadable.
        return Skip(
            path,
            f"written with store schema v{number}, this library reads up to "
            f"v{schema.SCHEMA_VERSION}: upgrade capture to read it",
        ), {}
    kind = kv.get(schema.METADATA_KIND, b"").decode("utf-8", "replace")
    if table not in schema.SCHEMAS or kind != table:
        return Skip(path, f"a {kind[:20]!r} file in the {table!r} folder"), {}
    try:
        known = footer_schema.facts(meta, table, number)
        problem = known.problem
    except Exception as e:  # a schema arrow cannot map
        problem = f"its schema cannot be read ({type(e).__name__})"
    if problem:
        return Skip(path, problem), {}
    declared, ids, sizes = _scan(meta, known, table == schema.CALLS)
    if declared > MAX_UNCOMPRESSED or (
        declared > _SMALL and declared > MAX_INFLATION * max(size, 1)
    ):
        return Skip(
            path, f"declares {declared:,} uncompressed bytes in a {size:,}-byte file (a bomb?)"
        ), {}
    replaces = _claims(kv, path)
    if isinstance(replaces, Skip):
        return replaces, {}
    segment = _segment(kv, path) if table == schema.STATS else None
    if isinstance(segment, Skip):
        return segment, {}
    rows = int(meta.num_rows)
    rollup = kv.get(schema.METADATA_ROLLUP)
    mark = rollup.decode("ascii", "replace")[:10] if rollup is not None else None
    columns = None if known.exact else known.names
    info = FileInfo(path, table, rows, size, replaces, ids, known.exact, mark, segment, columns)
    return info, sizes


_GLOB = "*?[]{}"


def _scan(
    meta: pq.FileMetaData, known: footer_schema.SchemaFacts, calls: bool
) -> tuple[int, tuple[int, int] | None, dict[str, list[pq.Statistics | None]]]:
    """One pass over the footer's column chunks (each one a Python object: one pass, not one
    per question), for:

    - about how many bytes the file's values take once decoded (dictionary and run-length
      encodings expand: a few KB of repeated values can stand for GBs); a byte array's width
      is the longest value its statistics know of;
    - `calls`: the smallest and largest ``call_id`` (None when a row group has no statistics)
      and the statistics of the ``dims`` and ``out_dims`` list elements (`calls_problem`).
    """
    total = 0
    widths = known.widths
    lows: list[int] = []
    highs: list[int] = []
    no_ids = False
    sizes: dict[str, list[pq.Statistics | None]] = {}
    # each watched Parquet column -> the name it is kept under
    watched = {index: column for column, index in known.leaves.items()} if calls else {}
    if calls:
        sizes = {column: [] for column in known.leaves}
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        for j in range(group.num_columns):  # as many as the schema's, unless the file lies
            chunk = group.column(j)
            width = widths[j] if j < len(widths) else footer_schema.width(chunk.physical_type)
            if width is None:
                stats = chunk.statistics
                width = 1
                if stats is not None and stats.has_min_max:
                    # the physical values: bytes, no conversion to str (a few µs each)
                    width = max(_width(stats.min_raw), _width(stats.max_raw), 1)
            total += max(chunk.num_values * width, chunk.total_uncompressed_size)
            if j in watched:
                sizes[watched[j]].append(chunk.statistics)
            elif calls and j == known.call_id:
                stats = chunk.statistics
                if stats is None or not stats.has_min_max:
                    no_ids = True
                else:
                    lows.append(int(stats.min_raw))
                    highs.append(int(stats.max_raw))
    ids = None if no_ids or not lows or meta.num_rows == 0 else (min(lows), max(highs))
    return total, ids, sizes


def _width(value: object) -> int:
    """Bytes of a statistics bound as stored (a byte array's length)."""
    return len(value) if isinstance(value, bytes | str) else len(str(value))


def _claims(kv: dict[bytes, bytes], path: str) -> dict[str, int | None] | Skip:
    raw = kv.get(METADATA_REPLACES)
    if not raw:
        return {}
    try:
        names = loads(raw)
        rows = loads(kv.get(METADATA_REPLACES_ROWS) or b"{}")
        if not isinstance(names, list) or not isinstance(rows, dict):
            raise ValueError("not a list")
    except JsonTooDeep as e:
        return Skip(path, f"{CORRUPT}: its capture.replaces holds {e}", corrupt=True)
    except ValueError:
        return Skip(path, "its capture.replaces is not a JSON list")
    own = path.rsplit("/", 1)[1]
    return {
        name: rows.get(name) if isinstance(rows.get(name), int) else None
        for name in names
        # only plain names of the same folder, never the file itself
        if isinstance(name, str)
        and name
        and "/" not in name
        and "\\" not in name
        and name not in (".", "..", own)
    }


_MAX_SEGMENT_DAYS = 32


def _segment(kv: dict[bytes, bytes], path: str) -> dict[str, int] | None | Skip:
    """The ``capture.segment_calls`` of a rollup: ``{"YYYY-MM-DD": rows}``, checked."""
    raw = kv.get(schema.METADATA_SEGMENT_CALLS)
    if raw is None:
        return None
    try:
        days = loads(raw)
        if not isinstance(days, dict) or not 0 < len(days) <= _MAX_SEGMENT_DAYS:
            raise ValueError("not a small JSON object")
        for day, rows in days.items():
            if len(day) != 10 or dt.date.fromisoformat(day).isoformat() != day:
                raise ValueError(f"{day[:20]!r} is not a day")
            if type(rows) is not int or rows < 0:
                raise ValueError(f"{str(rows)[:20]!r} is not a row count")
    except ValueError as e:
        return Skip(path, f"its {schema.METADATA_SEGMENT_CALLS.decode()} is malformed ({e})")
    return days


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 200 else line[:197] + "..."
