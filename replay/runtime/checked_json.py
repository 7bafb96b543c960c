"""Typed reads of an artifact's JSON: each bad value is one `ArtifactError` naming where it was.

An artifact is data written by `replay.artifact.saving.save` and read anywhere later; a changed
file must fail with one line that names the file and the field, never with a KeyError,
TypeError, ValueError or OverflowError out of the middle of a loader. `load` parses bytes with
plain `json` (no object hook; ``NaN``/``Infinity`` and numbers that overflow a float are
refused) once their nesting is measured (no deeper than `capture.untrusted.MAX_JSON_DEPTH`),
and `Fields` reads one JSON object field by field with the type and bounds each field
must have.

`read` and `to_json` (`replay.runtime.dataclass_json`, imported from here) do it for a whole
frozen dataclass, from its fields' type hints and the bounds in their ``metadata``: the
manifest's parts (`replay.runtime.guards.Axis`,
`replay.runtime.callform.CallForm`, `replay.runtime.coverage.CoverageRow`, an ONNX file's
inputs and outputs, ...) are declared once, as dataclasses, and read and written from that one
declaration. A check across fields stays with its class (``invalid``). The manifests' top
objects, whose JSON flattens or regroups their parts (a program entry holds its guard's fields),
compose these reads by hand.
"""

from __future__ import annotations

import gc
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

from capture.untrusted import MAX_JSON_DEPTH, too_deep
from replay.runtime.dataclass_json import (
    MAX_DEPTH,
    MAX_INT,
    as_int,
    bad_field,
    json_kind,
    read,
    to_json,
)
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
    "MAX_DEPTH",
]

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
            self.fail(where, f"must be a JSON object, not {json_kind(raw)}")
        self.raw: Mapping[str, Any] = raw
        self.where = where

    @staticmethod
    def fail(where: str, what: str) -> NoReturn:
        """Raises the one error of a bad field (`replay.runtime.dataclass_json.bad_field`)."""
        bad_field(where, what)

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
            self.fail(f"{self.where}.{key}", f"must be a string, not {json_kind(value)}")
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
            self.fail(f"{self.where}.{key}", f"must be true or false, not {json_kind(value)}")
        return value

    def number(self, key: str, *, optional: bool = False) -> float | None:
        """A number field; ``"nan"``, ``"inf"`` and ``"-inf"`` spell the non-finite ones."""
        value = self._get(key, optional)
        if value is None and optional:
            return None
        if isinstance(value, str) and value in ("nan", "inf", "-inf"):
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(f"{self.where}.{key}", f"must be a number, not {json_kind(value)}")
        return float(value)

    def items(self, key: str, *, optional: bool = False, max_items: int = 1_000_000) -> list[Any]:
        """A list field (empty when `optional` and absent or null)."""
        value = self._get(key, optional)
        if value is None and optional:
            return []
        if not isinstance(value, list):
            self.fail(f"{self.where}.{key}", f"must be a list, not {json_kind(value)}")
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
                self.fail(f"{self.where}.{key}[{i}]", f"must be a string, not {json_kind(item)}")
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
