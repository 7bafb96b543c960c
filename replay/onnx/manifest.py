"""The manifest beside an export's ONNX files: what each file serves, and how to call it.

``onnx=model.onnx`` writes ``model.onnx`` (one group) or ``model.<group>.onnx`` (several), their
shared weights ``model.onnx.data`` (`replay.onnx.weights`) and this manifest,
``model.onnx.json``, last: its presence says the set is complete. Its shape is the ``.pt2``
artifact's (`replay.ship.artifact`), so ``capture check`` and `replay.ship.guards` read both:

- ``format`` (`FORMAT`), ``model``, ``created``, ``versions`` (torch, transformers, capture,
  onnx, onnxscript, onnxruntime) and ``weights`` (the shared file's name and size);
- ``modules[""]``: the store, the export's ``complete``, its coverage rows (torch and ONNX);
- ``programs``: one entry per file, with the fields of the artifact's guard entries (group,
  recorded structure, ``axes`` with each dim's range, relations, ``rejected``: recorded
  signatures the ONNX check failed) plus ``file``, ``opset``, ``inputs`` (ONNX name, the
  recorded tensor leaf it takes, dtype, per axis its size or dim name, and ``min`` / ``max``:
  what an onnxruntime or TensorRT deployment builds its profiles from), ``dims`` (dim name ->
  recorded ``min`` / ``max``) and ``outputs`` (the output treespec, the ONNX name of each
  output leaf).

An axis whose range torch.export bounded more tightly than the recordings (`Converted.bounds`)
carries the program's range and ``"narrowed": true``, and the program's own size guards travel
as ``conditions`` (`replay.ship.conditions`; a guard line that could not be translated is listed
in ``unchecked_guards``): the ONNX graph checks none of them, the runner's guard does.

`read_manifest` parses one with json only (no torch, no onnx), refusing anything capture did
not write: a file name with a directory in it, a missing field, another format.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from replay.onnx.weights import OnnxFileError
from replay.ship.guards import LEAF_FIELDS

if TYPE_CHECKING:
    from replay.coverage import CoverageRow
    from replay.exportgroup import ExportGroup
    from replay.onnx.convert import Converted

__all__ = [
    "FORMAT",
    "manifest_path",
    "weights_path",
    "is_onnx_path",
    "program_entry",
    "read_manifest",
    "write_manifest",
    "onnx_versions",
]

FORMAT = "capture-onnx/1"
"""The manifest's ``format``: bumped when a reader could misread a newer manifest."""

_PROGRAM_KEYS = ("group", "program", "file", "structure_id", "leaves", "axes", "inputs", "outputs")


def manifest_path(path: str | os.PathLike[str]) -> str:
    """The manifest of the ONNX set written for ``onnx=path``.

    Example:
        >>> manifest_path("out/model.onnx")
        'out/model.onnx.json'
    """
    text = os.fspath(path)
    return text if text.endswith(".onnx.json") else f"{text}.json"


def weights_path(path: str | os.PathLike[str]) -> str:
    """The shared weights file of the ONNX set written for ``onnx=path``.

    Example:
        >>> weights_path("out/model.onnx")
        'out/model.onnx.data'
    """
    text = os.fspath(path)
    return f"{text.removesuffix('.json')}.data"


def is_onnx_path(path: str | os.PathLike[str]) -> bool:
    """Tells whether `path` names an ONNX set (``model.onnx`` or its ``model.onnx.json``).

    Example:
        >>> is_onnx_path("model.onnx"), is_onnx_path("model.pt2")
        (True, False)
    """
    return os.fspath(path).endswith((".onnx", ".onnx.json"))


def onnx_versions() -> dict[str, str | None]:
    """The versions of what made and runs the files (None: not installed).

    Example:
        >>> sorted(onnx_versions())
        ['capture', 'onnx', 'onnxruntime', 'onnxscript', 'torch', 'transformers']
    """
    from importlib.metadata import PackageNotFoundError, version

    from capture import __version__

    out: dict[str, str | None] = {"capture": __version__}
    for name in ("torch", "transformers", "onnx", "onnxscript", "onnxruntime"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _iso(ts: Any) -> str | None:
    from datetime import datetime

    return ts.isoformat() if isinstance(ts, datetime) else None


def spec_types(spec: str) -> set[str]:
    """The node types a dumped treespec names, builtins and collections left out (what a
    loader must have registered to rebuild it).

    Example:
        >>> spec_types('[1, {"type": "builtins.tuple", "context": "null", "children_spec": []}]')
        set()
    """
    out: set[str] = set()
    stack = [json.loads(spec)[1]]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("type"), str):
                out.add(node["type"])
            stack.extend(node.get("children_spec") or ())
    return {t for t in out if not t.startswith(("builtins.", "collections."))}


def _guard_entry(
    group: ExportGroup, converted: Converted, rows: Sequence[CoverageRow]
) -> dict[str, Any]:
    """The guard fields of a file's entry, as `replay.ship.guards.ProgramGuard.from_manifest`
    reads them (the fields the ``.pt2`` artifact writes for a program; `rejected` from the ONNX
    rows of the group's recorded signatures that are not covered, matched by their sizes)."""
    from replay.coverage import KIND_RECORDED

    structure = group.structure
    axes = [
        {
            "path": d.path,
            "axis": d.axis,
            "min": d.min,
            "max": d.max,
            "dynamic": d.dynamic,
            "symbol": d.symbol,
        }
        for d in group.dims
    ]
    if len(axes) != structure.width:
        raise OnnxFileError(
            f"group {group.name}: {len(axes)} analysed dims for {structure.width} recorded "
            "tensor dims; the guards cannot be written"
        )
    return {
        "module": "",
        "group": group.name,
        "program": group.name,
        "model": group.model,
        "structure_id": group.structure_id,
        "calls": group.calls,
        "signatures": group.signatures,
        "treespec": structure.treespec,
        "signature": structure.signature,
        "n_args": structure.n_args,
        "leaves": [
            {k: getattr(leaf, k) for k in ("argument", "position", *LEAF_FIELDS)}
            for leaf in structure.leaves
        ],
        "axes": axes,
        "relations": [
            {"symbol": r.symbol, "terms": list(r.terms), "offset": r.offset}
            for r in group.relations
        ],
        "pytree_types": sorted(spec_types(converted.outputs.spec)),
        "rejected": [
            {"dims": list(row.sizes), "error": row.error or "not reproduced"}
            for row in rows
            if row.group == group.name
            and row.kind == KIND_RECORDED
            and not row.covered
            and row.sizes is not None
        ],
        "first_ts": _iso(group.analysis.first_ts) if group.analysis else None,
        "last_ts": _iso(group.analysis.last_ts) if group.analysis else None,
    }


DimMap = list[tuple[tuple[int, ...], int]]
"""Per size of the file's call (the owning group's dims): ``(terms, offset)`` over the entry's
group's dims, the size being ``sum(dims[t] for t in terms) + offset``."""


def _dim_map(group: ExportGroup, owner: ExportGroup) -> DimMap:
    """How each size of the file's call follows from a call of `group`: the same size for the
    group owning the program; for a group served by it (`replay.merging`), its own sizes, or a
    filled input's axis (`replay.ship.fills`)."""
    if group is owner:
        return [((i,), 0) for i in range(owner.structure.width)]
    mine: dict[str, int] = {}
    width = 0
    for leaf in group.structure.tensors:
        mine[leaf.path] = width
        width += int(leaf.ndim)
    fills = {f"kwargs[{fill.argument!r}]": fill for fill in group.fills}
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
    entry_axes: Sequence[dict[str, Any]], converted: Converted, mapping: DimMap
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The entry's axes cut to the program's bounds, and the program's conditions, over the
    entry's group's dims (through `mapping`); a bound on a filled size becomes a condition."""
    from replay.ship.conditions import parse

    axes = [dict(a) for a in entry_axes]
    conditions: list[dict[str, str]] = []
    for (terms, offset), bound in zip(mapping, converted.bounds, strict=True):
        if bound is None:
            continue
        low, high = bound
        if len(terms) != 1 or offset:
            expr = _expr(terms, offset)
            if low > 0:
                conditions.append({"expr": f"{expr} >= {low}", "text": f"{expr} >= {low}"})
            if high is not None:
                conditions.append({"expr": f"{expr} <= {high}", "text": f"{expr} <= {high}"})
            continue
        axis = axes[terms[0]]
        if low == high and axis["dynamic"]:
            axis.update(min=low, max=low, dynamic=False, narrowed=True)
        elif low > int(axis["min"]) or (high is not None and high < int(axis["max"])):
            axis.update(min=max(low, int(axis["min"])), narrowed=True)
            axis["max"] = min(high, int(axis["max"])) if high is not None else axis["max"]
    for condition in converted.conditions:
        expr = re.sub(r"\bd(\d+)\b", lambda m: _expr(*mapping[int(m.group(1))]), condition.expr)
        parse(expr)  # a rewritten condition is still one of the grammar
        conditions.append({"expr": expr, "text": condition.text})
    return axes, conditions


def _size_range(
    axes: Sequence[dict[str, Any]], terms: tuple[int, ...], offset: int
) -> tuple[int, int]:
    low = sum(int(axes[t]["min"]) for t in terms) + offset
    high = sum(int(axes[t]["max"]) for t in terms) + offset
    return low, high


def program_entry(
    group: ExportGroup,
    converted: Converted,
    file: str,
    rows: Sequence[CoverageRow],
    owner: ExportGroup | None = None,
) -> dict[str, Any]:
    """The manifest entry of one group served by one ONNX file (module docstring).

    Args:
        group: The call group.
        converted: The conversion of the program serving it (`replay.onnx.convert.convert`).
        file: The ONNX file's name (no directory).
        rows: The ONNX coverage rows of the export: the group's failed recorded signatures
            become ``rejected``.
        owner: The group the program was exported from (default: `group` itself); another
            group's when `group` is served by its program with inputs filled.

    Returns:
        A JSON-serializable dict.

    Raises:
        OnnxFileError: An input of the program that the group neither passes nor fills.
    """
    owner = owner or group
    mapping = _dim_map(group, owner)
    entry = _guard_entry(group, converted, rows)
    entry["axes"], conditions = _program_guard(entry["axes"], converted, mapping)
    entry["program"] = owner.name
    entry["fills"] = [fill.as_dict() for fill in group.fills]
    dims: dict[str, dict[str, int]] = {}
    inputs = []
    widths = [int(leaf.ndim) for leaf in owner.structure.tensors]
    starts = [sum(widths[:i]) for i in range(len(widths))]
    for binding in converted.inputs:
        at = starts[binding.leaf]
        ranges = [_size_range(entry["axes"], *mapping[at + k]) for k in range(widths[binding.leaf])]
        for name, (low, high) in zip(binding.shape, ranges, strict=True):
            if isinstance(name, str):
                seen = dims.setdefault(name, {"min": low, "max": high})
                seen.update(min=min(seen["min"], low), max=max(seen["max"], high))
        inputs.append(
            {
                "name": binding.name,
                "leaf": binding.leaf,
                "path": binding.path,
                "dtype": binding.dtype,
                "shape": list(binding.shape),
                "min": [low for low, _ in ranges],
                "max": [high for _, high in ranges],
            }
        )
    entry.update(
        file=file,
        opset=_opset(converted),
        conditions=conditions,
        unchecked_guards=list(converted.unchecked),
        inputs=inputs,
        dims=dims,
        outputs={
            "spec": converted.outputs.spec,
            "names": list(converted.outputs.names),
            "constants": list(converted.outputs.constants),
        },
    )
    return entry


def _opset(converted: Converted) -> int | None:
    version = converted.model.opset_imports.get("")
    return int(version) if version is not None else None


def write_manifest(
    path: str | os.PathLike[str],
    model: str,
    programs: Sequence[dict[str, Any]],
    module: Mapping[str, Any],
    weights: Mapping[str, Any],
) -> str:
    """Writes the manifest of an ONNX set (temporary name, then renamed).

    Args:
        path: The ``onnx=`` path.
        model: The model's name in the store.
        programs: One `program_entry` per file.
        module: The export's ``modules[""]`` entry (store, complete, coverage, errors, notes).
        weights: ``{"file": name, "bytes": size}``.

    Returns:
        The manifest's path.
    """
    from datetime import datetime

    data = {
        "format": FORMAT,
        "model": model,
        "created": datetime.now().astimezone().isoformat(),
        "versions": onnx_versions(),
        "weights": dict(weights),
        "modules": {"": dict(module)},
        "programs": list(programs),
    }
    target = manifest_path(path)
    folder, name = os.path.split(target)
    tmp = os.path.join(folder, f".{name}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=1, default=str)
    os.replace(tmp, target)
    return target


def _plain_file(folder: str, name: Any, what: str, source: str) -> str:
    """`name` as a file in `folder`: a bare name, a regular file, not a link."""
    if (
        not isinstance(name, str)
        or not name
        or os.path.basename(name) != name
        or name in (".", "..")
    ):
        raise OnnxFileError(f"{source}: {what} {name!r} is not a file name beside the manifest")
    full = os.path.join(folder, name)
    if os.path.islink(full) or not os.path.isfile(full):
        raise OnnxFileError(f"{source}: {what} {name} is missing or not a regular file")
    return full


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the ONNX set written for ``onnx=path`` (json only: no torch, no onnx).

    Args:
        path: The ``onnx=`` path (``model.onnx``) or the manifest itself.

    Returns:
        The manifest, checked: its format, its fields, and every file it names (a bare name
        beside it, a regular file).

    Raises:
        OnnxFileError: No manifest, not JSON, another format, a missing field, or a file
            name that leaves the directory.

    Example:
        >>> read_manifest("model.onnx")["programs"][0]["file"]  # doctest: +SKIP
        'model.decode.onnx'
    """
    source = manifest_path(path)
    if not os.path.isfile(source):
        raise OnnxFileError(
            f"no ONNX manifest at {source}: replay.load takes the path given to onnx= "
            "(capture export --out MODEL.onnx writes one)"
        )
    try:
        with open(source, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        raise OnnxFileError(f"{source} is not a readable JSON manifest: {e}") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise OnnxFileError(f"{source}: manifest format {found!r}, this capture reads {FORMAT!r}")
    folder = os.path.dirname(os.path.abspath(source))
    weights = data.get("weights")
    if not isinstance(weights, dict):
        raise OnnxFileError(f"{source}: the manifest names no weights file")
    _plain_file(folder, weights.get("file"), "weights file", source)
    programs = data.get("programs")
    modules = data.get("modules")
    if not isinstance(programs, list) or not isinstance(modules, dict) or "" not in modules:
        raise OnnxFileError(f"{source}: the manifest lists no programs or modules")
    if not isinstance(data.get("model"), str):
        raise OnnxFileError(f"{source}: the manifest names no model")
    for entry in programs:
        missing = [k for k in _PROGRAM_KEYS if not isinstance(entry, dict) or k not in entry]
        if missing:
            raise OnnxFileError(f"{source}: a program entry lacks {', '.join(missing)}")
        _plain_file(folder, entry["file"], "ONNX file", source)
    return data
