"""A module planted where hostile data would have Python import it: its import writes a marker.

The hostile-store and hostile-artifact suites name this module from the data they tamper with;
the marker file and `sys.modules` then tell whether anything they read was run or imported.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def planted_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str = ""
) -> Iterator[Path]:
    """Plants ``<name>.py`` in a working directory on ``sys.path``; yields its marker file.

    Importing the module writes ``ran`` to the marker; the module also defines ``f()`` and
    whatever `body` adds. On exit, asserts the module was not imported meanwhile.
    """
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    marker = tmp_path / "MARKER"
    (cwd / f"{name}.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\ndef f():\n    return 0\n{body}"
    )
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(cwd))
    before = set(sys.modules)
    yield marker
    assert name not in set(sys.modules) - before  # nothing named by the data was imported
