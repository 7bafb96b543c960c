"""Which packages the wheel holds: found, not listed.

Every package under capture/ and replay/, and the repository's cli/ folder installed as
``capture.cli`` (``package_dir``: the one mechanism that maps it, for a wheel and an editable
install alike). fixtures/, tests/ and bench/ serve the repository only and are never installed.
The project's metadata lives in pyproject.toml; tests/test_packaging.py checks that the built
wheel holds every module of the checkout.
"""

from setuptools import find_packages, setup

CLI = ["capture.cli"] + [f"capture.cli.{name}" for name in find_packages("cli")]

setup(
    packages=find_packages(include=["capture", "capture.*", "replay", "replay.*"]) + CLI,
    package_dir={"capture.cli": "cli"},
)
