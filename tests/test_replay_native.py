"""An artifact's AOTInductor builds are loaded in a child process first: its death is an error."""

from __future__ import annotations

import sys

import pytest

from replay.runtime.guards import ArtifactError
from replay.runtime.pt2 import native


def test_a_build_that_kills_the_probe_is_an_artifact_error_not_a_dead_server() -> None:
    # The child dies as a native library's crash would: by SIGSEGV, with no Python error.
    crash = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    with pytest.raises(ArtifactError) as caught:
        native.probe("m.pt2", "cuda:0", [], argv=crash)
    assert str(caught.value) == (
        "m.pt2: loading its AOTInductor builds on cuda:0 killed a test process (SIGSEGV); this "
        "process did not load them: load it without compiled=True, or save it again with "
        "aoti=True on this machine's torch"
    )


def test_the_probes_error_line_is_the_loads() -> None:
    fails = [sys.executable, "-c", "import sys; sys.exit('Error: the build needs sm_90')"]
    with pytest.raises(ArtifactError, match=r"^m.pt2: its AOTInductor builds do not load on cpu: "):
        native.probe("m.pt2", "cpu", [], argv=fails)
    with pytest.raises(ArtifactError, match="the build needs sm_90$"):
        native.probe("m.pt2", "cpu", [], argv=fails)


def test_a_probe_that_loads_is_silent() -> None:
    native.probe("m.pt2", "cpu", [], argv=[sys.executable, "-c", "pass"])


def test_the_probe_runs_the_loader_on_the_artifact(tmp_path: object) -> None:
    # The default child is the loader's probe_child: an artifact it cannot open fails there.
    with pytest.raises(ArtifactError, match=r"^missing.pt2: its AOTInductor builds do not load"):
        native.probe("missing.pt2", "cpu", [])


@pytest.mark.parametrize(
    ("exported", "running", "ok"),
    [("2.11.0+cu130", "2.11.0", True), ("2.13.0", "2.11.0+cu130", False), (None, "2.11.0", False)],
)
def test_builds_load_only_on_the_torch_release_that_compiled_them(
    exported: str | None, running: str, ok: bool
) -> None:
    if ok:
        native.check_release("m.pt2", exported, running)
    else:
        with pytest.raises(ArtifactError, match="load it without compiled=True"):
            native.check_release("m.pt2", exported, running)
