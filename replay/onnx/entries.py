"""The manifest's entries, the ONNX side: `replay.artifact.entries` seen from an ONNX set.

Each entry is the ``.pt2`` artifact's own (`replay.artifact.entries.program_entry`: the group's
recorded structure, guard, call form, fills; ``rejected`` from the group's failed ONNX rows),
then made what the ONNX file needs checked for it, because the graph checks nothing itself:

- an axis that torch.export bounded more tightly than the recordings (`Converted.bounds`) is
  cut to the program's range (``narrowed``); a bound on a size the call does not pass (a
  filled input's axis) becomes a condition;
- the program's own size guards (`Converted.conditions`) travel as the guard's
  ``conditions``, rewritten over the entry's group's dims.

Plus the ONNX fields (`replay.runtime.ort.manifest.OnnxFile`): the file, its input bindings with
each axis' range, its dim names' ranges, its output names. `write_manifest` writes the set's
manifest last (temporary name, then renamed).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from replay.artifact.entries import program_entry
from replay.runtime.conditions import Condition
from replay.runtime.coverage import TARGET_ONNX
from replay.runtime.guards import Axis
from replay.runtime.manifest import Manifest, ModuleEntry, ProgramEntry
from replay.runtime.ort.manifest import (
    FORMAT,
    OnnxFile,
    OnnxInput,
    OnnxManifest,
    OnnxOutputs,
    manifest_path,
    onnx_versions,
)
from replay.runtime.ort.weights import OnnxFileError

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from replay.inputs.exportgroup import ExportGroup
    from replay.onnx.convert import Converted
    from replay.runtime.coverage import CoverageRow

__all__ = ["onnx_entry", "onnx_manifest", "write_manifest"]

DimMap = list[tuple[tuple[int, ...], int]]
"""Per size of the file's call (the owning group's dims): ``(terms, offset)`` over the entry's
group's dims, the size being ``sum(dims[t] for t in terms) + offset``."""


def _dim_map(group: ExportGroup, owner: ExportGroup) -> DimMap:
    """How each size of the file's call follows from a call of `group`: the same size for the
    group owning the program; for a group served by it (`replay.pipeline.merging`), its own sizes,
    or a filled input's axis (`replay.runtime.fills`)."""
    if group is owner:
        return [((i,), 0) for i in range(owner.structure.width)]
    mine: dict[str, int] = {}
    width = 0
    for leaf in group.structure.tensors:
        mine[leaf.path] = width
        width += int(leaf.ndim)
    fills = {f"kwargs[{fill.argument!r}]": fill for fill in group.example.fills}
    out: DimMap = []
    for leaf in owner.structure.tensors:
        if leaf.path in mine:
            out.extend(((mine[leaf.path] + k,), 0) for k in range(int(leaf.ndim)))
        elif leaf.path in fills:
            out.extend((tuple(a.terms), a.offset) for a in fills[leaf.path].shape)
        else:
            raise OnnxFileError(
                f"group {group.name}: {leaf.path} of program {owner.name} is neither passed "
                "nor filled"
            )
    return out


def _expr(terms: tuple[int, ...], offset: int) -> str:
    parts = [f"d{t}" for t in terms] + ([str(offset)] if offset or not terms else [])
    return "(" + " + ".join(parts) + ")"


def _program_guard(
    axes: Sequence[Axis], converted: Converted, mapping: DimMap
) -> tuple[tuple[Axis, ...], tuple[Condition, ...]]:
    """The entry's axes cut to the program's bounds, and the program's conditions, over the
    entry's group's dims (through `mapping`); a bound on a filled size becomes a condition."""
    out = list(axes)
    conditions: list[Condition] = []
    for (terms, offset), bound in zip(mapping, converted.bounds, strict=True):
        if bound is None:
            continue
        low, high = bound
        if len(terms) != 1 or offset:
            expr = _expr(terms, offset)
            if low > 0:
                conditions.append(Condition(f"{expr} >= {low}", f"{expr} >= {low}"))
            if high is not None:
                conditions.append(Condition(f"{expr} <= {high}", f"{expr} <= {high}"))
            continue
        axis = out[terms[0]]
        if low == high and axis.dynamic:
            out[terms[0]] = dataclasses.replace(
                axis, min=low, max=low, dynamic=False, narrowed=True
            )
        elif low > axis.min or (high is not None and high < axis.max):
            top = min(high, axis.max) if high is not None else axis.max
            out[terms[0]] = dataclasses.replace(
                axis, min=max(low, axis.min), max=top, narrowed=True
            )
    for condition in converted.conditions:
        expr = re.sub(r"\bd(\d+)\b", lambda m: _expr(*mapping[int(m.group(1))]), condition.expr)
        conditions.append(Condition(expr, condition.text))  # still one of the grammar
    return tuple(out), tuple(conditions)


def _size_range(axes: Sequence[Axis], terms: tuple[int, ...], offset: int) -> tuple[int, int]:
    low = sum(axes[t].min for t in terms) + offset
    high = sum(axes[t].max for t in terms) + offset
    return low, high


def onnx_entry(
    group: ExportGroup,
    program: ExportedProgram,
    converted: Converted,
    file: str,
    rows: Sequence[CoverageRow],
    owner: ExportGroup | None = None,
    *,
    module_name: str = "",
) -> tuple[ProgramEntry, OnnxFile]:
    """The manifest entry of one group served by one ONNX file (module docstring).

    Args:
        group: The call group.
        program: The torch program the file was converted from.
        converted: Its conversion (`replay.onnx.convert.convert`).
        file: The ONNX file's name (no directory).
        rows: The ONNX coverage rows of the export: the group's failed recorded signatures
            become ``rejected``.
        owner: The group the program was exported from (default: `group` itself); another
            group's when `group` is served by its program with inputs filled.
        module_name: The sub-module the group belongs to (``""``: the model itself); its
            program is then ``<module_name>.<group>``, as in a ``.pt2``.

    Returns:
        The typed entry (its guard as the ONNX runner checks it) and its ONNX fields.

    Raises:
        OnnxFileError: An input of the program that the group neither passes nor fills.
        ArtifactError: The group cannot be described (`replay.artifact.entries.program_entry`).
    """
    owner = owner or group
    mapping = _dim_map(group, owner)
    entry = program_entry(module_name, group, program, rows, TARGET_ONNX)
    axes, conditions = _program_guard(entry.guard.axes, converted, mapping)
    guard = dataclasses.replace(entry.guard, axes=axes, conditions=conditions)
    entry = dataclasses.replace(entry, guard=guard)
    dims: dict[str, tuple[int, int]] = {}
    inputs = []
    widths = [int(leaf.ndim) for leaf in owner.structure.tensors]
    starts = [sum(widths[:i]) for i in range(len(widths))]
    for binding in converted.inputs:
        at = starts[binding.leaf]
        ranges = [_size_range(axes, *mapping[at + k]) for k in range(widths[binding.leaf])]
        for name, (low, high) in zip(binding.shape, ranges, strict=True):
            if isinstance(name, str):
                seen = dims.get(name, (low, high))
                dims[name] = (min(seen[0], low), max(seen[1], high))
        inputs.append(
            OnnxInput(
                name=binding.name,
                leaf=binding.leaf,
                path=binding.path,
                dtype=binding.dtype,
                shape=tuple(binding.shape),
                min=tuple(low for low, _ in ranges),
                max=tuple(high for _, high in ranges),
            )
        )
    version = converted.model.opset_imports.get("")
    onnx = OnnxFile(
        file=file,
        inputs=tuple(inputs),
        outputs=OnnxOutputs(
            converted.outputs.spec, converted.outputs.names, converted.outputs.constants
        ),
        dims=dims,
        opset=int(version) if version is not None else None,
        unchecked_guards=tuple(converted.unchecked),
    )
    return entry, onnx


def onnx_manifest(
    model_name: str,
    entries: Sequence[tuple[ProgramEntry, OnnxFile]],
    modules: Mapping[str, ModuleEntry],
    weights: str,
    size: int,
) -> OnnxManifest:
    """The set's typed manifest.

    Args:
        model_name: The model's name in the store.
        entries: One `onnx_entry` per group served (of every module).
        modules: Module name (``""``: the model; ``encoder``) -> its export's entry (store,
            complete, coverage, errors, notes; `replay.artifact.entries.module_entry`).
        weights: The shared weights file's name.
        size: Its size in bytes.
    """
    manifest = Manifest(
        model_name=model_name,
        created=datetime.now().astimezone().isoformat(),
        versions=onnx_versions(),
        modules=dict(modules),
        programs=tuple(e for e, _ in entries),
        format=FORMAT,
    )
    return OnnxManifest(manifest, tuple(f for _, f in entries), weights, size)


def write_manifest(path: str | os.PathLike[str], manifest: OnnxManifest) -> str:
    """Writes the manifest of an ONNX set (temporary name, then renamed).

    Args:
        path: The ``onnx=`` path.
        manifest: The set's manifest (`onnx_manifest`); the digest of every file it names is
            added (`replay.runtime.digests`).

    Returns:
        The manifest's path.
    """
    from dataclasses import replace

    from replay.runtime.digests import digest_file

    target = manifest_path(path)
    folder, name = os.path.split(target)
    files = sorted({manifest.weights, *(f.file for f in manifest.files)})
    digests = {file: digest_file(os.path.join(folder or ".", file)) for file in files}
    manifest = replace(manifest, manifest=replace(manifest.manifest, digests=digests))
    tmp = os.path.join(folder, f".{name}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(manifest.to_json())
    os.replace(tmp, target)
    return target
