"""Call group names: what a group's calls pass, and the state they ran under.

``decode`` / ``prefill`` when the model has a cache argument (``past_key_values``, ``*_cache``)
holding tensors in some groups (``decode``) and missing or None in others (``prefill``); groups
that would share a name are told apart by the optional inputs they lack
(``decode_no_attention_mask``). Other models get ``g0``, ``g1``, ... by calls, largest first.

Where a model's calls ran under more than one state (`capture.state`: peft adapters,
``training``, a declared state), each group's name ends with its state's label after a ``+``
(``decode+adapter=b``, ``prefill+adapters_disabled``, ``g0+default``); a model recorded under one
state keeps the plain names. Names are unique within a model and safe as archive file names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from capture.analysis.symbols import unique_names
from capture.pytree.cachespec import is_cache_argument, is_cache_counter
from capture.pytree.recorded_structure import PRESENT, RecordedStructure
from capture.state import state_label


class Group(Protocol):
    """What naming reads of a call group (`capture.analysis.groups.Group` has it)."""

    @property
    def state(self) -> str: ...
    @property
    def structure(self) -> RecordedStructure: ...


__all__ = ["group_names", "STATE_SEPARATOR"]

STATE_SEPARATOR = "+"
"""Between a group's structure name and its state's label."""


def group_names(groups: Sequence[Group]) -> list[str]:
    """The name of each group of one model (sorted, largest first), unique within the model."""
    states = list(dict.fromkeys(g.state for g in groups))
    cache_args = _cache_arguments(groups)
    if len(states) < 2:
        return unique_names(_structure_names(groups, cache_args))
    names = [""] * len(groups)
    for state in states:
        members = [i for i, g in enumerate(groups) if g.state == state]
        label = state_label(state or None)
        mine = _structure_names([groups[i] for i in members], cache_args)
        for i, name in zip(members, mine, strict=True):
            names[i] = f"{name}{STATE_SEPARATOR}{label}"
    return unique_names(names)


def _holding(group: Group) -> set[str | None]:
    """The arguments holding tensors in the group's calls; a static cache's fill levels are
    tensors before its first update: not state."""
    return {leaf.argument for leaf in group.structure.tensors if not is_cache_counter(leaf.path)}


def _cache_arguments(groups: Sequence[Group]) -> set[str]:
    """The cache arguments holding tensors in some group ('use_cache', a bool, is not one)."""
    return {a for g in groups for a in _holding(g) if a and is_cache_argument(a)}


def _structure_names(groups: Sequence[Group], cache_args: set[str]) -> list[str]:
    """The name of each group of one state by its structure (sorted, largest first)."""
    statuses = [g.structure.argument_status() for g in groups]
    holding = [_holding(g) for g in groups]
    if not cache_args:
        return [f"g{i}" for i in range(len(groups))]
    bases = ["decode" if tensors & cache_args else "prefill" for tensors in holding]
    names = list(bases)
    for base in set(bases):
        members = [i for i, b in enumerate(bases) if b == base]
        if len(members) < 2:
            continue
        arguments = sorted({a for i in members for a in statuses[i]} - cache_args)
        varying = [
            a for a in arguments if len({statuses[i].get(a) == PRESENT for i in members}) > 1
        ]
        for i in members:
            absent = [a for a in varying if statuses[i].get(a) != PRESENT]
            names[i] = "_".join([base] + [f"no_{a}" for a in absent])
    return names
