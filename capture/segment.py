"""A writer's segment: the columns of the calls buffered since the last write, as Arrow tables.

Split from `capture.writer` (the queue, the thread and the files): this module turns records into
the `calls`, `stats` and `structures` tables. `_Segment.add` checks a record completely before
appending anything, so one record the tables cannot hold (a size that is not an int, a value range
outside int64, an error message that is not UTF-8) is refused alone and the segment stays
consistent (issue 12).
"""

from __future__ import annotations

import datetime as dt
import json
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from capture import schema

if TYPE_CHECKING:  # flatten imports torch; the store readers import this module without it
    from capture.flatten import Param, Structure

__all__ = ["CallRecord", "structure_table"]

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
        """Appends one call; raises (appending nothing) when the tables cannot hold it."""
        call_id, ts, sin, sout, dims, out_dims, ranges, duration, error = rec
        # Everything is checked before the first append: a failure leaves the columns aligned.
        packed = _pack(dims)  # struct.error: a size that is not an int (a ragged SymInt)
        out_packed = None if out_dims is None else _pack(out_dims)
        mins = maxs = None
        if ranges:
            _pack(tuple(0 if v is None else v for v in ranges))  # every bound fits int64
            mins, maxs = list(ranges[0::2]), list(ranges[1::2])
        if error is not None:
            error.encode()  # UnicodeEncodeError: Arrow cannot hold a lone surrogate
        self.call_id.append(call_id)
        self.ts.append(ts)
        self.in_structure.append(sin)
        self.out_structure.append(sout)
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
            out[day] = full.filter(pc.equal(col, day))
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
    """One row per leaf of each structure (the `structures` table).

    The treespec is on the structure's first row (leaf 0) only, null on the others: repeating it
    on every row made the table quadratic in the number of leaves (issue 12).
    """
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
            cols["treespec"].append(st.treespec if index == 0 else None)
            cols["signature"].append(sig_json)
            cols["n_args"].append(st.n_args)
    return pa.table(cols, schema=schema.STRUCTURES_SCHEMA)
