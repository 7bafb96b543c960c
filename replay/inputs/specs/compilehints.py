"""torch.compile warm start: dynamic marks with the recorded ranges, applied to live calls.

``torch.compile`` specializes on the sizes of the first call and recompiles when a later call
differs (automatic dynamic shapes), once per newly varying dim, or more where sizes reach 0 or
1. A store knows before the first request which dims vary and within which ranges. `CompileHints`
carries, per call group, the group's recorded call structure and one mark per dynamic axis
(tensor, axis, recorded min and max, the size most calls had as hint). `CompileHints.apply`
registers a forward pre-hook on the module: each incoming call is described as the recorder
describes it (`capture.record.flatten`, so a transformers cache's tensors are reached), matched
to its group by structure (the rule `replay.runtime.guards.ProgramGuard.matches` applies), and
each marked tensor gets ``torch._dynamo.mark_dynamic(t, axis, min=, max=)`` before the
compiled ``forward`` sees it. An axis recorded at 0 or 1 gets
``torch._dynamo.decorators.mark_unbacked(t, axis, min=, max=)`` instead: a backed dynamic
size of 1 is specialized by dynamo (``mark_dynamic`` then fails with "your code specialized it
to be a constant (1)"), an unbacked one is not, so batch 1 and batch 4 share one graph. A size
outside the recorded range is marked without the range (dynamic, unbounded): the compiled graph
serves the call instead of being told a wrong range. A call of no recorded group is left alone.

Dynamo reads marks from the tensors it is given, so the hook must run before the compiled
function: ``module.forward = torch.compile(module.forward)`` (or ``torch.compile(module)``,
whose wrapper calls the module's hooks first). The hints are data (`to_json` / `from_json`):
``capture hints`` prints them, a server loads them without the store.

This module imports torch only in `CompileHints.apply`'s hook.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from capture import compat, untrusted
from capture.errors import ReplayError
from replay.inputs import select
from replay.runtime.guards import leaf_key

__all__ = ["Mark", "GroupHints", "CompileHints", "compile_hints", "FORMAT"]

FORMAT = "capture-compile-hints"
_VERSION = 1


@dataclass(frozen=True)
class Mark:
    """One dynamic axis of a group's calls.

    Attributes:
        tensor: The tensor's position among the call's tensors (leaf order).
        path: Its key path (``kwargs['past_key_values'].key_cache[0]``).
        axis: The axis.
        min: Smallest recorded size.
        max: Largest recorded size.
        hint: The size most calls had.
        unbacked: The axis was recorded at 0 or 1: marked unbacked (module docstring).
    """

    tensor: int
    path: str
    axis: int
    min: int
    max: int
    hint: int
    unbacked: bool = False


@dataclass(frozen=True)
class GroupHints:
    """A call group's structure (to recognize its calls) and its marks."""

    group: str
    calls: int
    treespec: str | None
    signature: str | None
    leaves: tuple[tuple[Any, ...], ...]
    marks: tuple[Mark, ...]


@dataclass
class CompileHints:
    """Dynamic marks per call group, for ``torch.compile`` (module docstring).

    Attributes:
        model_name: The model name in the store.
        groups: One `GroupHints` per call group, most calls first.
    """

    model_name: str
    groups: list[GroupHints]
    _seen: dict[Any, tuple[int, tuple[int, ...] | None] | None] = field(
        default_factory=dict, repr=False, compare=False
    )

    def group_of(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[int | None, list[Any]]:
        """The index of the group whose structure the call has (None: none), and the call's
        tensors in the group's leaf order; cached per call layout (containers, keyword order,
        dtypes, ranks)."""
        from capture.record.flatten import tensor_key, walk

        tensors: list[Any] = []
        key: list[Any] = [len(args)]
        walk(tuple(args), tensors, key)
        walk(kwargs, tensors, key)
        layout, _ = tensor_key(key, tensors, devices=False)
        if layout not in self._seen:
            self._seen[layout] = self._match(tuple(args), kwargs, tensors)
        found = self._seen[layout]
        if found is None:
            return None, tensors
        index, order = found
        return index, tensors if order is None else [tensors[i] for i in order]

    def _match(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], tensors: list[Any]
    ) -> tuple[int, tuple[int, ...] | None] | None:
        """The first group whose structure the call has, and where its tensors move: the call
        is described as the recorder describes it, its keywords in the group's signature order
        (`capture.record.flatten.in_keyword_order`: generate() need not pass them in it)."""
        from capture.record.flatten import describe, in_keyword_order
        from capture.signature import Signature

        for i, g in enumerate(self.groups):
            signature = Signature.loads(g.signature) if g.signature else Signature()
            moved = in_keyword_order((args, kwargs), signature)
            call, order = moved if moved is not None else ((args, kwargs), None)
            ordered = list(tensors) if order is None else [tensors[k] for k in order]
            st = describe(call, ordered, signature=signature)
            if st.treespec == g.treespec and leaf_key(st.leaves) == g.leaves:
                return i, order
        return None

    def mark(self, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
        """Marks the dynamic dims of one call's tensors; returns its group's name (or None)."""
        import torch

        index, tensors = self.group_of(args, kwargs)
        if index is None:
            return None
        group = self.groups[index]
        for m in group.marks:
            t = tensors[m.tensor]
            bounds = {"min": m.min, "max": m.max} if m.min <= t.shape[m.axis] <= m.max else {}
            if m.unbacked:
                compat.mark_unbacked(t, m.axis, bounds)
            else:
                torch._dynamo.mark_dynamic(t, m.axis, **bounds)
        return group.group

    def apply(self, model: Any) -> Any:
        """Registers the forward pre-hook that marks every call (module docstring).

        Returns:
            The hook's handle (``handle.remove()`` takes the hints off).

        Example:
            >>> hints = replay.compile_hints("capture-store")  # doctest: +SKIP
            >>> hints.apply(model)  # doctest: +SKIP
            >>> model.forward = torch.compile(model.forward)  # doctest: +SKIP
        """

        def hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.mark(args, kwargs)

        return model.register_forward_pre_hook(hook, with_kwargs=True)

    def to_json(self) -> str:
        """The hints as a JSON document (``capture hints`` prints it)."""
        return json.dumps(
            {
                "format": FORMAT,
                "version": _VERSION,
                "model": self.model_name,
                "groups": [
                    {**asdict(g), "leaves": [list(leaf) for leaf in g.leaves]} for g in self.groups
                ],
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> CompileHints:
        """Hints read back from `to_json`'s document.

        Raises:
            ReplayError: Not such a document (the message says what is wrong).
        """
        try:
            doc = untrusted.loads(text)
            if doc.get("format") != FORMAT or doc.get("version") != _VERSION:
                raise ReplayError(
                    f"not a {FORMAT} document of version {_VERSION}; print one with `capture hints`"
                )
            groups = [
                GroupHints(
                    str(g["group"]),
                    int(g["calls"]),
                    g["treespec"],
                    g["signature"],
                    tuple(tuple(leaf) for leaf in g["leaves"]),
                    tuple(Mark(**m) for m in g["marks"]),
                )
                for g in doc["groups"]
            ]
            return cls(str(doc["model"]), groups)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ReplayError(f"compile hints cannot be read: {type(e).__name__}: {e}") from None


def _hints(group: Any) -> GroupHints:
    rows = select.signatures(group)
    tensors = [leaf.leaf for leaf in group.structure.leaves if leaf.is_tensor]
    ordinal = {leaf: k for k, leaf in enumerate(tensors)}
    marks = []
    for j, d in enumerate(group.dims):
        if not d.dynamic or d.min == d.max:
            continue
        weights: Counter[int] = Counter()
        for sizes, n in rows:
            weights[int(sizes[j])] += n
        hint = max(weights, key=lambda v: (weights[v], v))
        marks.append(
            Mark(ordinal[d.leaf], d.path, d.axis, int(d.min), int(d.max), hint, int(d.min) <= 1)
        )
    st = group.structure
    return GroupHints(
        group.name, int(group.calls), st.treespec, st.signature, leaf_key(st.leaves), tuple(marks)
    )


def compile_hints(store: Any, model_name: str | None = None) -> CompileHints:
    """The dynamic marks of every call group of a recorded model, for ``torch.compile``.

    Args:
        store: A store path (or URI) or an open `capture.Store`.
        model_name: The model name in the store; optional when it holds one model.

    Returns:
        A `CompileHints`; ``apply(model)`` before ``torch.compile`` (module docstring).

    Raises:
        StoreNotFound, EmptyStore, UnknownModel: The store or model cannot be found.
        ReplayError: The model has no analysable recorded call.

    Example:
        >>> hints = compile_hints("capture-store", "LlamaForCausalLM")  # doctest: +SKIP
        >>> [(m.path, m.axis, m.min, m.max) for m in hints.groups[0].marks][:1]  # doctest: +SKIP
        [("kwargs['input_ids']", 0, 1, 4)]
    """
    from capture.analysis.groups import analyze
    from replay.inputs.builder import reading, resolve_model

    with reading(store) as opened:
        name = resolve_model(opened, model_name)
        groups = analyze(opened, name)
        if not groups:
            raise ReplayError(f"model {name} has no analysable recorded call in {opened.path}")
        return CompileHints(name, [_hints(g) for g in groups])
