"""ONNX translations of aten ops whose torch.onnx conversion does not compute what torch does.

``torch.onnx.export(..., dynamo=True)`` translates each aten op with onnxscript's torchlib.
Where that translation disagrees with the op's torch semantics, the ONNX file answers
differently from the program it was converted from; a function here replaces the translation
(``custom_translation_table``) and says why.

**scaled_dot_product_attention with a boolean mask** (checked on torch 2.13.0, onnxscript
0.7.2): torch returns **zeros** for a query row whose mask is all False (its math kernel's
``_safe_softmax``). onnxscript turns the mask into ``where(mask, 0, finfo.min)`` and applies
``Softmax``, so such a row attends *uniformly* to every key and returns the mean of the values.
transformers' sdpa attention masks the padded query rows of a left-padded prompt exactly so; the
first layer's outputs there differ, and every later layer's keys and values at the padded
positions with them (0.07-0.49 on a tiny Llama and GPT-2). Here the translated
output is multiplied by "does the row attend to anything" (1 or 0 per query row), which keeps
every other row bit for bit and gives torch's zeros for the fully masked ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["translation_table", "sdpa"]


def sdpa(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """``aten::scaled_dot_product_attention`` as torch computes it (module docstring).

    Traced by the ONNX exporter (onnxscript's trace mode): the arguments are graph values,
    the result is the graph value of the attention output.

    Args:
        query: ``(batch, heads, q_len, dim)``.
        key: ``(batch, kv_heads, kv_len, dim)``.
        value: ``(batch, kv_heads, kv_len, dim)``.
        attn_mask: None, a float mask added to the scores, or a boolean mask (True: attend).
        dropout_p: Dropout probability (0 in inference).
        is_causal: Apply a causal mask (exclusive with `attn_mask`).
        scale: The scores' scale (default ``1/sqrt(dim)``).
        enable_gqa: Repeat the key/value heads for grouped-query attention.

    Returns:
        The attention output, zero on every query row whose boolean mask is all False.

    Example:
        >>> table = translation_table()  # doctest: +SKIP
        >>> torch.onnx.export(ep, dynamo=True, custom_translation_table=table)  # doctest: +SKIP
    """
    import onnx_ir as ir
    from onnxscript import opset18
    from onnxscript.function_libs.torch_lib.ops.nn import aten_scaled_dot_product_attention

    op: Any = opset18  # traced: the values are graph values, not onnxscript's static types

    out = aten_scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
    )
    if attn_mask is None or attn_mask.dtype != ir.DataType.BOOL:
        return out
    # 1.0 where the query row attends to some key, 0.0 where its mask is all False; shaped
    # (..., q_len, 1), it broadcasts over the heads and the value dim like the mask does.
    attends = op.ReduceMax(
        op.Cast(attn_mask, to=query.dtype), op.Constant(value_ints=[-1]), keepdims=1
    )
    return op.Mul(out, attends)


# The exporter infers the ONNX signature from these annotations (onnxscript's types), so they
# are set here, where onnxscript is importable, rather than in the signature above.
def _annotate(function: Callable[..., Any]) -> Callable[..., Any]:
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat
    from onnxscript.onnx_types import TensorType

    function.__annotations__ = {
        "query": TFloat,
        "key": TFloat,
        "value": TFloat,
        "attn_mask": TensorType | None,
        "dropout_p": float,
        "is_causal": bool,
        "scale": float | None,
        "enable_gqa": bool,
        "return": TFloat,
    }
    return function


def translation_table() -> dict[Any, Callable[..., Any]]:
    """The ``custom_translation_table`` of every conversion (aten op -> translation).

    Returns:
        ``{torch.ops.aten.scaled_dot_product_attention.default: sdpa}``.

    Example:
        >>> sorted(str(op) for op in translation_table())  # doctest: +SKIP
        ['aten.scaled_dot_product_attention.default']
    """
    import torch

    return {torch.ops.aten.scaled_dot_product_attention.default: _annotate(sdpa)}
