"""The checked files of one store table: each file's verdict (cached or read), rows, claims.

What `capture.store.reader` shows of a table: every listed file checked (`capture.store.layout`),
the rows of the small stats and structures files read in the same read, the files that a compacted
file provably replaces left out (`capture.store.claims`), with the reader's cache
(`capture.store.footer_cache`) standing in for files already checked. Imports pyarrow only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs

from capture import schema
from capture.store import footer_cache
from capture.store.claims import verified_replaced
from capture.store.commits import uncommitted
from capture.store.footer_procs import checked_blocks, start_helpers
from capture.store.layout import (
    VANISHED,
    FileInfo,
    Skip,
    list_files,
)
from capture.store.values import rows_problem

__all__ = ["CheckedTable", "check_table"]

_LISTINGS = 10
"""Times a table is listed again when files vanish between listing and reading."""
COLUMN_FILES = 1_000
"""Fewest calls files whose columns are read with their checks: below, DuckDB reading the
files after the check costs about what the check does."""
COLUMN_BUDGET = 256 << 20
"""Most bytes of calls rows read with the checks (the reader's share half, each helper's a
quarter); a larger read is left to DuckDB, which streams it."""


@dataclass(frozen=True)
class CheckedTable:
    """What a reader sees of one table."""

    kept: list[str]
    """The files that join the table's view, sorted."""
    skipped: list[Skip]
    """Files left out, and why (foreign, wrong schema, truncated, bomb, newer version, link)."""
    refused: list[Skip]
    """Claims of ``capture.replaces`` not proven (both files are read)."""
    rows: pa.Table | None
    """The rows of the kept files (stats and structures; None for calls or no file)."""
    exact: bool
    """Every kept file has exactly the table's columns."""
    waiting: frozenset[str] = frozenset()
    """Stats: the calls files of segments not committed yet (`capture.store.commits`): their
    calls are hidden, as their rollup is not counted."""
    folders: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Partition folder -> (kept files, their rows): what a compaction would merge."""
    uniform: bool = True
    """Every kept file has the same columns, in the same order (no merging by name needed:
    columns that all of them lack, added by a later version, are added as nulls)."""
    file_rows: dict[str, int] = field(default_factory=dict)
    """Kept file -> its rows, from its checked footer (`capture.store.row_counts`)."""
    columns: pa.Table | None = None
    """Calls: the asked columns of every kept file's rows, read with the checks, with the
    file column (`footer_cache`, dictionary-encoded); None when not asked or not all read."""


def check_table(
    fs: pafs.FileSystem,
    root: str,
    table: str,
    cache: footer_cache.FooterCache | None,
    columns: Sequence[str] | None = None,
) -> CheckedTable:
    """The files of `table` that join its view: checked, not provably replaced.

    A file deleted between the listing and its read (a writer replacing its stats rollup, a
    compaction) means a file that holds its rows appeared meanwhile: the table is listed
    again (at most `_LISTINGS` times; then the vanished files are left out, unreported, and
    so is a claimed file deleted while its claim was being checked: the rollup claiming it
    is the one that replaced it, and reading both would count its calls twice).

    Stats and structures files are read whole with their check (`read_with_rows`), their rows
    returned. Verdicts and rows of files already checked come from `cache` when the file's
    stamp is unchanged (`capture.store.footer_cache`); the claims are verified again every time.

    Args:
        fs: The store's filesystem.
        root: The store's root on `fs`.
        table: ``calls``, ``stats`` or ``structures``.
        cache: The reader's cache (used for tables of `footer_cache.MIN_FILES` files or more).
        columns: Calls: columns whose rows to read with the checks (`CheckedTable.columns`),
            from `COLUMN_FILES` files on, until they hold `COLUMN_BUDGET` bytes; every file
            is then read and checked again, cached or not.
    """
    for _ in range(_LISTINGS - 1):
        found = _check_once(fs, root, table, cache, columns, last=False)
        if not found.vanished:
            return found.checked
    return _check_once(fs, root, table, cache, columns, last=True).checked


@dataclass(frozen=True)
class _Attempt:
    checked: CheckedTable
    vanished: bool


def _check_once(
    fs: pafs.FileSystem,
    root: str,
    table: str,
    cache: footer_cache.FooterCache | None,
    columns: Sequence[str] | None,
    last: bool,
) -> _Attempt:
    skips: list[Skip] = []
    stamps: dict[str, str] = {}
    infos = list_files(fs, root, table, skips, stamps)
    small = table != schema.CALLS
    if len(infos) < footer_cache.MIN_FILES:
        cache = None
    cached, cached_rows = cache.load(table) if cache else ({}, None)
    if small and cached_rows is None:
        cached = {}
    verdicts = {p: v for p, (stamp, v) in cached.items() if stamps.get(p) == stamp}
    known = len(verdicts)  # files whose cached verdict holds: the cache is saved when fewer
    if table != schema.CALLS or len(infos) < COLUMN_FILES:
        columns = None  # DuckDB reads the files after the check as cheaply
    elif columns is not None:
        verdicts = {}  # every file is read for its columns: DuckDB would open each one anyway
    todo = [i.path for i in infos if i.path not in verdicts]
    todo_set = set(todo)

    fresh = _read(fs, table, todo, verdicts, columns)  # rows read now, with the file column
    good: list[FileInfo] = []
    vanished: set[str] = set()
    for info in infos:
        checked = verdicts[info.path]
        if isinstance(checked, Skip) and checked.reason == VANISHED:
            vanished.add(info.path)
        elif isinstance(checked, Skip):
            skips.append(checked)
        else:
            good.append(checked)
    if vanished:  # never cached: the path is gone
        infos = [i for i in infos if i.path not in vanished]
    # a rollup counts once its segment's calls files all exist; until then the one it claims
    # counts instead, and the calls that landed are hidden (capture.store.commits)
    pending = uncommitted(fs, good) if table == schema.STATS else {}
    counted = [f for f in good if f.path not in pending]
    # by a compacted file (capture.compact) that provably holds their rows: read it instead
    refused: list[Skip] = []
    # a claim whose file vanished while it was checked hides that file (it is gone): the last
    # time too, without listing again; any other claim not proven is refused (both files read)
    replaced = verified_replaced(fs, counted, refused, set() if last else vanished)
    kept = sorted(f.path for f in counted if f.path not in replaced)
    rows = kept_rows = None
    if small:
        again = [f.path for f in good if f.path not in todo_set]
        if again and cached_rows is not None:
            cached_good = sum(isinstance(v, FileInfo) for _, v in cached.values())
            every = len(again) == cached_good  # all cached files still there: no filter
            mask = None if every else footer_cache.file_mask(cached_rows, again)
            fresh.insert(0, cached_rows if mask is None else cached_rows.filter(mask))
        rows = _concat(fresh)
        if rows is not None:
            kept_rows = footer_cache.rows_of(rows, kept, len(kept) == len(good))
    if cache is not None and (len(infos) > known or len(cached) != len(infos)):
        cache.save(table, {i.path: (stamps[i.path], verdicts[i.path]) for i in infos}, rows)
    final = [f for f in counted if f.path not in replaced]
    exact = all(f.exact for f in final)
    uniform = len({f.columns for f in final}) <= 1
    waiting = frozenset(p for paths in pending.values() for p in paths)
    counts = {f.path: f.rows for f in final}
    read = _read_columns(fresh, final) if columns is not None else None
    result = CheckedTable(
        kept, skips, refused, kept_rows, exact, waiting, _folders(final), uniform, counts, read
    )
    return _Attempt(result, bool(vanished))


def _folders(kept: list[FileInfo]) -> dict[str, tuple[int, int]]:
    """Partition folder -> (files, rows) of `kept`."""
    folders: dict[str, tuple[int, int]] = {}
    for f in kept:
        files, rows = folders.get(f.folder, (0, 0))
        folders[f.folder] = (files + 1, rows + f.rows)
    return folders


def _read_columns(fresh: list[pa.Table], final: list[FileInfo]) -> pa.Table | None:
    """The rows read of the `final` files (with the file column), None unless every row of
    theirs was read (a budget reached, a page that did not decode)."""
    if not fresh or not final:
        return None
    rows = pa.concat_tables(fresh, promote_options="permissive")
    rows = rows.filter(footer_cache.file_mask(rows, [f.path for f in final]))
    return rows if rows.num_rows == sum(f.rows for f in final) else None


def _read(
    fs: pafs.FileSystem,
    table: str,
    paths: list[str],
    verdicts: dict[str, FileInfo | Skip],
    columns: Sequence[str] | None = None,
) -> list[pa.Table]:
    """Checks `paths`, their verdicts into `verdicts`; the rows read, in the order of `paths`.

    Many files at once (helper processes, a thread pool): one after the other, 100,000 files
    took minutes to open. Each is checked against the schema.
    """
    helpers, own = start_helpers(fs, table, paths, columns, COLUMN_BUDGET // 4)
    try:
        mine = _read_here(fs, table, own, verdicts, not helpers, columns)
        fresh: list[pa.Table] = []
        for helper in helpers:
            found = helper.results()
            if found is None:  # it failed: its share is checked here, the same way
                fresh.extend(_read_here(fs, table, helper.paths, verdicts, False, columns))
            else:
                verdicts.update(found[0])
                if found[1] is not None:
                    fresh.extend(_sound(table, found[1], verdicts))
        return fresh + mine
    finally:
        for helper in helpers:  # those not waited for (an error here) are stopped
            helper.close()


def _read_here(
    fs: pafs.FileSystem,
    table: str,
    paths: list[str],
    verdicts: dict[str, FileInfo | Skip],
    threads: bool,
    columns: Sequence[str] | None = None,
) -> list[pa.Table]:
    """Checks `paths` in this process (in this thread unless `threads`: helper processes check
    the other shares), their verdicts into `verdicts`; the rows read, one table per block
    (100,000 small tables cost GBs of memory), calls rows until `COLUMN_BUDGET` bytes."""
    fresh = []
    for found, rows in checked_blocks(fs, table, paths, threads, columns, COLUMN_BUDGET // 2):
        verdicts.update(found)
        if rows is not None:
            fresh.extend(_sound(table, rows, verdicts))
    return fresh


def _sound(table: str, rows: pa.Table, verdicts: dict[str, FileInfo | Skip]) -> list[pa.Table]:
    """`rows` (a file column: the rows of many files), their values checked at once
    (`rows_problem`: a few compute calls, not a few per file); only when they hold a problem
    is each file checked, and each one at fault marked corrupt in `verdicts`."""
    if rows_problem(table, rows) is None:
        return [rows]
    sound = []
    for path, one in footer_cache.split_files(rows).items():
        problem = rows_problem(table, one)
        if problem is None:
            sound.append(one)
        else:
            verdicts[path] = Skip(path, problem, corrupt=True)
    return sound


def _concat(parts: list[pa.Table]) -> pa.Table | None:
    """One table of `parts` (columns of other versions kept), in few chunks."""
    if not parts:
        return None
    return pa.concat_tables(parts, promote_options="permissive").combine_chunks()
