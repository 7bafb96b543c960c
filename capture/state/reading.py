"""Reads the state a call runs under, on the recorder's hot path (`capture.state`: the format).

What is read, found once when the recorder starts, never configured:

- ``training`` of the recorded module (an attribute read);
- for a model holding peft tuner layers (a ``peft.PeftModel``, or the model inside one, or any
  module peft's ``inject_adapter_in_model`` changed): the first tuner layer's active adapter(s)
  and whether adapters are disabled. peft's ``set_adapter()`` and ``disable_adapter()`` set both
  on every tuner layer, so one layer tells (two attribute reads). peft is looked for among the
  modules already imported: a model without it costs nothing;
- what the user declares: ``Recorder(..., state=fn)``, ``fn()`` returning a few scalars.

The key of each distinct reading is built and checked once (`capture.state.declared_items`) and
kept in a dict: a call costs the reads and one lookup. A reading that fails raises, and the
recorder counts it and leaves that call unrecorded (never recorded under a wrong state).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from capture.state import ADAPTER, ADAPTERS_DISABLED, TRAINING, declared_items, state_key

__all__ = ["has_training", "peft_layers", "state_reader", "TRAINING_KEY"]

TRAINING_KEY = state_key({TRAINING: True})
"""The key of a module in training mode with nothing else to read."""

_MAX_CACHED = 4_096
"""Distinct readings whose key is kept; beyond, a key is built per call (still correct)."""


def peft_layers(model: Any) -> list[Any]:
    """The peft tuner layers (``BaseTunerLayer``) inside `model`, in module order; [] when peft
    was never imported or `model` is not a module."""
    tuners = sys.modules.get("peft.tuners.tuners_utils")
    base = getattr(tuners, "BaseTunerLayer", None)
    modules = getattr(model, "modules", None)
    if base is None or not callable(modules):
        return []
    try:
        return [m for m in modules() if isinstance(m, base)]
    except TypeError:  # a `modules` attribute that is not nn.Module's
        return []


def has_training(model: Any) -> bool:
    """Whether `model` has a ``training`` flag to read (a ``torch.nn.Module``)."""
    return isinstance(getattr(model, "training", None), bool)


def state_reader(model: Any, declared: Callable[[], Any] | None) -> Callable[[], str | None] | None:
    """The function that returns a call's state key (None: the default state), or None when
    there is no peft layer and no ``state=`` callable: then at most ``training`` is read, which
    the recorder reads itself, inline (`TRAINING_KEY`; a function call would cost more than
    the read)."""
    layers = peft_layers(model)
    if not layers and declared is None:
        return None
    watched = model if has_training(model) else None
    return _full_reader(watched, layers[0] if layers else None, declared)


def _full_reader(
    model: Any, layer: Any, declared: Callable[[], Any] | None
) -> Callable[[], str | None]:
    cache: dict[Any, str | None] = {}

    def read() -> str | None:
        training = model is not None and model.training
        adapters: Any = None
        if layer is not None:
            active = layer._active_adapter
            if layer._disable_adapters:
                adapters = True
            else:
                adapters = active if type(active) is str else tuple(active)
        user = declared() if declared is not None else None
        reading = (training, adapters, tuple(user.items()) if type(user) is dict else user)
        key = cache.get(reading, cache)  # the cache itself: not seen yet
        if key is not cache:
            return key  # type: ignore[return-value]
        key = _key(training, adapters, user)
        if len(cache) < _MAX_CACHED:
            cache[reading] = key
        return key

    return read


def _key(training: bool, adapters: Any, user: Any) -> str | None:
    """The key of one reading, its declared items checked."""
    items: dict[str, Any] = dict(declared_items(user)) if user is not None else {}
    if training:
        items[TRAINING] = True
    if adapters is True:
        items[ADAPTERS_DISABLED] = True
    elif isinstance(adapters, str):
        items[ADAPTER] = adapters
    elif adapters is not None:
        names = [str(a) for a in adapters]
        items[ADAPTER] = names[0] if len(names) == 1 else names
    return state_key(items)
