"""The ONNX runner's per-call path on real generate() traffic: what a bare onnxruntime session of
the call's file answers, routed by the full guard rule's choice, and refused where it refuses.

A tiny Llama is recorded under greedy generate() with left-padded batches (forward pre-hook
copies of the ORIGINAL calls: generate passes its keywords in another order than ``forward``'s
signature, so every call takes the runner's moved-keyword path), exported with ``onnx=`` (no
merging: four files) and loaded with a session per file.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree

import replay
from fixtures.generate_traffic import record_traffic, tiny_causal
from fixtures.names import cache_argument
from replay.runtime.guards import CallNotServed
from replay.runtime.ort.runner import OnnxRunner, load_onnx
from replay.runtime.runner import _MATCHING, _SLOW

pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.slow  # a generate() recording and an ONNX export

WORKLOAD = [(1, 4, True), (2, 6, True), (3, 5, True)]


@pytest.fixture(scope="module")
def traffic(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Path, list[tuple[tuple[Any, ...], dict[str, Any]]]]]:
    model = tiny_causal("llama")
    root = tmp_path_factory.mktemp("llama")
    originals = record_traffic(model, root / "store", WORKLOAD, max_new_tokens=3)
    target = root / "out" / "model.onnx"
    target.parent.mkdir()
    replay.export(model, root / "store", onnx=target, merge=False)
    yield target, originals


def _decodes(originals: list[Any]) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    found = [c for c in originals if c[1]["input_ids"].shape[-1] == 1]
    assert len(found) >= 6  # 2 decode steps per prompt
    return found


def _fresh(call: tuple[tuple[Any, ...], dict[str, Any]]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    args, kwargs = copy.deepcopy(call)
    return args, kwargs


def _full_rule(runner: OnnxRunner, args: Any, kwargs: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The route of `replay.runtime.guards.route` itself: every entry tried, none skipped."""
    router = runner._router
    return router.route(args, router.spelled(kwargs), router.entries)


def test_every_original_call_answers_as_a_bare_session_of_its_file(traffic: Any) -> None:
    target, originals = traffic
    runner = load_onnx(target, mode="per-file")
    bare: dict[str, Any] = {}
    for call in originals:
        args, kwargs = _fresh(call)
        program, feeds = runner.feeds(*args, **runner._router.spelled(kwargs))
        if program.file.file not in bare:
            path = str(target.parent / program.file.file)
            bare[program.file.file] = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        expected = bare[program.file.file].run(None, {n: t.numpy() for n, t in feeds.items()})
        got = runner(*args, **kwargs)
        leaves, spec = pytree.tree_flatten(got)
        assert len(leaves) == len(expected)
        for leaf, array in zip(leaves, expected, strict=True):
            torch.testing.assert_close(leaf, torch.from_numpy(array), rtol=0, atol=0)
        # the output is what torch's unflatten builds over the same leaves: the model's types
        rebuilt = pytree.tree_unflatten(leaves, spec)
        assert type(got) is type(rebuilt) and list(got) == list(rebuilt)
        cache, again = got[list(got)[-1]], rebuilt[list(rebuilt)[-1]]
        assert type(cache) is type(again) and vars(cache).keys() == vars(again).keys()
        for layer, other in zip(cache.layers, again.layers, strict=True):
            assert type(layer) is type(other) and list(vars(layer)) == list(vars(other))
            assert layer.is_initialized and layer.dtype == other.dtype
        assert cache.get_seq_length() == again.get_seq_length() > 0


def test_generate_s_keyword_order_is_routed_as_the_full_rule_routes_it(traffic: Any) -> None:
    target, originals = traffic
    runner = load_onnx(target, mode="per-file")
    router = runner._router
    moved = 0
    for call in _decodes(originals):
        args, kwargs = _fresh(call)
        kwargs = router.spelled(kwargs)
        entry, tensors = router.route(args, kwargs)
        expected_entry, expected = _full_rule(runner, args, kwargs)
        assert entry is expected_entry
        assert len(tensors) == len(expected)
        assert all(a is b for a, b in zip(tensors, expected, strict=True))
        matching = router._seen[router.layout(args, kwargs)[0]][_MATCHING]
        (pick,) = [pick for e, _, pick in matching if e is entry]
        moved += pick not in (None, _SLOW)
    # not vacuous: generate's keywords come in another order than the signature's
    assert moved == len(_decodes(originals))


def _refused(runner: OnnxRunner, args: Any, kwargs: dict[str, Any]) -> str:
    """The runner's refusal of a call (no session may run), checked against the full rule's."""
    for program in runner.programs.values():
        program.session = None  # running anything would fail with AttributeError
    with pytest.raises(CallNotServed) as refused:
        runner(*args, **kwargs)
    with pytest.raises(CallNotServed) as by_rule:
        _full_rule(runner, args, kwargs)
    assert str(refused.value) == str(by_rule.value)
    assert refused.value.reasons == by_rule.value.reasons
    return str(refused.value)


def test_a_decode_call_whose_inputs_break_a_recorded_equality_is_refused(traffic: Any) -> None:
    target, originals = traffic
    args, kwargs = _fresh(next(c for c in _decodes(originals) if c[1]["input_ids"].shape[0] == 2))
    kwargs["position_ids"] = torch.cat([kwargs["position_ids"]] * 2)[:3]  # batch 3, ids 2
    message = _refused(load_onnx(target, mode="per-file"), args, kwargs)
    assert "they were equal in every recorded call" in message


def test_a_decode_call_past_the_recorded_batch_is_refused(traffic: Any) -> None:
    target, originals = traffic
    args, kwargs = _fresh(next(c for c in _decodes(originals) if c[1]["input_ids"].shape[0] == 3))
    grow = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    for name, value in grow.items():
        kwargs[name] = torch.cat([value, value[:1]])
    cache = kwargs[cache_argument("LlamaForCausalLM")]  # as the installed release spells it
    for layer in cache.layers:
        layer.keys = torch.cat([layer.keys, layer.keys[:1]])
        layer.values = torch.cat([layer.values, layer.values[:1]])
    message = _refused(load_onnx(target, mode="per-file"), args, kwargs)
    assert "axis 0 = 4 is outside" in message


def test_a_call_no_program_covers_is_refused_with_the_rule_s_message(traffic: Any) -> None:
    target, originals = traffic
    args, kwargs = _fresh(_decodes(originals)[0])
    kwargs["output_attentions"] = True  # a structure no group recorded
    message = _refused(load_onnx(target, mode="per-file"), args, kwargs)
    assert message.startswith("no program of ")
