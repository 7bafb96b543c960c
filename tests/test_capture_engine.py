"""One engine for dynamic dims and representative rows: seed API and store agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import capture
from capture import InputObserver
from capture.analysis.groups import analyze
from capture.analysis.representative import choose_row
from capture.analysis.symbols import ABSENT, Axis, find_symbols


class Pair(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sum() + y.sum()


def test_absent_entries_count_for_no_statistic() -> None:
    axes = [Axis("x", 0), Axis("mask", 0)]
    found = find_symbols([[2, ABSENT], [3, 4], [5, 4]], axes)
    # a tensor missing from a call (the seed API's alignment) does not make its dims vary
    assert (found.dynamic, found.minimum, found.maximum, found.distinct) == (
        [True, False],
        [2, 4],
        [5, 4],
        [3, 1],
    )


def test_a_column_with_absent_entries_enters_no_relation() -> None:
    rows = [[p, p + 1] for p in range(4, 10)]
    axes = [Axis("past", 2), Axis("mask", 1)]
    assert [str(r) for r in find_symbols(rows, axes).relations] == ["mask_1 = past_2 + 1"]
    rows[0][1] = ABSENT
    # an absent entry is no size, so it can neither support nor refute a relation
    assert find_symbols(rows, axes).relations == []


def test_choose_row_with_the_seed_options_takes_the_first_eligible_row() -> None:
    matrix = [[1, 0], [3, 1], [2, 1], [4, 5]]
    row, found = choose_row(
        matrix, [1, 1, 1, 1], [True, True], [False, True, True, True], None, "first"
    )
    # sizes below 2 allowed, ties to the earliest row, not to the smallest vector
    assert (row, found) == (1, True)


def test_choose_row_without_an_eligible_row_returns_the_most_called_row() -> None:
    row, found = choose_row([[1, 7], [1, 8], [1, 9]], [2, 5, 5], [True, True])
    # no row has every dynamic dim >= 2; the caller synthesizes from this row
    assert (row, found) == (1, False)


def _observed_dynamic(observer: InputObserver, batch: Any) -> dict[str, list[int]]:
    shapes = observer.infer_dynamic_shapes(set_batch_dimension_for=batch)
    return {f"args[{i}]": sorted(ds) for i, ds in enumerate(shapes)}


def _stored_dynamic(path: Path, batch: Any) -> dict[str, list[int]]:
    (group,) = analyze(capture.open_store(path), "Pair", set_batch_dimension_for=batch)
    out: dict[str, list[int]] = {}
    for d in group.dims:
        out.setdefault(d.path, [])
        if d.dynamic:
            out[d.path].append(d.axis)
    return out


@pytest.mark.parametrize("batch", [None, {0}, True])
def test_observer_and_store_analysis_agree_on_dynamic_dims(batch: Any, tmp_path: Path) -> None:
    model, observer = Pair(), InputObserver()
    with observer(model):
        for n, m in ((1, 3), (1, 5), (1, 4)):
            model(torch.zeros(n, m, 2), torch.zeros(n, 6))
    observer.to_store(tmp_path, name="Pair")
    # the seed API and the store analysis answer "which dims are dynamic" alike
    assert _observed_dynamic(observer, batch) == _stored_dynamic(tmp_path, batch)
