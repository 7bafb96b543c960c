"""One group's checked program -> one ONNX model that says what it is: inputs, outputs, dims.

`convert` runs ``torch.onnx.export(program, dynamo=True)`` with capture's translations
(`replay.onnx.translation`), then makes the model describe itself:

- **inputs** keep the names torch.export gives the program's user inputs (``input_ids``,
  ``past_key_values_key_cache_0``: what ``capture profiles`` prints); each is bound to the
  recorded tensor leaf it takes (`InputBinding.leaf`, the index among the structure's tensor
  leaves), found by identity on an example call: the runner feeds a call's tensors by leaf,
  never by guessing from names;
- **outputs** are renamed from ``linear_14`` / ``cat_3`` to their key path in the program's
  output (``logits``; a cache returned under a cache argument's name is ``present_...``:
  ``present_key_cache_0``), and the output treespec is kept so the runner returns eager's
  types (`OutputBinding`);
- **dynamic dims** are renamed from torch's ``s13`` to the recorded symbols (``batch``,
  ``past_key_values_2``; expressions follow: ``past_key_values_2 + 1``);
- **what it serves**: ``metadata_props`` name the group and its recorded structure (and, once
  written, the manifest that says the rest: `replay.onnx.target`);
- **no debugging metadata**: the exporter's per-node stack traces and FX text are dropped
  (`_strip_metadata`): they would outweigh a small model's weights in every file;
- **program bounds**: torch.export may bound a dim more tightly than the recorded range (a
  sliding window's ``seq <= 4``); the ONNX graph no longer checks it, so the bounds of every
  input axis are read from the program's ``range_constraints`` (`Converted.bounds`) and become
  part of the file's guard (`replay.onnx.entries`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from capture.errors import ReplayError
from capture.pytree import cachespec, nodes
from replay.onnx.translation import translation_table
from replay.runtime.conditions import Condition, translate

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.export import ExportedProgram

    from replay.inputs.exportgroup import ExportGroup

__all__ = ["Converted", "InputBinding", "OutputBinding", "convert", "output_name"]

_SYMBOL = re.compile(r"\b[su]\d+\b")
"""torch's shape symbols as they appear in ONNX dim params (``s13``, ``s5 + 1``)."""


@dataclass(frozen=True)
class InputBinding:
    """One ONNX input and the recorded tensor leaf it takes.

    Attributes:
        name: The ONNX input name.
        leaf: Index of the tensor among the structure's tensor leaves (the order of a call's
            ``dims``).
        path: The recorded leaf path (``kwargs['input_ids']``).
        dtype: The recorded dtype.
        shape: Per axis, its size (static) or its dim name (dynamic).
    """

    name: str
    leaf: int
    path: str
    dtype: str
    shape: tuple[int | str, ...]


@dataclass(frozen=True)
class OutputBinding:
    """How the ONNX outputs become the program's output object.

    Attributes:
        spec: The program's output treespec (``treespec_dumps`` JSON).
        names: Per output leaf, the ONNX output name, or None for a constant leaf.
        constants: Per output leaf, its value when it is a constant (None otherwise).
    """

    spec: str
    names: tuple[str | None, ...]
    constants: tuple[Any, ...]


@dataclass
class Converted:
    """One group's ONNX model and what the manifest says about it.

    Attributes:
        group: The call group.
        model: The ONNX model (``onnx_ir``), initializers still in memory.
        inputs: One binding per ONNX input, in the model's input order.
        outputs: The output binding.
        bounds: Per tensor axis of the recorded structure (the order of ``dims``): the
            program's ``(min, max)`` (max None: unbounded), or the static size as
            ``(size, size)``; None where the program's size is an expression.
        conditions: The program's own size guards over the recorded dims.
        unchecked: The program's guard lines that could not be translated (the ONNX file's
            guard does not check them).
    """

    group: str
    model: ir.Model
    inputs: list[InputBinding]
    outputs: OutputBinding
    bounds: list[tuple[int, int | None] | None]
    conditions: list[Condition] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)


def output_name(path: Sequence[Any]) -> str:
    """The readable ONNX name of an output leaf: its key path, lowercased, joined with ``_``;
    a leaf under a cache argument's name is ``present_...`` (the new cache, as ONNX models
    conventionally name it; the input keeps ``past_key_values_...``).

    Example:
        >>> output_name([pytree.GetAttrKey("logits")]), output_name([pytree.SequenceKey(1)])
        ('logits', 'output_1')
    """
    parts = [_key_text(k) for k in path]
    if parts and cachespec.is_cache_argument(parts[0]):
        parts[0] = "present"
    elif not parts or parts[0].isdigit():
        parts.insert(0, "output")  # a plain tensor or a tuple: output, output_0, output_1
    name = "_".join(p for p in parts if p)
    return re.sub(r"[^0-9a-zA-Z]+", "_", name).strip("_").lower()


def _key_text(key: Any) -> str:
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return re.sub(r"[^0-9a-zA-Z]+", "_", str(key))


def convert(group: ExportGroup, program: ExportedProgram) -> Converted:
    """Converts one group's program to ONNX (module docstring).

    Args:
        group: The call group the program was exported from.
        program: Its checked ``torch.export`` program.

    Returns:
        The `Converted` model, not yet written.

    Raises:
        ReplayError: The conversion fails, the group has ``fill_missing`` substitutes (a
            runner could not feed them), or an ONNX input matches no recorded leaf.

    Example:
        >>> converted = convert(result.inputs.group("decode"), result.programs["decode"])
        ... # doctest: +SKIP
    """
    if group.example.added:
        raise ReplayError(
            f"group {group.name} was exported with fill_missing substitutes "
            f"({', '.join(group.example.added)}); an ONNX runner cannot feed them: export without "
            "fill_missing"
        )
    args, kwargs = program.example_inputs or ((), {})
    with nodes.register_flattening_functions(), warnings.catch_warnings(), _quiet_registry():
        # torch 2.13's own deprecation warning while torch.onnx deep-copies the program
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        onnx_program = torch.onnx.export(
            program,
            tuple(args),
            kwargs=dict(kwargs),
            dynamo=True,
            custom_translation_table=translation_table(),
            verbose=False,
        )
        if onnx_program is None:
            raise ReplayError(f"group {group.name}: torch.onnx.export returned no program")
        model = onnx_program.model
        leaves, sources = _leaf_of_input(group, program)
        outputs = _outputs(program, model)
    bounds, renames = _bounds(group, program, leaves)
    conditions, unchecked = _conditions(group, program, sources)
    _rename_dims(model, renames)
    _strip_metadata(model)
    model.metadata_props.update(
        {"capture.group": group.name, "capture.structure_id": group.structure_id}
    )
    inputs = _bind_inputs(group, program, model, leaves)
    return Converted(group.name, model, inputs, outputs, bounds, conditions, unchecked)


def _bind_inputs(
    group: ExportGroup, program: ExportedProgram, model: ir.Model, leaves: dict[str, int]
) -> list[InputBinding]:
    """One binding per ONNX input: the k-th ONNX input is the program's k-th tensor input.

    The exporter may rename an input (``x`` -> ``x_orig`` when the program returns ``x`` as
    is); it gets its placeholder name back (the name ``capture profiles`` prints) when no other
    value holds it (outputs are renamed first).
    """
    names = [
        str(spec.arg.name)
        for spec in _user_inputs(program)
        if hasattr(spec.arg, "name") and str(spec.arg.name) in leaves
    ]
    values = list(model.graph.inputs)
    if len(names) != len(values):
        raise ReplayError(
            f"group {group.name}: the ONNX model has {len(values)} inputs, the program "
            f"{len(names)} tensor inputs"
        )
    taken = {str(v.name) for v in model.graph.outputs}
    for node in model.graph.all_nodes():
        taken.update(str(v.name) for v in node.outputs if v is not None)
    inputs = []
    for name, value in zip(names, values, strict=True):
        if value.name != name and name not in taken:
            value.name = name
        leaf = leaves[name]
        recorded = group.structure.tensors[leaf]
        inputs.append(
            InputBinding(str(value.name), leaf, recorded.path, str(recorded.dtype), _shape(value))
        )
    return inputs


_CHATTER = (
    "torch.onnx._internal.exporter._registration",
    "onnx_ir.passes.common.initializer_deduplication",
)
"""Loggers whose warnings on every conversion are noise to the caller: "torchvision is not
installed. Skipping torchvision::nms", "Skipped deduplication of initializer 'slice_14' as it
is a graph input or output" (the converted file is checked either way)."""


@contextlib.contextmanager
def _quiet_registry() -> Iterator[None]:
    """Keeps the exporter's chatter (`_CHATTER`) off the caller's stderr while converting."""
    loggers = [logging.getLogger(name) for name in _CHATTER]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _shape(value: ir.Value) -> tuple[int | str, ...]:
    return tuple(_dim(d) for d in value.shape) if value.shape is not None else ()


def _dim(dim: Any) -> int | str:
    return dim if isinstance(dim, int) else str(getattr(dim, "value", dim))


def _user_inputs(program: ExportedProgram) -> list[Any]:
    """The program's user input specs, in the order of its flattened call."""
    from torch.export.graph_signature import InputKind

    return [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]


def _leaf_of_input(
    group: ExportGroup, program: ExportedProgram
) -> tuple[dict[str, int], dict[str, int]]:
    """Placeholder name -> index of the recorded tensor leaf it takes; and the same by the
    ``L[...]`` source the program's guards name the input with.

    An example call is rebuilt as the recorded calls pass it and arranged in the program's call
    form (`replay.runtime.callform.arrange` moves the same tensor objects); the program's flattened
    call is then matched to the recorded tensors by identity.
    """
    from replay.runtime import callform

    sizes = group.example.representative.sizes
    args, kwargs = group.recorded_call(sizes)
    recorded = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if len(recorded) != len(group.structure.tensors):
        raise ReplayError(
            f"group {group.name}: {len(recorded)} tensors rebuilt for "
            f"{len(group.structure.tensors)} recorded tensor leaves"
        )
    index = {id(t): i for i, t in enumerate(recorded)}
    call_args, call_kwargs = callform.arrange(group.example.form, args, kwargs)
    example_kwargs: dict[str, Any] = dict((program.example_inputs or ((), {}))[1])
    ordered = {k: call_kwargs[k] for k in example_kwargs if k in call_kwargs}
    ordered.update({k: v for k, v in call_kwargs.items() if k not in ordered})
    flat, _ = pytree.tree_flatten_with_path((call_args, ordered))
    specs = _user_inputs(program)
    if len(flat) != len(specs):
        raise ReplayError(
            f"group {group.name}: the program takes {len(specs)} inputs, the recorded call "
            f"flattens to {len(flat)}"
        )
    by_name: dict[str, int] = {}
    by_source: dict[str, int] = {}
    for spec, (path, value) in zip(specs, flat, strict=True):
        name = getattr(spec.arg, "name", None)
        if isinstance(value, torch.Tensor) and id(value) in index:
            if name is not None:
                by_name[str(name)] = index[id(value)]
            # The spelling of replay.pipeline.exporting's guard rewrite: "L" + keystr of the path.
            by_source["L" + pytree.keystr(tuple(path[1:]))] = index[id(value)]
    return by_name, by_source


def _conditions(
    group: ExportGroup, program: ExportedProgram, sources: dict[str, int]
) -> tuple[list[Condition], list[str]]:
    """The program's guards over the recorded dims (`replay.runtime.conditions`)."""
    from capture.compat import guards_code

    code = guards_code(program)
    if code is None:
        return [], ["torch keeps no guards under ExportedProgram._guards_code"]
    widths = [int(leaf.ndim) for leaf in group.structure.tensors]
    starts = [sum(widths[:i]) for i in range(len(widths))]
    return translate(code, {src: (starts[i], widths[i]) for src, i in sources.items()})


def _bounds(
    group: ExportGroup, program: ExportedProgram, leaves: dict[str, int]
) -> tuple[list[tuple[int, int | None] | None], dict[str, str]]:
    """Per recorded tensor axis, the program's bounds; and torch symbol -> recorded symbol."""
    ranges = {str(sym): vr for sym, vr in program.range_constraints.items()}
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    offsets, width = [], 0
    for recorded in group.structure.tensors:
        offsets.append(width)
        width += int(recorded.ndim)
    bounds: list[tuple[int, int | None] | None] = [None] * width
    seen: dict[str, set[str]] = {}
    for name, leaf in leaves.items():
        val = placeholders[name].meta.get("val") if name in placeholders else None
        if val is None:
            continue
        for axis, size in enumerate(val.shape):
            at = offsets[leaf] + axis
            if isinstance(size, int):
                bounds[at] = (size, size)
                continue
            text = str(size)
            vr = ranges.get(text)
            if vr is not None:
                # A lower bound of 2 is torch.export's 0/1 specialization floor, which
                # ep.module() does not check at run time (a recorded batch of 1 is served):
                # only a higher one is a guard of the program's own.
                low = _finite(vr.lower) or 0
                bounds[at] = (low if low > 2 else 0, _finite(vr.upper))
                symbol = group.dims[at].symbol if at < len(group.dims) else None
                if symbol and group.dims[at].dynamic:
                    seen.setdefault(text, set()).add(str(symbol))
    renames = {
        torch_name: next(iter(names))
        for torch_name, names in seen.items()
        if len(names) == 1 and not _SYMBOL.fullmatch(next(iter(names)))
    }
    # Two torch symbols may carry one recorded symbol (torch.export did not tie dims the
    # recordings show equal): both get its name, which is what the guard enforces anyway.
    return bounds, renames


def _strip_metadata(model: ir.Model) -> None:
    """Drops the exporter's per-node metadata (the FX node, its stack trace with the
    exporting machine's file paths, name scopes): about 2 KB per node, more than the weights
    of a small model, and nothing onnxruntime reads."""
    for node in model.graph.all_nodes():
        node.metadata_props.clear()
        for value in node.outputs:
            if value is not None:
                value.metadata_props.clear()


def _finite(bound: Any) -> int | None:
    """A range bound as an int, None for torch's (int) infinities."""
    try:
        return int(bound)
    except (TypeError, ValueError, OverflowError, AttributeError):
        # sympy's oo and torch's int_oo: unbounded (int() of int_oo raises AttributeError)
        return None


def _rename_dims(model: ir.Model, renames: dict[str, str]) -> None:
    """Renames torch's dim symbols in every value shape of the main graph."""
    import onnx_ir as ir

    if not renames:
        return

    def rename(text: str) -> str:
        return _SYMBOL.sub(lambda m: renames.get(m.group(0), m.group(0)), text)

    values: list[ir.Value] = list(model.graph.inputs) + list(model.graph.outputs)
    for node in model.graph.all_nodes():
        values.extend(v for v in node.outputs if v is not None)
    for value in values:
        shape = value.shape
        if shape is None:
            continue
        # An unnamed dim (value None) stays unnamed: spelled "None", every unknown dim of the
        # graph would be one name, which onnxruntime takes as one size (its buffer reuse fails).
        dims = [
            d if isinstance(d, int) or d.value is None else ir.SymbolicDim(rename(str(d.value)))
            for d in shape
        ]
        if any(not isinstance(d, int) and d.value is not None for d in shape):
            value.shape = ir.Shape(dims)


def _stand_in(value: Any) -> torch.Tensor:
    """A tensor of ones of `value`'s rank (a fake tensor from the graph), else of one element."""
    rank = value.dim() if isinstance(value, torch.Tensor) else 1
    return torch.ones((1,) * rank)


def _outputs(program: ExportedProgram, model: ir.Model) -> OutputBinding:
    """Renames the model's outputs by their key paths and returns the output binding."""
    import onnx_ir as ir
    from torch.export.graph_signature import OutputKind

    specs = [s for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    out_spec = program.call_spec.out_spec
    if out_spec is None or out_spec.num_leaves != len(specs):
        raise ReplayError("the program's output treespec does not match its outputs")
    graph_outputs = list(model.graph.outputs)
    names: list[str | None] = []
    constants: list[Any] = []
    # Stand-in leaves, only to read each leaf's key path back (a None would not be a leaf),
    # each of its output's rank: unflattening runs the output classes' constructors, and an
    # EncoderDecoderCache reads its layers' sequence length (``keys.shape[-2]``).
    values = {n.name: n.meta.get("val") for n in program.graph.nodes}
    placeholders: list[Any] = []
    positions: list[int] = []
    for spec in specs:
        # The exporter may rename an output value (new_zeros_1 -> new_zeros_3): tensor outputs
        # are matched by position, constants (ConstantArgument) are not graph outputs.
        if hasattr(spec.arg, "name"):
            positions.append(sum(p >= 0 for p in positions))
            names.append(
                str(graph_outputs[positions[-1]].name)
                if positions[-1] < len(graph_outputs)
                else None
            )
            constants.append(None)
        else:
            positions.append(-1)
            names.append(None)
            constants.append(getattr(spec.arg, "value", None))
        placeholders.append(_stand_in(values.get(str(getattr(spec.arg, "name", "")))))
    if sum(p >= 0 for p in positions) != len(graph_outputs) or None in [
        n for n, p in zip(names, positions, strict=True) if p >= 0
    ]:
        raise ReplayError(
            f"the ONNX model has {len(graph_outputs)} outputs, the program "
            f"{sum(p >= 0 for p in positions)} tensor outputs"
        )
    tree = pytree.tree_unflatten(placeholders, out_spec)
    paths = [path for path, _ in pytree.tree_flatten_with_path(tree)[0]]
    used: set[str] = {str(v.name) for v in model.graph.inputs}
    renamed: set[int] = set()
    for index, (name, path) in enumerate(zip(names, paths, strict=True)):
        if name is None:
            continue
        readable = output_name(path)
        while readable in used:
            readable += "_"
        used.add(readable)
        position = positions[index]
        value = model.graph.outputs[position]
        if value.is_graph_input() or value.is_initializer() or id(value) in renamed:
            # An input returned as is, a constant, or a value returned twice: an output of
            # its own, so that renaming it renames nothing else.
            node = ir.Node("", "Identity", [value], num_outputs=1)
            model.graph.append(node)
            value = node.outputs[0]
            model.graph.outputs[position] = value
        renamed.add(id(value))
        value.name = readable
        names[index] = readable
    return OutputBinding(pytree.treespec_dumps(out_spec), tuple(names), tuple(constants))
