"""Bounded queue + writer thread: complete zstd Parquet files, tmp name then rename.

The recording thread only appends a tuple to a deque (tens of nanoseconds); when the deque holds
`queue_size` items the call is dropped and counted, so the model never waits for the disk. A
daemon thread drains the deque every `poll_seconds`, accumulates columns, and writes a *segment*
when `flush_rows` rows are buffered or `flush_seconds` have passed since the first one:

1. ``structures/model=<m>/<prefix>-<seq>.parquet``: structures first seen since the last segment;
2. ``stats/model=<m>/<prefix>-<seq>.parquet``: one row per distinct signature in the segment;
3. ``calls/model=<m>/date=<d>/<prefix>-<seq>.parquet``: one row per call.

Each file is written as ``.<name>.tmp`` in its final folder and renamed, so readers never see a
partial file (on object stores, S3 and GCS, in one upload under its final name: an object is
visible only once complete). A SIGKILL loses the rows buffered since the last segment: at most
``flush_rows + queue_size`` calls, or what `flush_seconds` let accumulate. A write that fails
(disk full, permissions, RLIMIT_FSIZE) removes its temporary file, counts the segment's calls as
dropped, logs one warning per recorder, and leaves every complete file untouched.
"""

from __future__ import annotations

import collections
import datetime as dt
import itertools
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from capture import schema

if TYPE_CHECKING:  # flatten imports torch; the store readers import this module without it
    from capture.flatten import Param, Structure

__all__ = [
    "CallRecord",
    "StoreWriter",
    "resolve_store",
    "write_parquet",
    "library_version",
    "safe_name",
]

logger = logging.getLogger(__name__)

# (call_id, ts_ns, in_structure_id, out_structure_id, dims, out_dims, ranges, duration_ns,
#  error); dims are every tensor size of the call, concatenated in leaf order.
CallRecord = tuple[
    int,
    int,
    str,
    str | None,
    tuple[int, ...],
    tuple[int, ...] | None,
    Sequence[int | None] | None,
    int,
    str | None,
]


def library_version() -> str:
    """The installed version of this package ('0+unknown' from a source tree)."""
    try:
        from importlib.metadata import version

        return version("capture")
    except Exception:  # not installed (running from a checkout)
        return "0+unknown"


def resolve_store(store: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and root path for a local directory or a filesystem URI."""
    text = os.fspath(store)
    if "://" in text:
        from capture.remote import bounded, store_error

        try:
            fs, root = pafs.FileSystem.from_uri(text)
        except (pa.ArrowInvalid, OSError) as e:  # unknown scheme, bad option: one line (#14)
            raise store_error(text, e) from None
        return bounded(fs), root.rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(text)


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
        # in memory and written under its final name in one upload (issue 14).
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
    """`value` safe as a directory or file name part (hive partition values, host names)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in value)
    return safe or "_"


_PACKERS: dict[int, Callable[..., bytes]] = {}


def _pack(values: tuple[int, ...]) -> bytes:
    """Ints as little-endian int64 bytes."""
    pack = _PACKERS.get(len(values))
    if pack is None:
        pack = _PACKERS[len(values)] = struct.Struct(f"<{len(values)}q").pack
    return pack(*values)


def _list_array(packed: Sequence[bytes | None]) -> pa.Array:
    """A list<int64> Arrow array from `_pack`ed rows (None: a null list)."""
    lengths = np.fromiter(
        (0 if b is None else len(b) >> 3 for b in packed), np.int32, count=len(packed)
    )
    offsets = np.zeros(len(packed) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.frombuffer(b"".join(b for b in packed if b is not None), "<i8")
    nulls = None
    if any(b is None for b in packed):  # a null start offset makes its list null
        nulls = np.zeros(len(packed) + 1, np.bool_)
        nulls[:-1] = [b is None for b in packed]
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32(), mask=nulls),
        pa.array(values, pa.int64()),
        type=pa.list_(pa.int64()),
    )


@dataclass
class _Signature:
    calls: int = 0
    errors: int = 0
    int_min: list[int | None] = field(default_factory=list)
    int_max: list[int | None] = field(default_factory=list)
    first_ts: int = 0
    last_ts: int = 0
    dur_sum: int = 0
    dur_min: int = 0
    dur_max: int = 0


def _merge_elementwise(
    acc: list[int | None], new: Sequence[int | None], pick: Any
) -> list[int | None]:
    """`pick` (min or max) of two value-range lists, element by element; None is unknown."""
    if not acc:
        return list(new)
    return [
        b if a is None else a if b is None else pick(a, b) for a, b in zip(acc, new, strict=False)
    ]


class _Segment:
    """Columns of the calls buffered since the last write, plus their signature summary."""

    def __init__(self) -> None:
        self.call_id: list[int] = []
        self.ts: list[int] = []
        self.in_structure: list[str] = []
        self.out_structure: list[str | None] = []
        # Sizes packed as little-endian int64 bytes: 4x faster to turn into Arrow than Python
        # ints, and a cheap, hash-cached signature key.
        self.dims: list[bytes] = []
        self.out_dims: list[bytes | None] = []
        self.int_min: list[list[int | None] | None] = []
        self.int_max: list[list[int | None] | None] = []
        self.duration: list[int] = []
        self.error: list[str | None] = []
        self.signatures: dict[tuple[Any, ...], _Signature] = {}
        self.started = time.monotonic()

    def __len__(self) -> int:
        return len(self.call_id)

    def add(self, rec: CallRecord) -> None:
        call_id, ts, sin, sout, dims, out_dims, ranges, duration, error = rec
        mins = maxs = None
        if ranges:
            mins, maxs = list(ranges[0::2]), list(ranges[1::2])
        self.call_id.append(call_id)
        self.ts.append(ts)
        self.in_structure.append(sin)
        self.out_structure.append(sout)
        packed = _pack(dims)
        out_packed = None if out_dims is None else _pack(out_dims)
        self.dims.append(packed)
        self.out_dims.append(out_packed)
        self.int_min.append(mins)
        self.int_max.append(maxs)
        self.duration.append(duration)
        self.error.append(error)
        key = (sin, sout, packed, out_packed)
        sig = self.signatures.get(key)
        if sig is None:
            sig = self.signatures[key] = _Signature(first_ts=ts, dur_min=duration)
        sig.calls += 1
        sig.errors += error is not None
        if mins is not None and maxs is not None:
            sig.int_min = _merge_elementwise(sig.int_min, mins, min)
            sig.int_max = _merge_elementwise(sig.int_max, maxs, max)
        sig.first_ts = min(sig.first_ts, ts)
        sig.last_ts = max(sig.last_ts, ts)
        sig.dur_sum += duration
        sig.dur_min = min(sig.dur_min, duration)
        sig.dur_max = max(sig.dur_max, duration)

    def calls_tables(self, model: str, host: str, pid: int) -> dict[str, pa.Table]:
        """One calls table per UTC date."""
        ts = pa.array(self.ts, pa.int64())
        full = pa.table(
            {
                "call_id": pa.array(self.call_id, pa.int64()),
                "ts": ts.cast(pa.timestamp("ns", tz="UTC")).cast(
                    pa.timestamp("us", tz="UTC"), safe=False
                ),
                "model": pa.array([model] * len(self), pa.string()),
                "host": pa.array([host] * len(self), pa.string()),
                "pid": pa.array([pid] * len(self), pa.int32()),
                "in_structure": pa.array(self.in_structure, pa.string()),
                "out_structure": pa.array(self.out_structure, pa.string()),
                "dims": _list_array(self.dims),
                "out_dims": _list_array(self.out_dims),
                "int_min": pa.array(self.int_min, pa.list_(pa.int64())),
                "int_max": pa.array(self.int_max, pa.list_(pa.int64())),
                "duration_ns": pa.array(self.duration, pa.int64()),
                "error": pa.array(self.error, pa.string()),
            },
            schema=schema.CALLS_SCHEMA,
        )
        days = [
            dt.datetime.fromtimestamp(t / 1e9, tz=dt.timezone.utc).date().isoformat()
            for t in (self.ts[0], self.ts[-1])
        ]
        if days[0] == days[1]:
            return {days[0]: full}
        all_days = [
            dt.datetime.fromtimestamp(t / 1e9, tz=dt.timezone.utc).date().isoformat()
            for t in self.ts
        ]
        col = pa.array(all_days)
        out = {}
        for day in sorted(set(all_days)):
            out[day] = full.filter(pa.compute.equal(col, day))
        return out

    def stats_table(self, model: str) -> pa.Table:
        rows = list(self.signatures.items())

        def ts_col(values: list[int]) -> pa.Array:
            return (
                pa.array(values, pa.int64())
                .cast(pa.timestamp("ns", tz="UTC"))
                .cast(pa.timestamp("us", tz="UTC"), safe=False)
            )

        return pa.table(
            {
                "model": pa.array([model] * len(rows), pa.string()),
                "in_structure": pa.array([k[0] for k, _ in rows], pa.string()),
                "out_structure": pa.array([k[1] for k, _ in rows], pa.string()),
                "dims": _list_array([k[2] for k, _ in rows]),
                "out_dims": _list_array([k[3] for k, _ in rows]),
                "calls": pa.array([s.calls for _, s in rows], pa.int64()),
                "errors": pa.array([s.errors for _, s in rows], pa.int64()),
                "int_min": pa.array([s.int_min or None for _, s in rows], pa.list_(pa.int64())),
                "int_max": pa.array([s.int_max or None for _, s in rows], pa.list_(pa.int64())),
                "first_ts": ts_col([s.first_ts for _, s in rows]),
                "last_ts": ts_col([s.last_ts for _, s in rows]),
                "duration_ns_sum": pa.array([s.dur_sum for _, s in rows], pa.int64()),
                "duration_ns_min": pa.array([s.dur_min for _, s in rows], pa.int64()),
                "duration_ns_max": pa.array([s.dur_max for _, s in rows], pa.int64()),
            },
            schema=schema.STATS_SCHEMA,
        )


def structure_table(
    model: str, structures: Sequence[Structure], signature: Sequence[Param]
) -> pa.Table:
    """One row per leaf of each structure (the `structures` table)."""
    import json

    sig_json = json.dumps([p.__dict__ for p in signature])
    cols: dict[str, list[Any]] = {f.name: [] for f in schema.STRUCTURES_SCHEMA}
    for st in structures:
        for index, leaf in enumerate(st.leaves):
            cols["structure_id"].append(st.structure_id)
            cols["model"].append(model)
            cols["leaf"].append(index)
            for name in (
                "path",
                "argument",
                "position",
                "kind",
                "type",
                "dtype",
                "rank",
                "device",
                "value",
                "dim_offset",
                "range_index",
            ):
                cols[name].append(getattr(leaf, name))
            cols["treespec"].append(st.treespec)
            cols["signature"].append(sig_json)
            cols["n_args"].append(st.n_args)
    return pa.table(cols, schema=schema.STRUCTURES_SCHEMA)


class StoreWriter:
    """Owns the queue and the writer thread of one recorder."""

    def __init__(
        self,
        store: str | os.PathLike[str],
        model: str,
        signature: Sequence[Param],
        *,
        queue_size: int = 100_000,
        flush_rows: int = 100_000,
        flush_seconds: float = 10.0,
        poll_seconds: float = 0.05,
    ) -> None:
        self.fs, self.root = resolve_store(store)
        self.model = model
        self.signature = tuple(signature)
        self.queue_size = queue_size
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self.poll_seconds = poll_seconds
        self.host = os.uname().nodename if hasattr(os, "uname") else "host"
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
        self._thread: threading.Thread | None = None
        self._drained = 0
        self._count_lock = threading.Lock()
        self.dropped = 0
        self.written_calls = 0
        self.write_errors = 0
        self.files: collections.deque[str] = collections.deque(maxlen=1000)  # the latest ones
        self.files_written = 0
        self._warned = False
        self._segment = _Segment()

    # -- recording side (any thread) -------------------------------------------------------
    def submit(self, rec: CallRecord) -> bool:
        """Queues one call; False (and counted) when the queue is full."""
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

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Starts the writer thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"capture-writer-{self.model}", daemon=True
        )
        self._thread.start()

    def flush(self, timeout: float | None = 30.0) -> None:
        """Writes everything queued so far, and waits for it."""
        if self._thread is None or not self._thread.is_alive():
            self._drain_and_write(force=True)
            return
        with self._flushed:
            target = self._flush_generation + 1
            self._flush_now.set()
            self._wake.set()
            self._flushed.wait_for(lambda: self._flush_generation >= target, timeout=timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        """Flushes and stops the writer thread."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            self._thread = None
        self._drain_and_write(force=True)

    # -- writer thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.poll_seconds)
            self._wake.clear()
            force = self._flush_now.is_set()
            self._flush_now.clear()
            try:
                self._drain_and_write(force=force)
            except Exception:  # never let the thread die: count, log once, go on
                self._fail("writer loop", exc_info=True)
            if force:
                with self._flushed:
                    self._flush_generation += 1
                    self._flushed.notify_all()
        with self._flushed:
            self._flush_generation += 1
            self._flushed.notify_all()

    def _drain_and_write(self, force: bool) -> None:
        queue, segment = self._queue, self._segment
        while queue:
            segment.add(queue.popleft())
            self._drained += 1
            if len(segment) >= self.flush_rows:
                self._write_segment()
                segment = self._segment
        due = time.monotonic() - segment.started >= self.flush_seconds
        if len(segment) and (force or due):
            self._write_segment()
        elif force or due:
            self._write_structures()
            segment.started = time.monotonic()

    def _write_structures(self, seq: int | None = None) -> None:
        with self._structures_lock:
            structures, self._pending_structures = self._pending_structures, []
        if not structures:
            return
        model = safe_name(self.model)
        seq = next(self._seq) if seq is None else seq
        table = structure_table(self.model, structures, self.signature)
        try:
            path = write_parquet(
                self.fs,
                f"{self.root}/{schema.STRUCTURES}/model={model}",
                f"{self.prefix}-{seq:06d}.parquet",
                table,
                schema.STRUCTURES,
            )
            self._written(path)
        except Exception as e:
            with self._structures_lock:  # keep them: the next segment tries again
                self._pending_structures[:0] = structures
            raise OSError(f"cannot write structures to {self.root}: {e}") from e

    def _write_segment(self) -> None:
        segment, self._segment = self._segment, _Segment()
        model = safe_name(self.model)
        seq = next(self._seq)
        name = f"{self.prefix}-{seq:06d}.parquet"
        try:
            self._write_structures(seq)
            stats = segment.stats_table(self.model)
            for day, table in segment.calls_tables(self.model, self.host, self.pid).items():
                path = write_parquet(
                    self.fs,
                    f"{self.root}/{schema.CALLS}/model={model}/date={day}",
                    name,
                    table,
                    schema.CALLS,
                )
                self._written(path)
            # Stats last: a reader that trusts stats never counts calls whose file is missing.
            path = write_parquet(
                self.fs, f"{self.root}/{schema.STATS}/model={model}", name, stats, schema.STATS
            )
            self._written(path)
            self.written_calls += len(segment)
        except Exception as e:
            with self._count_lock:
                self.dropped += len(segment)
            self.write_errors += 1
            self._fail(f"writing {len(segment)} calls to {self.root} ({e})")

    def _written(self, path: str) -> None:
        self.files.append(path)
        self.files_written += 1

    def _fail(self, what: str, exc_info: bool = False) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "capture: failed %s; the model keeps running, these calls are counted as "
                "dropped (further failures are counted in stats() without a warning)",
                what,
                exc_info=exc_info,
            )
