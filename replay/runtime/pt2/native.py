"""Whether this process may load an artifact's AOTInductor builds: native code, tried first apart.

An AOTInductor build is a shared library compiled against one torch and one device. Loading it
runs its native code; a build this torch or this device cannot use may not raise a Python
error but kill the process (a segmentation fault was seen loading a CUDA build with the torch
that made it). A serving process must never die on load, so before `load(compiled=True)` maps a
build into the caller's process:

- the torch release that exported the artifact (its manifest's ``versions``) must be this
  process's: a build is tied to the torch it was compiled with;
- a child process (this Python, this ``sys.path``) loads the same builds on the same device
  first (`replay.runtime.pt2.loading.probe_child`); a child that is killed by a signal, exits
  with an error or outlasts `PROBE_SECONDS` makes the load an `ArtifactError` naming what
  happened, and the caller's process never loads the library.

The probe costs one process start and one load (seconds), paid only with ``compiled=True``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from replay.runtime.guards import ArtifactError

__all__ = ["PROBE_SECONDS", "check_release", "probe"]

PROBE_SECONDS = 600.0
"""How long the child may take to load every build (a large CUDA build takes seconds)."""

_FIX = "load it without compiled=True, or save it again with aoti=True on this machine's torch"


def _release(version: str) -> str:
    return version.split("+", 1)[0]


def check_release(path: str, exported_with: str | None, running: str) -> None:
    """Raises `ArtifactError` unless the builds were made by this process's torch release.

    Args:
        path: The artifact (for the message).
        exported_with: The manifest's torch version (None: not recorded).
        running: ``torch.__version__`` of this process.

    Example:
        >>> check_release("m.pt2", "2.13.0+cpu", "2.13.0+cu130")
        >>> check_release("m.pt2", "2.13.0", "2.11.0")
        Traceback (most recent call last):
        ...
        replay.runtime.guards.ArtifactError: m.pt2: its AOTInductor builds were compiled with torch 2.13.0, this process runs torch 2.11.0: load it without compiled=True, or save it again with aoti=True on this machine's torch
    """  # noqa: E501
    if exported_with is None or _release(exported_with) != _release(running):
        raise ArtifactError(
            f"{path}: its AOTInductor builds were compiled with torch "
            f"{exported_with or '(not recorded)'}, this process runs torch {running}: {_FIX}"
        )


def probe(path: str, device: str, allowed: Sequence[str], argv: Sequence[str] = ()) -> None:
    """Loads the artifact's builds in a child process; raises `ArtifactError` if that fails.

    Args:
        path: The artifact.
        device: Where the builds will run (``"cpu"``, ``"cuda:0"``).
        allowed: The operators the caller allowed beyond the list (the child validates alike).
        argv: The child's command (default: `replay.runtime.pt2.loading.probe_child` under
            this Python).

    Raises:
        ArtifactError: The child was killed by a signal, failed, or outlasted `PROBE_SECONDS`.
    """
    child = "from replay.runtime.pt2.loading import probe_child; probe_child()"
    command = list(argv) or [sys.executable, "-c", child, path, device, *allowed]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=PROBE_SECONDS,
            env=env,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        raise ArtifactError(
            f"{path}: loading its AOTInductor builds on {device} took over {PROBE_SECONDS:.0f} s "
            f"in a test process: {_FIX}"
        ) from e
    if result.returncode < 0:
        name = signal.Signals(-result.returncode).name
        raise ArtifactError(
            f"{path}: loading its AOTInductor builds on {device} killed a test process "
            f"({name}); this process did not load them: {_FIX}"
        )
    if result.returncode != 0:
        lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
        last = lines[-1][:300].removeprefix("Error: ") if lines else f"exit {result.returncode}"
        raise ArtifactError(f"{path}: its AOTInductor builds do not load on {device}: {last}")
