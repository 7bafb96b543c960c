"""Bounded queue + writer thread: complete zstd Parquet files, tmp name then rename.

The recording thread only appends a call record (a plain tuple in `CallRecord`'s field
order; `InputObserver.to_store` queues the NamedTuple itself) to a deque (tens of
nanoseconds); when the deque holds `queue_size` items the call is dropped and counted, so the
model never waits for the disk. A daemon thread drains the deque every `poll_seconds`,
accumulates columns, and writes a *segment* when `flush_rows` rows are buffered or
`flush_seconds` have passed since the first one:

1. ``structures/model=<m>/<prefix>-<seq>.parquet``: the structures its calls refer to that this
   writer has not written yet (all of them again after the store folder was removed);
2. ``stats/model=<m>/<prefix>-<seq>.parquet``: the writer's *rollup*, one row per distinct
   signature and minute of every segment it wrote so far (up to `schema.ROLLUP_ROWS` rows). It
   replaces the previous rollup, which its footer claims (``capture.replaces``, verified by
   readers, as for a compacted file): a store holds one stats file per writer process, not one
   per flush, and opening it does not cost a read per flush. It names the segment's
   calls files (``capture.segment_calls``), written next;
3. ``calls/model=<m>/date=<d>/<prefix>-<seq>.parquet``: one row per call. These files are the
   segment's commit: readers count the new rollup only once they all exist, and the previous
   one until then (`capture.store.commits`), so a writer killed between the two leaves stats and
   calls that agree;
4. the previous rollup is deleted.

The rollup is marked ``open`` (``capture.rollup``) while the writer may still replace it, and
``closed`` by `close`; a writer idle for `schema.ROLLUP_CONTINUE_S` starts a new rollup, and
`capture compact` merges an open one only once it is `schema.ROLLUP_GRACE_S` old, so the two
never both take over the same rows.

Each file is written as ``.<name>.tmp`` in its final folder and renamed, so readers never see a
partial file (on object stores, S3 and GCS, in one upload under its final name: an object is
visible only once complete). A segment is all or nothing: when a write fails (disk full,
permissions, RLIMIT_FSIZE) the calls files it already renamed are deleted again, then its rollup
(left, uncommitted, when a calls file cannot be deleted: it keeps them hidden), its calls are
counted as dropped and one warning is logged per recorder; every complete file stays untouched. A
record the tables cannot hold is dropped alone (`bad_records`). A SIGKILL loses the rows not yet in
a complete segment: those of the last `flush_seconds` plus those that arrived while the last
segment was being written (bounded by ``flush_rows + queue_size`` calls).
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from capture import schema
from capture.record.segment import CallRecord, Segment, StatsRollup, structure_table
from capture.store import upkeep
from capture.store.files import model_folder, resolve_store, safe_name, write_parquet
from capture.store.layout import METADATA_REPLACES, METADATA_REPLACES_ROWS

if TYPE_CHECKING:  # flatten imports torch; the store readers import this module without it
    from capture.record.flatten import Structure
    from capture.signature import Signature

__all__ = ["StoreWriter", "TMP_MAX_AGE"]

logger = logging.getLogger(__name__)


TMP_MAX_AGE = 3600.0
"""Seconds after which a ``.tmp`` file is a killed writer's leftover, removed by the next writer."""


@dataclass(frozen=True)
class _Staged:
    """A rollup written ahead of its segment's calls files (`StoreWriter._stage_stats`)."""

    path: str
    name: str
    rollup: StatsRollup
    chain: list[tuple[str, int]]
    """The files it claims (name, rows), deleted once it commits."""
    calls: list[str]
    """The calls files that commit it."""


class StoreWriter:
    """Owns the queue and the writer thread of one recorder."""

    def __init__(
        self,
        store: str | os.PathLike[str],
        model_name: str,
        signature: Signature,
        *,
        queue_size: int = 100_000,
        flush_rows: int = 100_000,
        flush_seconds: float = 10.0,
        poll_seconds: float = 0.05,
    ) -> None:
        self.fs, self.root = resolve_store(store)
        self.model_name = model_name
        self.signature = signature
        self.queue_size = queue_size
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self.poll_seconds = poll_seconds
        self.host = os.uname().nodename if hasattr(os, "uname") else "host"
        # Every structure added (id -> Structure), and the ids this writer has written: a segment
        # writes the ones its calls refer to that are missing (again after the store was removed).
        self._structures: dict[str, Structure] = {}
        self._written_ids: set[str] = set()
        self._thread: threading.Thread | None = None
        self._fresh()

    def _fresh(self) -> None:
        """Queue, segment, counters, locks and file prefix of a new writer (or a forked child)."""
        self.pid = os.getpid()
        self.prefix = (
            f"{safe_name(self.host)}-{self.pid}-{time.time_ns() // 1000:x}-{os.urandom(2).hex()}"
        )
        self._queue: collections.deque[CallRecord] = collections.deque()
        self._pending_structures: list[Structure] = []
        self._structures_lock = threading.Lock()
        self._seq = itertools.count()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._flush_now = threading.Event()
        self._flushed = threading.Condition()
        self._flush_generation = 0
        self._drained = 0
        self._count_lock = threading.Lock()
        self.dropped = 0
        self.written_calls = 0
        self.write_errors = 0
        self.bad_records = 0
        self.store_resets = 0
        self.tmp_removed = 0
        self.files: collections.deque[str] = collections.deque(maxlen=1000)  # the latest ones
        self.files_written = 0
        self._warned: set[str] = set()
        self._segment = Segment()
        # The stats rollup (module docstring): its rows, the files of its chain still in the
        # store (the latest first; older ones whose delete failed are claimed again), and the
        # monotonic time of its latest write.
        self._rollup = StatsRollup(self.model_name)
        self._rollup_files: list[tuple[str, int]] = []
        self._rollup_at = 0.0
        self._rollup_closed = False
        self._closing = False

    # -- recording side (any thread) -------------------------------------------------------
    def submit(self, rec: CallRecord) -> bool:
        """Queues one call; False (and counted) when the queue is full or the writer closed."""
        if len(self._queue) >= self.queue_size:
            with self._count_lock:
                self.dropped += 1
            return False
        self._queue.append(rec)  # deque.append is atomic: no lock on the hot path
        return True

    @property
    def recorded(self) -> int:
        """Calls accepted so far (written, buffered in a segment, or still queued)."""
        return self._drained + len(self._queue)

    def add_structure(self, structure: Structure) -> None:
        """Queues a new structure; it is written before any call that refers to it."""
        with self._structures_lock:
            self._pending_structures.append(structure)
            self._structures[structure.structure_id] = structure

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Starts the writer thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"capture-writer-{self.model_name}", daemon=True
        )
        self._thread.start()

    def flush(self, timeout: float | None = 30.0) -> None:
        """Writes everything queued so far, and waits for it (at most `timeout` seconds)."""
        if self._thread is None or not self._thread.is_alive():
            self._drain_and_write(force=True)
            return
        with self._flushed:
            target = self._flush_generation + 1
            self._flush_now.set()
            self._wake.set()
            self._flushed.wait_for(lambda: self._flush_generation >= target, timeout=timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        """Flushes and stops the writer thread; later submissions are counted as dropped."""
        self.queue_size = 0  # submit() refuses from now on (and counts)
        self._stop.set()
        self._wake.set()
        stopped = True
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            stopped = not self._thread.is_alive()
            self._thread = None
        # The last rollup is marked closed (compaction may take it at once) only when no writer
        # thread can replace it any more.
        self._closing = stopped
        self._drain_and_write(force=True)
        if stopped and self._rollup_files and not self._rollup_closed:
            try:
                self._write_stats(None)
            except Exception as e:  # stays open: compaction takes it after its grace period
                self._fail("write", f"closing the stats rollup in {self.root} ({e})")
        late = len(self._queue)  # appended by a submit() that raced with the line above
        if late:
            self._queue.clear()
            with self._count_lock:
                self.dropped += late
                self._drained += late

    def after_fork_in_child(self) -> None:
        """In a forked child: a new file prefix, an empty queue and a new writer thread.

        The calls buffered before the fork are the parent's to write (the child wrote
        them again, under the parent's file names). Structures the parent had written stay
        known; the child's segments write the ones they need that are not.
        """
        running = self._thread is not None
        self._thread = None
        self._fresh()
        if running:
            self.start()

    # -- writer thread -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._clean_tmp()
        except Exception:  # cleaning is a courtesy: never stop the writer for it
            self._fail("tmp cleanup", "removing old .tmp files", exc_info=True)
        while not self._stop.is_set():
            self._wake.wait(self.poll_seconds)
            self._wake.clear()
            force = self._flush_now.is_set()
            self._flush_now.clear()
            try:
                self._drain_and_write(force=force)
            except Exception:  # never let the thread die: count, log once, go on
                self._fail("loop", "writer loop", exc_info=True)
            if force:
                with self._flushed:
                    self._flush_generation += 1
                    self._flushed.notify_all()
        with self._flushed:
            self._flush_generation += 1
            self._flushed.notify_all()

    def _drain_and_write(self, force: bool) -> None:
        queue = self._queue
        while queue:
            rec = queue.popleft()
            self._drained += 1
            try:
                self._segment.add(rec)
            except Exception as e:  # this record alone is dropped
                with self._count_lock:
                    self.dropped += 1
                self.bad_records += 1
                self._fail("record", f"converting a call record ({type(e).__name__}: {e})")
            if len(self._segment) >= self.flush_rows:
                self._write_segment()
        segment = self._segment
        due = time.monotonic() - segment.started >= self.flush_seconds
        if len(segment) and (force or due):
            self._write_segment()
        elif force or due:
            self._write_structures(set())
            segment.started = time.monotonic()

    def _check_store(self) -> None:
        """Forgets the written structures when the store's structures folder was removed."""
        if not self._written_ids:
            return
        folder = f"{self.root}/{schema.STRUCTURES}/{model_folder(self.model_name)}"
        if self.fs.get_file_info(folder).type == pafs.FileType.NotFound:
            self._written_ids.clear()
            # the rollup's rows went with the store
            self._rollup, self._rollup_files = StatsRollup(self.model_name), []
            self.store_resets += 1
            self._fail("reset", f"finding the store's structures under {folder} (removed?)")

    def _write_structures(self, needed: set[str], seq: int | None = None) -> None:
        with self._structures_lock:
            pending, self._pending_structures = self._pending_structures, []
            wanted = {st.structure_id: st for st in pending}
            for sid in needed - self._written_ids - wanted.keys():
                if sid in self._structures:
                    wanted[sid] = self._structures[sid]
        structures = [st for sid, st in wanted.items() if sid not in self._written_ids]
        if not structures:
            return
        seq = next(self._seq) if seq is None else seq
        table = structure_table(self.model_name, structures, self.signature)
        try:
            path = write_parquet(
                self.fs,
                f"{self.root}/{schema.STRUCTURES}/{model_folder(self.model_name)}",
                f"{self.prefix}-{seq:06d}.parquet",
                table,
                schema.STRUCTURES,
            )
            self._written(path)
            self._written_ids.update(st.structure_id for st in structures)
        except Exception as e:
            with self._structures_lock:  # keep them: the next segment tries again
                self._pending_structures[:0] = pending
            raise OSError(f"cannot write structures to {self.root}: {e}") from e

    def _write_segment(self) -> None:
        segment, self._segment = self._segment, Segment()
        folder_name = model_folder(self.model_name)
        seq = next(self._seq)
        name = f"{self.prefix}-{seq:06d}.parquet"
        staged: _Staged | None = None
        try:
            self._check_store()
            self._write_structures(segment.structure_ids(), seq)
            tables = segment.calls_tables(self.model_name, self.host, self.pid)
            # The rollup first, naming the calls files: they are its commit, written next
            # (capture.store.commits). A kill in between leaves the previous rollup counting
            # and these calls hidden; before, calls landed first and a kill left calls no
            # stats row counted, for good.
            days = {day: table.num_rows for day, table in tables.items()}
            staged = self._stage_stats(segment, name, days, self._open_chain())
            for day, table in tables.items():
                write_parquet(
                    self.fs,
                    f"{self.root}/{schema.CALLS}/{folder_name}/date={day}",
                    name,
                    table,
                    "calls",
                )
        except Exception as e:
            # All or nothing: the segment's calls files go, then its rollup; a
            # rollup whose calls could not all be removed stays, uncommitted, hiding them.
            if staged is not None:
                self._roll_back(staged)
            with self._count_lock:
                self.dropped += len(segment)
            self.write_errors += 1
            self._fail("write", f"writing {len(segment)} calls to {self.root} ({e})")
            return
        self._commit_stats(staged)
        for path in staged.calls:
            self._written(path)
        self.written_calls += len(segment)
        try:  # the store's background compaction, when due (capture.store.upkeep)
            upkeep.after_flush(self.fs, self.root)
        except Exception as e:  # a bad CAPTURE_AUTO_COMPACT: said once, recording goes on
            self._fail("upkeep", f"starting the background compaction of {self.root} ({e})")

    def _write_stats(self, segment: Segment | None) -> None:
        """Rewrites the rollup with no new segment (`segment` None: to mark it closed)."""
        chain = self._open_chain()
        if segment is None and not chain:  # nothing to close: the old one stays open
            return
        self._commit_stats(self._stage_stats(segment, None, {}, chain))

    def _open_chain(self) -> list[tuple[str, int]]:
        """The files of the rollup this writer may still replace (empty: start a new one)."""
        if time.monotonic() - self._rollup_at >= schema.ROLLUP_CONTINUE_S:
            return []
        chain = self._rollup_files
        folder = f"{self.root}/{schema.STATS}/{model_folder(self.model_name)}"
        if chain and self.fs.get_file_info(f"{folder}/{chain[0][0]}").type != pafs.FileType.File:
            return []  # removed by someone else: its rows are not ours to carry on
        return chain

    def _stage_stats(
        self,
        segment: Segment | None,
        name: str | None,
        days: dict[str, int],
        chain: list[tuple[str, int]],
    ) -> _Staged:
        """Writes the rollup with `segment`'s signatures added, naming its calls files `days`.

        It claims the files of `chain` (`_open_chain`), which are deleted only by
        `_commit_stats`, once the calls files exist. Raises when the file cannot be written
        (nothing changed then).
        """
        folder = f"{self.root}/{schema.STATS}/{model_folder(self.model_name)}"
        rollup = (self._rollup if chain else StatsRollup(self.model_name)).merged(segment)
        if chain and len(rollup) > schema.ROLLUP_ROWS:  # full: a new rollup for this segment
            chain, rollup = [], StatsRollup(self.model_name).merged(segment)
        meta = {schema.METADATA_ROLLUP: b"closed" if self._closing else b"open"}
        if chain:
            meta[METADATA_REPLACES] = json.dumps([n for n, _ in chain]).encode()
            meta[METADATA_REPLACES_ROWS] = json.dumps(dict(chain)).encode()
        if days:
            meta[schema.METADATA_SEGMENT_CALLS] = json.dumps(days, sort_keys=True).encode()
        name = name or f"{self.prefix}-{next(self._seq):06d}.parquet"
        path = write_parquet(self.fs, folder, name, rollup.table, schema.STATS, meta)
        folder_name = model_folder(self.model_name)
        calls = [
            f"{self.root}/{schema.CALLS}/{folder_name}/date={day}/{name}" for day in sorted(days)
        ]
        return _Staged(path, name, rollup, list(chain), calls)

    def _commit_stats(self, staged: _Staged) -> None:
        """The staged rollup counts now: it becomes the writer's, the ones it claims go."""
        self._written(staged.path)
        self._rollup = staged.rollup
        self._rollup_at = time.monotonic()
        # A closing rollup that names its segment is written once more without it (by close):
        # compaction leaves a rollup's segment calls files alone while the rollup names them.
        self._rollup_closed = self._closing and not staged.calls
        self._rollup_files = [(staged.name, len(staged.rollup))]
        folder = staged.path.rsplit("/", 1)[0]
        # held by the new file (its claim); a failed delete: claimed again
        for old, count in staged.chain:
            try:
                self.fs.delete_file(f"{folder}/{old}")
            except FileNotFoundError:
                pass
            except Exception:
                self._rollup_files.append((old, count))

    def _roll_back(self, staged: _Staged) -> None:
        """Removes a segment that failed: its calls files, then (when they are gone) its rollup."""
        gone = True
        for path in staged.calls:
            try:
                self.fs.delete_file(path)
            except FileNotFoundError:
                pass
            except Exception:  # the rollup stays: uncommitted, it keeps these calls hidden
                gone = False
        if gone:
            try:
                self.fs.delete_file(staged.path)
            except Exception:  # uncommitted all the same; compaction removes it in time
                pass

    def _clean_tmp(self) -> None:
        """Removes ``.tmp`` files older than `TMP_MAX_AGE` (left by killed writers)."""
        now = time.time()
        for table in schema.TABLES:
            selector = pafs.FileSelector(
                f"{self.root}/{table}/{model_folder(self.model_name)}",
                recursive=True,
                allow_not_found=True,
            )
            for info in self.fs.get_file_info(selector):
                if not (info.base_name.startswith(".") and info.base_name.endswith(".tmp")):
                    continue
                if info.mtime is not None and now - info.mtime.timestamp() > TMP_MAX_AGE:
                    self.fs.delete_file(info.path)
                    self.tmp_removed += 1

    def _written(self, path: str) -> None:
        self.files.append(path)
        self.files_written += 1

    def _fail(self, topic: str, what: str, exc_info: bool = False) -> None:
        if topic not in self._warned:
            self._warned.add(topic)
            logger.warning(
                "capture: failed %s; the model keeps running, the calls concerned are counted "
                "in stats() (further failures of this kind are counted without a warning)",
                what,
                exc_info=exc_info,
            )

    def adopt(self, previous: StoreWriter) -> None:
        """Takes over the structures a previous writer of the same recorder knew and wrote."""
        with previous._structures_lock:
            self._structures.update(previous._structures)
            self._written_ids.update(previous._written_ids)
            self._pending_structures.extend(previous._pending_structures)
