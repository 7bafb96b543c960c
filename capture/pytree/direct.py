"""A cache of key/value layers built directly from its leaves, as its registration builds it.

Capture's registered unflatten of a layered cache (`capture.pytree.nodes`) reads its context
and runs each layer's constructor, the fill of its keys and values (`capture.pytree.layers`) and
``Cache.__init__`` on every call. For a context of key/value layers only (a ``DynamicCache``
of ``DynamicLayer``: no sliding window, fill level, linear-attention state or opaque layer),
what that leaves is each object's attributes: the constructor's (the same on every call) and,
per layer, the keys, values, their dtype and device, and ``is_initialized``. `layered_cache`
builds those attributes directly, in the order the constructors and the fill set them, under
these conditions, checked once per context on objects built by the constructors themselves:

- each object is a plain Python object (``object.__new__``, ``object.__setattr__``; no
  property among the attributes the fill sets): its attributes are its ``__dict__``;
- what each constructor leaves is immutable (None, bools, numbers, strings), the cache's list
  of layers aside: sharing those values between calls is sharing nothing;
- the layers have no ``max_cache_len`` or ``sliding_window`` (the fill reads sizes for those).

`capture.pytree.unflatten.builder` then proves the build on the first call (built both ways
from the same leaves, the same arrangement of the same objects) before it uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["layered_cache"]

_IMMUTABLE = (type(None), bool, int, float, str)
_FILLED = ("keys", "values", "dtype", "device", "is_initialized")
"""The attributes the fill of a layer's keys and values sets (`capture.pytree.layers.fill_kv`)."""


def _attributes(obj: Any, replaced: Sequence[str]) -> dict[str, Any] | None:
    """The constructor's attributes of `obj` when it is a plain object whose attributes other
    than `replaced` are immutable and none of `replaced` is a class-level descriptor; else None."""
    cls: Any = type(obj)
    if cls.__new__ is not object.__new__ or cls.__setattr__ is not object.__setattr__:
        return None
    if any(hasattr(type(getattr(cls, name, None)), "__set__") for name in replaced):
        return None
    if not hasattr(obj, "__dict__"):
        return None
    attributes = dict(vars(obj))
    if any(type(v) not in _IMMUTABLE for k, v in attributes.items() if k not in replaced):
        return None
    return attributes


def layered_cache(
    cache_cls: type, context: Any, count: int
) -> Callable[[Sequence[Any]], Any] | None:
    """A function from the `count` children (every key, then every value: tensors) of a cache
    of `cache_cls` recorded with `context` to the cache its registered unflatten builds; None
    where the context or the classes do not allow the direct build (module docstring)."""
    import transformers.cache_utils as cu

    from capture.pytree.layers import kv_only_layers

    try:
        layers = kv_only_layers(context)
    except (TypeError, ValueError):  # a context the registry reads otherwise: the usual path
        return None
    if not layers or count != 2 * len(layers):
        return None
    made = []
    for layer in layers:
        if hasattr(layer, "max_cache_len") or hasattr(layer, "sliding_window"):
            return None
        attributes = _attributes(layer, _FILLED)
        if attributes is None:
            return None
        made.append((type(layer), attributes))
    proto: Any = object.__new__(cache_cls)
    cu.Cache.__init__(proto, layers=[])
    cache_attributes = _attributes(proto, ("layers",))
    if cache_attributes is None:
        return None
    n = len(made)
    new = object.__new__

    def build(children: Sequence[Any]) -> Any:
        built = []
        for (cls, attributes), key, value in zip(made, children[:n], children[n:], strict=True):
            layer = new(cls)
            own = layer.__dict__
            own.update(attributes)
            own["keys"], own["values"] = key, value
            own["dtype"], own["device"] = key.dtype, key.device
            own["is_initialized"] = True
            built.append(layer)
        cache: Any = new(cache_cls)
        own = cache.__dict__
        own.update(cache_attributes)
        own["layers"] = built
        return cache

    return build
