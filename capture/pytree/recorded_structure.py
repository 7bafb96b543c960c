"""A call's input structure, the store's side: what the ``structures`` rows say, typed.

The recorder writes one ``structures`` row per leaf of every distinct call structure, with the
structure-wide columns (``treespec``, ``signature``, ``n_args``) repeated on each row. The
analysis (`capture.analysis.groups.analyze`) reads those rows once per structure into a
`RecordedStructure` (its `RecordedLeaf` rows, the treespec, the method's parameters, the
positional count) and every reader after it (the analysis itself, ``capture summary``, the
`replay` package) asks that object instead of reading dict rows again.

This module is the store-side, torch-free twin of the recorder's
`capture.record.call_structure.Structure` (which holds live tensors' metadata while a call is being
recorded); `RecordedLeaf` is the one leaf record of both sides (the recorder builds it, a reader
reads it back). The recorded method's parameters are a `capture.signature.Signature`, the one
binder both sides ask.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from capture import schema
from capture.errors import ReplayError
from capture.pytree.treespec import Node
from capture.pytree.treespec import parse as parse_treespec
from capture.signature import Signature

__all__ = [
    "RecordedLeaf",
    "RecordedStructure",
    "as_leaves",
    "PRESENT",
    "MISSING",
    "NONE",
]

PRESENT, MISSING, NONE = "present", "missing", "none"
"""What a call group did with a top-level argument (`RecordedStructure.argument_status`)."""

_ABSENT_KINDS = frozenset({schema.KIND_MISSING, schema.KIND_NONE})
_SCALAR_KINDS = frozenset({schema.KIND_INT, schema.KIND_FLOAT, schema.KIND_BOOL, schema.KIND_STR})


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class RecordedLeaf:
    """One leaf of a recorded structure (one ``structures`` row, without the structure-wide
    columns). The attributes are the columns of `capture.schema.STRUCTURES_SCHEMA`.

    The one leaf record: the recorder builds it (`capture.record.call_structure.describe`) and
    writes its fields, a reader builds it back from the row (`from_row`)."""

    leaf: int
    path: str
    argument: str | None
    position: int | None
    kind: str
    type: str | None = None
    dtype: str | None = None
    rank: int | None = None
    device: str | None = None
    value: str | None = None
    dim_offset: int | None = None
    range_index: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RecordedLeaf:
        """The leaf of one ``structures`` row (extra columns are ignored)."""
        return cls(
            leaf=int(row["leaf"]),
            path=str(row["path"]),
            argument=row.get("argument"),
            position=_int(row.get("position")),
            kind=str(row["kind"]),
            type=row.get("type"),
            dtype=row.get("dtype"),
            rank=_int(row.get("rank")),
            device=row.get("device"),
            value=row.get("value"),
            dim_offset=_int(row.get("dim_offset")),
            range_index=_int(row.get("range_index")),
        )

    @property
    def is_tensor(self) -> bool:
        """True for a tensor leaf."""
        return self.kind == schema.KIND_TENSOR

    @property
    def is_missing(self) -> bool:
        """True for an optional argument the call did not pass."""
        return self.kind == schema.KIND_MISSING

    @property
    def is_scalar(self) -> bool:
        """True for an int, float, bool or str leaf (recorded with its value)."""
        return self.kind in _SCALAR_KINDS

    @property
    def ndim(self) -> int:
        """The tensor's rank (0 for other leaves)."""
        return self.rank or 0


def as_leaves(leaves: Iterable[RecordedLeaf | Mapping[str, Any]]) -> list[RecordedLeaf]:
    """Typed leaves from typed leaves or ``structures`` rows (the functions of `replay` that
    take a structure's leaves accept both: a user may hold rows read from the ``structures``
    view, the library holds `capture.analysis.groups.Group.structure`)."""
    return [
        leaf if isinstance(leaf, RecordedLeaf) else RecordedLeaf.from_row(leaf) for leaf in leaves
    ]


@dataclass(frozen=True)
class RecordedStructure:
    """A recorded input structure: its leaves, treespec, method parameters, positional count.

    Attributes:
        structure_id: The ``calls.in_structure`` it describes.
        model_name: The model's name in the store.
        leaves: Its leaves, in leaf order.
        treespec: The stored JSON treespec of ``(args, kwargs)`` (None when unserializable).
        signature: The stored JSON signature of the recorded method (None when unknown).
        n_args: How many arguments its calls passed positionally.
        params: The method's signature (empty when unknown or malformed).
        signature_error: Why `signature` could not be read, else None.
        schema_version: The store version it was recorded under (`capture.schema`: what its
            leaves and treespec hold; 1 when its rows do not say).
    """

    structure_id: str
    model_name: str
    leaves: tuple[RecordedLeaf, ...]
    treespec: str | None = None
    signature: str | None = None
    n_args: int = 0
    params: Signature = Signature()
    signature_error: str | None = field(default=None, compare=False)
    schema_version: int = field(default=schema.SCHEMA_VERSION, compare=False)

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, Any]]) -> RecordedStructure:
        """The structure of its ``structures`` rows (one per leaf, ordered by leaf).

        A malformed stored signature does not fail here (the analysis of `capture dims` does
        not need it): `signature_error` keeps why, and `checked_params` raises it.

        Raises:
            ValueError: `rows` is empty.

        Example:
            >>> st = RecordedStructure.from_rows([{"structure_id": "s", "model": "m", "leaf": 0,
            ...     "path": "args[0]", "argument": "x", "position": 0, "kind": "tensor",
            ...     "rank": 2, "dim_offset": 0, "n_args": 1}])
            >>> st.width, st.n_args, st.leaves[0].is_tensor
            (2, 1, True)
        """
        if not rows:
            raise ValueError("a recorded structure has at least one row")
        first = rows[0]
        signature = first.get("signature")
        params = Signature()
        error = None
        try:
            params = Signature.loads(signature)
        except ReplayError as e:
            error = str(e)
        return cls(
            structure_id=str(first.get("structure_id")),
            model_name=str(first.get("model")),
            leaves=tuple(RecordedLeaf.from_row(r) for r in rows),
            treespec=first.get("treespec"),
            signature=signature,
            n_args=int(first.get("n_args") or 0),
            params=params,
            signature_error=error,
            schema_version=int(first.get("schema_version") or 1),
        )

    @property
    def source(self) -> str:
        """How errors name this structure."""
        return f"the structure {self.structure_id!r} of model {self.model_name!r}"

    @cached_property
    def tree(self) -> Node:
        """The treespec parsed against the allow-list, protocol checked (`capture.pytree.treespec`).

        Raises:
            ReplayError: No treespec was recorded (a node type torch's pytree cannot serialize).
            UnsafeTreespec: The treespec is malformed, of another protocol, or names a node
                type outside the allow-list.
        """
        if not self.treespec:
            raise ReplayError(
                "the recorded structure has no treespec (a node type that torch's pytree cannot "
                "serialize); it cannot be rebuilt"
            )
        return parse_treespec(self.treespec, "the store's structures")

    def checked_params(self) -> Signature:
        """The method's signature.

        Raises:
            ReplayError: The stored signature is malformed.
        """
        if self.signature_error is not None:
            raise ReplayError(self.signature_error)
        return self.params

    @property
    def tensors(self) -> list[RecordedLeaf]:
        """The tensor leaves, in leaf order."""
        return [leaf for leaf in self.leaves if leaf.is_tensor]

    @property
    def width(self) -> int:
        """How many sizes a call of this structure records (the sum of tensor ranks)."""
        return sum(leaf.ndim for leaf in self.tensors)

    def arguments_of(self, kinds: Iterable[str]) -> list[str | None]:
        """The ``argument`` of every leaf of one of `kinds`, in leaf order."""
        wanted = set(kinds)
        return [leaf.argument for leaf in self.leaves if leaf.kind in wanted]

    def argument_status(self) -> dict[str, str]:
        """Per top-level argument, in signature order: `PRESENT`, `NONE` or `MISSING`.

        Example:
            >>> RecordedStructure("s", "m", (RecordedLeaf(0, "kwargs['x']", "x", None, "missing"),
            ...     RecordedLeaf(1, "kwargs['y']", "y", None, "tensor"))).argument_status()
            {'x': 'missing', 'y': 'present'}
        """
        kinds: dict[str, set[str]] = {}
        for leaf in self.leaves:
            kinds.setdefault(leaf.argument or leaf.path, set()).add(leaf.kind)
        order = self.params.index
        status = {}
        for argument in sorted(kinds, key=lambda a: order.get(a, len(order))):
            seen = kinds[argument]
            if seen - _ABSENT_KINDS:
                status[argument] = PRESENT
            elif seen == {schema.KIND_MISSING}:
                status[argument] = MISSING
            else:
                status[argument] = NONE
        return status
