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
  ``(args, kwargs)`` around them (`replay.check.payload_rows`).
- ``out/<i>``: the i-th leaf of torch's pytree flattening of what the model returned.

``__metadata__`` keys are in `METADATA_KEYS`. Files are written as ``.<name>.tmp`` in their final
folder and renamed, like the Parquet files: a reader never sees a partial file.

Reading one runs no code and is checked against what capture writes, with caps
(`capture.store.payload_format`); listing, reading and deleting never follow a symbolic link
(`capture.store.nofollow`). This module imports neither torch nor safetensors (the CLI
lists and deletes payloads without them); `read_payload` imports torch when it runs.
"""

from __future__ import annotations

import datetime as dt
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from capture.errors import CaptureError
from capture.store import nofollow
from capture.store.payload_format import (
    DEFAULT_MAX_CALL_BYTES,
    PAYLOAD_VERSION,
    PayloadError,
    read_checked,
)
from capture.untrusted import printable

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
    "DEFAULT_MAX_CALL_BYTES",
    "require_safetensors",
    "payload_folder",
    "list_payloads",
    "delete_payloads",
    "read_payload",
    "iter_payloads",
]

PAYLOADS = "payloads"
"""The store folder that holds payload files (next to structures/, calls/, stats/)."""

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


def payload_folder(root: str, model_name: str, day: str) -> str:
    """``<root>/payloads/model=<model_name>/date=<day>`` (`model_name` already made safe)."""
    return f"{root}/{PAYLOADS}/model={model_name}/date={day}"


@dataclass(frozen=True)
class PayloadFile:
    """One payload file of a store.

    Attributes:
        path: Its path in the store's filesystem.
        model_name: Its model's partition name (the store's model name, made safe for a path).
        date: Its day partition (``YYYY-MM-DD``).
        size: Its size in bytes.
    """

    path: str
    model_name: str
    date: str
    size: int


def _partition(path: str, key: str) -> str:
    for part in path.split("/"):
        if part.startswith(key + "="):
            return part[len(key) + 1 :]
    return ""


def _is_payload(name: str) -> bool:
    return name.endswith(SUFFIX) and not name.startswith(".")


def list_payloads(
    store: str | os.PathLike[str] | tuple[pafs.FileSystem, str], model_name: str | None = None
) -> list[PayloadFile]:
    """The complete payload files of a store, oldest partition first, then by name.

    Args:
        store: A store path or URI, or a ``(filesystem, root)`` pair.
        model_name: Only this model's payloads (its partition name).

    Returns:
        One `PayloadFile` per file; temporary dot-files are left out, and so are symbolic
        links (never followed, one `RuntimeWarning` each).

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
        # One line for a missing store, a file, an unreachable or refused endpoint.
        fs, root = open_root(store, "record into it first or pass --store")
    folder = f"{root}/{PAYLOADS}"
    if model_name is not None:
        folder += f"/model={safe_name(model_name)}"
    if isinstance(fs, pafs.LocalFileSystem):
        found = nofollow.walk(folder, _is_payload)
        for path in found.links:
            warnings.warn(
                printable(f"capture: skipping {path} under {PAYLOADS}/ ({nofollow.LINK_REASON})"),
                RuntimeWarning,
                stacklevel=2,
            )
        sized = [(path, int(st.st_size)) for path, st in found.files]
    else:  # object stores have no links
        selector = pafs.FileSelector(folder, recursive=True, allow_not_found=True)
        sized = [
            (info.path, int(info.size or 0))
            for info in fs.get_file_info(selector)
            if info.type == pafs.FileType.File and _is_payload(info.base_name)
        ]
    out = [
        PayloadFile(path, _partition(path, "model"), _partition(path, "date"), size)
        for path, size in sized
    ]
    return sorted(out, key=lambda p: (p.model_name, p.date, p.path))


def delete_payloads(
    store: str | os.PathLike[str],
    *,
    before: dt.date | None = None,
    model_name: str | None = None,
    dry_run: bool = False,
) -> list[PayloadFile]:
    """Deletes payload files (every one, or those of days before `before`).

    Args:
        store: A store path or URI.
        before: Only files of ``date=`` partitions strictly before this day (UTC); None: all.
        model_name: Only this model's files.
        dry_run: Delete nothing; return what would be deleted.

    Returns:
        The files deleted (or that would be): listed ones only, so never a file outside the
        store reached through a link.

    Raises:
        PayloadError: A file could not be deleted (it became a link, or permissions); the
            files before it are deleted; one line.

    Example:
        >>> delete_payloads("capture-store", before=dt.date(2026, 11, 1))  # doctest: +SKIP
        []
    """
    from capture.store.layout import open_root

    fs, root = open_root(store, "nothing to delete")
    chosen = [
        p
        for p in list_payloads((fs, root), model_name)
        if before is None or p.date < before.isoformat()
    ]
    if not dry_run:
        for done, p in enumerate(chosen):
            try:
                if isinstance(fs, pafs.LocalFileSystem):
                    # through no link: one swapped in after the listing fails
                    nofollow.unlink_under(root, p.path)
                else:
                    fs.delete_file(p.path)
            except OSError as e:
                raise PayloadError(
                    f"cannot delete {p.path} ({type(e).__name__}: {e}); {done} payload "
                    "file(s) before it were deleted, nothing outside the store was touched; "
                    "check the folder (a symbolic link?) and run the delete again"
                ) from e
    return chosen


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

    @property
    def state(self) -> str:
        """The call's state key (``calls.state``; ``""``: the default state, and files written
        before states were recorded)."""
        return self.metadata.get("state", "")

    def inputs(self) -> dict[int, torch.Tensor]:
        """Leaf index -> input tensor."""
        return {int(k[3:]): v for k, v in self.tensors.items() if k.startswith("in/")}

    def outputs(self) -> list[torch.Tensor] | None:
        """The output tensors in pytree leaf order (None when they were not kept)."""
        if self.metadata.get("outputs") != "kept":
            return None
        found = {int(k[4:]): v for k, v in self.tensors.items() if k.startswith("out/")}
        return [found[i] for i in sorted(found)]


def read_payload(
    fs: pafs.FileSystem, path: str, max_bytes: int = DEFAULT_MAX_CALL_BYTES
) -> Payload:
    """Reads one payload file, checked as data (`capture.store.payload_format`).

    The header is read and checked first (names, dtypes, shapes, byte ranges, metadata, the
    sizes against the file's and `max_bytes`), then the tensors' bytes. On a local disk the
    file is opened through no symbolic link below the store (`capture.store.nofollow`).

    Args:
        fs: The store's filesystem.
        path: The payload file.
        max_bytes: Most bytes of tensors accepted (the recorder's ``max_call_bytes``).

    Returns:
        The call's `Payload`.

    Raises:
        PayloadError: The file cannot be read, is not a capture payload file, or exceeds a
            cap; one line naming the file.

    Example:
        >>> read_payload(pafs.LocalFileSystem(), path).call_id  # doctest: +SKIP
        42
    """
    try:
        if isinstance(fs, pafs.LocalFileSystem):
            marker = f"/{PAYLOADS}/"
            root = path.rsplit(marker, 1)[0] if marker in path else os.path.dirname(path)
            with nofollow.open_under(root, path) as f:
                meta, tensors = read_checked(f, os.fstat(f.fileno()).st_size, path, max_bytes)
        else:
            with fs.open_input_file(path) as f:
                meta, tensors = read_checked(f, int(f.size()), path, max_bytes)
    except OSError as e:
        raise PayloadError(f"{path}: cannot be read ({type(e).__name__}: {e})") from e
    return Payload(path, meta, tensors)


def iter_payloads(
    files: Iterable[PayloadFile], fs: pafs.FileSystem, max_bytes: int = DEFAULT_MAX_CALL_BYTES
) -> Iterable[Payload | str]:
    """Each file read (`read_payload`), or the reason it could not be (a string), in order.

    Args:
        files: Listed payload files (`list_payloads`).
        fs: The store's filesystem.
        max_bytes: Most bytes of tensors accepted per file.

    Returns:
        An iterator of `Payload` or one-line reasons.

    Example:
        >>> [type(p).__name__ for p in iter_payloads(list_payloads(root), fs)]  # doctest: +SKIP
        ['Payload']
    """
    for p in files:
        try:
            yield read_payload(fs, p.path, max_bytes)
        except PayloadError as e:
            yield str(e)
