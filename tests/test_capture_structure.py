"""capture.pytree.recorded_structure: a recorded structure read once into typed leaves."""

from __future__ import annotations

import json

import pytest

from capture.analysis.groups import analyze
from capture.errors import ReplayError
from capture.pytree.recorded_structure import MISSING, PRESENT, RecordedLeaf, RecordedStructure
from capture.pytree.treespec import UnsafeTreespec
from capture.store_api import Store

_SIGNATURE = json.dumps(
    [
        {"name": "x", "kind": "POSITIONAL_OR_KEYWORD", "has_default": False},
        {"name": "mask", "kind": "POSITIONAL_OR_KEYWORD", "has_default": True},
    ]
)
_LEAF = '{"type": null, "context": null, "children_spec": []}'
_TREESPEC = (
    '[1, {"type": "builtins.tuple", "context": "null", "children_spec": ['
    '{"type": "builtins.tuple", "context": "null", "children_spec": [' + _LEAF + "]}, "
    '{"type": "builtins.dict", "context": "[]", "children_spec": []}]}]'
)


def _rows(**changes: object) -> list[dict[str, object]]:
    base: dict[str, object] = {
        "structure_id": "s1",
        "model": "m",
        "treespec": _TREESPEC,
        "signature": _SIGNATURE,
        "n_args": 1,
    }
    base.update(changes)
    return [
        {**base, "leaf": 0, "path": "args[0]", "argument": "x", "position": 0, "kind": "tensor",
         "type": "Tensor", "dtype": "float32", "rank": 2, "device": "cpu", "dim_offset": 0},
        {**base, "leaf": 1, "path": "kwargs['mask']", "argument": "mask", "position": None,
         "kind": "missing", "type": "missing"},
    ]  # fmt: skip


def test_rows_become_typed_leaves_with_the_structure_wide_columns_read_once() -> None:
    st = RecordedStructure.from_rows(_rows())
    assert (st.structure_id, st.n_args, st.width, [p.name for p in st.params]) == (
        "s1",
        1,
        2,
        ["x", "mask"],
    )
    assert st.leaves[0] == RecordedLeaf(
        0, "args[0]", "x", 0, "tensor", "Tensor", "float32", 2, "cpu", None, 0, None
    )


def test_argument_status_follows_the_signature_order() -> None:
    assert RecordedStructure.from_rows(_rows()).argument_status() == {"x": PRESENT, "mask": MISSING}


def test_a_malformed_signature_is_kept_as_an_error_until_replay_needs_it() -> None:
    st = RecordedStructure.from_rows(_rows(signature="[{]"))
    assert len(st.params) == 0 and st.params.index == {}
    with pytest.raises(ReplayError, match="signature is malformed"):
        st.checked_params()


def test_the_treespec_protocol_is_checked() -> None:
    st = RecordedStructure.from_rows(_rows(treespec=_TREESPEC.replace("[1,", "[2,", 1)))
    with pytest.raises(UnsafeTreespec, match="protocol 2"):
        _ = st.tree


def test_the_analysis_builds_one_structure_per_group_matching_its_rows(llama: Store) -> None:
    for group in analyze(llama):
        rows = llama.query(
            "SELECT * FROM structures WHERE model = $model AND structure_id = $sid ORDER BY leaf",
            {"model": group.model_name, "sid": group.structure_id},
        ).to_pylist()
        assert group.structure == RecordedStructure.from_rows(rows)
        assert [leaf.path for leaf in group.structure.leaves] == [r["path"] for r in rows]


def test_a_reshaped_group_equals_one_built_with_that_option(llama: Store) -> None:
    import replay

    named = replay.export_inputs(llama, named_dims=True).groups[0]
    plain = replay.export_inputs(llama).groups[0]
    from replay.inputs.options import ShapeRetry

    reshaped = named.reshaped(ShapeRetry(unbounded=True))
    assert str(reshaped.dynamic_shapes) == str(plain.dynamic_shapes)
