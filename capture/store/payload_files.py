"""Payload files: the real tensors of a sampled few calls (opt-in; they are user data).

With ``Recorder(model, store, payloads=0.01)`` (see `capture.record.payload_keeper`) about 1 % of
the recorded calls keep their input tensors, and the output tensors the model returned, in one
safetensors file per call::

    <root>/payloads/model=<m>/date=<YYYY-MM-DD>/<host>-<pid>-<t0>-<call_id:016x>.safetensors

safetensors, never pickle: the file is an 8-byte little-endian header length, a JSON header
(dtype, shape and byte range of every tensor, plus a flat string->string ``__metadata__``) and the
raw bytes. Reading it runs no code. Tensor names:

- ``in/<leaf>``: the tensor at leaf index ``<leaf>`` of the call's input structure
  (``structures.leaf`` of ``in_structure``); the structure's treespec and scalar leaves rebuild
  ``(args, kwargs)`` around them (`replay.payload_rows`).
- ``out/<i>``: the i-th leaf of torch's pytree flattening of what the model returned.

``__metadata__`` keys are in `METADATA_KEYS`. Files are written as ``.<name>.tmp`` in their final
folder and renamed, like the Parquet files: a reader never sees a partial file.

This module imports neither torch nor safetensors (the CLI lists and deletes payloads without
them); `read_payload` imports safetensors when it runs.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from capture.errors import CaptureError

if TYPE_CHECKING:
    import torch

__all__ = [
    "PAYLOADS",
    "PAYLOAD_VERSION",
    "SUFFIX",
    "METADATA_KEYS",
    "PayloadFile",
    "Payload",
    "PayloadError",
    "require_safetensors",
    "payload_folder",
    "list_payloads",
    "delete_payloads",
    "read_header",
    "read_payload",
]

PAYLOADS = "payloads"
"""The store folder that holds payload files (next to structures/, calls/, stats/)."""

PAYLOAD_VERSION = 1
"""Version of the payload file layout (``capture.payload_version`` in ``__metadata__``)."""

SUFFIX = ".safetensors"
SAFETENSORS_HINT = "pip install 'capture[payloads]'"

METADATA_KEYS = (
    "capture.kind",  # always "payload"
    "capture.payload_version",  # PAYLOAD_VERSION
    "capture.library_version",
    "model",  # the store's model name
    "call_id",  # decimal; the calls.call_id of the call
    "ts_ns",  # decimal; when the call started (ns since the epoch, UTC)
    "in_structure",  # calls.in_structure
    "outputs",  # "kept", or why the outputs were not kept
)
_MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header


class PayloadError(CaptureError):
    """A payload file that cannot be read (truncated, not safetensors, not ours)."""


def require_safetensors() -> None:
    """Checks that the safetensors package can be imported.

    Raises:
        CaptureError: safetensors is missing; the message names the extra to install.
    """
    try:
        import safetensors.torch  # noqa: F401
    except ImportError as e:
        raise CaptureError(
            "payloads=... keeps tensors in safetensors files, and the safetensors package is "
            f"not installed; run `{SAFETENSORS_HINT}` or leave payloads off"
        ) from e


def payload_folder(root: str, model: str, day: str) -> str:
    """``<root>/payloads/model=<model>/date=<day>`` (`model` already made safe)."""
    return f"{root}/{PAYLOADS}/model={model}/date={day}"


@dataclass(frozen=True)
class PayloadFile:
    """One payload file of a store."""

    path: str
    model: str
    date: str
    size: int


def _partition(path: str, key: str) -> str:
    for part in path.split("/"):
        if part.startswith(key + "="):
            return part[len(key) + 1 :]
    return ""


def list_payloads(
    store: str | os.PathLike[str] | tuple[pafs.FileSystem, str], model: str | None = None
) -> list[PayloadFile]:
    """The complete payload files of a store, oldest partition first, then by name.

    Args:
        store: A store path or URI, or a ``(filesystem, root)`` pair.
        model: Only this model's payloads (its partition name).

    Returns:
        One `PayloadFile` per file; temporary dot-files are left out.

    Raises:
        StoreNotFound: `store` is a path or URI where no store is, or that cannot be reached.

    Example:
        >>> [p.date for p in list_payloads("capture-store")]  # doctest: +SKIP
        ['2026-11-23']
    """
    from capture.store.files import safe_name
    from capture.store.layout import open_root

    if isinstance(store, tuple):
        fs, root = store
    else:
        # One line for a missing store, a file, an unreachable or refused endpoint (issue 24).
        fs, root = open_root(store, "record into it first or pass --store")
    folder = f"{root}/{PAYLOADS}"
    if model is not None:
        folder += f"/model={safe_name(model)}"
    selector = pafs.FileSelector(folder, recursive=True, allow_not_found=True)
    out = [
        PayloadFile(
            info.path,
            _partition(info.path, "model"),
            _partition(info.path, "date"),
            int(info.size or 0),
        )
        for info in fs.get_file_info(selector)
        if info.type == pafs.FileType.File
        and info.base_name.endswith(SUFFIX)
        and not info.base_name.startswith(".")
    ]
    return sorted(out, key=lambda p: (p.model, p.date, p.path))


def delete_payloads(
    store: str | os.PathLike[str],
    *,
    before: dt.date | None = None,
    model: str | None = None,
    dry_run: bool = False,
) -> list[PayloadFile]:
    """Deletes payload files (every one, or those of days before `before`).

    Args:
        store: A store path or URI.
        before: Only files of ``date=`` partitions strictly before this day (UTC); None: all.
        model: Only this model's files.
        dry_run: Delete nothing; return what would be deleted.

    Returns:
        The files deleted (or that would be).

    Example:
        >>> delete_payloads("capture-store", before=dt.date(2026, 11, 1))  # doctest: +SKIP
        []
    """
    from capture.store.layout import open_root

    fs, root = open_root(store, "nothing to delete")
    chosen = [
        p for p in list_payloads((fs, root), model) if before is None or p.date < before.isoformat()
    ]
    if not dry_run:
        for p in chosen:
            fs.delete_file(p.path)
    return chosen


def _parse_header(raw: bytes, where: str) -> dict[str, Any]:
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise PayloadError(f"{where}: the safetensors header is not JSON ({e})") from e
    if not isinstance(header, dict):
        raise PayloadError(f"{where}: the safetensors header is not a JSON object")
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict) or meta.get("capture.kind") != "payload":
        raise PayloadError(f"{where}: not a capture payload file (no capture.kind=payload)")
    version = str(meta.get("capture.payload_version", ""))
    if not version.isdigit() or int(version) > PAYLOAD_VERSION:
        raise PayloadError(
            f"{where}: payload version {version!r}, this library reads up to "
            f"{PAYLOAD_VERSION}; upgrade capture"
        )
    return header


def read_header(data: bytes, where: str = "payload") -> dict[str, Any]:
    """The JSON header of a safetensors payload file, checked to be one of ours.

    Raises:
        PayloadError: The bytes are not a capture payload file (the message says why).
    """
    if len(data) < 8:
        raise PayloadError(f"{where}: {len(data)} bytes, too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if n > _MAX_HEADER or 8 + n > len(data):
        raise PayloadError(f"{where}: truncated or not safetensors (header of {n} bytes)")
    return _parse_header(data[8 : 8 + n], where)


@dataclass
class Payload:
    """One sampled call: its metadata and tensors (``in/<leaf>`` and ``out/<i>``)."""

    path: str
    metadata: dict[str, str]
    tensors: dict[str, torch.Tensor]

    @property
    def call_id(self) -> int:
        """The call's ``calls.call_id``."""
        return int(self.metadata["call_id"])

    @property
    def in_structure(self) -> str:
        """The call's ``calls.in_structure``."""
        return self.metadata["in_structure"]

    def inputs(self) -> dict[int, torch.Tensor]:
        """Leaf index -> input tensor."""
        return {int(k[3:]): v for k, v in self.tensors.items() if k.startswith("in/")}

    def outputs(self) -> list[torch.Tensor] | None:
        """The output tensors in pytree leaf order (None when they were not kept)."""
        if self.metadata.get("outputs") != "kept":
            return None
        found = {int(k[4:]): v for k, v in self.tensors.items() if k.startswith("out/")}
        return [found[i] for i in sorted(found)]


def read_payload(fs: pafs.FileSystem, path: str) -> Payload:
    """Reads one payload file (no code runs: safetensors parses a JSON header and raw bytes).

    Raises:
        PayloadError: The file is unreadable or not a capture payload file.
        CaptureError: safetensors is not installed.
    """
    require_safetensors()
    from safetensors.torch import load

    try:
        with fs.open_input_file(path) as f:
            data = f.read()
    except OSError as e:
        raise PayloadError(f"{path}: cannot be read ({e})") from e
    header = read_header(data, path)
    try:
        tensors = load(data)
    except Exception as e:  # safetensors raises its own SafetensorError on bad bytes
        raise PayloadError(f"{path}: not a valid safetensors file ({e})") from e
    meta = {str(k): str(v) for k, v in header["__metadata__"].items()}
    for key in ("call_id", "in_structure"):
        if key not in meta:
            raise PayloadError(f"{path}: payload metadata has no {key!r}")
    return Payload(path, meta, tensors)


def iter_payloads(files: Iterable[PayloadFile], fs: pafs.FileSystem) -> Iterable[Payload | str]:
    """Each file read, or the reason it could not be (a string), in order."""
    for p in files:
        try:
            yield read_payload(fs, p.path)
        except PayloadError as e:
            yield str(e)
