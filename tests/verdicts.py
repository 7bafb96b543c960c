"""One hostile artifact through ``replay.load`` and the real ``capture check``: the same verdict.

`both` loads the artifact (``verify_weights=True``: what ``capture check`` verifies) and runs the
``capture check`` command of the CLI on it, and holds each run to what a hostile artifact may
not do: print anything (file descriptors 1 and 2 are watched, so a C++ print is seen too), open
a file for writing, open one of the paths the case planted outside the artifact, take 60 s, or
end in a traceback. It returns the refusal (the one-line message both gave) or None when both
accepted it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import replay
from capture.cli.main import cli
from replay.runtime.guards import ArtifactError

__all__ = ["both", "LIMIT_S"]

LIMIT_S = 60.0
"""The longest a load or a check of a hostile artifact may take."""

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_events: list[tuple[str, str, int]] | None = None


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if _events is not None and event == "open" and args and isinstance(args[0], (str, bytes)):
        path = os.fsdecode(args[0])
        mode = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        _events.append((path, mode, flags))


sys.addaudithook(_hook)  # audit hooks stay for the process: `_events` switches it on


def _watched(run: Any) -> tuple[Any, float, list[tuple[str, str, int]]]:
    global _events
    _events = []
    start = time.monotonic()
    try:
        out = run()
    finally:
        seen, _events = _events, None
    return out, time.monotonic() - start, seen


def _writes(events: Iterable[tuple[str, str, int]]) -> list[str]:
    return [p for p, mode, flags in events if set(mode) & set("wax+") or flags & _WRITE_FLAGS]


def both(
    path: Path,
    store: Path | None,
    capfd: pytest.CaptureFixture[str],
    *,
    planted: Sequence[Path | str] = (),
    allow_ops: Sequence[str] = (),
) -> str | None:
    """The verdict both give on `path` (the refusal, or None when both accept it).

    Raises:
        AssertionError: The verdicts differ, or a run printed, wrote a file, opened a planted
            path, took more than `LIMIT_S`, or ended in a traceback.
    """
    capfd.readouterr()

    def load() -> str | None:
        try:
            replay.load(path, verify_weights=True, allow_ops=allow_ops)
        except ArtifactError as e:
            return str(e)
        return None

    refused, load_s, load_events = _watched(load)
    out, err = capfd.readouterr()
    assert (out, err) == ("", ""), "replay.load printed"
    args = ([] if store is None else ["--store", str(store)]) + ["check", str(path)]
    for name in allow_ops:
        args += ["--allow-ops", name]
    result, check_s, check_events = _watched(lambda: CliRunner().invoke(cli, args))
    out, err = capfd.readouterr()
    assert (out, err) == ("", ""), "capture check printed past its streams"
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.stderr + result.stdout
    if refused is None:
        assert result.exit_code in (0, 3), result.stderr
    else:
        assert len(refused.splitlines()) == 1
        assert (result.exit_code, result.stdout) == (1, "")
        assert result.stderr == f"Error: {refused}\n"  # the same refusal, word for word
    assert load_s < LIMIT_S and check_s < LIMIT_S, (load_s, check_s)
    events = load_events + check_events
    assert _writes(events) == []
    touched = {os.path.realpath(p) for p, _, _ in events}
    assert touched.isdisjoint({os.path.realpath(p) for p in planted})
    return refused
