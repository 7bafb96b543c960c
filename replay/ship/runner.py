"""The runner `replay.load` returns: calls an artifact's programs like the original model.

Each call is matched against the programs' recorded structures and guards (`replay.ship.guards`),
then run on the program that accepts it (or its AOTInductor build); see `replay.ship.artifact`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from replay.ship.fills import Fill, fill_call, fills_of
from replay.ship.guards import CallNotServed, LeafFacts, ProgramGuard

if TYPE_CHECKING:
    from torch.export import ExportedProgram

__all__ = ["Runner"]


class Runner:
    """Calls an artifact's programs like the original model (what `load` returns).

    Attributes:
        manifest: The artifact's manifest.
        programs: Program name -> `torch.export.ExportedProgram`.
        compiled: Program name -> its AOTInductor-compiled form (artifacts saved with
            ``aoti=True``); when present, calls run it instead of the exported program.
        module: The sub-module this runner serves (``""``: the model itself).
        modules: Sub-module name -> its `Runner` (``runner.modules["encoder"]``).
    """

    def __init__(
        self,
        manifest: dict[str, Any],
        programs: Mapping[str, ExportedProgram],
        module: str = "",
        compiled: Mapping[str, Any] | None = None,
    ) -> None:
        self.manifest = manifest
        self.programs = dict(programs)
        self.compiled = dict(compiled or {})
        self.module = module
        self._entries = [e for e in manifest["programs"] if e.get("module", "") == module]
        self._guards = [ProgramGuard.from_manifest(e) for e in self._entries]
        self._fills = [
            fills_of(e, len(g.axes)) for e, g in zip(self._entries, self._guards, strict=True)
        ]
        self._callables: dict[str, Any] = {}
        self._seen: dict[Any, tuple[str | None, Sequence[LeafFacts], bool]] = {}
        self.modules: dict[str, Runner] = {}
        if not module:
            for name in manifest["modules"]:
                if name:
                    self.modules[name] = Runner(manifest, programs, name, compiled)

    @property
    def groups(self) -> list[str]:
        """The groups this runner serves, in the order they are tried."""
        return [g.group for g in self._guards]

    def _structure(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], entry: dict[str, Any]
    ) -> tuple[str | None, Sequence[LeafFacts], list[int]]:
        from capture.pytree.structure import parse_params
        from capture.record.flatten import describe, tensor_key, walk

        tensors: list[Any] = []
        key: list[Any] = [len(args)]
        walk(args, tensors, key)
        walk(kwargs, tensors, key)
        full, _ = tensor_key(key, tensors, devices=False)
        cache_key = (full, entry.get("signature"))
        found = self._seen.get(cache_key)
        if found is None:
            params = tuple(parse_params(entry.get("signature")))
            st = describe((args, kwargs), list(tensors), signature=params)
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
    ) -> tuple[ProgramGuard, dict[str, Any], tuple[Fill, ...], list[int]]:
        reasons: dict[str, str] = {}
        for guard, entry, fills in zip(self._guards, self._entries, self._fills, strict=True):
            treespec, leaves, dims = self._structure(args, kwargs, entry)
            if not guard.matches(treespec, leaves):
                reasons[guard.label] = (
                    "different call structure (arguments, dtypes, ranks or constants)"
                )
                continue
            failed = guard.check(dims)
            if failed is None:
                return guard, entry, fills, dims
            reasons[guard.label] = failed
        who = f"{self.manifest['model']}.{self.module}" if self.module else self.manifest["model"]
        tried = "; ".join(f"{k}: {v}" for k, v in reasons.items()) or "the artifact has no program"
        raise CallNotServed(f"no program of {who} accepts this call ({tried})", reasons)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the call on the program that accepts it.

        Returns:
            The program's output, shaped as eager returns it (output dataclasses, caches).

        Raises:
            CallNotServed: No program accepts the call (structure or guards).
        """
        from replay.shapes import CallForm, arrange

        guard, entry, fills, dims = self._route(args, kwargs)
        # A group served by another group's program: the inputs it lacks, filled (fills.py).
        args, kwargs = fill_call(fills, args, kwargs, dims)
        runnable = self._callables.get(guard.program)
        if runnable is None:
            runnable = self.compiled.get(guard.program) or self.programs[guard.program].module()
            self._callables[guard.program] = runnable
        form = entry["form"]
        call_form = CallForm(
            tuple(form["positional"]),
            tuple(form["keywords"]),
            tuple(form["extra"]),
            form.get("var_positional"),
        )
        args, kwargs = arrange(call_form, args, kwargs)
        try:
            return runnable(*args, **kwargs)
        except (AssertionError, RuntimeError, ValueError) as e:
            # torch's own input checks (a guard the recorded ranges did not show): say so
            text = str(e).strip().splitlines()
            reason = f"its program refused the call: {type(e).__name__}: {text[0] if text else ''}"
            raise CallNotServed(
                f"group {guard.label} of {self.manifest['model']} matched, but {reason}",
                {guard.label: reason},
            ) from e

    def __repr__(self) -> str:
        name = self.manifest["model"] + (f".{self.module}" if self.module else "")
        return f"Runner({name}, groups={self.groups}, modules={sorted(self.modules)})"
