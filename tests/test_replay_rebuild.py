"""replay.inputs.rebuild: example tensors from recorded metadata, (args, kwargs) from the
treespec."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import capture
from capture.analysis.groups import Group, analyze
from capture.errors import ReplayError
from capture.seeds.strings import string_type
from capture.store_api import Store
from fixtures.names import cache_argument
from replay.inputs.rebuild import make_tensor, rebuild
from replay.inputs.select import value_ranges


def _group(store: Store, model: str, name: str) -> Group:
    return next(g for g in analyze(store, model) if g.name == name)


def _rebuild(
    store: Store, group: Group, sizes: list[int]
) -> tuple[tuple[object, ...], dict[str, object]]:
    ranges = value_ranges(store, group).get(tuple(sizes))
    return rebuild(group.structure, sizes, ranges)


def test_integers_stay_within_the_recorded_range() -> None:
    t = make_tensor(torch.int64, (64,), low=3, high=5, generator=torch.Generator().manual_seed(0))
    assert (int(t.min()), int(t.max())) == (3, 5)


def test_a_mask_within_zero_and_one_is_all_ones() -> None:
    t = make_tensor(torch.int64, (2, 3), low=0, high=1, mask=True)
    assert t.tolist() == [[1, 1, 1], [1, 1, 1]]


def test_a_mask_without_a_range_is_all_ones() -> None:
    assert make_tensor(torch.float32, (2,), mask=True).dtype == torch.float32
    assert make_tensor(torch.int32, (2,), mask=True).tolist() == [1, 1]


def test_an_integer_tensor_without_a_range_is_zeros() -> None:
    assert make_tensor(torch.int64, (3,)).tolist() == [0, 0, 0]


def test_bool_tensors_are_true() -> None:
    assert make_tensor(torch.bool, (2,)).tolist() == [True, True]


def test_floats_come_from_the_seeded_generator() -> None:
    a = make_tensor(torch.float16, (4,), generator=torch.Generator().manual_seed(1))
    b = make_tensor(torch.float16, (4,), generator=torch.Generator().manual_seed(1))
    assert a.dtype == torch.float16
    assert torch.equal(a, b)


def test_positional_call_is_rebuilt(seeds: Store) -> None:
    args, kwargs = _rebuild(seeds, _group(seeds, "add_broadcast", "g0"), [3, 7, 1, 7])
    assert string_type((args, kwargs), with_shape=True) == "((T1s3x7,T1s1x7),{})"


def test_dynamic_cache_is_rebuilt(seeds: Store) -> None:
    sizes = [1, 1, 1, 11] + [1, 4, 11, 32] * 4
    args, kwargs = _rebuild(seeds, _group(seeds, "llm", "decode"), sizes)
    assert string_type(kwargs, with_shape=True) == (
        "dict(input_ids:T7s1x1,attention_mask:T7s1x11,past_key_values:DynamicCache("
        "key_cache=#2[T1s1x4x11x32,T1s1x4x11x32], value_cache=#2[T1s1x4x11x32,T1s1x4x11x32]))"
    )


def test_prefill_cache_keeps_its_empty_layers(llama: Store) -> None:
    group = _group(llama, "LlamaForCausalLM", "prefill")
    _, kwargs = _rebuild(llama, group, [2, 7, 2, 7, 2, 7])
    cache = kwargs[cache_argument()]
    assert [layer.is_initialized for layer in cache.layers] == [False, False]  # type: ignore[attr-defined]
    assert (kwargs["use_cache"], kwargs["logits_to_keep"], kwargs["return_dict"]) == (True, 1, True)


def test_token_ids_use_the_recorded_range_of_that_signature(llama: Store) -> None:
    group = _group(llama, "LlamaForCausalLM", "decode_no_attention_mask")
    sizes = [1, 1] + [1, 1] + [1, 2, 5, 16] * 4  # input_ids, position_ids, the cache
    lows, highs = value_ranges(llama, group)[tuple(sizes)]
    _, kwargs = _rebuild(llama, group, sizes)
    ids, positions = kwargs["input_ids"], kwargs["position_ids"]
    assert lows[0] <= int(ids.min()) <= int(ids.max()) <= highs[0]  # type: ignore[attr-defined]
    assert positions.tolist() == [[5]]  # type: ignore[attr-defined]


def test_rebuilding_twice_gives_identical_tensors(seeds: Store) -> None:
    group = _group(seeds, "masked", "g0")
    first = _rebuild(seeds, group, [3, 10, 3, 10])[1]
    second = _rebuild(seeds, group, [3, 10, 3, 10])[1]
    assert all(torch.equal(first[k], second[k]) for k in ("x", "mask"))  # type: ignore[arg-type]


def test_missing_arguments_are_left_out(seeds: Store) -> None:
    _, kwargs = _rebuild(seeds, _group(seeds, "masked", "g1"), [2, 10])
    assert list(kwargs) == ["x"]


def test_an_opaque_leaf_cannot_be_rebuilt(tmp_path: Path) -> None:
    class Thing:
        pass

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor, thing: object) -> torch.Tensor:
            return x

    model = Model()
    with capture.Recorder(model, tmp_path, name="opaque"):
        model(torch.ones(2), Thing())
    with capture.open_store(tmp_path) as store:
        group = analyze(store, "opaque")[0]
    with pytest.raises(ReplayError, match=r"args\[1\] is an object of type .*Thing"):
        rebuild(group.structure, [2])


def test_sizes_must_fit_the_structure(seeds: Store) -> None:
    group = _group(seeds, "add", "g0")
    with pytest.raises(ReplayError, match="the size vector has 2 sizes, the structure needs 4"):
        rebuild(group.structure, [2, 6])
