"""Hostile programs that stay within the allow-list's spelling but would harm the serving
process: memory outside a tensor's storage, writes to weights or the caller's tensors, process
state (grad mode, autocast, the global RNG), unbounded work. The cases test_hostile_artifact.py
adds, built as `hostile_programs` builds its cases: nodes planted at the start of a real saved
program's graph (``x`` is the caller's input of 2..4 x 3, ``p_proj_weight`` a parameter).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hostile_programs import Change, _arg, _edit, _node, _program

__all__ = ["EFFECT_CASES"]

W = "p_proj_weight"


def _t(name: str) -> dict[str, Any]:
    return {"as_tensor": {"name": name}}


def _op(target: str, out: str, **args: Any) -> dict[str, Any]:
    return _node(f"torch.ops.aten.{target}", [_arg(k, **v) for k, v in args.items()], out)


def _fill(name: str, out: str = "evil_fill") -> dict[str, Any]:
    return _op("fill_.Scalar", out, self=_t(name), value={"as_int": 0})


def _sym(target: str, out: str, *args: dict[str, Any]) -> dict[str, Any]:
    """A node whose output is a symbolic int (size arithmetic)."""
    node = _node(target, [_arg(f"a{i}", **a) for i, a in enumerate(args)], out)
    node["outputs"] = [{"as_sym_int": {"as_name": out}}]
    return node


def _listed(target: str, source: str, out: str) -> dict[str, Any]:
    """A node returning a list of tensors (``split``, ``unbind``)."""
    node = _op(target, out, self=_t(source), split_size={"as_int": 1})
    if target.startswith("unbind"):
        node["inputs"] = node["inputs"][:1]
    node["outputs"] = [{"as_tensors": [{"name": f"{out}_0"}, {"name": f"{out}_1"}]}]
    return node


def _nodes(*nodes: dict[str, Any]) -> Callable[[Path], Change]:
    return _list_outputs(list(nodes))


def _list_outputs(nodes: list[dict[str, Any]]) -> Callable[[Path], Change]:
    """Adds nodes at the start of g0's graph, with tensor metadata for their tensor outputs
    (lists too)."""

    def make(marker: Path) -> Change:
        def change(e: dict[str, bytes]) -> None:
            def edit(d: Any) -> None:
                graph = d["graph_module"]["graph"]
                meta = next(iter(graph["tensor_values"].values()))
                for node in nodes:
                    for out in node["outputs"]:
                        for item in out.get("as_tensors") or [out.get("as_tensor")]:
                            if item:
                                graph["tensor_values"][item["name"]] = meta
                graph["nodes"][:0] = json.loads(json.dumps(nodes))

            _edit(e, _program(e), edit)

        return change

    return make


def _buffer_mutation_of_a_parameter(marker: Path) -> Change:
    def change(e: dict[str, bytes]) -> None:
        def edit(d: Any) -> None:
            specs = d["graph_module"]["signature"]["output_specs"]
            specs.append(
                {"buffer_mutation": {"arg": {"name": "linear"}, "buffer_name": "proj.weight"}}
            )
            d["graph_module"]["graph"]["outputs"].append(_t("linear"))

        _edit(e, _program(e), edit)

    return change


def _buffer_in_a_weight_record(marker: Path) -> Change:
    """A buffer the program writes, placed by its config in the parameter's own record."""

    def change(e: dict[str, bytes]) -> None:
        def graph(d: Any) -> None:
            gm = d["graph_module"]
            gm["signature"]["input_specs"].insert(
                0,
                {"buffer": {"arg": {"name": "b_evil"}, "buffer_name": "evil", "persistent": True}},
            )
            gm["graph"]["nodes"][:0] = [_fill("b_evil")]
            gm["graph"]["tensor_values"]["evil_fill"] = gm["graph"]["tensor_values"][W]

        def config(d: Any) -> None:
            d["config"]["evil"] = dict(d["config"]["proj.weight"], is_param=False)

        _edit(e, _program(e), graph)
        _edit(e, "data/weights/g0_weights_config.json", config)

    return change


def _cond_with(inner: dict[str, Any]) -> dict[str, Any]:
    """A ``cond`` node whose true branch runs `inner` (a grad switch in a subgraph)."""
    sub = {"graph": {"inputs": [], "nodes": [inner], "outputs": [], "tensor_values": {},
                     "sym_int_values": {}, "sym_bool_values": {}, "is_single_tensor_return": False,
                     "custom_obj_values": {}, "sym_float_values": {}}}  # fmt: skip
    node = _node(
        "torch.ops.higher_order.cond",
        [_arg("pred", as_bool=True), _arg("true_fn", as_graph=sub),
         _arg("false_fn", as_graph=sub), _arg("operands", as_tensors=[])],
        "evil_cond",
    )  # fmt: skip
    node["outputs"] = []
    return node


def _call(target: str, out: str, *args: dict[str, Any]) -> dict[str, Any]:
    node = _node(target, [_arg(f"a{i}", **a) for i, a in enumerate(args)], out)
    node["outputs"] = [{"as_none": True}]
    return node


_SIZES = {"as_sym_ints": [{"as_int": 10**7}, {"as_int": 10**7}, {"as_int": 3}, {"as_int": 3}]}
_GRAD_OFF = _call("torch._C._set_grad_enabled", "grad_off", {"as_bool": False})

EFFECT_CASES: dict[str, tuple[Callable[[Path], Change], str]] = {
    # memory: views torch does not bound-check, sparse constructors that skip index checks
    "_reshape_alias past its storage": (
        _nodes(
            _op(
                "_reshape_alias.default",
                "big",
                self=_t("x"),
                size={"as_ints": [4 * 2**20]},
                stride={"as_ints": [1]},
            ),
            _fill("big"),
        ),
        "calls 'torch.ops.aten._reshape_alias.default'",
    ),  # fmt: skip
    "sparse_coo_tensor then to_dense": (
        _nodes(
            _op(
                "sparse_coo_tensor.indices_size",
                "sp",
                indices=_t("x"),
                values=_t("x"),
                size={"as_ints": [2]},
            )
        ),
        "calls 'torch.ops.aten.sparse_coo_tensor.indices_size'",
    ),  # fmt: skip
    "_sparse_coo_tensor_unsafe": (
        _nodes(
            _op(
                "_sparse_coo_tensor_unsafe.default",
                "sp",
                indices=_t("x"),
                values=_t("x"),
                size={"as_ints": [2]},
            )
        ),
        "calls 'torch.ops.aten._sparse_coo_tensor_unsafe.default'",
    ),  # fmt: skip
    "as_strided_ of the caller's input": (
        _nodes(
            _op(
                "as_strided_.default",
                "st",
                self=_t("x"),
                size={"as_ints": [4096]},
                stride={"as_ints": [1]},
            )
        ),
        "calls 'torch.ops.aten.as_strided_.default'",
    ),  # fmt: skip
    # writes: aliases of a parameter, foreach lists, output specs, the caller's tensors
    "lift of a parameter, filled": (
        _nodes(_op("lift.default", "lifted", self=_t(W)), _fill("lifted")),
        "writes lifted (a view of p_proj_weight), a parameter",
    ),
    "data of a parameter, filled": (
        _nodes(_op("data.default", "d", self=_t(W)), _fill("d")),
        "writes d (a view of p_proj_weight), a parameter",
    ),
    "dropout in eval returns the parameter": (
        _nodes(
            _op(
                "dropout.default", "dr", input=_t(W), p={"as_float": 0.5}, train={"as_bool": False}
            ),
            _fill("dr"),
        ),
        "writes dr (a view of p_proj_weight), a parameter",
    ),  # fmt: skip
    "split of a parameter, filled": (
        _list_outputs([_listed("split.Tensor", W, "parts"), _fill("parts_1")]),
        "writes parts_1 (a view of p_proj_weight), a parameter",
    ),
    "unbind of a parameter, filled": (
        _list_outputs([_listed("unbind.int", W, "rows"), _fill("rows_0")]),
        "writes rows_0 (a view of p_proj_weight), a parameter",
    ),
    "_foreach_zero_ with a parameter second": (
        _nodes(
            _op("zeros_like.default", "fresh", self=_t("x")),
            _call(
                "torch.ops.aten._foreach_zero_.default",
                "fz",
                {"as_tensors": [{"name": "fresh"}, {"name": W}]},
            ),
        ),
        "writes p_proj_weight, a parameter",
    ),  # fmt: skip
    "a written buffer placed in a parameter's record": (
        _buffer_in_a_weight_record,
        "and the buffer evil, which g0 writes",
    ),
    "buffer_mutation output naming a parameter": (
        _buffer_mutation_of_a_parameter,
        "writes back proj.weight, which is not a buffer",
    ),
    "copy_ into the caller's input": (
        _nodes(_op("copy_.default", "cp", self=_t("x"), src=_t("x"))),
        "writes x, an input of the caller",
    ),
    "resize_ of the caller's input": (
        _nodes(_op("resize_.default", "rs", self=_t("x"), size={"as_ints": [1]})),
        "changes the sizes, strides or flags of x, an input of the caller",
    ),
    "requires_grad_ of a parameter": (
        _nodes(_op("requires_grad_.default", "rg", self=_t(W), requires_grad={"as_bool": False})),
        "changes the sizes, strides or flags of p_proj_weight, a parameter",
    ),
    "t_ of the caller's input": (
        _nodes(_op("t_.default", "tt", self=_t("x"))),
        "changes the sizes, strides or flags of x",
    ),
    # process state: grad mode, autocast, the global random generator
    "autocast entered, never left": (
        _nodes(_call("torch.amp.autocast_mode._enter_autocast", "ac", {"as_string": "cpu"})),
        "calls 'torch.amp.autocast_mode._enter_autocast'",
    ),
    "grad mode off": (_nodes(_GRAD_OFF), "calls 'torch._C._set_grad_enabled'"),
    "grad mode off inside a cond branch": (
        _nodes(_cond_with(_GRAD_OFF)),
        "calls 'torch._C._set_grad_enabled'",
    ),
    "set_grad_enabled class": (
        _nodes(_call("torch.autograd.grad_mode.set_grad_enabled", "sg", {"as_bool": False})),
        "calls 'torch.autograd.grad_mode.set_grad_enabled'",
    ),
    "randn": (
        _nodes(_op("randn.default", "r", size={"as_ints": [3]})),
        "calls 'torch.ops.aten.randn.default'",
    ),
    "random_ of a tensor it made": (
        _nodes(
            _op("zeros_like.default", "z", self=_t("x")), _op("random_.default", "r", self=_t("z"))
        ),
        "calls 'torch.ops.aten.random_.default'",
    ),
    "dropout in train mode": (
        _nodes(
            _op(
                "dropout.default", "dr", input=_t("x"), p={"as_float": 0.5}, train={"as_bool": True}
            )
        ),
        "draws from torch's global random generator (train must be False)",
    ),  # fmt: skip
    "dropout with train=False written in p's place": (
        _nodes(
            _op(
                "dropout.default",
                "dr",
                input=_t("x"),
                train={"as_bool": False},
                p={"as_float": 0.5},
            )
        ),
        "passes 'train' where the operator takes 'p'",
    ),  # fmt: skip
    "attention with dropout": (
        _nodes(
            _op(
                "scaled_dot_product_attention.default",
                "at",
                query=_t("x"),
                key=_t("x"),
                value=_t("x"),
                dropout_p={"as_float": 0.5},
            )
        ),
        "draws from torch's global random generator (dropout_p must be 0.0)",
    ),  # fmt: skip
    # bounded work: loops, huge views reduced, Python integers of any length
    "while_loop": (
        _nodes(_node("torch.ops.higher_order.while_loop", [], "loop")),
        "calls 'torch.ops.higher_order.while_loop'",
    ),
    "expand to 1e7 x 1e7 then sum": (
        _nodes(
            _op("expand.default", "huge", self=_t("x"), size=_SIZES),
            _op("sum.default", "total", self=_t("huge")),
        ),
        "over the budget of",
    ),  # fmt: skip
    "expand whose size is named otherwise": (
        _nodes(
            _op("expand.default", "huge", self=_t("x"), dims=_SIZES),
            _op("sum.default", "total", self=_t("huge")),
        ),
        "passes 'dims' where the operator takes 'size'",
    ),  # fmt: skip
    "zeros of 1e14 elements": (
        _nodes(_op("zeros.default", "z", size={"as_ints": [10**7, 10**7]})),
        "over the budget of",
    ),
    "full of a batch times 1e12": (
        _nodes(
            _sym("torch.ops.aten.sym_size.int", "b", _t("x"), {"as_int": 0}),
            _op(
                "full.default",
                "f",
                size={"as_sym_ints": [{"as_name": "b"}, {"as_int": 10**12}]},
                fill_value={"as_int": 1},
            ),
        ),
        "over the budget of",
    ),  # fmt: skip
    "a size read from a tensor's values": (
        _nodes(
            _sym("torch.ops.aten.item.default", "u", _t("x")),
            _op(
                "expand.default",
                "e",
                self=_t("x"),
                size={"as_sym_ints": [{"as_name": "u"}, {"as_int": 3}]},
            ),
        ),
        "passes a size the guards do not bound",
    ),  # fmt: skip
    "pow(3, 10**9) on sizes": (
        _nodes(_sym("_operator.pow", "big", {"as_int": 3}, {"as_int": 10**9})),
        "computes a size that may exceed int64",
    ),
    "squaring a size 8 times": (
        _nodes(
            _sym("torch.ops.aten.sym_size.int", "s", _t("x"), {"as_int": 0}),
            *[
                _sym(
                    "_operator.mul",
                    f"s{i + 1}" if i else "s1",
                    {"as_sym_int": {"as_name": f"s{i}" if i else "s"}},
                    {"as_sym_int": {"as_name": f"s{i}" if i else "s"}},
                )
                for i in range(8)
            ],
        ),
        "computes a size that may exceed int64",
    ),  # fmt: skip
    "math.comb of sizes": (
        _nodes(_sym("math.comb", "c", {"as_int": 10**7}, {"as_int": 5 * 10**6})),
        "calls 'math.comb'",
    ),
    "math.factorial of a size": (
        _nodes(_sym("math.factorial", "f", {"as_int": 10**7})),
        "calls 'math.factorial'",
    ),
}
"""Case name -> (make, a part of the one-line refusal)."""
