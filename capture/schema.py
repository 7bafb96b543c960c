"""Arrow schemas of the store and SCHEMA_VERSION: every column name is defined here only.

The store is three Parquet trees (see DESIGN §3):

- ``structures/model=<m>/*.parquet``: one row per leaf of every distinct call structure.
- ``calls/model=<m>/date=<YYYY-MM-DD>/*.parquet``: one row per recorded call.
- ``stats/model=<m>/*.parquet``: one row per distinct *signature* (structure + every size) per
  written segment, with a call count. Signatures merge across segments by summing, so the
  analysis over millions of calls reads thousands of rows.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 3
"""The store format's version, in every file's footer (`METADATA_SCHEMA_VERSION`) and on every
``structures`` row (its ``schema_version`` column). Bumped whenever a column is renamed, removed
or changes meaning; readers read every older version by its number (docs/schema.md):

- 1: the first format.
- 2: a cache layer's state is part of its structure (a sliding window's ``full``/``filling`` in
  the treespec and its seen tokens as a leaf; a static layer's fill level as a leaf), special
  token counts follow the value ranges in ``int_min``/``int_max``, and each ``structures`` row
  says the version it was recorded under (null in files of version 1).
- 3: the state a call ran under (``state`` of ``calls`` and ``stats``: active adapters, training,
  what the user declares), part of a signature's key; null in files of older versions, and for
  a call with no state to read (the default state).
"""

STRUCTURE_ID_VERSION = 1
"""Version of the `structure_id` hash: kept across store versions, so that a structure recorded
the same way before and after an upgrade is one structure (one call group)."""

METADATA_SCHEMA_VERSION = b"capture.schema_version"
METADATA_LIBRARY_VERSION = b"capture.library_version"
METADATA_KIND = b"capture.kind"

METADATA_ROLLUP = b"capture.rollup"
"""Stats files only: the file is a writer's rollup, ``open`` while that writer may still replace
it by a successor holding its rows and more, ``closed`` once the writer stopped
(`capture.record.writer`).
"""

METADATA_SEGMENT_CALLS = b"capture.segment_calls"
"""A writer's rollup only: JSON ``{"YYYY-MM-DD": rows}``, the calls files of the segment it adds
(named like the rollup, in ``calls/model=<m>/date=<day>/``). The rollup is written *before* them
and counts only once every one of them exists (`capture.store.commits`): a writer killed in
between leaves its previous rollup counting, and the segment's calls hidden."""

ROLLUP_CONTINUE_S = 300.0
"""A writer replaces its open rollup only when it wrote it less than this many seconds ago (by
its own clock); after a longer pause it starts a new one and leaves the old one as it is."""

ROLLUP_GRACE_S = 2 * ROLLUP_CONTINUE_S
"""`capture compact` leaves an open rollup younger than this alone (its writer may replace it);
twice `ROLLUP_CONTINUE_S`, a margin for the writer's upload time and clock differences."""

ROLLUP_ROWS = 4_096
"""A writer's rollup grows to at most this many rows, then a new one starts (each flush writes
the whole rollup again)."""

ROLLUP_BUCKET_S = 60.0
"""A rollup keeps one row per signature and minute: the time resolution of calls over time."""

STRUCTURES = "structures"
CALLS = "calls"
STATS = "stats"
TABLES = (STRUCTURES, CALLS, STATS)

# Leaf kinds (the `kind` column of `structures`).
KIND_TENSOR = "tensor"
KIND_NONE = "none"
KIND_INT = "int"
KIND_FLOAT = "float"
KIND_BOOL = "bool"
KIND_STR = "str"
KIND_MISSING = "missing"
KIND_OPAQUE = "opaque"

_LIST_INT = pa.list_(pa.int64())

STRUCTURES_SCHEMA = pa.schema(
    [
        pa.field("structure_id", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("leaf", pa.int32(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        # The top-level parameter the leaf belongs to ('x', 'past_key_values', 'args[2]').
        pa.field("argument", pa.string()),
        # Position of that parameter in the call when passed positionally, else null.
        pa.field("position", pa.int32()),
        pa.field("kind", pa.string(), nullable=False),
        # Python type name of the leaf ('Tensor', 'int', 'MyOpaqueThing').
        pa.field("type", pa.string()),
        pa.field("dtype", pa.string()),
        pa.field("rank", pa.int32()),
        pa.field("device", pa.string()),
        # JSON of the scalar value for int/float/bool/str leaves.
        pa.field("value", pa.string()),
        # Offset of this tensor's sizes in the call's `dims` list (0-based), null for non-tensors.
        pa.field("dim_offset", pa.int32()),
        # Index of this tensor in the call's `int_min`/`int_max` lists, null when not tracked.
        pa.field("range_index", pa.int32()),
        # JSON treespec of the whole (args, kwargs) or output (torch `treespec_dumps`), same on
        # every row of a structure; null when a node type cannot be serialized.
        pa.field("treespec", pa.string()),
        # JSON of the recorded method's signature: [{"name", "kind", "has_default"}, ...].
        pa.field("signature", pa.string()),
        pa.field("n_args", pa.int32()),
        # The store version this structure was recorded under (null: version 1).
        pa.field("schema_version", pa.int32()),
    ]
)

STATE = "state"
"""The ``calls`` and ``stats`` column of a call's state key (`capture.record.state`): a short
canonical JSON object, null for the default state (no adapter, eval mode, nothing declared)."""

ADDED_IN = {(STRUCTURES, "schema_version"): 2, (CALLS, STATE): 3, (STATS, STATE): 3}
"""(table, column) -> the store version that added it: a file of an older version lacks it (its
rows read as null)."""

CALLS_SCHEMA = pa.schema(
    [
        pa.field("call_id", pa.int64(), nullable=False),
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("pid", pa.int32(), nullable=False),
        pa.field("in_structure", pa.string(), nullable=False),
        pa.field("out_structure", pa.string()),
        pa.field("dims", _LIST_INT, nullable=False),
        pa.field("out_dims", _LIST_INT),
        pa.field("int_min", _LIST_INT),
        pa.field("int_max", _LIST_INT),
        pa.field("duration_ns", pa.int64(), nullable=False),
        pa.field("error", pa.string()),
        pa.field(STATE, pa.string()),
    ]
)

STATS_SCHEMA = pa.schema(
    [
        pa.field("model", pa.string(), nullable=False),
        pa.field("in_structure", pa.string(), nullable=False),
        pa.field("out_structure", pa.string()),
        pa.field("dims", _LIST_INT, nullable=False),
        pa.field("out_dims", _LIST_INT),
        pa.field(STATE, pa.string()),
        pa.field("calls", pa.int64(), nullable=False),
        pa.field("errors", pa.int64(), nullable=False),
        pa.field("int_min", _LIST_INT),
        pa.field("int_max", _LIST_INT),
        pa.field("first_ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("last_ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("duration_ns_sum", pa.int64(), nullable=False),
        pa.field("duration_ns_min", pa.int64(), nullable=False),
        pa.field("duration_ns_max", pa.int64(), nullable=False),
    ]
)

SCHEMAS = {STRUCTURES: STRUCTURES_SCHEMA, CALLS: CALLS_SCHEMA, STATS: STATS_SCHEMA}

WRITER_COLUMNS = ("model", "host", "pid")
"""Calls columns that one writer writes the same on every row (not part of a call record)."""

CALL_RECORD_FIELDS = tuple(n for n in CALLS_SCHEMA.names if n not in WRITER_COLUMNS)
"""The fields of one call record, in column order: `capture.record.segment.CallRecord` checks its
own fields against them at import, so a calls column is named here and nowhere else."""

SIGNATURE_KEY = ("model", "in_structure", "out_structure", "dims", "out_dims", STATE)
"""The stats columns that identify a signature; the other stats columns merge over segments
(`capture.store.stats_merge`: the rule, in SQL and in Python)."""
