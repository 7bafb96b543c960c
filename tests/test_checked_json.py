"""The manifest's parts, read and written from their dataclasses (`replay.runtime.checked_json`).

Every part round-trips through strict JSON unchanged, and each bad value is one `ArtifactError`
line naming where it sits, for types, bounds and the parts' own cross-field checks alike.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from replay.runtime.callform import CallForm
from replay.runtime.checked_json import MAX_DEPTH, read, to_json
from replay.runtime.conditions import Condition
from replay.runtime.coverage import CoverageRow
from replay.runtime.fills import Fill, FillAxis
from replay.runtime.guards import ArtifactError, Axis, Relation
from replay.runtime.manifest import ModuleEntry
from replay.runtime.ort.manifest import OnnxInput, OnnxOutputs

PART_ROW = CoverageRow("g0", "probe", "T7s4", 0, True, 0.0)
PARTS: list[Any] = [
    Axis("kwargs['x']", 0, 1, 8, True, "s0"),
    Axis("kwargs['x']", 1, 3, 3, False, None, narrowed=True),
    Relation("s1", ("s0", "s2"), -1),
    CallForm(("x",), ("mask",), ("extra",), "args"),
    CallForm((), ()),
    Condition("16*d1 != 80", "16*L['x'].size()[1] != 80"),
    CoverageRow("g0", "recorded", "T7s2x5", 3, True, 0.5, None, "onnx", (2, 5)),
    CoverageRow(None, "payload", "x", 1, False, math.inf, "why", "torch", None),
    OnnxInput("input_ids", 0, "kwargs['input_ids']", "int64", ("batch", 7), (1, 7), (8, 7)),
    OnnxOutputs("[1]", ("logits", None), (None, 2.5)),
    Fill("mask", "int64", 1, (FillAxis((0,)), FillAxis((1, 2), 1)), "ones"),
    ModuleEntry("m", "s3://b/store", "2026-01-01", None, False, (PART_ROW,), {"g1": "why"}, ("n",)),
]


@pytest.mark.parametrize("part", PARTS, ids=lambda p: type(p).__name__)
def test_every_part_round_trips_through_strict_json(part: Any) -> None:
    text = json.dumps(to_json(part), allow_nan=False)
    assert read(type(part), json.loads(text), "m.json") == part


def test_the_written_form_follows_the_fields_and_omits_a_default_only_where_told() -> None:
    assert to_json(PARTS[0]) == {
        "path": "kwargs['x']",
        "axis": 0,
        "min": 1,
        "max": 8,
        "dynamic": True,
        "symbol": "s0",
    }
    assert to_json(PARTS[1])["narrowed"] is True
    assert to_json(PARTS[7])["max_abs_diff"] == "inf"  # JSON has no spelling for it
    assert list(to_json(PARTS[-1]))[:4] == ["model", "store", "window", "complete"]
    assert to_json(PARTS[-1])["window"] == {"first": "2026-01-01", "last": None}


def _axis(**change: Any) -> dict[str, Any]:
    return {**to_json(PARTS[0]), **change}


def _input(**change: Any) -> dict[str, Any]:
    return {**to_json(PARTS[8]), **change}


BAD: dict[str, tuple[type, Any, str]] = {
    "missing": (Axis, {"path": "p", "axis": 0, "min": 1, "dynamic": True}, "m.json.max is missing"),
    "null": (Axis, _axis(path=None), "m.json.path must be a string, not null"),
    "a string for an int": (Axis, _axis(max="7"), "m.json.max must be an integer, not a string"),
    "a boolean for an int": (Axis, _axis(max=True), "max must be an integer, not a boolean"),
    "past its bound": (Axis, _axis(axis=65), "m.json.axis = 65 is outside [0, 64]"),
    "not a symbol": (Axis, _axis(symbol="a-b"), "m.json.symbol is not a valid name ('a-b')"),
    "cross-field": (Axis, _axis(min=9), "m.json has min 9 > max 8"),
    "term not a name": (
        Relation,
        {"symbol": "s", "terms": ["ok", "1x"], "offset": 0},
        "m.json.terms[1] is not a valid name",
    ),
    "not an object": (CallForm, ["x"], "m.json must be a JSON object, not a list"),
    "a list of strings": (
        CallForm,
        {"positional": ["x", 3], "keywords": []},
        "m.json.positional[1] must be a string, not a number",
    ),
    "dim name": (OnnxInput, _input(shape=["batch;", 7]), "m.json.shape[0] is not a valid name"),
    "negative size": (OnnxInput, _input(shape=["batch", -7]), "shape[1] = -7 is outside"),
    "neither": (OnnxInput, _input(shape=[True, 7]), "must be an integer or a string, not a"),
    "too many axes": (OnnxInput, _input(shape=[1] * 65), "m.json.shape has more than 64 items"),
    "widths": (OnnxInput, _input(min=[1]), "m.json has 2 axes, 1 minima and 2 maxima"),
    "a list for a constant": (
        OnnxOutputs,
        {"spec": "[1]", "names": [None], "constants": [[1]]},
        "m.json.constants[0] must be a JSON scalar, not a list",
    ),
    "too long": (
        OnnxOutputs,
        {"spec": "[1]", "names": ["x" * 1025], "constants": [None]},
        "m.json.names[0] is longer than 1024 characters",
    ),
    "condition grammar": (
        Condition,
        {"expr": "__import__('os')", "text": "t"},
        "m.json is not what capture writes",
    ),
    "nested key": (
        ModuleEntry,
        {"model": "m", "window": "x", "complete": True},
        "m.json.window must be a JSON object, not a string",
    ),
    "nested key bound": (
        ModuleEntry,
        {"model": "m", "window": {"first": "x" * 65}, "complete": True},
        "m.json.window.first is longer than 64 characters",
    ),
    "dtype": (
        Fill,
        {"argument": "mask", "dtype": "float32", "value": 1, "shape": []},
        "m.json.dtype is not a valid name ('float32')",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_value_is_one_line_naming_where_it_was(case: str) -> None:
    cls, raw, message = BAD[case]
    with pytest.raises(ArtifactError) as caught:
        read(cls, raw, "m.json")
    text = str(caught.value)
    assert message in text
    assert len(text.splitlines()) == 1 and text.endswith("export it again")


def test_a_fill_term_past_the_calls_sizes_is_refused_where_it_sits() -> None:
    raw = {"argument": "mask", "dtype": "int64", "value": 1, "shape": [{"terms": [0, 2]}]}
    with pytest.raises(ArtifactError, match=re.escape("p[0].fills[1].shape[0].terms has [0, 2]")):
        Fill.from_dict(raw, width=2, where="p[0].fills[1]")


@dataclass(frozen=True)
class Node:
    """A part that nests: how deep a reader follows is bounded."""

    name: str
    children: tuple[Node, ...] = ()
    tags: Mapping[str, int] = field(
        default_factory=dict, metadata={"key_pattern": re.compile(r"[a-z]+\Z"), "low": 0}
    )
    pair: tuple[int, str] | None = None


def test_nesting_is_bounded() -> None:
    raw: dict[str, Any] = {"name": "leaf"}
    for i in range(MAX_DEPTH):
        raw = {"name": f"n{i}", "children": [raw]}
    assert read(Node, {"name": "top", "children": [{"name": "a"}]}, "m").children[0].name == "a"
    with pytest.raises(ArtifactError, match=f"is nested deeper than {MAX_DEPTH}"):
        read(Node, raw, "m")


def test_mappings_and_fixed_tuples_are_read_with_their_bounds() -> None:
    node = read(Node, {"name": "n", "tags": {"a": 1}, "pair": [2, "x"]}, "m")
    assert node == Node("n", (), {"a": 1}, (2, "x"))
    assert to_json(node) == {"name": "n", "children": [], "tags": {"a": 1}, "pair": [2, "x"]}
    with pytest.raises(ArtifactError, match=re.escape("m.tags has the key 'A'")):
        read(Node, {"name": "n", "tags": {"A": 1}}, "m")
    with pytest.raises(ArtifactError, match=re.escape("m.tags.a = -1 is outside")):
        read(Node, {"name": "n", "tags": {"a": -1}}, "m")
    with pytest.raises(ArtifactError, match=re.escape("m.pair has 1 items, not 2")):
        read(Node, {"name": "n", "pair": [2]}, "m")


def test_a_module_entry_writes_its_store_model_name_under_model() -> None:
    entry = next(p for p in PARTS if isinstance(p, ModuleEntry))
    written = to_json(entry)
    assert list(written)[:2] == ["model", "store"]
    assert written["model"] == entry.model_name == "m"
