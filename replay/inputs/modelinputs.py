"""`ModelInputs` and `all_dynamic_shape_from_inputs`: dynamic shapes from example inputs.

The seeds' offline helpers: given a few sets of valid inputs (no recording, no store),
`ModelInputs.guess_dynamic_shapes` marks the dims that differ between them, and
`all_dynamic_shape_from_inputs` marks every dim of one set of inputs as dynamic with a name.

Both build dynamic shapes the way torch.export accepts them with this project's pytree
registrations (`capture.pytree.nodes`): tuples, lists and dicts mirror the inputs, and a registered
class becomes the list of its children, so a transformers `DynamicCache` or `StaticCache` with
L layers gives a *flat* list of ``2 * L`` per-tensor dicts (keys first, then values). Older
libraries printed the nested ``[[keys...], [values...]]`` form (seed 004); torch.export rejects
that form for our registration.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from capture.analysis.symbols import Axis, find_symbols
from capture.errors import CaptureError, ObservationMismatch
from capture.pytree.shape_tree import dynamic_shapes_from_spec, dynamic_shapes_like, registered
from capture.signature import POSITIONAL_ONLY, Signature

__all__ = ["ModelInputs", "all_dynamic_shape_from_inputs"]

DynamicShapes = tuple[tuple[Any, ...], dict[str, Any]]
_SCALARS = (bool, int, float, str)


def all_dynamic_shape_from_inputs(inputs: Any, dim_prefix: Any = "d") -> Any:
    """Dynamic shapes marking every dim of every tensor in `inputs` as dynamic.

    Tensors are numbered in pytree order; dim ``j`` of tensor ``i`` is named
    ``f"{dim_prefix}_{i}_{j}"``. A cache gives the flat list of its tensors' dicts (see the
    module docstring: the seeds show an older nested form).

    Args:
        inputs: A tuple, a dict or any pytree of tensors (transformers caches included).
        dim_prefix: A string prefix for the names, or a value to use for every dim
            (``torch.export.Dim.DYNAMIC``, ``torch.export.Dim.AUTO``).

    Returns:
        The dynamic shapes, with the structure of `inputs`; None for non-tensor leaves.

    Example:
        >>> import torch
        >>> all_dynamic_shape_from_inputs({"x": torch.zeros(2, 3), "n": 1})
        {'x': {0: 'd_0_0', 1: 'd_0_1'}, 'n': None}
    """
    counter = iter(range(1 << 62))

    def leaf(value: Any) -> dict[int, Any] | None:
        if not isinstance(value, torch.Tensor):
            return None
        if isinstance(dim_prefix, str):
            i = next(counter)
            return {j: f"{dim_prefix}_{i}_{j}" for j in range(value.dim())}
        return dict.fromkeys(range(value.dim()), dim_prefix)

    with registered():
        return dynamic_shapes_like(inputs, leaf)


class ModelInputs:
    """A model and a few sets of valid inputs, from which dynamic shapes are guessed.

    Args:
        model: The module to export (its signature maps positional inputs to names).
        inputs: A list of input sets, each a tuple (positional), a dict (keyword) or an
            ``(args, kwargs)`` pair.
        method_name: The method whose signature is used.

    Raises:
        CaptureError: `inputs` is not a list of those forms, or the model has no such method.

    Example:
        >>> import torch
        >>> class Model(torch.nn.Module):
        ...     def forward(self, x, y):
        ...         return x + y
        >>> mi = ModelInputs(Model(), [(torch.randn(5, 6), torch.randn(1, 6)),
        ...                            (torch.randn(7, 8), torch.randn(1, 8))])
        >>> mi.guess_dynamic_shapes()
        (({0: DimHint(DYNAMIC), 1: DimHint(DYNAMIC)}, {1: DimHint(DYNAMIC)}), {})
    """

    def __init__(
        self,
        model: Any,
        inputs: Sequence[tuple[Any, ...] | dict[str, Any]],
        method_name: str = "forward",
    ) -> None:
        method = getattr(model, method_name, None) if model is not None else None
        if model is not None and not callable(method):
            raise CaptureError(f"{type(model).__name__} has no method {method_name!r}")
        self.model = model
        self.method_name = method_name
        self.signature = inspect.signature(method) if method is not None else None
        # The binder (`capture.signature`): which parameter a positional input fills.
        self._binder = Signature.of(method) if method is not None else None
        self.inputs: list[tuple[tuple[Any, ...], dict[str, Any]]] = self._process(inputs)

    @staticmethod
    def _process(inputs: Any) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        if not isinstance(inputs, list):
            raise CaptureError(
                f"inputs must be a list of input sets (tuples, dicts or (args, kwargs) pairs), "
                f"not a {type(inputs).__name__}"
            )
        out: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        for i, inp in enumerate(inputs):
            if (
                isinstance(inp, tuple)
                and len(inp) == 2
                and isinstance(inp[0], tuple)
                and isinstance(inp[1], dict)
            ):
                out.append((inp[0], dict(inp[1])))
            elif isinstance(inp, tuple):
                out.append((inp, {}))
            elif isinstance(inp, dict):
                out.append(((), dict(inp)))
            else:
                raise CaptureError(
                    f"inputs[{i}] is a {type(inp).__name__}; each input set must be a tuple, "
                    "a dict or an (args, kwargs) pair"
                )
        return out

    def guess_dynamic_shapes(self, auto: bool | str = False) -> DynamicShapes:
        """Guesses ``(args_dynamic_shapes, kwargs_dynamic_shapes)`` from the input sets.

        A dim is dynamic when it differs between the input sets (or is 0 in all of them), as
        `capture.analysis.symbols.find_symbols` decides it over the input sets' sizes (the
        zeros as forced dims), the same engine as a store's call groups. With
        a single input set nothing can be guessed: every tensor gets ``{}`` (or every dim
        ``Dim.AUTO`` with ``auto=True``).

        Args:
            auto: True: use ``Dim.AUTO`` instead of ``Dim.DYNAMIC``; a string: name the dims
                ``f"{auto}{dim}"``.

        Returns:
            A pair: a tuple for the positional arguments, a dict for the keyword arguments.

        Raises:
            ObservationMismatch: The input sets differ in a way dynamic shapes cannot express
                (number of positional arguments, keyword names, pytree structure, tensor
                rank, scalar value); the message names the key path.
        """
        if not self.inputs:
            return (), {}
        n_args = {len(args) for args, _ in self.inputs}
        if len(n_args) > 1:
            raise ObservationMismatch(
                f"the input sets have {sorted(n_args)} positional arguments; they must all have "
                "the same, pass the others by keyword"
            )
        names = list(self.inputs[0][1])
        for i, (_, kwargs) in enumerate(self.inputs):
            if set(kwargs) != set(names):
                raise ObservationMismatch(
                    f"inputs[{i}] passes the keyword arguments {sorted(kwargs)} but inputs[0] "
                    f"passes {sorted(names)}; every input set must pass the same ones"
                )
        roots = [(f"args[{i}]", [a[i] for a, _ in self.inputs]) for i in range(n_args.pop())]
        roots += [(f"kwargs[{name!r}]", [kw[name] for _, kw in self.inputs]) for name in names]
        with registered():
            checked = [self._check(values, root) for root, values in roots]
        # One size matrix over every tensor axis of the input sets, decided by the same engine
        # as a store's call groups. Seed rules kept as inputs to it: a dim 0 in every input set
        # is forced dynamic; one input set decides nothing (see the docstring).
        tensors = [
            (root, path, column)
            for (root, _), (_, leaves) in zip(roots, checked, strict=True)
            for path, column in leaves
            if column is not None
        ]
        axes = [Axis(r, d, f"{r}{p}") for r, p, col in tensors for d in range(col[0].dim())]
        matrix = np.zeros((len(self.inputs), len(axes)), dtype=np.int64)
        j = 0
        for _, _, column in tensors:
            rank = column[0].dim()
            matrix[:, j : j + rank] = [tuple(t.shape) for t in column]
            j += rank
        forced = (len(self.inputs) > 1) & np.all(matrix == 0, axis=0)
        dynamic = iter(find_symbols(matrix, axes, forced).dynamic)
        out = []
        for spec, leaves in checked:
            ds = [self._leaf_shapes(column, dynamic, auto) for _, column in leaves]
            out.append(dynamic_shapes_from_spec(spec, ds))
        n_pos = len(roots) - len(names)
        return tuple(out[:n_pos]), dict(zip(names, out[n_pos:], strict=True))

    def _check(
        self, values: list[Any], root: str
    ) -> tuple[pytree.TreeSpec, list[tuple[str, list[torch.Tensor] | None]]]:
        """The argument's structure, and per leaf its tensors over the input sets (None: not a
        tensor); raises when the input sets cannot share one set of dynamic shapes."""
        flats = [pytree.tree_flatten_with_path(v) for v in values]
        spec = flats[0][1]
        paths = [pytree.keystr(kp) for kp, _ in flats[0][0]]
        for i, (flat, other) in enumerate(flats[1:], start=1):
            if other != spec:
                theirs = [pytree.keystr(kp) for kp, _ in flat]
                diff = next((p for p in theirs if p not in paths), None)
                if diff is not None:
                    raise ObservationMismatch(
                        f"{root}{diff} is in inputs[{i}] but not in inputs[0]: the structure "
                        "changed (a list length, dict keys or cache layers)"
                    )
                diff = next((p for p in paths if p not in theirs), None)
                raise ObservationMismatch(
                    f"{root}{diff or ''} is in inputs[0] but not in inputs[{i}]: the structure "
                    "changed (a list length, dict keys, cache layers or container types)"
                )
        leaves = []
        for j, path in enumerate(paths):
            column = [flat[0][j][1] for flat in flats]
            leaves.append((path, self._check_leaf(column, f"{root}{path}")))
        return spec, leaves

    @staticmethod
    def _check_leaf(column: list[Any], path: str) -> list[torch.Tensor] | None:
        first = column[0]
        if not isinstance(first, torch.Tensor):
            for i, value in enumerate(column[1:], start=1):
                if isinstance(value, torch.Tensor) or (
                    isinstance(first, _SCALARS) and value != first
                ):
                    raise ObservationMismatch(
                        f"{path} is {value!r} in inputs[{i}] but {first!r} in inputs[0]: "
                        "torch.export bakes scalars into the program as constants"
                    )
            return None
        ranks = {t.dim() if isinstance(t, torch.Tensor) else None for t in column}
        if len(ranks) > 1:
            raise ObservationMismatch(
                f"{path} has ranks {sorted(ranks, key=str)} across the input sets; dynamic "
                "shapes cannot change a tensor's rank"
            )
        return column

    @staticmethod
    def _leaf_shapes(
        column: list[torch.Tensor] | None, dynamic: Iterator[bool], auto: bool | str
    ) -> dict[int, Any] | None:
        """The seed form of one leaf's dynamic shape, `dynamic` giving its axes' decisions."""
        if column is None:
            return None
        flags = [next(dynamic) for _ in range(column[0].dim())]
        if len(column) == 1:
            if auto is True:
                return dict.fromkeys(range(len(flags)), torch.export.Dim.AUTO)
            return {}
        dim: Any = torch.export.Dim.AUTO if auto is True else torch.export.Dim.DYNAMIC
        return {d: f"{auto}{d}" if isinstance(auto, str) else dim for d, f in enumerate(flags) if f}

    def move_to_kwargs(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], dynamic_shapes: DynamicShapes
    ) -> tuple[tuple[Any, ...], dict[str, Any], DynamicShapes]:
        """Moves positional arguments and their dynamic shapes to keyword arguments.

        torch.export does not take dynamic shapes split between positional and keyword
        arguments; this uses the signature to name the positional ones. Entries the signature
        does not name go under its ``**kwargs`` parameter in the dynamic shapes. Nothing given
        is modified.

        Args:
            args: Positional arguments (``mi.inputs[0][0]``).
            kwargs: Keyword arguments.
            dynamic_shapes: ``(args_ds, kwargs_ds)`` as `guess_dynamic_shapes` returns.

        Returns:
            ``(new_args, new_kwargs, new_dynamic_shapes)``: ``new_args`` is ``()``, the
            keyword arguments and their dynamic shapes follow the signature's order, and
            ``new_dynamic_shapes`` is ``((), kwargs_ds)``.

        Raises:
            CaptureError: No signature, or a positional argument cannot be passed by name
                (positional-only or ``*args``).

        Example:
            >>> import torch
            >>> class Model(torch.nn.Module):
            ...     def forward(self, x, y):
            ...         return x + y
            >>> mi = ModelInputs(Model(), [((torch.zeros(2),), {"y": torch.zeros(2)})])
            >>> a, kw, ds = mi.move_to_kwargs(*mi.inputs[0], ((None,), {"y": None}))
            >>> a, list(kw), ds
            ((), ['x', 'y'], ((), {'x': None, 'y': None}))
        """
        sig = self._binder
        if sig is None:
            raise CaptureError("ModelInputs has no model, so no signature to name arguments")
        args_ds, kwargs_ds = dynamic_shapes
        moved: dict[str, Any] = {}
        moved_ds: dict[str, Any] = {}
        for i, value in enumerate(args):
            name = sig.name_at(i)
            if name is None or name in sig.positional_only:
                what = (
                    POSITIONAL_ONLY.name
                    if name is not None
                    else "a *args entry"
                    if sig.var_positional
                    else "beyond the method's positional parameters"
                )
                raise CaptureError(f"args[{i}] cannot be moved to a keyword argument: it is {what}")
            moved[name] = value
            if i < len(args_ds):
                moved_ds[name] = args_ds[i]
        all_kwargs = {**moved, **kwargs}
        all_ds = {**moved_ds, **kwargs_ds}
        named, var_kw = sig.plain, sig.var_keyword
        new_kwargs = {n: all_kwargs[n] for n in named if n in all_kwargs}
        new_kwargs.update((k, v) for k, v in all_kwargs.items() if k not in new_kwargs)
        new_ds = {n: all_ds[n] for n in named if n in all_ds}
        extras = {k: v for k, v in all_ds.items() if k not in new_ds}
        if extras and var_kw:
            new_ds[var_kw] = extras
        else:
            new_ds.update(extras)
        return (), new_kwargs, ((), new_ds)
