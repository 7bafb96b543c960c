"""One artifact to ship: every group's program in one PT2 archive, and a runner that routes calls.

`save` writes torch's PT2 archive (``torch.export.pt2_archive``: several named programs, weights
as raw bytes) holding the program of every call group of the model, and of each recorded
sub-module (``encoder``), plus a JSON manifest (``extra/capture_manifest.json``): the model
name, per program its recorded input structure and the recorded ranges of its dims
(`replay.ship.guards`), the coverage table, the torch / transformers / capture versions, and the
store and time window the export was built from.

No pickle: the example inputs torch would pickle (a ``DynamicCache`` in them makes torch fall
back to ``weights_only=False`` and log ``--- Logging error ---``) are left out of the archive;
the manifest says what a call looks like instead.

`load` reads it back in any process, without a capture context: it registers the pytree nodes
the programs' treespecs name (transformers caches through `capture.pytree.nodes`, transformers
``ModelOutput`` classes by importing their ``transformers.*`` module, nothing else), and returns
a `Runner`. Calling the runner like the model picks the program whose recorded structure
matches the call, checks its guards and runs it; it returns what the program returns, rebuilt
with the recorded output treespec (a ``CausalLMOutputWithPast`` holding a ``DynamicCache``,
as eager returns). One difference with eager: an input cache is not grown in place; the new
cache is the one in the output (``out.past_key_values``).
"""

from __future__ import annotations

import importlib
import json
import os
import warnings
import zipfile
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from replay.coverage import KIND_RECORDED, CoverageRow
from replay.ship.guards import LEAF_FIELDS, ArtifactError, CallNotServed
from replay.ship.runner import Runner

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from replay.exporting import ExportResult
    from replay.inputs import ExportGroup

__all__ = [
    "ArtifactError",
    "CallNotServed",
    "Runner",
    "save",
    "load",
    "read_manifest",
    "MANIFEST",
    "FORMAT",
]

MANIFEST = "capture_manifest.json"
"""Name of the manifest among the archive's extra files."""

FORMAT = "capture-artifact/1"
"""The manifest's ``format``: bumped when a reader could misread a newer manifest."""

_ALLOWED_MODULES = ("transformers.",)
"""Modules whose pytree registrations a manifest may ask the loader to import."""


def _iso(ts: Any) -> str | None:
    return ts.isoformat() if isinstance(ts, datetime) else None


def _versions() -> dict[str, str | None]:
    import torch

    from capture import __version__ as capture_version

    try:
        from importlib.metadata import version

        transformers_version: str | None = version("transformers")
    except Exception:  # not installed: the artifact does not need it
        transformers_version = None
    return {
        "torch": torch.__version__,
        "transformers": transformers_version,
        "capture": capture_version,
    }


def _program_name(module: str, group: str) -> str:
    return f"{module}.{group}" if module else group


def _axes(group: ExportGroup) -> list[dict[str, Any]]:
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
    ranks = group.structure.width
    if ranks != len(axes):
        raise ArtifactError(
            f"group {group.name}: {len(axes)} analysed dims for {ranks} recorded tensor dims; "
            "the guards cannot be written"
        )
    return axes


def _pytree_types(spec: Any, out: set[str]) -> None:
    import torch.utils._pytree as pytree

    node = pytree.SUPPORTED_NODES.get(spec.type)
    name = getattr(node, "serialized_type_name", None) if node is not None else None
    if name and spec.type not in (tuple, list, dict):
        out.add(str(name))
    for child in spec.children():
        _pytree_types(child, out)


def _rejected(group: ExportGroup, coverage: list[CoverageRow]) -> list[dict[str, Any]]:
    """The recorded signatures of `group` its program failed in the export's check.

    Rows of kind ``recorded`` that are not covered, matched by the sizes they checked (never by
    their position among the group's rows: probes and payloads sit between them).
    """
    return [
        {"dims": list(row.sizes), "error": row.error or "not reproduced"}
        for row in coverage
        if row.group == group.name
        and row.kind == KIND_RECORDED
        and not row.covered
        and row.sizes is not None
    ]


def _entry(
    module: str, group: ExportGroup, program: ExportedProgram, coverage: list[CoverageRow]
) -> dict[str, Any]:
    if group.added:
        raise ArtifactError(
            f"group {group.name} was exported with fill_missing substitutes "
            f"({', '.join(group.added)}); an artifact cannot store them: export without "
            "fill_missing to save it"
        )
    types: set[str] = set()
    _pytree_types(program.call_spec.in_spec, types)
    _pytree_types(program.call_spec.out_spec, types)
    structure = group.structure
    return {
        "module": module,
        "group": group.name,
        "program": _program_name(module, group.program_name),
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
        "axes": _axes(group),
        "relations": [
            {"symbol": r.symbol, "terms": list(r.terms), "offset": r.offset}
            for r in group.relations
        ],
        "form": {
            "positional": list(group.form.positional),
            "keywords": list(group.form.keywords),
            "extra": list(group.form.extra),
            "var_positional": group.form.var_positional,
        },
        "pytree_types": sorted(types),
        "rejected": _rejected(group, coverage),
        # A group served by another's program: the inputs the runner fills per call.
        "fills": [fill.as_dict() for fill in group.fills],
        "first_ts": _iso(group.analysis.first_ts) if group.analysis else None,
        "last_ts": _iso(group.analysis.last_ts) if group.analysis else None,
    }


def manifest(results: Mapping[str, ExportResult]) -> dict[str, Any]:
    """The JSON manifest of an artifact holding `results` (sub-module name -> result).

    Args:
        results: ``""`` -> the model's `ExportResult`, plus one per recorded sub-module.

    Returns:
        A JSON-serializable dict (`FORMAT`).
    """
    programs: list[dict[str, Any]] = []
    modules: dict[str, dict[str, Any]] = {}
    for module, result in results.items():
        coverage = CoverageRow.from_table(result.coverage)
        for group in result.inputs.groups:
            program = result.programs.get(group.program_name)
            if program is not None:
                programs.append(_entry(module, group, program, coverage))
        starts = [g.first_ts for g in result.inputs.analysed if g.first_ts]
        ends = [g.last_ts for g in result.inputs.analysed if g.last_ts]
        modules[module] = {
            "model": result.inputs.model,
            "store": getattr(result, "source", None),
            "window": {
                "first": _iso(min(starts)) if starts else None,
                "last": _iso(max(ends)) if ends else None,
            },
            "complete": result.complete,
            "coverage": result.coverage.to_pylist(),
            "errors": dict(result.errors),
            "notes": list(result.notes),
        }
    if "" not in modules:
        raise ArtifactError("an artifact needs the model's own ExportResult (module name '')")
    return {
        "format": FORMAT,
        "model": modules[""]["model"],
        "created": datetime.now().astimezone().isoformat(),
        "versions": _versions(),
        "modules": modules,
        "programs": programs,
    }


def _compile(name: str, program: ExportedProgram) -> list[Any]:
    """AOTInductor-compiles one program (from its own example inputs); the files to package."""
    from torch._inductor import aot_compile

    args, kwargs = program.example_inputs or ((), {})
    try:
        with warnings.catch_warnings():
            # torch 2.13's own deprecation warnings while it copies graphs (LeafSpec): chatter
            warnings.simplefilter("ignore", FutureWarning)
            files = aot_compile(
                program.module(), tuple(args), dict(kwargs), options={"aot_inductor.package": True}
            )
    except Exception as e:  # no silent fallback: the artifact would not be what was asked
        text = str(e).strip().splitlines()
        raise ArtifactError(
            f"AOTInductor could not compile program {name}: {type(e).__name__}: "
            f"{text[0] if text else ''}"
        ) from e
    if not isinstance(files, list):
        raise ArtifactError(f"AOTInductor returned no package files for program {name}")
    return files


def save(
    path: str | os.PathLike[str],
    results: ExportResult | Mapping[str, ExportResult],
    *,
    aoti: bool = False,
) -> str:
    """Writes one PT2 archive with every program of `results` and the JSON manifest.

    Args:
        path: Where to write (``model.pt2``).
        results: An `ExportResult`, or sub-module name -> `ExportResult` (``""`` for the model
            itself, ``"encoder"`` for a sub-module recorded with ``Recorder(modules=...)``).
        aoti: Also compile every program with AOTInductor into the archive; `load` then runs
            the compiled form (the exported program stays in the archive). Slow: minutes.

    Returns:
        The path written.

    Raises:
        ArtifactError: Nothing to save (no program exported), a group cannot be described,
            or AOTInductor fails on a program (``aoti=True``).

    Example:
        >>> replay.export(model, "capture-store").save("model.pt2")  # doctest: +SKIP
        'model.pt2'
    """
    from torch.export.pt2_archive._package import package_pt2

    from capture.pytree import nodes

    if not isinstance(results, Mapping):
        results = {"": results}
    with nodes.register_flattening_functions():  # the manifest names the cache types
        data = manifest(results)
    data["aoti"] = bool(aoti)
    if not data["programs"]:
        raise ArtifactError("no program to save: torch.export rejected every group")
    programs: dict[str, ExportedProgram] = {}
    for module, result in results.items():
        for name, program in result.programs.items():
            programs[_program_name(module, name)] = program
    # The example inputs are pickled by torch (and unpicklable without weights_only=False when
    # they hold a cache): leave them out while packaging, then put them back.
    kept = {name: p.example_inputs for name, p in programs.items()}
    target = os.fspath(path)
    # (The setter checks the inputs against the program's treespec: caches must be registered.)
    with nodes.register_flattening_functions():
        compiled = {n: _compile(n, p) for n, p in programs.items()} if aoti else None
        try:
            for p in programs.values():
                p.example_inputs = None
            package_pt2(
                target,
                exported_programs=programs,
                aoti_files=compiled,
                extra_files={MANIFEST: json.dumps(data, indent=1, default=str)},
            )
        finally:
            for name, p in programs.items():
                p.example_inputs = kept[name]
    return target


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of an artifact, read with zipfile only (no torch, no model code).

    Raises:
        ArtifactError: `path` is missing, not a zip archive, or holds no capture manifest.
    """
    target = os.fspath(path)
    if not os.path.isfile(target):
        raise ArtifactError(f"no artifact at {target}")
    try:
        with zipfile.ZipFile(target) as archive:
            names = [n for n in archive.namelist() if n.endswith(f"/extra/{MANIFEST}")]
            if not names:
                raise ArtifactError(
                    f"{target} holds no {MANIFEST}: not written by ExportResult.save "
                    "(capture export --out MODEL.pt2 writes one)"
                )
            data = json.loads(archive.read(names[0]))
    except (zipfile.BadZipFile, ValueError) as e:
        raise ArtifactError(f"{target} is not a PT2 archive: {e}") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ArtifactError(
            f"{target}: manifest format {data.get('format') if isinstance(data, dict) else '?'!r}, "
            f"this capture reads {FORMAT!r}"
        )
    return data


def _spec_types(tree: Any, out: set[str]) -> None:
    if isinstance(tree, dict):
        if isinstance(tree.get("type"), str):
            out.add(tree["type"])
        for child in tree.get("children_spec") or ():
            _spec_types(child, out)


def archive_types(path: str | os.PathLike[str]) -> set[str]:
    """The pytree node types named by the treespecs of every program in a PT2 archive.

    Read from the archive's program JSON (not the manifest), so that an archive whose
    treespecs name transformers caches loads even when its manifest does not list them.
    """
    out: set[str] = set()
    with zipfile.ZipFile(os.fspath(path)) as archive:
        for name in archive.namelist():
            if "/models/" not in name or not name.endswith(".json"):
                continue
            graph = json.loads(archive.read(name)).get("graph_module", {})
            for entry in graph.get("module_call_graph") or ():
                signature = entry.get("signature") or {}
                for key in ("in_spec", "out_spec"):
                    text = signature.get(key)
                    if text:
                        loaded = json.loads(text)
                        _spec_types(loaded[1] if isinstance(loaded, list) else loaded, out)
    return {t for t in out if not t.startswith(("builtins.", "collections."))}


def _register(types: set[str]) -> None:
    """Registers the pytree node types the programs' treespecs name (allow-listed modules only)."""
    import torch.utils._pytree as pytree

    from capture.pytree import nodes

    known = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE
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


def load(path: str | os.PathLike[str]) -> Runner:
    """Loads an artifact written by `save` and returns a runner callable like the model.

    Works in a fresh process: no capture context is needed, nothing is printed, nothing is
    unpickled (the archive's weights are raw bytes, its example inputs are left out).

    Args:
        path: The ``.pt2`` written by `ExportResult.save` or ``capture export --out``.

    Returns:
        A `Runner`; ``runner.modules[name]`` serves a recorded sub-module.

    Raises:
        ArtifactError: Not a capture artifact, an unknown manifest format, or a pytree type the
            loader cannot register.

    Example:
        >>> runner = replay.load("model.pt2")  # doctest: +SKIP
        >>> out = runner(input_ids=ids, attention_mask=mask)  # doctest: +SKIP
    """
    import logging

    from torch.export.pt2_archive._package import load_pt2

    data = read_manifest(path)
    types = archive_types(path)
    for entry in data["programs"]:
        types.update(entry.get("pytree_types", []))
    _register(types)
    # torch logs (not prints) its deserialization chatter; keep it off the server's output.
    quiet = logging.getLogger("torch._export.serde.serialize")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        contents = load_pt2(os.fspath(path))
    except Exception as e:
        raise ArtifactError(
            f"cannot load the programs of {os.fspath(path)}: {type(e).__name__}: {e}"
        ) from e
    finally:
        quiet.setLevel(level)
    programs = dict(contents.exported_programs)
    wanted = {e["program"] for e in data["programs"]}
    absent = sorted(wanted - set(programs))
    if absent:
        raise ArtifactError(
            f"{os.fspath(path)} lacks the programs {', '.join(absent)} its manifest lists"
        )
    compiled = dict(getattr(contents, "aoti_runners", None) or {}) if data.get("aoti") else {}
    if data.get("aoti") and set(compiled) != set(programs):
        missing = ", ".join(sorted(set(programs) - set(compiled)))
        raise ArtifactError(
            f"{os.fspath(path)} says it holds AOTInductor builds, none for {missing}"
        )
    return Runner(data, programs, compiled=compiled)
