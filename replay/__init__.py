"""replay: from recordings to export arguments, dynamic shapes and a checked export.

Exposed lazily so that importing `replay` costs nothing until an API is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "export_inputs",
    "export",
    "ExportInputs",
    "ExportResult",
    "Saved",
    "ModelInputs",
    "all_dynamic_shape_from_inputs",
    "load",
    "additional_inputs",
    "compile_hints",
    "CompileHints",
]

_LAZY = {
    "export_inputs": "replay.inputs.builder",
    "ExportInputs": "replay.inputs.builder",
    "export": "replay.pipeline.exporting",
    "ExportResult": "replay.pipeline.result",
    "Saved": "replay.pipeline.result",
    "ModelInputs": "replay.inputs.modelinputs",
    "all_dynamic_shape_from_inputs": "replay.inputs.modelinputs",
    "load": "replay.loader",
    "additional_inputs": "replay.inputs.specs.additional",
    "compile_hints": "replay.inputs.specs.compilehints",
    "CompileHints": "replay.inputs.specs.compilehints",
}

if TYPE_CHECKING:
    from replay.inputs.builder import ExportInputs, export_inputs
    from replay.inputs.modelinputs import ModelInputs, all_dynamic_shape_from_inputs
    from replay.inputs.specs.additional import additional_inputs
    from replay.inputs.specs.compilehints import CompileHints, compile_hints
    from replay.loader import load
    from replay.pipeline.exporting import export
    from replay.pipeline.result import ExportResult, Saved


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'replay' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
