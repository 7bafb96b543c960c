"""Sub-modules recorded with ``Recorder(modules=...)``: which ones a store holds, and which object
of the model each one is (`replay.export(..., modules=True)` exports them with the model).

A sub-module ``encoder`` of a model recorded as ``T5ForConditionalGeneration`` is the store model
``T5ForConditionalGeneration.encoder``; replay finds it on the model as ``model.get_encoder()``
(how transformers' ``generate()`` reaches it) or, failing that, ``model.get_submodule("encoder")``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from capture.errors import ReplayError

if TYPE_CHECKING:
    from capture.store.reader import StoreReader

__all__ = ["recorded_submodules", "submodule"]


def recorded_submodules(store: StoreReader, model_name: str) -> list[str]:
    """The names of the sub-modules of `model_name` the store holds recordings of, sorted.

    Args:
        store: The open store.
        model_name: The model's name in the store.

    Returns:
        Sub-module names (``encoder``; ``vision.tower`` for a store model
        ``<model>.vision.tower``).

    Example:
        >>> recorded_submodules(open_store("capture-store"), "T5ForConditionalGeneration")
        ... # doctest: +SKIP
        ['encoder']
    """
    prefix = f"{model_name}."
    return [m.removeprefix(prefix) for m in store.models() if m.startswith(prefix)]


def submodule(model: Any, module_name: str) -> Any:
    """The object recorded as sub-module `module_name`: ``model.get_<module_name>()``, else
    the sub-module at path `module_name`.

    Raises:
        ReplayError: The model has neither.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> submodule(model, "0")
        Linear(in_features=2, out_features=2, bias=True)
    """
    getter = getattr(model, f"get_{module_name}", None)
    if callable(getter):
        return getter()
    try:
        return model.get_submodule(module_name)
    except AttributeError as e:
        raise ReplayError(
            f"the store has recordings of sub-module {module_name!r}, but the model has no "
            f"get_{module_name}() and no sub-module {module_name!r}"
        ) from e
