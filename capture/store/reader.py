"""The store's data-access object: an in-process DuckDB connection with views over the Parquet tree.

This module imports duckdb and pyarrow but never torch: ``capture query`` goes through it. It
answers "which files, which rows, this SQL" and nothing more: the analyses of a store
(`capture.analysis`, `capture.engines`) import it, never the reverse, and the public
`capture.Store` (`capture.store_api`) puts the two together.

Views users can rely on (DESIGN §6):

- ``calls(call_id, ts, model, host, pid, in_structure, out_structure, dims, out_dims, int_min,
  int_max, duration_ns, error, date)``: one row per recorded call;
- ``structures(model, structure_id, leaf, path, argument, position, kind, type, dtype, rank,
  device, value, dim_offset, range_index, treespec, signature, n_args)``: one row per leaf of
  each distinct structure (deduplicated across the files of many processes);
- ``leaves(call_id, model, side, leaf, path, argument, kind, type, dtype, device, shape, int_min,
  int_max)``: one row per call and leaf, ``side`` is 'input' or 'output';
- ``dims(call_id, model, side, leaf, path, axis, size)``: one row per call, tensor leaf and axis;
- ``stats``: the signature rows as written (one per signature per file: a writer's rollup, a
  compacted file); ``signatures``: the same merged over files, one row per distinct (model,
  in_structure, out_structure, dims, out_dims), integer value ranges merged item by item
  (`capture.store.stats_merge`, the one place stats rows merge).

Every file is checked before it joins a view (`capture.store.layout.read_footer`): unreadable,
foreign, wrong-schema and bomb-sized files, files of a newer schema version and symbolic links are
skipped with one warning naming each (the newer ones say to upgrade capture). Files that a compacted
file replaces (`capture.compact`, left behind when a compaction died before deleting them) are not
read, once `capture.store.claims` has checked that the compacted file holds their rows. A
statement that only counts the rows of ``calls`` gets them from those checked footers
(`capture.store.row_counts`); the first other ``SELECT`` over many calls files runs over the
columns it names, decoded with the checks (`capture.store.first_read`).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.fs as pafs

from capture import schema
from capture.errors import CorruptStoreFile, EmptyStore, QueryError, UnknownModel
from capture.store import first_read, footer_cache
from capture.store.checked import check_table
from capture.store.layout import list_files, open_root
from capture.store.row_counts import counted, counts_calls, own_calls_view
from capture.store.upkeep import compact_hint
from capture.store.views import (
    CALLS_VIEWS,
    DATE_FROM_PATH,
    DERIVED_VIEWS,
    SQL_TYPES,
    batches,
    needs_calls,
    with_columns,
)
from capture.untrusted import printable

__all__ = ["StoreReader", "SkippedFile"]

logger = logging.getLogger(__name__)

_Self = TypeVar("_Self", bound="StoreReader")
_T = TypeVar("_T")


@dataclass(frozen=True)
class SkippedFile:
    """A store file that could not be read, and why."""

    path: str
    reason: str


_NO_EXTENSION_LOADING: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}

_CALLS_FILES = "capture_calls_files"
"""The DuckDB variable holding the calls files the ``calls`` view reads (local stores)."""

_RELISTS = 5
"""Times a query lists the store again when files it read were deleted meanwhile (compactions
replacing them; each listing finds the files that replaced them)."""


class StoreReader:
    """A read-only view of a capture store through an in-process DuckDB connection.

    Users get one as a `capture.Store` (`capture.open_store()`, which adds the analyses).
    `query()` runs any SQL over the views listed in this module's docstring and returns a
    `pyarrow.Table`.
    """

    def __init__(self, path: str | os.PathLike[str], *, unsafe_sql: bool = False) -> None:
        self.path = os.fspath(path)
        self.unsafe_sql = unsafe_sql
        self.fs, self.root = open_root(
            path,
            "record into it first (capture.Recorder) or pass --store / set CAPTURE_STORE",
        )
        self._cache = footer_cache.FooterCache(self.fs, self.root)
        self._counted: duckdb.DuckDBPyConnection | None = None  # `row_counts.counted`'s
        # the first statement over the calls: the columns it names, read with the checks
        self._ask: list[str] | None = None
        self._first_rows: pa.Table | None = None
        self._list_files()
        if not self._files[schema.STATS] and not self._files[schema.STRUCTURES]:
            self._check_calls()  # a store of calls files alone (their stats skipped) still opens
        if not any(self._files.values()):
            raise EmptyStore(
                f"the store at {self.path} holds no recorded call yet; record into it first "
                "(capture.Recorder) or pass another --store"
            )
        self._connect(with_calls=False)

    def _connect(self, with_calls: bool) -> None:
        """A DuckDB connection with the store's views (locked down unless ``unsafe_sql``).

        The stats and structures views read rows held in memory (read with the files' checks);
        the views over the calls files (`calls`, `leaves`, `dims`) are made only for a query
        that names one (`capture.store.views.needs_calls`): binding a view over 100,000 files
        costs seconds, and `summary` never reads a call. Adding them later
        reconnects (temporary tables a user made in the store's session before are gone then).
        """
        self._with_calls = with_calls
        if self.unsafe_sql:
            self.con = duckdb.connect()
        else:
            self.con = duckdb.connect(config=_NO_EXTENSION_LOADING)
        # DuckDB draws a progress bar on stdout for a query of more than 2 s, terminal or not:
        # stdout carries the result only.
        self.con.execute("SET enable_progress_bar = false")
        # DuckDB's parquet_metadata_cache stays off: it keeps every footer read, with no bound
        # (2.9 GiB over 100,000 files); the stats and structures rows are in memory already,
        # and a store kept compacted (capture.store.upkeep) has few calls files to read.
        self._create_views(with_calls)
        if not self.unsafe_sql:
            self._lock_down()

    @property
    def files(self) -> dict[str, list[str]]:
        """The files a reader sees, per table (``calls``, ``stats``, ``structures``), sorted.

        Hand them to an engine that does not know ``capture.replaces`` (Spark, Trino). The
        calls files are checked the first time they are needed (this, or SQL over ``calls``,
        ``leaves`` or ``dims``): `summary` and `dims` read stats only, and at 100,000 calls
        files the check costs a minute.
        """
        self._check_calls()
        return self._files

    def _list_files(self, with_calls: bool = False) -> None:
        """Lists the store's stats and structures (and calls) files into `_files`, `skipped`."""
        self.skipped: list[SkippedFile] = []
        self._waiting: frozenset[str] = frozenset()
        self._files: dict[str, list[str]] = {}
        self._rows: dict[str, pa.Table | None] = {}
        for table in (schema.STRUCTURES, schema.STATS):
            self._files[table] = self._checked_files(table)
        if with_calls:
            self._check_calls()

    def _check_calls(self) -> None:
        """Checks the calls files, once (each skipped one is warned about then)."""
        if schema.CALLS not in self._files:
            self._files[schema.CALLS] = self._checked_files(schema.CALLS)

    def _checked_files(self, table: str) -> list[str]:
        """The files of `table` that join its view (`capture.store.checked.check_table`)."""
        asked = table == schema.CALLS and self._ask is not None
        ask = first_read.file_columns(self._ask or []) if asked else None
        found = check_table(self.fs, self.root, table, self._cache, ask)
        corrupt = next((s for s in found.skipped if s.corrupt), None)
        if corrupt is not None:
            raise CorruptStoreFile(
                f"the store file {corrupt.path} {corrupt.reason}; move it out of the store "
                "(its calls are then not read) or restore it from a copy"
            )
        skipped = [SkippedFile(s.path, s.reason) for s in found.skipped]
        self.skipped.extend(skipped)
        for one in skipped:
            warnings.warn(
                printable(f"capture: skipping unreadable store file {one.path} ({one.reason})"),
                RuntimeWarning,
                stacklevel=4,
            )
        for claim in found.refused:
            warnings.warn(
                printable(f"capture: {claim.path} {claim.reason}"), RuntimeWarning, stacklevel=4
            )
        compact_hint(self.path, table, found.folders)
        if table == schema.CALLS:
            self._uniform_calls = found.uniform
            # calls of segments whose rollup is not counted yet (capture.store.commits)
            kept = [path for path in found.kept if path not in self._waiting]
            self._calls_rows = sum(found.file_rows[path] for path in kept)
            rows = found.columns
            if rows is not None and len(kept) < len(found.kept):
                rows = rows.filter(footer_cache.file_mask(rows, kept))
            self._first_rows = rows
            return kept
        self._rows[table] = found.rows
        if table == schema.STATS:
            self._waiting = found.waiting
        return found.kept

    def _lock_down(self) -> None:
        """From here on SQL reads the store's files and nothing else.

        No other file, directory or URL is read or written (``read_csv``, ``COPY ... TO``,
        ``ATTACH``, ``glob``), no extension is installed or loaded, and no setting changes.
        """
        # Only the calls files are read by DuckDB (stats and structures rows are in memory).
        files = self.files[schema.CALLS] if self._with_calls else []
        if isinstance(self.fs, pafs.LocalFileSystem) and files:
            self.con.execute(f"SET allowed_paths = getvariable('{_CALLS_FILES}')")
        self.con.execute("SET enable_external_access = false")
        self.con.execute("SET lock_configuration = true")

    def _create_views(self, with_calls: bool) -> None:
        self._registered: dict[str, Any] = {}
        local = isinstance(self.fs, pafs.LocalFileSystem)
        partitions = {
            schema.STRUCTURES: [("model", pa.string())],
            schema.CALLS: [("model", pa.string()), ("date", pa.date32())],
            schema.STATS: [("model", pa.string())],
        }
        for table in schema.TABLES:
            if table == schema.CALLS and not with_calls:
                continue
            name = "_structures_raw" if table == schema.STRUCTURES else table
            files = self.files[table] if table == schema.CALLS else self._files[table]
            base = schema.SCHEMAS[table]
            extra = [pa.field(n, t) for n, t in partitions[table] if n not in base.names]
            if not files:
                empty = pa.schema(list(base) + extra).empty_table()
                self._register(f"_{table}_empty", empty)
                self.con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM _{table}_empty")
            elif table != schema.CALLS:
                # Read with their checks (`_checked_files`): every query would fetch each
                # small file again (on an object store a round trip each).
                self._register(f"_{table}_rows", with_columns(self._rows[table], base))
                self.con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM _{table}_rows")
            elif local:
                # The `model` column of a file is the recorded name; its `model=` folder is a
                # sanitized copy ('org/name' -> 'org_name'), so only `date` comes from the path.
                # Merging the columns by name reads every file's schema each time a statement
                # binds the view (about 1 ms a file): only when the files' columns differ.
                mixed = "false" if self._uniform_calls else "true"
                # The list is a bound value, not SQL text: a literal of 100,000 paths is
                # parsed, and copied at each bind, as an expression per path (GBs).
                self.con.execute(f"SET VARIABLE {_CALLS_FILES} = ?::VARCHAR[]", [files])
                self.con.execute(
                    f"CREATE OR REPLACE VIEW {name} AS SELECT * EXCLUDE (filename), "
                    f"{DATE_FROM_PATH} AS date FROM read_parquet(getvariable('{_CALLS_FILES}'), "
                    f"hive_partitioning = false, union_by_name = {mixed}, filename = true)"
                )
            else:
                import pyarrow.dataset as ds

                dates = ds.partitioning(pa.schema([("date", pa.date32())]), flavor="hive")
                dataset = ds.dataset(
                    files,
                    filesystem=self.fs,
                    format="parquet",
                    partitioning=dates if table == schema.CALLS else None,
                )
                self._register(f"_{table}_dataset", dataset)
                self.con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM _{table}_dataset")
            if table == schema.CALLS and files:
                self._add_missing_columns(name, base)
        self.con.execute(DERIVED_VIEWS)
        if with_calls:
            self.con.execute(CALLS_VIEWS)
        self._calls_view = own_calls_view(self.con)  # as made here (`row_counts.counts_calls`)

    def _register(self, name: str, data: Any) -> None:
        """`data` registered as `name` (kept: a cursor registers it again, `first_read.run`)."""
        self.con.register(name, data)
        self._registered[name] = data

    def _add_missing_columns(self, view: str, base: pa.Schema) -> None:
        """`view` over files that all lack a column a later store version added
        (`schema.ADDED_IN`): the column, null on every row, as a file of that version reads."""
        have = {row[0] for row in self.con.execute(f"DESCRIBE {view}").fetchall()}
        missing = [f for f in base if f.name not in have]
        if not missing:
            return
        nulls = ", ".join(f"CAST(NULL AS {SQL_TYPES[f.type]}) AS {f.name}" for f in missing)
        self.con.execute(f"ALTER VIEW {view} RENAME TO _{view}_files")
        self.con.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT *, {nulls} FROM _{view}_files")

    # -- queries -----------------------------------------------------------------------------
    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> pa.Table:
        """Runs SQL over the store's views and returns the result as a `pyarrow.Table`.

        Args:
            sql: DuckDB SQL over `calls`, `structures`, `leaves`, `dims`, `signatures`; it
                cannot reach other files, URLs or settings unless the store was opened with
                ``unsafe_sql=True``.
            params: Positional (``?``/``$1``) or named (``$name``) parameters, bound by DuckDB
                (never formatted into the SQL text).

        Raises:
            QueryError: The SQL is invalid or fails; the message is DuckDB's.

        Example:
            >>> store.query("SELECT count(*) AS n FROM calls").to_pylist()  # doctest: +SKIP
            [{'n': 8}]
        """
        return self._run(sql, params, lambda relation: relation.to_arrow_table(), pa.table({}))

    def stream(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        batch_rows: int = 8192,
    ) -> pa.RecordBatchReader:
        """Runs SQL like `query`, and hands its result over batch by batch (bounded memory).

        DuckDB produces the rows as they are read (``capture query`` prints 100 million rows in
        about 140 MB). A file that vanished under a compaction is retried, as in `query`, until
        the first batch is read; later, the reader raises `QueryError`. The store's connection
        serves no other query until the reader is exhausted or closed.

        Args:
            sql: As for `query`.
            params: As for `query`.
            batch_rows: Rows per batch.

        Returns:
            A reader of the result's record batches (an empty one for a statement without a
            result).

        Raises:
            QueryError: The SQL is invalid or fails, now or while the batches are read.

        Example:
            >>> with store.stream("SELECT * FROM calls") as reader:  # doctest: +SKIP
            ...     rows = sum(batch.num_rows for batch in reader)
        """

        def start(relation: duckdb.DuckDBPyRelation) -> tuple[Any, pa.RecordBatch | None]:
            reader = relation.to_arrow_reader(batch_rows)
            try:
                return reader, reader.read_next_batch()
            except StopIteration:
                return reader, None

        empty: tuple[Any, pa.RecordBatch | None] = (None, None)
        reader, first = self._run(sql, params, start, empty)
        if reader is None:
            return pa.RecordBatchReader.from_batches(pa.schema([]), [])
        return pa.RecordBatchReader.from_batches(reader.schema, batches(reader, first))

    def _run(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any] | None,
        fetch: Callable[[duckdb.DuckDBPyRelation], _T],
        no_result: _T,
    ) -> _T:
        """Runs `sql` and `fetch`es its relation (`no_result` for SET, CREATE VIEW, ...),
        listing the store again when a calls file it read vanished (at most `_RELISTS` times)."""
        if self._counted is not None:  # the last statement's cursor: its reader is done
            self._counted.close()
            self._counted = None
        bind = not self._with_calls and needs_calls(self.con, sql)
        counts = (bind or self._with_calls) and not params
        if counts and counts_calls(self.con, sql, self._calls_view):  # the checked footers tell
            self._check_calls()
            self._counted, relation = counted(self.con, self._calls_rows, sql)
            return fetch(relation)
        if bind and not params:
            self._ask = first_read.statement_columns(self.con, sql)
        relisted = 0
        stale = False
        while True:
            try:
                if stale:
                    # A compaction replaced (then deleted) files listed before: the files
                    # that replaced them hold their rows; list again.
                    self.con.close()
                    self._list_files(with_calls=self._with_calls)
                    self._connect(self._with_calls)
                    stale = False
                if bind and not self._with_calls:
                    # Bound inside the retry: binding reads the calls files' footers, and a
                    # compaction may delete one meanwhile (`No files found`).
                    self._reconnect(with_calls=True)
                first = self._first(sql, fetch)
                if first:
                    return first[0]
                relation = self.con.sql(sql, params=params) if params else self.con.sql(sql)
                if relation is None:  # a statement without a result (SET, CREATE VIEW, ...)
                    return no_result
                return fetch(relation)
            except duckdb.CatalogException as e:
                if not self._with_calls:  # DuckDB misses a table: bind the calls views, lazily
                    bind = True
                    continue
                raise QueryError(f"query failed: {str(e).strip()}") from e
            except (duckdb.Error, OSError, pa.ArrowException) as e:
                if relisted < _RELISTS and self._calls_gone():
                    relisted += 1
                    stale = True
                    continue
                raise QueryError(f"query failed: {str(e).strip()}") from e

    def _first(self, sql: str, fetch: Callable[[duckdb.DuckDBPyRelation], _T]) -> tuple[_T] | None:
        """`sql` over the calls columns read with the checks (`capture.store.first_read`), once;
        None when there are none, or it needs a column not read: the files are read then."""
        rows, self._first_rows = self._first_rows, None
        columns, self._ask = self._ask, None
        if rows is None or columns is None:
            return None
        try:
            found = first_read.run(self.con, self._registered, rows, columns, sql)
            self._counted, relation = found
            return (fetch(relation),)
        except (duckdb.Error, OSError, pa.ArrowException) as e:
            logger.debug("capture: the statement reads the calls files (%s)", e)
            return None

    def _calls_gone(self) -> bool:
        """Whether a calls file the views read no longer exists (the table listed again).

        A fact, not the error's text: whatever DuckDB or pyarrow said about the failure, the
        query is run again only when a file it read is gone.
        """
        bound = self._files.get(schema.CALLS) if self._with_calls else None
        if not bound:
            return False
        try:
            now = {info.path for info in list_files(self.fs, self.root, schema.CALLS)}
        except OSError:  # the store cannot be listed: the original error stands
            return False
        return any(path not in now for path in bound)

    def _reconnect(self, with_calls: bool) -> None:
        self.con.close()
        self._connect(with_calls)

    def models(self) -> list[str]:
        """The model names recorded in the store, sorted."""
        rows = self.query(
            "SELECT DISTINCT model FROM stats UNION SELECT DISTINCT model FROM structures "
            "ORDER BY 1"
        )
        return [str(m) for m in rows.column("model").to_pylist()]

    def check_model(self, model_name: str | None) -> list[str]:
        """The models to analyse: all of them, or `model_name` after checking that it exists."""
        models = self.models()
        if model_name is None:
            return models
        if model_name not in models:
            known = ", ".join(models) or "none"
            raise UnknownModel(
                f"no model {model_name!r} in the store at {self.path} (models: {known}); "
                "pass --model with one of them"
            )
        return [model_name]

    def signatures(self, model_name: str | None = None) -> pa.Table:
        """Distinct call signatures (structure + every size) with their call counts."""
        models = self.check_model(model_name)
        return self.query(
            "SELECT * FROM signatures WHERE model IN (SELECT unnest($models)) "
            "ORDER BY model, in_structure, calls DESC",
            {"models": models},
        )

    def close(self) -> None:
        """Closes the DuckDB connections."""
        self.con.close()
        if self._counted is not None:
            self._counted.close()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
