"""capture: record how a PyTorch model is really called, for torch.export.

The package exposes its API lazily (PEP 562 ``__getattr__``): ``import capture`` imports
nothing heavy, and ``capture.open_store`` / the analysis modules load without torch, so the
``capture query`` command stays fast. ``capture.Recorder`` imports torch and pyarrow on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from capture import errors
from capture.errors import *  # noqa: F403  (its classes, so callers catch them without a second import)

__all__ = [
    "Recorder",
    "open_store",
    "Store",
    "compact",
    "InputObserver",
    "string_type",
    "register_flattening_functions",
    "make_dynamic_cache",
    "register_cache",
    "RecorderOptions",
    "Payloads",
    "__version__",
]
__all__ += errors.__all__

_LAZY = {
    "Recorder": "capture.record.recorder",
    "open_store": "capture.store_api",
    "Store": "capture.store_api",
    "compact": "capture.store.compaction",
    "InputObserver": "capture.seeds.observer",
    "string_type": "capture.seeds.strings",
    "register_flattening_functions": "capture.pytree.nodes",
    "make_dynamic_cache": "capture.pytree.nodes",
    "register_cache": "capture.pytree.cachespec",
    "RecorderOptions": "capture.record.recorder_options",
    "Payloads": "capture.record.recorder_options",
}

if TYPE_CHECKING:
    __version__: str
    from capture.pytree.cachespec import register_cache
    from capture.pytree.nodes import make_dynamic_cache, register_flattening_functions
    from capture.record.recorder import Recorder
    from capture.record.recorder_options import Payloads, RecorderOptions
    from capture.seeds.observer import InputObserver
    from capture.seeds.strings import string_type
    from capture.store.compaction import compact
    from capture.store_api import Store, open_store


def _version() -> str:
    """pyproject.toml's version, as the installed metadata carries it (its one source)."""
    # Imported here: importlib.metadata costs more than the rest of `import capture`.
    import importlib.metadata

    try:
        return importlib.metadata.version("capture")
    except importlib.metadata.PackageNotFoundError:  # a source tree never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = version = _version()
        return version
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'capture' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
