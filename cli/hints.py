"""`capture hints`: torch.compile dynamic marks from the recorded traffic, as JSON.

A thin command over `replay.inputs.specs.compilehints`; a server reads the document back with
``replay.CompileHints.from_json`` and applies it to its module before ``torch.compile``.
"""

from __future__ import annotations

import click

from .flags import model_option
from .main import store_path
from .output import write_text

__all__ = ["compile_hints_command"]


@click.command("hints")
@model_option("The model (the Recorder's name). Default: the store's only model.")
@click.pass_context
def compile_hints_command(ctx: click.Context, model_name: str | None) -> None:
    """Print torch.compile dynamic marks per call group, as JSON.

    One entry per call group: its recorded call structure and, per dynamic
    axis, the tensor, the recorded min and max and the size most calls had.
    replay.CompileHints.from_json(text).apply(module) marks every incoming
    call of a recorded group before the compiled forward sees it, so the
    recorded traffic compiles once per call group.

    \b
    Example:
      capture hints > hints.json
      capture hints --model LlamaForCausalLM
    """
    import capture
    import replay

    with capture.open_store(store_path(ctx)) as store:
        if model_name is not None:
            store.check_model(model_name)
        hints = replay.compile_hints(store, model_name)
    write_text(hints.to_json(), data=True)
