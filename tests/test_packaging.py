"""The wheel, built for real: every module of the checkout in it, nothing generic at top level."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A wheel build and a venv install: the slow suite (.ci/run runs it) keeps the fast one short.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel pip builds from a copy of the repository (no build/ left in the checkout)."""
    source = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md", "capture", "replay", "cli"):
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
    # no generic `cli` or `fixtures` package in site-packages.
    assert top == {"capture", "replay"}


def test_wheel_holds_every_module_of_the_checkout(wheel: zipfile.ZipFile) -> None:
    # The installed name of each source file: cli/ is installed as capture/cli/.
    checkout = {
        ("capture/" if path.parts[0] == "cli" else "") + path.as_posix()
        for top in ("capture", "replay", "cli")
        for path in (p.relative_to(ROOT) for p in (ROOT / top).rglob("*.py"))
        if "__pycache__" not in path.parts
    }
    in_wheel = {name for name in wheel.namelist() if name.endswith(".py")}
    assert sorted(checkout - in_wheel) == []
    assert sorted(in_wheel - checkout) == []


def test_wheel_maps_cli_under_capture_with_the_demo_model(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert {"capture/cli/main.py", "capture/cli/demo.py", "capture/demo_model.py"} <= names


def test_console_script_is_capture_cli_main(wheel: zipfile.ZipFile) -> None:
    (entry,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry).decode()
    assert "capture = capture.cli.main:cli" in text.splitlines()


@pytest.fixture(scope="module")
def installed(wheel: zipfile.ZipFile, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch venv with the wheel installed (its dependencies seen from this environment)."""
    import sysconfig
    import venv

    where = tmp_path_factory.mktemp("venv")
    venv.create(where, with_pip=False)
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Dependencies (torch, click, ...) from this environment, after the venv's own packages:
    # its purelib and every site-packages folder on its path (a venv layered on another by a
    # .pth file). Folders a .pth file names are added as they are: their own .pth files (an
    # editable install of the checkout) are not run.
    here = [sysconfig.get_paths()["purelib"]]
    here += [p for p in sys.path if Path(p).name == "site-packages" and p not in here]
    Path(purelib, "zz_dependencies.pth").write_text("".join(f"{p}\n" for p in here))
    assert wheel.filename is not None
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", purelib]
        + [wheel.filename],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # The version the metadata carries (pyproject's), from the wheel's name: capture-V-py3-...
    (where / "wheel-version").write_text(Path(wheel.filename).name.split("-")[1])
    return python


def _run_installed(python: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=python.parent,  # not the repository: its folders must not be importable
        env=env,
        check=False,
    )


def test_installed_capture_cli_runs_from_the_wheel(installed: Path) -> None:
    result = _run_installed(
        installed, "import capture.cli.main as m; print(m.__file__); m.cli(['--version'])"
    )
    version = (installed.parent.parent / "wheel-version").read_text()
    assert (result.returncode, result.stdout.splitlines()[-1]) == (0, f"capture {version}")
    assert "site-packages" in result.stdout.splitlines()[0]


@pytest.mark.parametrize("name", ["cli", "fixtures"])
def test_installed_wheel_has_no_generic_top_level_package(installed: Path, name: str) -> None:
    result = _run_installed(installed, f"import {name}")
    # `cli` and `fixtures` are not installed names.
    assert f"No module named '{name}'" in result.stderr
