"""Which recorded state a served call runs under: the server's word, matched to the artifact's.

An artifact's programs each serve one state (`ProgramEntry.state`, `capture.state`). A server
says the state of a call with ``runner.state(...)``, which returns a runner serving that state's
programs only (`replay.runtime.runner.Runner.state`); this module turns what the server wrote
into one of the artifact's state keys, or refuses it with the states the artifact knows:

- ``runner.state(adapter="b")``, ``runner.state(adapters_disabled=True)``,
  ``runner.state(tenant="x", training=True)``: the state's items (`capture.state`);
- ``runner.state("adapter=b")``: a state's label, as group names and ``capture summary`` show it;
- ``runner.state('{"adapter":"b"}')``: the key as the store holds it (``calls.state``);
- ``runner.state()`` or ``runner.state("default")``: the default state.

Needs no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from capture.errors import StateError
from capture.state import DEFAULT, state_key, state_label
from replay.runtime.guards import CallNotServed

__all__ = ["UnknownState", "resolve", "state_required", "describe_states"]


class UnknownState(CallNotServed, StateError):
    """A call asked for a state the artifact has no program of (or named none where it must)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, {"state": message})


def describe_states(known: Sequence[str]) -> str:
    """The states, by label, for messages (``adapter=a, adapter=b, adapters_disabled``)."""
    return ", ".join(sorted(state_label(k or None) for k in known))


def resolve(who: str, known: Sequence[str], state: str | None, items: Mapping[str, Any]) -> str:
    """The artifact's state key the server asks for.

    Args:
        who: The model (and sub-module) served, for messages.
        known: The artifact's state keys.
        state: A label, a key, ``"default"``, or None (then `items` say it).
        items: The state's items, when `state` is None.

    Raises:
        UnknownState: Both or neither form given wrongly, or a state the artifact does not
            serve (the message names those it does).
    """
    if state is not None and items:
        raise UnknownState(f"{who}: give the state as a name or as items, not both")
    if state is None:
        try:
            key = state_key(items) or DEFAULT
        except (TypeError, ValueError) as e:
            raise UnknownState(f"{who}: the state items {dict(items)!r} are not scalars") from e
    elif state in ("", "default"):
        key = DEFAULT
    elif state.startswith("{"):
        key = state
    else:
        labels = {state_label(k or None): k for k in known}
        key = labels.get(state, state)
    if key not in known:
        asked = state if state is not None else state_label(key or None)
        raise UnknownState(
            f"{who} has no program of the state {asked!r}; its states: {describe_states(known)}"
        )
    return key


def state_required(who: str, known: Sequence[str]) -> UnknownState:
    """The refusal of a call that names no state, to an artifact of several states."""
    first = min(state_label(k or None) for k in known)
    return UnknownState(
        f"{who} serves several states ({describe_states(known)}): say which a call runs under "
        f"with runner.state(...), e.g. runner.state({first!r})(*args, **kwargs)"
    )
