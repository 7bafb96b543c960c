"""Groups split where torch.export cuts them: one program per regime.

Tiny modules that branch on a size are recorded with the real Recorder, exported with real
torch.export, and the ORIGINAL calls (the tensors passed to the model, kept by the test) are run
through the saved artifact's runner (`replay.load`) and compared with eager: the check that can
disagree with the coverage table. Generate() traffic on sliding-window models is in
tests/test_fidelity_regimes.py (slow).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import capture
import replay
from replay.pipeline.cuts import find_cut, verdicts
from replay.runtime.guards import CallNotServed


class Branchy(torch.nn.Module):
    """Two code paths: rows beyond 3 take another one (a sliding window in small)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[0] > 3 else x + 1


class Parity(torch.nn.Module):
    """A cut at every size: even and odd row counts take different paths."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[0] % 2 == 0 else x + 1


def _record(root: Path, model: torch.nn.Module, rows: list[int]) -> list[torch.Tensor]:
    calls = [torch.arange(n * 3, dtype=torch.float32).reshape(n, 3) for n in rows]
    with capture.Recorder(model, root, name="m"), torch.no_grad():
        for x in calls:
            model(x)
    return calls


def test_a_group_cut_by_a_branch_is_exported_once_per_regime(tmp_path: Path) -> None:
    _record(tmp_path, Branchy(), [2, 3, 5, 6])
    result = replay.export(Branchy(), tmp_path, probes=0)
    assert sorted(result.programs) == ["g0[x_0<=3]", "g0[x_0>=5]"]
    rows = result.coverage.to_pylist()
    assert [(r["group"], r["signature"], r["covered"]) for r in rows] == [
        ("g0[x_0<=3]", "x=2x3", True),
        ("g0[x_0<=3]", "x=3x3", True),
        ("g0[x_0>=5]", "x=5x3", True),
        ("g0[x_0>=5]", "x=6x3", True),
    ]
    assert result.complete


def test_a_regime_note_names_the_cut(tmp_path: Path) -> None:
    _record(tmp_path, Branchy(), [2, 3, 5, 6])
    result = replay.export(Branchy(), tmp_path, probes=0)
    assert (
        "g0[x_0<=3]: a regime of g0: torch.export cuts its recorded x_0 into 2..3 | 5..6 "
        "(the program it traced refuses the other side: x_0 = 5 is outside the program's "
        "range [2, 3]); one program per side"
    ) in result.notes


def test_each_regime_has_its_own_ranges(tmp_path: Path) -> None:
    _record(tmp_path, Branchy(), [2, 3, 5, 6])
    result = replay.export(Branchy(), tmp_path, probes=0)
    ranges = {g.name: [(d.min, d.max) for d in g.dims] for g in result.inputs.groups}
    assert ranges == {"g0[x_0<=3]": [(2, 3), (3, 3)], "g0[x_0>=5]": [(5, 6), (3, 3)]}


def test_the_runner_serves_each_original_call_from_its_regime(tmp_path: Path) -> None:
    calls = _record(tmp_path, Branchy(), [2, 3, 5, 6])
    path = replay.export(Branchy(), tmp_path, probes=0).save(tmp_path / "m.pt2")
    runner = replay.load(path)
    for x in calls:
        assert torch.equal(runner(x.clone()), Branchy()(x.clone()))
    assert [runner.select(x) for x in calls] == ["g0[x_0<=3]"] * 2 + ["g0[x_0>=5]"] * 2


def test_a_size_between_two_regimes_is_not_served(tmp_path: Path) -> None:
    _record(tmp_path, Branchy(), [2, 3, 5, 6])
    runner = replay.load(replay.export(Branchy(), tmp_path, probes=0).save(tmp_path / "m.pt2"))
    # 4 was never recorded: neither regime's recorded range holds it.
    with pytest.raises(CallNotServed, match=r"outside the recorded range \[5, 6\]"):
        runner(torch.ones(4, 3))


def test_a_rejected_export_is_split_where_the_auto_program_cuts(tmp_path: Path) -> None:
    _record(tmp_path, Branchy(), [2, 3, 5, 6])
    # Named dims: Dim('x_0', min=2, max=6) cannot hold the branch, torch.export raises a
    # constraint violation; the Dim.AUTO trace says where the cut lies.
    result = replay.export(Branchy(), tmp_path, probes=0, named_dims=True)
    assert sorted(result.programs) == ["g0[x_0<=3]", "g0[x_0>=5]"]
    assert result.complete and result.not_honoured == {}
    # Each regime keeps named dims, bounded by its own recorded range.
    shapes = [str(g.dynamic_shapes[0][0]) for g in result.inputs.groups]
    assert shapes == ["Dim('x_0', max=3)", "Dim('x_0', min=5, max=6)"]


def test_a_regime_with_one_size_is_exported_static(tmp_path: Path) -> None:
    _record(tmp_path, Branchy(), [2, 3, 5])
    result = replay.export(Branchy(), tmp_path, probes=0)
    assert result.inputs.group("g0[x_0>=5]").dynamic_shapes == (None,)
    assert result.complete


def test_a_cut_needing_more_regimes_than_allowed_is_not_split(tmp_path: Path) -> None:
    _record(tmp_path, Parity(), [2, 3, 4, 5, 6])
    # No static fallback here (tests/test_replay_budget.py serves the rest with it).
    result = replay.export(Parity(), tmp_path, probes=0, max_regimes=4, max_static=0)
    # Five runs (2 | 3 | 4 | 5 | 6) would make five regimes: the group stays whole, its
    # refused signatures not covered, and a note says why.
    assert sorted(result.programs) == ["g0"]
    assert [r["covered"] for r in result.coverage.to_pylist()] == [True, False, True, False, True]
    assert any("not split there: that would make more regimes" in n for n in result.notes)


def test_verdicts_agree_with_running_the_program(tmp_path: Path) -> None:
    _record(tmp_path, Branchy(), [2, 3, 5, 6])
    inputs = replay.export_inputs(tmp_path)
    group = inputs.groups[0]
    program = torch.export.export(
        Branchy(), group.args, kwargs=group.kwargs, dynamic_shapes=group.dynamic_shapes
    )
    signatures = [sizes for sizes, _ in group.recorded()]
    found = verdicts(program, group, signatures)
    assert found is not None
    ran = []
    for sizes in signatures:
        try:
            program.module()(torch.ones(sizes[:2]))
            ran.append(True)
        except Exception:  # the program's own input check refused it
            ran.append(False)
    assert [v.accepted for v in found] == ran == [True, True, False, False]
    cut = find_cut(group, found)
    assert cut is not None and (cut.symbol, cut.runs) == ("x_0", ((2, 3, True), (5, 6, False)))
