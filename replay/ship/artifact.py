"""One artifact to ship: every program in one PT2 archive, each weight once, and a typed manifest.

`save` writes torch's PT2 archive layout (`replay.ship.archive` lists its entries) with the
program of every call group of the model and of each recorded sub-module (``encoder``): each
program's graph as torch's JSON, every parameter, buffer and constant ONCE however many
programs use it (`replay.ship.weights`), and the manifest (`replay.ship.manifest`): per program
its recorded input structure and guards, per module the coverage table, the versions and the
store it was exported from. Example inputs are not shipped (torch would pickle them).

`load` reads it back in any process, without a capture context, and never unpickles, imports
or evaluates anything the archive names: `read_artifact` checks every entry against what
`save` writes (`replay.ship.archive`), parses the manifest and the payload configs into typed
objects with bounded sizes, and checks every string of the program graphs that torch would run
as code (`replay.ship.graph_check`), all before torch reads a byte; the weights are then
memory-mapped once (`replay.ship.weights.load_tensors`) and torch deserializes only the graphs,
around those tensors. The pytree types the programs name are registered (transformers caches
through `capture.pytree.nodes`, other ``transformers.*`` types by importing their module,
nothing else). The result is a `replay.ship.runner.Runner`: called like the model, it routes
the call to the program whose structure and guards accept it (`replay.ship.guards.route`).

An artifact saved with ``aoti=True`` also holds AOTInductor builds, compiled without their
weights; ``load(path, compiled=True)`` runs them on the artifact's single copy of the weights
(``user_managed`` constants). A build is native code: loading it runs it, so it is opt-in.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from capture.output_paths import check_file, write_error, writing
from replay.ship.archive import (
    AOTI_DIR,
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
from replay.ship.checked_json import DOTTED
from replay.ship.graph_check import check_program, spec_types
from replay.ship.guards import ArtifactError, CallNotServed
from replay.ship.manifest import FORMAT, MANIFEST_CAP, Manifest
from replay.ship.records import check_extent, config_json, parse_config
from replay.ship.runner import Runner
from replay.ship.weights import ProgramSlots, WeightTable, load_tensors

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from replay.ship.entries import SavedResult

__all__ = [
    "ArtifactError",
    "CallNotServed",
    "Runner",
    "Artifact",
    "save",
    "load",
    "read_artifact",
    "read_manifest",
    "loadable_type",
    "MANIFEST",
    "FORMAT",
]

_ALLOWED_MODULES = ("transformers.",)
"""Modules whose pytree registrations an artifact may ask the loader to import."""


def save(
    path: str | os.PathLike[str],
    results: SavedResult | Mapping[str, SavedResult],
    *,
    aoti: bool = False,
) -> str:
    """Writes one PT2 archive with every program of `results`, each weight once, and the manifest.

    The file appears whole or not at all (written under a temporary name, then renamed).

    Args:
        path: Where to write (``model.pt2``).
        results: An `ExportResult`, or sub-module name -> `ExportResult` (``""`` for the model
            itself, ``"encoder"`` for a sub-module recorded with ``Recorder(modules=...)``).
        aoti: Also compile every program with AOTInductor, without its weights (the compiled
            programs use the archive's single copy at load). Slow: minutes per program.

    Returns:
        The path written.

    Raises:
        ArtifactError: Nothing to save (no program exported), a group cannot be described, a
            constant is not a plain tensor, or AOTInductor fails on a program (``aoti=True``).

    Example:
        >>> save("model.pt2", replay.export(model, "capture-store"))  # doctest: +SKIP
        'model.pt2'
    """
    from torch.export.pt2_archive import PT2ArchiveWriter

    from capture import compat_archive
    from capture.pytree import nodes
    from replay.ship.entries import manifest_of, program_name

    if not isinstance(results, Mapping):
        results = {"": results}
    target = check_file(path, what="artifact", example="model.pt2")
    with nodes.register_flattening_functions():  # the manifest and graphs name the cache types
        manifest = manifest_of(results, aoti=aoti)
        wanted = set(manifest.program_names)
        programs = {
            program_name(module, key): program
            for module, result in results.items()
            for key, program in result.programs.items()
            if program_name(module, key) in wanted
        }
        table = WeightTable()
        for name, program in programs.items():
            table.add(name, program)
        graphs = {name: compat_archive.serialize_program(p) for name, p in programs.items()}
        compiled = {name: _compile(name, p) for name, p in programs.items()} if aoti else {}
    folder = os.path.dirname(os.path.abspath(target))
    prefix = f".{os.path.basename(target)}."
    with writing(target, what="artifact"):
        fd, temp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f, PT2ArchiveWriter(f) as writer:
            for name, slots in table.programs.items():
                writer.write_bytes(MODELS.format(name), graphs[name])
                writer.write_bytes(SAMPLE_INPUTS.format(name), b"")
                writer.write_string(WEIGHTS_CONFIG.format(name), config_json(slots.weights))
                writer.write_string(CONSTANTS_CONFIG.format(name), config_json(slots.constants))
            for record in table.records:
                compat_archive.write_archive_storage(writer, record.name, record.storage)
            for name, files in compiled.items():
                for file in files:
                    writer.write_file(f"{AOTI_DIR}{name}/{os.path.basename(file)}", file)
            writer.write_string(MANIFEST, manifest.to_json())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(temp, 0o666 & ~mask)  # as open() would have made it (mkstemp makes it 0600)
        os.replace(temp, target)
    except OSError as e:  # the disk filled up while writing: one line, no half file left
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise write_error(e, target, what="artifact") from e
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
    return target


def _compile(name: str, program: ExportedProgram) -> list[str]:
    """AOTInductor-compiles one program (from its own example inputs), weights left out."""
    from capture import compat_archive

    args, kwargs = program.example_inputs or ((), {})
    try:
        files = compat_archive.aoti_compile(program.module(), tuple(args), dict(kwargs))
    except Exception as e:  # no silent fallback: the artifact would not be what was asked
        text = str(e).strip().splitlines()
        raise ArtifactError(
            f"AOTInductor could not compile program {name}: {type(e).__name__}: "
            f"{text[0] if text else ''}"
        ) from e
    paths = [f for f in files if isinstance(f, str) and f]
    if len(paths) != len([f for f in files if f != ""]) or not paths:
        raise ArtifactError(f"AOTInductor packaged weights or nothing for program {name}")
    return paths


@dataclass
class Artifact:
    """An artifact read as data (`read_artifact`): nothing of it has run.

    Attributes:
        archive: The checked archive.
        manifest: The typed manifest.
        slots: Program name -> where its tensors are (its payload configs).
        graphs: Program name -> its checked graph JSON (bytes).
        types: Pytree node types the graphs and the manifest name.
    """

    archive: Archive
    manifest: Manifest
    slots: dict[str, ProgramSlots] = field(default_factory=dict)
    graphs: dict[str, bytes] = field(default_factory=dict)
    types: set[str] = field(default_factory=set)

    @property
    def weight_bytes(self) -> int:
        """Bytes of every tensor record in the archive (each stored once)."""
        return sum(e.size for n, e in self.archive.entries.items() if Archive.is_record(n))


def read_artifact(
    path: str | os.PathLike[str], known_type: Callable[[str], bool] | None = None
) -> Artifact:
    """Reads and checks a whole artifact without torch: what `load` and ``capture check`` read.

    Args:
        path: The ``.pt2``.
        known_type: Which pytree types the graphs may name (default: any dotted name; `load`
            allows the types registered in its process and ``transformers.*``).

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
    for entry in manifest.programs:
        for name in entry.pytree_types:
            if not known(name):
                raise ArtifactError(
                    f"{archive.name(MANIFEST)}: program {entry.program} names the pytree type "
                    f"{name[:200]}, which the loader does not register (only "
                    f"{', '.join(_ALLOWED_MODULES)} types are, and those registered in the "
                    "loading process)"
                )
        art.types.update(entry.pytree_types)
    records: set[str] = set()
    for p in names:
        if archive.entries[SAMPLE_INPUTS.format(p)].size:
            raise ArtifactError(
                f"{archive.name(SAMPLE_INPUTS.format(p))} is not empty: capture never ships "
                "example inputs (torch would unpickle them)"
            )
        art.slots[p] = _slots(archive, p, records)
        inner = MODELS.format(p)
        graph = archive.read(inner, PROGRAM_CAP)
        art.types |= spec_types(check_program(graph, archive.name(inner), known))
        art.graphs[p] = graph
    # Every record is named by a config, every named record exists.
    archive.check_layout(fixed | records, aoti)
    return art


def _slots(archive: Archive, program: str, records: set[str]) -> ProgramSlots:
    """A program's payload configs, each tensor checked to lie within its record (whose
    names are added to `records`)."""
    slots = ProgramSlots()
    for table, config, folder, prefix in (
        (slots.weights, WEIGHTS_CONFIG, WEIGHTS_DIR, WEIGHT_PREFIX),
        (slots.constants, CONSTANTS_CONFIG, CONSTANTS_DIR, CONSTANT_PREFIX),
    ):
        inner = config.format(program)
        table.update(parse_config(archive.read(inner, CONFIG_CAP), archive.name(inner), prefix))
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
        >>> read_manifest("model.pt2").model  # doctest: +SKIP
        'LlamaForCausalLM'
    """
    return read_artifact(path).manifest


def loadable_type(name: str) -> bool:
    """Whether `load` may rebuild a pytree node type a program names: a ``transformers.*`` type
    (registered by importing its module) or one registered with torch's pytree in this process
    (without torch imported, as in ``capture check``, only the former).

    Example:
        >>> loadable_type("transformers.cache_utils.DynamicCache"), loadable_type("evil.Thing")
        (True, False)
    """
    from capture import compat

    if not DOTTED.match(name):
        return False
    tables = compat.serialized_pytree_types()  # None without torch imported: capture check
    registered = tables is not None and name in tables[0]
    return registered or name.startswith(_ALLOWED_MODULES)


def _register(types: set[str]) -> None:
    """Registers the pytree node types the programs name (allow-listed modules only)."""
    import torch.utils._pytree  # noqa: F401 (torch's pytree tables exist once it is imported)

    from capture import compat
    from capture.pytree import nodes

    tables = compat.serialized_pytree_types()
    if tables is None:
        raise ArtifactError("torch's pytree registry cannot be read: the artifact cannot load")
    known = tables[0]
    missing = sorted(t for t in types if t not in known)
    if not missing:
        return
    if any(t.startswith("transformers.") for t in missing):
        nodes.acquire()  # held for the life of the process: the runner needs them on every call
    for name in missing:
        if name in known:
            continue
        module = name.rpartition(".")[0]
        if not module.startswith(_ALLOWED_MODULES):
            raise ArtifactError(
                f"the artifact's programs name the pytree type {name}, which the loader does not "
                f"register (only {', '.join(_ALLOWED_MODULES)} types are); register it with "
                "torch.utils._pytree before replay.load"
            )
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ArtifactError(f"the artifact needs {module} to load: {e}") from e
        if name not in known:
            raise ArtifactError(f"{name} is not a pytree node type after importing {module}")


def load(
    path: str | os.PathLike[str], *, device: str | None = None, compiled: bool = False
) -> Runner:
    """Loads an artifact written by `save` and returns a runner callable like the model.

    Works in a fresh process: no capture context is needed, nothing is printed, nothing is
    unpickled, imported or evaluated from the archive (`read_artifact` checks it all first).
    Every weight is materialised once (memory-mapped on CPU) and every program uses it.

    Args:
        path: The ``.pt2`` written by `ExportResult.save` or ``capture export --out``.
        device: Where the weights go and the programs run (``cuda``, ``cuda:1``; default
            ``cpu``): each weight is copied there once, and every program's graph is moved.
        compiled: Run the AOTInductor builds of an artifact saved with ``aoti=True``
            (native code from the archive: loading it runs it, so it is asked for, never
            assumed).

    Returns:
        A `Runner`; ``runner.modules[name]`` serves a recorded sub-module.

    Raises:
        ArtifactError: Not a capture artifact, an entry that is not what `save` writes, a pytree
            type the loader cannot register, a program torch cannot read, or ``compiled``
            for an artifact without AOTInductor builds.

    Example:
        >>> runner = replay.load("model.pt2")  # doctest: +SKIP
        >>> out = runner(input_ids=ids, attention_mask=mask)  # doctest: +SKIP
    """
    art = read_artifact(path)
    if compiled and not art.manifest.aoti:
        raise ArtifactError(
            f"{art.archive.path} holds no AOTInductor builds; save it with aoti=True "
            "(capture export --aoti) or load it without compiled=True"
        )
    _register(art.types)
    target = device or "cpu"
    tensors = load_tensors(art.archive, art.slots, target)
    programs = {name: _program(art, name, tensors[name], target) for name in art.graphs}
    modules = {name: p.module() for name, p in programs.items()}
    builds = {n: _compiled(art, n, tensors[n], target) for n in programs} if compiled else {}
    return Runner(art.manifest, programs, modules, builds)


def _program(
    art: Artifact, name: str, tensors: tuple[dict[str, Any], dict[str, Any]], device: str
) -> ExportedProgram:
    from torch.export.passes import move_to_device_pass

    from capture import compat_archive

    # torch logs (not prints) its deserialization chatter; keep it off the server's output.
    quiet = logging.getLogger("torch._export.serde.serialize")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        program = compat_archive.deserialize_program(art.graphs[name], tensors[0], tensors[1])
        saved = {
            s.device
            for s in (*art.slots[name].weights.values(), *art.slots[name].constants.values())
        }
        if saved - {device} or device != "cpu":
            program = move_to_device_pass(program, device)
    except ArtifactError:
        raise
    except Exception as e:
        text = str(e).strip().splitlines()
        raise ArtifactError(
            f"{art.archive.name(MODELS.format(name))}: torch cannot read this program: "
            f"{type(e).__name__}: {text[0][:200] if text else ''}"
        ) from e
    finally:
        quiet.setLevel(level)
    return program  # type: ignore[no-any-return]


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
