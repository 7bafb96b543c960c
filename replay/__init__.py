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
    "ModelInputs",
    "all_dynamic_shape_from_inputs",
    "load",
]

_LAZY = {
    "export_inputs": "replay.inputs",
    "ExportInputs": "replay.inputs",
    "export": "replay.exporting",
    "ExportResult": "replay.result",
    "ModelInputs": "replay.modelinputs",
    "all_dynamic_shape_from_inputs": "replay.modelinputs",
    "load": "replay.ship.loader",
}

if TYPE_CHECKING:
    from replay.exporting import export
    from replay.inputs import ExportInputs, export_inputs
    from replay.modelinputs import ModelInputs, all_dynamic_shape_from_inputs
    from replay.result import ExportResult
    from replay.ship.loader import load


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'replay' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
