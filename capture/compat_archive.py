"""The seam for torch's private PT2-archive APIs: serialization, the archive writer, AOTInductor.

The other half of `capture.compat` (split by concept: this one is the artifact's,
`replay.runtime`), under the same rules: each use of a private torch API is one function here,
naming the API (`PRIVATE_APIS`) and what breaks without it, checked on the torch versions of
`capture.compat.CHECKED_ON`; `tests/test_compat.py` calls each against the installed torch.
No torch import at import time.

Example:
    >>> from capture import compat_archive
    >>> sorted(compat_archive.PRIVATE_APIS)[:2]
    ['aoti_compile', 'aoti_load']
"""

from __future__ import annotations

import threading
from typing import Any

from capture.compat import CHECKED_ON

__all__ = [
    "CHECKED_ON",
    "PRIVATE_APIS",
    "serialize_program",
    "deserialize_program",
    "write_archive_storage",
    "aoti_compile",
    "aoti_load",
]

PRIVATE_APIS = {
    "serialize_program": "torch._export.serde.serialize.serialize (state dict, constants, "
    "example inputs left out; on torch < 2.13 its serialize_torch_artifact skipped)",
    "deserialize_program": (
        "torch._export.serde.serialize._bytes_to_dataclass, ExportedProgramDeserializer"
    ),
    "write_archive_storage": "PT2ArchiveWriter.archive_file (torch._C.PyTorchFileWriter)",
    "aoti_compile": "torch._inductor.aot_compile (aot_inductor.package_constants_in_so=False)",
    "aoti_load": "torch.export.pt2_archive._package._load_aoti",
}
"""Function of this module -> the private torch API it uses (checked on `CHECKED_ON`)."""

_SERIALIZE_LOCK = threading.Lock()


def serialize_program(program: Any) -> bytes:
    """An exported program's graph as torch's JSON, without its weights or example inputs.

    Private API: ``torch._export.serde.serialize.serialize`` (``serialize_state_dict``,
    ``serialize_constants``, ``serialize_example_inputs`` = False; torch 2.11 and 2.12 lack
    them: ``serialize_torch_artifact`` is skipped for the call instead). Without it an artifact
    could only be written by ``package_pt2``, which stores every program's weights again.

    Example:
        >>> data = serialize_program(torch.export.export(model, args))  # doctest: +SKIP
    """
    import inspect

    from torch._export.serde import serialize as serde

    if (
        "serialize_state_dict"
        in inspect.signature(serde.ExportedProgramSerializer.serialize).parameters
    ):
        artifact = serde.serialize(
            program,
            serialize_state_dict=False,
            serialize_constants=False,
            serialize_example_inputs=False,
        )
        return bytes(artifact.exported_program)
    # torch < 2.13 has no such keywords: its serializer pickles the weights, constants and
    # example inputs (``serialize_torch_artifact``) beside the JSON, bytes the artifact never
    # keeps. Under the lock, that one step returns nothing instead, so saving costs no copy of
    # the weights and nothing is pickled.
    with _SERIALIZE_LOCK:
        pickle_step = serde.serialize_torch_artifact
        serde.serialize_torch_artifact = lambda *_args, **_kwargs: b""
        try:
            artifact = serde.serialize(program)
        finally:
            serde.serialize_torch_artifact = pickle_step
    return bytes(artifact.exported_program)


def deserialize_program(data: bytes, state_dict: dict[str, Any], constants: dict[str, Any]) -> Any:
    """An exported program from torch's JSON and tensors the caller already holds.

    Private API: ``torch._export.serde.serialize._bytes_to_dataclass`` and
    ``ExportedProgramDeserializer.deserialize``. The program uses the given tensors as they
    are (no copy), which is what lets several programs share one weight; without it a loader
    must go through ``load_pt2``, which reads every program's weights again.

    Example:
        >>> program = deserialize_program(data, {"w": w}, {})  # doctest: +SKIP
    """
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _bytes_to_dataclass

    serialized = _bytes_to_dataclass(schema.ExportedProgram, data)
    return ExportedProgramDeserializer().deserialize(serialized, state_dict, constants, None)


def write_archive_storage(writer: Any, name: str, storage: Any) -> None:
    """Writes a CPU tensor storage's bytes as one record of a PT2 archive, without a copy.

    Private API: ``PT2ArchiveWriter.archive_file`` (a ``torch._C.PyTorchFileWriter``) and its
    ``write_record(name, storage, nbytes)`` overload. Without it every record would be copied
    into a Python ``bytes`` first (twice the memory of the largest weight).

    Example:
        >>> write_archive_storage(writer, "w/weight_0", w.untyped_storage())  # doctest: +SKIP
    """
    writer.archive_file.write_record(name, storage, storage.nbytes())


def aoti_compile(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """AOTInductor-compiles a module into package files *without its weights*.

    Private API: ``torch._inductor.aot_compile`` with ``aot_inductor.package`` and
    ``aot_inductor.package_constants_in_so=False`` (weights are neither in the shared library
    nor on disk: the loader hands them over with ``load_constants(user_managed=True)``, so the
    compiled programs use the artifact's one copy).

    Example:
        >>> files = aoti_compile(program.module(), args, kwargs)  # doctest: +SKIP
    """
    import warnings

    from torch._inductor import aot_compile

    options = {"aot_inductor.package": True, "aot_inductor.package_constants_in_so": False}
    with warnings.catch_warnings():
        # torch 2.13's own deprecation warnings while it copies graphs (LeafSpec): chatter
        warnings.simplefilter("ignore", FutureWarning)
        return list(aot_compile(module, args, kwargs, options=options))  # type: ignore[arg-type]


def aoti_load(path: str, name: str, device_index: int = -1) -> Any:
    """Loads one AOTInductor build of a PT2 archive (its weights not yet loaded).

    Private API: ``torch.export.pt2_archive._package._load_aoti`` (an ``AOTICompiledModel``
    over ``torch._C._aoti.AOTIModelPackageLoader``). Loading it runs the build's native code.

    Example:
        >>> compiled = aoti_load("model.pt2", "g0")  # doctest: +SKIP
    """
    from torch.export.pt2_archive._package import _load_aoti

    return _load_aoti(path, name, False, 1, device_index)
