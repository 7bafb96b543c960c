"""InputObserver: the seeds' in-memory API, built on the recorder's flattening.

``with observer(model):`` replaces ``model.forward`` (or ``method_name``) by a wrapper that
describes every call the way the `Recorder` does: `flatten.walk` gives the tensors and a
structure key, a new key is described once (`flatten.describe` for the store,
`call_layout.CallLayout` for the analysis), and the call itself keeps only its sizes. Calls with
the same structure and sizes are counted once, so memory grows with the number of *distinct*
calls. The tensors (cloned before the forward, which may update a cache in place) are kept
for the first ``store_n_calls`` calls of each ``with`` block only: those are the observations
`num_obs()` counts and `infer_arguments()` returns, while `infer_dynamic_shapes()` uses every
observed call. A call whose forward raises is not observed.

The analysis (normalisation, alignment, the errors it raises) is described in
`capture.seeds.alignment`. `to_store()` writes the observed calls into a capture store, so they go
through `replay.export_inputs` / `replay.export` like recorded ones.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import torch
import torch.utils._pytree as pytree

from capture.errors import CaptureError
from capture.pytree import nodes
from capture.pytree.shape_tree import registered
from capture.record.flatten import Structure, describe, tensor_key, walk
from capture.record.method_patch import MethodPatch
from capture.seeds.aligned import View
from capture.seeds.alignment import Aligner, Analysis
from capture.seeds.call_layout import CallLayout, Observation
from capture.signature import Signature
from capture.store.stats_merge import merge_items

__all__ = ["InputObserver"]

logger = logging.getLogger(__name__)

_INTEGER_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _track_range(t: torch.Tensor) -> bool:
    """Value ranges of integer CPU tensors only: on an accelerator `aminmax` forces a sync."""
    return t.device.type == "cpu" and t.dtype in _INTEGER_DTYPES


@dataclass
class _Layout:
    index: int
    structure: Structure
    call: CallLayout


@dataclass
class _Seen(Observation):
    """Every observed call with one structure and one set of sizes (input and output)."""

    structure: Structure | None = None
    ts: int = 0
    out: Structure | None = None
    out_dims: tuple[tuple[int, ...], ...] | None = None
    calls: int = 0
    duration_ns: int = 0
    # Integer value ranges, item by item (None: an empty tensor), as the calls columns hold them.
    int_min: list[int | None] = field(default_factory=list)
    int_max: list[int | None] = field(default_factory=list)


@dataclass
class _Stored:
    seen: _Seen
    tensors: list[torch.Tensor]


class InputObserver:
    """Observes how a model's method is called, then infers export arguments and dynamic shapes.

    Args:
        value_if_missing: Values for optional arguments some calls do not pass, by name (or by
            position), e.g. ``{"pixel_values": torch.empty((0, 3, 224, 224))}``. They are used
            by the analysis only: never passed to the model, never written by `to_store`.

    Example:
        >>> import torch
        >>> class Add(torch.nn.Module):
        ...     def forward(self, x, y):
        ...         return x + y
        >>> model, observer = Add(), InputObserver()
        >>> with observer(model):
        ...     _ = model(torch.randn(2, 6), torch.randn(2, 6))
        ...     _ = model(torch.randn(3, 7), torch.randn(3, 7))
        >>> observer.infer_dynamic_shapes()
        ({0: DimHint(DYNAMIC), 1: DimHint(DYNAMIC)}, {0: DimHint(DYNAMIC), 1: DimHint(DYNAMIC)})
    """

    def __init__(self, value_if_missing: Mapping[str | int, Any] | None = None) -> None:
        self.value_if_missing: dict[str | int, Any] = dict(value_if_missing or {})
        self._aligner: Aligner | None = None
        self._model_name = ""
        self._layouts: dict[tuple[Any, ...], _Layout] = {}
        self._outputs: dict[tuple[Any, ...], Structure] = {}
        self._seen: dict[tuple[Any, ...], _Seen] = {}
        self._stored: list[_Stored] = []
        self._n_calls = 0
        self._failures: list[str] = []
        self._n_failures = 0
        self._lock = threading.RLock()

    # -- observing ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def __call__(
        self, model: Any, store_n_calls: int = 3, method_name: str = "forward"
    ) -> Iterator[InputObserver]:
        """Observes `model.<method_name>` for the duration of a ``with`` block.

        Args:
            model: The module (or any object) whose method is observed.
            store_n_calls: How many calls of this block keep their tensors (for
                `infer_arguments`); every call keeps its shapes (for `infer_dynamic_shapes`).
            method_name: The method to observe.

        Raises:
            CaptureError: The model has no such method, its signature differs from the one
                observed before, or `value_if_missing` names an argument it does not take.
        """
        original = getattr(model, method_name, None)
        if not callable(original):
            raise CaptureError(
                f"{type(model).__name__} has no method {method_name!r} to observe; "
                "pass method_name='<name of the method>'"
            )
        sig = Signature.of(original)
        if self._aligner is None:
            with registered():
                self._aligner = Aligner(sig, self.value_if_missing)
            self._model_name = type(model).__name__
        elif sig.names != self._aligner.sig.names:
            raise CaptureError(
                f"{type(model).__name__}.{method_name} takes {list(sig.names)} but this observer "
                f"already observed a method taking {list(self._aligner.sig.names)}; use a new "
                "observer"
            )
        limit = len(self._stored) + store_n_calls
        # The one way to wrap a method (the Recorder's too): a block that ends while another
        # wrapper sits on top of ours leaves that wrapper in place, and ours passes through.
        patch = MethodPatch(model, method_name)
        state = {"acquired": False}

        @functools.wraps(original)
        def observed(*args: Any, **kwargs: Any) -> Any:
            if not patch.active or torch.compiler.is_compiling():
                return original(*args, **kwargs)
            if not state["acquired"] and nodes.transformers_loaded():
                nodes.acquire()  # released when the block ends
                state["acquired"] = True
            pending = None
            try:
                pending = self._before(args, kwargs, len(self._stored) < limit)
            except Exception as e:  # observing must never break the model's call
                self._fail("observing the inputs", e)
            t0 = time.perf_counter_ns()
            out = original(*args, **kwargs)
            duration = time.perf_counter_ns() - t0
            if pending is not None:
                try:
                    self._after(pending, out, duration, limit)
                except Exception as e:
                    self._fail("observing the outputs", e)
            return out

        # transformers' generate() inspects the forward's signature.
        with contextlib.suppress(TypeError, ValueError):
            observed.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
        patch.install(original, observed)
        try:
            yield self
        finally:
            patch.restore()
            if state["acquired"]:
                nodes.release()

    def _before(self, args: tuple[Any, ...], kwargs: dict[str, Any], store: bool) -> Any:
        tensors: list[torch.Tensor] = []
        key: list[Any] = [len(args)]
        walk(args, tensors, key)
        walk(kwargs, tensors, key)
        k, _ = tensor_key(key, tensors)
        layout = self._layouts.get(k)
        if layout is None:
            layout = self._new_layout(k, args, kwargs, tensors)
        if layout.structure.slow:
            tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        dims = tuple(tuple(t.shape) for t in tensors)
        lows: list[int | None] = []
        highs: list[int | None] = []
        for i in layout.structure.range_tensors:
            t = tensors[i]
            if t.numel():
                lo, hi = torch.aminmax(t)
                lows.append(int(lo))
                highs.append(int(hi))
            else:
                lows.append(None)
                highs.append(None)
        clones = [t.detach().clone() for t in tensors] if store else None
        return layout, dims, (lows, highs), clones, time.time_ns()

    def _new_layout(
        self, key: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any], tensors: Any
    ) -> _Layout:
        assert self._aligner is not None  # noqa: S101 - set by __call__ before any call
        with self._lock:
            layout = self._layouts.get(key)
            if layout is None:
                structure = describe(
                    (args, kwargs),
                    tensors,
                    signature=self._aligner.sig,
                    track_ranges=_track_range,
                )
                call = CallLayout.of(args, kwargs)
                layout = self._layouts[key] = _Layout(len(self._layouts), structure, call)
            return layout

    def _after(self, pending: Any, out: Any, duration: int, limit: int) -> None:
        layout, dims, ranges, clones, ts = pending
        tensors: list[torch.Tensor] = []
        okey: list[Any] = ["out"]
        walk(out, tensors, okey)
        ok, _ = tensor_key(okey, tensors)
        with self._lock:
            out_st = self._outputs.get(ok)
            if out_st is None:
                out_st = self._outputs[ok] = describe(out, tensors, root="output")
            if out_st.slow:
                tensors = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
            out_dims = tuple(tuple(t.shape) for t in tensors)
            call = self._n_calls
            self._n_calls += 1
            key = (layout.index, dims, out_st.structure_id, out_dims)
            seen = self._seen.get(key)
            if seen is None:
                seen = self._seen[key] = _Seen(
                    layout.call, dims, call, call, layout.structure, ts, out_st, out_dims
                )
            seen.calls += 1
            seen.last = call
            seen.duration_ns += duration
            lows, highs = ranges
            if lows:
                seen.int_min = merge_items(seen.int_min, lows, min)
                seen.int_max = merge_items(seen.int_max, highs, max)
            if clones is not None and len(self._stored) < limit:
                self._stored.append(_Stored(seen, clones))

    def _fail(self, what: str, e: BaseException) -> None:
        with self._lock:
            self._n_failures += 1
            if not self._failures:
                logger.warning(
                    "InputObserver: %s failed (%s: %s); the model's call is not affected, the "
                    "analysis will report it",
                    what,
                    type(e).__name__,
                    e,
                )
                self._failures.append(f"{what}: {type(e).__name__}: {e}")

    # -- results -----------------------------------------------------------------------------
    def num_obs(self) -> int:
        """The number of stored observations: calls whose tensors are kept, at most
        ``store_n_calls`` per ``with`` block."""
        return len(self._stored)

    def num_calls(self) -> int:
        """The number of observed calls (each keeps its shapes, not its tensors)."""
        return self._n_calls

    def infer_dynamic_shapes(
        self, set_batch_dimension_for: set[int | str] | bool | None = None
    ) -> tuple[Any, ...] | dict[str, Any]:
        """Dynamic shapes for torch.export, from every observed call.

        Args:
            set_batch_dimension_for: Arguments whose dim 0 is dynamic even when it never
                changed: True for all of them, or a set of names and positions.

        Returns:
            A tuple (every call positional) or a dict (keyword or mixed calls) mirroring the
            arguments, with ``{dim: torch.export.Dim.DYNAMIC}`` per tensor and None for
            anything else; a cache is the flat list of its tensors' dicts.

        Raises:
            ObservationMismatch: The calls cannot share one set of dynamic shapes (see
                `capture.seeds.alignment`); the message names the key path.
            CaptureError: Nothing was observed, a call could not be observed, or
                `set_batch_dimension_for` names an unknown argument.

        Example:
            >>> import torch
            >>> model, observer = torch.nn.Linear(4, 2), InputObserver()
            >>> with observer(model):
            ...     _ = model(torch.randn(2, 4))
            ...     _ = model(torch.randn(3, 4))
            >>> observer.infer_dynamic_shapes()
            ({0: DimHint(DYNAMIC)},)
        """
        with registered():
            aligner, an = self._analyse()
            return aligner.dynamic_shapes(an, set_batch_dimension_for)

    def infer_arguments(
        self,
        index_or_args_or_kwargs: int | tuple[Any, ...] | dict[str, Any] | None = None,
        flat: bool = False,
        as_args_kwargs: bool = False,
    ) -> Any:
        """Example arguments for torch.export: one stored call, completed.

        A tensor the call did not pass (an optional argument, a ``None`` cache layer) becomes
        an empty tensor: its last observed shape with the last dynamic dim set to 0, or zeros
        of that shape when no dim is dynamic, as the seeds do.

        Args:
            index_or_args_or_kwargs: None picks the first stored call passing the same
                arguments as the call with the most tensors; an int picks a stored call; a
                tuple or a dict gives new inputs, checked and completed the same way.
            flat: Return the list of tensors instead.
            as_args_kwargs: Always return ``(args, kwargs)``.

        Returns:
            A tuple (every call positional), a dict (keyword or mixed calls), or
            ``(args, kwargs)``.

        Raises:
            ObservationMismatch: See `infer_dynamic_shapes`.
            CaptureError: Nothing was stored, or the index is out of range.

        Example:
            >>> import torch
            >>> model, observer = torch.nn.Linear(4, 2), InputObserver()
            >>> with observer(model):
            ...     _ = model(torch.randn(2, 4))
            >>> [tuple(t.shape) for t in observer.infer_arguments()]
            [(2, 4)]
        """
        with registered():
            aligner, an, view, tensors = self._pick(index_or_args_or_kwargs)
            return aligner.arguments(an, view, tensors, flat=flat, as_args_kwargs=as_args_kwargs)

    def _analyse(self, extra: View | None = None) -> tuple[Aligner, Analysis]:
        with self._lock:
            if self._n_failures:
                raise CaptureError(
                    f"{self._n_failures} calls could not be observed, so the analysis would be "
                    f"incomplete; the first failure: {self._failures[0]}"
                )
            if not self._seen or self._aligner is None:
                raise CaptureError(
                    "nothing was observed: call the model inside `with observer(model):`"
                )
            aligner = self._aligner
            seen = sorted(self._seen.values(), key=lambda s: s.first)
        views = [aligner.view(s) for s in seen]
        return aligner, aligner.align(views if extra is None else [*views, extra])

    def _pick(self, which: Any) -> tuple[Aligner, Analysis, View, Sequence[torch.Tensor]]:
        if which is None or (isinstance(which, int) and not isinstance(which, bool)):
            aligner, an = self._analyse()
            if not self._stored:
                raise CaptureError("no call was stored: observe at least one call")
            views = {id(v.obs): v for v in an.views}
            if which is None:
                stored = self._stored[aligner.representative(an, [s.seen for s in self._stored])]
            elif 0 <= which < len(self._stored):
                stored = self._stored[which]
            else:
                raise CaptureError(f"no stored observation {which}: {len(self._stored)} stored")
            return aligner, an, views[id(stored.seen)], stored.tensors
        if isinstance(which, tuple):
            args, kwargs = which, {}
        elif isinstance(which, dict):
            args, kwargs = (), which
        else:
            raise CaptureError(
                f"infer_arguments takes None, an index, a tuple or a dict, not {type(which)}"
            )
        if self._aligner is None:
            raise CaptureError(
                "nothing was observed: call the model inside `with observer(model):`"
            )
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        obs = Observation(
            CallLayout.of(args, kwargs), tuple(tuple(t.shape) for t in tensors), -1, -1
        )
        view = self._aligner.view(obs)
        aligner, an = self._analyse(extra=view)
        return aligner, an, view, tensors

    # -- store -------------------------------------------------------------------------------
    def to_store(self, path: str | os.PathLike[str], name: str | None = None) -> int:
        """Writes the observed calls into a capture store, for `replay.export_inputs`/`export`.

        The store holds what the model received: `value_if_missing` values are not written
        (an argument a call did not pass is recorded as ``missing``). Calls with the same
        structure and sizes are written as that many rows sharing the first call's timestamp,
        their mean duration and their merged integer value ranges.

        Args:
            path: The store directory (or a pyarrow filesystem URI); created if needed.
            name: The ``model`` partition; defaults to the observed model's class name.

        Returns:
            The number of calls written.

        Raises:
            CaptureError: Nothing was observed, or the store could not be written.

        Example:
            >>> import tempfile, torch
            >>> model, observer = torch.nn.Linear(4, 2), InputObserver()
            >>> with observer(model):
            ...     _ = model(torch.randn(2, 4))
            >>> observer.to_store(tempfile.mkdtemp())
            1
        """
        from capture.record.segment import CallRecord, call_id_base
        from capture.record.writer import StoreWriter

        with self._lock:
            if not self._seen or self._aligner is None:
                raise CaptureError(
                    "nothing was observed: call the model inside `with observer(model):` first"
                )
            seen = sorted(self._seen.values(), key=lambda s: s.first)
            total = sum(s.calls for s in seen)
            writer = StoreWriter(
                path,
                name or self._model_name,
                self._aligner.sig,
                queue_size=total + 1,
                flush_rows=total + 1,
                flush_seconds=float("inf"),
            )
            for layout in sorted(self._layouts.values(), key=lambda x: x.index):
                writer.add_structure(layout.structure)
            for st in self._outputs.values():
                writer.add_structure(st)
            base = call_id_base()
            n = 0
            for s in seen:
                assert s.structure is not None  # noqa: S101 - set on every observed call
                record = CallRecord(
                    call_id=0,
                    ts=s.ts,
                    in_structure=s.structure.structure_id,
                    out_structure=None if s.out is None else s.out.structure_id,
                    dims=tuple(chain.from_iterable(s.dims)),
                    out_dims=None if s.out_dims is None else tuple(chain.from_iterable(s.out_dims)),
                    int_min=s.int_min or None,
                    int_max=s.int_max or None,
                    duration_ns=s.duration_ns // max(s.calls, 1),
                    error=None,
                )
                for _ in range(s.calls):
                    writer.submit(record._replace(call_id=base | n))
                    n += 1
        writer.close()
        if writer.write_errors or writer.dropped:
            raise CaptureError(
                f"could not write {writer.dropped} of {total} calls to {os.fspath(path)}; check "
                "that the path is writable (the logged warning has the cause)"
            )
        return total
