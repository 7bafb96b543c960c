"""A writer's segment: the columns of the calls buffered since the last write, as Arrow tables.

Split from `capture.record.writer` (the queue, the thread and the files): this module turns records
into the `calls`, `stats` and `structures` tables. `Segment.add` checks a record completely before
appending anything, so one record the tables cannot hold (a size that is not an int, a value range
outside int64, an error message that is not UTF-8) is refused alone and the segment stays
consistent.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from capture import schema
from capture.pytree.recorded_structure import RecordedLeaf
from capture.store.stats_merge import merge, merge_items

if TYPE_CHECKING:  # flatten imports torch; the store readers import this module without it
    from capture.record.flatten import Structure
    from capture.signature import Signature

__all__ = [
    "CallRecord",
    "Segment",
    "call_id_base",
    "StatsRollup",
    "pack_sizes",
    "sizes_array",
    "stats_table",
    "structure_table",
]


class CallRecord(NamedTuple):
    """One recorded call, as a producer (`Recorder`, `InputObserver.to_store`) queues it.

    The fields are the ``calls`` columns a writer does not add itself, in column order
    (`schema.CALL_RECORD_FIELDS`, checked below). A NamedTuple: as small as a tuple, not tracked
    by the GC when its items are not. The recorder's hot path queues a plain tuple in this field
    order instead (0.16 µs a call cheaper than building the NamedTuple, docs/benchmarks.md), so
    the writer's side (`Segment`) reads records by position only.
    """

    call_id: int
    ts: int
    """Nanoseconds since the epoch (the column keeps microseconds)."""
    in_structure: str
    out_structure: str | None
    dims: tuple[int, ...]
    """Every tensor size of the call, concatenated in leaf order."""
    out_dims: tuple[int, ...] | None
    int_min: Sequence[int | None] | None
    """Per tracked integer tensor (``structures.range_index``) its minimum; None: unknown."""
    int_max: Sequence[int | None] | None
    duration_ns: int
    error: str | None
    state: str | None = None
    """The call's state key (`capture.record.state`); None: the default state."""


if CallRecord._fields != schema.CALL_RECORD_FIELDS:  # pragma: no cover - a developer's error
    raise ImportError(f"CallRecord fields {CallRecord._fields} != {schema.CALL_RECORD_FIELDS}")


def call_id_base() -> int:
    """A random base for one producer's call ids (``base | n``): distinct across processes."""
    return (int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF) << 32


_PACKERS: dict[int, Callable[..., bytes]] = {}


def pack_sizes(values: Sequence[int]) -> bytes:
    """Ints as little-endian int64 bytes."""
    pack = _PACKERS.get(len(values))
    if pack is None:
        pack = _PACKERS[len(values)] = struct.Struct(f"<{len(values)}q").pack
    return pack(*values)


def sizes_array(packed: Sequence[bytes | None]) -> pa.Array:
    """A list<int64> Arrow array from `pack_sizes`ed rows (None: a null list)."""
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


def _column(field: pa.Field, values: Sequence[Any]) -> pa.Array:
    """One column of `field`'s type: timestamps from ns, packed sizes, or values as they are."""
    if pa.types.is_timestamp(field.type):
        return (
            pa.array(values, pa.int64())
            .cast(pa.timestamp("ns", tz="UTC"))
            .cast(field.type, safe=False)
        )
    first = next((v for v in values if v is not None), None)
    if pa.types.is_list(field.type) and isinstance(first, bytes):
        return sizes_array(values)
    return pa.array(values, field.type)


@dataclass
class _Signature:
    """One signature's merged columns: every stats column that is not its key (they merge by
    `capture.store.stats_merge.RULES`)."""

    calls: int = 0
    errors: int = 0
    int_min: list[int | None] = field(default_factory=list)
    int_max: list[int | None] = field(default_factory=list)
    first_ts: int = 0
    last_ts: int = 0
    duration_ns_sum: int = 0
    duration_ns_min: int = 0
    duration_ns_max: int = 0


_MERGED = tuple(n for n in schema.STATS_SCHEMA.names if n not in schema.SIGNATURE_KEY)
if tuple(_Signature.__dataclass_fields__) != _MERGED:  # pragma: no cover - a developer's error
    raise ImportError(f"_Signature fields != {_MERGED}")
# The signature key of a segment row: the key columns but the writer's own (the model).
_KEY = tuple(n for n in schema.SIGNATURE_KEY if n not in schema.WRITER_COLUMNS)
_Key = tuple[str, str | None, bytes, bytes | None, str | None]


_TS: Final = 1  # rows are plain tuples in CallRecord order: index of ts
if CallRecord._fields[_TS] != "ts":  # pragma: no cover - a developer's error
    raise ImportError("CallRecord: ts is not field 1")


# int_min/int_max of a record; anything else is a deferred device read, resolved by
# the writer thread (`capture.record.value_ranges`, not imported: this module runs without torch).
_PLAIN = (list, tuple, type(None))


def _check_int64(values: Sequence[int | None]) -> None:
    """Raises struct.error unless every known item fits int64."""
    pack_sizes(tuple(0 if v is None else v for v in values))


class Segment:
    """The calls buffered since the last write, plus their signature summary."""

    def __init__(self) -> None:
        self.rows: list[CallRecord] = []
        # Per row its signature key (in_structure, out_structure, dims, out_dims, state), the sizes
        # packed as little-endian int64 bytes: 4x faster to turn into Arrow than Python ints,
        # and a cheap, hash-cached dict key. Rows of one signature share one key tuple.
        self.keys: list[_Key] = []
        self.signatures: dict[_Key, tuple[_Key, _Signature]] = {}
        self.started = time.monotonic()

    def __len__(self) -> int:
        return len(self.rows)

    def structure_ids(self) -> set[str]:
        """The input and output structures the buffered calls refer to."""
        out = {k[0] for k in self.signatures}
        out.update(k[1] for k in self.signatures if k[1] is not None)
        return out

    def add(self, rec: CallRecord) -> None:
        """Appends one call; raises (appending nothing) when the tables cannot hold it."""
        # Everything is checked before the first append: a failure leaves the segment as it was.
        # Unpacked by position: the recorder queues a plain tuple in CallRecord's field order.
        _, ts, in_structure, out_structure, dims, out_dims, mins, maxs, duration, error, state = rec
        if type(mins) not in _PLAIN:  # `value_ranges.DeviceRanges`: read from a device now
            deferred: Any = mins
            mins, maxs = deferred.values()
            rec = (*rec[:6], mins, maxs, *rec[8:])  # type: ignore[assignment]
        packed = pack_sizes(dims)  # struct.error: a size that is not an int (a ragged SymInt)
        out_packed = None if out_dims is None else pack_sizes(out_dims)
        if mins is not None and maxs is not None:
            _check_int64(mins)  # every bound fits int64
            _check_int64(maxs)
        if error is not None:
            error.encode()  # UnicodeEncodeError: Arrow cannot hold a lone surrogate
        if state is not None:
            state.encode()  # a user's state value that is not UTF-8
        key = (in_structure, out_structure, packed, out_packed, state)
        entry = self.signatures.get(key)
        if entry is None:
            entry = self.signatures[key] = (key, _Signature(first_ts=ts, duration_ns_min=duration))
        key, sig = entry  # the signature's first key: its rows share one tuple
        self.rows.append(rec)
        self.keys.append(key)
        sig.calls += 1
        sig.errors += error is not None
        if mins is not None and maxs is not None:
            sig.int_min = merge_items(sig.int_min, mins, min)
            sig.int_max = merge_items(sig.int_max, maxs, max)
        sig.first_ts = min(sig.first_ts, ts)
        sig.last_ts = max(sig.last_ts, ts)
        sig.duration_ns_sum += duration
        sig.duration_ns_min = min(sig.duration_ns_min, duration)
        sig.duration_ns_max = max(sig.duration_ns_max, duration)

    def calls_tables(self, model_name: str, host: str, pid: int) -> dict[str, pa.Table]:
        """One calls table per UTC date, its columns in `schema.CALLS_SCHEMA` order."""
        n = len(self)
        fields = dict(zip(schema.CALL_RECORD_FIELDS, zip(*self.rows, strict=True), strict=True))
        fields.update(zip(_KEY, zip(*self.keys, strict=True), strict=True))
        constant = dict(zip(schema.WRITER_COLUMNS, (model_name, host, pid), strict=True))
        columns = [
            _column(f, [constant[f.name]] * n if f.name in constant else fields[f.name])
            for f in schema.CALLS_SCHEMA
        ]
        full = pa.Table.from_arrays(columns, schema=schema.CALLS_SCHEMA)
        first, last = self.rows[0][_TS], self.rows[-1][_TS]
        days = [_day(t) for t in (first, last)]
        if days[0] == days[1]:
            return {days[0]: full}
        all_days = [_day(r[_TS]) for r in self.rows]
        col = pa.array(all_days)
        return {day: full.filter(pc.equal(col, day)) for day in sorted(set(all_days))}

    def stats_table(self, model_name: str) -> pa.Table:
        """One row per distinct signature, its columns in `schema.STATS_SCHEMA` order."""
        return stats_table(model_name, [(k, s) for k, s in self.signatures.values()])


_RowKey = tuple[_Key, int]
"""A rollup row: a signature key and its minute (`schema.ROLLUP_BUCKET_S`)."""


class StatsRollup:
    """A writer's cumulative signature rows for one model: what its rolled-up stats file holds.

    One row per signature and minute (`schema.ROLLUP_BUCKET_S`, by the segment's first call of
    that signature): the rows keep when the calls happened, which `capture report`'s calls over
    time reads. The rows are kept both as Python values (to merge) and as the Arrow table the
    file is written from; `merged` builds only the rows a segment touches (a segment holds a
    few signatures of the current minute, a rollup up to `schema.ROLLUP_ROWS`: building every
    row at each flush cost about 8 µs a row, with the GIL held). A rollup is never changed:
    `merged` returns a new one, so a segment whose files fail to land leaves the writer's as it
    was (all or nothing).
    """

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.rows: dict[_RowKey, _Signature] = {}
        self.table = stats_table(model_name, [])
        """Row ``i`` is that of the ``i``-th key of `rows`."""

    def __len__(self) -> int:
        return len(self.rows)

    def merged(self, segment: Segment | None) -> StatsRollup:
        """This rollup with `segment`'s signatures added (None: the same rows)."""
        bucket_ns = int(schema.ROLLUP_BUCKET_S * 1e9)
        touched: dict[_RowKey, _Signature] = {}
        for key, sig in segment.signatures.values() if segment is not None else ():
            at = (key, sig.first_ts // bucket_ns)
            before = self.rows.get(at)  # the segment's own object is taken over: it is dropped
            touched[at] = sig if before is None else _Signature(**merge(vars(before), vars(sig)))
        out = StatsRollup.__new__(StatsRollup)
        out.model_name = self.model_name
        if not touched:
            out.rows, out.table = self.rows, self.table
            return out
        keep = [at not in touched for at in self.rows]
        out.rows = {at: sig for at, sig in self.rows.items() if at not in touched}
        out.rows.update(touched)  # the touched rows move to the end, in the table too
        fresh = stats_table(self.model_name, [(key, sig) for (key, _), sig in touched.items()])
        kept = self.table if all(keep) else self.table.filter(pa.array(keep, pa.bool_()))
        out.table = pa.concat_tables([kept, fresh]).combine_chunks()
        return out


def stats_table(model_name: str, entries: Sequence[tuple[_Key, _Signature]]) -> pa.Table:
    """The stats rows of `entries` (signature key, merged columns) for `model_name`."""
    fields: dict[str, Sequence[Any]] = {
        name: [model_name] * len(entries)  # the one writer column of a signature key
        for name in schema.SIGNATURE_KEY
        if name in schema.WRITER_COLUMNS
    }
    if entries:
        fields.update(zip(_KEY, zip(*(k for k, _ in entries), strict=True), strict=True))
    else:
        fields.update((name, []) for name in _KEY)
    for name in _MERGED:
        values = [getattr(s, name) for _, s in entries]
        if pa.types.is_list(schema.STATS_SCHEMA.field(name).type):
            values = [v or None for v in values]  # no merged item: recorded without ranges
        fields[name] = values
    columns = [_column(f, fields[f.name]) for f in schema.STATS_SCHEMA]
    return pa.Table.from_arrays(columns, schema=schema.STATS_SCHEMA)


def _day(ts_ns: int) -> str:
    """The UTC date of a timestamp in nanoseconds, ISO formatted."""
    return dt.datetime.fromtimestamp(ts_ns / 1e9, tz=dt.timezone.utc).date().isoformat()


_LEAF_COLUMNS = tuple(f.name for f in dataclasses.fields(RecordedLeaf))
"""The ``structures`` columns a leaf fills (`capture.pytree.recorded_structure.RecordedLeaf`)."""


def structure_table(
    model_name: str, structures: Sequence[Structure], signature: Signature
) -> pa.Table:
    """One row per leaf of each structure (the `structures` table).

    The treespec is on the structure's first row (leaf 0) only, null on the others: repeating it
    on every row made the table quadratic in the number of leaves.
    """
    sig_json = signature.dumps()
    cols: dict[str, list[Any]] = {f.name: [] for f in schema.STRUCTURES_SCHEMA}
    for st in structures:
        for index, leaf in enumerate(st.leaves):
            cols["structure_id"].append(st.structure_id)
            cols["model"].append(model_name)
            for name in _LEAF_COLUMNS:
                cols[name].append(getattr(leaf, name))
            cols["treespec"].append(st.treespec if index == 0 else None)
            cols["signature"].append(sig_json)
            cols["n_args"].append(st.n_args)
            cols["schema_version"].append(schema.SCHEMA_VERSION)
    return pa.table(cols, schema=schema.STRUCTURES_SCHEMA)
