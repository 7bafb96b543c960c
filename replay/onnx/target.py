"""``export(..., onnx=PATH)``: convert every checked program, write the set, check it, describe it.

`write_onnx` is what `replay.pipeline.exporting.export_with` calls after the torch check:

1. every torch program is converted (`replay.onnx.convert`), from the group (or regime) that
   owns it; a group served by another's program (`replay.pipeline.merging`) is served by that file,
   its missing inputs filled as the ``.pt2`` runner fills them; a program whose conversion fails
   keeps its torch program, and the ONNX rows of the groups it serves say why;
2. the files are written with one shared weights file (`replay.runtime.ort.weights`):
   ``PATH`` for one group, ``<stem>.<group>.onnx`` for several, and ``PATH.data``;
3. the written files are opened as the runner ``replay.load`` gives (`replay.runtime.ort.runner`)
and
   checked on every row of the torch check, then on the sampled real calls
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

    from replay.inputs.builder import ExportInputs
    from replay.inputs.options import ExportOptions

__all__ = ["OnnxOutcome", "OnnxPart", "refusal", "write_onnx", "output_path"]

logger = logging.getLogger(__name__)


@dataclass
class OnnxOutcome:
    """What `write_onnx` did.

    Attributes:
        files: Group name -> the ONNX file written.
        rows: The coverage rows of target ``onnx``.
        notes: What was done and why (``"<group>: <note>"``).
        manifest: The manifest written (None when no file was).
        errors: Group name -> why it has no ONNX file.
    """

    files: dict[str, str] = field(default_factory=dict)
    rows: list[CoverageRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    manifest: str | None = None
    errors: dict[str, str] = field(default_factory=dict)


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


@dataclass
class OnnxPart:
    """One module of the set: the model (``name`` ``""``) or a recorded sub-module (``encoder``).

    Attributes:
        name: The sub-module's name (``""``: the model itself).
        module: The eager module.
        inputs: Its export inputs.
        programs: Group name -> checked torch program.
        errors: Group name -> why torch.export gave it no program.
        torch_rows: Its torch check's rows.
        complete_torch: Its torch side is complete (every torch row covered, every option
            honoured): its manifest ``complete`` also needs every ONNX row covered.
        outcome: What was written for it (filled by `write_onnx`).
    """

    name: str
    module: Any
    inputs: ExportInputs
    programs: Mapping[str, ExportedProgram]
    errors: Mapping[str, str]
    torch_rows: Sequence[CoverageRow]
    complete_torch: bool
    outcome: OnnxOutcome = field(default_factory=OnnxOutcome)

    def label(self, group: str) -> str:
        """``decode``, or ``encoder.g0`` for a sub-module's group (its program's name)."""
        return f"{self.name}.{group}" if self.name else group


def write_onnx(
    module: Any,
    store: Any,
    inputs: ExportInputs,
    programs: Mapping[str, ExportedProgram],
    errors: Mapping[str, str],
    torch_rows: Sequence[CoverageRow],
    options: ExportOptions,
    *,
    complete_torch: bool,
    source: str | None = None,
    submodules: Sequence[OnnxPart] = (),
) -> OnnxOutcome:
    """Converts, writes, checks and describes the ONNX set of an export (module docstring).

    Args:
        module: The eager model.
        store: The store (path, URI or open `capture.Store`), for the payload rows.
        inputs: The export inputs.
        programs: Group name -> checked torch program.
        errors: Group name -> why torch.export gave it no program.
        torch_rows: The torch check's rows.
        options: The export's options (``onnx`` is the path).
        complete_torch: The torch side is complete (every torch row covered, every option
            honoured): the manifest's ``complete`` also needs every ONNX row covered.
        source: The store's path or URI, for the manifest.
        submodules: The recorded sub-modules exported with the model (``modules=True``): their
            files join the set (``<stem>.<module>.<group>.onnx``, the weights file shared),
            ``runner.modules[name]`` serves them; each part's `OnnxPart.outcome` says what.

    Returns:
        The model's `OnnxOutcome` (its ``manifest`` is the set's).

    Raises:
        ReplayError: ``options.onnx`` is not set.
    """
    from capture.errors import ReplayError

    if options.onnx is None:
        raise ReplayError("write_onnx needs options.onnx")
    path = os.path.abspath(options.onnx)
    model = OnnxPart("", module, inputs, programs, errors, torch_rows, complete_torch)
    parts = [model, *submodules]
    converted: dict[str, dict[str, Converted]] = {}  # part -> program name -> its ONNX model
    for part in parts:
        refused = refusal(part.module, part.inputs)
        if refused is not None:
            for group in part.inputs.groups:
                part.outcome.errors[group.name] = f"ONNX export refused: {refused}"
            logger.warning("ONNX export of %s refused: %s", part.inputs.model, refused)
            model.outcome.notes.append(f"onnx: {part.inputs.model} refused: {refused}")
        converted[part.name] = {} if refused is not None else _convert_part(part)
    labels = [part.label(n) for part in parts for n in converted[part.name]]
    several = len(labels) > 1
    files = {label: output_path(path, label, several) for label in labels}
    if len(set(files.values())) != len(files):
        # Two group names spelled alike: number the files rather than overwrite one.
        files = {n: output_path(path, f"{n}.{i}", several) for i, n in enumerate(labels)}
    runner = None
    weights = weights_path(path)
    size = 0
    if labels:
        pairs = []
        for part in parts:
            for name, c in converted[part.name].items():
                c.model.metadata_props["capture.manifest"] = os.path.basename(manifest_path(path))
                pairs.append((files[part.label(name)], c.model))
                part.outcome.files[name] = files[part.label(name)]
        size = write_models(pairs, weights)
        stubs = {
            p.name: ModuleEntry(p.inputs.model, None, None, None, complete=False) for p in parts
        }
        draft = _manifest(parts, converted, files, weights, size, stubs)
        try:
            runner = open_set(draft, os.path.dirname(path))
        except OnnxFileError as e:
            # A file onnxruntime cannot load is never left behind as a set: without its
            # manifest nothing names the files, and they are removed.
            _remove([*files.values(), weights])
            model.outcome.notes.append(f"onnx: not written: {e}")
            for part in parts:
                part.outcome.files.clear()
                for group in part.inputs.groups:
                    part.outcome.errors[group.name] = f"ONNX set not written: {e}"
            labels = []
    for part in parts:
        served = runner if runner is None or not part.name else runner.modules.get(part.name)
        _check_part(part, store, served, options)
    if not labels:
        model.outcome.notes.append("onnx: no group could be converted; nothing written")
        return model.outcome
    entries = {
        part.name: module_entry(
            part.inputs,
            source,
            part.complete_torch and all(r.covered for r in part.outcome.rows),
            [*part.torch_rows, *part.outcome.rows],
            {**part.errors, **{f"onnx {k}": v for k, v in part.outcome.errors.items()}},
            part.outcome.notes,
        )
        for part in parts
    }
    final = _manifest(parts, converted, files, weights, size, entries)
    model.outcome.manifest = write_manifest(path, final)
    return model.outcome


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


def _convert_part(part: OnnxPart) -> dict[str, Converted]:
    """Program name -> its conversion, from the group that owns it; the errors in the part's
    outcome (a program whose conversion fails keeps its torch program only)."""
    converted: dict[str, Converted] = {}
    outcome = part.outcome
    for group in part.inputs.groups:
        program = part.programs.get(group.name) if group.served_by is None else None
        if program is None:
            continue
        try:
            converted[group.name] = convert(group, program)
        except Exception as e:  # the conversion failed: this program's ONNX rows say why
            outcome.errors[group.name] = f"ONNX conversion failed: {_summary(e)}"
            label = part.label(group.name)
            logger.warning("ONNX conversion of group %s failed: %s", label, _summary(e))
    for group in part.inputs.groups:
        name = group.program_name
        if name not in converted:
            why = outcome.errors.get(name) or part.errors.get(name) or part.errors.get(group.name)
            outcome.errors.setdefault(group.name, why or f"group {group.name} has no program")
    return converted


def _check_part(
    part: OnnxPart, store: Any, runner: OnnxRunner | None, options: ExportOptions
) -> None:
    """The part's ONNX rows: every torch row, then the sampled real calls, through `runner`."""
    outcome = part.outcome
    with nodes.register_flattening_functions():
        for group in part.inputs.groups:
            error = outcome.errors.get(group.name)
            outcome.rows.extend(
                onnx_rows(
                    part.module, group, part.torch_rows, runner, error, options.atol, options.rtol
                )
            )
        serve: dict[str, Serve] = {}
        if runner is not None:
            serve = {g: functools.partial(_serve, runner, g) for g in runner.groups}
        found, notes = payload_rows(
            part.module,
            store,
            part.inputs,
            part.programs,
            {**part.errors, **outcome.errors},
            atol=options.atol,
            rtol=options.rtol,
            limit=options.max_payloads,
            device=options.device,
            target=TARGET_ONNX,
            serve=serve,
        )
    outcome.rows.extend(found)
    outcome.notes.extend(f"onnx {note}" for note in notes)


def _manifest(
    parts: Sequence[OnnxPart],
    converted: Mapping[str, Mapping[str, Converted]],
    files: Mapping[str, str],
    weights: str,
    size: int,
    modules: Mapping[str, ModuleEntry],
) -> OnnxManifest:
    """The set's manifest (the draft the check opens has no rows, so no ``rejected`` yet)."""
    entries: list[tuple[ProgramEntry, OnnxFile]] = []
    for part in parts:
        mine = converted[part.name]
        owners = {g.name: g for g in part.inputs.groups if g.name in mine}
        entries.extend(
            onnx_entry(
                group,
                part.programs[group.program_name],
                mine[group.program_name],
                os.path.basename(files[part.label(group.program_name)]),
                part.outcome.rows,
                owners[group.program_name],
                module=part.name,
            )
            for group in part.inputs.groups
            if group.program_name in mine
        )
    return onnx_manifest(parts[0].inputs.model, entries, modules, os.path.basename(weights), size)
