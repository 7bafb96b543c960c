"""The runner, the ONNX side: `replay.runtime.runner` on onnxruntime sessions, behind the guards.

Same contract as the ``.pt2`` runner (`replay.runtime.runner.Runner`): called like the model, it
picks the file whose recorded structure matches the call and whose guards accept its sizes
with the same rule (`replay.runtime.guards.route`, through the same `replay.runtime.runner.Router`),
over the typed entries of its manifest (`replay.runtime.ort.manifest`: recorded ranges, cut to the
program's bounds where torch.export bounded a dim, equal dims, relations, the program's own
size guards, and the signatures the ONNX check failed); the file's program
(`replay.runtime.ort.program.OnnxProgram`) builds the feeds and returns eager's types:

- **feeds**: the call's tensors in recorded leaf order (the order of ``dims``: a
  ``DynamicCache`` flattened by capture's registrations, a sliding window's shape-only
  ``seen_tokens`` leaf included) give each ONNX input the leaf the manifest binds it to; an
  optional argument the call omits is simply not an input of its group's file;
- **outputs**: the ONNX outputs (and the program's constant outputs) are put back into the
  program's output treespec, parsed by `capture.pytree.treespec` (a ``CausalLMOutputWithPast``
  holding a ``DynamicCache``).

As with the ``.pt2`` runner, an input cache is not grown in place: the new cache is in the
output. Sessions use onnxruntime's CPU execution provider unless `load_onnx` is given others.

**Modes** (`replay.runtime.ort.sessions`, `OnnxRunner.mode`): the set's files combined into one
model served by one session (each file an ``If`` branch, the weights loaded and prepacked once),
or a session per file (a copy of the weights each); by default the one whose calls cost
onnxruntime's own time at the set's size, measured: a session per file under 128 MiB of weights.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from replay.runtime.fills import fill_call
from replay.runtime.guards import CallNotServed
from replay.runtime.manifest import ProgramEntry
from replay.runtime.ort import sessions as sessions_
from replay.runtime.ort.checks import read_checked
from replay.runtime.ort.combined import Branch, Checked, combine, partition
from replay.runtime.ort.manifest import OnnxManifest, manifest_path, read_onnx_set
from replay.runtime.ort.program import OnnxProgram
from replay.runtime.ort.weights import OnnxFileError
from replay.runtime.runner import Routed, Router, picker

__all__ = ["OnnxRunner", "OnnxProgram", "OpenedSet", "load_onnx", "open_onnx", "open_set", "CPU"]

CPU = ("CPUExecutionProvider",)
"""The execution providers a runner uses by default."""


class OnnxRunner(Routed):
    """Calls an ONNX set like the original model (what ``replay.load("model.onnx")`` returns).

    Attributes:
        manifest: The set's typed manifest (`replay.runtime.ort.manifest.OnnxManifest`).
        programs: Program name (the group that owns the file; ``encoder.g0`` for a
            sub-module's) -> its `OnnxProgram`.
        module_name: The sub-module this runner serves (``""``: the model itself).
        modules: Sub-module name -> its `OnnxRunner` (``runner.modules["encoder"]``), as the
            ``.pt2`` runner has them.
    """

    def __init__(
        self,
        manifest: OnnxManifest,
        programs: dict[str, OnnxProgram],
        module: str = "",
    ) -> None:
        self.manifest = manifest
        self.programs = programs
        self.module_name = module
        self.modules: dict[str, OnnxRunner] = {}
        self._router = Router(
            manifest.manifest.model_name, module, manifest.manifest.for_module(module)
        )
        # An ONNX set serves one state (the export refuses several): `state()` returns self.
        self.states = manifest.manifest.states(module)
        # each entry's tensor leaf paths, in the order a call's tensors come (`Router.route`),
        # and where its file's inputs are among them (None: the file takes one it lacks)
        self._paths = {
            id(e): [leaf.path for leaf in e.guard.leaves if leaf.kind == "tensor"]
            for e in self._router.entries
        }
        # per entry: its program and the function picking its file's inputs among the call's
        # tensors
        self._plans: dict[int, tuple[OnnxProgram, Any]] = {}
        for e in self._router.entries:
            if e.fills or e.program not in programs:
                continue
            order = programs[e.program].feed_order(self._paths[id(e)])
            if order is not None:
                self._plans[id(e)] = (programs[e.program], picker(order))
        if not module:
            for name in manifest.manifest.modules:
                if name:
                    self.modules[name] = OnnxRunner(manifest, programs, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the call on the ONNX file that accepts it.

        Returns:
            The output, shaped as eager returns it (output dataclasses, caches).

        Raises:
            CallNotServed: No file accepts the call (structure, ranges, relations, a signature
                the ONNX check failed), or onnxruntime refused it.
        """
        kwargs = self._router.spelled(kwargs)
        entry, tensors = self._router.route(args, kwargs)
        return self._run(entry, args, kwargs, tensors)

    def _run(
        self, entry: ProgramEntry, args: tuple[Any, ...], kwargs: dict[str, Any], tensors: Any
    ) -> Any:
        """Runs a routed call on its entry's file: its tensors fed in the order made once per
        entry, or by leaf path where inputs are filled (or the file takes one the entry lacks:
        `OnnxProgram.run` names it)."""
        plan = self._plans.get(id(entry))
        if plan is not None:
            return plan[0].run_at(tensors, plan[1])
        return self.programs[entry.program].run(self._by_path(entry, args, kwargs, tensors))

    def _by_path(
        self,
        entry: ProgramEntry,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        tensors: Sequence[Any],
    ) -> dict[str, Any]:
        """The call's tensors by recorded leaf path, as the entry's file takes them."""
        if not entry.fills:  # the call matched the entry's recorded leaves
            return dict(zip(self._paths[id(entry)], tensors, strict=True))
        # A group served by another group's program: the inputs it lacks, filled as the .pt2
        # runner fills them; the filled call is the owner's, read again by path.
        dims = [int(s) for t in tensors for s in t.shape]
        args, kwargs = fill_call(entry.fills, args, kwargs, dims)
        _, leaves, tensors = self._router.facts(args, kwargs, entry)
        paths = [leaf.path for leaf in leaves if leaf.kind == "tensor"]
        return dict(zip(paths, tensors, strict=True))

    def feeds(self, *args: Any, **kwargs: Any) -> tuple[OnnxProgram, dict[str, Any]]:
        """The file a call runs on and the tensors its inputs get (nothing runs): what a bare
        ``onnxruntime.InferenceSession`` of the same file would be fed (bench/bench_onnx.py).

        Raises:
            CallNotServed: No file accepts the call.
        """
        entry, tensors = self._router.route(args, kwargs)
        by_path = self._by_path(entry, args, kwargs, tensors)
        program = self.programs[entry.program]
        return program, {i.name: by_path[i.path] for i in program.file.inputs}

    def run_group(self, group: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Runs the call on one group's entry, behind that entry's guard only (the ONNX check
        runs each coverage row on its own group this way).

        Raises:
            CallNotServed: The group's guard refuses the call, or onnxruntime does.
        """
        mine = [e for e in self._router.entries if e.group == group]
        if not mine:
            raise CallNotServed(f"no ONNX file serves group {group}", {group: "no ONNX file"})
        kwargs = self._router.spelled(kwargs)
        entry, tensors = self._router.route(args, kwargs, mine)
        return self._run(entry, args, kwargs, tensors)

    @property
    def mode(self) -> str:
        """How the set's files run: ``"combined"`` (each file a branch of one session, the
        weights loaded and prepacked once) or ``"per-file"`` (a session per file)."""
        return "combined" if any(p.branch for p in self.programs.values()) else "per-file"

    def __repr__(self) -> str:
        name = self.manifest.manifest.model_name + (
            f".{self.module_name}" if self.module_name else ""
        )
        groups, modules = self.groups, sorted(self.modules)
        return f"OnnxRunner({name}, mode={self.mode}, groups={groups}, modules={modules})"


def _register_types(types: set[str]) -> None:
    """Makes the types the output treespecs name known to torch's pytree, by the loader's one
    table (`replay.runtime.allowed`): capture's cache registrations (held for the life of the
    process: every call unflattens with them), transformers' output classes (registered when
    their module is imported) and diffusers' (`capture.pytree.outputs`). Anything else must be
    registered by the caller; parsing the treespec then says which
    (`capture.pytree.treespec`)."""
    from replay.runtime.allowed import ALLOWED_MODULES

    wanted = {t for t in types if t.startswith(ALLOWED_MODULES)}
    if wanted:  # capture's registrations import torch: only when a type needs them
        from replay.runtime.allowed import register_types

        register_types(wanted)


def load_onnx(
    path: str | os.PathLike[str],
    *,
    share_weights: bool = True,
    providers: Sequence[str] = CPU,
    threads: int | None = None,
    allow_ops: Iterable[str] | None = None,
    verify_weights: bool = False,
    mode: str = "auto",
) -> OnnxRunner:
    """Loads the ONNX set written by ``replay.export(..., onnx=path)`` as a runner, validated
    in full first (`replay.validation.validate`, what ``capture check`` runs).

    Args:
        path: The path given to ``onnx=`` (``model.onnx``) or its manifest ``model.onnx.json``.
        share_weights: False: one session per file, each with its own copy of the weights
            (``mode="per-file"``); True: as `mode` says.
        providers: onnxruntime execution providers (default: CPU).
        threads: onnxruntime's intra-op threads per session (default: its own, one per core).
        allow_ops: Operator domains the models may use beyond the standard ones
            (`replay.runtime.ort.checks.DOMAINS`).
        verify_weights: Also hash the weights file against the manifest (the model files
            always are).
        mode: ``"auto"`` (a session per file under 128 MiB of weights, where the combined
            session's ``If`` branches cost a few % per call; one combined session, the weights
            once, from there), ``"combined"`` or ``"per-file"``
            (`replay.runtime.ort.sessions`); `OnnxRunner.mode` says which serves.

    Returns:
        An `OnnxRunner`.

    Raises:
        OnnxFileError: No manifest, a malformed one, a file it names that is missing, a link,
            changed (its digest) or not ONNX, an operator outside the allowed domains, or
            weights referenced outside the set's weights file.
        ReplayError: onnxruntime is not installed, or an unknown `mode`.

    Example:
        >>> runner = replay.load("model.onnx")  # doctest: +SKIP
        >>> out = runner(input_ids=ids, attention_mask=mask)  # doctest: +SKIP
    """
    from replay.runtime.allowed import allow_ops as allowed_ops

    opened = open_onnx(
        path,
        allowed=allowed_ops(allow_ops),
        verify_weights=verify_weights,
        share_weights=share_weights,
        providers=providers,
        threads=threads,
        mode=mode,
    )
    return opened.runner()


@dataclass
class OpenedSet:
    """An ONNX set validated in full and opened (`open_onnx`): its sessions exist, none ran.

    Attributes:
        manifest: The set's typed manifest.
        runner_: The runner over its sessions.
    """

    manifest: OnnxManifest
    runner_: OnnxRunner

    def runner(self) -> OnnxRunner:
        """The `OnnxRunner` over the opened sessions."""
        return self.runner_


def open_onnx(
    path: str | os.PathLike[str],
    *,
    allowed: Iterable[str] = (),
    verify_weights: bool = False,
    share_weights: bool = True,
    providers: Sequence[str] = CPU,
    threads: int | None = None,
    mode: str = "auto",
) -> OpenedSet:
    """Validates and opens an ONNX set: `replay.validation.validate` for a set.

    The manifest and its files are read as data (`read_onnx_set`), every model file (and with
    `verify_weights` the weights file) hashed against the manifest's digest, then `open_set`
    checks each model's operators and external data and opens its session.

    Raises:
        OnnxFileError: See `load_onnx`.
    """
    from replay.runtime.digests import check_digest, digest_file

    manifest = read_onnx_set(path)
    folder = os.path.dirname(os.path.abspath(manifest_path(path)))
    names = sorted({f.file for f in manifest.files}) + (
        [manifest.weights] if verify_weights else []
    )
    for name in names:
        full = os.path.join(folder, name)
        check_digest(manifest.manifest.digests.get(name), digest_file(full), full)
    runner = open_set(
        manifest,
        folder,
        share_weights=share_weights,
        providers=providers,
        threads=threads,
        allowed=allowed,
        mode=mode,
    )
    return OpenedSet(manifest, runner)


def open_set(
    manifest: OnnxManifest,
    folder: str,
    *,
    share_weights: bool = True,
    providers: Sequence[str] = CPU,
    threads: int | None = None,
    allowed: Iterable[str] = (),
    mode: str = "auto",
) -> OnnxRunner:
    """A runner over the ONNX files of `manifest` in `folder` (`load_onnx` without reading the
    manifest: the export's check opens the files it just wrote this way, before its manifest).

    Raises:
        OnnxFileError: See `load_onnx`.
        ReplayError: onnxruntime is not installed.
    """
    from capture.errors import ReplayError

    try:
        import onnxruntime as ort
    except ImportError as e:
        raise ReplayError(
            "running ONNX files needs onnxruntime; run `pip install capture[onnx]`"
        ) from e
    weights = manifest.weights
    owners = manifest.program_files()
    missing = set(manifest.manifest.program_names) - set(owners)
    if missing:
        raise OnnxFileError(
            f"the manifest serves groups with programs it has no file of: {sorted(missing)}"
        )
    files = sorted({f.file for f in owners.values()})
    types: set[str] = set()
    for entry in manifest.manifest.programs:
        types.update(entry.pytree_types)
    _register_types(types)
    served = {f: [o for o in owners.values() if o.file == f] for f in files}  # loops' bounds
    chosen = sessions_.chosen_mode(mode, share_weights, os.path.join(folder, weights))
    opened = _sessions(ort, chosen, folder, weights, served, allowed, providers, threads)
    # the models' protos and the combined model's bytes are gone now: their memory goes back
    sessions_.release_freed_memory()
    programs = {
        name: OnnxProgram(name, owned, *opened[owned.file]) for name, owned in owners.items()
    }
    return OnnxRunner(manifest, programs)


def _sessions(
    ort: Any,
    mode: str,
    folder: str,
    weights: str,
    served: dict[str, list[Any]],
    allowed: Iterable[str],
    providers: Sequence[str],
    threads: int | None,
) -> dict[str, tuple[Any, Branch | None]]:
    """Each file's session (and its branch, in the combined session) in `mode`, the files
    checked first (`read_checked`). The checked models and the combined model's bytes live
    only here: they are freed when it returns, before the C heap is trimmed."""
    checked = [
        Checked(f, *read_checked(os.path.join(folder, f), weights, allowed, owned))
        for f, owned in served.items()
    ]
    sessions: dict[str, tuple[Any, Branch | None]] = {}
    if mode == "combined":
        for group in partition(checked):
            model, branches = combine(group, weights)
            names = ", ".join(c.file for c in group)
            model_bytes = model.SerializeToString()
            del model
            session = sessions_.session(ort, model_bytes, names, folder, providers, threads)
            sessions.update({f: (session, branches[f]) for f in branches})
    else:
        for c in checked:
            path = os.path.join(folder, c.file)
            opened = sessions_.session(ort, path, c.file, folder, providers, threads)
            sessions[c.file] = (opened, None)
    return sessions
