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
    "ExportOptions",
    "group_coverage",
    "coverage_total",
    "validate",
    "read_any_manifest",
    "check_rows",
    "DriftRow",
    "Saved",
    "require_onnx",
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
    "ExportOptions": "replay.inputs.options",
    "group_coverage": "replay.runtime.coverage",
    "coverage_total": "replay.runtime.coverage",
    "validate": "replay.validation",
    "read_any_manifest": "replay.loader",
    "check_rows": "replay.check.drift",
    "DriftRow": "replay.check.drift",
    "Saved": "replay.pipeline.result",
    "require_onnx": "replay.onnx.target",
    "ModelInputs": "replay.inputs.modelinputs",
    "all_dynamic_shape_from_inputs": "replay.inputs.modelinputs",
    "load": "replay.loader",
    "additional_inputs": "replay.inputs.specs.additional",
    "compile_hints": "replay.inputs.specs.compilehints",
    "CompileHints": "replay.inputs.specs.compilehints",
}

if TYPE_CHECKING:
    from replay.check.drift import DriftRow, check_rows
    from replay.inputs.builder import ExportInputs, export_inputs
    from replay.inputs.modelinputs import ModelInputs, all_dynamic_shape_from_inputs
    from replay.inputs.options import ExportOptions
    from replay.inputs.specs.additional import additional_inputs
    from replay.inputs.specs.compilehints import CompileHints, compile_hints
    from replay.loader import load, read_any_manifest
    from replay.onnx.target import require_onnx
    from replay.pipeline.exporting import export
    from replay.pipeline.result import ExportResult, Saved
    from replay.runtime.coverage import coverage_total, group_coverage
    from replay.validation import validate


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'replay' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
