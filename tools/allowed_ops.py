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
- plus `NEWER`: what newer torch releases add by the same rules;
- plus `EVIDENCE`: operators real models emit that carry none of those tags, found by the
  operator census (``tools/op_census.py``, its output ``tools/op_census.json``) and by the
  quantized and mixture-of-experts models serving stacks run, each checked by hand against
  the trust rules (reads only its tensors' bytes, the kernel checking their sizes; writes no
  argument; output bounded by its arguments' sizes); and `OTHER_NAMESPACES`: the same, outside
  ``aten`` (torch's ``quantized_decomposed`` (de)quantize operators);
- `REFUSED`: operators real models emit that stay off the list, each with the reason (what
  docs/trust.md lists); a caller who accepts the risk names one in ``allow_ops``.

The view table lists the overloads whose result aliases their ``self`` (``view``, ``slice``,
``transpose``), so the graph check can follow a view back to the tensor it writes.
"""

from __future__ import annotations

import json
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

EVIDENCE = """
_int_mm.default _weight_int8pack_mm.default _weight_int4pack_mm.default
_weight_int4pack_mm_for_cpu.default _weight_int4pack_mm_with_scales_and_zeros.default
_convert_weight_to_int4pack.default _convert_weight_to_int4pack_for_cpu.default
_scaled_mm.default histc.default view_as_complex.default view_as_real.default max.default
min.default var_mean.correction
""".split()
"""Quantized matmuls (int8 activations x int8 weights: ``_int_mm``; weight-only int8 and int4
packs with their scales; fp8 ``_scaled_mm`` with its scales), the int4 weight packers torchao
calls on load, ``histc`` (a mixture-of-experts router counting tokens per expert: its output
has ``bins`` elements, a constant of the graph), and the complex views of rotary embeddings
(``view_as_complex``, ``view_as_real``: Llama 4; views, followed by the graph check like the
others), and the whole-tensor reductions torch tags ``reduction`` but not ``core``
(``max()``, ``min()``: XLM, Flaubert, PhiMoE; ``var_mean``). Each kernel checks its operands'
sizes, dtypes, strides and group sizes against each other before it reads them, writes only
its own result, and does work bounded by its operands' sizes."""

OTHER_NAMESPACES = {
    "quantized_decomposed": (
        "torch.ao.quantization.fx._decomposed",
        """
quantize_per_tensor.default quantize_per_tensor.tensor quantize_per_tensor.tensor2
dequantize_per_tensor.default dequantize_per_tensor.tensor dequantize_per_tensor.tensor2
quantize_per_channel.default dequantize_per_channel.default quantize_per_channel_group.default
dequantize_per_channel_group.default quantize_per_token.default dequantize_per_token.default
choose_qparams.tensor choose_qparams_symmetric.tensor choose_qparams_per_token.default
choose_qparams_per_token_asymmetric.default convert_element_type.no_fuse
""".split(),
    ),
    "transformers": ("transformers.integrations.moe", ["grouped_mm_fallback.default"]),
}
"""Namespace -> (the module whose import registers it, its operators a program may call).
``quantized_decomposed``: torch's own (de)quantize and quantization-parameter operators, what
PT2E quantization and torchao leave in an exported graph, pure functions of their tensors
written with ``aten`` operators. ``transformers.grouped_mm_fallback``: the experts' matmul
of transformers' mixture-of-experts layers where ``torch._grouped_mm`` does not apply
(float32, CPU): declared pure (``mutates_args=()``), a loop of ``torch.mm`` over row slices
of its input by the offsets it is given (slices stay inside the tensors whatever the offsets;
work bounded by the experts' count and the tensors' sizes). The loader imports the module
(``transformers`` is already the one library whose types an artifact may name)."""

_VMAP = (
    "torch.vmap inside forward: it changes functorch's process-wide vmap nesting level, "
    "process state a program may not change"
)

REFUSED = {
    "bincount.default": "its output has as many elements as the largest value of its input "
    "plus one: the work is bounded by the values a call passes, not by the guards' sizes",
    "_dyn_quant_matmul_4bit.default": "it trusts the integer sizes it is given against the "
    "packed weight's bytes",
    "_dyn_quant_pack_4bit_weight.default": "it trusts the integer sizes it is given against "
    "its weights' bytes",
    "torch._functorch.predispatch._vmap_increment_nesting": _VMAP,
    "torch._functorch.predispatch._vmap_decrement_nesting": _VMAP,
    "torch._functorch.predispatch._add_batch_dim": _VMAP,
    "torch._functorch.predispatch._remove_batch_dim": _VMAP,
    "torch._functorch.predispatch.lazy_load_decompositions": _VMAP,
    "torch.ops.higher_order.flat_apply": "it calls a Python function the graph names, code "
    "the artifact would choose",
}
"""Operators real models emit that stay off the list, and why (``aten`` ones by
``<op>.<overload>``, others by the target a graph names); a caller who accepts the risk of an
``aten`` one names it (``allow_ops=["aten.bincount"]``)."""

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
    wanted: set[str] = set(EXTRA) | set(EVIDENCE)
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
        if name in REFUSED:
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


def other_namespaces() -> list[str]:
    """``<namespace>.<op>.<overload>`` of `OTHER_NAMESPACES`, each checked to exist in this
    torch and to write none of its arguments."""
    import importlib

    out = []
    for namespace, (module, names) in OTHER_NAMESPACES.items():
        importlib.import_module(module)  # registers the namespace's operators
        for name in names:
            op, _, overload = name.partition(".")
            o = getattr(getattr(getattr(torch.ops, namespace), op), overload)
            if _writes(o) or _names_a_file(o):
                raise SystemExit(f"{namespace}.{name} writes an argument or names a file")
            out.append(f"{namespace}.{name}")
    return sorted(out)


def _lines(text: str) -> list[str]:
    return textwrap.wrap(text, 80, drop_whitespace=False)


def _block(names: list[str]) -> str:
    return "\n".join(textwrap.wrap(" ".join(names), 96, break_on_hyphens=False))


def main() -> None:
    pure, inplace, views = table()
    others = other_namespaces()
    modules = "".join(
        f"    {json.dumps(n)}: {json.dumps(m)},\n" for n, (m, _) in OTHER_NAMESPACES.items()
    )
    refused = "".join(
        f"    {json.dumps(name)}: (\n"
        + "".join(f"        {json.dumps(p)}\n" for p in _lines(reason))
        + "    ),\n"
        for name, reason in sorted(REFUSED.items())
    )
    out = Path(__file__).resolve().parents[1] / "replay/runtime/pt2/op_table.py"
    out.write_text(
        '"""The ``aten`` operators a program may call, as data '
        "(`replay.runtime.pt2.operators`).\n\n"
        "Generated by ``python tools/allowed_ops.py`` (its docstring says how the list is derived\n"
        f"from torch's operator metadata) with torch {torch.__version__}: {len(pure)} pure, "
        f"{len(inplace)} in-place\nand {len(views)} view overloads; {len(others)} of other "
        "namespaces (with the modules that register\nthem), and the operators real models emit "
        "that stay off the list, with why.\n"
        '"""\n\n'
        f'_PURE = """\n{_block(pure)}\n"""\n\n'
        f'_INPLACE = """\n{_block(inplace)}\n"""\n\n'
        f'_VIEWS = """\n{_block(views)}\n"""\n\n'
        f'_OTHER = """\n{_block(others)}\n"""\n\n'
        "ALLOWED_OPS = frozenset(_PURE.split())\n"
        '"""``aten`` overloads (``<op>.<overload>``) a program may call."""\n'
        "INPLACE_OPS = frozenset(_INPLACE.split())\n"
        '"""``aten`` overloads that write their ``self`` (and nothing else)."""\n'
        "VIEW_OPS = frozenset(_VIEWS.split())\n"
        '"""``aten`` overloads whose result aliases their ``self``."""\n'
        "OTHER_OPS = frozenset(_OTHER.split())\n"
        '"""Pure overloads outside ``aten`` (``<namespace>.<op>.<overload>``) a program may '
        'call."""\n'
        f"OTHER_MODULES = {{\n{modules}}}\n"
        '"""Namespace of `OTHER_OPS` -> the module whose import registers its operators."""\n'
        f"REFUSED_OPS = {{\n{refused}}}\n"
        '"""``aten`` operators real models emit that stay off the list -> why (docs/trust.md)."""\n'
    )
    print(f"{out}: {len(pure)} pure, {len(inplace)} in-place, {len(views)} views", file=sys.stderr)


if __name__ == "__main__":
    main()
