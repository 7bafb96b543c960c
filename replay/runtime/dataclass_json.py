"""Whole frozen dataclasses read from and written to an artifact's JSON, from their fields' type
hints and the bounds in their ``metadata`` (`read`, `to_json`), and the one error of a bad
value (`bad_field`). `replay.runtime.checked_json` builds its field-by-field reads on these.

Needs neither torch nor the model's code.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Hashable, Mapping, Sequence, Sized
from typing import Any, NoReturn, TypeVar, cast

from capture.errors import ReplayError
from replay.runtime.guards import ArtifactError

__all__ = ["read", "to_json", "as_int", "bad_field", "json_kind", "MAX_INT", "MAX_DEPTH"]

MAX_INT = 2**62
"""Largest magnitude an integer field may have (sizes, counts, offsets)."""

_T = TypeVar("_T")


def bad_field(where: str, what: str) -> NoReturn:
    """Raises the one error of a bad field."""
    raise ArtifactError(
        f"{where} {what}: the artifact was changed or damaged after it was written; export it again"
    )


def as_int(value: Any, where: str, low: int = -MAX_INT, high: int = MAX_INT) -> int:
    """`value` as an int within ``[low, high]``, or one `ArtifactError` naming `where`."""
    if isinstance(value, bool) or not isinstance(value, int):
        bad_field(where, f"must be an integer, not {json_kind(value)}")
    if not low <= value <= high:
        bad_field(where, f"= {value} is outside [{low}, {high}]")
    return value


def json_kind(value: Any) -> str:
    """How an error names a JSON value's kind (``an object``, ``null``, ...)."""
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number"
    )


MAX_DEPTH = 32
"""Deepest nesting of dataclasses, lists and objects `read` follows."""


def to_json(value: Any) -> Any:
    """`value` as JSON data, derived from its dataclass fields and their order.

    Each init field of a dataclass is written under its name (or its metadata's ``key``), in
    field order; a field whose metadata says ``omit_default`` is left out while it holds its
    default. Tuples and lists become lists, mappings objects, non-finite floats their spelling
    (``"nan"``, ``"inf"``, ``"-inf"``: JSON has none). What `read` reads back is equal.

    Example:
        >>> from replay.runtime.guards import Relation
        >>> to_json(Relation("s", ("a", "b"), 1))
        {'symbol': 's', 'terms': ['a', 'b'], 'offset': 1}
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            if not f.init:
                continue
            item = getattr(value, f.name)
            if f.metadata.get("omit_default") and item == _default(f):
                continue
            *parents, key = f.metadata.get("key", f.name).split(".")
            node = out
            for parent in parents:  # a field kept in a nested object (``window.first``)
                node = node.setdefault(parent, {})
            node[key] = to_json(item)
        return out
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def read(cls: type[_T], raw: Any, where: str) -> _T:
    """A dataclass read from JSON data, every field checked against its type hint and bounds.

    The type hints say what a field holds: ``str``, ``int``, ``float``, ``bool``, unions with
    None, ``tuple[X, ...]`` / ``list[X]``, fixed ``tuple[X, Y]``, ``Mapping[str, X]``, nested
    dataclasses and ``Any`` (a JSON scalar). A field's ``metadata`` bounds it: ``max_len``
    (strings, 4096 when unsaid), ``pattern`` (a compiled regex strings must match), ``low`` /
    ``high`` (integers), ``max_items`` (lists and objects), ``key_pattern`` (an object's keys),
    ``key`` (its JSON name; dotted, a key of a nested object: ``window.first``); the bounds
    apply to every string or integer inside the field. An absent field takes its default (or
    None where its type allows it), else it is missing; a null one is None where the type
    allows it, else its default. A class may define
    ``invalid(self) -> str | None``: what is wrong beyond the types (a cross-field check).

    Raises:
        ArtifactError: One line naming where the bad value was (``where.field[i]``).

    Example:
        >>> from replay.runtime.guards import Relation
        >>> read(Relation, {"symbol": "s", "terms": ["a"], "offset": 1}, "m.json")
        Relation(symbol='s', terms=('a',), offset=1)
    """
    return _dataclass(cls, raw, where, 0)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _dataclass(cls: type[_T], raw: Any, where: str, depth: int) -> _T:
    if depth > MAX_DEPTH:
        bad_field(where, f"is nested deeper than {MAX_DEPTH}")
    if not isinstance(raw, Mapping):
        bad_field(where, f"must be a JSON object, not {json_kind(raw)}")
    hints = _hints(cast(Hashable, cls))
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        key = f.metadata.get("key", f.name)
        hint, at, default = hints[f.name], f"{where}.{key}", _default(f)
        node, key = _parent(raw, key, where)
        value = node.get(key)
        if value is None and not _allows_none(hint):
            if default is dataclasses.MISSING:
                if key not in node:
                    bad_field(at, "is missing")
                bad_field(at, f"must be {_spelled(hint)}, not null")
            values[f.name] = default
            continue
        values[f.name] = _value(hint, value, at, f.metadata, depth + 1)
    try:
        out = cls(**values)
    except (ValueError, ReplayError) as e:  # the class's own check (a condition's syntax)
        bad_field(where, f"is not what capture writes ({str(e)[:200]})")
    problem = getattr(out, "invalid", None)
    if problem is not None and (text := problem()):
        bad_field(where, text)
    return out


def _parent(raw: Mapping[str, Any], key: str, where: str) -> tuple[Mapping[str, Any], str]:
    """The object holding a field whose key is a path (``window.first``), and its last key;
    an absent or null object on the path holds nothing."""
    *parents, last = key.split(".")
    for parent in parents:
        where = f"{where}.{parent}"
        child = raw.get(parent)
        if child is not None and not isinstance(child, Mapping):
            bad_field(where, f"must be a JSON object, not {json_kind(child)}")
        raw = child or {}
    return raw, last


def _allows_none(hint: Any) -> bool:
    return hint is Any or (_is_union(hint) and type(None) in typing.get_args(hint))


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _spelled(hint: Any) -> str:
    origin = typing.get_origin(hint) or hint
    if _is_union(hint):
        return " or ".join(_spelled(h) for h in typing.get_args(hint) if h is not type(None))
    if dataclasses.is_dataclass(origin) or origin in (dict, Mapping):
        return "a JSON object"
    if origin in (tuple, list, Sequence):
        return "a list"
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
    return names.get(origin, "a JSON scalar")


def _matches(hint: Any, value: Any) -> bool:
    """Whether `value`'s JSON kind is the one `hint` reads (a union picks its member)."""
    origin = typing.get_origin(hint) or hint
    if value is None:
        return hint is type(None)
    if origin is bool:
        return isinstance(value, bool)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is float:
        return isinstance(value, (int, float, str)) and not isinstance(value, bool)
    if origin is str:
        return isinstance(value, str)
    if origin in (tuple, list, Sequence):
        return isinstance(value, list)
    return isinstance(value, Mapping)


def _value(hint: Any, value: Any, where: str, bounds: Mapping[str, Any], depth: int) -> Any:
    if depth > MAX_DEPTH:
        bad_field(where, f"is nested deeper than {MAX_DEPTH}")
    if _is_union(hint):
        for member in typing.get_args(hint):
            if _matches(member, value):
                return None if value is None else _value(member, value, where, bounds, depth)
        bad_field(where, f"must be {_spelled(hint)}, not {json_kind(value)}")
    origin, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    if hint is Any:
        return _scalar(value, where, bounds)
    if origin is str:
        return _text(value, where, bounds)
    if origin is bool:
        if not isinstance(value, bool):
            bad_field(where, f"must be true or false, not {json_kind(value)}")
        return value
    if origin is int:
        return as_int(value, where, bounds.get("low", -MAX_INT), bounds.get("high", MAX_INT))
    if origin is float:
        if isinstance(value, str) and value in ("nan", "inf", "-inf"):
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            bad_field(where, f"must be a number, not {json_kind(value)}")
        return float(value)
    if origin in (tuple, list, Sequence):
        return _items(origin, args, value, where, bounds, depth)
    if origin in (dict, Mapping):
        return _mapping(args[1], value, where, bounds, depth)
    if isinstance(origin, type) and dataclasses.is_dataclass(origin):
        return _dataclass(origin, value, where, depth)
    raise TypeError(f"{where}: no JSON form for {hint!r}")  # a class this module cannot read


def _text(value: Any, where: str, bounds: Mapping[str, Any]) -> str:
    if not isinstance(value, str):
        bad_field(where, f"must be a string, not {json_kind(value)}")
    max_len = bounds.get("max_len", 4096)
    if len(value) > max_len:
        bad_field(where, f"is longer than {max_len} characters")
    pattern = bounds.get("pattern")
    if pattern is not None and not pattern.match(value):
        bad_field(where, f"is not a valid name ({value[:60]!r})")
    return value


def _scalar(value: Any, where: str, bounds: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        return _text(value, where, bounds)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    bad_field(where, f"must be a JSON scalar, not {json_kind(value)}")


def _check_container(
    value: Any, kind: type, spelled: str, where: str, b: Mapping[str, Any]
) -> None:
    """`value` is a `kind` of at most the field's ``max_items`` items, else one error."""
    if not isinstance(value, kind):
        bad_field(where, f"must be {spelled}, not {json_kind(value)}")
    max_items = b.get("max_items", 1_000_000)
    if len(cast(Sized, value)) > max_items:
        bad_field(where, f"has more than {max_items} items")


def _items(
    origin: Any, args: tuple[Any, ...], value: Any, where: str, b: Mapping[str, Any], depth: int
) -> Any:
    _check_container(value, list, "a list", where, b)
    if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[X, Y]: fixed length
        if len(value) != len(args):
            bad_field(where, f"has {len(value)} items, not {len(args)}")
        return tuple(
            _value(a, v, f"{where}[{i}]", b, depth + 1)
            for i, (a, v) in enumerate(zip(args, value, strict=True))
        )
    item = args[0] if args else Any
    out = [_value(item, v, f"{where}[{i}]", b, depth + 1) for i, v in enumerate(value)]
    return out if origin is list else tuple(out)


def _mapping(item: Any, value: Any, where: str, b: Mapping[str, Any], depth: int) -> Any:
    _check_container(value, Mapping, "a JSON object", where, b)
    pattern = b.get("key_pattern")
    for key in value:
        if len(key) > 512 or (pattern is not None and not pattern.match(key)):
            bad_field(where, f"has the key {key[:60]!r}")
    return {str(k): _value(item, v, f"{where}.{k}", b, depth + 1) for k, v in value.items()}
