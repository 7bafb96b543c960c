"""How the stats rows of one signature merge: the SQL and its Python twin, from one table of rules.

A signature (`schema.SIGNATURE_KEY`: model, structures, sizes) is written as many ``stats`` rows:
one per writer segment, rollup and compacted file. They merge column by column, by the rule
`RULES` gives each column that is not part of the key:

- ``sum``: call and error counts, the summed durations;
- ``min`` / ``max``: first and last call, shortest and longest duration;
- ``item_min`` / ``item_max``: the integer value ranges, item by item (one item per tracked
  integer tensor): the smallest minimum, the largest maximum. An unknown item (NULL: an empty
  tensor) gives way to a known one, a missing list (recorded without ranges) to a present one,
  and a shorter list is padded with unknown items.

`select` writes the rule as SQL (the store's ``signatures`` view, `capture compact`, the analysis
that merges signatures over their outputs, replay's value ranges); `merge` and `merge_items` are
the same rule in Python (a writer's segment and rollup, the seed API's observer).
`tests/test_stats_merge.py` checks with generated rows that DuckDB and Python agree. Imports
nothing but `capture.schema`.

Example:
    >>> merge_items([3, None, 1], [5, 2], min)
    [3, 2, 1]
    >>> "sum(calls)::BIGINT AS calls" in select(key=("model",), columns=("calls",))
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import zip_longest
from typing import Any, TypeVar

from capture import schema

__all__ = ["RULES", "SIGNATURE_MERGE", "select", "merge", "merge_items"]

_T = TypeVar("_T")

RULES: dict[str, str] = {
    "calls": "sum",
    "errors": "sum",
    "int_min": "item_min",
    "int_max": "item_max",
    "first_ts": "min",
    "last_ts": "max",
    "duration_ns_sum": "sum",
    "duration_ns_min": "min",
    "duration_ns_max": "max",
}
"""Stats column (every one that is not in `schema.SIGNATURE_KEY`) -> how it merges."""

_MERGED = tuple(n for n in schema.STATS_SCHEMA.names if n not in schema.SIGNATURE_KEY)
if tuple(RULES) != _MERGED:  # pragma: no cover - a developer's error
    raise ImportError(f"stats_merge.RULES {tuple(RULES)} != the merged stats columns {_MERGED}")

_SQL: dict[str, Callable[[str], str]] = {
    "sum": lambda c: f"sum({c})::BIGINT AS {c}",
    "min": lambda c: f"min({c}) AS {c}",
    "max": lambda c: f"max({c}) AS {c}",
    "item_min": lambda c: _items_sql(c, "least"),
    "item_max": lambda c: _items_sql(c, "greatest"),
}


def _items_sql(column: str, pick: str) -> str:
    # list_zip pads the shorter list with NULL, and least/greatest skip a NULL argument.
    return (
        f"CASE WHEN count({column}) > 0 THEN list_reduce("
        f"list({column}) FILTER (WHERE {column} IS NOT NULL), "
        f"lambda a, b: list_transform(list_zip(a, b), lambda p: {pick}(p[1], p[2]))) "
        f"END AS {column}"
    )


def select(key: Sequence[str] = schema.SIGNATURE_KEY, columns: Iterable[str] | None = None) -> str:
    """The SQL select list that merges stats rows: `key`, then each column by its rule.

    Args:
        key: The columns to ``GROUP BY`` (default: the whole signature key).
        columns: The merged columns wanted (default: all of `RULES`, in stats column order).

    Returns:
        Select items, to use with ``GROUP BY`` the key columns (or ``GROUP BY ALL``).

    Raises:
        KeyError: A column with no rule (a key column, or not a stats column).

    Example:
        >>> select(key=("dims",), columns=("calls", "first_ts"))
        'dims, sum(calls)::BIGINT AS calls, min(first_ts) AS first_ts'
    """
    wanted = RULES if columns is None else columns
    return ", ".join([*key, *(_SQL[RULES[c]](c) for c in wanted)])


SIGNATURE_MERGE = select()
"""Every stats column, merged over the whole signature key: the ``signatures`` view and
`capture compact` select it from the stats rows, ``GROUP BY ALL``."""


def merge_items(
    acc: Sequence[_T | None], new: Sequence[_T | None], pick: Callable[[_T, _T], _T]
) -> list[_T | None]:
    """`pick` (min or max) of two value-range lists, item by item (rule ``item_min/max``).

    None is an unknown item and gives way to a known one; an empty list (no ranges) gives way
    to the other list; a shorter list is padded with unknown items, as SQL's ``list_zip`` does.

    Example:
        >>> merge_items([4, None], [2, 7, 1], max)
        [4, 7, 1]
    """
    if not acc:
        return list(new)
    if not new:
        return list(acc)
    pairs = zip(acc, new, strict=True) if len(acc) == len(new) else zip_longest(acc, new)
    return [b if a is None else a if b is None else pick(a, b) for a, b in pairs]


_PYTHON: dict[str, Callable[[Any, Any], Any]] = {
    "sum": lambda a, b: a + b,
    "min": min,
    "max": max,
    "item_min": lambda a, b: merge_items(a or (), b or (), min),
    "item_max": lambda a, b: merge_items(a or (), b or (), max),
}


def merge(acc: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Two rows' merged columns (`RULES`' keys) merged into a new dict (neither is changed).

    Example:
        >>> a = dict(calls=2, errors=0, int_min=[1], int_max=[5], first_ts=10, last_ts=20,
        ...          duration_ns_sum=7, duration_ns_min=3, duration_ns_max=4)
        >>> merged = merge(a, {**a, "calls": 1, "int_min": [0], "last_ts": 30})
        >>> merged["calls"], merged["int_min"], merged["last_ts"]
        (3, [0], 30)
    """
    return {name: _PYTHON[rule](acc[name], new[name]) for name, rule in RULES.items()}
