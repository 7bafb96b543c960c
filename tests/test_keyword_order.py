"""Keyword order is not part of a call's structure: the same calls, any order, one set of groups.

A model's ``generate()`` traffic is recorded, then the same calls are made again directly with
their keywords in reverse order (a forward pre-hook keeps the ORIGINAL calls of both orders): the
store holds the groups of one order, and the exported artifact serves every original call.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

import capture
import replay
from capture.record.flatten import in_keyword_order
from capture.signature import Signature

Call = tuple[tuple[Any, ...], dict[str, Any]]


class Scale(torch.nn.Module):
    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, **extra: torch.Tensor
    ) -> torch.Tensor:
        out = x * 2
        if mask is not None:
            out = out + mask
        for value in extra.values():
            out = out + value.sum()
        return out


def test_in_keyword_order_moves_each_keyword_with_its_tensors() -> None:
    sig = Signature.of(Scale().forward)
    a, b, c, d = (torch.zeros(i + 1) for i in range(4))
    call = ((a,), {"zeta": [b, c], "mask": d})
    moved = in_keyword_order(call, sig)
    assert moved is not None
    (args, kwargs), order = moved
    assert list(kwargs) == ["mask", "zeta"] and args == (a,)
    assert order == (0, 3, 1, 2)  # a, then mask's d, then zeta's b, c
    assert in_keyword_order(((a,), {"mask": d, "zeta": [b, c]}), sig) is None


def test_keywords_in_any_order_record_one_structure(tmp_path: Path) -> None:
    model = Scale()
    x, mask, bias = torch.randn(2, 3), torch.ones(2, 3), torch.ones(4)
    with capture.Recorder(model, tmp_path, flush_seconds=3600):
        model(x=x, mask=mask, bias=bias)
        model(bias=bias, mask=mask, x=x)
        model(mask=torch.ones(3, 5), x=torch.randn(3, 5), bias=torch.ones(2))
    with capture.open_store(tmp_path) as store:
        rows = store.query("SELECT in_structure, dims FROM calls ORDER BY ts").to_pylist()
        paths = store.query(
            "SELECT path FROM structures WHERE kind = 'tensor' AND structure_id = $s ORDER BY leaf",
            {"s": rows[0]["in_structure"]},
        ).column("path")
    assert len({r["in_structure"] for r in rows}) == 1
    assert [r["dims"] for r in rows] == [[2, 3, 2, 3, 4], [2, 3, 2, 3, 4], [3, 5, 3, 5, 2]]
    assert paths.to_pylist() == ["kwargs['x']", "kwargs['mask']", "kwargs['bias']"]


def _reversed_calls(model: Any, root: Path, originals: list[Call]) -> list[Call]:
    """Makes each call again with its keywords reversed, recorded into `root`; the calls as the
    model received them (pre-hook copies)."""
    received: list[Call] = []

    def keep(_module: Any, args: Any, kwargs: Any) -> None:
        received.append(copy.deepcopy((tuple(args), dict(kwargs))))

    handle = model.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with capture.Recorder(model, root, flush_seconds=3600), torch.no_grad():
            for args, kwargs in originals:
                args, kwargs = copy.deepcopy((args, kwargs))
                model(*args, **dict(reversed(list(kwargs.items()))))
    finally:
        handle.remove()
    return received


@pytest.mark.slow
def test_generate_calls_in_two_keyword_orders_group_and_serve_as_one(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from fixtures.generate_traffic import record_traffic, serve_originals, tiny_causal

    model = tiny_causal("llama")
    workload = [(2, 5, True), (3, 8, True), (1, 6, True), (2, 7, True)]
    once = tmp_path / "once"
    originals = record_traffic(model, once, workload, max_new_tokens=3)
    both = tmp_path / "both"
    record_traffic(model, both, workload, max_new_tokens=3)
    reversed_calls = _reversed_calls(model, both, originals)
    assert [list(k) for _, k in reversed_calls] == [list(k)[::-1] for _, k in originals]

    def groups(root: Path) -> list[tuple[str, int, int]]:
        from capture.analysis.groups import analyze

        with capture.open_store(root) as store:
            found = analyze(store)
        return [(g.name, g.calls, g.signatures) for g in found]

    single = groups(once)
    assert [(name, 2 * calls, sigs) for name, calls, sigs in single] == groups(both)
    result = replay.export(model, both)
    assert result.complete, [r for r in result.coverage.to_pylist() if not r["covered"]]
    # the groups of one order, exported (merged groups share a program)
    assert sorted(g.name for g in result.inputs.groups) == sorted(n for n, _, _ in single)
    assert len(result.programs) <= len(single)
    result.save(tmp_path / "m.pt2")
    runner = replay.load(tmp_path / "m.pt2")
    verdicts = serve_originals(model, runner, originals + reversed_calls)
    assert [v.reason for v in verdicts if not v.correct] == []
    assert len(verdicts) == 2 * len(originals)
