"""The runner, the PT2 side: `replay.load`'s runner calling an artifact's programs.

Each call is routed with `replay.runtime.guards.route` (the rule ``capture check`` uses too): the
first program whose recorded structure is the call's and whose guards accept its sizes runs it
(or its AOTInductor build); see `replay.runtime.pt2.loading`. The `Router` describes a live call for
that rule; the ONNX runner (`replay.runtime.ort.runner`) routes through it too, so the ``.pt2``
runner, the ONNX runner and ``capture check`` answer with one rule. A keyword that spells a
renamed argument the other way (``past_key_values`` for a program exported with ``cache``,
`capture.renames`) is passed under the program's spelling (`Router.spelled`).

**States.** An artifact's programs each serve one recorded state (`ProgramEntry.state`,
`capture.state`: peft adapters, ``training``, a declared state). A server says which state a
call runs under with ``runner.state(...)``, a runner over that state's programs only (built once
per state and kept); `resolve_state` turns what it wrote into one of the artifact's keys:
``runner.state(adapter="b")`` (the items), ``runner.state("adapter=b")`` (the label group names
show), ``runner.state('{"adapter":"b"}')`` (the key as the store holds it), ``runner.state()``
(the default state). A call made without it to a runner of several states, or under a state
no program serves, is refused (`UnknownState`, naming the states it serves).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

from capture.errors import StateError
from capture.renames import respell
from capture.state import DEFAULT, state_key, state_label
from replay.runtime.fills import fill_call
from replay.runtime.guards import CallFacts, CallNotServed, LeafFacts, ProgramGuard, route
from replay.runtime.manifest import Manifest, ProgramEntry

__all__ = ["Runner", "Router", "Routed", "UnknownState", "resolve_state", "describe_states"]
__all__ += ["picker"]


_MATCHING = object()
"""The key, among a call layout's descriptions by signature, of the entries it matches."""

_SLOW = object()
"""A matching entry whose leaves are read again with torch's pytree (`Router._described`)."""


class Router:
    """Which entry of a manifest serves a live call: `route` over the entries' guards.

    Args:
        model_name: The model's name (for messages).
        module_name: The sub-module served (``""``: the model itself).
        entries: The manifest's program entries of that module, in the order they are tried.

    Attributes:
        model_name: The model's name.
        module_name: The sub-module served.
        entries: The entries, in order.
    """

    def __init__(self, model_name: str, module_name: str, entries: Sequence[ProgramEntry]) -> None:
        self.model_name = model_name
        self.module_name = module_name
        self.entries = list(entries)
        self._by_guard = {id(e.guard): e for e in self.entries}
        self._names = {
            n for e in self.entries for n in (*e.form.positional, *e.form.keywords, *e.form.extra)
        }
        # call layout -> entry signature -> the call's treespec, leaves, and whether its tensors
        # must be read again the slow way
        # (and, under `_MATCHING`, the entries whose recorded structure it is)
        self._seen: dict[Any, dict[Any, Any]] = {}

    @property
    def groups(self) -> list[str]:
        """The groups served, in the order they are tried."""
        return [e.group for e in self.entries]

    def spelled(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's keywords, a renamed argument spelled as the programs take it (the name the
        serving library passes may be the other one: `capture.renames`)."""
        if kwargs.keys() <= self._names:  # every keyword one the programs take as spelled
            return kwargs
        return respell(kwargs, self._names)

    def facts(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        entry: ProgramEntry,
        layout: tuple[Any, list[Any]] | None = None,
    ) -> tuple[str | None, Sequence[LeafFacts], list[Any]]:
        """The call's treespec, leaves and tensors (in leaf order: the order of ``dims``),
        described with the entry's recorded signature (which names positional arguments);
        cached per call layout.

        Args:
            args: The call's positional arguments.
            kwargs: The call's keyword arguments.
            entry: The entry whose signature describes the call.
            layout: The call's `layout`, when the caller already walked it (routing
                describes one call for every entry it tries).
        """
        full, tensors = layout if layout is not None else self.layout(args, kwargs)
        by_signature = self._seen.get(full)
        if by_signature is None:
            by_signature = self._seen[full] = {}
        return self._described(by_signature, args, kwargs, entry, tensors)

    @staticmethod
    def _described(
        by_signature: dict[str | None, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        entry: ProgramEntry,
        tensors: list[Any],
    ) -> tuple[str | None, Sequence[LeafFacts], list[Any]]:
        """`facts` for one call layout: its descriptions so far, by the entry's signature.

        Keywords passed in another order than the signature's are described in its order, as
        the recorder describes them (`capture.record.flatten.in_keyword_order`): the tensors
        come back in that order."""
        found = by_signature.get(entry.signature)
        if found is None:
            from capture.record.flatten import describe, in_keyword_order
            from capture.signature import Signature

            signature = Signature.loads(entry.signature)
            moved = in_keyword_order((args, kwargs), signature)
            order = moved[1] if moved is not None else None
            call = moved[0] if moved is not None else (args, kwargs)
            ordered = [tensors[i] for i in order] if order is not None else list(tensors)
            st = describe(call, ordered, signature=signature)
            found = (st.treespec, tuple(st.leaves), st.slow, order, tuple(call[1]))
            by_signature[entry.signature] = found
        treespec, leaves, slow, order, names = found
        if slow:
            import torch.utils._pytree as pytree

            call = (args, {name: kwargs[name] for name in names})
            tensors = [t for t in pytree.tree_leaves(call) if hasattr(t, "shape")]
        elif order is not None:
            tensors = [tensors[i] for i in order]
        return treespec, leaves, tensors

    @staticmethod
    def layout(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[Any]]:
        """The call's layout key (containers, keys, tensor kinds and ranks; no sizes) and its
        tensors, walked once."""
        full, tensors, _ = _walked(args, kwargs)
        return full, tensors

    def _matching(
        self,
        by_signature: dict[Any, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        walked: list[Any],
    ) -> tuple[tuple[ProgramEntry, Any, Any], ...]:
        """The entries whose recorded structure is the call's layout, in order, each with its
        guard's size check and how its leaves come from the call's tensors as walked (None: in
        that order; `picker` of the order its signature moves them to; or `_SLOW`)."""
        out = []
        for e in self.entries:
            treespec, leaves, _ = self._described(by_signature, args, kwargs, e, walked)
            if e.guard.matches(treespec, leaves):
                _, _, slow, order, _ = by_signature[e.signature]
                pick = _SLOW if slow else None if order is None else picker(order)
                out.append((e, e.guard.check, pick))
        return tuple(out)

    def route(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        entries: Sequence[ProgramEntry] | None = None,
    ) -> tuple[ProgramEntry, list[Any]]:
        """The entry that serves the call (`replay.runtime.guards.route`), and the call's tensors.

        Args:
            args: The call's positional arguments.
            kwargs: The call's keyword arguments.
            entries: Try only these (default: every entry, in order).

        Raises:
            CallNotServed: No entry accepts the call; the message names each group and why.
        """
        full, walked, shapes = _walked(args, kwargs)
        by_signature = self._seen.get(full)  # the layout's key hashed once per call
        if by_signature is None:
            by_signature = self._seen[full] = {}
        if entries is None:
            # A structure does not depend on sizes: it is matched once per layout, then only
            # size guards run. The first entry they accept is the one `route` picks, which runs
            # in full (every refusal described) only when none does.
            matching = by_signature.get(_MATCHING)
            if matching is None:
                matching = by_signature[_MATCHING] = self._matching(
                    by_signature, args, kwargs, walked
                )
            dims = None
            for entry, check, pick in matching:
                if pick is None:  # the call's sizes as walked, read once for every entry tried
                    if dims is None:
                        dims = [*chain.from_iterable(shapes)]
                    if check(dims) is None:
                        return entry, walked
                elif pick is _SLOW:  # described the slow way: its own tensors, its own sizes
                    tensors = self._described(by_signature, args, kwargs, entry, walked)[2]
                    if check([int(s) for t in tensors for s in t.shape]) is None:
                        return entry, tensors
                elif check([*chain.from_iterable(pick(shapes))]) is None:
                    # keywords moved to the signature's order: the walk's shapes, moved too
                    return entry, list(pick(walked))
        return self._route_in_full(args, kwargs, entries, by_signature, walked, shapes)

    def _route_in_full(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        entries: Sequence[ProgramEntry] | None,
        by_signature: dict[Any, Any],
        walked: list[Any],
        shapes: list[Any],
    ) -> tuple[ProgramEntry, list[Any]]:
        """`route` by `replay.runtime.guards.route` itself, every entry's refusal described."""
        seen: dict[int, list[Any]] = {}

        def facts(guard: ProgramGuard) -> CallFacts:
            entry = self._by_guard[id(guard)]
            treespec, leaves, tensors = self._described(by_signature, args, kwargs, entry, walked)
            seen[id(guard)] = tensors
            if tensors is walked:
                return treespec, leaves, [*chain.from_iterable(shapes)]
            return treespec, leaves, [int(s) for t in tensors for s in t.shape]

        tried = self.entries if entries is None else entries
        distances: dict[str, int] = {}
        chosen, reasons = route([e.guard for e in tried], facts, distances)
        if chosen is not None:
            return self._by_guard[id(chosen)], seen[id(chosen)]
        who = f"{self.model_name}.{self.module_name}" if self.module_name else self.model_name
        why = "; ".join(f"{k}: {v}" for k, v in reasons.items()) or "the artifact has no program"
        closest = ""
        if len(distances) > 1:  # the first group tried among the fewest differing inputs
            closest = f"; closest: group {min(distances, key=lambda k: distances[k])}"
        raise CallNotServed(f"no program of {who} accepts this call ({why}){closest}", reasons)


def picker(order: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """A function taking the items of a sequence at `order`, as a tuple (one C call)."""
    if len(order) > 1:
        return itemgetter(*order)
    return lambda items: tuple(items[i] for i in order)


def _walked(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[Any], list[Any]]:
    """The call's layout key (`Router.layout`), its tensors and their shapes, walked once."""
    from capture.record.flatten import tensor_key, walk

    tensors: list[Any] = []
    key: list[Any] = [len(args)]
    walk(args, tensors, key)
    walk(kwargs, tensors, key)
    full, shapes = tensor_key(key, tensors, devices=False)
    return full, tensors, shapes


class UnknownState(CallNotServed, StateError):
    """A call asked for a state the artifact has no program of (or named none where it must)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, {"state": message})


def describe_states(known: Sequence[str]) -> str:
    """The states, by label, for messages (``adapter=a, adapter=b, adapters_disabled``)."""
    return ", ".join(sorted(state_label(k or None) for k in known))


def resolve_state(
    who: str, known: Sequence[str], state: str | None, items: Mapping[str, Any]
) -> str:
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


class Routed:
    """What every runner answers through its `Router`: its groups, and which one serves a call.

    Subclasses set ``self._router``.
    """

    _router: Router

    @property
    def groups(self) -> list[str]:
        """The groups this runner serves, in the order they are tried."""
        return self._router.groups

    states: list[str]

    def state(self, state: str | None = None, /, **items: Any) -> Any:
        """This runner serving one recorded state only: what a server calls a request with.

        ``runner.state(adapter="b")(**inputs)`` runs the programs exported with adapter ``b``
        active; a call of an artifact of several states made without it is refused. The view
        is built once per state and kept.

        Args:
            state: A state's label (``"adapter=b"``, ``"adapters_disabled"``, ``"default"``)
                or key (``'{"adapter":"b"}'``); or None, and the state's items as keywords.
            **items: The state's items (``adapter="b"``, ``adapters_disabled=True``,
                ``training=True``, a declared item ``tenant="x"``); none: the default state.

        Returns:
            A runner of the same kind over that state's programs (its sub-modules' too); this
            one when it serves that state only.

        Raises:
            UnknownState: The artifact has no program of that state (the message names its
                states).

        Example:
            >>> runner.state(adapter="b").select(**inputs)  # doctest: +SKIP
            'decode+adapter=b'
        """
        key = resolve_state(self._who(), self.states, state, items)
        return self if self.states == [key] else self._view(key)

    def _view(self, key: str) -> Any:
        """This runner over the programs of state `key` only."""
        raise NotImplementedError

    def select(self, *args: Any, **kwargs: Any) -> str:
        """The group that would serve this call (nothing runs).

        Raises:
            CallNotServed: No group accepts the call, or the runner serves several states
                (then `UnknownState`, naming them: call ``runner.state(...).select``).
        """
        if len(self.states) > 1:
            raise state_required(self._who(), self.states)
        return self._router.route(args, self._router.spelled(kwargs))[0].group

    def _who(self) -> str:
        """The model (and sub-module) served, for messages."""
        module_name = self._router.module_name
        return self._router.model_name + (f".{module_name}" if module_name else "")


class Runner(Routed):
    """Calls an artifact's programs like the original model (what `replay.load` returns).

    Args:
        manifest: The artifact's typed manifest.
        programs: Program name -> its `replay.runtime.pt2.program.Program`.
        modules: Program name -> what runs it (``program.module()``: the program itself).
        compiled: Program name -> its AOTInductor build (run instead of the module).
        module_name: The sub-module this runner serves.
        state: Serve only the programs of this state key (`state` builds such a view); None:
            every program, a call refused when they serve several states.

    Attributes:
        manifest: The artifact's typed manifest.
        programs: Program name -> its `replay.runtime.pt2.program.Program` (its graph module,
            ``state_dict`` and ``constants``: the artifact's tensors).
        compiled: Program name -> its AOTInductor build, for artifacts loaded with
            ``compiled=True`` (calls then run it instead of the exported program).
        module_name: The sub-module this runner serves (``""``: the model itself).
        modules: Sub-module name -> its `Runner` (``runner.modules["encoder"]``).
    """

    def __init__(
        self,
        manifest: Manifest,
        programs: Mapping[str, Any],
        modules: Mapping[str, Any],
        compiled: Mapping[str, Any] | None = None,
        module_name: str = "",
        state: str | None = None,
    ) -> None:
        self.manifest = manifest
        self.programs = dict(programs)
        self.compiled = dict(compiled or {})
        self.module_name = module_name
        self.states = manifest.states(module_name)
        """The state keys this runner's programs serve (`capture.state`; ``""``: default)."""
        entries = manifest.for_module(module_name)
        if state is not None:
            entries = [e for e in entries if e.state == state]
            self.states = [state]
        self._router = Router(manifest.model_name, module_name, entries)
        self._all_modules = modules
        self._runnables = {
            e.program: self.compiled.get(e.program) or modules[e.program]
            for e in self._router.entries
        }
        self._views: dict[str, Runner] = {}
        self.modules: dict[str, Runner] = {}
        if not module_name:
            for name in manifest.modules:
                if name:
                    self.modules[name] = Runner(manifest, programs, modules, compiled, name, state)

    def _view(self, key: str) -> Runner:
        """This runner over the programs of state `key` only, built once."""
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = Runner(
                self.manifest,
                self.programs,
                self._all_modules,
                self.compiled,
                self.module_name,
                key,
            )
        return view

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the call on the program that accepts it.

        A group served by another group's program (`replay.pipeline.merging`) gets the inputs that
        program takes and the call lacks, filled by the entry's rules (`replay.runtime.fills`).

        Returns:
            The program's output, shaped as eager returns it (output dataclasses, caches).

        Raises:
            CallNotServed: No program accepts the call (structure or guards).
        """
        from replay.runtime.callform import arrange

        if len(self.states) > 1:
            raise state_required(self._who(), self.states)
        kwargs = self._router.spelled(kwargs)
        entry, tensors = self._router.route(args, kwargs)
        if entry.fills:
            dims = [int(s) for t in tensors for s in t.shape]
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
                f"group {label} of {self.manifest.model_name} matched, but {reason}",
                {label: reason},
            ) from e

    def __repr__(self) -> str:
        name = self._who()
        return f"Runner({name}, groups={self.groups}, modules={sorted(self.modules)})"
