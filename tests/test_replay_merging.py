"""Fewer programs where it is proven safe: a group lacking an optional input
served by another group's program, the input filled.

Tiny modules with an optional integer mask are recorded with the real Recorder (calls with a
padded mask at batch 2-3, calls without it at batch 1, as generate() makes them), exported with
real torch.export, and the ORIGINAL calls are run through the saved artifact's runner and
compared with eager. A model whose default for the missing input is not a recorded constant
must keep its own program, with the reason said.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

import capture
import replay
from replay.runtime.fills import Fill
from replay.runtime.guards import ArtifactError
from replay.runtime.pt2.loading import read_manifest


class Masked(torch.nn.Module):
    """Without a mask, every position counts: the mask's default is all ones."""

    def __init__(self, default: int = 1) -> None:
        super().__init__()
        self.default = default

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is None:
            mask = torch.full(x.shape[:2], self.default, dtype=torch.int64)
        return (x * mask.unsqueeze(-1)).sum(dim=1)


class Scaled(torch.nn.Module):
    """An optional float input: nothing recorded says what to fill it with."""

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        return x * (scale if scale is not None else torch.ones_like(x))


Call = tuple[torch.Tensor, dict[str, Any]]


def _masked_calls() -> list[Call]:
    calls: list[Call] = []
    for batch, seq in [(2, 3), (3, 5), (2, 6), (3, 4)]:
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[1:, 0] = 0  # left padding, as generate() pads a batch
        calls.append((torch.randn(batch, seq, 4), {"mask": mask}))
    calls += [(torch.randn(1, seq, 4), {}) for seq in (2, 3, 5, 7)]
    return calls


def _record(root: Path, model: torch.nn.Module, calls: list[Call], **options: Any) -> None:
    with capture.Recorder(model, root, name="m", **options), torch.no_grad():
        for x, kwargs in calls:
            model(x, **kwargs)


@pytest.fixture
def masked(tmp_path: Path) -> tuple[Path, list[Call]]:
    torch.manual_seed(0)
    calls = _masked_calls()
    _record(tmp_path, Masked(), calls)
    return tmp_path, calls


def test_a_group_without_the_mask_is_served_by_the_masked_program(
    masked: tuple[Path, list[Call]],
) -> None:
    root, _ = masked
    result = replay.export(Masked(), root)
    assert sorted(result.programs) == ["g0"]
    assert {g.name: g.program_name for g in result.inputs.groups} == {"g0": "g0", "g1": "g0"}
    assert result.complete


def test_the_fill_follows_the_recorded_relations(masked: tuple[Path, list[Call]]) -> None:
    root, _ = masked
    result = replay.export(Masked(), root)
    (fill,) = result.inputs.group("g1").example.fills
    assert (fill.argument, fill.dtype, fill.value) == ("mask", "int64", 1)
    # (batch, seq) of the call's own x: sizes 0 and 1 of its size vector.
    assert [(a.terms, a.offset) for a in fill.shape] == [((0,), 0), ((1,), 0)]
    assert any(
        n.startswith("g1: served by the program of g0 with mask = ones of shape (batch, x_1): ")
        for n in result.notes
    )


def test_the_merged_groups_rows_are_the_proof(masked: tuple[Path, list[Call]]) -> None:
    root, _ = masked
    result = replay.export(Masked(), root)
    rows = [r for r in result.coverage.to_pylist() if r["group"] == "g1"]
    assert [r["signature"] for r in rows if r["kind"] == "recorded"] == [
        "x=1x2x4",
        "x=1x3x4",
        "x=1x5x4",
        "x=1x7x4",
    ]
    assert all(r["covered"] for r in rows)


def test_the_runner_fills_the_mask_for_original_calls(
    masked: tuple[Path, list[Call]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    root, calls = masked
    path = replay.export(Masked(), root).save(tmp_path_factory.mktemp("art") / "m.pt2")
    runner = replay.load(path)
    for x, kwargs in calls:
        expected = Masked()(x.clone(), **kwargs)
        assert torch.allclose(runner(x.clone(), **kwargs), expected, atol=1e-5)
    assert [runner.select(x, **kwargs) for x, kwargs in calls] == ["g0"] * 4 + ["g1"] * 4
    entries = {e.group: e for e in read_manifest(path).programs}
    assert entries["g1"].program == "g0"
    assert [f.argument for f in entries["g1"].fills] == ["mask"]


def test_a_default_that_is_no_recorded_constant_keeps_its_own_program(tmp_path: Path) -> None:
    torch.manual_seed(0)
    _record(tmp_path, Masked(default=2), _masked_calls())
    result = replay.export(Masked(default=2), tmp_path)
    # Neither ones nor zeros (the recorded range of mask) give what the model does without it.
    assert sorted(result.programs) == ["g0", "g1"]
    why = [n for n in result.notes if n.startswith("g1: not served by the program of g0")]
    assert len(why) == 1 and "differs by" in why[0]


def test_a_float_input_is_not_filled(tmp_path: Path) -> None:
    model = Scaled()
    calls: list[Call] = [(torch.randn(2, 3), {"scale": torch.rand(2, 3)}) for _ in range(2)]
    calls += [(torch.randn(1, 3), {})]
    _record(tmp_path, model, calls)
    result = replay.export(model, tmp_path, probes=0)
    assert sorted(result.programs) == ["g0", "g1"]
    assert (
        "g1: not served by the program of g0 with scale filled: scale is a float32 tensor: no "
        "recorded value range to fill from"
    ) in result.notes


def test_merge_false_keeps_one_program_per_group(masked: tuple[Path, list[Call]]) -> None:
    root, _ = masked
    assert sorted(replay.export(Masked(), root, merge=False).programs) == ["g0", "g1"]


def test_payloads_are_part_of_the_proof(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    torch.manual_seed(0)
    _record(tmp_path, Masked(), _masked_calls(), payloads=1.0)
    result = replay.export(Masked(), tmp_path, probes=0)
    assert any(
        "proven on its 4 recorded signatures, 0 probes and 4 sampled real calls" in n
        for n in result.notes
    )
    payload = [r for r in result.coverage.to_pylist() if r["kind"] == "payload"]
    assert [(r["group"], r["covered"]) for r in payload] == [("g0", True)] * 4 + [("g1", True)] * 4


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"argument": "mask", "dtype": "float32", "value": 1, "shape": []},
            "dtype is not a valid name ('float32')",
        ),
        ({"argument": "__import__('os')", "dtype": "int64", "value": 1, "shape": []}, "valid"),
        ({"argument": "mask", "dtype": "int64", "value": 1.5, "shape": []}, "must be an integer"),
        (
            {"argument": "mask", "dtype": "int64", "value": 1, "shape": [{"terms": [9]}]},
            "indices below 2",
        ),
        ({"argument": "mask"}, "dtype is missing"),
    ],
)
def test_a_malformed_fill_in_a_manifest_is_one_clear_error(
    entry: dict[str, Any], message: str
) -> None:
    with pytest.raises(ArtifactError, match=re.escape(message)):
        Fill.from_dict(entry, width=2)
