"""Each weight once, the PT2 side: one record per storage on disk, one tensor per record.

Writing (`WeightTable`): every parameter, buffer and constant of every program (and of every
sub-module's programs: a T5 encoder shares its embedding with the decoder) is matched to a
record by its storage's identity, then by content (torch.export copies some constants; equal
bytes of the same dtype and size are one record). A buffer a program mutates is never merged
by content with another tensor: sharing it would let one write change the other. The record
holds the whole storage; each program's payload config (`replay.runtime.pt2.records`) places its
tensors in it (dtype, sizes, strides, offset), so views and tied weights stay views.

Reading (`load_tensors`): the archive is memory-mapped once (copy-on-write: the file is never
written, pages are read from disk when first touched and shared with the page cache), each
record becomes one tensor over the mapped bytes (or one copy on the target device), and every
program's parameters and constants are views of it. A 16 GB artifact loads without a second
16 GB copy on the host.
"""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from replay.runtime.guards import ArtifactError
from replay.runtime.pt2.archive import (
    CONSTANT_PREFIX,
    CONSTANTS_DIR,
    WEIGHT_PREFIX,
    WEIGHTS_DIR,
    Archive,
)
from replay.runtime.pt2.records import DTYPES, TensorSlot, check_extent

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

__all__ = ["WeightTable", "ProgramSlots", "load_tensors", "storage_bytes"]

_SAMPLE = 4096


@dataclass
class ProgramSlots:
    """Where one program's tensors are: ``weights`` (state dict) and ``constants``."""

    weights: dict[str, TensorSlot] = field(default_factory=dict)
    constants: dict[str, TensorSlot] = field(default_factory=dict)


@dataclass
class _Record:
    name: str  # inner archive name: data/weights/weight_0
    storage: Any  # the CPU untyped storage whose bytes are written
    shareable: bool  # may another tensor with equal bytes use it


class WeightTable:
    """The records of an artifact being written, each storage once (see the module doc).

    Attributes:
        programs: Program name -> its `ProgramSlots`.
        records: The records to write, in order.

    Example:
        >>> table = WeightTable()  # doctest: +SKIP
        >>> table.add("decode", decode_program)  # doctest: +SKIP
        >>> table.add("prefill", prefill_program)  # doctest: +SKIP
        >>> len(table.records)  # one per distinct storage  # doctest: +SKIP
    """

    def __init__(self) -> None:
        self.programs: dict[str, ProgramSlots] = {}
        self.records: list[_Record] = []
        self._by_identity: dict[tuple[Any, ...], _Record] = {}
        self._by_content: dict[tuple[Any, ...], list[_Record]] = {}
        self._codes: dict[Any, int] | None = None
        self._counts: dict[str, int] = {}

    @property
    def nbytes(self) -> int:
        """Bytes of every record."""
        return sum(int(r.storage.nbytes()) for r in self.records)

    def add(self, program: str, ep: ExportedProgram) -> None:
        """Places every tensor of `ep` in a record (an existing one when its storage or its
        bytes are already there).

        Raises:
            ArtifactError: A constant is not a tensor (a script or opaque object: an artifact
                holds tensors only), or a tensor is a subclass or not strided.
        """
        mutated = set(ep.graph_signature.buffers_to_mutate.values())
        slots = ProgramSlots()
        for name, tensor in ep.state_dict.items():
            slots.weights[name] = self._slot(program, name, tensor, WEIGHTS_DIR, name in mutated)
        for name, value in ep.constants.items():
            slots.constants[name] = self._slot(program, name, value, CONSTANTS_DIR, False)
        self.programs[program] = slots

    def _slot(self, program: str, name: str, tensor: Any, folder: str, mutated: bool) -> TensorSlot:
        import torch

        if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.layout != torch.strided:
            raise ArtifactError(
                f"program {program}: {name} is a {type(tensor).__name__}, not a plain strided "
                "tensor; an artifact holds raw tensor bytes only (no pickled object)"
            )
        record = self._record(tensor, folder, shareable=not mutated)
        return TensorSlot(
            record=record.name.rpartition("/")[2],
            is_param=isinstance(tensor, torch.nn.Parameter),
            dtype=self._code(tensor.dtype, program, name),
            sizes=tuple(int(s) for s in tensor.shape),
            strides=tuple(int(s) for s in tensor.stride()),
            offset=int(tensor.storage_offset()),
            requires_grad=bool(tensor.requires_grad),
            device=str(tensor.device),
        )

    def _code(self, dtype: Any, program: str, name: str) -> int:
        import torch

        if self._codes is None:
            self._codes = {getattr(torch, n): code for code, (n, _) in DTYPES.items()}
        code = self._codes.get(dtype)
        if code is None:
            raise ArtifactError(
                f"program {program}: {name} has dtype {dtype}, not one capture writes"
            )
        return code

    def _record(self, tensor: Any, folder: str, shareable: bool) -> _Record:
        storage = tensor.untyped_storage()
        nbytes = int(storage.nbytes())
        identity: tuple[Any, ...] = (folder, tensor.dtype, str(tensor.device), storage.data_ptr())
        if nbytes == 0:
            identity = (folder, tensor.dtype, "empty")
        else:
            identity += (nbytes,)
        found = self._by_identity.get(identity)
        if found is not None:
            return found
        cpu = storage if tensor.device.type == "cpu" else storage.cpu()
        content = (folder, tensor.dtype, nbytes, _fingerprint(cpu))
        if shareable:
            for candidate in self._by_content.get(content, ()):
                if _same_bytes(candidate.storage, cpu):
                    self._by_identity[identity] = candidate
                    return candidate
        prefix = WEIGHT_PREFIX if folder == WEIGHTS_DIR else CONSTANT_PREFIX
        count = self._counts.get(folder, 0)
        self._counts[folder] = count + 1
        record = _Record(f"{folder}{prefix}{count}", cpu, shareable)
        self.records.append(record)
        self._by_identity[identity] = record
        if shareable:
            self._by_content.setdefault(content, []).append(record)
        return record


def _bytes_of(storage: Any) -> torch.Tensor:
    import torch

    return torch.empty(0, dtype=torch.uint8).set_(storage)


def storage_bytes(storage: Any) -> memoryview:
    """A CPU storage's bytes, without a copy (what `save` writes as its record)."""
    if int(storage.nbytes()) == 0:
        return memoryview(b"")
    return memoryview(_bytes_of(storage).numpy())  # type: ignore[arg-type]


def _fingerprint(storage: Any) -> bytes:
    """A digest of a storage's first, middle and last 4 KiB: equal bytes, equal fingerprint."""
    data = _bytes_of(storage)
    n = data.numel()
    digest = hashlib.blake2b(digest_size=16)
    for start in sorted({0, max(0, n // 2 - _SAMPLE // 2), max(0, n - _SAMPLE)}):
        digest.update(data[start : start + _SAMPLE].numpy().tobytes())
    return digest.digest()


def _same_bytes(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.equal(_bytes_of(a), _bytes_of(b)))


def load_tensors(
    archive: Archive, programs: Mapping[str, ProgramSlots], device: str = "cpu"
) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Every program's state dict and constants, each record materialised once.

    Args:
        archive: The checked archive.
        programs: Program name -> where its tensors are (from its payload configs).
        device: Where the tensors go (``cpu``: views of the memory-mapped file).

    Returns:
        Program name -> ``(state_dict, constants)``; tensors placed in one record by several
        programs are views of one storage (one object when their views are the same).

    Raises:
        ArtifactError: A record is misaligned for its dtype, a view lies outside it, or torch
            refuses the tensor's description (one line naming it).
    """
    import torch

    mapped: mmap.mmap | None = None
    bases: dict[tuple[str, int], torch.Tensor] = {}
    views: dict[tuple[str, TensorSlot], Any] = {}
    out: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for program, slots in programs.items():
        tables: list[dict[str, Any]] = [{}, {}]
        for table, folder, named in (
            (tables[0], WEIGHTS_DIR, slots.weights),
            (tables[1], CONSTANTS_DIR, slots.constants),
        ):
            for name, slot in named.items():
                inner = f"{folder}{slot.record}"
                key = (inner, slot)
                if key not in views:
                    entry = archive.entries[inner]
                    where = f"{archive.name(inner)} ({name} of {program})"
                    numel = check_extent(slot, entry.size, where)
                    base = bases.get((inner, slot.dtype))
                    if base is None:
                        if entry.size and mapped is None:
                            mapped = _map(archive.path)
                        base = _base(mapped, entry.offset, numel, slot, where)
                        base = base.to(device)
                        bases[(inner, slot.dtype)] = base
                    try:
                        view = base.as_strided(slot.sizes, slot.strides, slot.offset)
                        if slot.is_param:
                            view = torch.nn.Parameter(view, requires_grad=slot.requires_grad)
                    except (RuntimeError, ValueError, TypeError) as e:  # flags torch refuses
                        text = str(e).strip().splitlines()
                        raise ArtifactError(
                            f"{where}: torch cannot place it: {text[0][:200] if text else e}"
                        ) from None
                    views[key] = view
                table[name] = views[key]
        out[program] = (tables[0], tables[1])
    return out


def _map(path: str) -> mmap.mmap:
    with open(path, "rb") as f:
        # copy-on-write: writable for torch (no warning), never written back to the file
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)


def _base(mapped: mmap.mmap | None, offset: int, numel: int, slot: TensorSlot, where: str) -> Any:
    import torch

    dtype = getattr(torch, slot.dtype_name)
    if numel == 0 or mapped is None:
        return torch.empty(0, dtype=dtype)
    if offset % slot.itemsize:
        raise ArtifactError(f"{where}: its record is not aligned for {slot.dtype_name}")
    return torch.frombuffer(mapped, dtype=dtype, count=numel, offset=offset)
