"""The one seam for private torch APIs: each use, the torch versions it was checked on.

capture relies on a few torch internals that have no public equivalent (guards of an exported
program, pytree deregistration, the recorder's tensor guards, the PT2 archive's packaging).
Every such use goes through a function of this module, which names the private API, the
versions it was checked on, and what breaks without it; `tests/test_compat.py` calls each one
against the installed torch, so a torch release that moves one fails there, loudly, rather
than somewhere deep in a recording or an export.
"""

from __future__ import annotations

CHECKED_ON = ("2.13.0",)
"""torch versions every entry of this module was checked on."""
