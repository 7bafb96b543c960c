"""The operators an artifact's program may call: the model's math, nothing else.

A program's graph names each node's target as a string (``torch.ops.aten.add.Tensor``), which
torch resolves and calls. The graph check (`replay.runtime.pt2.graph_check`) accepts a target
only when `op_kind` knows it:

- ``aten`` overloads of `replay.runtime.pt2.op_table`, generated from torch's own operator
  metadata by ``tools/allowed_ops.py`` (its docstring says how: the core ATen set, the
  ``pointwise`` tag, the composites torch.export keeps, the few others real transformers
  exports emit, minus anything that writes an argument, touches a file, prints or reads the
  environment);
- in-place overloads (``masked_fill_``, ``index_copy_``, ``copy_``): they may write only a
  buffer of the program, an input, or a tensor the program made; never a parameter or a
  constant (the graph check follows views back to the tensor they alias, `VIEW_OPS`);
- the higher-order operators and Python callables torch.export writes around the math (size
  arithmetic from ``operator`` and ``math``, ``torch.sym_*``, the scoped grad-mode and autocast
  wrappers, which restore the state they change when their subgraph returns);
- random operators only with their randomness off (`RANDOM_OFF`: ``dropout(train=False)``,
  attention with ``dropout_p=0``): a served call never draws from torch's global generator;
- the overloads of other namespaces in `OTHER_OPS` (torch's ``quantized_decomposed``
  (de)quantize operators);
- anything else only when the caller names it: a namespace (a custom operator library the
  serving process loads itself), one operator or one overload of any namespace, ``aten``
  included (``replay.load(path, allow_ops=["mylib", "aten.bincount"])``, ``capture check
  --allow-ops mylib``); a named ``aten`` operator whose name ends in ``_`` is in-place, its
  writes checked as the table's are.

``aten.from_file`` (maps a file), ``aten._print``, the unscoped grad and autocast switches
(``torch._C._set_grad_enabled``, ``_enter_autocast``: they would leave the serving thread
changed), ``while_loop`` (its trip count is data, unbounded at load), the ``math`` functions
whose time grows with their argument (``factorial``, ``comb``, ``perm``) and every unlisted
operator are refused by name. Needs no torch.
"""

from __future__ import annotations

import re

from replay.runtime.allowed import AllowOps, allow_ops
from replay.runtime.pt2.op_table import (
    ALLOWED_OPS,
    INPLACE_OPS,
    METADATA_OPS,
    OTHER_OPS,
    RANDOM_OFF,
    VIEW_OPS,
)

__all__ = [
    "ALLOWED_OPS",
    "INPLACE_OPS",
    "VIEW_OPS",
    "METADATA_OPS",
    "RANDOM_OFF",
    "OTHER_OPS",
    "HIGHER_ORDER_OPS",
    "MATH_FUNCTIONS",
    "TORCH_CALLABLES",
    "OPERATOR_FUNCTIONS",
    "AllowOps",
    "allow_ops",
    "op_kind",
    "check_op",
]

"""Caller-named namespaces (``mylib``) and operators (``mylib.op``) beyond the tables."""

TORCH_CALLABLES = frozenset(
    """sym_float sym_int sym_max sym_min sym_not sym_ite sym_sqrt sym_sum _sym_sqrt _check
    _check_is_size _assert _assert_async _assert_scalar _constrain_as_size
    _constrain_as_value""".split()
)
"""``torch.<name>`` callables torch.export writes: symbolic size arithmetic and its assertions
(not the unscoped grad and autocast switches, which change the serving thread's state)."""

OPERATOR_FUNCTIONS = frozenset(
    """add sub mul truediv floordiv mod pow neg pos abs eq ne lt le gt ge and_ or_ xor not_
    invert getitem lshift rshift matmul truth index""".split()
)
"""``_operator.<name>`` functions (size arithmetic on symbolic ints, ``getitem`` of a
multi-output node)."""

HIGHER_ORDER_OPS = frozenset({"wrap_with_set_grad_enabled", "wrap_with_autocast", "cond"})
"""``torch.ops.higher_order.<name>``: they run the program's own subgraphs (checked as the
top graph is); the two wrappers change grad mode or autocast for their subgraph only."""

MATH_FUNCTIONS = frozenset(
    """ceil floor trunc sqrt isqrt log log2 log10 exp fabs copysign fmod gcd isfinite isinf
    isnan""".split()
)
"""``math.<name>`` functions a graph may call on sizes: each runs in time bounded by its
arguments' bit length (not ``factorial``, ``comb``, ``perm``, ``pow``, ``prod``)."""


def op_kind(target: str, allowed: AllowOps = frozenset()) -> str | None:
    """What a node target is: ``pure``, ``view`` (its result may share memory with a tensor
    argument), ``inplace`` (writes its ``self``), ``metadata`` (changes its ``self``'s sizes,
    strides or autograd flags), or None when the program may not call it.

    Example:
        >>> op_kind("torch.ops.aten.mm.default"), op_kind("torch.ops.aten.from_file.default")
        ('pure', None)
        >>> op_kind("torch.ops.mylib.fused.default", allow_ops(["mylib"]))
        'pure'
        >>> op_kind("torch.ops.aten._int_mm.default", allow_ops(["aten._int_mm"]))
        'pure'
    """
    if target.startswith("#"):  # torch's spelling of an operator of a loaded library
        namespace, _, op = target[1:].partition(":")
        op, _, overload = op.partition(".")
        return "pure" if _named(namespace, op, overload or "default", allowed) else None
    module, _, rest = target.partition(".")
    if module == "_operator":
        return "pure" if rest in OPERATOR_FUNCTIONS else None
    if module == "math":
        return "pure" if rest in MATH_FUNCTIONS else None
    if module != "torch":
        return None
    if not rest.startswith("ops."):
        return "pure" if rest in TORCH_CALLABLES else None
    parts = rest.split(".")[1:]
    if not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) for p in parts) or len(parts) > 3:
        return None
    if parts[0] == "higher_order":
        return "pure" if len(parts) == 2 and parts[1] in HIGHER_ORDER_OPS else None
    if len(parts) != 3:
        return None
    namespace, op, overload = parts
    if namespace == "aten":
        name = f"{op}.{overload}"
        if name in METADATA_OPS:
            return "metadata"
        if name in INPLACE_OPS:
            return "inplace"
        if name in VIEW_OPS:
            return "view"
        if name in ALLOWED_OPS:
            return "pure"
        if not _named(namespace, op, overload, allowed):
            return None
        return "inplace" if op.endswith("_") else "pure"
    if op.startswith("__") or overload.startswith("__"):
        return None
    if f"{namespace}.{op}.{overload}" in OTHER_OPS:
        return "pure"
    return "pure" if _named(namespace, op, overload, allowed) else None


def _named(namespace: str, op: str, overload: str, allowed: AllowOps) -> bool:
    """The caller names the operator: its namespace (never ``aten``, `allow_ops`), the
    operator or the overload."""
    return (
        namespace in allowed
        or f"{namespace}.{op}" in allowed
        or f"{namespace}.{op}.{overload}" in allowed
    )


def check_op(target: str, allowed: AllowOps = frozenset()) -> bool:
    """True when a program may call `target` (`op_kind` knows it).

    Example:
        >>> check_op("torch.ops.aten._print.default")
        False
    """
    return op_kind(target, allowed) is not None
