"""Typed reads of an artifact's JSON: each bad value is one `ArtifactError` naming where it was.

An artifact is data written by `replay.artifact.saving.save` and read anywhere later; a changed
file must fail with one line that names the file and the field, never with a KeyError,
TypeError, ValueError or OverflowError out of the middle of a loader. `load` parses bytes with
plain `json` (no object hook; ``NaN``/``Infinity`` and numbers that overflow a float are
refused) once their nesting is measured (no deeper than `capture.untrusted.MAX_JSON_DEPTH`),
and `Fields` reads one JSON object field by field with the type and bounds each field
must have.

`read` and `to_json` do it for a whole frozen dataclass, from its fields' type hints and the bounds
in their ``metadata``: the manifest's parts (`replay.runtime.guards.Axis`,
`replay.runtime.callform.CallForm`, `replay.runtime.coverage.CoverageRow`, an ONNX file's
inputs and outputs, ...) are declared once, as dataclasses, and read and written from that one
declaration. A check across fields stays with its class (``invalid``). The manifests' top
objects, whose JSON flattens or regroups their parts (a program entry holds its guard's fields),
compose these reads by hand.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import math
import re
import types
import typing
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar, cast

from capture.errors import ReplayError
from capture.untrusted import MAX_JSON_DEPTH, too_deep
from replay.runtime.guards import NAME, ArtifactError

__all__ = [
    "load",
    "collector_paused",
    "Fields",
    "read",
    "to_json",
    "checked_format",
    "as_int",
    "MAX_INT",
    "NAME",
    "DOTTED",
]

MAX_INT = 2**62
"""Largest magnitude an integer field may have (sizes, counts, offsets)."""


DOTTED = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*\Z")
"""A dotted name of identifiers and digits: parameter FQNs (``model.layers.0.q.weight``)."""

_T = TypeVar("_T")


def _refuse_constant(text: str) -> NoReturn:
    raise ValueError(f"{text} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows a float")
    return value


def load(data: bytes, source: str) -> Any:
    """Parses JSON bytes read from an artifact.

    Args:
        data: The bytes (already bounded in size by the caller).
        source: What they were read from (an archive entry), named in errors.

    Returns:
        The parsed value.

    Raises:
        ArtifactError: Not UTF-8 JSON, nested deeper than
            `capture.untrusted.MAX_JSON_DEPTH`, a number out of range, ``NaN`` or ``Infinity``.

    Example:
        >>> load(b'{"a": 1}', "x.json")
        {'a': 1}
    """
    if too_deep(data, MAX_JSON_DEPTH):
        raise ArtifactError(
            f"{source} nests deeper than {MAX_JSON_DEPTH} levels of lists and objects, which "
            "capture never writes: the artifact was changed or damaged; export it again"
        )
    try:
        return json.loads(data, parse_constant=_refuse_constant, parse_float=_finite)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        raise ArtifactError(f"{source} is not valid JSON ({str(e)[:120]})") from None


@contextmanager
def collector_paused() -> Iterator[None]:
    """CPython's cyclic garbage collector off for the block, back on after it (on error too)
    unless it was off already.

    A program's graph parses into some 10^5 small dicts and lists, all alive while a reader
    checks or builds from them: that many young survivors make CPython run a full collection,
    which walks every object of the process (torch's and transformers' too: a fifth of a
    second after they are imported) and can free none of them. A reader that holds parsed
    JSON only while it reads it runs in this block; the collector stays off for the whole
    process meanwhile, other threads included.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Fields:
    """One JSON object of an artifact, read field by field with types and bounds.

    Attributes:
        where: Where the object sits (``extra/capture_manifest.json: programs[2]``).

    Example:
        >>> Fields({"n": 3}, "x.json").integer("n", low=0)
        3
    """

    def __init__(self, raw: Any, where: str) -> None:
        if not isinstance(raw, Mapping):
            self.fail(where, f"must be a JSON object, not {_kind(raw)}")
        self.raw: Mapping[str, Any] = raw
        self.where = where

    @staticmethod
    def fail(where: str, what: str) -> NoReturn:
        """Raises the one error of a bad field."""
        raise ArtifactError(
            f"{where} {what}: the artifact was changed or damaged after it was written; "
            "export it again"
        )

    def _get(self, key: str, optional: bool) -> Any:
        if key not in self.raw:
            if optional:
                return None
            self.fail(f"{self.where}.{key}", "is missing")
        return self.raw[key]

    def text(
        self,
        key: str,
        *,
        optional: bool = False,
        pattern: re.Pattern[str] | None = None,
        max_len: int = 4096,
    ) -> Any:
        """A string field (None when `optional` and absent or null)."""
        value = self._get(key, optional)
        if value is None and optional:
            return None
        if not isinstance(value, str):
            self.fail(f"{self.where}.{key}", f"must be a string, not {_kind(value)}")
        if len(value) > max_len:
            self.fail(f"{self.where}.{key}", f"is longer than {max_len} characters")
        if pattern is not None and not pattern.match(value):
            self.fail(f"{self.where}.{key}", f"is not a valid name ({value[:60]!r})")
        return value

    def integer(
        self, key: str, *, low: int = -MAX_INT, high: int = MAX_INT, optional: bool = False
    ) -> Any:
        """An integer field within ``[low, high]`` (booleans refused)."""
        value = self._get(key, optional)
        if value is None and optional:
            return None
        return as_int(value, f"{self.where}.{key}", low, high)

    def flag(self, key: str, *, optional: bool = False, default: bool = False) -> bool:
        """A boolean field (`default` when `optional` and absent)."""
        value = self._get(key, optional)
        if value is None and optional:
            return default
        if not isinstance(value, bool):
            self.fail(f"{self.where}.{key}", f"must be true or false, not {_kind(value)}")
        return value

    def number(self, key: str, *, optional: bool = False) -> float | None:
        """A number field; ``"nan"``, ``"inf"`` and ``"-inf"`` spell the non-finite ones."""
        value = self._get(key, optional)
        if value is None and optional:
            return None
        if isinstance(value, str) and value in ("nan", "inf", "-inf"):
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(f"{self.where}.{key}", f"must be a number, not {_kind(value)}")
        return float(value)

    def items(self, key: str, *, optional: bool = False, max_items: int = 1_000_000) -> list[Any]:
        """A list field (empty when `optional` and absent or null)."""
        value = self._get(key, optional)
        if value is None and optional:
            return []
        if not isinstance(value, list):
            self.fail(f"{self.where}.{key}", f"must be a list, not {_kind(value)}")
        if len(value) > max_items:
            self.fail(f"{self.where}.{key}", f"has more than {max_items} items")
        return value

    def child(self, key: str, *, optional: bool = False) -> Fields:
        """A nested object field (an empty one when `optional` and absent or null)."""
        value = self._get(key, optional)
        if value is None and optional:
            return Fields({}, f"{self.where}.{key}")
        return Fields(value, f"{self.where}.{key}")

    def each(self, key: str, read: Callable[[Fields], _T], *, optional: bool = False) -> list[_T]:
        """`read` applied to every object of a list field."""
        return [
            read(Fields(item, f"{self.where}.{key}[{i}]"))
            for i, item in enumerate(self.items(key, optional=optional))
        ]

    def one(self, key: str, cls: type[_T]) -> _T:
        """A nested object field read whole as the dataclass `cls` (`read`)."""
        return read(cls, self._get(key, False), f"{self.where}.{key}")

    def each_of(
        self, key: str, cls: type[_T], *, optional: bool = False, max_items: int = 1_000_000
    ) -> list[_T]:
        """Every object of a list field read whole as the dataclass `cls` (`read`)."""
        return [
            read(cls, item, f"{self.where}.{key}[{i}]")
            for i, item in enumerate(self.items(key, optional=optional, max_items=max_items))
        ]

    def texts(self, key: str, *, optional: bool = False, max_len: int = 4096) -> list[Any]:
        """A list of strings."""
        out = self.items(key, optional=optional)
        for i, item in enumerate(out):
            if not isinstance(item, str) or len(item) > max_len:
                self.fail(f"{self.where}.{key}[{i}]", f"must be a string, not {_kind(item)}")
        return out

    def integers(self, key: str, *, low: int = -MAX_INT, high: int = MAX_INT) -> tuple[int, ...]:
        """A list of integers within ``[low, high]``."""
        return tuple(
            as_int(v, f"{self.where}.{key}[{i}]", low, high) for i, v in enumerate(self.items(key))
        )


def checked_format(raw: Any, expected: str, source: str) -> Fields:
    """A parsed manifest's top object, its ``format`` checked.

    Raises:
        ArtifactError: Not an object, or another format.

    Example:
        >>> checked_format({"format": "x/1", "n": 3}, "x/1", "m.json").integer("n")
        3
    """
    if not isinstance(raw, dict) or raw.get("format") != expected:
        found = raw.get("format") if isinstance(raw, dict) else None
        raise ArtifactError(
            f"{source}: manifest format {str(found)[:60]!r}, this capture reads {expected!r}"
        )
    return Fields(raw, source)


def as_int(value: Any, where: str, low: int = -MAX_INT, high: int = MAX_INT) -> int:
    """`value` as an int within ``[low, high]``, or one `ArtifactError` naming `where`."""
    if isinstance(value, bool) or not isinstance(value, int):
        Fields.fail(where, f"must be an integer, not {_kind(value)}")
    if not low <= value <= high:
        Fields.fail(where, f"= {value} is outside [{low}, {high}]")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number"
    )


# -- whole dataclasses -----------------------------------------------------------------------

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
        Fields.fail(where, f"is nested deeper than {MAX_DEPTH}")
    if not isinstance(raw, Mapping):
        Fields.fail(where, f"must be a JSON object, not {_kind(raw)}")
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
                    Fields.fail(at, "is missing")
                Fields.fail(at, f"must be {_spelled(hint)}, not null")
            values[f.name] = default
            continue
        values[f.name] = _value(hint, value, at, f.metadata, depth + 1)
    try:
        out = cls(**values)
    except (ValueError, ReplayError) as e:  # the class's own check (a condition's syntax)
        Fields.fail(where, f"is not what capture writes ({str(e)[:200]})")
    problem = getattr(out, "invalid", None)
    if problem is not None and (text := problem()):
        Fields.fail(where, text)
    return out


def _parent(raw: Mapping[str, Any], key: str, where: str) -> tuple[Mapping[str, Any], str]:
    """The object holding a field whose key is a path (``window.first``), and its last key;
    an absent or null object on the path holds nothing."""
    *parents, last = key.split(".")
    for parent in parents:
        where = f"{where}.{parent}"
        child = raw.get(parent)
        if child is not None and not isinstance(child, Mapping):
            Fields.fail(where, f"must be a JSON object, not {_kind(child)}")
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
        Fields.fail(where, f"is nested deeper than {MAX_DEPTH}")
    if _is_union(hint):
        for member in typing.get_args(hint):
            if _matches(member, value):
                return None if value is None else _value(member, value, where, bounds, depth)
        Fields.fail(where, f"must be {_spelled(hint)}, not {_kind(value)}")
    origin, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    if hint is Any:
        return _scalar(value, where, bounds)
    if origin is str:
        return _text(value, where, bounds)
    if origin is bool:
        if not isinstance(value, bool):
            Fields.fail(where, f"must be true or false, not {_kind(value)}")
        return value
    if origin is int:
        return as_int(value, where, bounds.get("low", -MAX_INT), bounds.get("high", MAX_INT))
    if origin is float:
        if isinstance(value, str) and value in ("nan", "inf", "-inf"):
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            Fields.fail(where, f"must be a number, not {_kind(value)}")
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
        Fields.fail(where, f"must be a string, not {_kind(value)}")
    max_len = bounds.get("max_len", 4096)
    if len(value) > max_len:
        Fields.fail(where, f"is longer than {max_len} characters")
    pattern = bounds.get("pattern")
    if pattern is not None and not pattern.match(value):
        Fields.fail(where, f"is not a valid name ({value[:60]!r})")
    return value


def _scalar(value: Any, where: str, bounds: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        return _text(value, where, bounds)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    Fields.fail(where, f"must be a JSON scalar, not {_kind(value)}")


def _items(
    origin: Any, args: tuple[Any, ...], value: Any, where: str, b: Mapping[str, Any], depth: int
) -> Any:
    if not isinstance(value, list):
        Fields.fail(where, f"must be a list, not {_kind(value)}")
    max_items = b.get("max_items", 1_000_000)
    if len(value) > max_items:
        Fields.fail(where, f"has more than {max_items} items")
    if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[X, Y]: fixed length
        if len(value) != len(args):
            Fields.fail(where, f"has {len(value)} items, not {len(args)}")
        return tuple(
            _value(a, v, f"{where}[{i}]", b, depth + 1)
            for i, (a, v) in enumerate(zip(args, value, strict=True))
        )
    item = args[0] if args else Any
    out = [_value(item, v, f"{where}[{i}]", b, depth + 1) for i, v in enumerate(value)]
    return out if origin is list else tuple(out)


def _mapping(item: Any, value: Any, where: str, b: Mapping[str, Any], depth: int) -> Any:
    if not isinstance(value, Mapping):
        Fields.fail(where, f"must be a JSON object, not {_kind(value)}")
    max_items = b.get("max_items", 1_000_000)
    if len(value) > max_items:
        Fields.fail(where, f"has more than {max_items} items")
    pattern = b.get("key_pattern")
    for key in value:
        if len(key) > 512 or (pattern is not None and not pattern.match(key)):
            Fields.fail(where, f"has the key {key[:60]!r}")
    return {str(k): _value(item, v, f"{where}.{k}", b, depth + 1) for k, v in value.items()}
