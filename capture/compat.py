"""The one seam for private torch APIs: each use, the torch versions it was checked on.

capture relies on a few torch internals that have no public equivalent (guards of an exported
program, pytree deregistration, the recorder's tensor guards, the PT2 archive's packaging).
Every such use goes through a function of this module, which names the private API, the
versions it was checked on, and what breaks without it; `tests/test_compat.py` calls each one
against the installed torch, so a torch release that moves one fails there, loudly, rather
than somewhere deep in a recording or an export.
"""

from __future__ import annotations

from typing import Any

CHECKED_ON = ("2.13.0",)
"""torch versions every entry of this module was checked on."""


def guards_code(program: Any) -> list[str] | None:
    """The input guards of an exported program, as the Python lines ``ep.module()`` checks.

    Private API: ``ExportedProgram._guards_code`` (torch 2.13.0). Without it an ONNX file
    converted from the program cannot carry the program's own guards (`replay.ship.conditions`):
    it is guarded by the recorded ranges and the program's range constraints only.

    Args:
        program: A ``torch.export.ExportedProgram``.

    Returns:
        The guard lines (empty: none), or None when torch keeps none under that name.

    Example:
        >>> guards_code(ep)  # doctest: +SKIP
        ["L['input_ids'].size()[1] <= 4"]
    """
    if not hasattr(program, "_guards_code"):
        return None
    code = program._guards_code
    return [str(line) for line in code] if code else []
