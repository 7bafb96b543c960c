"""A program of an artifact, built straight from its graph JSON into a runnable fx graph.

torch's own deserializer rebuilds a whole `torch.export.ExportedProgram` from a program's JSON:
a ShapeEnv, a sympy expression for every symbolic size and a fake tensor for every node, all
to reproduce what export knew at trace time. Running the graph needs none of it: the runner
checks its own guards before a call reaches a program (`replay.runtime.guards`), so a program
here is only its operators, wired as the JSON says. `build_program` reads the parsed (already
checked, `replay.runtime.pt2.graph_check`) JSON once, maps each node's target to its torch
operator through one table (`resolve_target`), each argument to its value (tensors and sizes
to the nodes that produce them, dtypes, devices, layouts, memory formats and scalars to
their torch values, a subgraph to a sub-module), and each input of the graph signature to
the artifact's parameter, buffer or constant, or to the call's flattened input. The result
is a `torch.fx.GraphModule` wrapped in a `Program`, which flattens a call by the program's
input treespec, runs the graph, writes buffer mutations back to the buffers (as the unlifted
module torch builds does) and rebuilds the output structure. The load builds every program's
fx graph and the Python code torch.fx generates for it, so a loaded runner answers its first
call at the eager model's speed; the parsed JSON is dropped once the graph is built.

Nothing is evaluated: the JSON is data read field by field, and an operator is reached only by
name through `resolve_target`.

The package holds the graph reader (`fx_graph`: `resolve_target` and the JSON-to-fx builder)
and the runnable program (`runnable`: `Program`, `build_program`); import the names from here.
"""

from __future__ import annotations

from replay.runtime.pt2.program.fx_graph import resolve_target
from replay.runtime.pt2.program.runnable import Program, build_program

__all__ = ["Program", "build_program", "resolve_target"]
