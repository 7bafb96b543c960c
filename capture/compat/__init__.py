"""The one seam for private torch APIs: each use, the torch versions it was checked on.

capture relies on a few torch internals with no public equivalent. Each use goes through a function
here, which names the private API (`PRIVATE_APIS`), the versions it was checked on (`CHECKED_ON`)
and what breaks without it; `tests/test_compat.py` calls each against the installed torch, so a
torch release that moves one fails there, loudly, not deep in a recording or an export. At run
time a missing private API is never passed over in silence: one warning says what is lost, or an
error where nothing works without it. Where torch gives only text (the names a constraint
violation lists, a violation raised without its type), the text is read here and nowhere else.

Private means: a name starting with ``_`` anywhere in torch, and the names of
``torch.utils._pytree`` outside its ``__all__`` (``SUPPORTED_NODES``, the serialized-type tables,
``treespec_leaf``). Its ``__all__`` (``register_pytree_node``, ``tree_flatten_with_path``,
``treespec_dumps``, ``keystr``, ...) and the key classes its path functions return are **not**
routed through here: torch has no other pytree module (2.13 ships no ``torch.utils.pytree``),
torch.export's documentation sends users to ``torch.utils._pytree.register_pytree_node``, and
``dynamic_shapes`` and treespec serialization are defined over it: it is torch's pytree API in
all but name, and wrapping it (the recorder's hot path walks with it) would add a layer, no check.

The seam is split by the part of torch it reaches: `versions` (the checked versions, the table of
private APIs, the warning), `exported` (torch.export), `trees` (torch's pytree), `dynamo`
(torch.compile). Import the names from here. No torch import at import time (the store side reads
treespecs without torch).

Example:
    >>> from capture import compat
    >>> "2.11.0" in compat.CHECKED_ON
    True
"""

from __future__ import annotations

from capture.compat.dynamo import (
    export_check,
    mark_unbacked,
    run_outside_dynamo,
    tensor_metadata_check,
)
from capture.compat.exported import (
    ShapeFacts,
    dim_kind,
    guards_code,
    is_constraint_violation,
    set_guards_code,
    shape_facts,
    violation_names,
)
from capture.compat.trees import (
    deregister_pytree_node,
    leaf_treespec,
    pytree_nodes,
    serialized_pytree_types,
)
from capture.compat.versions import CHECKED_ON, PRIVATE_APIS, TESTED

__all__ = [
    "TESTED",
    "CHECKED_ON",
    "PRIVATE_APIS",
    "guards_code",
    "set_guards_code",
    "deregister_pytree_node",
    "pytree_nodes",
    "serialized_pytree_types",
    "leaf_treespec",
    "tensor_metadata_check",
    "run_outside_dynamo",
    "export_check",
    "dim_kind",
    "is_constraint_violation",
    "violation_names",
    "ShapeFacts",
    "shape_facts",
    "mark_unbacked",
]
