"""Recorder: wraps a model's forward, records every call's metadata, never raises into the model.

The wrapper does, per call: a sampling check, `flatten.walk` over (args, kwargs) (tensor leaves
and a structure key), a dict lookup of the key, the sizes of the tensors, optional integer value
ranges, the forward itself (timed), the same for the output, and one deque append. Everything
that can fail in there is inside one `try`: a failure is counted in `stats()["errors"]`, logged
once, and the model's call goes on untouched. A model's exception is recorded and re-raised.

One class composed of parts, each with its own state: the wrapped method
(`capture.record.method_patch.MethodPatch`), the structure cache
(`capture.record.structure_cache.StructureCache`), the writer
(`capture.record.writer.StoreWriter`), the payload keeper, the accounting
(`capture.record.accounting`: calls in flight, call ids, counters, warnings once) and the
summaries of arguments it cannot record leaf by leaf (`capture.record.summaries`). A forked
child renews each part (`after_fork_in_child`).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

import torch

from capture import compat
from capture.errors import CaptureError
from capture.pytree import nodes
from capture.record import lifecycle
from capture.record.accounting import CallIds, Counters, InFlight, OnceLog
from capture.record.flatten import Unreadable, walk
from capture.record.method_patch import MethodPatch
from capture.record.payload_keeper import PayloadKeeper
from capture.record.recorder_options import RecorderOptions
from capture.record.structure_cache import StructureCache
from capture.record.summaries import Summaries
from capture.record.tokens import special_token_ids
from capture.record.value_ranges import DeviceRanges, int_range, ranges
from capture.record.writer import StoreWriter
from capture.signature import Signature
from capture.state.reading import TRAINING_KEY, has_training, state_reader

__all__ = ["Recorder", "DEFAULT_STORE", "STOP_WAIT_SECONDS", "NOTHING_RECORDED_AFTER"]

logger = logging.getLogger(__name__)

DEFAULT_STORE = "capture-store"

STOP_WAIT_SECONDS = 5.0
"""Longest time stop() waits for calls still inside the model to finish and be queued."""
NOTHING_RECORDED_AFTER = 8
"""Failed calls after which a recorder that recorded none says so loudly."""

_DEFAULT_OPTIONS = RecorderOptions()

_FIX = (
    "run with logging at DEBUG for the traceback (logger 'capture'), and report it; a class "
    "capture cannot read can be registered with capture.register_cache or "
    "torch.utils._pytree.register_pytree_node"
)
_FIXES = {"opening the store": "check that the store path or URI exists and is writable"}


def _submodules(model: Any, modules: Mapping[str, Any] | Iterable[str] | None) -> dict[str, Any]:
    """The ``modules=`` option as name -> object (paths resolved with ``get_submodule``)."""
    if modules is None:
        return {}
    items = modules.items() if isinstance(modules, Mapping) else ((p, p) for p in modules)
    out: dict[str, Any] = {}
    for name, sub in items:
        if not isinstance(name, str) or not name or "/" in name:
            raise CaptureError(f"modules: {name!r} is not a usable sub-module name")
        if isinstance(sub, str):
            try:
                sub = model.get_submodule(sub)
            except (AttributeError, TypeError) as e:
                raise CaptureError(
                    f"modules: {type(model).__name__} has no sub-module {sub!r} ({e}); pass "
                    "{name: module} for a module reached otherwise (model.get_encoder())"
                ) from e
        if sub is model:
            raise CaptureError(f"modules: {name!r} is the model itself, already recorded")
        out[name] = sub
    return out


class Recorder:
    """Records how a model's method is called, into a Parquet store.

    Args:
        model: The module (or any object) whose method is recorded.
        store: A directory or a pyarrow filesystem URI (``s3://bucket/prefix``).
        name: The `model` partition in the store; defaults to the model's class name.
        method: The method to wrap ('forward').
        modules: Sub-modules to record too, for those that callers such as ``generate()``
            call directly (an encoder through ``get_encoder()``, a vision tower): a mapping
            ``{name: module or module path}`` or a list of module paths
            (``model.get_submodule(path)``). Each is recorded by a child `Recorder` (the same
            `RecorderOptions` object) under the model partition ``<name>.<sub-module name>``
            (``T5ForConditionalGeneration.encoder``); they start and stop with this one and
            are in ``recorder.modules``.
        options: The recording options as one `RecorderOptions` (default: its defaults).
        **keywords: Any `RecorderOptions` field by name (``sample=0.1``, ``max_calls=``,
            ``record_outputs=``, ``value_ranges=``, ``queue_size=``, ``flush_rows=``,
            ``flush_seconds=``, ``max_structures=``, ``payloads=``, ``compiled=``,
            ``state=``): each
            replaces that field of `options`. What each means: `RecorderOptions`.

    Raises:
        CaptureError: The model has no such method, an option is out of range or unknown, or
            a sub-module cannot be found.

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(4, 2)
        >>> with Recorder(model, "/tmp/capture-doctest") as rec:  # doctest: +SKIP
        ...     _ = model(torch.randn(3, 4))
        >>> rec.stats()["recorded"]  # doctest: +SKIP
        1
    """

    def __init__(
        self,
        model: Any,
        store: str | os.PathLike[str] = DEFAULT_STORE,
        *,
        name: str | None = None,
        method: str = "forward",
        modules: Mapping[str, Any] | Iterable[str] | None = None,
        options: RecorderOptions | None = None,
        **keywords: Any,
    ) -> None:
        if options is not None and not isinstance(options, RecorderOptions):
            raise CaptureError(
                f"options={options!r} must be a capture.RecorderOptions; pass single options "
                "as keywords (sample=0.1)"
            )
        if not hasattr(model, method) or not callable(getattr(model, method)):
            raise CaptureError(
                f"{type(model).__name__} has no method {method!r} to record; "
                "pass method='<name of the method>'"
            )
        options = (options or _DEFAULT_OPTIONS).with_keywords(keywords)
        self.options: RecorderOptions = options
        """The recording options (shared, whole, with the sub-module recorders)."""
        self.model = model
        self.store = store
        self.name = name or type(model).__name__
        self.method = method
        # The options the wrapper reads on every call, as plain attributes (one lookup each).
        self._sample = options.sample
        self._max_calls = options.max_calls
        self._record_outputs = options.record_outputs
        self._compiled = options.compiled
        self._read_state: Callable[[], str | None] | None = None  # found at start()
        self._trains = has_training(model)  # `training` read inline when nothing else is
        policy = options.payload_policy
        self._payloads = PayloadKeeper(policy, store, self.name) if policy else None
        self._writer: StoreWriter | None = None
        self._registered = False
        self._random = random.Random()
        # The parts (module docstring).
        self._log = OnceLog(logger)
        self._patch = MethodPatch(model, method)
        self._cache = StructureCache(
            self.name, options.max_structures, options.value_ranges, self._log
        )
        self._structure = self._cache.lookup  # bound once: the hot path calls it twice a call
        self._flight = InFlight()
        self._ids = CallIds()
        self._counts = Counters()
        self._summaries = Summaries(self.name, self._counts, self._log)
        self.modules: dict[str, Recorder] = {
            sub_name: Recorder(
                sub, store, name=f"{self.name}.{sub_name}", method=method, options=options
            )
            for sub_name, sub in _submodules(model, modules).items()
        }
        """Sub-module name -> the child `Recorder` recording it (the ``modules=`` option)."""

    # -- lifecycle ---------------------------------------------------------------------------
    def after_fork_in_child(self) -> None:
        """A forked child's recorder: new call ids, fresh counters, its own writers."""
        self._random = random.Random()
        self._ids.renew()
        self._flight.reset()
        self._counts.reset()
        self._cache.after_fork_in_child()
        if self._writer is not None:
            self._writer.after_fork_in_child()
        if self._payloads is not None:
            self._payloads.after_fork_in_child()

    def start(self) -> Recorder:
        """Wraps the method and starts the writer thread (for long-lived servers)."""
        if self._patch.active:
            return self
        original = self._patch.current()
        signature = Signature.of(original)
        previous = self._writer
        if previous is not None:
            self._counts.retire(previous)
        try:
            options = self.options
            self._writer = StoreWriter(
                self.store,
                self.name,
                signature,
                queue_size=options.queue_size,
                flush_rows=options.flush_rows,
                flush_seconds=options.flush_seconds,
            )
            if previous is not None:
                self._writer.adopt(previous)
            self._writer.start()
        except Exception as e:  # an unusable store must not stop the model from serving
            self._count_error("opening the store", e)
            self._writer = None
        if nodes.transformers_loaded():
            nodes.acquire()
            self._registered = True
        self._cache.start(self._writer, signature, special_token_ids(self.model))
        self._read_state = state_reader(self.model, self.options.state)
        if self._payloads is not None:
            self._payloads.start()
        self._patch.install(original, self._make_wrapper(original))
        atexit.register(self.stop)
        lifecycle.track(self)
        for child in self.modules.values():
            child.start()
        return self

    def stop(self) -> None:
        """Restores the method, writes what is buffered and stops the writer thread.

        Calls still inside the model are waited for (at most `STOP_WAIT_SECONDS`) and written.
        """
        if not self._patch.active:
            return
        self._patch.active = False  # from now on the wrapper passes calls through
        # A SIGTERM meanwhile waits for the last writes (capture.record.lifecycle)
        with lifecycle.stopping(self):
            for child in self.modules.values():
                child.stop()
            try:
                self._patch.restore()
            finally:
                atexit.unregister(self.stop)
                self._flight.wait(STOP_WAIT_SECONDS)
                if self._writer is not None:
                    try:
                        self._writer.close()
                    except Exception as e:
                        self._count_error("closing the store", e)
                if self._payloads is not None:
                    self._payloads.close()
                if self._registered:
                    nodes.release()
                    self._registered = False

    def flush(self, timeout: float | None = 30.0) -> None:
        """Writes every call recorded so far to the store (the recorder keeps running).

        A server with its own SIGTERM handler calls this (or `stop()`) in it: see
        `capture.record.lifecycle`.

        Args:
            timeout: Longest wait for the writer thread, in seconds (None: no limit).
        """
        if self._writer is not None:
            self._writer.flush(timeout=timeout)
        for child in self.modules.values():
            child.flush(timeout=timeout)

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stats(self) -> dict[str, int]:
        """Counters since the recorder was created (they add up over stop() and start()).

        Returns:
            recorded, dropped, errors, written, sampled_out, structures, files; and what
            explains a loss: bad_records (calls the writer could not convert, also in
            dropped), oversized (calls with an argument summarised past `flatten.MAX_ITEMS`
            or `MAX_KEY`), unreadable (calls with an argument capture cannot flatten, recorded
            as an opaque leaf naming its class), store_resets (the store's folder was found
            removed: structures written again), tmp_removed (old `.tmp` files of killed
            writers removed).
        """
        out = self._counts.totals(self._writer)
        counts = self._counts
        return {
            "recorded": out["recorded"],
            "dropped": out["dropped"] + self._cache.overflow,
            "errors": counts.errors + out["write_errors"],
            "written": out["written"],
            "sampled_out": counts.sampled_out,
            "structures": self._cache.count(),
            "files": out["files"],
            "bad_records": out["bad_records"],
            "oversized": counts.oversized,
            "unreadable": counts.unreadable,
            "store_resets": out["store_resets"],
            "tmp_removed": out["tmp_removed"],
            **(self._payloads.stats() if self._payloads is not None else {}),
        }

    # -- hot path ----------------------------------------------------------------------------
    def _make_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        perf_ns = time.perf_counter_ns
        time_ns = time.time_ns
        payloads = self._payloads
        flight = self._flight
        patch = self._patch
        exporting = compat.export_check()  # is_exporting(), also right while Dynamo traces
        outside: Callable[..., Any] = original  # set below

        @functools.wraps(original)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if not patch.active:
                return original(*args, **kwargs)
            if torch.compiler.is_compiling():  # Dynamo traces this: call the eager part instead
                if not self._compiled or exporting():
                    return original(*args, **kwargs)
                return outside(*args, **kwargs)
            pending = None
            try:
                pending = self._inputs(args, kwargs)
            except Exception as e:
                self._count_error("recording inputs", e)
            if pending is None:
                return original(*args, **kwargs)
            kept = None
            if payloads is not None:
                try:
                    kept = payloads.take(args, kwargs, pending[0], pending[4], pending[5])
                except Exception as e:
                    self._count_error("keeping a payload", e)
            flight.enter()
            ts = time_ns()
            t0 = perf_ns()
            try:
                out = original(*args, **kwargs)
            except BaseException as e:
                duration = perf_ns() - t0
                try:
                    self._emit(pending, ts, duration, None, f"{type(e).__name__}: {e}")
                except Exception as e2:
                    self._count_error("recording an exception", e2)
                flight.leave()
                raise
            duration = perf_ns() - t0
            try:
                call_id = self._emit(pending, ts, duration, out, None)
                if kept is not None:
                    payloads.finish(kept, call_id, out)  # type: ignore[union-attr]
            except Exception as e:
                self._count_error("recording outputs", e)
            flight.leave()
            return out

        # Compiled callers (torch.compile of the model, before or after wrapping) graph-break
        # to `outside`, which records eagerly and calls the compiled method.
        outside = lifecycle.outside_compiled_region(
            recorded, Recorder._inputs, Recorder._emit, Recorder._count_error
        )
        return recorded

    def _inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._sample < 1.0 and self._random.random() >= self._sample:
            self._counts.sampled_out += 1
            return None
        max_calls = self._max_calls
        if max_calls is not None and self._writer and self._writer.recorded >= max_calls:
            return None
        read = self._read_state
        if read is None:
            state = TRAINING_KEY if self._trains and self.model.training else None
        else:
            try:
                state = read()
            except Exception as e:  # never recorded under a state it may not be
                self._count_error("reading the call's state", e)
                return None
        tensors: list[torch.Tensor] = []
        key: list[Any] = [len(args)]
        try:
            walk(args, tensors, key)
            walk(kwargs, tensors, key)
        except Exception as e:  # too large, or unreadable: opaque leaves
            args, kwargs, tensors, key = self._summaries.inputs(args, kwargs, e)
        try:
            found = self._structure((args, kwargs), tensors, key, "inputs")
        except Unreadable as e:  # torch's pytree cannot flatten what walk() read
            args, kwargs, tensors, key = self._summaries.inputs(args, kwargs, e)
            found = self._structure((args, kwargs), tensors, key, "inputs")
        if found is None:
            return None
        st, dims = found
        lows: list[int | None] | None = None
        highs: list[int | None] | None = None
        if st.range_tensors:
            if st.deferred:  # device tensors: read by the writer thread, no sync
                lows = highs = DeviceRanges(tensors, st.range_tensors, st.counts)  # type: ignore[assignment]
            else:
                lows, highs = [], []
                for i in st.range_tensors:
                    lo, hi = int_range(tensors[i])
                    lows.append(lo)
                    highs.append(hi)
                if st.counts:  # special token counts after the ranges
                    counted = ranges(tensors, (), st.counts)[0]
                    lows += counted
                    highs += counted
        return st.structure_id, dims, lows, highs, st.keywords, state

    def _emit(
        self, pending: Any, ts: int, duration: int, out: Any, error: str | None
    ) -> int | None:
        sid, dims, lows, highs, _, state = pending
        out_sid = out_dims = None
        if error is None and self._record_outputs:
            tensors: list[torch.Tensor] = []
            key: list[Any] = ["out"]
            try:
                walk(out, tensors, key)
                found = self._structure(out, tensors, key, "output")
            except Exception as e:  # too large, or unreadable: one opaque leaf
                summary, key = self._summaries.output(out, e)
                tensors = []
                found = self._structure(summary, tensors, key, "output")
            if found is not None:
                out_sid, out_dims = found[0].structure_id, found[1]
        writer = self._writer
        if writer is None:
            return None
        ids = self._ids
        call_id = ids.base | next(ids.seq)
        # A plain tuple in CallRecord's field order: building the NamedTuple costs 0.16 µs more
        # per call, and the writer reads records by position (Segment.add).
        record = (call_id, ts, sid, out_sid, dims, out_dims, lows, highs, duration, error, state)
        writer.submit(record)  # type: ignore[arg-type]
        return call_id

    def _count_error(self, what: str, e: BaseException) -> None:
        self._counts.errors += 1
        self._log.warn(
            what,
            "capture: %s failed for %s (%s: %s); the model's call is not affected, further "
            "failures are counted in stats()['errors']",
            what,
            self.name,
            type(e).__name__,
            e,
        )
        logger.debug("capture: %s failed for %s", what, self.name, exc_info=e)
        if self._counts.errors == NOTHING_RECORDED_AFTER:
            self._warn_nothing_recorded(what, e)

    def _warn_nothing_recorded(self, what: str, error: BaseException) -> None:
        """Every call so far failed and none was recorded: one loud warning."""
        if self._counts.totals(self._writer)["recorded"]:
            return
        logger.warning(
            "capture: %s has recorded NO call: its first %d calls all failed while %s "
            "(%s: %s). The model serves as before, but nothing reaches the store. Fix: %s",
            self.name,
            self._counts.errors,
            what,
            type(error).__name__,
            error,
            _FIXES.get(what, _FIX),
        )
