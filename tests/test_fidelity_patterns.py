"""Rebuilt integer inputs take the paths production took.

Built from the tiny-Llama fixture store (left-padded generate() traffic, batches 1-3): the
rebuilt calls of its signatures, as the coverage check gets them.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import replay
from capture.store_api import Store
from fixtures.names import cache_argument

pytest.importorskip("transformers")


def _calls(store: Store, prefix: str) -> list[dict[str, Any]]:
    """The rebuilt kwargs of every recorded signature with a mask, in groups named `prefix`*."""
    inputs = replay.export_inputs(store)
    calls = []
    for group in inputs.groups:
        if group.name.startswith(prefix):
            for sizes, _ in group.recorded():
                args, kwargs = group.recorded_call(sizes)
                if isinstance(kwargs.get("attention_mask"), torch.Tensor):
                    calls.append({"args": args, **kwargs})
    assert calls
    return calls


def _padded_batches(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in calls if c["attention_mask"].shape[0] > 1]


def test_recorded_padding_gives_a_left_padded_row(llama: Store) -> None:
    calls = _padded_batches(_calls(llama, "decode"))
    # masks are not all ones, so the padding path production took runs.
    assert calls and all(c["attention_mask"][0, 0] == 0 for c in calls)


def test_left_padding_never_masks_the_newest_token(llama: Store) -> None:
    calls = _calls(llama, "decode")
    assert all(bool((c["attention_mask"][:, -1] == 1).all()) for c in calls)


def test_prefill_without_cache_gets_a_right_padded_row(llama: Store) -> None:
    calls = _padded_batches(_calls(llama, "prefill"))
    assert calls and all(c["attention_mask"][1, -1] == 0 for c in calls)


def test_no_rebuilt_row_is_all_padding(llama: Store) -> None:
    calls = _calls(llama, "decode") + _calls(llama, "prefill")
    assert all(bool((c["attention_mask"].sum(-1) > 0).all()) for c in calls)


def test_decode_positions_agree_with_the_mask(llama: Store) -> None:
    for call in _calls(llama, "decode"):
        mask = call["attention_mask"]
        expected = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)[:, -1:]
        # generate()'s own rule: the new token's position counts the unpadded tokens before it.
        assert torch.equal(call["position_ids"], expected)


def test_mask_length_is_cache_length_plus_new_tokens(llama: Store) -> None:
    for call in _calls(llama, "decode"):
        keys = call[cache_argument()].layers[0].keys
        assert call["attention_mask"].shape[-1] == keys.shape[-2] + call["input_ids"].shape[-1]
