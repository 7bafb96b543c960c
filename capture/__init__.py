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
    # Showing text a store holds, and checking where a command writes (capture.untrusted,
    # capture.output_paths): what the `capture` command uses, and any tool built on stores.
    "printable",
    "printable_lines",
    "terminal_data",
    "check_file",
    "check_folder",
    "writing",
    # A store's files: where a path or URI leads (capture.store.files), the payload files kept
    # with Recorder(payloads=...) (capture.store.payload_files), and the store's column names
    # and SCHEMA_VERSION (the module capture.schema, docs/schema.md).
    "resolve_store",
    "list_payloads",
    "delete_payloads",
    "schema",
    # TensorRT shape profiles of the recorded traffic (Store.profiles() is their table), and
    # the engines' own syntax for them (trtexec flags, torch_tensorrt.Input, ONNX Runtime).
    "store_profiles",
    "format_profiles",
    # The key of Store.buckets()'s totals (JSON) in its table's schema metadata.
    "METADATA_BUCKETS",
    # The tiny models of `capture demo` and the docs (``capture.demo_model:tiny_llama``).
    "demo_model",
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
    "printable": "capture.untrusted",
    "printable_lines": "capture.untrusted",
    "terminal_data": "capture.untrusted",
    "check_file": "capture.output_paths",
    "check_folder": "capture.output_paths",
    "writing": "capture.output_paths",
    "resolve_store": "capture.store.files",
    "list_payloads": "capture.store.payload_files",
    "delete_payloads": "capture.store.payload_files",
    "store_profiles": "capture.engines.profiles",
    "format_profiles": "capture.engines.profile_formats",
    "METADATA_BUCKETS": "capture.engines.buckets",
}

_MODULES = ("schema", "demo_model")
"""Public modules of the package, imported on first use (``from capture import schema``)."""

if TYPE_CHECKING:
    __version__: str
    from capture import demo_model, schema
    from capture.engines.buckets import METADATA_BUCKETS
    from capture.engines.profile_formats import format_profiles
    from capture.engines.profiles import store_profiles
    from capture.output_paths import check_file, check_folder, writing
    from capture.pytree.cachespec import register_cache
    from capture.pytree.nodes import make_dynamic_cache, register_flattening_functions
    from capture.record.recorder import Recorder
    from capture.record.recorder_options import Payloads, RecorderOptions
    from capture.seeds.observer import InputObserver
    from capture.seeds.strings import string_type
    from capture.store.compaction import compact
    from capture.store.files import resolve_store
    from capture.store.payload_files import delete_payloads, list_payloads
    from capture.store_api import Store, open_store
    from capture.untrusted import printable, printable_lines, terminal_data


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
    if name in _MODULES:
        return importlib.import_module(f"capture.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'capture' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
