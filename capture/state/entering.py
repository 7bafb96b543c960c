"""Putting a model in a recorded state (`capture.state`) for the export and check of its groups.

A call's answer may depend on the state it ran under: peft's active adapter(s), whether adapters
are disabled, ``training``, what the user declared with ``Recorder(..., state=fn)``. `entered`
puts the model in one recorded state and, on exit, back in the state it was in:

- peft adapters: on every tuner layer of the model, ``set_adapter(names)`` and
  ``enable_adapters(True)``; disabled adapters: ``enable_adapters(False)`` (what peft's own
  ``set_adapter()`` and ``disable_adapter()`` do to the layers). The layers' active adapters,
  disabled flag and the ``requires_grad`` of every parameter are restored after;
- ``training``: ``model.train(flag)``; every sub-module's own flag is restored after;
- declared items: the ``set_state`` callback of ``replay.export(..., set_state=fn)`` is called
  with them (``fn({"tenant": "a"})``), and with the state the model was in before on exit
  (``fn(None)``: what the callback's owner considers the model's normal state).

A state the model cannot be put in raises `StateNotEntered` (why, and what to pass): the export
reports that state's groups not covered with that reason, never exported under another state.

**A state's own weights.** An exported program holds the model's own parameter and buffer
tensors, not copies. A ``set_state`` that writes a state's weights into them in place (an adapter
merged, a scale copied in) would, when it puts the model back, change the programs already
exported in that state. `Entered.changed` lists the tensors entering changed in place (their
version counters moved), and `own_weights` gives a state's programs their own copy of those
tensors only, before the state is left: the artifact then holds the base weights once and each
state's differing tensors once (`replay.runtime.pt2.weights` stores equal bytes once).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from capture.errors import ReplayError
from capture.state import ADAPTER, ADAPTERS_DISABLED, RESERVED, TRAINING, parse_key, state_label
from capture.state.reading import peft_layers

__all__ = ["Entered", "SetState", "StateNotEntered", "entered", "own_weights"]

SetState = Callable[[dict[str, Any] | None], None]
"""``replay.export(..., set_state=fn)``: ``fn(items)`` puts the model in the state whose
declared items are `items`; ``fn(None)`` puts it back after the export of that state."""


class StateNotEntered(ReplayError):
    """The model cannot be put in a recorded state (its groups are not exported)."""


def _peft_names(layers: list[Any]) -> set[str]:
    """Every adapter name some tuner layer holds."""
    names: set[str] = set()
    for layer in layers:
        known = getattr(layer, "_all_available_adapter_names", None)
        if callable(known):
            names.update(str(n) for n in known())
    return names


def _check_peft(items: dict[str, Any], layers: list[Any], label: str) -> list[str] | None:
    """The adapter names the state activates (None: adapters disabled, or no peft item)."""
    if ADAPTER not in items and ADAPTERS_DISABLED not in items:
        return None
    if not layers:
        raise StateNotEntered(
            f"state {label}: the calls ran under peft adapters, and the model holds no peft "
            "tuner layer; export the peft model the calls were recorded on"
        )
    if items.get(ADAPTERS_DISABLED):
        return None
    value = items[ADAPTER]
    names = [value] if isinstance(value, str) else [str(v) for v in value]
    missing = sorted(set(names) - _peft_names(layers))
    if missing:
        raise StateNotEntered(
            f"state {label}: the model has no adapter {', '.join(map(repr, missing))}; load it "
            "(load_adapter) before the export"
        )
    return names


@dataclass
class Entered:
    """What entering a state did: the tensors it changed in place, by ``id`` (module doc)."""

    changed: set[int] = field(default_factory=set)


@contextlib.contextmanager
def entered(model: Any, state: str, set_state: SetState | None) -> Iterator[Entered]:
    """`model` in the recorded `state` inside the block, back in its own state after.

    Args:
        model: The model (or sub-module) whose calls were recorded.
        state: The state key (`capture.state`; ``""``: the default state).
        set_state: The user's callback for declared items, or None.

    Raises:
        StateNotEntered: The state names peft adapters the model lacks, or declared items and
            no `set_state` was passed, or `set_state` failed.
    """
    items = parse_key(state or None)
    label = state_label(state or None)
    declared = {k: v for k, v in items.items() if k not in RESERVED}
    if declared and set_state is None:
        raise StateNotEntered(
            f"state {label}: the calls ran under a declared state; pass set_state= to "
            "replay.export to put the model in it"
        )
    layers = peft_layers(model)
    names = _check_peft(items, layers, label)
    with contextlib.ExitStack() as stack:
        stack.callback(_restorer(model, layers))
        if layers and (ADAPTER in items or ADAPTERS_DISABLED in items):
            for layer in layers:
                if names is None:
                    layer.enable_adapters(False)
                else:
                    layer.set_adapter(names if len(names) > 1 else names[0])
                    layer.enable_adapters(True)
        train = getattr(model, "train", None)
        if callable(train) and isinstance(getattr(model, "training", None), bool):
            train(bool(items.get(TRAINING, False)))
        done = Entered()
        if set_state is not None and declared:
            versions = _versions(model)
            try:
                set_state(declared)
            except Exception as e:
                raise StateNotEntered(f"state {label}: set_state failed ({e})") from e
            stack.callback(set_state, None)
            done.changed = {i for i, (t, v) in versions.items() if t._version != v}
        yield done


def _versions(model: Any) -> dict[int, tuple[Any, int]]:
    """Every parameter and buffer of `model` with its version counter, by ``id``."""
    if not callable(getattr(model, "parameters", None)):
        return {}
    tensors = [*model.parameters(), *model.buffers()]
    return {id(t): (t, t._version) for t in tensors}


def own_weights(programs: Iterable[Any], entered: Entered) -> None:
    """Gives each of `programs` (exported in the entered state) its own copy of the tensors
    entering that state changed in place, so that leaving it changes none of their weights."""
    if not entered.changed:
        return
    import torch

    for program in programs:
        for table in (program.state_dict, program.constants):
            for name, tensor in list(table.items()):
                if id(tensor) in entered.changed:
                    copy = tensor.detach().clone()
                    if isinstance(tensor, torch.nn.Parameter):
                        copy = torch.nn.Parameter(copy, requires_grad=tensor.requires_grad)
                    table[name] = copy


def _restorer(model: Any, layers: list[Any]) -> Callable[[], None]:
    """A function that puts back the flags `entered` may change."""
    modules = list(model.modules()) if callable(getattr(model, "modules", None)) else []
    training = [(m, m.training) for m in modules]
    grads = [(p, p.requires_grad) for p in model.parameters()] if modules else []
    adapters = [(layer, layer._active_adapter, layer._disable_adapters) for layer in layers]

    def restore() -> None:
        for m, flag in training:
            m.training = flag
        for p, flag in grads:
            p.requires_grad_(flag)
        for layer, active, disabled in adapters:
            layer._active_adapter = active
            layer._disable_adapters = disabled

    return restore
