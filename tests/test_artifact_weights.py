"""Each weight once: one record per storage on disk, one in memory.

torch 2.13's ``package_pt2`` wrote every program's weights again (4.00x the model's weights for
the demo's four programs); `save` writes each storage once, matched by identity and, for the
copies torch.export makes of constants, by content; `replay.load` memory-maps the archive once
and every program's tensors are views of it. The archive stays loadable by torch's own reader.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

import capture
import replay
from replay.runtime.pt2.loading import read_artifact


class Shared(torch.nn.Module):
    """Two call groups (with and without a mask) over one weight; a constant made in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = self.proj(x) + torch.tensor([1.0, 2.0, 3.0, 4.0])  # lifted: copied per program
        y = y + torch.arange(x.shape[1], device=x.device)  # a device baked into the graph
        return y if mask is None else y * mask


class Counter(torch.nn.Module):
    """Two buffers of equal bytes; forward mutates one of them."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(4))
        self.register_buffer("zeros", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return x + self.zeros


def _save(model: torch.nn.Module, root: Path, calls: list[dict[str, Any]], name: str) -> Path:
    with capture.Recorder(model, root / "store", name=name), torch.no_grad():
        for kwargs in calls:
            model(**kwargs)
    path = root / f"{name}.pt2"
    replay.export(model, root / "store", probes=0).save(path)
    return path


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Shared, Path]:
    torch.manual_seed(0)
    model = Shared()
    calls: list[dict[str, Any]] = [{"x": torch.randn(b, 4)} for b in (2, 3)]
    calls += [{"x": torch.randn(b, 4), "mask": torch.rand(b, 4)} for b in (2, 3)]
    return model, _save(model, tmp_path_factory.mktemp("shared"), calls, "shared")


def _configs(path: Path) -> dict[str, dict[str, str]]:
    """Program -> tensor name -> the record its config names."""
    out: dict[str, dict[str, str]] = {}
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            if name.endswith("_config.json"):
                program = name.rpartition("/")[2].rsplit("_", 2)[0]
                config = json.loads(z.read(name))["config"]
                out.setdefault(program, {}).update({k: v["path_name"] for k, v in config.items()})
    return out


def test_every_program_names_the_same_record_for_a_shared_weight(
    shared: tuple[Shared, Path],
) -> None:
    model, path = shared
    configs = _configs(path)
    assert sorted(configs) == ["g0", "g1"]
    assert configs["g0"] == configs["g1"]  # the weight, the bias and the lifted constant
    model_bytes = sum(t.untyped_storage().nbytes() for t in model.parameters())
    # weights once, plus the 16-byte constant torch.export lifted out of forward
    assert read_artifact(path).weight_bytes == model_bytes + 16


def test_a_mutated_buffer_is_never_merged_with_equal_bytes(tmp_path: Path) -> None:
    path = _save(Counter(), tmp_path, [{"x": torch.randn(b, 4)} for b in (2, 3)], "counter")
    records = set(_configs(path)["g0"].values())
    assert len(records) == 2  # `calls` and `zeros` hold equal bytes; `calls` is written to


def _mapped_ranges(path: Path) -> list[tuple[int, int]]:
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            if line.rstrip().endswith(str(path)):
                start, end = line.split()[0].split("-")
                ranges.append((int(start, 16), int(end, 16)))
    return ranges


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")
def test_load_maps_the_archive_once_and_every_program_uses_that_memory(
    shared: tuple[Shared, Path],
) -> None:
    model, path = shared
    runner = replay.load(path)
    ranges = _mapped_ranges(path)
    assert ranges  # the archive is memory-mapped
    pointers = {
        name: {k: v.data_ptr() for k, v in ep.state_dict.items()}
        for name, ep in runner.programs.items()
    }
    assert pointers["g0"] == pointers["g1"]  # one storage per weight for both programs
    for ptr in pointers["g0"].values():
        assert any(start <= ptr < end for start, end in ranges)  # in the file's pages: no copy
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(runner(x=x), model(x))


# torch 2.11's load_pt2 builds tensors on the archive's read-only bytes and warns so
# (torch/export/pt2_archive/_package.py): torch's reader, which this test calls, not ours.
@pytest.mark.filterwarnings("ignore:The given buffer is not writable:UserWarning")
def test_torchs_own_reader_loads_the_archive(shared: tuple[Shared, Path]) -> None:
    # What differs from package_pt2's archives: records shared across programs; none pickled.
    from torch.export.pt2_archive._package import load_pt2

    model, path = shared
    programs = load_pt2(str(path)).exported_programs
    assert sorted(programs) == ["g0", "g1"]
    x, mask = torch.randn(3, 4), torch.rand(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(programs["g0"].module()(x=x), model(x))
        torch.testing.assert_close(programs["g1"].module()(x=x, mask=mask), model(x, mask=mask))


def test_the_device_reaches_every_weight_and_the_graph(shared: tuple[Shared, Path]) -> None:
    # No GPU here: the meta device takes the same path as "cuda" (each record copied once,
    # every program's graph moved, the arange's baked-in device included).
    _, path = shared
    runner = replay.load(path, device="meta")
    for program in runner.programs.values():
        assert {t.device.type for t in program.state_dict.values()} == {"meta"}
        assert {t.device.type for t in program.constants.values()} == {"meta"}
    out = runner(x=torch.empty(3, 4, device="meta"), mask=torch.empty(3, 4, device="meta"))
    assert (out.device.type, tuple(out.shape)) == ("meta", (3, 4))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_load_on_cuda_copies_each_weight_once(shared: tuple[Shared, Path]) -> None:
    model, path = shared
    runner = replay.load(path, device="cuda")
    pointers = [
        {k: v.data_ptr() for k, v in ep.state_dict.items()} for ep in runner.programs.values()
    ]
    assert pointers[0] == pointers[1]
    assert all(t.is_cuda for ep in runner.programs.values() for t in ep.state_dict.values())
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(runner(x=x.cuda()).cpu(), model(x))
