"""The one seam for private torch APIs: each use, the torch versions it was checked on.

capture relies on a few torch internals that have no public equivalent (guards of an exported
program, pytree deregistration, the recorder's tensor guards, the PT2 archive's packaging).
Every such use goes through a function of this module, which names the private API, the
versions it was checked on, and what breaks without it; `tests/test_compat.py` calls each one
against the installed torch, so a torch release that moves one fails there, loudly, rather
than somewhere deep in a recording or an export.
"""

from __future__ import annotations

from typing import Any

CHECKED_ON = ("2.13.0",)
"""torch versions every entry of this module was checked on."""


# -- the artifact (replay.ship): torch's PT2 archive, program JSON, AOTInductor ---------------
# Checked on torch 2.13.0. Callers import torch; importing this module does not.


def serialize_program(program: Any) -> bytes:
    """An exported program's graph as torch's JSON, without its weights or example inputs.

    Private API: ``torch._export.serde.serialize.serialize`` (``serialize_state_dict``,
    ``serialize_constants``, ``serialize_example_inputs`` = False). Without it an artifact
    could only be written by ``package_pt2``, which stores every program's weights again.

    Example:
        >>> data = serialize_program(torch.export.export(model, args))  # doctest: +SKIP
    """
    from torch._export.serde.serialize import serialize

    artifact = serialize(
        program,
        serialize_state_dict=False,
        serialize_constants=False,
        serialize_example_inputs=False,
    )
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
