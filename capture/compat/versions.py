"""The torch versions capture is checked on, the private torch API each seam function uses, and
the one warning given when one of them is missing.

No torch import at import time.
"""

from __future__ import annotations

import logging

__all__ = ["TESTED", "CHECKED_ON", "PRIVATE_APIS", "warn_lost"]

logger = logging.getLogger("capture.compat")
"""One logger for the whole seam: a missing private API is said under ``capture.compat``."""

TESTED = (
    ("2.11.0", "5.23.0"),
    ("2.15.0", "5.24.0"),
)
"""The (torch, transformers) pairs `.ci/run` installs and runs the tests on, oldest first: the
oldest with the fast and the slow suites, the newest with the fast suite. ``pyproject.toml``
declares the range they bound (`tests/test_compat.py` checks both), and `.ci/run` reads this
table (with ``ast``, without importing capture), so a pair is added here and nowhere else."""

CHECKED_ON = tuple(torch for torch, _ in TESTED)
"""torch versions every entry of this module was checked on: those of `TESTED`, on which
`tests/test_compat.py` exercises each entry (and fails on a torch that is not one of them)."""

PRIVATE_APIS = {
    "guards_code": "torch.export.ExportedProgram._guards_code",
    "set_guards_code": "torch.export.ExportedProgram._guards_code",
    "deregister_pytree_node": "torch.utils._pytree._deregister_pytree_node",
    "pytree_nodes": "torch.utils._pytree.SUPPORTED_NODES",
    "serialized_pytree_types": (
        "torch.utils._pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE, SUPPORTED_SERIALIZED_TYPES"
    ),
    "leaf_treespec": "torch.utils._pytree.treespec_leaf",
    "tensor_metadata_check": "torch._C._dynamo.guards.TensorGuards",
    "dim_kind": "torch.export.dynamic_shapes._DerivedDim, _Dim, _DimHint",
    "is_constraint_violation": (
        "torch._dynamo.exc.UserError(UserErrorType.CONSTRAINT_VIOLATION), "
        "torch.fx.experimental.symbolic_shapes.ConstraintViolationError"
    ),
    "violation_names": "the text of a constraint violation (no structured list)",
    "shape_facts": (
        "torch.export.exported_program._get_shape_env, ShapeEnv.guards, ShapeEnv.replacements"
    ),
    "mark_unbacked": "torch._dynamo.decorators.mark_unbacked (its min=/max= since 2.13)",
    "run_outside_dynamo": (
        "torch._C._dynamo.eval_frame.set_code_exec_strategy, _FrameExecStrategy, _FrameAction; "
        "the _torchdynamo_disable function attribute"
    ),
    "export_check": "torch.compiler._is_exporting_flag",
}
"""Function of `capture.compat` -> the private torch API it uses (`tests/test_compat.py` checks
that every function here is listed, and exercises each)."""

_warned: set[str] = set()


def warn_lost(function: str, consequence: str, error: BaseException) -> None:
    """Logs, once per function, that a private API is missing and what is lost."""
    if function in _warned:
        return
    _warned.add(function)
    import torch

    logger.warning(
        "capture: torch %s has no %s (%s: %s; capture was checked on torch %s): %s",
        torch.__version__,
        PRIVATE_APIS[function],
        type(error).__name__,
        error,
        ", ".join(CHECKED_ON),
        consequence,
    )
