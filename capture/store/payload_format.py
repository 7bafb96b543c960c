"""The payload file format, read as data: a safetensors file checked against what capture writes.

A payload file (`capture.store.payload_files`) is safetensors: an 8-byte little-endian header
length, a JSON header (per tensor: dtype, shape and the ``[begin, end)`` byte range of its data;
plus a flat string->string ``__metadata__``), then the raw bytes. `read_checked` reads the header
first and checks it against what `capture.record.payload_keeper` writes, with caps:

- names are ``in/<leaf>`` or ``out/<i>`` (decimal, no other form), dtypes are safetensors'
  names of the dtypes in `DTYPES`, shapes are at most `MAX_RANK` sizes, each tensor's byte
  range is exactly its shape's bytes, and the ranges tile the data exactly, to the file's end;
- the data is at most `max_bytes` (the recorder's ``max_call_bytes``), the header at most
  `MAX_HEADER_BYTES`, and the file no bigger than both: a bigger one is refused from its size
  alone, before a byte is read;
- ``__metadata__`` has the keys capture writes, as strings of bounded size, ``call_id`` a
  decimal 64-bit integer.

Only then is the data read, and the whole file decoded by the safetensors package: nothing is
evaluated, and memory stays within the cap: a huge sparse file is refused from its size before
it is read, a tensor named ``in/../x`` or a non-numeric ``call_id`` from its header. Every
problem is one `PayloadError` naming the file and what is wrong. Imports torch and safetensors
only inside `read_checked`.

The recorder writes the format itself (`capture.record.payload_keeper`): it streams the header
and the tensors' bytes through the store's pyarrow filesystem (local or remote) without holding
the GIL, where ``safetensors.torch.save`` would build the whole file as one bytes object while
the serving threads wait, and ``save_file`` writes local paths only. The tests read what it
writes with the safetensors package.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from capture import untrusted
from capture.errors import CaptureError

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_MAX_CALL_BYTES",
    "DTYPES",
    "MAX_HEADER_BYTES",
    "MAX_RANK",
    "PAYLOAD_VERSION",
    "PayloadError",
    "TensorEntry",
    "read_checked",
]

PAYLOAD_VERSION = 1
"""Version of the payload file layout (``capture.payload_version`` in ``__metadata__``)."""

DEFAULT_MAX_CALL_BYTES = 16 * 2**20
"""The recorder's default ``Payloads.max_call_bytes``, and what a reader accepts by default."""

MAX_HEADER_BYTES = 8 * 2**20
"""Largest JSON header read (a call of thousands of tensors writes about 150 bytes each)."""

MAX_RANK = 64
_MAX_METADATA_KEYS = 64
_MAX_METADATA_VALUE = 64 * 1024
_INT64 = 2**63

DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "U16": ("uint16", 2),
    "U32": ("uint32", 4),
    "U64": ("uint64", 8),
}
"""safetensors dtype name -> (torch dtype attribute, bytes per item): what payloads hold."""

_REQUIRED = ("capture.kind", "capture.payload_version", "call_id", "in_structure")


class PayloadError(CaptureError):
    """A payload file that cannot be read (truncated, not safetensors, not ours, over a cap)."""


class Readable(Protocol):
    """A binary file: Python's or pyarrow's."""

    def read(self, n: int = ..., /) -> bytes: ...  # noqa: D102

    def readinto(self, buffer: Any, /) -> int | None: ...  # noqa: D102


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a payload's header, checked."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_checked(
    f: Readable, size: int, where: str, max_bytes: int = DEFAULT_MAX_CALL_BYTES
) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """The metadata and tensors of a payload file, every part checked before it is read.

    Args:
        f: The file, at its start.
        size: Its size in bytes.
        where: Its path, for messages.
        max_bytes: Most bytes of tensor data accepted.

    Returns:
        ``(metadata, tensors)``: the ``__metadata__`` strings and the tensors by name.

    Raises:
        PayloadError: The file is not a payload capture wrote, or exceeds a cap.

    Example:
        >>> with open(path, "rb") as f:  # doctest: +SKIP
        ...     metadata, tensors = read_checked(f, os.path.getsize(path), path)
    """
    if size > 8 + MAX_HEADER_BYTES + max_bytes:
        raise PayloadError(
            f"{where}: {size:,} bytes, more than a payload of at most {max_bytes:,} bytes of "
            "tensors holds; pass a larger max_payload_bytes if it was recorded with a larger "
            "max_call_bytes"
        )
    if size < 8:
        raise PayloadError(f"{where}: {size} bytes, too short for a safetensors file")
    prefix = _read_exactly(f, 8, where)
    (n,) = struct.unpack("<Q", prefix)
    if n > MAX_HEADER_BYTES or 8 + n > size:
        raise PayloadError(f"{where}: truncated or not safetensors (header of {n:,} bytes)")
    header = _read_exactly(f, n, where)
    metadata, entries = _parse_header(header, where, size - 8 - n, max_bytes)
    return metadata, _tensors(entries, prefix + header + _read_into(f, size - 8 - n, where), where)


def _read_exactly(f: Readable, n: int, where: str) -> bytes:
    try:
        data = f.read(n)
    except OSError as e:
        raise PayloadError(f"{where}: cannot be read ({type(e).__name__}: {e})") from e
    if len(data) != n:
        raise PayloadError(f"{where}: truncated ({len(data):,} of {n:,} bytes)")
    return bytes(data)


def _read_into(f: Readable, n: int, where: str) -> bytearray:
    """`n` bytes read straight into one buffer (the tensors are views of it: one copy)."""
    data = bytearray(n)
    view, done = memoryview(data), 0
    try:
        while done < n:
            got = f.readinto(view[done:])
            if not got:
                raise PayloadError(f"{where}: truncated ({done:,} of {n:,} bytes of tensors)")
            done += got
    except OSError as e:
        raise PayloadError(f"{where}: cannot be read ({type(e).__name__}: {e})") from e
    return data


def _parse_header(
    raw: bytes, where: str, data_size: int, max_bytes: int
) -> tuple[dict[str, str], list[TensorEntry]]:
    try:
        header = untrusted.loads(raw)
    except (ValueError, RecursionError) as e:
        raise PayloadError(f"{where}: the safetensors header is not JSON ({e})") from e
    if not isinstance(header, dict):
        raise PayloadError(f"{where}: the safetensors header is not a JSON object")
    metadata = _metadata(header.pop("__metadata__", None), where)
    entries = [_entry(name, spec, where) for name, spec in header.items()]
    entries.sort(key=lambda e: (e.begin, e.end))
    offset = 0
    for entry in entries:
        if entry.begin != offset:
            raise PayloadError(
                f"{where}: tensor {entry.name} starts at byte {entry.begin:,}, "
                f"not where the one before ends ({offset:,})"
            )
        offset = entry.end
    if offset != data_size:
        raise PayloadError(
            f"{where}: its tensors hold {offset:,} bytes, the file {data_size:,} after its header"
        )
    if data_size > max_bytes:
        raise PayloadError(
            f"{where}: {data_size:,} bytes of tensors, more than max_payload_bytes={max_bytes:,}; "
            "pass a larger one if it was recorded with a larger max_call_bytes"
        )
    return metadata, entries


def _metadata(meta: Any, where: str) -> dict[str, str]:
    if not isinstance(meta, dict) or meta.get("capture.kind") != "payload":
        raise PayloadError(f"{where}: not a capture payload file (no capture.kind=payload)")
    version = meta.get("capture.payload_version")
    if not isinstance(version, str) or not version.isdecimal() or int(version) > PAYLOAD_VERSION:
        raise PayloadError(
            f"{where}: payload version {str(version)[:20]!r}, this library reads up to "
            f"{PAYLOAD_VERSION}; upgrade capture"
        )
    if len(meta) > _MAX_METADATA_KEYS:
        raise PayloadError(f"{where}: {len(meta)} metadata keys, at most {_MAX_METADATA_KEYS}")
    for key, value in meta.items():
        if not isinstance(value, str) or len(value) > _MAX_METADATA_VALUE:
            raise PayloadError(f"{where}: metadata {key[:40]!r} is not a string of bounded size")
    for key in _REQUIRED:
        if key not in meta:
            raise PayloadError(f"{where}: payload metadata has no {key!r}")
    call_id = meta["call_id"]
    digits = call_id[1:] if call_id.startswith("-") else call_id
    if not (digits.isascii() and digits.isdecimal()) or not -_INT64 <= int(call_id) < _INT64:
        raise PayloadError(f"{where}: call_id {call_id[:30]!r} is not a 64-bit decimal integer")
    structure = meta["in_structure"]
    if not structure or len(structure) > 128 or not structure.isprintable():
        raise PayloadError(f"{where}: in_structure {structure[:30]!r} is not a structure id")
    return dict(meta)


def _index(name: str) -> bool:
    """Whether `name` is ``in/<leaf>`` or ``out/<i>``, the index decimal as Python writes it."""
    side, _, index = name.partition("/")
    return (
        side in ("in", "out")
        and index.isascii()
        and index.isdecimal()
        and len(index) <= 9
        and str(int(index)) == index
    )


def _entry(name: str, spec: Any, where: str) -> TensorEntry:
    if not _index(name):
        raise PayloadError(f"{where}: tensor name {name[:40]!r} is not in/<leaf> or out/<i>")
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
        raise PayloadError(f"{where}: tensor {name} has no dtype, shape and data_offsets")
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if dtype not in DTYPES:
        raise PayloadError(f"{where}: tensor {name} has dtype {str(dtype)[:20]!r}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(type(s) is int and s >= 0 for s in shape)
    ):
        raise PayloadError(f"{where}: tensor {name} has shape {str(shape)[:40]}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise PayloadError(f"{where}: tensor {name} has data_offsets {str(offsets)[:40]}")
    nbytes = math.prod(shape) * DTYPES[dtype][1]
    if nbytes != offsets[1] - offsets[0]:
        raise PayloadError(
            f"{where}: tensor {name} of shape {shape} takes {nbytes:,} bytes, its range "
            f"{offsets[1] - offsets[0]:,}"
        )
    return TensorEntry(name, dtype, tuple(shape), offsets[0], offsets[1])


def _tensors(entries: list[TensorEntry], data: bytes, where: str) -> dict[str, torch.Tensor]:
    """The tensors of a whole payload file whose header `_parse_header` accepted, decoded by the
    safetensors package (capture checks the header and the caps; the format's owner decodes)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        tensors = load(data)
    except SafetensorError as e:
        raise PayloadError(f"{where}: not a readable safetensors file ({e})") from e
    if sorted(tensors) != sorted(e.name for e in entries):
        raise PayloadError(f"{where}: its tensors differ from its checked header")
    return tensors
