"""capture.pytree.treespec: stored treespecs parsed against an allow-list."""

from __future__ import annotations

import collections
import json
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree

from capture.pytree import nodes, treespec
from capture.pytree.treespec import UnsafeTreespec

_LEAF: dict[str, Any] = {"type": None, "context": None, "children_spec": []}


def _dumps(value: Any) -> str:
    return pytree.treespec_dumps(pytree.tree_structure(value))


@pytest.mark.parametrize(
    "value",
    [
        ((1, [2, 3]), {"a": 4}),
        ((), {"d": collections.defaultdict(list, {"x": 1}), "q": collections.deque([1], maxlen=3)}),
        ((collections.OrderedDict(k=1, j=2),), {}),
        (([],), {"none": None}),
    ],
    ids=["tuple-list-dict", "defaultdict-deque", "ordereddict", "empty-and-none"],
)
def test_builtin_containers_round_trip(value: Any) -> None:
    spec = pytree.tree_structure(value)
    assert treespec.to_treespec(treespec.parse(_dumps(value))) == spec


def test_registered_cache_round_trips() -> None:
    with nodes.register_flattening_functions():
        cache = nodes.make_dynamic_cache([(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))])
        value = ((torch.zeros(1, 3),), {"past_key_values": cache})
        spec = pytree.tree_structure(value)
        rebuilt = treespec.to_treespec(treespec.parse(pytree.treespec_dumps(spec)))
        assert rebuilt == spec


def test_class_registered_without_a_context_dumper_round_trips() -> None:
    # transformers registers its ModelOutputs with no context dumper: torch stores the context
    # as JSON text (a T5 encoder_outputs argument; the T5 generate() replay failed on it).
    from transformers.modeling_outputs import BaseModelOutput

    value = ((), {"encoder_outputs": BaseModelOutput(last_hidden_state=torch.zeros(1, 2))})
    spec = pytree.tree_structure(value)
    rebuilt = treespec.to_treespec(treespec.parse(pytree.treespec_dumps(spec)))
    assert rebuilt == spec
    restored = pytree.tree_unflatten([torch.ones(1, 2)], rebuilt)[1]["encoder_outputs"]
    assert list(restored.keys()) == ["last_hidden_state"]


def test_cache_class_not_registered_in_this_process_is_refused() -> None:
    with nodes.register_flattening_functions():
        cache = nodes.make_dynamic_cache([(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))])
        text = pytree.treespec_dumps(pytree.tree_structure(((), {"c": cache})))
    node = treespec.parse(text, "file.parquet")
    with pytest.raises(UnsafeTreespec, match="not registered in this process"):
        treespec.to_treespec(node, "file.parquet")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("not json", "is not JSON"),
        ("[2, null]", "uses protocol 2"),
        ('{"type": null}', r"is not \[protocol, node\]"),
        (
            json.dumps([1, {"type": "os.system", "context": "null", "children_spec": []}]),
            "names the node type 'os.system'",
        ),
        (
            json.dumps(
                [
                    1,
                    {
                        "type": "builtins.dict",
                        "context": json.dumps([{"__enum__": 1}]),
                        "children_spec": [_LEAF],
                    },
                ]
            ),
            "has a builtins.dict key of type dict",
        ),
        (
            json.dumps(
                [
                    1,
                    {
                        "type": "collections.defaultdict",
                        "context": {
                            "default_factory_module": "os",
                            "default_factory_name": "system",
                            "dict_context": [],
                        },
                        "children_spec": [],
                    },
                ]
            ),
            "names the defaultdict factory os.system",
        ),
        (
            json.dumps(
                [1, {"type": "builtins.dict", "context": '["a", "b"]', "children_spec": [_LEAF]}]
            ),
            "keys that do not match its children",
        ),
        (json.dumps([1, {"type": None, "context": "x", "children_spec": []}]), "malformed leaf"),
    ],
    ids=["json", "protocol", "shape", "type", "enum", "factory", "keys", "leaf"],
)
def test_refused_treespecs_name_their_source(text: str, match: str) -> None:
    with pytest.raises(UnsafeTreespec, match=match) as info:
        treespec.parse(text, "calls/x.parquet")
    assert "calls/x.parquet" in str(info.value)
    assert "\n" not in str(info.value)


def test_deep_nesting_is_refused() -> None:
    node: dict[str, Any] = _LEAF
    for _ in range(100):
        node = {"type": "builtins.list", "context": "null", "children_spec": [node]}
    with pytest.raises(UnsafeTreespec, match="deeper than"):
        treespec.parse(json.dumps([1, node]))


def test_unregistered_namedtuple_is_rebuilt_positionally() -> None:
    text = json.dumps(
        [
            1,
            {
                "type": "collections.namedtuple",
                "context": "somewhere.Point",
                "children_spec": [_LEAF, _LEAF],
            },
        ]
    )
    value = pytree.tree_unflatten([1, 2], treespec.to_treespec(treespec.parse(text)))
    assert (type(value).__name__, value._fields, tuple(value)) == (
        "Point",
        ("field0", "field1"),
        (1, 2),
    )
