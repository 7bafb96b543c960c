"""A call the runner refuses names what differs by key path, and the group that came closest.

The artifact serves the tiny Llama's decode and prefill groups; the calls are the ORIGINAL ones
generate() makes, copied by a forward pre-hook.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

import replay
from fixtures.models import run_generate, tiny_llama
from replay.runtime.guards import CallNotServed

pytestmark = pytest.mark.slow  # an export of two groups and generate() runs: about a minute


@pytest.fixture(scope="module")
def served(llama_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    model = tiny_llama()
    path = tmp_path_factory.mktemp("refused") / "llama.pt2"
    replay.export(model, llama_root, groups=["decode", "prefill"], probes=0).save(path)
    return model, replay.load(path)


def _a_decode_call(model: Any) -> dict[str, Any]:
    """The kwargs of a batch-2 decode call generate() makes (a cache and a mask)."""
    seen: list[dict[str, Any]] = []

    def keep(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        if not seen and kwargs["input_ids"].shape == (2, 1):
            seen.append(copy.deepcopy(kwargs))

    handle = model.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        run_generate(model, [(2, 7)], max_new_tokens=3)
    finally:
        handle.remove()
    return seen[0]


def test_the_original_decode_call_is_served(served: Any) -> None:
    model, runner = served
    assert runner.select(**_a_decode_call(model)) == "decode"


def test_a_decode_call_without_its_mask_names_the_mask_and_decode(served: Any) -> None:
    # the missing argument is named, not "different call structure" for every group
    model, runner = served
    call = _a_decode_call(model)
    del call["attention_mask"]
    with pytest.raises(CallNotServed) as caught:
        runner(**call)
    assert caught.value.reasons["decode"] == (
        "different call structure: the call does not pass kwargs['attention_mask'] (the "
        "program takes a int64 tensor of rank 2)"
    )
    # prefill: the mask, and the cache's tensors where prefill's (empty) cache held None
    prefill = caught.value.reasons["prefill"]
    assert prefill.startswith(
        "different call structure: the call does not pass kwargs['attention_mask'] (the "
        "program takes a int64 tensor of rank 2); kwargs['"
    ), prefill
    assert prefill.endswith("are a float32 tensor of rank 4, the program takes None"), prefill
    assert str(caught.value).endswith("; closest: group decode")
