"""Probes and bounded named dims: a program called covered must hold inside its range.

Probes are unseen size vectors inside the recorded ranges (`replay.inputs.select.probes`), checked
like the recorded signatures (coverage rows of kind ``probe``). Named dims torch.export rejects are
replaced by bounded hints, so the program still refuses sizes beyond the recorded ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import capture
import replay
from capture.store_api import Store
from fixtures.names import cache_argument
from replay.inputs import select
from replay.inputs.builder import ExportGroup


@pytest.fixture(scope="module")
def llama(llama_root: Path) -> Iterator[tuple[Store, Any]]:
    from fixtures.models import tiny_llama

    with capture.open_store(llama_root) as store:
        yield store, tiny_llama(0)


def _record(tmp_path: Path, model: torch.nn.Module, sizes: list[int]) -> Store:
    with capture.Recorder(model, tmp_path, name="m"), torch.no_grad():
        for n in sizes:
            model(torch.ones(n, 3))
    return capture.open_store(tmp_path)


class Gap(torch.nn.Module):
    """Right on every recorded batch size (2, 3, 8), wrong on 5, which was never recorded."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1 if x.shape[0] == 5 else x * 2


def _values(group: ExportGroup, sizes: tuple[int, ...]) -> dict[str, int]:
    return {d.symbol: sizes[j] for j, d in enumerate(group.dims) if d.symbol is not None}


def test_probes_stay_inside_the_recorded_ranges_and_keep_relations(
    llama: tuple[Store, Any],
) -> None:
    store, _ = llama
    group = replay.export_inputs(store, groups=["decode"]).group("decode")
    assert group.analysis is not None
    probes = select.probes(group.analysis, 10)
    recorded = {sizes for sizes, _ in group.recorded()}
    assert probes and not recorded & set(probes)
    for sizes in probes:
        values = _values(group, sizes)
        for d in group.dims:
            if d.dynamic:
                assert max(d.min, 2) <= values[str(d.symbol)] <= d.max
        assert values["attention_mask_1"] == values[f"{cache_argument()}_2"] + 1
    # The ends of every dynamic dim together come first.
    past = f"{cache_argument()}_2"
    assert _values(group, probes[0]) == {"batch": 3, past: 9, "attention_mask_1": 10}


def test_probes_are_capped(llama: tuple[Store, Any]) -> None:
    store, _ = llama
    group = replay.export_inputs(store, groups=["prefill"]).group("prefill")
    assert group.analysis is not None
    assert len(select.probes(group.analysis, 2)) == 2
    assert select.probes(group.analysis, 0) == []


def test_probe_rows_follow_the_recorded_rows(llama: tuple[Store, Any]) -> None:
    store, model = llama
    result = replay.export(model, store, groups=["decode"], probes=3)
    analysis = result.inputs.group("decode").analysis
    assert analysis is not None
    probes = len(select.probes(analysis, 3))
    rows = result.coverage.to_pylist()
    assert probes >= 2
    assert [r["kind"] for r in rows] == ["recorded"] * 9 + ["probe"] * probes
    assert all(r["calls"] == 0 and r["covered"] for r in rows[9:]), rows[9:]
    assert result.complete


def test_a_probe_the_program_gets_wrong_is_not_covered(tmp_path: Path) -> None:
    with _record(tmp_path, Gap(), [2, 3, 8, 8]) as store:
        result = replay.export(Gap(), store)
    rows = result.coverage.to_pylist()
    assert all(r["covered"] for r in rows if r["kind"] == "recorded")
    probe = next(r for r in rows if r["signature"] == "x=5x3")
    assert probe["kind"] == "probe"
    assert not probe["covered"]  # a probe that fails is reported, with the reason
    assert probe["error"]
    assert not result.complete


def test_probes_zero_checks_recorded_signatures_only(tmp_path: Path) -> None:
    with _record(tmp_path, Gap(), [2, 3, 8]) as store:
        result = replay.export(Gap(), store, probes=0)
    assert result.coverage.column("kind").to_pylist() == ["recorded"] * 3
    assert result.complete


def _beyond(group: ExportGroup, symbol: str, size: int) -> tuple[int, ...]:
    sizes, _ = group.recorded()[0]
    values = _values(group, sizes)
    values[symbol] = size
    if symbol == f"{cache_argument()}_2":
        values["attention_mask_1"] = size + 1
    return tuple(
        values[str(d.symbol)] if d.symbol is not None else sizes[j]
        for j, d in enumerate(group.dims)
    )


@contextlib.contextmanager
def _flattening() -> Iterator[None]:
    with torch.no_grad(), capture.register_flattening_functions():
        yield


# Slow: a whole torch.export (15-25 s); keeps the fast suite under 3 minutes.
@pytest.mark.slow
def test_named_dims_on_llama_decode_stay_bounded(llama: tuple[Store, Any]) -> None:
    # torch 2.13 rejects a named Dim on the cache length of a grouped-query attention model
    # (an unprovable min(...) guard): the program must still refuse sizes never recorded.
    store, model = llama
    result = replay.export(model, store, named_dims=True, groups=["decode"], probes=0)
    assert result.not_honoured == {}
    assert result.complete
    group = result.inputs.group("decode")
    past = f"{cache_argument()}_2"  # the cache length, named after the installed argument
    assert any(f"bounded Dim.DYNAMIC hints for {past} in [4, 9]" in n for n in group.notes)
    with capture.register_flattening_functions():
        runnable = result.programs["decode"].module()
    for symbol, size in (("batch", 4), (past, 10)):
        args, kwargs = group.program_call(_beyond(group, symbol, size))
        with _flattening(), pytest.raises(Exception, match="Guard failed"):
            runnable(*args, **kwargs)  # no silent unbounded program
    args, kwargs = group.program_call(_beyond(group, past, 9))
    with _flattening():
        runnable(*args, **kwargs)
