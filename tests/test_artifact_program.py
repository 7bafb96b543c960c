"""A loaded program is built from its graph JSON (no torch deserializer) and runs as torch's own.

`replay.load` builds each program's fx graph straight from the checked JSON
(`replay.runtime.pt2.program`); these tests hold it to what torch's deserialized
``ExportedProgram.module()`` does on the same archive: the same outputs, bit for bit, buffer
mutations written back, and the program's own input checks (`replay.runtime.pt2.shape_checks`)
refusing what torch's module refuses.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch

import capture
import replay
from capture import compat_archive
from replay.runtime.guards import ArtifactError, CallNotServed
from replay.runtime.pt2.loading import read_artifact
from replay.runtime.pt2.weights import load_tensors


class Mixed(torch.nn.Module):
    """A multi-output op (split), a buffer written in forward, a size-dependent arange."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor, scale: float = 2.0) -> dict[str, torch.Tensor]:
        self.calls.add_(1)
        a, b = self.proj(x).split(4, dim=-1)
        steps = torch.arange(x.shape[1], dtype=x.dtype)
        return {"a": a * scale + steps[:, None], "b": torch.nn.functional.silu(b)}


def _export(tmp_path: Path, model: torch.nn.Module, calls: list[dict[str, Any]]) -> Path:
    with capture.Recorder(model, tmp_path / "store"), torch.no_grad():
        for kwargs in calls:
            model(**kwargs)
    path = tmp_path / "mixed.pt2"
    replay.export(model, tmp_path / "store", probes=0).save(path)
    return path


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Mixed, Path]:
    torch.manual_seed(0)
    model = Mixed().eval()
    calls = [{"x": torch.randn(b, s, 8)} for b, s in ((2, 3), (3, 5), (4, 4))]
    return model, _export(tmp_path_factory.mktemp("mixed"), model, calls)


def test_the_built_program_equals_torchs_deserialized_module_bit_for_bit(
    mixed: tuple[Mixed, Path],
) -> None:
    model, path = mixed
    runner = replay.load(path)
    art = read_artifact(path)
    tensors = load_tensors(art.archive, art.slots)
    name = runner.groups[0]
    theirs = compat_archive.deserialize_program(art.graphs[name], *tensors[name]).module()
    ours = runner.programs[name]
    for b, s in ((2, 3), (3, 5), (4, 4)):
        x = torch.randn(b, s, 8)
        with torch.no_grad():
            got, want = ours(x=x), theirs(x=x)
        assert sorted(got) == ["a", "b"]
        for key in ("a", "b"):
            assert torch.equal(got[key], want[key])
        with torch.no_grad():
            torch.testing.assert_close(runner(x=x)["a"], model(x=x)["a"])


def test_a_buffer_the_program_mutates_is_written_back(mixed: tuple[Mixed, Path]) -> None:
    _, path = mixed
    runner = replay.load(path)
    program = runner.programs[runner.groups[0]]
    calls = program.state_dict["calls"]
    before = float(calls)
    with torch.no_grad():
        runner(x=torch.randn(2, 3, 8))
        runner(x=torch.randn(3, 4, 8))
    assert float(program.state_dict["calls"]) == before + 2


def test_the_programs_own_checks_refuse_what_torchs_module_refuses(
    mixed: tuple[Mixed, Path],
) -> None:
    _, path = mixed
    runner = replay.load(path)
    program = runner.programs[runner.groups[0]]
    with pytest.raises(ValueError, match="the program takes 8 only"):
        program(x=torch.randn(2, 3, 7))  # a static size: the runner's guards stop it too
    with pytest.raises(ValueError, match="takes the keyword arguments"):
        program(x=torch.randn(2, 3, 8), y=torch.randn(1))
    with pytest.raises(ValueError, match="the call's structure is not the one program"):
        program(torch.randn(2, 3, 8), x=torch.randn(2, 3, 8))
    with pytest.raises(CallNotServed, match="the program takes 8 only"):
        runner(x=torch.randn(2, 3, 7))


def test_a_graph_naming_an_operator_torch_lacks_is_refused_in_one_line(
    mixed: tuple[Mixed, Path],
) -> None:
    from replay.runtime.pt2.program import build_program

    _, path = mixed
    art = read_artifact(path)
    name = next(iter(art.trees))
    tree = art.trees[name]
    node = tree["graph_module"]["graph"]["nodes"][0]
    node["target"] = "torch.ops.aten.no_such_operator.default"
    tensors = load_tensors(art.archive, art.slots)[name]
    with pytest.raises(ArtifactError, match="no_such_operator.default does not exist in this"):
        build_program(name, tree, tensors[0], tensors[1], None, "g0.json")


class Clamped(torch.nn.Module):
    """Float arguments JSON cannot hold: torch's serializer writes them as "Infinity" strings."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(min=float("-inf"), max=float("inf")) + x.clamp(max=0.5)


def test_non_finite_float_arguments_are_read_as_floats(tmp_path: Path) -> None:
    model = Clamped()
    originals = [torch.randn(b, 3) * 10 for b in (2, 3, 5)]
    path = _export(tmp_path, model, [{"x": x} for x in originals])
    runner = replay.load(path)
    for x in originals:
        with torch.no_grad():
            assert torch.equal(runner(x=x.clone()), model(x))


@pytest.mark.parametrize("enabled", [True, False])
def test_loading_leaves_the_garbage_collector_as_it_found_it(
    mixed: tuple[Mixed, Path], tmp_path: Path, enabled: bool
) -> None:
    # off while an artifact is read and its programs built; then as it was
    _, path = mixed
    damaged = tmp_path / "damaged.pt2"
    damaged.write_bytes(path.read_bytes()[:-100])
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        runner = replay.load(path)
        assert gc.isenabled() is enabled
        assert all(len(p.graph.nodes) > 3 for p in runner.programs.values())
        with pytest.raises(ArtifactError):
            replay.load(damaged)
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
