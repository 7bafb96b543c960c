"""Checking many local store files on every core: shares of the files go to helper processes.

A file's check (`capture.store.layout.read_footer`; `read_with_rows` for the small stats and
structures files, whose rows are decoded with it) is Python holding the GIL between short calls
into pyarrow, and each of those calls hands the GIL over: threads of one process fight for it
and spend more than they save (10,000 footers from the page cache: 0.21 ms a file in one
thread, 0.27 ms of wall and 0.37 ms of CPU in two). So a reader that must check many files of a
local store hands contiguous shares of them to helper processes and checks the last share
itself; each process checks its share in one thread.

A helper is ``python -m capture.store.footer_procs TABLE``: the same interpreter, and the same
capture package (its folder leads ``PYTHONPATH``). It reads the paths as a JSON list on stdin
and writes, on stdout, its verdicts and the rows it decoded as Arrow IPC streams: data, never
pickles. Its rows' values are not checked there: the reader checks them with its own
(`capture.store.checked`), as it does for the rows it decoded itself.

A helper that cannot start, fails or writes anything else leaves its share to the reader, which
checks it the same way (the same verdicts, later), and says so in a debug log. Only local
stores use helpers (an object store's reads wait on the network: threads overlap them), only
for `MIN_SHARE` files or more per process, and ``$CAPTURE_CHECK_PROCESSES`` caps the processes
(``1`` checks everything in the reader's process).

Imports pyarrow only.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc

from capture import schema
from capture.store import footer_cache
from capture.store.layout import FileInfo, Skip, read_columns, read_with_rows
from capture.store.many_reads import read_footers

__all__ = [
    "Checked",
    "ENV",
    "Helper",
    "MIN_SHARE",
    "ROWS_BLOCK",
    "blocks",
    "check_block",
    "check_here",
    "check_one",
    "checked_blocks",
    "processes",
    "start_helpers",
]

logger = logging.getLogger("capture.store")

MIN_SHARE = 2_000
"""Fewest files a process is given: a helper's start (an interpreter and pyarrow's import,
about 0.3 s) costs what checking ~1,000 files does."""
_MAX_PROCESSES = 8
_HEAD_START = 1_000
"""Files the reader checks while a helper starts (about 0.3 s: 0.23 ms a calls file's footer,
0.5 ms a small file's rows)."""
ROWS_BLOCK = 512
"""Small files whose rows are merged into one table at a time: each file's own table costs
about 40 KB of memory until then (a block of 4,096 files: 175 MiB)."""
_CALLS_BLOCK = 4096
"""Calls files checked at a time (no rows to merge: the block only paces `read_footers`)."""
ENV = "CAPTURE_CHECK_PROCESSES"
_LENGTH = struct.Struct("<Q")
_CPU_MAX = "/sys/fs/cgroup/cpu.max"

Verdict = FileInfo | Skip
Checked = tuple[dict[str, Verdict], pa.Table | None]
"""Each path's verdict, and the rows decoded from the passing small files (a
``footer_cache`` file column; None for calls files or when none passed)."""


def processes(fs: pafs.FileSystem, files: int) -> int:
    """How many processes (the reader's included) check `files` files of `fs`."""
    if not isinstance(fs, pafs.LocalFileSystem) or files < 2 * MIN_SHARE:
        return 1
    chosen = os.environ.get(ENV, "").strip()
    if chosen:
        try:
            cap = max(1, int(chosen))
        except ValueError:
            logger.warning("capture: $%s=%r is not a number of processes: ignored", ENV, chosen)
            cap = _MAX_PROCESSES
    else:
        cap = _MAX_PROCESSES
    return max(1, min(cap, _cores(), files // MIN_SHARE))


def _cores() -> int:
    """The cores this process may use: its CPU affinity, within its cgroup's CPU quota (a
    container limited to 2 CPUs of a 64-core host gets 2)."""
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    try:
        with open(_CPU_MAX) as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(quota) // int(period)))
    except (OSError, ValueError):  # no cgroup v2 quota to read: the affinity stands
        pass
    return cores


def check_one(
    fs: pafs.FileSystem, table: str, path: str, columns: Sequence[str] | None = None
) -> tuple[Verdict, pa.Table | None]:
    """One file's verdict and, for a small file that passed, its rows (values not checked yet:
    the reader checks many files' rows at once); for a calls file, the rows of `columns`
    (None: no rows)."""
    if table == schema.CALLS:
        return read_columns(fs, path, table, columns)
    return read_with_rows(fs, path, table, check_values=False)


def blocks(table: str, paths: Sequence[str]) -> Iterator[Sequence[str]]:
    """`paths` in the blocks they are checked in: `ROWS_BLOCK` small files (their rows merged
    per block), `_CALLS_BLOCK` calls files."""
    step = _CALLS_BLOCK if table == schema.CALLS else ROWS_BLOCK
    for start in range(0, len(paths), step):
        yield paths[start : start + step]


def check_block(
    fs: pafs.FileSystem,
    table: str,
    paths: Sequence[str],
    threads: bool = False,
    columns: Sequence[str] | None = None,
) -> Checked:
    """The verdicts of one block of `paths` and their rows in one table, checked in this
    thread, or by `read_footers`'s threads where they help (`threads`). Calls files' rows (of
    `columns`) carry a dictionary-encoded file column: many rows, few files."""
    if threads:
        checked = read_footers(
            fs,
            paths,
            lambda f, p: check_one(f, table, p, columns),
            decodes=table != schema.CALLS,
        )
    else:
        checked = [check_one(fs, table, p, columns) for p in paths]
    verdicts: dict[str, Verdict] = {}
    tables, names = [], []
    for path, (verdict, rows) in zip(paths, checked, strict=True):
        verdicts[path] = verdict
        if rows is not None:
            tables.append(rows)
            names.append(path)
    if not tables:
        return verdicts, None
    return verdicts, footer_cache.with_files(tables, names, dictionary=table == schema.CALLS)


def checked_blocks(
    fs: pafs.FileSystem,
    table: str,
    paths: Sequence[str],
    threads: bool = False,
    columns: Sequence[str] | None = None,
    budget: int = 0,
) -> Iterator[Checked]:
    """`check_block` of each block of `paths` in turn; calls files' rows of `columns` are read
    until the blocks so far hold more than `budget` bytes (the later blocks: verdicts alone)."""
    held = 0
    for part in blocks(table, paths):
        found, rows = check_block(fs, table, part, threads, columns if held <= budget else None)
        if rows is not None:
            held += rows.nbytes
        yield found, rows


def check_here(
    fs: pafs.FileSystem,
    table: str,
    paths: Sequence[str],
    columns: Sequence[str] | None = None,
    budget: int = 0,
) -> Checked:
    """The verdicts of `paths` and the small files' rows (calls files: the rows of `columns`,
    until they hold `budget` bytes), checked in this thread (a helper's share)."""
    verdicts: dict[str, Verdict] = {}
    parts: list[pa.Table] = []
    for found, rows in checked_blocks(fs, table, paths, columns=columns, budget=budget):
        verdicts.update(found)
        if rows is not None:
            parts.append(rows)
    return verdicts, pa.concat_tables(parts, promote_options="permissive") if parts else None


class Helper:
    """One helper process checking a share of the files."""

    def __init__(
        self,
        table: str,
        paths: Sequence[str],
        columns: Sequence[str] | None = None,
        budget: int = 0,
    ) -> None:
        self.table = table
        self.paths = list(paths)
        self._ask = {"paths": self.paths, "columns": columns and list(columns), "budget": budget}
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package, env.get("PYTHONPATH")) if p)
        env[ENV] = "1"
        self.process: subprocess.Popen[bytes] | None = None
        self._feeding: threading.Thread | None = None
        try:
            self.process = subprocess.Popen(
                _command(table),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
            )
        except OSError as e:  # no interpreter to start (an embedded Python): checked here
            logger.debug("capture: no helper process for %d files (%s)", len(self.paths), e)
            return
        # the paths go in while the helper starts and the reader checks its own share
        self._feeding = threading.Thread(target=self._feed, name="capture-helper-feed")
        self._feeding.start()

    def _feed(self) -> None:
        assert self.process is not None and self.process.stdin is not None
        try:
            with self.process.stdin as stdin:
                stdin.write(json.dumps(self._ask).encode())
        except OSError:  # the helper is gone: `results` says so
            pass

    def results(self) -> Checked | None:
        """The helper's verdicts and rows; None when it failed (check its share again)."""
        if self.process is None or self._feeding is None:
            return None
        try:
            assert self.process.stdout is not None
            out = self.process.stdout.read()
            self._feeding.join()
            if self.process.wait() != 0:
                raise ValueError(f"it exited with {self.process.returncode}")
            return _decoded(out, self.table, self.paths)
        except Exception as e:  # a failed helper costs time, never a verdict
            self.process.kill()
            self.process.wait()
            logger.debug("capture: a helper's check of %d files failed (%s)", len(self.paths), e)
            return None

    def close(self) -> None:
        """Stops the helper if it still runs (its results are no longer wanted)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        if self._feeding is not None:
            self._feeding.join()


def start_helpers(
    fs: pafs.FileSystem,
    table: str,
    paths: Sequence[str],
    columns: Sequence[str] | None = None,
    budget: int = 0,
) -> tuple[list[Helper], list[str]]:
    """Helpers started on the first shares of `paths`, and the last share (the caller's);
    calls files' rows of `columns` are read too, `budget` bytes at most per process.

    The caller's share is `_HEAD_START` files larger: it starts checking at once, while each
    helper first starts an interpreter and imports pyarrow.
    """
    count = processes(fs, len(paths))
    if count == 1:
        return [], list(paths)
    each = max(1, (len(paths) - _HEAD_START) // count)
    shares = [paths[i * each : (i + 1) * each] for i in range(count - 1)]
    helpers = [Helper(table, share, columns, budget) for share in shares]
    return helpers, list(paths[(count - 1) * each :])


def _command(table: str) -> list[str]:
    """The helper's command line: this interpreter running this module."""
    return [sys.executable, "-m", __name__, table]


def _decoded(out: bytes, table: str, paths: Sequence[str]) -> Checked:
    """A helper's output: two length-prefixed IPC streams, the verdicts and the rows."""
    (length,) = _LENGTH.unpack_from(out, 0)
    index = pa.ipc.open_stream(out[_LENGTH.size : _LENGTH.size + length]).read_all()
    rest = out[_LENGTH.size + length :]
    rows = pa.ipc.open_stream(rest).read_all() if rest else None
    verdicts = {
        path: verdict for path, (_, verdict) in footer_cache.verdicts_of(index, table).items()
    }
    if set(verdicts) != set(paths):
        raise ValueError("its verdicts are not those of the files it was given")
    if rows is not None and not set(footer_cache.files_of(rows)) <= set(paths):
        raise ValueError("its rows name files it was not given")
    return verdicts, rows


def _stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as out:
        out.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def _main(table: str) -> None:
    ask = json.loads(sys.stdin.buffer.read())
    paths, columns, budget = ask["paths"], ask["columns"], ask["budget"]
    if (
        table not in schema.TABLES
        or not all(isinstance(p, str) for p in paths)
        or not (columns is None or all(c in schema.CALLS_SCHEMA.names for c in columns))
        or not isinstance(budget, int)
    ):
        raise SystemExit(2)
    verdicts, rows = check_here(pafs.LocalFileSystem(), table, paths, columns, budget)
    index = _stream(footer_cache.verdict_table({p: ("", v) for p, v in verdicts.items()}))
    sys.stdout.buffer.write(_LENGTH.pack(len(index)) + index)
    if rows is not None:
        sys.stdout.buffer.write(_stream(rows))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    _main(sys.argv[1])
