"""capture.store.stats_merge: the SQL rule and its Python twin agree.

DuckDB runs `SIGNATURE_MERGE` over generated stats rows of one signature; Python folds the same
rows with `merge`; the two must give the same row, whatever the counts, timestamps, durations
and value ranges (unknown items, missing lists, lists of different lengths).
"""

from __future__ import annotations

import functools
from typing import Any

import duckdb
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from capture import schema
from capture.store import stats_merge

_ITEM = st.none() | st.integers(-(2**40), 2**40)
_RANGES = st.none() | st.lists(_ITEM, min_size=1, max_size=4)
_TS = st.integers(1_600_000_000_000_000, 1_900_000_000_000_000)  # microseconds


@st.composite
def _row(draw: st.DrawFn) -> dict[str, Any]:
    calls = draw(st.integers(1, 10**6))
    first = draw(_TS)
    low = draw(st.integers(0, 10**9))
    return {
        "calls": calls,
        "errors": draw(st.integers(0, calls)),
        "int_min": draw(_RANGES),
        "int_max": draw(_RANGES),
        "first_ts": first,
        "last_ts": first + draw(st.integers(0, 10**9)),
        "duration_ns_sum": draw(st.integers(low * calls, low * calls + 10**9)),
        "duration_ns_min": low,
        "duration_ns_max": low + draw(st.integers(0, 10**6)),
    }


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    key = {"model": "m", "in_structure": "s", "out_structure": None, "dims": [2, 3]}
    full = [{**key, "out_dims": None, **r} for r in rows]
    for r in full:  # timestamps in microseconds, as the stats schema keeps them
        r["first_ts"], r["last_ts"] = (
            pa.scalar(r[n], pa.timestamp("us", tz="UTC")) for n in ("first_ts", "last_ts")
        )
    return pa.Table.from_pylist(full, schema=schema.STATS_SCHEMA)


def _normal(row: dict[str, Any]) -> dict[str, Any]:
    """Merged columns only; an empty range list is what the store writes as NULL."""
    out = {name: row[name] for name in stats_merge.RULES}
    for name in ("int_min", "int_max"):
        out[name] = out[name] or None
    return out


@functools.cache
def _connection() -> duckdb.DuckDBPyConnection:
    return duckdb.connect()  # one for the module: a new connection per example costs ~0.1 s


def _sql(rows: list[dict[str, Any]]) -> dict[str, Any]:
    con = _connection()
    con.register("_stats", _table(rows))
    merged = con.sql(
        f"SELECT {stats_merge.SIGNATURE_MERGE} FROM _stats GROUP BY ALL"
    ).to_arrow_table()
    assert merged.num_rows == 1
    for name in ("first_ts", "last_ts"):
        index = merged.schema.get_field_index(name)
        merged = merged.set_column(index, name, merged.column(name).cast(pa.int64()))
    return _normal(merged.to_pylist()[0])


@settings(max_examples=50, deadline=None)
@given(st.lists(_row(), min_size=1, max_size=6))
def test_sql_and_python_merge_stats_rows_alike(rows: list[dict[str, Any]]) -> None:
    python = _normal(functools.reduce(stats_merge.merge, rows))
    assert _sql(rows) == python


def test_a_shorter_range_list_is_padded_with_unknown_items() -> None:
    rows = [
        {**_base(), "int_min": [5, None], "int_max": [7]},
        {**_base(), "int_min": [3], "int_max": [None, 9, 1]},
    ]
    expected = {"int_min": [3, None], "int_max": [7, 9, 1]}
    assert {k: _sql(rows)[k] for k in expected} == expected
    merged = stats_merge.merge(rows[0], rows[1])
    assert {k: merged[k] for k in expected} == expected


def test_select_refuses_a_key_column() -> None:
    try:
        stats_merge.select(columns=("dims",))
    except KeyError as e:
        assert "dims" in str(e)
    else:
        raise AssertionError("select accepted a key column as a merged one")


def _base() -> dict[str, Any]:
    return {
        "calls": 1,
        "errors": 0,
        "int_min": None,
        "int_max": None,
        "first_ts": 1_700_000_000_000_000,
        "last_ts": 1_700_000_000_000_001,
        "duration_ns_sum": 5,
        "duration_ns_min": 5,
        "duration_ns_max": 5,
    }
