"""Sub-modules recorded with ``Recorder(modules=...)``: which ones a store holds, and which object
of the model each one is (`replay.export(..., modules=True)` exports them with the model).

A sub-module ``encoder`` of a model recorded as ``T5ForConditionalGeneration`` is the store model
``T5ForConditionalGeneration.encoder``; replay finds it on the model as ``model.get_encoder()``
(how transformers' ``generate()`` reaches it) or, failing that, ``model.get_submodule("encoder")``.
"""

from __future__ import annotations

from typing import Any

from capture.errors import ReplayError
from replay.inputs.builder import reading

__all__ = ["recorded_submodules", "submodule"]


def recorded_submodules(store: Any, model: str) -> list[str]:
    """The names of the sub-modules of `model` the store holds recordings of, sorted.

    Args:
        store: A store path (or URI) or an open `capture.Store`.
        model: The model's name in the store.

    Returns:
        Sub-module names (``encoder``; ``vision.tower`` for a store model
        ``<model>.vision.tower``).

    Example:
        >>> recorded_submodules("capture-store", "T5ForConditionalGeneration")  # doctest: +SKIP
        ['encoder']
    """
    prefix = f"{model}."
    with reading(store) as opened:
        return [m.removeprefix(prefix) for m in opened.models() if m.startswith(prefix)]


def submodule(module: Any, name: str) -> Any:
    """The object recorded as sub-module `name`: ``module.get_<name>()``, else the sub-module
    at path `name`.

    Raises:
        ReplayError: The model has neither.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> submodule(model, "0")
        Linear(in_features=2, out_features=2, bias=True)
    """
    getter = getattr(module, f"get_{name}", None)
    if callable(getter):
        return getter()
    try:
        return module.get_submodule(name)
    except AttributeError as e:
        raise ReplayError(
            f"the store has recordings of sub-module {name!r}, but the model has no "
            f"get_{name}() and no sub-module {name!r}"
        ) from e
