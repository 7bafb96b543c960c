"""`string_type`: a one-line description of nested inputs, in the seeds' notation.

``T1s2x6`` is a float32 tensor of shape ``(2, 6)``: ``T`` (``F`` for a FakeTensor, ``A`` for a
numpy array), the element type as an ONNX ``TensorProto`` code (1 float32, 7 int64, 9 bool,
10 float16, 11 float64, 16 bfloat16, ...), then ``s`` and the shape (``r`` and the rank when
``with_shape=False``). Containers: ``(a,b)`` tuples, ``#2[a,b]`` lists, ``dict(x:a,y:b)``
dicts, ``{0:DYNAMIC}`` dynamic shapes; transformers caches print their keys and values, e.g.
``DynamicCache(key_cache=#2[T1s1x4x10x32,...], value_cache=#2[...])``. Scalars print their type
(``int``, ``float``, ``bool``, ``str``), or ``int=3`` with ``with_min_max=True``.

The module imports neither torch nor transformers: classes are recognised by name
(``type(obj).__name__``; caches through the registry, `capture.pytree.cachespec`) and torch is
imported only once an object needs it, which means torch is already loaded.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from capture import compat
from capture.errors import CaptureError
from capture.pytree.cachespec import KEY_VALUE, cache_spec

__all__ = ["string_type", "onnx_dtype_code", "ONNX_DTYPE_CODES"]

ONNX_DTYPE_CODES: dict[str, int] = {
    "float32": 1,
    "uint8": 2,
    "int8": 3,
    "uint16": 4,
    "int16": 5,
    "int32": 6,
    "int64": 7,
    "bool": 9,
    "float16": 10,
    "float64": 11,
    "uint32": 12,
    "uint64": 13,
    "complex64": 14,
    "complex128": 15,
    "bfloat16": 16,
    "float8_e4m3fn": 17,
    "float8_e4m3fnuz": 18,
    "float8_e5m2": 19,
    "float8_e5m2fnuz": 20,
    "uint4": 21,
    "int4": 22,
    "float4_e2m1fn_x2": 23,
}
"""ONNX ``TensorProto`` element type codes, keyed by torch/numpy dtype name."""


def onnx_dtype_code(dtype: Any) -> int:
    """The ONNX ``TensorProto`` code of a torch or numpy dtype (``torch.float32`` -> 1).

    Args:
        dtype: A ``torch.dtype``, a ``numpy.dtype`` or a dtype name.

    Returns:
        The integer code (``TensorProto.FLOAT`` is 1, ``INT64`` 7, ``BOOL`` 9, ...).

    Raises:
        CaptureError: The dtype has no ONNX counterpart.

    Example:
        >>> onnx_dtype_code("int64")
        7
    """
    name = str(dtype).rsplit(".", 1)[-1]
    name = {"float": "float32", "double": "float64", "half": "float16", "long": "int64"}.get(
        name, name
    )
    code = ONNX_DTYPE_CODES.get(name)
    if code is None:
        raise CaptureError(f"dtype {dtype} has no ONNX TensorProto code")
    return code


def string_type(
    obj: Any,
    with_shape: bool = False,
    with_min_max: bool = False,
    with_device: bool = False,
    ignore: bool = False,
    limit: int = 20,
) -> str:
    """Describes the type (and shapes) of a nested object in one line.

    Args:
        obj: Anything the model receives: tensors, containers, scalars, transformers caches.
        with_shape: Show tensor shapes (``T1s2x6``) rather than ranks (``T1r2``).
        with_min_max: Append ``[min,max:Amean]`` to tensors and ``=value`` to scalars.
        with_device: Prefix tensors with ``C`` (CPU) or ``G`` (GPU).
        ignore: Print ``Name(...)`` for an unknown type instead of raising.
        limit: Containers with this many elements or more show their first one only
            (``#30[T1s2,...]``).

    Returns:
        The description, e.g. ``dict(x:T1s2x8,labels:T7s2)``.

    Raises:
        CaptureError: `obj` contains a type this function does not know and `ignore` is False.

    Example:
        >>> string_type((1, ["r", 6.6]))
        '(int,#2[str,float])'
        >>> string_type({"n": None, "b": True}, with_min_max=True)
        'dict(n:None,b:bool=True)'
    """
    return _Formatter(with_shape, with_min_max, with_device, ignore, limit).run(obj)


class _Formatter:
    def __init__(
        self, with_shape: bool, with_min_max: bool, with_device: bool, ignore: bool, limit: int
    ) -> None:
        self.with_shape = with_shape
        self.with_min_max = with_min_max
        self.with_device = with_device
        self.ignore = ignore
        self.limit = limit

    def run(self, obj: Any) -> str:
        if obj is None:
            return "None"
        tp = type(obj)
        if tp is tuple or (isinstance(obj, tuple) and not hasattr(obj, "_fields")):
            return self._tuple(obj)
        if isinstance(obj, list):
            return self._list(obj)
        if isinstance(obj, set | frozenset):
            if len(obj) >= 10:
                return f"{{...}}#{len(obj)}" if self.with_shape else "{...}"
            return "{" + ",".join(self.run(o) for o in obj) + "}"
        if tp is dict:
            return self._dict(obj)
        if isinstance(obj, bool | int | float | str):
            return self._scalar(obj)
        if isinstance(obj, slice):
            return "slice"
        name = tp.__name__
        if name == "ndarray":
            return self._array(obj)
        if "torch" in sys.modules:
            text = self._torch(obj)
            if text is not None:
                return text
        text = self._named(obj, name)
        if text is not None:
            return text
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            values = {
                f.name: getattr(obj, f.name, None)
                for f in dataclasses.fields(obj)
                if getattr(obj, f.name, None) is not None
            }
            return f"{name}{self._dict(values)[4:]}" if values else f"{name}()"
        if isinstance(obj, tuple):  # a namedtuple
            return f"{name}{self._tuple(tuple(obj))}"
        if self.ignore:
            return f"{name}(...)"
        raise CaptureError(
            f"string_type does not know how to print a {tp.__module__}.{tp.__qualname__}; "
            "pass ignore=True to print it as Name(...)"
        )

    # -- containers ------------------------------------------------------------------------
    def _tuple(self, obj: tuple[Any, ...]) -> str:
        if len(obj) == 1:
            return f"({self.run(obj[0])},)"
        if len(obj) < self.limit:
            return "(" + ",".join(self.run(o) for o in obj) + ")"
        return f"#{len(obj)}({self.run(obj[0])},...){self._seq_range(obj)}"

    def _list(self, obj: list[Any]) -> str:
        if len(obj) < self.limit:
            return f"#{len(obj)}[" + ",".join(self.run(o) for o in obj) + "]"
        return f"#{len(obj)}[{self.run(obj[0])},...]{self._seq_range(obj)}"

    def _seq_range(self, obj: Any) -> str:
        if not self.with_min_max or not all(isinstance(o, bool | int | float) for o in obj):
            return ""
        return f"[{min(obj)},{max(obj)}:A{sum(float(o) for o in obj) / len(obj)}]"

    def _dict(self, obj: dict[Any, Any]) -> str:
        if not obj:
            return "{}"
        if all(isinstance(k, int) for k in obj):
            # Integer keys: a dynamic shape ({0: Dim.DYNAMIC}) or an index -> value mapping.
            rows = []
            for k, v in obj.items():
                rows.append(f"{k}:DYN({v})" if isinstance(v, str) else f"{k}:{self.run(v)}")
            return "{" + ",".join(rows) + "}"
        return "dict(" + ",".join(f"{k}:{self.run(v)}" for k, v in obj.items()) + ")"

    def _scalar(self, obj: bool | int | float | str) -> str:
        name = type(obj).__name__ if type(obj) in (bool, int, float, str) else None
        if name is None:  # subclasses (IntEnum, ...): print the base type
            name = next(t.__name__ for t in (bool, int, float, str) if isinstance(obj, t))
        if self.with_min_max and name != "str":
            return f"{name}={obj}"
        return name

    # -- tensors -----------------------------------------------------------------------------
    def _shape(self, prefix: str, code: Any, shape: Any) -> str:
        if not self.with_shape:
            return f"{prefix}{code}r{len(shape)}"
        return f"{prefix}{code}s{'x'.join(str(d) for d in shape)}"

    def _array(self, obj: Any) -> str:
        s = self._shape("A", onnx_dtype_code(obj.dtype), obj.shape)
        if not self.with_min_max:
            return s
        if obj.size == 0:
            return f"{s}[empty]"
        return f"{s}[{obj.min()},{obj.max()}:A{obj.astype(float).mean()}]"

    def _torch(self, obj: Any) -> str | None:
        import torch

        if isinstance(obj, torch.Tensor):
            return self._tensor(obj)
        export = torch.export
        kind = compat.dim_kind(obj)  # Dim objects have no public type (a private torch API)
        if kind == "derived":
            return "DerivedDim"
        if kind == "dim":
            return f"Dim({obj.__name__})"
        if kind == "hint":
            if obj == export.Dim.DYNAMIC:
                return "DYNAMIC"
            if obj == export.Dim.AUTO:
                return "AUTO"
            return str(obj)
        if isinstance(obj, torch.SymInt):
            return "SymInt"
        if isinstance(obj, torch.SymFloat):
            return "SymFloat"
        if isinstance(obj, torch.nn.Module):
            return f"{type(obj).__name__}(...)"
        if isinstance(obj, torch.device | torch.dtype | torch.memory_format | torch.layout):
            return f"{type(obj).__name__}({obj})"
        return None

    def _tensor(self, obj: Any) -> str:
        import torch

        kind = "F" if type(obj).__name__ == "FakeTensor" else "T"
        prefix = ""
        if self.with_device:
            prefix = "G" if obj.device.type not in ("cpu", "meta") else "C"
        s = self._shape(f"{prefix}{kind}", onnx_dtype_code(obj.dtype), obj.shape)
        if not self.with_min_max or kind == "F":
            return s
        if obj.dim() == 0:
            return f"{s}={obj.item()}"
        if obj.numel() == 0:
            return f"{s}[empty]"
        values = obj.detach()
        if values.is_complex():
            values = values.abs()
        flat = values.reshape(-1)
        nans = int(flat.isnan().sum()) if flat.is_floating_point() else 0
        if nans:
            flat = flat[~flat.isnan()]
            if flat.numel() == 0:
                return f"{s}[N{nans}nans]"
            mean = flat.to(torch.float64).mean()
            return f"{s}[{flat.min()},{flat.max()}:A{mean}N{nans}nans]"
        return f"{s}[{flat.min()},{flat.max()}:A{flat.to(torch.float64).mean()}]"

    # -- classes known by name: the cache registry's, and transformers' input containers -----
    def _named(self, obj: Any, name: str) -> str | None:
        spec = cache_spec(name)
        if spec is not None and spec.fields == KEY_VALUE:
            if hasattr(obj, "layers"):
                keys = [getattr(layer, "keys", None) for layer in obj.layers]
                values = [getattr(layer, "values", None) for layer in obj.layers]
                text = f"{name}(key_cache={self.run(keys)}, value_cache={self.run(values)}"
                linear = [layer for layer in obj.layers if hasattr(layer, "conv_states")]
                if linear:  # state-space layers: their states, every state index
                    conv = [v for layer in linear for v in layer.conv_states.values()]
                    rec = [v for layer in linear for v in layer.recurrent_states.values()]
                    text += f", conv_states={self.run(conv)}, recurrent_states={self.run(rec)}"
                return text + ")"
            if hasattr(obj, "key_cache"):
                kc, vc = self.run(list(obj.key_cache)), self.run(list(obj.value_cache))
                return f"{name}(key_cache={kc}, value_cache={vc})"
        elif spec is not None and spec.fields:
            parts = ", ".join(f"{f}={self.run(getattr(obj, f))}" for f in spec.fields)
            return f"{name}({parts})"
        if name in ("BatchEncoding", "BatchFeature"):
            return f"{name}(data={self.run(dict(obj.data))})"
        return None
