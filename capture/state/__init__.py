"""The state a call runs under besides its arguments: its key, reading it, entering it.

One concept seen from its three sides: `capture.state.key` (the key's format, what the store,
the analysis, the manifest and the runner share), `capture.state.reading` (the recorder reads a
call's state on its hot path), `capture.state.entering` (the export puts a model in a recorded
state). This package's names are the key's (`capture.state.key`); it imports no torch.
"""

from __future__ import annotations

from capture.state import key
from capture.state.key import *  # noqa: F403  (the package's names are the key's, listed there)

__all__ = key.__all__
