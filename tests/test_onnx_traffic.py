"""The ONNX runner never answers a real call wrong ("Must hold").

Tiny Llama, GPT-2 and Mistral (sliding window 6) are recorded under greedy generate() with
left-padded batches, exported with ``onnx=PATH``, and every ORIGINAL call (a forward pre-hook's
deep copy) is run through ``replay.load(PATH)`` and through eager
(`fixtures.generate_traffic.check_runner`): each is served within atol 1e-4 + rtol 1e-4 *
max|eager|, or refused with ``CallNotServed``; the ONNX coverage rows say the same per signature.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree

import capture
import replay
from fixtures.generate_traffic import CallVerdict, check_runner, record_traffic, tiny_causal
from fixtures.models import tiny_gpt2
from replay.runtime.guards import CallNotServed
from replay.runtime.ort.runner import load_onnx

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

# (batch, prompt length, with attention mask): batches of 2-3 are left-padded; 11 > the window.
WORKLOAD = [(1, 4, True), (2, 6, True), (3, 5, True), (1, 11, True)]
ARCHS = ["llama", "gpt2", "mistral-window-6"]


def _model(arch: str) -> tuple[Any, dict[str, Any]]:
    """The model and its export options."""
    if arch == "llama":
        # 256 wide: weights (~5 MB) large enough that the graphs do not dominate the set's size;
        # no merging: four groups, four files sharing one weights file
        return tiny_causal("llama", hidden_size=256, intermediate_size=512), {"merge": False}
    if arch == "gpt2":
        return tiny_gpt2(), {}  # merged groups: two files serve four groups, inputs filled
    return tiny_causal("mistral", sliding_window=6), {}  # regimes: one file per regime


@pytest.fixture(scope="module", params=ARCHS)
def traffic(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Any, Any, Path, list[CallVerdict], list[Any]]]:
    arch = request.param
    model, options = _model(arch)
    root = tmp_path_factory.mktemp(arch)
    originals = record_traffic(model, root / "store", WORKLOAD, max_new_tokens=6)
    target = root / "out" / "model.onnx"
    target.parent.mkdir()
    result = replay.export(model, root / "store", onnx=target, probes=2, **options)
    runner = replay.load(target)
    with capture.open_store(root / "store") as store:
        found = check_runner(model, runner, result, store, originals)
    long_prompts = [c for c in originals if tuple(c[1]["input_ids"].shape) == (1, 11)]
    yield arch, model, result, target, found, long_prompts, originals


@pytest.mark.slow
def test_no_original_call_gets_a_wrong_answer(traffic: Any) -> None:
    arch, _, _, _, found, _, _ = traffic
    wrong = [v for v in found if v.served and not v.correct]
    # none wrong, left-padded prefills on Llama and GPT-2 included
    assert wrong == [], arch


@pytest.mark.slow
def test_onnx_rows_agree_with_the_runner_per_signature(traffic: Any) -> None:
    arch, _, _, _, found, _, _ = traffic
    # a signature is reported covered exactly when its calls are answered right
    assert [v for v in found if bool(v.covered) != v.correct] == [], arch


@pytest.mark.slow
def test_the_runner_serves_the_traffic(traffic: Any) -> None:
    arch, _, _, _, found, _, _ = traffic
    served = sum(v.correct for v in found)
    # Not vacuous: every call is served (Mistral's prefill through the regimes torch.export's
    # cuts made; GPT-2's mask-less groups through the masked groups' files, the mask filled).
    assert (len(found), served) == (24, 24), arch


@pytest.mark.slow
def test_a_prompt_past_the_recorded_range_is_refused_not_run(traffic: Any) -> None:
    _, _, _, target, _, long_prompts, _ = traffic
    ((args, kwargs),) = long_prompts  # the 1x11 prompt generate() sent, made 2 tokens longer
    kwargs = dict(kwargs)
    kwargs["input_ids"] = torch.cat([kwargs["input_ids"], kwargs["input_ids"][:, :2]], dim=1)
    if "position_ids" in kwargs:
        kwargs["position_ids"] = torch.arange(13)[None]
    runner = replay.load(target)
    for program in runner.programs.values():
        program.session = None  # running anything would fail with AttributeError
    # the ONNX file of a bounded group refuses where torch refuses, never answers wrongly
    with pytest.raises(CallNotServed, match=r"axis 1 = 13( is outside|, the program takes)"):
        runner(*args, **kwargs)


@pytest.mark.slow
def test_a_four_group_causal_lm_writes_its_weights_once(traffic: Any) -> None:
    arch, model, result, target, _, _, _ = traffic
    if arch != "llama":
        pytest.skip("measured on the 256-wide Llama")
    assert len(result.onnx) == 4 and len(result.inputs.groups) == 4
    weights = {p.untyped_storage().data_ptr(): p.nbytes for p in model.state_dict().values()}
    files = [*result.onnx.values(), f"{target}.data"]
    on_disk = sum(os.path.getsize(f) for f in files)
    assert on_disk <= 1.10 * sum(weights.values()), (on_disk, sum(weights.values()))


@pytest.mark.slow
def test_the_set_s_one_session_answers_as_each_file_s_own_session(traffic: Any) -> None:
    arch, _, _, target, _, _, originals = traffic
    one = load_onnx(target, mode="combined")  # every file a branch of one model, one session
    own = replay.load(target, share_weights=False)  # a session per file
    assert len({id(p.session) for p in one.programs.values()}) == 1
    assert len({id(p.session) for p in own.programs.values()}) == len(own.programs) > 1
    served = 0
    for args, kwargs in originals:
        try:
            expected = own(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        except CallNotServed as e:
            with pytest.raises(CallNotServed, match=re.escape(str(e).splitlines()[0])):
                one(*copy.deepcopy(args), **copy.deepcopy(kwargs))
            continue
        got = one(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        (got_leaves, got_spec), (leaves, spec) = map(pytree.tree_flatten, (got, expected))
        assert got_spec == spec, arch  # the same output types (a cache), the same structure
        for a, b in zip(got_leaves, leaves, strict=True):
            # the same kernels on the same prepacked weights: the same bits
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=arch)
        served += 1
    assert served == len(originals), arch


@pytest.mark.slow
def test_each_mode_says_which_it_is_and_serves_every_original_call_as_eager(traffic: Any) -> None:
    arch, model, result, target, found, _, originals = traffic
    chosen = replay.load(target)  # weights under 128 MiB: a session per file
    forced = load_onnx(target, mode="combined")  # the set's files as branches of one session
    assert (chosen.mode, forced.mode) == ("per-file", "combined"), arch
    assert "mode=per-file" in repr(chosen) and "mode=combined" in repr(forced), arch
    # the chosen mode's verdicts are the fixture's (`found`); the forced mode's, the same way
    with capture.open_store(target.parent.parent / "store") as store:
        verdicts = {
            "chosen": found,
            "forced": check_runner(model, forced, result, store, originals),
        }
    for mode, checked in verdicts.items():
        assert [v.correct for v in checked] == [True] * len(originals) == [True] * 24, (arch, mode)
