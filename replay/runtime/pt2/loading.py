"""Loading an artifact: the PT2 archive `replay.artifact.saving.save` writes, read as data.

`save` writes torch's PT2 archive layout (`replay.runtime.pt2.archive` lists its entries) with the
program of every call group of the model and of each recorded sub-module (``encoder``): each
program's graph as torch's JSON, every parameter, buffer and constant ONCE however many
programs use it (`replay.runtime.pt2.weights`), and the manifest (`replay.runtime.manifest`): per
program its recorded input structure and guards, per module the coverage table, the versions and the
store it was exported from. Example inputs are not shipped (torch would pickle them).

`replay.load` reads it back in any process, with no capture context, and never unpickles, imports or
evaluates anything the archive names: `read_artifact` checks every entry against what `save`
writes (`replay.runtime.pt2.archive`), parses the manifest and the payload configs into typed
objects with bounded sizes, and checks every string of the program graphs that torch would run
as code (`replay.runtime.pt2.graph_check`), all before torch reads a byte; the weights are then
memory-mapped once (`replay.runtime.pt2.weights.load_tensors`) and each program's graph is built
from its checked JSON around those tensors (`replay.runtime.pt2.program`: torch's own
deserializer, with its ShapeEnv, sympy and fake tensors, is not needed to run a graph; its input
checks are read from the JSON, `replay.runtime.pt2.shape_checks`). The pytree types the programs
name are registered (transformers caches through `capture.pytree.nodes`, other
``transformers.*`` types by importing their module, nothing else). The result is a
`replay.runtime.runner.Runner`: called like the model, it routes the call to the program whose
structure and guards accept it (`replay.runtime.guards.route`).

An artifact saved with ``aoti=True`` also holds AOTInductor builds, compiled without their
weights; ``replay.load(path, compiled=True)`` runs them on the artifact's single copy of the weights
(``user_managed`` constants). A build is native code: loading it runs it, so it is opt-in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from replay.runtime.allowed import ALLOWED_MODULES, AllowOps, loadable_type, register_types
from replay.runtime.allowed import allow_ops as allowed_ops
from replay.runtime.digests import check_digest, digest_bytes, digest_file
from replay.runtime.guards import ArtifactError, CallNotServed
from replay.runtime.manifest import FORMAT, MANIFEST_CAP, Manifest
from replay.runtime.pt2 import native
from replay.runtime.pt2.archive import (
    ARCHIVE_FORMAT,
    ARCHIVE_VERSION,
    BYTEORDER,
    CONFIG_CAP,
    CONSTANT_PREFIX,
    CONSTANTS_CONFIG,
    CONSTANTS_DIR,
    MANIFEST,
    MODELS,
    PROGRAM_CAP,
    SAMPLE_INPUTS,
    SERIALIZATION_ID,
    WEIGHT_PREFIX,
    WEIGHTS_CONFIG,
    WEIGHTS_DIR,
    ZIP_VERSION,
    Archive,
)
from replay.runtime.pt2.graph_check import check_program, spec_types
from replay.runtime.pt2.limits.budget import check_budget, symbol_maxima
from replay.runtime.pt2.limits.effects import Effects
from replay.runtime.pt2.program import Program, build_program
from replay.runtime.pt2.records import check_extent, parse_config
from replay.runtime.pt2.weights import ProgramSlots, load_tensors
from replay.runtime.runner import Runner

__all__ = [
    "ArtifactError",
    "CallNotServed",
    "Runner",
    "Artifact",
    "read_artifact",
    "read_manifest",
    "open_artifact",
    "Opened",
    "MANIFEST",
    "FORMAT",
]


_UNDESCRIBED = frozenset(
    {ARCHIVE_FORMAT, ARCHIVE_VERSION, BYTEORDER, ZIP_VERSION, SERIALIZATION_ID, MANIFEST}
)
"""Entries the manifest's digests do not cover: itself, and torch's format markers (whose
content is checked byte for byte)."""


@dataclass
class Artifact:
    """An artifact read as data (`read_artifact`): nothing of it has run.

    Attributes:
        archive: The checked archive.
        manifest: The typed manifest.
        slots: Program name -> where its tensors are (its payload configs).
        graphs: Program name -> its checked graph JSON (bytes).
        trees: Program name -> that JSON, parsed (emptied by `open_artifact` once the
            programs are built).
        types: Pytree node types the graphs and the manifest name.
        effects: Program name -> the buffers it may write (`replay.runtime.pt2.limits.effects`).
    """

    archive: Archive
    manifest: Manifest
    slots: dict[str, ProgramSlots] = field(default_factory=dict)
    graphs: dict[str, bytes] = field(default_factory=dict)
    trees: dict[str, dict[str, Any]] = field(default_factory=dict)
    types: set[str] = field(default_factory=set)
    effects: dict[str, Effects] = field(default_factory=dict)

    @property
    def weight_bytes(self) -> int:
        """Bytes of every tensor record in the archive (each stored once)."""
        return sum(e.size for n, e in self.archive.entries.items() if Archive.is_record(n))


def read_artifact(
    path: str | os.PathLike[str],
    known_type: Callable[[str], bool] | None = None,
    allowed: AllowOps = frozenset(),
) -> Artifact:
    """Reads and checks a whole artifact without torch (the first part of
    `replay.validation.validate`): every entry, the manifest, the payload configs and the
    program graphs, each graph and config verified against its digest.

    Args:
        path: The ``.pt2``.
        known_type: Which pytree types the graphs may name (default: any dotted name; `load`
            allows the types registered in its process and ``transformers.*``).
        allowed: Operator namespaces a program may call beyond the model's math
            (`replay.runtime.pt2.operators`).

    Returns:
        The `Artifact`.

    Raises:
        ArtifactError: No file, not an artifact, another manifest format, or any entry that is
            not what `save` writes (named): one line, never a traceback.
    """
    archive = Archive.open(path)
    if MANIFEST not in archive.entries:
        raise ArtifactError(
            f"{archive.path} holds no {MANIFEST.rpartition('/')[2]}: not written by "
            "ExportResult.save (capture export --out MODEL.pt2 writes one)"
        )
    archive.check_small_files()
    manifest = Manifest.parse(archive.read(MANIFEST, MANIFEST_CAP), archive.name(MANIFEST))
    known = known_type or loadable_type
    fixed = {ARCHIVE_FORMAT, ARCHIVE_VERSION, BYTEORDER, ZIP_VERSION, SERIALIZATION_ID, MANIFEST}
    names = manifest.program_names
    for p in names:
        fixed |= {MODELS.format(p), SAMPLE_INPUTS.format(p)}
        fixed |= {WEIGHTS_CONFIG.format(p), CONSTANTS_CONFIG.format(p)}
    aoti = names if manifest.aoti else []
    # Unknown entries are refused by name before any config or graph is read.
    archive.check_layout(fixed | {n for n in archive.entries if Archive.is_record(n)}, aoti)
    art = Artifact(archive, manifest)
    _check_types(art, known)
    records: set[str] = set()
    checked: set[tuple[str, Any]] = set()  # strings found good, shared by the programs
    for p in names:
        _read_program(art, p, records, checked, known, allowed)
    # Every record is named by a config, every named record exists.
    archive.check_layout(fixed | records, aoti)
    _check_written_records(art)
    described = set(archive.entries) - _UNDESCRIBED
    if set(manifest.digests) != described:
        odd = sorted(set(manifest.digests) ^ described)
        raise ArtifactError(
            f"{archive.name(MANIFEST)}: its digests do not describe the archive's files "
            f"({odd[0][:120]} differs); it is not loaded"
        )
    return art


def _check_types(art: Artifact, known: Callable[[str], bool]) -> None:
    """Every pytree type the manifest names is one the loader registers (kept in `art`)."""
    for entry in art.manifest.programs:
        for name in entry.pytree_types:
            if not known(name):
                where = art.archive.name(MANIFEST)
                raise ArtifactError(
                    f"{where}: program {entry.program} names the pytree type {name[:200]}, "
                    f"which the loader does not register (only {', '.join(ALLOWED_MODULES)} "
                    "types are, and those registered in the loading process)"
                )
        art.types.update(entry.pytree_types)


def _read_program(
    art: Artifact,
    p: str,
    records: set[str],
    checked: set[tuple[str, Any]],
    known: Callable[[str], bool],
    allowed: AllowOps,
) -> None:
    """One program's entries checked into `art`: no example inputs, its payload configs (records
    added to `records`), its graph (digest, operators, effects, size budget)."""
    archive, manifest = art.archive, art.manifest
    if archive.entries[SAMPLE_INPUTS.format(p)].size:
        raise ArtifactError(
            f"{archive.name(SAMPLE_INPUTS.format(p))} is not empty: capture never ships "
            "example inputs (torch would unpickle them)"
        )
    art.slots[p] = _slots(archive, p, records, manifest.digests)
    inner = MODELS.format(p)
    graph = archive.read(inner, PROGRAM_CAP)
    check_digest(manifest.digests.get(inner), digest_bytes(graph), archive.name(inner))
    found: list[Effects] = []
    tree = check_program(graph, archive.name(inner), known, allowed, checked, found)
    art.effects[p] = found[0]
    check_budget(tree, symbol_maxima(tree, _recorded_maxima(manifest, p)), archive.name(inner))
    art.types |= spec_types(tree)
    art.graphs[p] = graph
    art.trees[p] = tree


def _recorded_maxima(manifest: Manifest, program: str) -> list[list[int | None]]:
    """Per recorded input leaf of the program, the largest size the runner admits per axis."""
    for entry in manifest.programs:
        if entry.program == program:
            out: list[list[int | None]] = []
            for leaf in entry.guard.leaves:
                axes = {a.axis: a.max for a in entry.guard.axes if a.path == leaf.path}
                out.append([axes.get(i) for i in range(max(axes, default=-1) + 1)])
            return out
    return []


def _check_written_records(art: Artifact) -> None:
    """No record a program's buffer writes also holds a parameter or a constant (a config
    placing both in one record would let the buffer's writes change the weight)."""
    written: dict[str, tuple[str, str]] = {}
    for program, effects in art.effects.items():
        slots = art.slots[program]
        for name in effects.written:
            for table, folder in ((slots.weights, WEIGHTS_DIR), (slots.constants, CONSTANTS_DIR)):
                if name in table:
                    written[folder + table[name].record] = (program, name)
    if not written:
        return
    for program, effects in art.effects.items():
        slots = art.slots[program]
        for table, folder in ((slots.weights, WEIGHTS_DIR), (slots.constants, CONSTANTS_DIR)):
            for name, slot in table.items():
                hit = written.get(folder + slot.record)
                if hit is not None and name in effects.read_only:
                    raise ArtifactError(
                        f"{art.archive.name(folder + slot.record)} holds {name[:80]} (read-only "
                        f"in {program}) and the buffer {hit[1][:80]}, which {hit[0]} writes; a "
                        "written buffer has a record of its own, so it is not loaded"
                    )


def _slots(
    archive: Archive, program: str, records: set[str], digests: Mapping[str, str]
) -> ProgramSlots:
    """A program's payload configs, each tensor checked to lie within its record (whose
    names are added to `records`)."""
    slots = ProgramSlots()
    for table, config, folder, prefix in (
        (slots.weights, WEIGHTS_CONFIG, WEIGHTS_DIR, WEIGHT_PREFIX),
        (slots.constants, CONSTANTS_CONFIG, CONSTANTS_DIR, CONSTANT_PREFIX),
    ):
        inner = config.format(program)
        data = archive.read(inner, CONFIG_CAP)
        check_digest(digests.get(inner), digest_bytes(data), archive.name(inner))
        table.update(parse_config(data, archive.name(inner), prefix))
        for name, slot in table.items():
            record = f"{folder}{slot.record}"
            found = archive.entries.get(record)
            if found is None:
                raise ArtifactError(
                    f"{archive.path} lacks {archive.root}/{record} ({name} of {program})"
                )
            check_extent(slot, found.size, f"{archive.name(record)} ({name} of {program})")
            records.add(record)
    return slots


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """The typed manifest of an artifact, the whole artifact checked (`read_artifact`).

    Raises:
        ArtifactError: See `read_artifact`.

    Example:
        >>> read_manifest("model.pt2").model_name  # doctest: +SKIP
        'LlamaForCausalLM'
    """
    return read_artifact(path).manifest


@dataclass
class Opened:
    """An artifact validated in full and opened (`open_artifact`): nothing of it has run.

    Attributes:
        art: The artifact read as data.
        programs: Program name -> its ``ExportedProgram`` (over the mapped weights).
        modules: Program name -> its ``.module()``.
        builds: Program name -> its AOTInductor runner (``compiled=True`` only).
    """

    art: Artifact
    programs: dict[str, Any]
    modules: dict[str, Any]
    builds: dict[str, Any]

    def runner(self) -> Runner:
        """The `Runner` over the opened programs."""
        return Runner(self.art.manifest, self.programs, self.modules, self.builds)


def open_artifact(
    path: str | os.PathLike[str],
    *,
    device: str | None = None,
    compiled: bool = False,
    allowed: AllowOps = frozenset(),
    verify_weights: bool = False,
    probe: bool = True,
) -> Opened:
    """Validates and opens an artifact: `replay.validation.validate` for a ``.pt2``.

    `read_artifact` checks it as data; the weight records are hashed against the manifest
    (`verify_weights`), mapped once and placed (`replay.runtime.pt2.weights.load_tensors`);
    the pytree types the programs name are registered; every program's graph is built from
    its JSON around those tensors (`replay.runtime.pt2.program`). Nothing is run
    (AOTInductor builds are loaded, which runs their native code, only with
    ``compiled=True``, and only once a child process loaded them first: `native.probe`,
    unless `probe` is False, as in that child).

    Raises:
        ArtifactError: See `load`.
    """
    art = read_artifact(path, allowed=allowed)
    if compiled and not art.manifest.aoti:
        raise ArtifactError(
            f"{art.archive.path} holds no AOTInductor builds; save it with aoti=True "
            "(capture export --aoti) or load it without compiled=True"
        )
    if compiled:
        import torch

        native.check_release(
            art.archive.path, art.manifest.versions.get("torch"), torch.__version__
        )
        if probe:
            native.probe(art.archive.path, device or "cpu", sorted(allowed))
    if verify_weights:
        _verify_files(art)
    register_types(art.types)
    target = device or "cpu"
    tensors = load_tensors(art.archive, art.slots, target)
    programs = {name: _program(art, name, tensors[name], target) for name in art.graphs}
    art.trees.clear()  # the programs hold their fx graphs; the parsed trees go now
    modules = {name: _module(art, name, p) for name, p in programs.items()}
    builds = {n: _compiled(art, n, tensors[n], target) for n in programs} if compiled else {}
    return Opened(art, programs, modules, builds)


def _verify_files(art: Artifact) -> None:
    """Every entry the digests describe but `read_artifact` did not read (weight records,
    AOTInductor files), hashed in place."""
    archive = art.archive
    read = {MODELS.format(p) for p in art.graphs}
    read |= {c.format(p) for p in art.graphs for c in (WEIGHTS_CONFIG, CONSTANTS_CONFIG)}
    for inner in sorted(set(art.manifest.digests) - read):
        entry = archive.entries[inner]
        found = digest_file(archive.path, entry.offset, entry.size)
        check_digest(art.manifest.digests[inner], found, archive.name(inner))


def _module(art: Artifact, name: str, program: Any) -> Any:
    try:
        return program.module()
    except Exception as e:
        raise _torch_refused(art.archive.name(MODELS.format(name)), "build", e) from e


def _program(
    art: Artifact, name: str, tensors: tuple[dict[str, Any], dict[str, Any]], device: str
) -> Program:
    """One program, built from its checked graph JSON around the artifact's tensors
    (`replay.runtime.pt2.program`); its device arguments moved when the weights were."""
    saved = {
        s.device for s in (*art.slots[name].weights.values(), *art.slots[name].constants.values())
    }
    moved = device if saved - {device} or device != "cpu" else None
    source = art.archive.name(MODELS.format(name))
    try:
        return build_program(name, art.trees[name], tensors[0], tensors[1], moved, source)
    except ArtifactError:
        raise
    except Exception as e:  # torch refusing a node (an operator's signature, a treespec)
        raise _torch_refused(source, "read", e) from e


def _torch_refused(source: str, verb: str, error: Exception) -> ArtifactError:
    """One line for what torch raised on a program: its type and its message's first line."""
    first = (str(error).strip().splitlines() or [""])[0][:200]
    return ArtifactError(
        f"{source}: torch cannot {verb} this program: {type(error).__name__}: {first}"
    )


def _compiled(
    art: Artifact, name: str, tensors: tuple[dict[str, Any], dict[str, Any]], device: str
) -> Any:
    """The AOTInductor build of one program, running on the artifact's own weights."""
    import torch

    from capture import compat_archive

    index = torch.device(device).index
    runner = compat_archive.aoti_load(art.archive.path, name, -1 if index is None else index)
    available = {**tensors[0], **tensors[1]}
    wanted = list(runner.get_constant_fqns())
    absent = [fqn for fqn in wanted if fqn not in available]
    if absent:
        raise ArtifactError(
            f"{art.archive.path}: the AOTInductor build of {name} needs {absent[0]}, which its "
            "program does not hold"
        )
    # user_managed: the build reads these very tensors (no copy); they live as long as the runner
    runner.load_constants(
        {fqn: available[fqn].detach() for fqn in wanted}, check_full_update=True, user_managed=True
    )
    return runner


def probe_child() -> None:
    """The child `replay.runtime.pt2.native.probe` starts: ``argv`` = PATH DEVICE [ALLOWED_OP ...].

    Opens the artifact with its builds, as ``replay.load(compiled=True)`` would, without a probe
    of its own; an `ArtifactError` is one ``Error:`` line on stderr and exit status 1.
    """
    import sys

    path, device, *allowed = sys.argv[1:]
    try:
        open_artifact(path, device=device, compiled=True, allowed=allowed_ops(allowed), probe=False)
    except ArtifactError as e:
        print(f"Error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
