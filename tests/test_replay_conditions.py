"""A program's own size guards as data (replay/runtime/conditions.py): translated over a
call's dims, parsed against a small grammar, evaluated without eval."""

from __future__ import annotations

import pytest

from replay.runtime.checked_json import Fields
from replay.runtime.conditions import ConditionError, holds, parse, translate
from replay.runtime.guards import ArtifactError
from replay.runtime.manifest import ProgramEntry

SOURCES = {"L['input_ids']": (0, 2), "L['past_key_values'].key_cache[0]": (2, 4)}


@pytest.mark.parametrize(
    ("line", "expr"),
    [
        ("L['input_ids'].size()[1] <= 4", "d1 <= 4"),
        ("(16*L['input_ids'].size()[1]) != 80", "(16*d1) != 80"),
        (
            "L['input_ids'].size()[0] == L['past_key_values'].key_cache[0].size()[0]",
            "d0 == d2",
        ),
        (
            "max(0, (-5) + L['past_key_values'].key_cache[0].size()[2]) <= 3",
            "max(0, (-5) + d4) <= 3",
        ),
    ],
)
def test_guard_lines_become_conditions_over_dims(line: str, expr: str) -> None:
    done, skipped = translate([line], SOURCES)
    assert [(c.expr, c.text) for c in done] == [(expr, line)] and skipped == []


@pytest.mark.parametrize(
    "line",
    [
        "L['attention_mask'].size()[1] <= 4",  # an input the call does not have
        "L['input_ids'].size()[2] <= 4",  # past the input's rank
        "L['input_ids'].stride()[0] == 1",  # not a size
    ],
)
def test_lines_naming_anything_else_are_reported_not_translated(line: str) -> None:
    assert translate([line], SOURCES) == ([], [line])


@pytest.mark.parametrize(
    ("expr", "dims", "expected"),
    [
        ("16*d1 != 80", [2, 5], False),
        ("16*d1 != 80", [2, 6], True),
        ("d0 + 1 == d1 and not d0 > 3", [2, 3], True),
        ("max(1024, 2*d0) >= d1 or d1 % 2 == 0", [1, 4000], True),
        ("-d0 <= -5", [4], False),
    ],
)
def test_conditions_evaluate_on_dims(expr: str, dims: list[int], expected: bool) -> None:
    assert holds(parse(expr), dims) is expected


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('true')",
        "d0.__class__",
        "open('x')",
        "d0 ** 99999999",
        "[d0][0] == 1",
        "'a' == 'a'",
        "max",
        "d0 if d1 else d2",
    ],
)
def test_anything_outside_the_grammar_is_refused(expr: str) -> None:
    # a manifest is data; a planted condition is refused, never evaluated
    with pytest.raises(ConditionError):
        parse(expr)


def _entry(conditions: list[dict[str, str]]) -> dict[str, object]:
    return {
        "group": "prefill",
        "program": "prefill",
        "model": "m",
        "structure_id": "s",
        "calls": 1,
        "signatures": 1,
        "n_args": 0,
        "leaves": [{"path": "kwargs['x']", "kind": "tensor", "dtype": "int64", "rank": 2}],
        "axes": [
            {"path": "kwargs['x']", "axis": 0, "min": 1, "max": 4, "dynamic": True},
            {"path": "kwargs['x']", "axis": 1, "min": 2, "max": 9, "dynamic": True},
        ],
        "form": {"positional": [], "keywords": ["x"]},
        "conditions": conditions,
    }


def test_a_guard_refuses_sizes_its_program_guard_excludes() -> None:
    line = {"expr": "(16*d1) != 80", "text": "(16*L['x'].size()[1]) != 80"}
    guard = ProgramEntry.parse(Fields(_entry([line]), "m.json")).guard
    assert guard.check([2, 6]) is None
    assert guard.check([2, 5]) == "its program's guard (16*L['x'].size()[1]) != 80 does not hold"


def test_a_planted_condition_in_a_manifest_is_refused_not_evaluated() -> None:
    # the manifest is data; what the grammar does not allow is one ArtifactError
    planted = {"expr": "__import__('os').system('true')", "text": "x"}
    refused = r"conditions\[0\] is not what capture writes \(the size condition .* holds a Call"
    with pytest.raises(ArtifactError, match=refused):
        ProgramEntry.parse(Fields(_entry([planted]), "m.json"))


@pytest.mark.parametrize(
    "expr",
    [
        "-" * 1990 + "d0 > 1",  # the recursion limit passed in a 2,000-character condition
        "not " * 400 + "d0",
        "+".join(["d0"] * 300) + " > 1",
    ],
)
def test_a_condition_nested_too_deep_is_refused_in_one_line(expr: str) -> None:
    # one ConditionError naming the limit, never a RecursionError
    with pytest.raises(ConditionError, match="nests deeper than 200 levels") as raised:
        parse(expr)
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 300


def test_a_deep_condition_in_a_manifest_is_one_artifact_error() -> None:
    planted = {"expr": "-" * 1990 + "d0 > 1", "text": "x"}
    with pytest.raises(ArtifactError, match=r"conditions\[0\] is not what capture writes"):
        ProgramEntry.parse(Fields(_entry([planted]), "m.json"))


def test_a_sum_of_many_terms_still_parses() -> None:
    assert holds(parse(" + ".join(["d0"] * 150) + " == 300"), [2])
