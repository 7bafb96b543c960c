"""Writes replay/runtime/pt2/op_table.py: the ``aten`` operators an artifact's programs may call
(`replay.runtime.pt2.operators` reads it).

Run with the torch capture supports (``python tools/allowed_ops.py``); the table it writes is
data, reviewed in the diff. The list is derived from torch's own operator metadata:

- every ``aten`` overload tagged ``core`` (the core ATen set) or ``pointwise``, every ``aten``
  overload ``torch._decomp.core_aten_decompositions()`` decomposes, and every composite one
  (a ``CompositeImplicitAutograd`` / ``CompositeExplicitAutograd`` kernel: defined by other
  operators; torch.export's default IR keeps many: ``reshape``, ``linear``,
  ``scaled_dot_product_attention``);
- plus `EXTRA`: operators real exports of the test suite's transformers models emit that carry
  none of those tags (dtype conversions, export's own assertions, size queries);
- minus every overload whose schema writes an argument (``out=`` variants, ``resize_``, ...),
  except the in-place form (``self`` written, nothing else) of an allowed functional
  operator: those go to the in-place table, and the graph check lets them write only the
  program's buffers, its inputs or tensors the program made itself;
- minus `DENIED`: anything that touches a file, prints or reads the environment;
- plus `NEWER`: what newer torch releases add by the same rules.

The view table lists the overloads whose result aliases their ``self`` (``view``, ``slice``,
``transpose``), so the graph check can follow a view back to the tensor it writes.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import torch
from torch._decomp import core_aten_decompositions

EXTRA = """
_assert_tensor_metadata.default _assert_async.default _assert_async.msg _assert_scalar.default
_functional_assert_async.msg _functional_assert_scalar.default sym_constrain_range.default
sym_constrain_range_for_size.default _functional_sym_constrain_range.default
_functional_sym_constrain_range_for_size.default sym_size.int sym_stride.int sym_numel.default
sym_storage_offset.default to.dtype to.dtype_layout to.device to.other to.prim_Device
to.prim_dtype to.prim_other dropout.default lift_fresh_copy.default contiguous.default
clone.default detach.default detach_.default item.default _local_scalar_dense.default
type_as.default masked_fill.Scalar masked_fill.Tensor copy_.default index_copy_.default
index_put_.default _unsafe_view.default einsum.default scaled_dot_product_attention.default
_scaled_dot_product_flash_attention.default _scaled_dot_product_flash_attention_for_cpu.default
_scaled_dot_product_efficient_attention.default _scaled_dot_product_cudnn_attention.default
_enable_grad.default _disable_grad.default _set_grad_enabled.default unflatten.int
""".split()

NEWER = ("linalg_vector_norm.default", "_philox_randint.default")
"""Pure operators newer torch releases derive by the same rules (torch 2.15 checked), kept in
the table so that one table serves every torch capture supports."""

DENIED = frozenset(
    {"from_file", "_print", "save", "set_", "record_stream", "_nested_tensor_from_mask"}
)
"""Operators that touch a file, print, or change what a tensor's storage is."""
DENIED_PREFIXES = ("set", "_cufft", "_test", "_cudnn_rnn_flatten", "_use_", "_debug")
"""Operators that set process-wide state, and torch's test and debug operators."""


def _overload(name: str) -> torch._ops.OpOverload | None:
    op, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, op, None)
    return getattr(packet, overload or "default", None) if packet is not None else None


def _writes(o: torch._ops.OpOverload) -> list[int]:
    return [
        i
        for i, a in enumerate(o._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    ]


def _names_a_file(o: torch._ops.OpOverload) -> bool:
    """An argument that is a file or path name (``from_file(filename)``)."""
    return any(
        str(a.type) in ("str", "Optional[str]") and a.name in ("filename", "path", "file", "f")
        for a in o._schema.arguments
    )


def _is_view(o: torch._ops.OpOverload) -> bool:
    schema = o._schema
    if not schema.returns or not schema.arguments:
        return False
    ret, first = schema.returns[0].alias_info, schema.arguments[0].alias_info
    return (
        ret is not None
        and not ret.is_write
        and first is not None
        and bool(set(ret.before_set) & set(first.before_set))
    )


def _composite(full: str) -> bool:
    """An operator defined by its decomposition into others (``reshape``, ``linear``): torch's
    default export IR keeps many of them as they are."""
    return any(
        torch._C._dispatch_has_kernel_for_dispatch_key(full, key)
        for key in ("CompositeImplicitAutograd", "CompositeExplicitAutograd")
    )


def table() -> tuple[list[str], list[str], list[str]]:
    """(pure, in-place, view) overload names, ``aten.<op>.<overload>``."""
    wanted: set[str] = set(EXTRA)
    for full in torch._C._dispatch_get_all_op_names():
        ns, _, rest = full.partition("::")
        if ns != "aten":
            continue
        op, _, overload = rest.partition(".")
        o = _overload(f"{op}.{overload or 'default'}")
        if o is not None and {torch.Tag.core, torch.Tag.pointwise} & set(o.tags):
            wanted.add(f"{op}.{overload or 'default'}")
        if o is not None and _composite(full):
            wanted.add(f"{op}.{overload or 'default'}")
    for key in core_aten_decompositions():
        if getattr(key, "namespace", None) == "aten":
            wanted.add(f"{key._opname}.{key._overloadname}")
    pure, inplace, views = set(), set(), set()
    for name in wanted:
        o = _overload(name)
        op = name.partition(".")[0]
        if o is None or op in DENIED or op.startswith(DENIED_PREFIXES) or _names_a_file(o):
            continue
        writes = _writes(o)
        if not writes:
            pure.add(name)
        elif writes == [0] and not o._schema.name.endswith("_out") and "out" not in name:
            inplace.add(name)
        if _is_view(o):
            views.add(name)
    for name in list(pure):  # the in-place form of every allowed functional operator
        op, _, overload = name.partition(".")
        o = _overload(f"{op}_.{overload}")
        if o is not None and _writes(o) == [0] and op + "_" not in DENIED:
            inplace.add(f"{op}_.{overload}")
    return sorted(pure | set(NEWER)), sorted(inplace), sorted(views - inplace)


def _block(names: list[str]) -> str:
    return "\n".join(textwrap.wrap(" ".join(names), 96, break_on_hyphens=False))


def main() -> None:
    pure, inplace, views = table()
    out = Path(__file__).resolve().parents[1] / "replay/runtime/pt2/op_table.py"
    out.write_text(
        '"""The ``aten`` operators a program may call, as data '
        "(`replay.runtime.pt2.operators`).\n\n"
        "Generated by ``python tools/allowed_ops.py`` (its docstring says how the list is derived\n"
        f"from torch's operator metadata) with torch {torch.__version__}: {len(pure)} pure, "
        f"{len(inplace)} in-place\nand {len(views)} view overloads.\n"
        '"""\n\n'
        f'_PURE = """\n{_block(pure)}\n"""\n\n'
        f'_INPLACE = """\n{_block(inplace)}\n"""\n\n'
        f'_VIEWS = """\n{_block(views)}\n"""\n\n'
        "ALLOWED_OPS = frozenset(_PURE.split())\n"
        '"""``aten`` overloads (``<op>.<overload>``) a program may call."""\n'
        "INPLACE_OPS = frozenset(_INPLACE.split())\n"
        '"""``aten`` overloads that write their ``self`` (and nothing else)."""\n'
        "VIEW_OPS = frozenset(_VIEWS.split())\n"
        '"""``aten`` overloads whose result aliases their ``self``."""\n'
    )
    print(f"{out}: {len(pure)} pure, {len(inplace)} in-place, {len(views)} views", file=sys.stderr)


if __name__ == "__main__":
    main()
