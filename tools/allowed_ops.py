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
- minus `DENIED` and `DENIED_PATTERN`: anything that touches a file, prints, reads the
  environment, changes process state (grad mode), builds a tensor over memory torch does not
  bound-check (``_reshape_alias``, ``as_strided_``, ``set_``, sparse and nested layouts, whose
  constructors skip their index checks);
- minus every operator that draws from torch's global random generator (tagged
  ``nondeterministic_seeded`` or taking a ``Generator``), except those of `RANDOM_OFF`, which
  draw nothing when one argument says so (``dropout(train=False)``,
  ``scaled_dot_product_attention(dropout_p=0)``): the graph check holds each node to it;
- plus `NEWER`: what newer torch releases add by the same rules;
- plus `EVIDENCE`: operators real models emit that carry none of those tags, found by the
  operator census (``tools/op_census.py``, its output ``tools/op_census.json``) and by the
  quantized and mixture-of-experts models serving stacks run, each checked by hand against
  the trust rules (reads only its tensors' bytes, the kernel checking their sizes; writes no
  argument; output bounded by its arguments' sizes); and `OTHER_NAMESPACES`: the same, outside
  ``aten`` (torch's ``quantized_decomposed`` (de)quantize operators);
- `REFUSED`: operators real models emit that stay off the list, each with the reason (what
  docs/trust.md lists); a caller who accepts the risk names one in ``allow_ops``.

The view table lists the overloads whose result may share memory with a tensor argument: the
schema's views (``view``, ``slice``, ``split``), every ``CompositeImplicitAutograd`` operator
(defined in Python-like C++ that may return an argument: ``dropout`` in eval, ``type_as``,
``einsum``, ``chunk``) and `ALIASING` (``lift``, ``data``, ``_unsafe_view``...), so the graph check
can follow any tensor a node writes back to every tensor it may be. The metadata table lists the
in-place overloads that change their ``self``'s sizes, strides, storage or autograd flags
(``resize_``, ``t_``, ``requires_grad_``): a program may apply them only to tensors it made.
"""

from __future__ import annotations

import json
import re
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
unflatten.int
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

_RANDOM = (
    "it draws from torch's global random generator: a served call would change the serving "
    "process's random state (BigBird's random attention, ViT-MAE's masking, VITS's noise)"
)
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
    "rand.default": _RANDOM,
    "randn.default": _RANDOM,
    "randn_like.default": _RANDOM,
    "uniform_.default": _RANDOM,
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
    {
        "from_file", "_print", "save", "set_", "record_stream", "_reshape_alias",
        "as_strided_", "_enable_grad", "_disable_grad", "_set_grad_enabled",
        "to_dense", "to_dense_backward",
    }
)  # fmt: skip
"""Operators that touch a file, print, change what a tensor's storage is, view memory without
torch's bounds check (``_reshape_alias``: a 2-element tensor viewed as 4M elements), change
grad mode outside a scope, or read a sparse layout (``to_dense``)."""
DENIED_PREFIXES = ("set", "_cufft", "_test", "_cudnn_rnn_flatten", "_use_", "_debug")
"""Operators that set process-wide state, and torch's test and debug operators."""
DENIED_PATTERN = re.compile(
    r"sparse|coalesce|nested|_make_per_|\A(_?indices|_?values|crow_indices"
    r"|col_indices|ccol_indices|row_indices)\Z"
)
"""Sparse and nested layouts and raw quantized tensors: their constructors take index arrays that
torch checks only when asked (``sparse_coo_tensor`` then ``to_dense`` writes out of bounds)."""

ALIASING = frozenset(
    {"lift", "lift_fresh", "data", "alias", "_unsafe_view", "split", "split_with_sizes",
     "unbind", "unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk", "chunk",
     "broadcast_tensors", "meshgrid", "atleast_1d", "atleast_2d", "atleast_3d", "type_as",
     "sum_to_size", "cartesian_prod", "dropout", "feature_dropout", "alpha_dropout",
     "feature_alpha_dropout", "einsum", "tensor_split", "hsplit", "vsplit", "dsplit",
     "_to_cpu", "_pin_memory", "pin_memory", "contiguous", "_conj", "conj", "resolve_conj",
     "resolve_neg", "_neg_view", "_cast_Float", "_cast_Half", "_cast_Double", "_cast_Long",
     "_cast_Int", "_cast_Short", "_cast_Char", "_cast_Byte", "_lazy_clone"}
)  # fmt: skip
"""Operators whose result may be (or share memory with) a tensor argument, whatever their
schema says (``lift``, ``data`` and ``_unsafe_view`` return their input's memory)."""

METADATA = frozenset(
    {"resize_", "resize_as_", "_resize_output_", "requires_grad_", "retain_grad", "detach_",
     "t_", "transpose_", "squeeze_", "unsqueeze_", "swapaxes_", "swapdims_"}
)  # fmt: skip
"""In-place operators that change their ``self``'s sizes, strides or autograd flags."""

RANDOM_OFF: dict[str, tuple[str, bool | float, bool]] = {
    **{op: ("train", False, False) for op in (
        "dropout", "dropout_", "feature_dropout", "feature_dropout_", "alpha_dropout",
        "alpha_dropout_", "feature_alpha_dropout", "feature_alpha_dropout_", "native_dropout",
        "lstm", "gru", "rnn_tanh", "rnn_relu")},
    **{op: ("dropout_p", 0.0, True) for op in (
        "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable")},
    "rrelu": ("training", False, True),
}  # fmt: skip
"""Random operators that draw nothing when one argument has one value: operator -> (the
argument, the value, whether leaving the argument out means that value). torch.export writes
``dropout(x, p, False)`` for a model in eval mode, and ``dropout_p=0.0`` for attention."""


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


def _is_random(o: torch._ops.OpOverload) -> bool:
    """Draws from torch's global generator (a serialized graph cannot hold a local one)."""
    return torch.Tag.nondeterministic_seeded in o.tags or any(
        "Generator" in str(a.type) for a in o._schema.arguments
    )


def _aliases(o: torch._ops.OpOverload) -> bool:
    """The schema says a result may be a view of an argument (lists too: ``split``'s
    ``Tensor(a -> *)``)."""
    schema = o._schema
    returned = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    spread = any(
        a.alias_info is not None and not a.alias_info.is_write and "*" in a.alias_info.after_set
        for a in schema.arguments
    )
    return bool(schema.returns) and (returned or spread)


def _denied(op: str, o: torch._ops.OpOverload) -> bool:
    return (
        op in DENIED
        or op.startswith(DENIED_PREFIXES)
        or bool(DENIED_PATTERN.search(op))
        or _names_a_file(o)
        or (_is_random(o) and op not in RANDOM_OFF)
    )


def _implicit(name: str) -> bool:
    """A ``CompositeImplicitAutograd`` overload: defined by other operators, it may return one
    of its arguments (``dropout`` in eval mode returns its input)."""
    op, _, overload = name.partition(".")
    full = f"aten::{op}" if overload == "default" else f"aten::{name}"
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(full, "CompositeImplicitAutograd")
    except RuntimeError:  # an overload the dispatcher spells otherwise (``to.prim_Device``)
        return True


def _composite(full: str) -> bool:
    """An operator defined by its decomposition into others (``reshape``, ``linear``): torch's
    default export IR keeps many of them as they are."""
    return any(
        torch._C._dispatch_has_kernel_for_dispatch_key(full, key)
        for key in ("CompositeImplicitAutograd", "CompositeExplicitAutograd")
    )


def table() -> tuple[list[str], list[str], list[str], list[str]]:
    """(pure, in-place, view, metadata) overload names, ``aten.<op>.<overload>``."""
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
        if o is None or _denied(op, o):
            continue
        if name in REFUSED:
            continue
        writes = _writes(o)
        if not writes:
            pure.add(name)
        elif writes == [0] and not o._schema.name.endswith("_out") and "out" not in name:
            inplace.add(name)
        implicit = _implicit(name) and not writes
        if _is_view(o) or _aliases(o) or op in ALIASING or implicit:
            views.add(name)
    for name in list(pure):  # the in-place form of every allowed functional operator
        op, _, overload = name.partition(".")
        o = _overload(f"{op}_.{overload}")
        if o is not None and _writes(o) == [0] and not _denied(op + "_", o):
            inplace.add(f"{op}_.{overload}")
    metadata = {n for n in inplace if n.partition(".")[0] in METADATA}
    return sorted(pure | set(NEWER)), sorted(inplace), sorted(views - inplace), sorted(metadata)


def _random_off(names: set[str]) -> str:
    rows = [(n, RANDOM_OFF.get(n.partition(".")[0])) for n in sorted(names)]
    lines = [f"    {n!r}: {v!r},".replace("'", '"') for n, v in rows if v is not None]
    return "{\n" + "\n".join(lines) + "\n}"


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


SHARED_REASONS = {"_RANDOM": _RANDOM, "_VMAP": _VMAP}
"""Reasons of `REFUSED` that several operators share: written once in the table, by name."""

_DECODE = '''
def _overloads(text: str) -> Iterator[tuple[str, str, bool]]:
    """(operator, overload, whether its in-place twin is allowed too) of each overload a table
    names: ``abs`` is ``abs.default``, ``add.Scalar,Tensor`` two overloads, and ``add(_)``
    stands for ``add`` and its in-place ``add_`` with the same overloads."""
    for token in text.split():
        op, _, overloads = token.partition(".")
        twin = op.endswith("(_)")
        for overload in (overloads or "default").split(","):
            yield op.removesuffix("(_)"), overload, twin


def _table(text: str) -> frozenset[str]:
    return frozenset(f"{op}.{overload}" for op, overload, _ in _overloads(text))
'''
"""The generated table's reader of its own tokens (`_compact` writes them)."""


def _lines(text: str) -> list[str]:
    return textwrap.wrap(text, 80, drop_whitespace=False)


def _block(names: list[str]) -> str:
    return "\n".join(textwrap.wrap(" ".join(names), 96, break_on_hyphens=False))


def _by_operator(names: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name in sorted(names):
        op, _, overload = name.partition(".")
        out.setdefault(op, []).append(overload)
    return out


def _compact(names: list[str], twins: dict[str, list[str]] | None = None) -> str:
    """`names` (``<op>.<overload>``) as the table's tokens (`_DECODE` reads them back): one per
    operator, ``(_)`` after an operator whose in-place form in `twins` has its overloads."""
    tokens = []
    for op, overloads in _by_operator(names).items():
        mark = "(_)" if twins is not None and twins.get(op + "_") == overloads else ""
        tail = "" if overloads == ["default"] else "." + ",".join(overloads)
        tokens.append(f"{op}{mark}{tail}")
    return _block(tokens)


def _parenthesized(reason: str, indent: str) -> str:
    return "(\n" + "".join(f"{indent}    {json.dumps(p)}\n" for p in _lines(reason)) + indent + ")"


def _refused() -> str:
    """`SHARED_REASONS` once each, then ``REFUSED_OPS`` naming them."""
    shared = {reason: name for name, reason in SHARED_REASONS.items()}
    constants = "".join(
        f"{name} = {_parenthesized(reason, '')}\n" for name, reason in SHARED_REASONS.items()
    )
    rows = "".join(
        f"    {json.dumps(name)}: {shared.get(reason) or _parenthesized(reason, '    ')},\n"
        for name, reason in sorted(REFUSED.items())
    )
    return f"{constants}\nREFUSED_OPS = {{\n{rows}}}\n"


def _tables(pure: list[str], inplace: list[str], views: list[str], metadata: list[str]) -> str:
    """The ``aten`` tables' text and the frozensets read from them."""
    twins = _by_operator(inplace)
    twinned = {
        f"{op}_.{overload}"
        for op, overloads in _by_operator(pure).items()
        if twins.get(op + "_") == overloads
        for overload in overloads
    }
    return (
        f'_PURE = """\n{_compact(pure, twins)}\n"""\n\n'
        f'_INPLACE = """\n{_compact(sorted(set(inplace) - twinned))}\n"""\n\n'
        f'_VIEWS = """\n{_compact(views)}\n"""\n\n'
        f'_METADATA = """\n{_compact(metadata)}\n"""\n\n'
        f"{_DECODE}\n\n"
        "ALLOWED_OPS = _table(_PURE)\n"
        '"""``aten`` overloads (``<op>.<overload>``) a program may call."""\n'
        "INPLACE_OPS = _table(_INPLACE) | {\n"
        '    f"{op}_.{overload}" for op, overload, twin in _overloads(_PURE) if twin\n'
        "}\n"
        '"""``aten`` overloads that write their ``self`` (and nothing else)."""\n'
        "VIEW_OPS = _table(_VIEWS)\n"
        '"""``aten`` overloads whose result may share memory with a tensor argument."""\n'
        "METADATA_OPS = _table(_METADATA)\n"
        '"""In-place overloads that change their ``self``\'s sizes, strides or autograd '
        'flags."""\n'
    )


def main() -> None:
    pure, inplace, views, metadata = table()
    others = other_namespaces()
    modules = "".join(
        f"    {json.dumps(n)}: {json.dumps(m)},\n" for n, (m, _) in OTHER_NAMESPACES.items()
    )
    out = Path(__file__).resolve().parents[1] / "replay/runtime/pt2/op_table.py"
    out.write_text(
        '"""The ``aten`` operators a program may call, as data '
        "(`replay.runtime.pt2.operators`).\n\n"
        "Generated by ``python tools/allowed_ops.py`` (its docstring says how the list is derived\n"
        f"from torch's operator metadata) with torch {torch.__version__}: {len(pure)} pure, "
        f"{len(inplace)} in-place\n({len(metadata)} of them change metadata), {len(views)} "
        "overloads whose result may alias an argument;\n"
        f"{len(others)} of other namespaces (with the modules that register them), and the "
        "operators\nreal models emit that stay off the list, with why.\n\n"
        "The ``aten`` tables name one operator per token (`_overloads` reads them): ``abs`` is\n"
        "its ``default`` overload, ``add.Scalar,Tensor`` the overloads listed, and ``add(_)``\n"
        "the operator and its in-place twin ``add_`` (the same overloads) at once.\n"
        '"""\n\n'
        "from __future__ import annotations\n\n"
        "from collections.abc import Iterator\n\n"
        + _tables(pure, inplace, views, metadata)
        + f'\n_OTHER = """\n{_block(others)}\n"""\n\n'
        f"RANDOM_OFF = {_random_off({*pure, *inplace})}\n"
        '"""Random overloads allowed only with their randomness off: overload -> (argument, '
        'value,\nwhether leaving the argument out means that value)."""\n'
        "OTHER_OPS = frozenset(_OTHER.split())\n"
        '"""Pure overloads outside ``aten`` (``<namespace>.<op>.<overload>``) a program may '
        'call."""\n'
        f"OTHER_MODULES = {{\n{modules}}}\n"
        '"""Namespace of `OTHER_OPS` -> the module whose import registers its operators."""\n'
        + _refused()
        + '"""``aten`` operators real models emit that stay off the list -> why '
        '(docs/trust.md)."""\n'
    )
    print(f"{out}: {len(pure)} pure, {len(inplace)} in-place, {len(views)} views", file=sys.stderr)


if __name__ == "__main__":
    main()
