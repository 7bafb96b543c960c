"""replay.additional_inputs: torch's AdditionalInputs from a store, checked by torch itself.

The object is torch's (``torch.export.AdditionalInputs``): its ``verify`` must accept the
programs `replay.export` makes for the group and refuse a program that does not take the
recorded range; exporting with it as ``dynamic_shapes`` gives a program serving every call.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import capture
import replay
from capture.analysis.groups import analyze
from capture.errors import ReplayError
from fixtures.traffic import record_scale
from replay.inputs.specs.additional import representative_signatures

CALLS = [(b, s) for s in (3, 5, 9) for b in (2, 3, 4)] + [(3, 5)] * 4


def test_representative_calls_hold_the_most_called_and_every_range_end(tmp_path: Path) -> None:
    record_scale(tmp_path, CALLS)
    with capture.open_store(tmp_path) as store:
        (group,) = analyze(store, "m")
    chosen = representative_signatures(group, limit=8)
    columns = [j for j, d in enumerate(group.dims) if d.dynamic]
    assert chosen[0] == max(
        (tuple(int(v) for v in row) for row in group.matrix),
        key=lambda r: sum(1 for c in CALLS if (c[0], c[1]) == (r[0], r[1])),
    )
    for j in columns:
        values = [s[j] for s in chosen]
        assert min(values) == group.dims[j].min and max(values) == group.dims[j].max
    assert len(set(chosen)) == len(chosen) <= 8


def test_verify_accepts_capture_programs_and_refuses_a_static_one(tmp_path: Path) -> None:
    model, originals = record_scale(tmp_path, CALLS)
    extra = replay.additional_inputs(tmp_path)
    assert isinstance(extra, torch.export.AdditionalInputs)
    result = replay.export(model, tmp_path, named_dims=True)
    assert result.complete
    extra.verify(result.programs["g0"])  # raises when a call is refused
    g = replay.export_inputs(tmp_path).group("g0")
    static = torch.export.export(g.module(model), g.args, g.kwargs)
    with pytest.raises(Exception, match="Expected input|size"):
        extra.verify(static)


def test_export_with_it_as_dynamic_shapes_serves_every_call(tmp_path: Path) -> None:
    model, originals = record_scale(tmp_path, CALLS)
    extra = replay.additional_inputs(tmp_path, "m", group="g0")
    g = replay.export_inputs(tmp_path, "m").group("g0")
    program = torch.export.export(g.module(model), g.args, g.kwargs, dynamic_shapes=extra)
    extra.verify(program)
    for args in originals:
        torch.testing.assert_close(program.module()(*args), model(*args))


def test_unknown_group_names_the_groups(tmp_path: Path) -> None:
    record_scale(tmp_path, CALLS)
    with pytest.raises(ReplayError, match="no group 'decode'.*g0"):
        replay.additional_inputs(tmp_path, group="decode")


@pytest.mark.slow
def test_verify_accepts_every_program_of_a_llama_under_generate(tmp_path: Path) -> None:
    from fixtures.stores import record_llama

    model, _ = record_llama(tmp_path)
    result = replay.export(model, tmp_path)
    assert result.programs
    for name, program in result.programs.items():
        if "[" in name:  # a regime serves part of its group's range only
            continue
        replay.additional_inputs(tmp_path, group=name).verify(program)
