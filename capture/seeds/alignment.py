"""Observed calls -> one set of aligned arguments and dynamic shapes (InputObserver's analysis).

Each call is normalised to its arguments by name with the method's signature, so ``model(x, y)``
and ``model(x, y=y)`` are the same two arguments. ``None``, an empty container and a keyword
scalar equal to its default count as *not passed*; `value_if_missing` supplies a value for an
argument a call did not pass.

The reference call is the one with the most tensors (the first one on ties): it must pass every
argument any call passed. Every argument must keep its pytree structure across the calls that pass
it (a leaf may be ``None`` in one call and a tensor in another: an uninitialised cache layer), each
tensor its rank and dtype, each scalar its value, since torch.export bakes scalars in as constants
(`capture.seeds.alignment_checks`). Anything else raises `ObservationMismatch` naming the key path
(``kwargs['past_key_values'].key_cache[2]``).

A dim is dynamic when it takes more than one value among the calls where its tensor is present
(`value_if_missing` values included), or when the caller asks for a dynamic batch dim: the aligned
calls become one size matrix (one row per observation, `ABSENT` where a call lacks a tensor) that
`capture.analysis.symbols.find_symbols` decides, as it does for a store's call groups; the default
call of `infer_arguments` is chosen by `capture.analysis.representative.choose_row`. What stays here
is seed-specific: arguments by name, defaults counted as not passed, `value_if_missing`, aligning
calls with different optional inputs, and the tuple-or-dict form of the results. The results mirror
the arguments: a tuple when every call was positional, else a dict in signature order (``*args``
elements under the ``*args`` name, ``**kwargs`` extras under the ``**kwargs`` name, as torch.export
wants); a registered class becomes the list of its children, so a `DynamicCache` gives a flat list
of ``2 * layers`` per-tensor dicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.utils._pytree as pytree

from capture.analysis.representative import choose_row
from capture.analysis.symbols import ABSENT, Axis, Symbols, find_symbols
from capture.errors import CaptureError, ObservationMismatch
from capture.pytree.shape_tree import dynamic_shapes_from_spec
from capture.schema import KIND_NONE, KIND_TENSOR
from capture.seeds.aligned import LeafAgg, Slot, View
from capture.seeds.alignment_checks import check_structure, merge_leaf
from capture.seeds.call_layout import ArgInfo, Observation
from capture.signature import Signature

__all__ = ["Aligner", "Analysis"]


# -- analysis -----------------------------------------------------------------------------------
@dataclass
class Analysis:
    """The aligned calls: argument order, reference call, per-leaf aggregates, result form.

    `matrix` has one row per view (in `views` order) and one column per axis of every tensor
    leaf of the reference call (`axes`; `ABSENT` where a view lacks the tensor); `symbols` is
    what `find_symbols` decides over it, without forced batch dims.
    """

    order: list[str]
    best: View
    views: list[View]
    leaves: dict[str, list[LeafAgg]]
    tuple_form: bool
    matrix: npt.NDArray[np.int64]
    axes: list[Axis]
    symbols: Symbols

    def row(self, obs: Observation) -> int:
        """The matrix row of an observation."""
        return next(i for i, v in enumerate(self.views) if v.obs is obs)


class Aligner:
    """Normalises and aligns observations for one signature and one `value_if_missing`.

    Args:
        signature: The observed method's signature.
        value_if_missing: Values for arguments a call does not pass, by name or position.

    Raises:
        CaptureError: `value_if_missing` names an argument the method does not take.

    Example:
        >>> def forward(x, mask=None): ...
        >>> Aligner(Signature.of(forward), {}).sig.names
        ('x', 'mask')
    """

    def __init__(self, signature: Signature, value_if_missing: Mapping[str | int, Any]) -> None:
        self.sig = signature
        self.fills: dict[str, tuple[ArgInfo, list[torch.Tensor]]] = {}
        for key, value in value_if_missing.items():
            name = self._fill_name(key)
            tensors = [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]
            self.fills[name] = (ArgInfo.of(value), tensors)

    def _fill_name(self, key: str | int) -> str:
        sig = self.sig
        if isinstance(key, int) and not isinstance(key, bool):
            if not 0 <= key < len(sig.positional):
                raise CaptureError(
                    f"value_if_missing[{key}]: the method has {len(sig.positional)} positional "
                    f"parameters {list(sig.positional)}"
                )
            return sig.positional[key]
        if not isinstance(key, str):
            raise CaptureError(f"value_if_missing keys are names or positions, not {key!r}")
        if key not in sig.names and not sig.var_keyword:
            raise CaptureError(
                f"value_if_missing[{key!r}]: the method takes no argument {key!r}; its "
                f"parameters are {list(sig.names)}"
            )
        return key

    def view(self, obs: Observation) -> View:
        """The arguments of one observation by name, with `value_if_missing` filled in."""
        sig, slots = self.sig, {}

        def dims_of(arg: ArgInfo) -> tuple[tuple[int, ...] | None, ...]:
            return tuple(obs.dims[i] if i >= 0 else None for i in arg.tensor_index)

        for i, arg in enumerate(obs.layout.positional):
            name = sig.positional_name(i)
            if not arg.is_empty():
                slots[name] = Slot(name, "positional", i, arg, dims_of(arg), None)
        for name, arg in obs.layout.keywords:
            if arg.is_empty():
                continue
            if arg.is_scalar() and name in sig.defaults:
                if arg.leaves[0].value == sig.defaults[name]:
                    continue  # the default: as if not passed
            slots[name] = Slot(name, "keyword", None, arg, dims_of(arg), None)
        for name, (arg, tensors) in self.fills.items():
            if name not in slots:
                fill = tuple(tuple(tensors[i].shape) if i >= 0 else None for i in arg.tensor_index)
                slots[name] = Slot(name, "filled", None, arg, fill, tensors)
        return View(obs, {n: slots[n] for n in sorted(slots, key=sig.order)})

    def align(self, views: list[View]) -> Analysis:
        """Checks the views against the reference call and aggregates every leaf.

        Raises:
            ObservationMismatch: See the module docstring.
        """
        # The most tensors; on ties the earliest call (given inputs, numbered -1, come last).
        best = max(views, key=lambda v: (v.n_tensors, -(v.obs.first % (1 << 62))))
        for view in views:
            for name, slot in view.slots.items():
                if name in best.slots:
                    continue
                self._check_absent(slot, view, best)
                raise ObservationMismatch(
                    f"no observed call passes every argument: {slot.path()} is passed in "
                    f"{view.label} but not in {best.label}, the call with the most tensors. "
                    "torch.export needs one set of arguments: pass InputObserver("
                    f"value_if_missing={{{name!r}: <a value, e.g. an empty tensor>}}) or "
                    "observe a call that passes all of them"
                )
        leaves: dict[str, list[LeafAgg]] = {}
        for name, ref in best.slots.items():
            aggs = [LeafAgg(info, best.obs.first) for info in ref.arg.leaves]
            for view in views:
                other = view.slots.get(name)
                if other is None:
                    self._check_absent(ref, best, view)
                    continue
                check_structure(ref, best, other, view)
                for agg, path, info, dims in zip(
                    aggs, ref.arg.paths, other.arg.leaves, other.dims, strict=True
                ):
                    merge_leaf(agg, info, dims, other.path(path), view)
            leaves[name] = aggs
        order = list(best.slots)
        positional = all(s.passed != "keyword" for v in views for s in v.slots.values())
        contiguous = all(n == self.sig.positional_name(i) for i, n in enumerate(order))
        matrix, axes = _size_matrix(best, views, leaves)
        return Analysis(
            order,
            best,
            views,
            leaves,
            positional and contiguous,
            matrix,
            axes,
            find_symbols(matrix, axes),
        )

    @staticmethod
    def representative(an: Analysis, observations: Sequence[Observation]) -> int:
        """The observation `infer_arguments` returns by default, as an index in `observations`.

        The seeds' rule, as options of `capture.analysis.representative.choose_row` over the stored
        calls' rows: the first call (one weight per call, ties to the earliest) passing the same
        arguments as the reference call, at any size; else the first call.
        """
        rows = [an.row(obs) for obs in observations]
        eligible = [set(an.views[r].slots) == set(an.best.slots) for r in rows]
        row, _ = choose_row(
            an.matrix[rows],
            np.ones(len(rows), dtype=np.int64),
            an.symbols.dynamic,
            eligible,
            min_dynamic=None,
            ties="first",
        )
        return row

    def _check_absent(self, present: Slot, where: View, absent: View) -> None:
        """A scalar argument passed in one call and not in another changes a constant."""
        if any(info.kind == KIND_TENSOR for info in present.arg.leaves):
            return  # a missing optional tensor: completed by `arguments`
        value = present.arg.leaves[0].value if present.arg.is_scalar() else "set"
        default = self.sig.defaults.get(present.name, "<no default>")
        raise ObservationMismatch(
            f"{present.path()} is {value!r} in {where.label} but not passed (default "
            f"{default!r}) in {absent.label}: torch.export bakes scalars into the program as "
            "constants, so one program cannot serve both; pass the same value in every call"
        )

    # -- results -----------------------------------------------------------------------------
    def dynamic_shapes(
        self, an: Analysis, set_batch_dimension_for: set[int | str] | bool | None
    ) -> tuple[Any, ...] | dict[str, Any]:
        """``{dim: Dim.DYNAMIC}`` per tensor, arranged like the arguments."""
        batch = self._batch_slots(set_batch_dimension_for, an)
        forced = [ax.axis == 0 and ax.argument in batch for ax in an.axes]
        symbols = find_symbols(an.matrix, an.axes, forced) if any(forced) else an.symbols
        dynamic = symbols.dynamic
        per_slot = {}
        for name in an.order:
            leaf_ds: list[dict[int, Any] | None] = []
            for agg in an.leaves[name]:
                if agg.info.kind != KIND_TENSOR:
                    leaf_ds.append(None)
                    continue
                dyn = [d for d in range(agg.info.rank) if dynamic[agg.column + d]]
                leaf_ds.append(dict.fromkeys(dyn, torch.export.Dim.DYNAMIC))
            per_slot[name] = dynamic_shapes_from_spec(an.best.slots[name].arg.spec, leaf_ds)
        if an.tuple_form and not any(self.sig.is_var_element(n) for n in an.order):
            return tuple(per_slot[n] for n in an.order)
        return self._nest(per_slot, an)

    def _batch_slots(self, which: set[int | str] | bool | None, an: Analysis) -> set[str]:
        if not which:
            return set()
        if which is True:
            return set(an.order)
        names = set()
        for item in which:
            if isinstance(item, int) and not isinstance(item, bool):
                name = self.sig.positional_name(item)
                if item < 0 or (item >= len(self.sig.positional) and name not in an.order):
                    raise CaptureError(
                        f"set_batch_dimension_for: no argument at position {item}; the "
                        f"arguments are {an.order}"
                    )
                names.add(name)
            elif item in an.order or item in self.sig.names:
                names.add(str(item))
            else:
                raise CaptureError(
                    f"set_batch_dimension_for: unknown argument {item!r}; the observed "
                    f"arguments are {an.order}"
                )
        return names

    def _nest(self, per_slot: dict[str, Any], an: Analysis) -> dict[str, Any]:
        """Dict form: ``*args`` elements under the ``*args`` name, extras under ``**kwargs``."""
        sig = self.sig
        out: dict[str, Any] = {}
        extras: dict[str, Any] = {}
        for name in an.order:
            if name in sig.names:
                out[name] = per_slot[name]
            elif sig.var_positional and sig.is_var_element(name):
                out[sig.var_positional] = (*out.get(sig.var_positional, ()), per_slot[name])
            else:
                extras[name] = per_slot[name]
        if extras and sig.var_keyword:
            if sig.var_keyword in out:
                raise CaptureError(
                    f"an argument is named {sig.var_keyword!r} like the method's "
                    f"**{sig.var_keyword}: dynamic shapes cannot tell them apart"
                )
            out[sig.var_keyword] = extras
        else:
            out.update(extras)
        return out

    def arguments(
        self,
        an: Analysis,
        view: View,
        tensors: Sequence[torch.Tensor],
        flat: bool = False,
        as_args_kwargs: bool = False,
    ) -> Any:
        """The arguments of `view` (whose tensors are `tensors`), completed and arranged."""
        values = {name: self._rebuild(an, name, view.slots.get(name), tensors) for name in an.order}
        if flat:
            return [t for t in pytree.tree_leaves(values) if isinstance(t, torch.Tensor)]
        if an.tuple_form:
            args = tuple(values[n] for n in an.order)
            return (args, {}) if as_args_kwargs else args
        n_args = 0
        for i, name in enumerate(an.order):
            if name in self.sig.positional_only or self.sig.is_var_element(name):
                n_args = i + 1
        if n_args and not as_args_kwargs:
            raise CaptureError(
                f"the arguments cannot be one dict: {an.order[n_args - 1]!r} can only be "
                "passed by position; call infer_arguments(as_args_kwargs=True)"
            )
        args = tuple(values[n] for n in an.order[:n_args])
        kwargs = {n: values[n] for n in an.order[n_args:]}
        return (args, kwargs) if as_args_kwargs else kwargs

    @staticmethod
    def _rebuild(
        an: Analysis, name: str, slot: Slot | None, tensors: Sequence[torch.Tensor]
    ) -> Any:
        ref = an.best.slots[name]
        source = slot if slot is not None else ref
        leaves = []
        for j, agg in enumerate(an.leaves[name]):
            info, index = source.arg.leaves[j], source.arg.tensor_index[j]
            if slot is not None and index >= 0:
                leaves.append((slot.tensors if slot.tensors is not None else tensors)[index])
            elif agg.info.kind == KIND_TENSOR:
                leaves.append(agg.empty(an.symbols.dynamic))
            elif info.kind == KIND_NONE:
                leaves.append(agg.info.value)
            else:
                leaves.append(info.value)
        return pytree.tree_unflatten(leaves, ref.arg.spec)


def _size_matrix(
    best: View, views: list[View], leaves: dict[str, list[LeafAgg]]
) -> tuple[npt.NDArray[np.int64], list[Axis]]:
    """One row per view, one column per axis of every tensor leaf (`ABSENT`: not in that view);
    sets each tensor aggregate's first column."""
    axes: list[Axis] = []
    for name, aggs in leaves.items():
        for agg, path in zip(aggs, best.slots[name].arg.paths, strict=True):
            if agg.info.kind == KIND_TENSOR:
                agg.column = len(axes)
                axes.extend(Axis(name, d, f"{name}{path}") for d in range(agg.info.rank))
    matrix = np.full((len(views), len(axes)), ABSENT, dtype=np.int64)
    for i, view in enumerate(views):
        for name, aggs in leaves.items():
            slot = view.slots.get(name)
            if slot is None:
                continue
            for agg, dims in zip(aggs, slot.dims, strict=True):
                if agg.column >= 0 and dims is not None:
                    matrix[i, agg.column : agg.column + len(dims)] = dims
    return matrix, axes
