"""Which writer segments count: a rollup counts once its segment's calls files all exist.

A writer flushes a segment in this order (`capture.record.writer`): its new structures; its stats
*rollup*, which names the segment's calls files (``capture.segment_calls``) and claims the
previous rollup; the calls files; then it deletes the previous rollup. The calls files are the
segment's commit. Until every one of them exists, a reader counts the previous rollup (still
there: it is deleted only after the calls landed) and hides the segment's calls files that did
land, so a writer killed anywhere in between leaves a store whose stats and calls agree (calls
that landed before their rollup would stay counted by no stats row, for good).

Readers (`capture.store.checked`) and `capture.compact` ask this module; compaction also leaves
the calls files a rollup names alone while that rollup exists, and rolls back a segment that
never committed once it is `schema.ROLLUP_GRACE_S` old (its writer is gone).

Existence is checked for the rollups that name a segment only (about one per live writer), and
without following links: a link is not a store file. Imports pyarrow only.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence

import pyarrow.fs as pafs

from capture import schema
from capture.store.layout import FileInfo

__all__ = ["segment_paths", "uncommitted", "existing"]


def segment_paths(rollup: FileInfo) -> list[str]:
    """The calls files of the segment a rollup adds (none when it names no segment).

    They sit in ``calls/<its model folder>/date=<day>/`` under the rollup's own name.

    Args:
        rollup: A checked stats file (`capture.store.layout.read_footer`).

    Returns:
        Their paths, by day.

    Example:
        >>> info = FileInfo("/s/stats/model=m/w-000003.parquet", "stats", 1, 9, {},
        ...                 segment={"2026-01-02": 4})
        >>> segment_paths(info)
        ['/s/calls/model=m/date=2026-01-02/w-000003.parquet']
    """
    if not rollup.segment:
        return []
    root, _, model = rollup.folder.rpartition(f"/{schema.STATS}/")
    return [
        f"{root}/{schema.CALLS}/{model}/date={day}/{rollup.name}" for day in sorted(rollup.segment)
    ]


def uncommitted(fs: pafs.FileSystem, rollups: Sequence[FileInfo]) -> dict[str, list[str]]:
    """The rollups whose segment has not committed: not every calls file it names exists.

    Args:
        fs: The store's filesystem.
        rollups: Checked stats files (those naming no segment always count).

    Returns:
        Rollup path -> the calls files its segment names (to hide: they hold calls no
        counted stats row counts).

    Example:
        >>> uncommitted(pafs.LocalFileSystem(), [])
        {}
    """
    named = {r.path: segment_paths(r) for r in rollups if r.segment}
    there = existing(fs, [p for paths in named.values() for p in paths])
    return {r: paths for r, paths in named.items() if not all(p in there for p in paths)}


def existing(fs: pafs.FileSystem, paths: Iterable[str]) -> set[str]:
    """Those of `paths` that are regular files (a symbolic link is not one).

    Args:
        fs: The store's filesystem.
        paths: Files to look for.

    Returns:
        The paths found.

    Example:
        >>> existing(pafs.LocalFileSystem(), ["/no/such/file"])
        set()
    """
    wanted = list(paths)
    if not wanted:
        return set()
    if isinstance(fs, pafs.LocalFileSystem):
        found = set()
        for path in wanted:
            try:
                if stat.S_ISREG(os.lstat(path).st_mode):
                    found.add(path)
            except OSError:  # not there (or not reachable): not committed
                continue
        return found
    return {i.path for i in fs.get_file_info(wanted) if i.type == pafs.FileType.File}
