"""An ExportGroup is the analysed call group, its example and its options, all frozen: the export
makes new groups (regimes, retries, notes) and never changes the ones it is given.

A tiny module that branches on a size is recorded with the real Recorder and exported with real
torch.export through the pipeline's chain (`replay.pipeline.chain.export_group`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import capture
import replay
from replay.inputs.options import ExportOptions, ShapeRetry
from replay.pipeline.chain import Job, export_group


class Branchy(torch.nn.Module):
    """Two code paths: rows beyond 3 take another one, so torch.export cuts the range at 3."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[0] > 3 else x + 1


def _record(root: Path, rows: list[int]) -> None:
    model = Branchy()
    with capture.Recorder(model, root, name="m"), torch.no_grad():
        for n in rows:
            model(torch.arange(n * 3, dtype=torch.float32).reshape(n, 3))


def test_a_group_reads_through_to_its_analysis_and_example(tmp_path: Path) -> None:
    _record(tmp_path, [2, 3, 5, 6])
    inputs = replay.export_inputs(tmp_path)
    group = inputs.groups[0]
    assert (group.name, group.model_name, group.calls, group.signatures) == ("g0", "m", 4, 4)
    # No copies of the analysis or the example: the properties are theirs.
    assert group.dims is group.analysis.dims
    assert group.relations is group.analysis.relations
    assert group.structure is group.analysis.structure
    assert group.args is group.example.args and group.kwargs is group.example.kwargs
    assert group.dynamic_shapes is group.example.dynamic_shapes
    assert [tuple(a.shape) for a in group.args] == [tuple(group.example.representative.sizes)]
    assert inputs.args is group.args


def test_every_part_of_a_group_is_frozen(tmp_path: Path) -> None:
    _record(tmp_path, [2, 3, 5, 6])
    inputs = replay.export_inputs(tmp_path)
    group = inputs.groups[0]
    for value, field in [
        (group, "notes"),
        (group.example, "args"),
        (group.analysis, "name"),
        (group.options, "seed"),
        (inputs, "groups"),
    ]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, None)


def test_noted_and_reshaped_make_new_groups(tmp_path: Path) -> None:
    _record(tmp_path, [2, 3, 5, 6])
    group = replay.export_inputs(tmp_path, named_dims=True).groups[0]
    notes, shapes = group.notes, str(group.dynamic_shapes)
    noted = group.noted("checked twice")
    assert noted.notes == (*notes, "checked twice")
    assert noted.example is group.example and noted.analysis is group.analysis
    reshaped = group.reshaped(ShapeRetry(unbounded=True))
    assert str(reshaped.dynamic_shapes) == "({0: DimHint(DYNAMIC)},)"
    assert reshaped.retry == ShapeRetry(unbounded=True) and reshaped.args is group.args
    assert (group.notes, str(group.dynamic_shapes)) == (notes, shapes)
    assert shapes == "({0: Dim('x_0', max=6)},)"  # the recorded range: 2..6 rows


def test_the_chain_returns_new_groups_and_leaves_the_given_one_as_it_was(tmp_path: Path) -> None:
    _record(tmp_path, [2, 3, 5, 6])
    options = ExportOptions.of(probes=0)
    inputs = replay.export_inputs(tmp_path)
    group = inputs.groups[0]
    notes, shapes = group.notes, str(group.dynamic_shapes)
    parts = export_group(Job(Branchy(), tmp_path, inputs, options), group, served=())
    assert [p.group.name for p in parts] == ["g0[x_0<=3]", "g0[x_0>=5]"]
    assert all(p.program is not None and all(r.covered for r in p.rows) for p in parts)
    for part in parts:
        assert part.group.notes[0].startswith("a regime of g0: torch.export cuts its recorded x_0")
        assert part.group.analysis is not group.analysis
    assert (group.notes, str(group.dynamic_shapes)) == (notes, shapes)
    assert len(inputs.groups) == 1 and inputs.groups[0] is group
