"""Saving an artifact: every program of an export in one PT2 archive, each weight once.

`save` writes torch's PT2 archive layout (`replay.runtime.pt2.archive` lists its entries) with the
program of every call group of the model and of each recorded sub-module (``encoder``): each
program's graph as torch's JSON, every parameter, buffer and constant ONCE however many programs
use it (`replay.runtime.pt2.weights`), and the manifest (`replay.artifact.entries` builds it from
the export's groups). Example inputs are not shipped (torch would pickle them). What it writes is
what `replay.runtime.pt2.loading` accepts, entry by entry.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import weakref
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from capture.output_paths import check_file, write_error, writing
from replay.runtime.digests import digest_bytes, digest_file
from replay.runtime.guards import ArtifactError
from replay.runtime.pt2.archive import (
    AOTI_DIR,
    CONSTANTS_CONFIG,
    MANIFEST,
    MODELS,
    SAMPLE_INPUTS,
    WEIGHTS_CONFIG,
)
from replay.runtime.pt2.records import config_json
from replay.runtime.pt2.weights import WeightTable

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from replay.artifact.entries import SavedResult

__all__ = ["save", "program_graph", "without_metadata"]

_GRAPHS: weakref.WeakKeyDictionary[Any, bytes] = weakref.WeakKeyDictionary()
"""Program -> its graph JSON as `program_graph` made it (an export's claim check serializes
each program once; `save` writes those very bytes)."""


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
        OutputNotWritable: The folder of `path` is missing, read-only or full (checked before
            the programs are serialized).

    Example:
        >>> save("model.pt2", replay.export(model, "capture-store"))  # doctest: +SKIP
        'model.pt2'
    """
    from capture.pytree import nodes
    from replay.artifact.entries import manifest_of, program_name

    if not isinstance(results, Mapping):
        results = {"": results}
    target = check_file(path, what="artifact", example="model.pt2")
    with nodes.register_flattening_functions():  # the manifest and graphs name the cache types
        manifest = manifest_of(results, aoti=aoti)
        wanted = set(manifest.program_names)
        programs = {
            program_name(module_name, key): program
            for module_name, result in results.items()
            for key, program in result.programs.items()
            if program_name(module_name, key) in wanted
        }
        table = WeightTable()
        for name, program in programs.items():
            table.add(name, program)
        graphs = {name: program_graph(p) for name, p in programs.items()}
        compiled = {name: _compile(name, p) for name, p in programs.items()} if aoti else {}
    manifest = replace(manifest, digests=_digests(table, graphs, compiled))
    _write(target, table, graphs, compiled, manifest.to_json())
    return target


def _write(
    target: str,
    table: WeightTable,
    graphs: Mapping[str, bytes],
    compiled: Mapping[str, list[str]],
    manifest: str,
) -> None:
    """The archive written under a temporary name, then renamed: whole or not at all."""
    from torch.export.pt2_archive import PT2ArchiveWriter

    from capture import compat_archive

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
            writer.write_string(MANIFEST, manifest)
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


def _digests(
    table: WeightTable, graphs: Mapping[str, bytes], compiled: Mapping[str, list[str]]
) -> dict[str, str]:
    """The digest of every entry `save` writes but the manifest and torch's format markers
    (`replay.runtime.digests`)."""
    from replay.runtime.pt2.weights import storage_bytes

    out = {}
    for name, slots in table.programs.items():
        out[MODELS.format(name)] = digest_bytes(graphs[name])
        out[SAMPLE_INPUTS.format(name)] = digest_bytes(b"")
        out[WEIGHTS_CONFIG.format(name)] = digest_bytes(config_json(slots.weights).encode())
        out[CONSTANTS_CONFIG.format(name)] = digest_bytes(config_json(slots.constants).encode())
    for record in table.records:
        out[record.name] = digest_bytes(storage_bytes(record.storage))
    for name, files in compiled.items():
        for file in files:
            out[f"{AOTI_DIR}{name}/{os.path.basename(file)}"] = digest_file(file)
    return out


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


def program_graph(program: ExportedProgram) -> bytes:
    """The graph JSON `save` writes for `program`: torch's serialization, without the nodes'
    metadata (`without_metadata`). Made once per program (the claim check at export,
    `replay.artifact.loadable`, and `save` read the same bytes); call it with the pytree
    registrations of `capture.pytree.nodes` in place, as `save` does.
    """
    from capture import compat_archive

    graph = _GRAPHS.get(program)
    if graph is None:
        graph = _GRAPHS[program] = without_metadata(compat_archive.serialize_program(program))
    return graph


def without_metadata(graph: bytes) -> bytes:
    """A program's graph JSON without its nodes' debugging metadata (stack traces, module
    stacks, source functions): 60% of its bytes on a Llama, read and checked on every load,
    and needed by no reader to run the graph (torch's own reader takes it missing).

    Example:
        >>> without_metadata(b'{"nodes": [{"target": "t", "metadata": {"stack_trace": "x"}}]}')
        b'{"nodes": [{"target": "t", "metadata": {}}]}'
    """
    import json

    tree = json.loads(graph)
    stack: list[Any] = [tree]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if "target" in value and isinstance(value.get("metadata"), dict):
                value["metadata"] = {}
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return json.dumps(tree).encode()
