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

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from capture import schema
from capture.layout import VANISHED, FileInfo, Skip

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
    if claimant.table != target.table or claimant.folder != target.folder:
        return "it is in another folder or table"
    claimed = claimant.replaces.get(target.name)
    if claimed is not None and claimed != target.rows:
        return f"it records {claimed} rows for it, the file holds {target.rows}"
    if target.rows > claimant.rows and target.table == schema.CALLS:
        return f"it holds {claimant.rows} rows, fewer than the file's {target.rows}"
    if target.rows == 0:
        return None
    names = _KEYS[target.table]
    try:
        if target.table == schema.CALLS:
            ours = _read(fs, target.path, names).cast(
                pa.schema([schema.CALLS_SCHEMA.field(n) for n in names])
            )
            theirs = _read(fs, claimant.path, names).cast(ours.schema)
            missing = ours.join(
                theirs.group_by(names).aggregate([]), keys=names, join_type="left anti"
            )
            if missing.num_rows:
                return f"{missing.num_rows} of the file's calls are not in it"
            return None
        columns = names + (["calls"] if target.table == schema.STATS else [])
        ours, theirs = _read(fs, target.path, columns), _read(fs, claimant.path, columns)
        if not _key_set(ours, names) <= _key_set(theirs, names):
            return "some of the file's rows are not in it"
        if target.table == schema.STATS:
            mine = int(pc.sum(ours.column("calls")).as_py() or 0)
            held = int(pc.sum(theirs.column("calls")).as_py() or 0)
            if held < mine:
                return f"it counts {held} calls, the file {mine}"
        return None
    except FileNotFoundError:  # deleted since the listing: the caller lists again
        return VANISHED
    except Exception as e:  # unreadable rows: the claim is not proven
        return f"its rows cannot be compared ({type(e).__name__})"


def verified_replaced(
    fs: pafs.FileSystem,
    files: Sequence[FileInfo],
    refused: list[Skip] | None = None,
    vanished: set[str] | None = None,
) -> set[str]:
    """Paths of the files in `files` that another file of `files` provably replaces.

    Args:
        fs: The store's filesystem.
        files: The checked files of one table (from `capture.layout.read_footer`).
        refused: Receives one `Skip` per refused claim (path = the claiming file).
        vanished: Receives the claiming file of each claim that could not be checked because
            a file was deleted meanwhile (a writer replacing its rollup): list again. Without
            it, such a claim is refused.

    Returns:
        The paths to hide (readers) or delete as leftovers (compaction).
    """
    by_path = {f.path: f for f in files}
    hidden: set[str] = set()
    for claimant in sorted(files, key=lambda f: f.path):
        if claimant.path in hidden or not claimant.replaces:
            continue
        for name in sorted(claimant.replaces):
            target = by_path.get(f"{claimant.folder}/{name}")
            if target is None or target.path in hidden or target.path == claimant.path:
                continue
            why = holds_rows(fs, claimant, target)
            if why is None:
                hidden.add(target.path)
            elif why == VANISHED and vanished is not None:
                vanished.add(claimant.path)
            elif refused is not None:
                refused.append(
                    Skip(
                        claimant.path,
                        f"claims to replace {name} but does not hold its rows ({why}); "
                        "both files are read",
                    )
                )
    return hidden
