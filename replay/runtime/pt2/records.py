"""Which raw record each program's tensors come from: the payload configs, typed and checked.

Each program of an artifact has two payload configs (torch's ``PayloadConfig`` JSON): its
weights (parameters and persistent buffers) and its constants (lifted tensors, non-persistent
buffers). Each names, per tensor, the record holding its storage's bytes and how the tensor
sits in it (dtype, sizes, strides, storage offset). `save` points every program that uses one
storage at the same record; `replay.load` maps each record once.

`parse_config` reads a config into `TensorSlot` rows and refuses what capture never writes,
with one `ArtifactError` naming the entry and the tensor: ``use_pickle`` (torch would run
``torch.load(weights_only=False)`` on the record), a record that is not a raw tensor
(``opaque_obj_*`` / ``custom_obj_*``: pickled objects), an unknown dtype or layout, a view that
reaches past the end of its record. Needs no torch; `DTYPES` is torch's serialized
``ScalarType`` table (tests/test_compat.py checks it against torch's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from replay.runtime.checked_json import DOTTED, Fields, as_int, load
from replay.runtime.guards import ArtifactError

__all__ = ["DTYPES", "STRIDED", "TensorSlot", "parse_config", "config_json", "check_extent"]

DTYPES: dict[int, tuple[str, int]] = {
    1: ("uint8", 1),
    2: ("int8", 1),
    3: ("int16", 2),
    4: ("int32", 4),
    5: ("int64", 8),
    6: ("float16", 2),
    7: ("float32", 4),
    8: ("float64", 8),
    9: ("complex32", 4),
    10: ("complex64", 8),
    11: ("complex128", 16),
    12: ("bool", 1),
    13: ("bfloat16", 2),
    28: ("uint16", 2),
    29: ("float8_e4m3fn", 1),
    30: ("float8_e5m2", 1),
    31: ("float8_e4m3fnuz", 1),
    32: ("float8_e5m2fnuz", 1),
    33: ("float8_e8m0fnu", 1),
    34: ("uint32", 4),
    35: ("uint64", 8),
}
"""torch's serialized ``ScalarType`` value -> (torch dtype name, bytes per element)."""

STRIDED = 7
"""torch's serialized ``Layout.Strided``: the only layout an artifact's tensors have."""

_MAX_RANK = 64
_GRAD_DTYPES = frozenset(
    {"float16", "float32", "float64", "bfloat16", "complex32", "complex64", "complex128"}
)


@dataclass(frozen=True)
class TensorSlot:
    """One tensor of a program, as its payload config places it in a record.

    Attributes:
        record: The record's file name (``weight_3``, ``tensor_0``).
        is_param: A parameter (else a buffer or constant).
        dtype: torch's serialized ``ScalarType`` value (a key of `DTYPES`).
        sizes: The tensor's sizes.
        strides: Its strides, in elements.
        offset: Its storage offset, in elements.
        requires_grad: As exported.
        device: The device it was saved from (``cpu``, ``cuda:0``).
    """

    record: str
    is_param: bool
    dtype: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    requires_grad: bool
    device: str

    @property
    def dtype_name(self) -> str:
        """``float32``: the torch dtype's name."""
        return DTYPES[self.dtype][0]

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return DTYPES[self.dtype][1]

    def as_json(self) -> dict[str, Any]:
        """The slot as torch's ``PayloadMeta`` JSON."""
        kind, _, index = self.device.partition(":")
        return {
            "path_name": self.record,
            "is_param": self.is_param,
            "use_pickle": False,
            "tensor_meta": {
                "dtype": self.dtype,
                "sizes": [{"as_int": s} for s in self.sizes],
                "requires_grad": self.requires_grad,
                "device": {"type": kind, "index": int(index) if index else None},
                "strides": [{"as_int": s} for s in self.strides],
                "storage_offset": {"as_int": self.offset},
                "layout": STRIDED,
            },
        }


def config_json(slots: Mapping[str, TensorSlot]) -> str:
    """A payload config's text (tensor name -> slot), as torch's ``PayloadConfig`` JSON."""
    return json.dumps({"config": {name: slot.as_json() for name, slot in slots.items()}})


def parse_config(data: bytes, source: str, prefix: str) -> dict[str, TensorSlot]:
    """Reads one payload config.

    Args:
        data: The config's bytes (bounded by the caller).
        source: The entry's name, for errors.
        prefix: The record prefix of its folder (``weight_`` or ``tensor_``).

    Returns:
        Tensor name -> its slot.

    Raises:
        ArtifactError: Not a config capture writes: ``use_pickle``, a pickled object record,
            a malformed tensor description (each named with the tensor).

    Example:
        >>> parse_config(b'{"config": {}}', "x_weights_config.json", "weight_")
        {}
    """
    top = Fields(load(data, source), source)
    config = top.child("config")
    out: dict[str, TensorSlot] = {}
    for name in config.raw:
        where = f"{source}: tensor {str(name)[:200]}"
        item = Fields(config.raw[name], where)
        if not DOTTED.match(str(name)):
            item.fail(where, "has a name capture does not write")
        if item.raw.get("use_pickle") is not False:
            raise ArtifactError(
                f"{where} is stored with use_pickle={item.raw.get('use_pickle')!r}; an artifact "
                "holds raw tensor bytes only, never a pickle, so it is not loaded"
            )
        record = item.text("path_name", max_len=64)
        if not (record.startswith(prefix) and record[len(prefix) :].isdigit()):
            raise ArtifactError(
                f"{where} is stored in {record[:60]!r}, not a raw tensor record ({prefix}N); "
                "pickled objects (opaque_obj_*, custom_obj_*) are never loaded"
            )
        out[str(name)] = _slot(item, record)
    return out


def _slot(item: Fields, record: str) -> TensorSlot:
    meta = item.child("tensor_meta")
    dtype = meta.integer("dtype", low=0, high=255)
    if dtype not in DTYPES:
        meta.fail(f"{meta.where}.dtype", f"= {dtype} is not a dtype capture writes")
    if meta.integer("layout", low=0, high=255) != STRIDED:
        meta.fail(f"{meta.where}.layout", "is not strided")
    sizes = tuple(
        _sym_int(v, f"{meta.where}.sizes") for v in meta.items("sizes", max_items=_MAX_RANK)
    )
    strides = tuple(
        _sym_int(v, f"{meta.where}.strides") for v in meta.items("strides", max_items=_MAX_RANK)
    )
    if len(sizes) != len(strides):
        meta.fail(meta.where, f"has {len(sizes)} sizes and {len(strides)} strides")
    device = meta.child("device")
    kind = device.text("type", max_len=32)
    if not kind.isidentifier():
        device.fail(f"{device.where}.type", f"is {kind[:40]!r}, not a device")
    index = device.integer("index", low=0, high=1024, optional=True)
    requires_grad = meta.flag("requires_grad")
    if requires_grad and DTYPES[dtype][0] not in _GRAD_DTYPES:
        meta.fail(
            f"{meta.where}.requires_grad",
            f"is true for a {DTYPES[dtype][0]} tensor; only floating and complex tensors have "
            "gradients",
        )
    return TensorSlot(
        record=record,
        is_param=item.flag("is_param"),
        dtype=dtype,
        sizes=sizes,
        strides=strides,
        offset=_sym_int(meta.raw.get("storage_offset"), f"{meta.where}.storage_offset"),
        requires_grad=requires_grad,
        device=kind if index is None else f"{kind}:{index}",
    )


def _sym_int(value: Any, where: str) -> int:
    """torch's ``{"as_int": n}`` (symbolic sizes never appear in saved weights)."""
    if not isinstance(value, dict) or set(value) != {"as_int"}:
        Fields.fail(where, "must be {'as_int': n}")
    return as_int(value["as_int"], where, 0, 2**62)


def check_extent(slot: TensorSlot, record_bytes: int, where: str) -> int:
    """Checks that a tensor lies within its record; returns the record's element count.

    Raises:
        ArtifactError: The record's size is not a whole number of elements, or the tensor's
            view reaches past its end (a loader would read other memory).

    Example:
        >>> slot = TensorSlot("weight_0", True, 7, (2, 3), (3, 1), 0, False, "cpu")
        >>> check_extent(slot, 24, "w")
        6
    """
    if record_bytes % slot.itemsize:
        raise ArtifactError(
            f"{where}: its record holds {record_bytes} bytes, not a whole number of "
            f"{slot.dtype_name} elements"
        )
    numel = record_bytes // slot.itemsize
    if 0 in slot.sizes:
        return numel
    last = slot.offset + sum((s - 1) * st for s, st in zip(slot.sizes, slot.strides, strict=True))
    if last >= numel:
        raise ArtifactError(
            f"{where}: its view (sizes {list(slot.sizes)}, strides {list(slot.strides)}, offset "
            f"{slot.offset}) reaches element {last} of a record of {numel}"
        )
    return numel
