"""File digests of an artifact: what the manifest records of every file it describes, and checks.

The manifest records the SHA-256 of every file it describes (a ``.pt2``'s graphs, payload
configs, weight records and AOTInductor builds; an ONNX set's model files and its weights file),
so a file swapped for another (a different model with the same inputs and outputs) is refused.
A manifest of a format written before the digests is refused with the advice to export again
(`older`). What hashing costs per GiB: docs/benchmarks.md.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from typing import Any

from replay.runtime.guards import ArtifactError

__all__ = ["DIGEST", "check_digest", "digest_bytes", "digest_file", "older"]

DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
"""A file's digest as a manifest records it."""

_CHUNK = 16 * 2**20


def digest_bytes(data: bytes | memoryview) -> str:
    """``sha256:<hex>`` of `data`.

    Example:
        >>> digest_bytes(b"")[:16]
        'sha256:e3b0c4429'
    """
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def digest_file(path: str, offset: int = 0, length: int | None = None) -> str:
    """``sha256:<hex>`` of `length` bytes of the file at `path` from `offset` (default: to its
    end), read in chunks into one buffer.

    Raises:
        ArtifactError: The file is shorter than the range.
    """
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        left = os.fstat(f.fileno()).st_size - offset if length is None else length
        while left > 0:
            n = f.readinto(view[: min(left, _CHUNK)])
            if not n:
                raise ArtifactError(f"{path} ends before the bytes its manifest describes")
            digest.update(view[:n])
            left -= n
    return f"sha256:{digest.hexdigest()}"


def check_digest(expected: str | None, found: str, what: str) -> None:
    """Refuses a file whose digest is not the one its manifest records.

    Raises:
        ArtifactError: Names the file (`what`).

    Example:
        >>> check_digest(digest_bytes(b"a"), digest_bytes(b"b"), "m.onnx")
        Traceback (most recent call last):
        ...
        replay.runtime.guards.ArtifactError: m.onnx is not the file its manifest describes \
(its sha256 differs): the artifact was changed after it was written; it is not loaded
    """
    if expected is None:
        raise ArtifactError(f"{what} has no digest in its manifest; it is not loaded")
    if found != expected:
        raise ArtifactError(
            f"{what} is not the file its manifest describes (its sha256 differs): the artifact "
            "was changed after it was written; it is not loaded"
        )


def older(raw: Any, source: str, formats: Iterable[str]) -> Any:
    """`raw`, unless its ``format`` is one of `formats` (written by an older capture, without
    file digests): then one `ArtifactError` saying to export again.

    Example:
        >>> older({"format": "capture-artifact/1"}, "m.json", ["capture-artifact/1"])
        Traceback (most recent call last):
        ...
        replay.runtime.guards.ArtifactError: m.json: manifest format 'capture-artifact/1' was \
written by an older capture, without the file digests this capture verifies; export the model \
again (capture export) to serve it
    """
    found = raw.get("format") if isinstance(raw, dict) else None
    if found in set(formats):
        raise ArtifactError(
            f"{source}: manifest format {found!r} was written by an older capture, without the "
            "file digests this capture verifies; export the model again (capture export) to "
            "serve it"
        )
    return raw
