"""replay.compile_hints: recorded traffic through torch.compile compiles once per call group.

Real torch.compile (backend ``aot_eager``), graphs counted with torch's own counter
(``torch._dynamo.utils.counters["stats"]["unique_graphs"]``). With the hints applied, the
recorded traffic and new traffic inside the recorded ranges compile one graph per call group;
without them torch recompiles as sizes change (the count is reported in docs/benchmarks.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
from click.testing import CliRunner
from torch._dynamo.utils import counters

import capture
import replay
from capture.cli.main import cli
from capture.errors import ReplayError
from replay.inputs.specs.compilehints import CompileHints


class Scale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, 4))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        out = x * self.w
        return out if mask is None else out + mask.sum(-1, keepdim=True).unsqueeze(-1)


RECORDED = [(b, s) for s in (3, 5, 9) for b in (1, 2, 4)]


def _calls(sizes: list[tuple[int, int]], mask: bool = True) -> Iterator[tuple[Any, ...]]:
    for batch, seq in sizes:
        x = torch.randn(batch, seq, 4)
        yield (x, torch.ones(batch, seq)) if mask else (x,)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    model = Scale()
    with capture.Recorder(model, tmp_path, name="m"), torch.no_grad():
        for args in _calls(RECORDED):
            model(*args)
        for args in _calls([(2, 4), (2, 7)], mask=False):
            model(*args)
    return tmp_path


def _graphs(model: Scale, traffic: list[tuple[Any, ...]], hints: CompileHints | None) -> int:
    """Graphs torch.compile makes for the traffic (fresh tensors: marks stay on a tensor)."""
    traffic = [tuple(t.clone() for t in args) for args in traffic]
    torch._dynamo.reset()
    counters.clear()
    handle = hints.apply(model) if hints is not None else None
    model.forward = torch.compile(model.forward, backend="aot_eager")  # type: ignore[method-assign]
    try:
        with torch.no_grad():
            for args in traffic:
                torch.testing.assert_close(model(*args), Scale.forward(model, *args))
    finally:
        del model.forward
        if handle is not None:
            handle.remove()
    return int(counters["stats"]["unique_graphs"])


def test_hints_mark_each_group_and_compile_once_per_group(store: Path) -> None:
    hints = replay.compile_hints(store)
    assert [g.group for g in hints.groups] == ["g0", "g1"]
    marks = {(m.path, m.axis): (m.min, m.max) for m in hints.groups[0].marks}
    assert marks[("args[0]", 0)] == (1, 4) and marks[("args[1]", 1)] == (3, 9)
    model = Scale()
    recorded = list(_calls(RECORDED)) + list(_calls([(2, 4), (2, 7)], mask=False))
    inside = list(_calls([(3, 4), (1, 8), (4, 6)])) + list(_calls([(2, 5)], mask=False))
    with_hints = _graphs(model, recorded + inside, hints)
    without = _graphs(model, recorded + inside, None)
    assert with_hints == 2  # one graph per call group, none for the new sizes inside the ranges
    assert without > with_hints


def test_a_size_outside_the_range_is_still_served(store: Path) -> None:
    hints = replay.compile_hints(store)
    model = Scale()
    assert _graphs(model, list(_calls([(2, 3), (6, 12)])), hints) >= 1


def test_cli_prints_hints_torch_applies(store: Path) -> None:
    result = CliRunner().invoke(cli, ["--store", str(store), "hints"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["format"] == "capture-compile-hints" and doc["model"] == "m"
    hints = CompileHints.from_json(result.stdout)
    assert hints.to_json() == replay.compile_hints(store).to_json()
    assert _graphs(Scale(), list(_calls(RECORDED)), hints) == 1


def test_a_call_passing_its_keywords_in_another_order_is_marked_as_its_group(
    tmp_path: Path,
) -> None:
    # generate() of transformers 5.24 passes `cache` before `position_ids` and
    # `attention_mask`; the recorder describes a call in its signature's keyword order, so do
    # the hints, and each mark lands on the tensor it was recorded for.
    model = Scale()
    with capture.Recorder(model, tmp_path, name="m"), torch.no_grad():
        for batch, seq in RECORDED:
            model(x=torch.randn(batch, seq, 4), mask=torch.ones(batch, seq))
    hints = replay.compile_hints(tmp_path)
    x, mask = torch.randn(3, 4, 4), torch.ones(3, 4)
    index, tensors = hints.group_of((), {"mask": mask, "x": x})
    assert index == 0 and tensors[0] is x and tensors[1] is mask
    assert hints.mark((), {"mask": mask, "x": x}) == "g0"
    # the batch (recorded at 1) is marked unbacked, the sequence dynamic within [3, 9]
    assert x._dynamo_dynamic_indices == {1} and mask._dynamo_dynamic_indices == {1}
    assert x._dynamo_unbacked_indices == {0} and mask._dynamo_unbacked_indices == {0}


def test_not_a_hints_document_names_the_fix() -> None:
    with pytest.raises(ReplayError, match="capture hints"):
        CompileHints.from_json(json.dumps({"format": "other"}))


LLAMA_RECORDED = [(2, 5), (3, 8), (1, 6), (4, 9)]
LLAMA_INSIDE = [(3, 6), (2, 7), (4, 5)]
"""New (batch, prompt length) pairs inside the recorded ranges of their groups (generate()
calls batch 1 without a mask: its groups hold prompt length 6 only)."""


@pytest.mark.slow
def test_llama_generate_compiles_once_per_group_with_hints(tmp_path: Path) -> None:
    from fixtures.compile_traffic import compiled_generate
    from fixtures.models import run_generate, tiny_llama

    model = tiny_llama(0)
    with capture.Recorder(model, tmp_path, name="llama"):
        run_generate(model, LLAMA_RECORDED, max_new_tokens=3)
    hints = replay.compile_hints(tmp_path)
    groups = len(hints.groups)
    with_hints = compiled_generate(model, [LLAMA_RECORDED, LLAMA_INSIDE], hints)
    without = compiled_generate(model, [LLAMA_RECORDED, LLAMA_INSIDE])
    assert with_hints.graphs[1] == with_hints.graphs[0]  # nothing new inside the ranges
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 13):
        # torch 2.11/2.12 compile this traffic into 7 graphs with the hints and without them
        # (their unbacked marks take no range): the hints cost no graph there, and save none.
        assert with_hints.graphs[-1] <= without.graphs[-1]
        return
    assert with_hints.graphs[0] <= groups
    assert without.graphs[-1] > with_hints.graphs[-1]
