"""replay.inputs.select: representative sizes (every dynamic dim >= 2, relations kept) and value
ranges.

Groups come from the real analysis (capture.analysis.groups.analyze) of stores recorded with the
real Recorder: the seed scenarios, tiny-Llama generate() traffic, and small purpose-built models.
"""

from __future__ import annotations

from pathlib import Path

import torch

import capture
from capture.analysis.groups import Group, analyze
from capture.store_api import Store
from replay.inputs.select import representative, signatures, value_ranges


def _group(store: Store, model: str, name: str, **options: object) -> Group:
    return next(g for g in analyze(store, model, **options) if g.name == name)  # type: ignore[arg-type]


class Pair(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sum() + y.sum()


def test_recorded_signature_with_every_dynamic_dim_at_least_two_is_chosen(seeds: Store) -> None:
    rep = representative(_group(seeds, "add", "g0"))
    # Three calls, one each: the tie goes to the smallest size vector.
    assert (rep.sizes, rep.synthesized) == ([2, 6, 2, 6], False)
    assert rep.symbols == {"batch": 2, "x_1": 6}


def test_the_most_called_signature_wins(llama: Store) -> None:
    group = _group(llama, "LlamaForCausalLM", "decode")
    rep = representative(group)
    calls = {sizes: n for sizes, n in signatures(group)}
    assert not rep.synthesized
    assert calls[tuple(rep.sizes)] == max(calls.values())


def test_forced_batch_dim_of_one_is_synthesized_to_two(seeds: Store) -> None:
    group = _group(seeds, "llm", "decode", set_batch_dimension_for=True)
    rep = representative(group)
    assert rep.synthesized
    # Base: the smallest signature (input_ids 1x1); batch 1 -> 2, input_ids_1 1 -> 10 (the
    # smallest recorded size >= 2); the cache length keeps its shared symbol with the mask.
    assert rep.symbols == {"batch": 2, "input_ids_1": 10, "attention_mask_1": 11}
    assert rep.sizes == [2, 10, 2, 11] + [2, 4, 11, 32] * 4
    assert rep.raised == ["batch: 1 -> 2", "input_ids_1: 1 -> 10"]


def test_static_dims_keep_their_recorded_size(seeds: Store) -> None:
    rep = representative(_group(seeds, "multimodal", "prefill", set_batch_dimension_for=True))
    # pixel_values 3x224x224 and the sequence of 20 never varied: only the batch moves.
    assert rep.sizes == [2, 20, 2, 3, 224, 224, 2, 20]


def test_synthesis_recomputes_a_relation_from_its_raised_root(tmp_path: Path) -> None:
    model = Pair()
    with capture.Recorder(model, tmp_path, name="pair"):
        for n in (1, 2, 3, 4):
            model(torch.ones(1, n), torch.ones(1, n + 1))
    with capture.open_store(tmp_path) as store:
        group = analyze(store, "pair", set_batch_dimension_for=True)[0]
        assert [str(r) for r in group.relations] == ["y_1 = x_1 + 1"]
        rep = representative(group)
    assert rep.synthesized
    assert rep.sizes == [2, 2, 2, 3]
    assert rep.symbols == {"batch": 2, "x_1": 2, "y_1": 3}


def test_signatures_lists_distinct_size_vectors_with_calls(tmp_path: Path) -> None:
    model = Pair()
    with capture.Recorder(model, tmp_path, name="pair"):
        for n in (3, 3, 5):
            model(torch.ones(n), torch.ones(n))
    with capture.open_store(tmp_path) as store:
        assert signatures(analyze(store, "pair")[0]) == [((3, 3), 2), ((5, 5), 1)]


def test_value_ranges_merge_over_segments(tmp_path: Path) -> None:
    class Ids(torch.nn.Module):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return ids * 2

    model = Ids()
    for low, high in ((5, 9), (2, 7)):
        with capture.Recorder(model, tmp_path, name="ids"):
            model(torch.tensor([[low, high]]))
    with capture.open_store(tmp_path) as store:
        group = analyze(store, "ids")[0]
        assert value_ranges(store, group) == {(1, 2): ([2], [9])}


def test_no_ranges_when_not_recorded(tmp_path: Path) -> None:
    model = Pair()
    with capture.Recorder(model, tmp_path, name="pair", value_ranges="none"):
        model(torch.ones(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64))
    with capture.open_store(tmp_path) as store:
        assert value_ranges(store, analyze(store, "pair")[0]) == {}
