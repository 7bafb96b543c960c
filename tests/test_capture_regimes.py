"""A regime of a call group: own ranges, the group's symbols and relations.

Groups are analysed from real stores (the Recorder writes them); regimes are made of some of
their signature rows, as `replay.pipeline.splitting` makes them after torch.export cut a group.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import capture
from capture.analysis.groups import Group, analyze
from capture.analysis.regimes import regime
from capture.analysis.symbols import Axis, find_symbols
from capture.errors import ReplayError


class Attend(torch.nn.Module):
    def forward(self, q: torch.Tensor, past: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return q.sum() + past.sum() + mask.sum()


def _group(root: Path, calls: list[tuple[int, int, int]]) -> Group:
    """One group of (batch, seq, past) calls whose mask is (batch, past + seq)."""
    model = Attend()
    with capture.Recorder(model, root, name="m"), torch.no_grad():
        for batch, seq, past in calls:
            model(torch.ones(batch, seq), torch.ones(batch, past), torch.ones(batch, past + seq))
    with capture.open_store(root) as store:
        (group,) = analyze(store, "m")
    return group


# Decode steps (seq 1) and two prefills: mask = past + seq is supported by the whole group.
CALLS = [(2, 1, p) for p in (3, 4, 5, 6, 7)] + [(2, s, p) for s, p in ((4, 2), (5, 3))]


def test_the_group_finds_the_relation(tmp_path: Path) -> None:
    group = _group(tmp_path, CALLS)
    assert [str(r) for r in group.relations] == ["mask_1 = q_1 + past_1"]


def test_a_regime_keeps_a_relation_its_own_rows_cannot_support(tmp_path: Path) -> None:
    group = _group(tmp_path, CALLS)
    rows = [i for i, r in enumerate(group.matrix.tolist()) if r[1] >= 4]  # the prefills
    prefill = regime(group, rows, "g0[q_1>=4]")
    assert [str(r) for r in prefill.relations] == ["mask_1 = q_1 + past_1"]
    assert (prefill.calls, prefill.signatures) == (2, 2)
    # Two signatures are too few for the analysis to find it again on its own.
    axes = [Axis(d.argument, d.axis, d.path) for d in group.dims]
    assert find_symbols(group.matrix[rows], axes).relations == []


def test_a_symbol_constant_in_the_regime_joins_the_offset(tmp_path: Path) -> None:
    group = _group(tmp_path, CALLS)
    rows = [i for i, r in enumerate(group.matrix.tolist()) if r[1] == 1]  # the decode steps
    decode = regime(group, rows, "g0[q_1<=1]")
    assert [str(r) for r in decode.relations] == ["mask_1 = past_1 + 1"]
    by_path = {(d.path, d.axis): (d.dynamic, d.symbol, d.min, d.max) for d in decode.dims}
    assert by_path[("args[0]", 1)] == (False, None, 1, 1)
    assert by_path[("args[2]", 1)] == (True, "mask_1", 4, 8)


def test_a_forced_batch_dim_stays_dynamic(tmp_path: Path) -> None:
    model = Attend()
    with capture.Recorder(model, tmp_path, name="m"), torch.no_grad():
        for seq in (2, 3, 4):
            model(torch.ones(1, seq), torch.ones(1, 2), torch.ones(1, seq + 2))
    with capture.open_store(tmp_path) as store:
        (group,) = analyze(store, "m", set_batch_dimension_for=True)
    part = regime(group, [0, 1], "g0[q_1<=3]")
    assert [d.dynamic for d in part.dims if d.axis == 0] == [True, True, True]


def test_a_regime_needs_rows(tmp_path: Path) -> None:
    group = _group(tmp_path, CALLS)
    with pytest.raises(ReplayError, match="no signature rows"):
        regime(group, [], "g0[x]")


def test_a_regime_of_every_row_is_the_group(tmp_path: Path) -> None:
    group = _group(tmp_path, CALLS)
    every = regime(group, range(group.signatures), "same")
    assert every.dims == group.dims and every.relations == group.relations
    assert np.array_equal(every.matrix, group.matrix)
