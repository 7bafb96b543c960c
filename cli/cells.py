"""The text of one value in each output format: the one rule per kind that every command follows.

`cli.output` writes; this module only turns values into text, a whole column at a time where
Arrow can do it (an integer column of a 100-million-row `capture query` is cast in C++, not
formatted number by number). The rules, in full, are in `cli.output`'s docstring.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import unicodedata
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "Column",
    "to_json_value",
    "dumps",
    "cell",
    "column_cells",
    "column_json",
    "is_numeric",
    "width",
]

Column = Union["pa.Array", Sequence[Any]]
"""One column of a batch of rows: an Arrow array, or Python values (rows given as mappings)."""


def to_json_value(value: Any) -> Any:
    """Converts a value from a query result into plain JSON data (see `cli.output`).

    Args:
        value: A Python value as pyarrow's ``to_pylist`` returns it.

    Returns:
        None, bool, int, float (finite), str, list or dict, recursively.

    Example:
        >>> to_json_value({"shape": [2, 7], "x": float("nan"), "b": b"\\x00\\xff"})
        {'shape': [2, 7], 'x': None, 'b': 'AP8='}
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            return None
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if type(value).__name__ == "MonthDayNano" and isinstance(value, tuple):
        months, days, nanoseconds = value
        return {"months": months, "days": days, "nanoseconds": nanoseconds}
    if isinstance(value, Mapping):
        return {_json_key(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    return str(value)


def _json_key(key: Any) -> str:
    converted = to_json_value(key)
    return converted if isinstance(converted, str) else json.dumps(converted)


def dumps(value: Any) -> str:
    """JSON text of plain JSON data (non-ASCII kept as is; NaN refused: convert first).

    Example:
        >>> dumps({"v": "é"})
        '{"v": "é"}'
    """
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def cell(value: Any, null: str) -> str:
    """A table or csv cell: scalars as text, nested values as JSON, None as `null`.

    Example:
        >>> [cell(v, "null") for v in (None, True, float("-inf"), [2, 7], b"\\x00")]
        ['null', 'true', '-inf', '[2, 7]', 'AA==']
    """
    if value is None:
        return null
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (int, str)):
        return str(value)
    converted = to_json_value(value)
    return converted if isinstance(converted, str) else dumps(converted)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, decimal.Decimal)) and not isinstance(value, bool)


def _arrow_kind(column: Column) -> str | None:
    """``int``, ``str``, ``bool`` or ``other`` for an Arrow array; None for Python values."""
    import pyarrow as pa

    if not isinstance(column, (pa.Array, pa.ChunkedArray)):
        return None
    kind = column.type
    if pa.types.is_integer(kind):
        return "int"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "str"
    if pa.types.is_boolean(kind):
        return "bool"
    return "other"


def is_numeric(column: Column) -> bool | None:
    """Whether a column reads as numbers (right-aligned in a table); None when it is all null.

    Arrow columns go by their type, Python values by every non-null value.

    Example:
        >>> [is_numeric(c) for c in ([1, None, 2.5], [1, "a"], [None])]
        [True, False, None]
    """
    import pyarrow as pa

    if isinstance(column, (pa.Array, pa.ChunkedArray)):
        if column.null_count == len(column):
            return None
        kind = column.type
        return bool(
            pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
        )
    values = [v for v in column if v is not None]
    if not values:
        return None
    return all(_is_number(v) for v in values)


def _pylist(column: Column) -> list[Any]:
    import pyarrow as pa

    if isinstance(column, (pa.Array, pa.ChunkedArray)):
        values: list[Any] = column.to_pylist(maps_as_pydicts="lossy")
        return values
    return list(column)


def _int_text(column: Column, null: str) -> list[str]:
    """An integer column's decimal text, cast by Arrow (C++), nulls as `null`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = pc.cast(column, pa.string())
    values: list[str] = (text.fill_null(null) if text.null_count else text).to_pylist()
    return values


def column_cells(column: Column, null: str) -> list[str]:
    """The `cell` text of every value of a column (integers and strings cast by Arrow).

    Example:
        >>> import pyarrow as pa
        >>> column_cells(pa.array([1, None, 30]), "null")
        ['1', 'null', '30']
    """

    kind = _arrow_kind(column)
    if kind == "int":
        return _int_text(column, null)
    if kind == "str":
        values = _pylist(column)
        return [null if v is None else v for v in values]
    return [cell(v, null) for v in _pylist(column)]


def column_json(column: Column) -> list[str]:
    """The JSON text of every value of a column (json and jsonl formats).

    Example:
        >>> import pyarrow as pa
        >>> column_json(pa.array([1.5, float("nan"), None]))
        ['1.5', 'null', 'null']
    """

    kind = _arrow_kind(column)
    if kind == "int":
        return _int_text(column, "null")
    if kind == "bool":
        return ["null" if v is None else "true" if v else "false" for v in _pylist(column)]
    if kind == "str":
        return [dumps(v) for v in _pylist(column)]
    return [dumps(to_json_value(v)) for v in _pylist(column)]


def width(text: str) -> int:
    """Display width: East Asian wide characters count 2, combining marks 0.

    Example:
        >>> width("日本x")
        5
    """
    if text.isascii():
        return len(text)
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1
        for c in text
    )
