"""The artifact's manifest, the ONNX side: `replay.runtime.manifest` seen from an ONNX set.

``onnx=model.onnx`` writes ``model.onnx`` (one program) or ``model.<group>.onnx`` (several),
their shared weights ``model.onnx.data`` (`replay.runtime.ort.weights`) and this manifest,
``model.onnx.json``, last: its presence says the set is complete. It is the ``.pt2``
artifact's manifest under its own format (`FORMAT`), read by the same typed code
(`replay.runtime.manifest.Manifest.read`): ``model``, ``created``, ``versions`` (torch,
transformers, capture, onnx, onnxscript, onnxruntime), ``modules`` (the model ``""`` and each
sub-module exported with ``modules=True``, ``encoder``: the store, the export's ``complete``, its
coverage rows, torch and ONNX) and ``programs``: one `replay.runtime.manifest.ProgramEntry` per
call group (or regime) of each module with its guard
(`replay.runtime.guards.ProgramGuard`: recorded structure, ranges, relations, ``rejected``: the
recorded signatures the ONNX check failed). What only an ONNX set has, each read field by field
too (`OnnxFile`, `OnnxManifest`):

- ``weights``: the shared file's name and size;
- per program entry ``file``, ``opset``, ``inputs`` (ONNX name, the recorded tensor leaf it
  takes, dtype, per axis its size or dim name, and ``min`` / ``max``: what an onnxruntime or
  TensorRT deployment builds its profiles from), ``dims`` (dim name -> recorded ``min`` /
  ``max``), ``outputs`` (the output treespec, the ONNX name of each output leaf) and
  ``unchecked_guards``.

An axis whose range torch.export bounded more tightly than the recordings carries the
program's range (``narrowed``), and the program's own size guards travel as the guard's
``conditions`` (`replay.runtime.conditions`): the ONNX graph checks none of them, the runner's
guard does (`replay.onnx.entries` writes them).

`read_onnx_set` reads a set as data, without torch or onnx, as
`replay.runtime.pt2.loading.read_artifact` reads a ``.pt2``: the manifest (a regular file, not a
link, its size bounded before it is read) parsed into typed entries, every pytree type it names one
the loader may register, and every file it names a bare name beside it, a regular file, not a link.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replay.runtime.checked_json import Fields, checked_format, load, to_json
from replay.runtime.digests import older
from replay.runtime.guards import ArtifactError
from replay.runtime.manifest import MANIFEST_CAP, Manifest, ProgramEntry
from replay.runtime.ort.weights import OnnxFileError

__all__ = [
    "FORMAT",
    "OnnxInput",
    "OnnxOutputs",
    "OnnxFile",
    "OnnxManifest",
    "manifest_path",
    "weights_path",
    "is_onnx_path",
    "read_onnx_set",
    "onnx_versions",
]

FORMAT = "capture-onnx/2"
"""The manifest's ``format``: bumped when a reader could misread a newer manifest (2: the digest
of every file, ``digests``)."""

_FILE = re.compile(r"[^./\\\0][^/\\\0]{0,254}\Z")
"""A bare file name: no directory, not hidden, not ``.`` or ``..``."""
_DIM = re.compile(r"[A-Za-z0-9_ +*/%(),.-]{1,256}\Z")
"""A dim name or its expression (``batch``, ``past_key_values_2 + 1``)."""


def manifest_path(path: str | os.PathLike[str]) -> str:
    """The manifest of the ONNX set written for ``onnx=path``.

    Example:
        >>> manifest_path("out/model.onnx")
        'out/model.onnx.json'
    """
    text = os.fspath(path)
    return text if text.endswith(".onnx.json") else f"{text}.json"


def weights_path(path: str | os.PathLike[str]) -> str:
    """The shared weights file of the ONNX set written for ``onnx=path``.

    Example:
        >>> weights_path("out/model.onnx")
        'out/model.onnx.data'
    """
    text = os.fspath(path)
    return f"{text.removesuffix('.json')}.data"


def is_onnx_path(path: str | os.PathLike[str]) -> bool:
    """Tells whether `path` names an ONNX set (``model.onnx`` or its ``model.onnx.json``).

    Example:
        >>> is_onnx_path("model.onnx"), is_onnx_path("model.pt2")
        (True, False)
    """
    return os.fspath(path).endswith((".onnx", ".onnx.json"))


def onnx_versions() -> dict[str, str | None]:
    """The versions of what made and runs the files (None: not installed).

    Example:
        >>> sorted(onnx_versions())
        ['capture', 'onnx', 'onnxruntime', 'onnxscript', 'torch', 'transformers']
    """
    from importlib.metadata import PackageNotFoundError, version

    from capture import __version__

    out: dict[str, str | None] = {"capture": __version__}
    for name in ("torch", "transformers", "onnx", "onnxscript", "onnxruntime"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def bare_name(f: Fields, key: str) -> str:
    """A file name field: a bare name (no directory, not hidden), beside the manifest."""
    name = str(f.text(key, max_len=255))
    if not _FILE.match(name):
        f.fail(f"{f.where}.{key}", f"{name[:60]!r} is not a file name beside the manifest")
    return name


@dataclass(frozen=True)
class OnnxInput:
    """One input of an ONNX file and the recorded tensor leaf it takes.

    Attributes:
        name: The ONNX input name.
        leaf: Index of the tensor among the file's program's tensor leaves.
        path: The recorded leaf path (``kwargs['input_ids']``) the runner feeds it from.
        dtype: The recorded dtype.
        shape: Per axis, its size (static) or its dim name (dynamic).
        min: Per axis, the smallest size the entry's group sends.
        max: Per axis, the largest.
    """

    name: str = field(metadata={"max_len": 1024})
    leaf: int = field(metadata={"low": 0, "high": 1_000_000})
    path: str
    dtype: str = field(metadata={"max_len": 64})
    shape: tuple[int | str, ...] = field(metadata={"pattern": _DIM, "low": 0, "max_items": 64})
    min: tuple[int, ...] = field(metadata={"low": 0})
    max: tuple[int, ...] = field(metadata={"low": 0})

    def invalid(self) -> str | None:
        """What is wrong beyond the fields' types (`replay.runtime.checked_json.read`)."""
        if len(self.shape) == len(self.min) == len(self.max):
            return None
        return f"has {len(self.shape)} axes, {len(self.min)} minima and {len(self.max)} maxima"


@dataclass(frozen=True)
class OnnxOutputs:
    """How a file's outputs become the program's output object.

    Attributes:
        spec: The program's output treespec (``treespec_dumps`` JSON, parsed by the runner with
            capture's allow-list parser, `capture.pytree.treespec`).
        names: Per output leaf, the ONNX output name, or None for a constant leaf.
        constants: Per output leaf, its value when it is a constant (None otherwise).
    """

    spec: str = field(metadata={"max_len": 10_000_000})
    names: tuple[str | None, ...] = field(metadata={"max_len": 1024, "max_items": 100_000})
    constants: tuple[Any, ...] = field(metadata={"max_items": 100_000})

    def invalid(self) -> str | None:
        """What is wrong beyond the fields' types (`replay.runtime.checked_json.read`)."""
        if len(self.names) == len(self.constants):
            return None
        return f"has {len(self.names)} names for {len(self.constants)} constants"


@dataclass(frozen=True)
class OnnxFile:
    """What one program entry of an ONNX set says that a ``.pt2`` entry does not.

    Attributes:
        file: The ONNX file serving the entry (a bare name beside the manifest).
        inputs: One per ONNX input, in the file's input order.
        outputs: How its outputs become eager's output object.
        dims: Dim name -> ``(min, max)`` the entry's group sends.
        opset: The file's default-domain opset.
        unchecked_guards: The program's guard lines that could not be translated into
            conditions (the runner's guard does not check them).
    """

    file: str
    inputs: tuple[OnnxInput, ...]
    outputs: OnnxOutputs
    dims: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    opset: int | None = None
    unchecked_guards: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The ONNX fields of the entry's JSON object."""
        return {
            "file": self.file,
            "opset": self.opset,
            "inputs": to_json(self.inputs),
            "dims": {k: {"min": low, "max": high} for k, (low, high) in self.dims.items()},
            "outputs": to_json(self.outputs),
            "unchecked_guards": list(self.unchecked_guards),
        }

    @classmethod
    def parse(cls, f: Fields) -> OnnxFile:
        """Reads the ONNX fields of one ``programs`` item.

        Raises:
            ArtifactError: A field is missing, of the wrong type or out of bounds.
        """
        dims = f.child("dims", optional=True)
        ranges = {}
        for name in dims.raw:
            if not _DIM.match(str(name)):
                f.fail(f"{dims.where}", f"names the dim {str(name)[:60]!r}")
            d = dims.child(name)
            ranges[str(name)] = (d.integer("min", low=0), d.integer("max", low=0))
        return cls(
            file=bare_name(f, "file"),
            inputs=tuple(f.each_of("inputs", OnnxInput)),
            outputs=f.one("outputs", OnnxOutputs),
            dims=ranges,
            opset=f.integer("opset", low=0, high=10_000, optional=True),
            unchecked_guards=tuple(f.texts("unchecked_guards", optional=True, max_len=10_000)),
        )


@dataclass(frozen=True)
class OnnxManifest:
    """An ONNX set's manifest, validated (`parse`) or built by `replay.onnx.entries`.

    Attributes:
        manifest: The typed manifest every artifact has (its ``programs`` are routed by
            `replay.runtime.guards.route`, as a ``.pt2``'s are).
        files: Per entry of ``manifest.programs`` (same order), its `OnnxFile`.
        weights: The shared weights file's name (beside the manifest).
        weights_bytes: Its size.
    """

    manifest: Manifest
    files: tuple[OnnxFile, ...]
    weights: str
    weights_bytes: int = 0

    @property
    def entries(self) -> list[tuple[ProgramEntry, OnnxFile]]:
        """Every program entry with its ONNX fields."""
        return list(zip(self.manifest.programs, self.files, strict=True))

    def program_files(self) -> dict[str, OnnxFile]:
        """Program name -> the `OnnxFile` of the entry of the group that owns it (its inputs
        are the file's; a merged group's entry names the same file). A sub-module's program
        is ``<module>.<group>`` (``encoder.g0``), as in a ``.pt2``."""
        return {e.program: f for e, f in self.entries if e.program == e.guard.label}

    def as_dict(self) -> dict[str, Any]:
        """The manifest as JSON-serializable data."""
        out = self.manifest.as_dict()
        out.pop("aoti", None)
        out["weights"] = {"file": self.weights, "bytes": self.weights_bytes}
        out["programs"] = [{**e.as_dict(), **f.as_dict()} for e, f in self.entries]
        return out

    def to_json(self) -> str:
        """The manifest's text (strict JSON: no NaN)."""
        import json

        return json.dumps(self.as_dict(), indent=1, allow_nan=False)

    @classmethod
    def parse(cls, data: bytes, source: str) -> OnnxManifest:
        """Parses and validates an ONNX set's manifest (module docstring).

        Raises:
            OnnxFileError: Not JSON, another `FORMAT`, a field missing, of the wrong type or
                out of bounds; entries of one program naming different files, or a program
                without the entry of the group owning it.
        """
        try:
            raw = older(load(data, source), source, ("capture-onnx/1",))
            f = checked_format(raw, FORMAT, source)
            manifest = Manifest.read(f)
            files = tuple(f.each("programs", OnnxFile.parse))
            weights = f.child("weights")
            out = cls(
                manifest,
                files,
                bare_name(weights, "file"),
                weights.integer("bytes", low=0),
            )
        except OnnxFileError:
            raise
        except ArtifactError as e:
            raise OnnxFileError(str(e)) from None
        owners = out.program_files()
        for i, (entry, file) in enumerate(out.entries):
            owner = owners.get(entry.program)
            if owner is None:
                raise OnnxFileError(
                    f"{source}.programs[{i}]: group {entry.group} is served by program "
                    f"{entry.program}, which no entry owns"
                )
            if owner.file != file.file:
                raise OnnxFileError(
                    f"{source}.programs[{i}]: group {entry.group} names {file.file}, its "
                    f"program {entry.program} is {owner.file}"
                )
        return out


def _regular(folder: str, name: str, what: str, source: str) -> str:
    """`name` in `folder`: a bare name (checked when parsed), a regular file, not a link."""
    if os.path.basename(name) != name or name in (".", ".."):
        raise OnnxFileError(f"{source}: {what} {name!r} is not a file name beside the manifest")
    full = os.path.join(folder, name)
    if os.path.islink(full) or not os.path.isfile(full):
        raise OnnxFileError(f"{source}: {what} {name} is missing or not a regular file")
    return full


def _read_bounded(source: str) -> bytes:
    """The manifest's bytes: a regular file, not a link, at most `MANIFEST_CAP` bytes."""
    if os.path.islink(source):
        raise OnnxFileError(f"{source} is a link; an ONNX set's manifest is a regular file")
    if not os.path.isfile(source):
        raise OnnxFileError(
            f"no ONNX manifest at {source}: replay.load takes the path given to onnx= "
            "(capture export --out MODEL.onnx writes one)"
        )
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(source, flags)
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MANIFEST_CAP:
                raise OnnxFileError(
                    f"{source} holds {size} bytes, more than the {MANIFEST_CAP} a manifest "
                    "may hold; it is not read"
                )
            return f.read(MANIFEST_CAP + 1)
    except OSError as e:
        raise OnnxFileError(f"{source} cannot be read: {e.strerror or e}") from None


def read_onnx_set(path: str | os.PathLike[str]) -> OnnxManifest:
    """Reads and checks an ONNX set's manifest and files as data: no torch, no onnx.

    Args:
        path: The ``onnx=`` path (``model.onnx``) or the manifest itself.

    Returns:
        The typed manifest, every file it names checked to be a bare name beside it, a
        regular file, not a link.

    Raises:
        OnnxFileError: No manifest, a link, too large, not JSON, another format, a field
            missing, of the wrong type or out of bounds, a pytree type the loader does not
            register, or a file name that leaves the folder, is missing or is a link.

    Example:
        >>> read_onnx_set("model.onnx").files[0].file  # doctest: +SKIP
        'model.decode.onnx'
    """
    from replay.runtime.allowed import ALLOWED_MODULES, loadable_type

    source = manifest_path(path)
    parsed = OnnxManifest.parse(_read_bounded(source), source)
    folder = os.path.dirname(os.path.abspath(source))
    _regular(folder, parsed.weights, "weights file", source)
    files = {f.file for f in parsed.files}
    for file in files:
        _regular(folder, file, "ONNX file", source)
    if set(parsed.manifest.digests) != files | {parsed.weights}:
        odd = sorted(set(parsed.manifest.digests) ^ (files | {parsed.weights}))
        raise OnnxFileError(
            f"{source}: its digests do not describe the set's files ({odd[0][:120]} differs)"
        )
    for entry in parsed.manifest.programs:
        for name in entry.pytree_types:
            if not loadable_type(name):
                raise OnnxFileError(
                    f"{source}: program {entry.program} names the pytree type {name[:200]}, "
                    "which the loader does not register (only types of "
                    f"{', '.join(ALLOWED_MODULES)} are, and those registered in the loading "
                    "process)"
                )
    return parsed
