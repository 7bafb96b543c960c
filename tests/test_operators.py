"""The operators a program may call and the bounds on its size expressions, on real exports.

Programs exported by torch.export (serialized as an artifact holds them) pass the graph check;
the same programs with one node retargeted or one expression changed do not, in one line, and
a power bomb is refused before sympy sees it.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import torch

from capture import compat_archive
from replay.runtime.guards import ArtifactError
from replay.runtime.pt2.expressions import check_guard, check_sympy
from replay.runtime.pt2.graph_check import check_program
from replay.runtime.pt2.op_table import (
    ALLOWED_OPS,
    INPLACE_OPS,
    METADATA_OPS,
    RANDOM_OFF,
    VIEW_OPS,
)
from replay.runtime.pt2.operators import op_kind


class _Cached(torch.nn.Module):
    """Writes its cache buffer in place (as a static cache does) and masks a tensor it made."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(8, 4))
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(x.shape[0], 4)
        mask.masked_fill_(x > 0, 1.0)
        self.cache.index_copy_(0, position, x[:1])
        y = torch.nn.functional.scaled_dot_product_attention(
            x[None, None], x[None, None], x[None, None]
        )[0, 0]
        return self.proj(x).reshape(-1, 4) + mask + y + self.cache.sum()


@pytest.fixture(scope="module")
def program() -> dict[str, Any]:
    batch = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(
        _Cached(),
        (torch.randn(3, 4), torch.tensor([1])),
        dynamic_shapes=({0: batch}, None),
    )
    return json.loads(compat_archive.serialize_program(ep))


def _check(tree: dict[str, Any], allowed: frozenset[str] = frozenset()) -> None:
    check_program(json.dumps(tree).encode(), "m.json", lambda _t: True, allowed)


def _targets(tree: dict[str, Any]) -> list[str]:
    return [n["target"] for n in tree["graph_module"]["graph"]["nodes"]]


def test_a_real_program_with_in_place_writes_of_its_own_tensors_passes(
    program: dict[str, Any],
) -> None:
    kinds = {t: op_kind(t) for t in _targets(program)}
    assert None not in kinds.values(), kinds
    assert "inplace" in kinds.values()  # masked_fill_ of its own tensor, index_copy_ of a buffer
    _check(program)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("torch.ops.aten.from_file.default", "not an operator an artifact may call"),
        ("torch.ops.aten._print.default", "not an operator an artifact may call"),
        ("torch.ops.mylib.fused.default", "not an operator an artifact may call"),
        ("torch.ops.aten.set_.source_Storage", "not an operator an artifact may call"),
    ],
)
def test_an_operator_outside_the_list_is_refused(
    program: dict[str, Any], target: str, message: str
) -> None:
    tree = json.loads(json.dumps(program))
    tree["graph_module"]["graph"]["nodes"][-1]["target"] = target
    with pytest.raises(ArtifactError, match=message) as caught:
        _check(tree)
    assert len(str(caught.value).splitlines()) == 1


def test_a_namespace_is_allowed_only_when_named(program: dict[str, Any]) -> None:
    tree = json.loads(json.dumps(program))
    tree["graph_module"]["graph"]["nodes"][-1]["target"] = "torch.ops.mylib.fused.default"
    _check(tree, frozenset({"mylib"}))
    _check(tree, frozenset({"mylib.fused"}))
    with pytest.raises(ArtifactError):
        _check(tree, frozenset({"mylib.other"}))


def test_an_in_place_write_of_a_parameter_is_refused(program: dict[str, Any]) -> None:
    tree = json.loads(json.dumps(program))
    nodes = tree["graph_module"]["graph"]["nodes"]
    node = next(n for n in nodes if n["target"].endswith("index_copy_.default"))
    node["inputs"][0]["arg"]["as_tensor"]["name"] = "p_proj_weight"
    with pytest.raises(ArtifactError, match="writes p_proj_weight, a parameter"):
        _check(tree)


def test_the_table_holds_the_math_and_not_the_files() -> None:
    for name in ("linear.default", "scaled_dot_product_attention.default", "sym_size.int"):
        assert name in ALLOWED_OPS
    assert {"index_copy_.default", "copy_.default", "masked_fill_.Scalar"} <= INPLACE_OPS
    assert {"view.default", "slice.Tensor", "transpose.int"} <= VIEW_OPS
    every = ALLOWED_OPS | INPLACE_OPS
    assert not {n for n in every if n.split(".")[0] in ("from_file", "_print", "set_", "set")}
    assert not INPLACE_OPS & ALLOWED_OPS  # an in-place operator is never a pure one


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Integer(10)**Integer(10)**Integer(12)", "not a literal of at most 64"),
        ("Pow(Integer(10), Pow(Integer(10), Integer(12)))", "not a literal of at most 64"),
        ("Pow(Integer(2), Integer(100), evaluate=False)", "not a literal of at most 64"),
        ("Pow(Pow(Integer(10), Integer(64)), Integer(64))", "a power of a power"),
        ("LShift(Integer(1), Integer(10**15))", "not a literal of at most 64"),
        ("Integer(" + "9" * 100 + ")", "an integer constant above 2**64"),
        ("Integer('" + "9" * 100 + "')", "is not one torch.export writes"),
        ("Float('1.0', precision=10**9)", "a precision above 1024"),
        ("Abs(" * 120 + "s0" + ")" * 120, "more than 100 levels of nesting"),
        ("s0 + " * 5000 + "s0", "is not one torch.export writes"),
    ],
)
def test_a_costly_expression_is_refused_before_sympy_sees_it(text: str, message: str) -> None:
    start = time.monotonic()
    with pytest.raises(ArtifactError, match=message.replace("*", r"\*")):
        check_sympy(text, "m.json")
    assert time.monotonic() - start < 5  # a bound on the check itself, not a benchmark


@pytest.mark.parametrize(
    "text",
    [
        "Add(Mul(Integer(2), Symbol('s0', integer=True, positive=True)), Integer(1))",
        "Pow(Symbol('s0', integer=True, positive=True), Integer(2))",
        "FloorDiv(Symbol('s0', integer=True, positive=True), Integer(8))",
        "Float('0.5', precision=53)",
    ],
)
def test_what_torch_export_writes_passes(text: str) -> None:
    check_sympy(text, "m.json")


def test_a_guard_is_bounded_too() -> None:
    check_guard("L['x'].size()[0] <= 4096 and 2 <= L['x'].size()[0]", "m.json")
    with pytest.raises(ArtifactError, match="not a literal of at most 64"):
        check_guard("L['x'].size()[0] ** 10 ** 12 > 0", "m.json")


def test_the_table_refuses_unchecked_memory_random_draws_and_unscoped_switches() -> None:
    every = ALLOWED_OPS | INPLACE_OPS
    ops = {n.split(".")[0] for n in every}
    assert not ops & {"_reshape_alias", "as_strided_", "set_", "_set_grad_enabled", "to_dense"}
    assert not {o for o in ops if "sparse" in o or "coalesce" in o or "nested" in o}
    assert not ops & {"randn", "rand", "random_", "normal_functional", "bernoulli", "randperm"}
    assert set(RANDOM_OFF) <= every and "dropout.default" in RANDOM_OFF
    # results that may be an argument: views, composites, and the ops that return their input
    assert {"lift.default", "data.default", "split.Tensor", "unbind.int", "dropout.default",
            "broadcast_tensors.default", "_unsafe_view.default"} <= VIEW_OPS  # fmt: skip
    assert {"resize_.default", "t_.default", "requires_grad_.default"} <= METADATA_OPS
    assert op_kind("math.factorial") is None and op_kind("math.ceil") == "pure"
    assert op_kind("torch.ops.higher_order.while_loop") is None
    assert op_kind("torch._C._set_grad_enabled") is None
    assert op_kind("torch.ops.higher_order.wrap_with_autocast") == "pure"
