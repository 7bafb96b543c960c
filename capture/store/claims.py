"""Which store files a compacted file may hide: its ``capture.replaces`` claim, verified.

A compacted file lists in its footer the files it replaces (`capture.compact`). Anyone who can
write one file into a store could list the real files there, so a listed file is hidden (by
readers) or deleted (by compaction) only when the listing file *provably holds its rows*:

- the row count recorded for it in ``capture.replaces_rows`` (when recorded) matches the file;
- every row key of the listed file is in the listing file: calls by (host, pid, call_id, ts),
  structures by (model, structure_id, leaf), stats by signature, with at least as many calls
  counted in the listing file as in the listed ones.

Listed files exist only between a compaction's rename and its deletes (or after it died
there), so this reads rows in that rare case only. A file never hides itself, a hidden file
hides nothing, and a failed claim is reported (both files stay visible: a reader may count
some calls twice, but loses none).

Imports pyarrow only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from capture import schema
from capture.store.files import vanished
from capture.store.layout import VANISHED, FileInfo, Skip
from capture.store.many_reads import read_footers

__all__ = ["verified_replaced", "holds_rows"]

_KEYS = {
    schema.CALLS: ["host", "pid", "call_id", "ts"],
    schema.STRUCTURES: ["model", "structure_id", "leaf"],
    schema.STATS: ["model", "in_structure", "out_structure", "dims", "out_dims"],
}


def _read(fs: pafs.FileSystem, path: str, columns: list[str]) -> pa.Table:
    with fs.open_input_file(path) as f:
        return pq.read_table(f, columns=columns)


def _key_set(table: pa.Table, names: list[str]) -> set[tuple[object, ...]]:
    columns = [table.column(n).to_pylist() for n in names]
    return {
        tuple(tuple(v) if isinstance(v, list) else v for v in row)
        for row in zip(*columns, strict=True)
    }


def holds_rows(fs: pafs.FileSystem, claimant: FileInfo, target: FileInfo) -> str | None:
    """None when `claimant` holds every row of `target`, else why not (one line).

    Args:
        fs: The store's filesystem.
        claimant: The file whose footer lists `target`.
        target: The listed file (same folder, same table).
    """
    return _held(fs, claimant, [target])[target.path]


def _cheap_reason(claimant: FileInfo, target: FileInfo) -> str | None:
    """Why `claimant` cannot hold `target`, from their footers alone (None: read the rows)."""
    if claimant.table != target.table or claimant.folder != target.folder:
        return "it is in another folder or table"
    claimed = claimant.replaces.get(target.name)
    if claimed is not None and claimed != target.rows:
        return f"it records {claimed} rows for it, the file holds {target.rows}"
    if target.rows > claimant.rows and target.table == schema.CALLS:
        return f"it holds {claimant.rows} rows, fewer than the file's {target.rows}"
    return None


_CHUNK = 1_000
"""Listed files whose rows are compared at once with their claimant's."""


def _held(
    fs: pafs.FileSystem, claimant: FileInfo, targets: Sequence[FileInfo]
) -> dict[str, str | None]:
    """`holds_rows` for every file of `targets` (listed by `claimant`), by path.

    The claimant's rows are read once for all of them: a compaction of 100,000 files that
    died before its deletes listed 100,000 files, each compared with a 1,000,000-row file
    (hours, where one read of it and its files' keys takes a minute).
    """
    out: dict[str, str | None] = {}
    todo: list[FileInfo] = []
    for target in targets:
        why = _cheap_reason(claimant, target)
        if why is None and target.rows:
            todo.append(target)
        else:
            out[target.path] = why
    if not todo:
        return out
    names = _KEYS[todo[0].table]
    columns = names + (["calls"] if todo[0].table == schema.STATS else [])
    theirs = _try_read(fs, claimant.path, columns)
    try:
        if isinstance(theirs, Exception):
            raise theirs
        check = _checker(todo[0].table, theirs)
    except Exception as e:  # unreadable rows: no claim of this file is proven
        return out | {t.path: _uncompared(e) for t in todo}
    for start in range(0, len(todo), _CHUNK):
        chunk = todo[start : start + _CHUNK]
        good: list[tuple[FileInfo, pa.Table]] = []
        reader = functools.partial(_try_read, columns=columns)
        for target, rows in zip(
            chunk, read_footers(fs, [t.path for t in chunk], reader, decodes=True), strict=True
        ):
            if isinstance(rows, Exception):
                out[target.path] = _uncompared(rows)
            else:
                good.append((target, rows))
        try:
            out.update(check(good))
        except Exception as e:  # uncomparable rows: none of these claims is proven
            out.update({t.path: _uncompared(e) for t, _ in good})
    return out


_Check = Callable[[list[tuple[FileInfo, pa.Table]]], dict[str, "str | None"]]


def _checker(table: str, theirs: pa.Table) -> _Check:
    """What says, for listed files and their key rows, whether `theirs` holds them."""
    names = _KEYS[table]
    if table == schema.CALLS:
        key_schema = pa.schema([schema.CALLS_SCHEMA.field(n) for n in names])
        held = theirs.cast(key_schema).group_by(names).aggregate([])
        return functools.partial(_missing_calls, names=names, held=held)
    keys = _key_set(theirs, names)
    counted = int(pc.sum(theirs.column("calls")).as_py() or 0) if table == schema.STATS else 0

    def check(files: list[tuple[FileInfo, pa.Table]]) -> dict[str, str | None]:
        return {t.path: _set_reason(rows, names, keys, counted) for t, rows in files}

    return check


def _uncompared(e: Exception) -> str:
    if isinstance(e, FileNotFoundError):  # deleted since the listing: the caller lists again
        return VANISHED
    return f"its rows cannot be compared ({type(e).__name__})"


def _try_read(fs: pafs.FileSystem, path: str, columns: list[str]) -> pa.Table | Exception:
    """The key rows of `path`, or what reading it raised (`FileNotFoundError` when it is gone,
    whatever the filesystem raised: S3 says so with a plain `OSError`)."""
    try:
        return _read(fs, path, columns)
    except Exception as e:  # said per file by the caller
        return FileNotFoundError(path) if vanished(fs, path, e) else e


def _set_reason(
    ours: pa.Table, names: list[str], held: set[tuple[object, ...]], counted: int
) -> str | None:
    """Stats and structures: every key of `ours` held, and (stats) as many calls counted."""
    if not _key_set(ours, names) <= held:
        return "some of the file's rows are not in it"
    if "calls" in ours.column_names:
        mine = int(pc.sum(ours.column("calls")).as_py() or 0)
        if counted < mine:
            return f"it counts {counted} calls, the file {mine}"
    return None


def _missing_calls(
    files: list[tuple[FileInfo, pa.Table]], names: list[str], held: pa.Table
) -> dict[str, str | None]:
    """Calls files: how many of each file's calls `held` (the claimant's distinct keys) lacks."""
    if not files:
        return {}
    ours = pa.concat_tables(
        [
            rows.cast(held.schema).append_column("_file", pa.array([i] * rows.num_rows, pa.int32()))
            for i, (_, rows) in enumerate(files)
        ]
    )
    missing = ours.join(held, keys=names, join_type="left anti")
    lost = pc.value_counts(missing.column("_file")).to_pylist() if missing.num_rows else []
    counts = {int(v["values"]): int(v["counts"]) for v in lost}
    return {
        t.path: f"{counts[i]} of the file's calls are not in it" if i in counts else None
        for i, (t, _) in enumerate(files)
    }


def verified_replaced(
    fs: pafs.FileSystem,
    files: Sequence[FileInfo],
    refused: list[Skip] | None = None,
    vanished: set[str] | None = None,
) -> set[str]:
    """Paths of the files in `files` that another file of `files` provably replaces.

    Args:
        fs: The store's filesystem.
        files: The checked files of one table (from `capture.store.layout.read_footer`).
        refused: Receives one `Skip` per refused claim (path = the claiming file).
        vanished: Receives the claiming file of each claim that could not be checked because
            the claimed file was deleted meanwhile (a writer replacing its rollup deletes the
            one its new rollup claims): the claimed file is then hidden, as gone, and the
            caller lists again. Without it (compaction), such a claim is refused.

    Returns:
        The paths to hide (readers) or delete as leftovers (compaction).
    """
    by_path = {f.path: f for f in files}
    hidden: set[str] = set()
    for claimant in sorted(files, key=lambda f: f.path):
        if claimant.path in hidden or not claimant.replaces:
            continue
        targets: dict[str, FileInfo] = {}
        for name in sorted(claimant.replaces):
            target = by_path.get(f"{claimant.folder}/{name}")
            if target is None or target.path in hidden or target.path == claimant.path:
                continue
            targets[name] = target
        verdicts = _held(fs, claimant, list(targets.values()))
        for name, target in targets.items():
            why = verdicts[target.path]
            if why is None:
                hidden.add(target.path)
            elif why == VANISHED and vanished is not None:
                vanished.add(claimant.path)
                hidden.add(target.path)
            elif refused is not None:
                refused.append(
                    Skip(
                        claimant.path,
                        f"claims to replace {name} but does not hold its rows ({why}); "
                        "both files are read",
                    )
                )
    return hidden
