"""Whether the loader would take a program, asked at export time: what is claimed is what loads.

An export claims a group's rows covered only when its program would pass ``replay.load``'s
validation. `refusal` runs that validation on the program in memory, the way `save` writes it
and `replay.runtime.pt2.loading` reads it: its tensors placed in records
(`replay.runtime.pt2.weights.WeightTable`: no script object, no subclass, a strided layout) and
their payload configs parsed back (`replay.runtime.pt2.records.parse_config`: dtypes and
extents); its graph serialized as `save` serializes it (`replay.artifact.saving.program_graph`:
made once, `save` writes these very bytes) and checked as the loader checks it
(`replay.runtime.pt2.graph_check.check_program`: operators, in-place writes, size expressions,
guards, treespecs, pytree types) with the caller's ``allow_ops``; and its graph built from that
JSON around its own tensors (`replay.runtime.pt2.program.build_program`), as the loader builds
it. What the archive adds on disk (digests, layout, extents within records) is `save`'s own
doing and is checked when an artifact is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replay.runtime.allowed import AllowOps, loadable_type
from replay.runtime.guards import ArtifactError
from replay.runtime.pt2.archive import CONSTANT_PREFIX, MODELS, WEIGHT_PREFIX
from replay.runtime.pt2.graph_check import check_program
from replay.runtime.pt2.program import build_program
from replay.runtime.pt2.records import config_json, parse_config
from replay.runtime.pt2.weights import WeightTable

if TYPE_CHECKING:
    from torch.export import ExportedProgram

__all__ = ["LoaderRefusal", "refusal", "refused_operators"]


class LoaderRefusal(Exception):
    """A program the loader would refuse (its message is the loader's).

    Attributes:
        by_operator: The refusal names an operator the program calls: a program of the same
            model at other sizes calls it too (a static one included).
    """

    def __init__(self, reason: str, by_operator: bool) -> None:
        super().__init__(reason)
        self.by_operator = by_operator


def refusal(name: str, program: ExportedProgram, allowed: AllowOps = frozenset()) -> str | None:
    """The loader's reason to refuse `program`, or None when ``replay.load`` would take it.

    Args:
        name: The program's name (the group's), for the message.
        program: The exported program.
        allowed: The operators the caller will name at load (`replay.runtime.allowed.allow_ops`).

    Returns:
        The `replay.runtime.guards.ArtifactError` message the loader would raise, or None.

    Example:
        >>> refusal("decode", torch.export.export(model, args))  # doctest: +SKIP
        "models/decode.json: the program calls 'torch.ops.aten.bincount.default', which ..."
    """
    from capture.pytree import nodes
    from replay.artifact.saving import program_graph

    source = MODELS.format(name)
    try:
        # the graphs name the cache types: registered as the loader registers them
        with nodes.register_flattening_functions():
            table = WeightTable()
            table.add(name, program)
            graph = program_graph(program)  # what save writes (made once)
            slots = table.programs[name]
            parse_config(config_json(slots.weights).encode(), source, WEIGHT_PREFIX)
            parse_config(config_json(slots.constants).encode(), source, CONSTANT_PREFIX)
            tree = check_program(graph, source, loadable_type, allowed)
            state = dict(program.state_dict)
            constants = {k: v for k, v in program.constants.items() if k not in state}
            build_program(name, tree, state, constants, None, source)
    except ArtifactError as e:
        return str(e)
    except Exception as e:  # torch cannot serialize or rebuild it: save or load would fail
        text = (str(e).strip().splitlines() or [""])[0]
        return f"{source}: torch cannot serialize or read this program: {type(e).__name__}: {text}"
    return None


def refused_operators(program: ExportedProgram, allowed: AllowOps = frozenset()) -> list[str]:
    """The operators of `program` (as its serialized graph names them) the loader refuses.

    Example:
        >>> refused_operators(torch.export.export(model, args))  # doctest: +SKIP
        ['torch.ops.aten.bincount.default']
    """
    import json

    from capture.pytree import nodes
    from replay.artifact.saving import program_graph
    from replay.runtime.pt2.operators import op_kind

    try:
        with nodes.register_flattening_functions():
            graph = program_graph(program)  # made by `refusal` already
    except Exception:  # torch cannot serialize it: no operator to name
        return []
    stack: list[object] = [json.loads(graph)]
    out = set()
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            target = value.get("target")
            if isinstance(target, str) and op_kind(target, allowed) is None:
                out.add(target)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return sorted(out)
