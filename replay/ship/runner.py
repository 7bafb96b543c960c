"""The runner `replay.load` returns: calls an artifact's programs like the original model.

Each call is routed with `replay.ship.guards.route` (the rule ``capture check`` uses too): the
first program whose recorded structure is the call's and whose guards accept its sizes runs it
(or its AOTInductor build); see `replay.ship.artifact`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from replay.ship.fills import fill_call
from replay.ship.guards import CallFacts, CallNotServed, LeafFacts, route
from replay.ship.manifest import Manifest, ProgramEntry

if TYPE_CHECKING:
    from torch.export import ExportedProgram

__all__ = ["Runner"]


class Runner:
    """Calls an artifact's programs like the original model (what `replay.load` returns).

    Args:
        manifest: The artifact's typed manifest.
        programs: Program name -> its exported program.
        modules: Program name -> its runnable module (``program.module()``).
        compiled: Program name -> its AOTInductor build (run instead of the module).
        module: The sub-module this runner serves.

    Attributes:
        manifest: The artifact's typed manifest.
        programs: Program name -> its `torch.export.ExportedProgram`.
        compiled: Program name -> its AOTInductor build, for artifacts loaded with
            ``compiled=True`` (calls then run it instead of the exported program).
        module: The sub-module this runner serves (``""``: the model itself).
        modules: Sub-module name -> its `Runner` (``runner.modules["encoder"]``).
    """

    def __init__(
        self,
        manifest: Manifest,
        programs: Mapping[str, ExportedProgram],
        modules: Mapping[str, Any],
        compiled: Mapping[str, Any] | None = None,
        module: str = "",
    ) -> None:
        self.manifest = manifest
        self.programs = dict(programs)
        self.compiled = dict(compiled or {})
        self.module = module
        self._entries = manifest.for_module(module)
        self._runnables = {
            e.program: self.compiled.get(e.program) or modules[e.program] for e in self._entries
        }
        self._by_guard = {id(e.guard): e for e in self._entries}
        self._seen: dict[Any, tuple[str | None, Sequence[LeafFacts], bool]] = {}
        self.modules: dict[str, Runner] = {}
        if not module:
            for name in manifest.modules:
                if name:
                    self.modules[name] = Runner(manifest, programs, modules, compiled, name)

    @property
    def groups(self) -> list[str]:
        """The groups this runner serves, in the order they are tried."""
        return [e.group for e in self._entries]

    def _facts(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], entry: ProgramEntry
    ) -> CallFacts:
        """The call's treespec, leaves and sizes, described with the entry's recorded signature
        (which names positional arguments); cached per call layout."""
        from capture.record.flatten import describe, tensor_key, walk
        from capture.signature import Signature

        tensors: list[Any] = []
        key: list[Any] = [len(args)]
        walk(args, tensors, key)
        walk(kwargs, tensors, key)
        full, _ = tensor_key(key, tensors, devices=False)
        cache_key = (full, entry.signature)
        found = self._seen.get(cache_key)
        if found is None:
            signature = Signature.loads(entry.signature)
            st = describe((args, kwargs), list(tensors), signature=signature)
            found = (st.treespec, st.leaves, st.slow)
            self._seen[cache_key] = found
        treespec, leaves, slow = found
        if slow:
            import torch.utils._pytree as pytree

            tensors = [t for t in pytree.tree_leaves((args, kwargs)) if hasattr(t, "shape")]
        dims = [int(s) for t in tensors for s in t.shape]
        return treespec, leaves, dims

    def select(self, *args: Any, **kwargs: Any) -> str:
        """The group that would serve this call (no program runs).

        Raises:
            CallNotServed: No group accepts the call; the message names each group and why.
        """
        return self._route(args, kwargs)[0].group

    def _route(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[ProgramEntry, Sequence[int]]:
        """The entry that serves the call, and the call's sizes."""
        seen: dict[int, CallFacts] = {}

        def facts(guard: Any) -> CallFacts:
            seen[id(guard)] = self._facts(args, kwargs, self._by_guard[id(guard)])
            return seen[id(guard)]

        chosen, reasons = route([e.guard for e in self._entries], facts)
        if chosen is not None:
            return self._by_guard[id(chosen)], seen[id(chosen)][2]
        model = self.manifest.model
        who = f"{model}.{self.module}" if self.module else model
        tried = "; ".join(f"{k}: {v}" for k, v in reasons.items()) or "the artifact has no program"
        raise CallNotServed(f"no program of {who} accepts this call ({tried})", reasons)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the call on the program that accepts it.

        A group served by another group's program (`replay.merging`) gets the inputs that
        program takes and the call lacks, filled by the entry's rules (`replay.ship.fills`).

        Returns:
            The program's output, shaped as eager returns it (output dataclasses, caches).

        Raises:
            CallNotServed: No program accepts the call (structure or guards).
        """
        from replay.shapes import arrange

        entry, dims = self._route(args, kwargs)
        args, kwargs = fill_call(entry.fills, args, kwargs, dims)
        args, kwargs = arrange(entry.form, args, kwargs)
        try:
            return self._runnables[entry.program](*args, **kwargs)
        except (AssertionError, RuntimeError, ValueError) as e:
            # torch's own input checks (a guard the recorded ranges did not show): say so
            text = str(e).strip().splitlines()
            reason = f"its program refused the call: {type(e).__name__}: {text[0] if text else ''}"
            label = entry.guard.label
            raise CallNotServed(
                f"group {label} of {self.manifest.model} matched, but {reason}", {label: reason}
            ) from e

    def __repr__(self) -> str:
        name = self.manifest.model + (f".{self.module}" if self.module else "")
        return f"Runner({name}, groups={self.groups}, modules={sorted(self.modules)})"
