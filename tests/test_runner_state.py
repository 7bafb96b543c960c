"""A served call leaves the serving process as it found it: torch's grad mode, autocast state,
global random generator, default dtype and thread count, the artifact's weights and the
caller's tensors (the rules of `replay.runtime.pt2.limits.effects` and the operator table).

The model exported here uses what real models do inside ``forward``: dropout (eval mode), a
``no_grad`` block and an autocast-disabled block (torch.export writes the scoped wrappers for
both when it exports with grad enabled), and an in-place write of a buffer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import capture
import replay


class _Stateful(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.5)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.drop(self.proj(x))
        with torch.no_grad():
            scale = y.abs().mean()
        with torch.autocast("cpu", enabled=False):
            y = y * 2
        self.calls.add_(1)
        return y + scale


def _state() -> dict[str, Any]:
    return {
        "grad": torch.is_grad_enabled(),
        "autocast cpu": (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")),
        "autocast cuda": (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")),
        "rng": torch.get_rng_state(),
        "default dtype": torch.get_default_dtype(),
        "threads": torch.get_num_threads(),
        "inference mode": torch.is_inference_mode_enabled(),
    }


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, _Stateful]:
    root = tmp_path_factory.mktemp("runner_state")
    torch.manual_seed(0)
    model = _Stateful().eval()
    with capture.Recorder(model, root / "store", name="stateful"):  # grad enabled: wrappers
        for batch in (2, 3, 5):
            model(torch.randn(batch, 4))
    replay.export(model, root / "store", probes=0).save(root / "stateful.pt2")
    return root / "stateful.pt2", model


@pytest.mark.parametrize("grad", [True, False])
def test_a_call_leaves_torch_state_weights_and_inputs_as_it_found_them(
    artifact: tuple[Path, _Stateful], grad: bool
) -> None:
    runner = replay.load(artifact[0])
    weights = {n: t.detach().clone() for n, t in runner.programs["g0"].state_dict.items()}
    x = torch.randn(3, 4)
    given = x.clone()
    with torch.set_grad_enabled(grad):
        before = _state()
        out = runner(x)
        after = _state()
    _same(before, after)
    assert torch.equal(x, given)  # the caller's tensor
    for name, value in runner.programs["g0"].state_dict.items():
        if name != "calls":  # the one buffer the program declares it writes
            assert torch.equal(value, weights[name]), name
    assert out.shape == (3, 4)


def test_the_exported_program_uses_what_the_state_rules_allow(
    artifact: tuple[Path, _Stateful],
) -> None:
    # the scoped wrappers and eval-mode dropout are served, not refused
    targets = {str(n.target) for n in replay.load(artifact[0]).programs["g0"].graph.nodes}
    assert {"wrap_with_autocast", "wrap_with_set_grad_enabled"} <= targets, targets
    assert {"aten.dropout.default", "aten.add_.Tensor"} <= targets, targets


def _leaves(value: Any) -> list[torch.Tensor]:
    import torch.utils._pytree as pytree

    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


@pytest.mark.slow
def test_a_tiny_llama_runner_changes_no_state_over_its_original_calls(tmp_path: Path) -> None:
    import copy

    from fixtures.models import run_generate
    from fixtures.stores import record_llama

    model, _ = record_llama(tmp_path / "store", workload=((1, 5), (2, 4)), max_new_tokens=3)
    replay.export(model, tmp_path / "store").save(tmp_path / "llama.pt2")
    runner = replay.load(tmp_path / "llama.pt2")
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def hook(module: Any, args: Any, kwargs: Any) -> None:
        calls.append((copy.deepcopy(args), copy.deepcopy(kwargs)))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)  # the ORIGINAL calls
    run_generate(model, ((1, 5), (2, 4)), max_new_tokens=3)
    handle.remove()
    weights = {
        (p, n): t.detach().clone()
        for p, program in runner.programs.items()
        for n, t in program.state_dict.items()
    }
    assert len(calls) == 6
    for args, kwargs in calls:
        given = [t.clone() for t in _leaves((args, kwargs))]
        with torch.no_grad():
            before = _state()
            runner(*args, **kwargs)
            after = _state()
        _same(before, after)
        assert all(torch.equal(a, b) for a, b in zip(_leaves((args, kwargs)), given, strict=True))
    for (p, n), value in weights.items():
        assert torch.equal(runner.programs[p].state_dict[n], value), (p, n)
