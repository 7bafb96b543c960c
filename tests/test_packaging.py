"""The wheel installs nothing generic at top level (issue 13 item 7), built for real."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel pip builds from a copy of the repository (no build/ left in the checkout)."""
    source = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "capture", "replay", "cli"):
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, source / name)
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (path,) = out.glob("capture-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_installs_only_capture_and_replay(wheel: zipfile.ZipFile) -> None:
    top = {
        name.split("/")[0]
        for name in wheel.namelist()
        if not name.split("/")[0].endswith(".dist-info")
    }
    # issue 13: no generic `cli` or `fixtures` package in site-packages.
    assert top == {"capture", "replay"}


def test_wheel_maps_cli_under_capture_with_the_demo_model(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert {"capture/cli/main.py", "capture/cli/demo.py", "capture/demo_model.py"} <= names


def test_console_script_is_capture_cli_main(wheel: zipfile.ZipFile) -> None:
    (entry,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry).decode()
    assert "capture = capture.cli.main:cli" in text.splitlines()
