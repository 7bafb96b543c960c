"""The ONNX set of an export: convert every checked program, write the set, check it, describe it.

`write_onnx` is what ``ExportResult.save("m.onnx")`` (and ``export(..., onnx=PATH)``, which
takes the same step) calls with the torch check done; it returns what it wrote and checked,
per module (`OnnxOutcome`), and changes nothing it is given:

1. every torch program is converted (`replay.onnx.convert`), from the group (or regime) that
   owns it; a group served by another's program (`replay.pipeline.merging`) is served by that file,
   its missing inputs filled as the ``.pt2`` runner fills them; a program whose conversion fails
   keeps its torch program, and the ONNX rows of the groups it serves say why;
2. the files are written with one shared weights file (`replay.runtime.ort.weights`):
   ``PATH`` for one group, ``<stem>.<group>.onnx`` for several, and ``PATH.data``;
3. the written files are opened as the runner ``replay.load`` gives (`replay.runtime.ort.runner`)
   and checked on every row of the torch check, then on the sampled real calls
   (`replay.onnx.parity`, `replay.check.payload_rows`): rows of target ``onnx``;
4. the manifest ``PATH.json`` is written last (`replay.onnx.entries`), with the signatures
   the ONNX check failed in each file's guard.

The recorded sub-modules exported with the model (``modules=True``) join the same set
(`OnnxPart`): their files are ``<stem>.<module>.<group>.onnx``, the weights file and the
manifest are shared, and ``replay.load(PATH).modules[name]`` serves them. A model onnxruntime
cannot serve on CPU (bfloat16: `refusal`) gets no file, and a set whose files onnxruntime
cannot open is removed: nothing ``replay.load`` finds is unloadable.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from capture.pytree import nodes
from replay.artifact.entries import module_entry
from replay.check.payload_rows import Serve, payload_rows
from replay.onnx.convert import Converted, convert
from replay.onnx.entries import onnx_entry, onnx_manifest, write_manifest
from replay.onnx.parity import onnx_rows
from replay.runtime.coverage import TARGET_ONNX, CoverageRow
from replay.runtime.manifest import ModuleEntry, ProgramEntry
from replay.runtime.ort.manifest import OnnxFile, OnnxManifest, manifest_path, weights_path
from replay.runtime.ort.runner import OnnxRunner, open_set
from replay.runtime.ort.weights import OnnxFileError, write_models

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from capture.store.reader import StoreReader
    from replay.inputs.builder import ExportInputs
    from replay.inputs.options import ExportOptions

__all__ = [
    "ONNX_HINT",
    "OnnxOutcome",
    "OnnxPart",
    "output_path",
    "refusal",
    "require_onnx",
    "require_one_state",
    "write_onnx",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnnxOutcome:
    """What `write_onnx` wrote and checked for one module of the set.

    Attributes:
        files: Group name -> the ONNX file written.
        rows: The coverage rows of target ``onnx``.
        notes: What was done and why (``"<group>: <note>"``).
        manifest: The set's manifest (None when no file was written, and for a sub-module).
        errors: Group name -> why it has no ONNX file.
    """

    files: Mapping[str, str] = field(default_factory=dict)
    rows: tuple[CoverageRow, ...] = ()
    notes: tuple[str, ...] = ()
    manifest: str | None = None
    errors: Mapping[str, str] = field(default_factory=dict)


ONNX_HINT = "pip install capture[onnx]"


def require_onnx() -> None:
    """Checks that the optional ONNX dependencies are installed.

    Raises:
        ReplayError: onnx, onnxscript or onnxruntime is missing; the message names the extra
            to install.
    """
    import importlib.util

    from capture.errors import ReplayError

    missing = [
        m for m in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(m) is None
    ]
    if missing:
        raise ReplayError(
            f"ONNX export needs {' and '.join(missing)}, which are not installed; run `{ONNX_HINT}`"
        )


def require_one_state(inputs: ExportInputs) -> None:
    """Checks that the groups' calls ran under one state: an ONNX set serves one.

    Raises:
        ReplayError: Calls of several states.
    """
    from capture.errors import ReplayError
    from capture.state import state_label

    states = sorted({g.state for g in inputs.groups})
    if len(states) > 1:
        raise ReplayError(
            f"onnx= is not available for calls of several states "
            f"({', '.join(state_label(s or None) for s in states)}): export the .pt2 "
            "artifact, which serves each state, or pass groups= of one state"
        )


_SPELLED = (("<=", "_le_"), (">=", "_ge_"), ("<", "_lt_"), (">", "_gt_"), ("==", "_eq_"))
"""How a regime's bounds are spelled in a file name (``prefill[input_ids_1<=4]``)."""


def output_path(path: str, group: str, several: bool) -> str:
    """`path` for a single file, else ``<stem>.<group><suffix>`` (one file per group), the
    group's name spelled with letters, digits, ``_``, ``-`` and ``.`` only (a regime's
    ``[input_ids_1<=4]`` becomes ``.input_ids_1_le_4``): a name any shell and file system take.

    Example:
        >>> output_path("model.onnx", "decode", True)
        'model.decode.onnx'
        >>> output_path("model.onnx", "prefill[input_ids_1<=4]", True)
        'model.prefill.input_ids_1_le_4.onnx'
    """
    if not several:
        return path
    name = group.replace("[", ".").replace("]", "")
    for text, spelled in _SPELLED:
        name = name.replace(text, spelled)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "group"
    root, ext = os.path.splitext(path)
    return f"{root}.{name}{ext}"


def _serve(runner: OnnxRunner, group: str, args: Any, kwargs: Any, sizes: Any) -> Any:
    """A payload call run through the runner on its group's entry (`payload_rows.Serve`)."""
    del sizes  # the runner takes the sizes from the call itself
    return runner.run_group(group, args, kwargs)


def _summary(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")


@dataclass(frozen=True)
class OnnxPart:
    """One module of the set: the model (``module_name`` ``""``) or a recorded sub-module
    (``encoder``).

    Attributes:
        module_name: The sub-module's name (``""``: the model itself).
        module: The eager module.
        inputs: Its export inputs.
        programs: Group name -> checked torch program.
        errors: Group name -> why torch.export gave it no program.
        torch_rows: Its torch check's rows.
        complete_torch: Its torch side is complete (every torch row covered, every option
            honoured): its manifest ``complete`` also needs every ONNX row covered.
    """

    module_name: str
    module: Any
    inputs: ExportInputs
    programs: Mapping[str, ExportedProgram]
    errors: Mapping[str, str]
    torch_rows: Sequence[CoverageRow]
    complete_torch: bool

    def label(self, group: str) -> str:
        """``decode``, or ``encoder.g0`` for a sub-module's group (its program's name)."""
        return f"{self.module_name}.{group}" if self.module_name else group


@dataclass
class _Set:
    """The files of a set as they are written: part name -> program name -> its ONNX model,
    part name -> group -> why it has no file, the file of each program label, the weights."""

    converted: dict[str, dict[str, Converted]]
    errors: dict[str, dict[str, str]]
    files: dict[str, str]
    weights: str
    size: int = 0


def write_onnx(
    parts: Sequence[OnnxPart],
    path: str,
    store: StoreReader,
    options: ExportOptions,
    *,
    source: str | None = None,
) -> dict[str, OnnxOutcome]:
    """Converts, writes, checks and describes the ONNX set of an export (module docstring).

    Args:
        parts: The model (name ``""``), first, then the recorded sub-modules exported with it
            (``modules=True``): their files join the set (``<stem>.<module>.<group>.onnx``, the
            weights file shared) and ``runner.modules[name]`` serves them.
        path: The set's path (``model.onnx``).
        store: The open store, for the payload rows.
        options: The export's options (tolerances, payload limit, device).
        source: The store's path or URI, for the manifest.

    Returns:
        Part name -> its `OnnxOutcome` (the model's ``manifest`` is the set's).
    """
    path = os.path.abspath(path)
    notes: list[str] = []  # the set's notes, the model's first
    written = _convert(parts, path, notes)
    runner = _opened(parts, written, path, notes)
    checked = {
        part.module_name: _check_part(
            part,
            store,
            runner
            if runner is None or not part.module_name
            else runner.modules.get(part.module_name),
            options,
            written.errors[part.module_name],
        )
        for part in parts
    }
    if not written.files:
        checked[""][1].append("onnx: no group could be converted; nothing written")
    outcomes = {
        part.module_name: OnnxOutcome(
            {n: written.files[part.label(n)] for n in written.converted[part.module_name]},
            tuple(checked[part.module_name][0]),
            tuple([*(() if part.module_name else notes), *checked[part.module_name][1]]),
            None,
            written.errors[part.module_name],
        )
        for part in parts
    }
    if not written.files:
        return outcomes
    entries = {p.module_name: _module_entry(p, outcomes[p.module_name], source) for p in parts}
    final = _manifest(parts, written, outcomes, entries)
    first = parts[0].module_name
    outcomes[first] = dataclasses.replace(outcomes[first], manifest=write_manifest(path, final))
    return outcomes


def _served_by(runner: OnnxRunner | None, module_name: str) -> OnnxRunner | None:
    """The runner of the set's module `module_name` (``""``: the model's own)."""
    return runner if runner is None or not module_name else runner.modules.get(module_name)


def _module_entry(part: OnnxPart, outcome: OnnxOutcome, source: str | None) -> ModuleEntry:
    return module_entry(
        part.inputs,
        source,
        part.complete_torch and all(r.covered for r in outcome.rows),
        [*part.torch_rows, *outcome.rows],
        {**part.errors, **{f"onnx {k}": v for k, v in outcome.errors.items()}},
        outcome.notes,
    )


def _convert(parts: Sequence[OnnxPart], path: str, notes: list[str]) -> _Set:
    """Every part's programs converted (a part onnxruntime cannot serve on CPU refused, with a
    note), and the file each is written to."""
    converted: dict[str, dict[str, Converted]] = {}
    errors: dict[str, dict[str, str]] = {}
    for part in parts:
        refused = refusal(part.module, part.inputs)
        if refused is None:
            converted[part.module_name], errors[part.module_name] = _convert_part(part)
            continue
        errors[part.module_name] = {
            g.name: f"ONNX export refused: {refused}" for g in part.inputs.groups
        }
        logger.warning("ONNX export of %s refused: %s", part.inputs.model_name, refused)
        notes.append(f"onnx: {part.inputs.model_name} refused: {refused}")
        converted[part.module_name] = {}
    labels = [part.label(n) for part in parts for n in converted[part.module_name]]
    several = len(labels) > 1
    files = {label: output_path(path, label, several) for label in labels}
    if len(set(files.values())) != len(files):
        # Two group names spelled alike: number the files rather than overwrite one.
        files = {n: output_path(path, f"{n}.{i}", several) for i, n in enumerate(labels)}
    return _Set(converted, errors, files, weights_path(path))


def _opened(
    parts: Sequence[OnnxPart], written: _Set, path: str, notes: list[str]
) -> OnnxRunner | None:
    """The set written and opened as ``replay.load`` opens it; None when nothing was converted,
    or when onnxruntime cannot open a file: then nothing is left behind (without its manifest
    nothing names the files), and every group's error says why."""
    if not written.files:
        return None
    pairs = []
    for part in parts:
        for name, c in written.converted[part.module_name].items():
            c.model.metadata_props["capture.manifest"] = os.path.basename(manifest_path(path))
            pairs.append((written.files[part.label(name)], c.model))
    written.size = write_models(pairs, written.weights)
    stubs = {
        p.module_name: ModuleEntry(p.inputs.model_name, None, None, None, complete=False)
        for p in parts
    }
    try:
        return open_set(_manifest(parts, written, None, stubs), os.path.dirname(path))
    except OnnxFileError as e:
        _remove([*written.files.values(), written.weights])
        notes.append(f"onnx: not written: {e}")
        for part in parts:
            written.converted[part.module_name] = {}
            written.errors[part.module_name] = {
                g.name: f"ONNX set not written: {e}" for g in part.inputs.groups
            }
        written.files.clear()
        return None


_NO_CPU_KERNELS = ("bfloat16",)
"""Dtypes onnxruntime's CPU execution provider has no arithmetic kernels for (Mul, MatMul,
Softmax: a session over such a graph fails to load with NOT_IMPLEMENTED)."""


def refusal(module: Any, inputs: ExportInputs) -> str | None:
    """Why the module's ONNX files could not be served by onnxruntime on CPU, or None.

    A model whose weights or recorded tensors are bfloat16: onnxruntime's CPU provider has no
    bfloat16 kernels, so such a file cannot even be opened; the export says so instead of
    writing it (the torch target serves the model as it is).
    """
    import torch

    dtypes = {
        str(t.dtype).removeprefix("torch.")
        for t in module.state_dict().values()
        if isinstance(t, torch.Tensor)
    }
    for group in inputs.groups:
        dtypes.update(str(leaf.dtype) for leaf in group.structure.tensors)
    bad = sorted(d for d in dtypes if d in _NO_CPU_KERNELS)
    if not bad:
        return None
    return (
        f"the model computes in {', '.join(bad)}, for which onnxruntime's CPU execution provider "
        "has no kernels (a session over the file fails with NOT_IMPLEMENTED), so no ONNX "
        "file is written; serve it with the torch target (the .pt2 runs bfloat16), or record "
        "and export a float32 model for ONNX"
    )


def _remove(paths: Sequence[str]) -> None:
    for name in paths:
        try:
            os.remove(name)
        except FileNotFoundError:
            pass


def _convert_part(part: OnnxPart) -> tuple[dict[str, Converted], dict[str, str]]:
    """Program name -> its conversion, from the group that owns it, and group name -> why it
    has no ONNX file (a program whose conversion fails keeps its torch program only)."""
    converted: dict[str, Converted] = {}
    errors: dict[str, str] = {}
    for group in part.inputs.groups:
        program = part.programs.get(group.name) if group.served_by is None else None
        if program is None:
            continue
        try:
            converted[group.name] = convert(group, program)
        except Exception as e:  # the conversion failed: this program's ONNX rows say why
            errors[group.name] = f"ONNX conversion failed: {_summary(e)}"
            label = part.label(group.name)
            logger.warning("ONNX conversion of group %s failed: %s", label, _summary(e))
    for group in part.inputs.groups:
        name = group.program_name
        if name not in converted:
            why = errors.get(name) or part.errors.get(name) or part.errors.get(group.name)
            errors.setdefault(group.name, why or f"group {group.name} has no program")
    return converted, errors


def _check_part(
    part: OnnxPart,
    store: StoreReader,
    runner: OnnxRunner | None,
    options: ExportOptions,
    errors: Mapping[str, str],
) -> tuple[list[CoverageRow], list[str]]:
    """The part's ONNX rows (every torch row, then the sampled real calls, through `runner`)
    and the notes of its payload check."""
    rows: list[CoverageRow] = []
    with nodes.register_flattening_functions():
        for group in part.inputs.groups:
            error = errors.get(group.name)
            rows += onnx_rows(
                part.module, group, part.torch_rows, runner, error, options.atol, options.rtol
            )
        serve: dict[str, Serve] = {}
        if runner is not None:
            serve = {g: functools.partial(_serve, runner, g) for g in runner.groups}
        found, notes = payload_rows(
            part.module,
            store,
            part.inputs,
            part.programs,
            {**part.errors, **errors},
            atol=options.atol,
            rtol=options.rtol,
            limit=options.max_payloads,
            device=options.device,
            target=TARGET_ONNX,
            serve=serve,
        )
    return [*rows, *found], [f"onnx {note}" for note in notes]


def _manifest(
    parts: Sequence[OnnxPart],
    written: _Set,
    outcomes: Mapping[str, OnnxOutcome] | None,
    modules: Mapping[str, ModuleEntry],
) -> OnnxManifest:
    """The set's manifest (the draft the check opens has no outcomes, so no ``rejected`` yet)."""
    entries: list[tuple[ProgramEntry, OnnxFile]] = []
    for part in parts:
        mine = written.converted[part.module_name]
        rows = outcomes[part.module_name].rows if outcomes is not None else ()
        owners = {g.name: g for g in part.inputs.groups if g.name in mine}
        entries.extend(
            onnx_entry(
                group,
                part.programs[group.program_name],
                mine[group.program_name],
                os.path.basename(written.files[part.label(group.program_name)]),
                rows,
                owners[group.program_name],
                module_name=part.module_name,
            )
            for group in part.inputs.groups
            if group.program_name in mine
        )
    weights = os.path.basename(written.weights)
    return onnx_manifest(parts[0].inputs.model_name, entries, modules, weights, written.size)
