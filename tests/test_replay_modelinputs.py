"""replay.ModelInputs and replay.all_dynamic_shape_from_inputs (seeds 003 and 004)."""

from __future__ import annotations

import pprint
import re
from typing import Any

import pytest
import torch

from capture import make_dynamic_cache, register_flattening_functions
from capture.errors import CaptureError, ObservationMismatch
from replay import ModelInputs, all_dynamic_shape_from_inputs

D = torch.export.Dim.DYNAMIC


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


def _cache(seq: int, layers: int = 1) -> Any:
    return make_dynamic_cache(
        [(torch.randn(2, 1, seq, 8), torch.randn(2, 1, seq, 8)) for _ in range(layers)]
    )


# -- ModelInputs ----------------------------------------------------------------------------------
def test_positional_inputs_as_in_seed_003() -> None:
    inputs = [(torch.randn(5, 6), torch.randn(1, 6)), (torch.randn(7, 8), torch.randn(1, 8))]
    ds = ModelInputs(Model(), inputs).guess_dynamic_shapes()
    assert ds == (({0: D, 1: D}, {1: D}), {})


def test_keyword_inputs_as_in_seed_003() -> None:
    inputs = [
        dict(x=torch.randn(5, 6), y=torch.randn(1, 6)),
        dict(x=torch.randn(7, 8), y=torch.randn(1, 8)),
    ]
    ds = ModelInputs(Model(), inputs).guess_dynamic_shapes()
    assert ds == ((), {"x": {0: D, 1: D}, "y": {1: D}})


def test_mixed_inputs_as_in_seed_003() -> None:
    inputs = [
        ((torch.randn(5, 6),), dict(y=torch.randn(1, 6))),
        ((torch.randn(7, 8),), dict(y=torch.randn(1, 8))),
    ]
    ds = ModelInputs(Model(), inputs).guess_dynamic_shapes()
    assert ds == (({0: D, 1: D},), {"y": {1: D}})


def test_pprint_of_the_guess() -> None:
    inputs = [(torch.randn(5, 6), torch.randn(1, 6)), (torch.randn(7, 8), torch.randn(1, 8))]
    text = pprint.pformat(ModelInputs(Model(), inputs).guess_dynamic_shapes())
    assert text == "(({0: DimHint(DYNAMIC), 1: DimHint(DYNAMIC)}, {1: DimHint(DYNAMIC)}), {})"


def test_inputs_are_normalised_to_args_kwargs_pairs() -> None:
    x = torch.zeros(1)
    mi = ModelInputs(Model(), [(x, x), dict(x=x, y=x), ((x,), dict(y=x))])
    assert [(len(a), list(k)) for a, k in mi.inputs] == [(2, []), (0, ["x", "y"]), (1, ["y"])]


def test_inputs_must_be_a_list() -> None:
    with pytest.raises(CaptureError, match="inputs must be a list"):
        ModelInputs(Model(), (torch.zeros(1),))  # type: ignore[arg-type]


def test_single_input_set_guesses_nothing() -> None:
    ds = ModelInputs(Model(), [(torch.randn(5, 6), torch.randn(1, 6))]).guess_dynamic_shapes()
    assert ds == (({}, {}), {})


def test_single_input_set_with_auto() -> None:
    mi = ModelInputs(Model(), [(torch.randn(5, 6), torch.randn(1, 6))])
    auto = torch.export.Dim.AUTO
    assert mi.guess_dynamic_shapes(auto=True) == (({0: auto, 1: auto}, {0: auto, 1: auto}), {})


def test_named_dims_with_a_string() -> None:
    inputs = [(torch.randn(5, 6), torch.randn(1, 6)), (torch.randn(7, 8), torch.randn(1, 8))]
    ds = ModelInputs(Model(), inputs).guess_dynamic_shapes(auto="dim")
    assert ds == (({0: "dim0", 1: "dim1"}, {1: "dim1"}), {})


def test_dim_always_zero_is_dynamic() -> None:
    inputs = [(torch.randn(0, 6), torch.randn(1, 6)), (torch.randn(0, 6), torch.randn(1, 6))]
    assert ModelInputs(Model(), inputs).guess_dynamic_shapes() == (({0: D}, {}), {})


def test_cache_gives_a_flat_list() -> None:
    inputs = [dict(x=torch.zeros(2, 3), y=_cache(3, 2)), dict(x=torch.zeros(2, 4), y=_cache(4, 2))]
    with register_flattening_functions():
        ds = ModelInputs(Model(), inputs).guess_dynamic_shapes()
    assert ds == ((), {"x": {1: D}, "y": [{2: D}] * 4})


def test_different_number_of_positional_arguments_raises() -> None:
    x = torch.zeros(1)
    with pytest.raises(ObservationMismatch, match=r"\[1, 2\] positional arguments"):
        ModelInputs(Model(), [(x, x), ((x,), dict(y=x))]).guess_dynamic_shapes()


def test_different_keyword_names_raise() -> None:
    x = torch.zeros(1)
    with pytest.raises(ObservationMismatch, match=r"inputs\[1\] passes the keyword arguments"):
        ModelInputs(Model(), [dict(x=x, y=x), dict(x=x, z=x)]).guess_dynamic_shapes()


def test_list_length_change_names_the_path() -> None:
    x = torch.zeros(1)
    with pytest.raises(
        ObservationMismatch, match=re.escape("args[1][2] is in inputs[1] but not in inputs[0]")
    ):
        ModelInputs(Model(), [(x, [x, x]), (x, [x, x, x])]).guess_dynamic_shapes()


def test_cache_layer_change_names_the_path() -> None:
    with pytest.raises(
        ObservationMismatch,
        match=re.escape("kwargs['y'].key_cache[1] is in inputs[1] but not in inputs[0]"),
    ):
        inputs = [dict(x=torch.zeros(1), y=_cache(3, 1)), dict(x=torch.zeros(1), y=_cache(3, 2))]
        ModelInputs(Model(), inputs).guess_dynamic_shapes()


def test_rank_change_names_the_path() -> None:
    with pytest.raises(ObservationMismatch, match=re.escape("args[0] has ranks [1, 2]")):
        inputs = [(torch.zeros(2), torch.zeros(1)), (torch.zeros(2, 2), torch.zeros(1))]
        ModelInputs(Model(), inputs).guess_dynamic_shapes()


def test_scalar_change_names_the_path() -> None:
    with pytest.raises(ObservationMismatch, match=re.escape("kwargs['y'] is 2 in inputs[1]")):
        inputs = [dict(x=torch.zeros(2), y=1), dict(x=torch.zeros(3), y=2)]
        ModelInputs(Model(), inputs).guess_dynamic_shapes()


def test_same_scalar_has_no_dynamic_shape() -> None:
    inputs = [dict(x=torch.zeros(2), y=1), dict(x=torch.zeros(3), y=1)]
    assert ModelInputs(Model(), inputs).guess_dynamic_shapes() == ((), {"x": {0: D}, "y": None})


def test_move_to_kwargs_as_in_seed_003() -> None:
    x, y = torch.randn(5, 6), torch.randn(1, 6)
    inputs = [((x,), dict(y=y)), ((torch.randn(7, 8),), dict(y=torch.randn(1, 8)))]
    mi = ModelInputs(Model(), inputs)
    new_args, new_kwargs, new_ds = mi.move_to_kwargs(*mi.inputs[0], mi.guess_dynamic_shapes())
    assert new_args == ()
    assert list(new_kwargs) == ["x", "y"] and new_kwargs["x"] is x
    assert new_ds == ((), {"x": {0: D, 1: D}, "y": {1: D}})
    ep = torch.export.export(Model(), new_args, kwargs=new_kwargs, dynamic_shapes=new_ds[1])
    assert str(ep.range_constraints) == "{s77: VR[2, int_oo], s27: VR[2, int_oo]}"


def test_move_to_kwargs_does_not_modify_its_arguments() -> None:
    x = torch.zeros(2)
    ds: Any = (({0: D},), {"y": {0: D}})
    kwargs = {"y": x}
    ModelInputs(Model(), [((x,), kwargs)]).move_to_kwargs((x,), kwargs, ds)
    assert (kwargs, ds) == ({"y": x}, (({0: D},), {"y": {0: D}}))


def test_move_to_kwargs_nests_extras_under_var_keyword() -> None:
    class VarKw(torch.nn.Module):
        def forward(self, x: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
            return x

    x = torch.zeros(2)
    mi = ModelInputs(VarKw(), [((x,), {"z": x})])
    _, kwargs, ds = mi.move_to_kwargs((x,), {"z": x}, (({0: D},), {"z": {0: D}}))
    assert (list(kwargs), ds) == (["x", "z"], ((), {"x": {0: D}, "kwargs": {"z": {0: D}}}))


def test_move_to_kwargs_rejects_positional_only() -> None:
    class PosOnly(torch.nn.Module):
        def forward(self, x: torch.Tensor, /) -> torch.Tensor:
            return x

    x = torch.zeros(2)
    with pytest.raises(CaptureError, match=r"args\[0\] cannot be moved.*POSITIONAL_ONLY"):
        ModelInputs(PosOnly(), [(x,)]).move_to_kwargs((x,), {}, (({0: D},), {}))


# -- all_dynamic_shape_from_inputs -----------------------------------------------------------------
def test_all_dynamic_with_a_dynamic_cache_is_flat() -> None:
    inputs = dict(
        input_ids=torch.randint(15, size=(2, 3)),
        attention_mask=torch.randint(1, size=(2, 33)),
        position_ids=torch.arange(3),
        past_key_values=_cache(30),
    )
    assert all_dynamic_shape_from_inputs(inputs) == {
        "input_ids": {0: "d_0_0", 1: "d_0_1"},
        "attention_mask": {0: "d_1_0", 1: "d_1_1"},
        "position_ids": {0: "d_2_0"},
        "past_key_values": [
            {0: "d_3_0", 1: "d_3_1", 2: "d_3_2", 3: "d_3_3"},
            {0: "d_4_0", 1: "d_4_1", 2: "d_4_2", 3: "d_4_3"},
        ],
    }


def test_all_dynamic_numbering_is_keys_then_values() -> None:
    ds = all_dynamic_shape_from_inputs((_cache(3, layers=2),))
    assert [d[0] for d in ds[0]] == ["d_0_0", "d_1_0", "d_2_0", "d_3_0"]


def test_all_dynamic_with_dim_dynamic() -> None:
    ds = all_dynamic_shape_from_inputs({"x": torch.zeros(2, 3), "n": 4}, dim_prefix=D)
    assert ds == {"x": {0: D, 1: D}, "n": None}


def test_all_dynamic_shapes_are_accepted_by_torch_export() -> None:
    class Cat(torch.nn.Module):
        def forward(self, x: torch.Tensor, past_key_values: Any) -> torch.Tensor:
            return torch.cat([past_key_values.layers[0].keys.sum(dim=2), x], dim=-1)

    inputs = dict(x=torch.zeros(2, 1, 3), past_key_values=_cache(5))
    ds = all_dynamic_shape_from_inputs(inputs, dim_prefix=torch.export.Dim.AUTO)
    with register_flattening_functions():
        ep = torch.export.export(Cat(), (), kwargs=inputs, dynamic_shapes=ds)
    assert len(ep.graph_signature.user_inputs) == 3
