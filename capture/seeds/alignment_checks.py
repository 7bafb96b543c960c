"""The checks that let observed calls share one program, with errors naming the key path.

Every argument keeps its pytree structure across the calls that pass it (a leaf may be ``None``
in one call and a tensor in another: an uninitialised cache layer), each tensor its rank and
dtype, each scalar its value, since torch.export bakes scalars in as constants. Anything else
raises `ObservationMismatch`. Used by `capture.seeds.alignment.Aligner.align`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from capture.errors import ObservationMismatch
from capture.schema import KIND_NONE, KIND_OPAQUE, KIND_TENSOR

if TYPE_CHECKING:
    from capture.seeds.aligned import LeafAgg, Slot, View
    from capture.seeds.call_layout import LeafInfo

__all__ = ["check_structure", "merge_leaf"]


def check_structure(ref: Slot, best: View, slot: Slot, view: View) -> None:
    """The argument has the reference call's pytree structure, or a clear error.

    Args:
        ref: The argument in the reference call.
        best: The reference call.
        slot: The same argument in another call.
        view: That other call.

    Raises:
        ObservationMismatch: The structures differ; the message names the first differing path.
    """
    if slot.arg.spec == ref.arg.spec:
        return
    mine, theirs = set(slot.arg.paths), set(ref.arg.paths)
    extra = next((p for p in slot.arg.paths if p not in theirs), None)
    if extra is not None:
        where = f"{slot.path(extra)} is in {view.label} but not in {best.label}"
    else:
        lacking = next((p for p in ref.arg.paths if p not in mine), None)
        if lacking is None:
            raise ObservationMismatch(
                f"{slot.path()} changes container types between {best.label} and {view.label} "
                f"({_type_name(ref.arg.spec.type)} vs {_type_name(slot.arg.spec.type)}); "
                "torch.export needs one structure per exported program"
            )
        where = f"{ref.path(lacking)} is in {best.label} but not in {view.label}"
    raise ObservationMismatch(
        f"{where}: the structure of {ref.name!r} changed between calls (a list length, dict keys "
        "or the number of cache layers); torch.export needs one structure per exported program, "
        "so observe the calls of each structure with a separate observer"
    )


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def merge_leaf(
    agg: LeafAgg, info: LeafInfo, dims: tuple[int, ...] | None, where: str, view: View
) -> None:
    """Adds one call's leaf to the aggregate, or raises on a rank, dtype or value change.

    Args:
        agg: The leaf over the calls merged so far.
        info: The leaf in one more call.
        dims: Its shape, for a tensor.
        where: Its key path, for messages.
        view: The call.

    Raises:
        ObservationMismatch: The leaf changes kind, rank, dtype or (for a scalar) value.
    """
    if info.kind == KIND_NONE:
        return
    if agg.info.kind == KIND_NONE:
        agg.info, agg.call = info, view.obs.first
    elif (agg.info.kind == KIND_TENSOR) != (info.kind == KIND_TENSOR):
        raise ObservationMismatch(
            f"{where} is a {info.kind} in {view.label} but a {agg.info.kind} in call {agg.call}"
        )
    if info.kind == KIND_TENSOR:
        if info.rank != agg.info.rank:
            raise ObservationMismatch(
                f"{where} has rank {info.rank} in {view.label} but rank {agg.info.rank} in call "
                f"{agg.call}: dynamic shapes cannot change a tensor's rank; export one program "
                "per rank"
            )
        if info.dtype != agg.info.dtype:
            raise ObservationMismatch(
                f"{where} is {info.dtype} in {view.label} but {agg.info.dtype} in call "
                f"{agg.call}; export one program per dtype"
            )
        if dims is not None and (agg.last is None or view.obs.last >= agg.last[0]):
            agg.last = (view.obs.last, dims)
    elif info.kind != KIND_OPAQUE and info.value != agg.info.value:
        raise ObservationMismatch(
            f"{where} is {info.value!r} in {view.label} but {agg.info.value!r} in call "
            f"{agg.call}: torch.export bakes scalars into the program as constants, so one "
            "program cannot serve both; pass a tensor, or observe each value separately"
        )
