"""Folders this process really cannot write to, root included, and a really full filesystem.

Root ignores permission bits, so ``chmod a-w`` proves nothing when the tests run as root (CI
does). As root a folder is made immutable (``chattr -R +i``: no file can be created, changed or
removed in it, by root either, until the attribute is cleared); as another user, the write
permission bits are cleared. Either way the folder is tried before it is handed out: creating a
file in it must fail, or the test fails (a read-only folder that is not read-only would let a
test pass without checking anything).

A full filesystem is a small tmpfs mounted for the test and filled up (needs root with the
right to mount, as on CI); elsewhere the test that needs it is skipped and says why.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["read_only", "read_only_filesystem", "full_filesystem"]


def _refuses_writes(folder: Path) -> bool:
    try:
        (folder / ".write-attempt").write_bytes(b"x")
    except OSError:
        return True
    (folder / ".write-attempt").unlink()
    return False


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[str]:
    """Makes `folder` and everything in it unwritable for this process; yields how.

    Raises:
        pytest.skip.Exception: Running as root where ``chattr +i`` is refused (a filesystem
            without the immutable attribute); the reason is shown.
    """
    if os.geteuid() != 0:
        paths = [folder, *folder.rglob("*")]
        modes = {p: p.stat().st_mode for p in paths}
        for path in paths:
            path.chmod(modes[path] & ~0o222)
        mechanism = "permission bits (chmod a-w)"

        def undo() -> None:
            for path, mode in modes.items():
                path.chmod(mode)

    else:
        done = subprocess.run(
            ["chattr", "-R", "+i", str(folder)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            subprocess.run(["chattr", "-R", "-i", str(folder)], capture_output=True, check=False)
            pytest.skip(f"running as root and chattr +i is refused here: {done.stderr.strip()}")
        mechanism = "the immutable attribute (chattr +i), which binds root too"

        def undo() -> None:
            subprocess.run(["chattr", "-R", "-i", str(folder)], check=True)

    try:
        assert _refuses_writes(folder), f"{folder} still takes new files after {mechanism}"
        yield mechanism
    finally:
        undo()


@contextlib.contextmanager
def full_filesystem(
    folder: Path,
    size_kib: int = 1024,
    fill: bool = True,
    content: Path | None = None,
) -> Iterator[Path]:
    """Mounts a tmpfs of `size_kib` KiB on `folder`, copies `content` (a folder) into it, and
    (`fill`) fills the rest; yields the folder.

    Raises:
        pytest.skip.Exception: Mounting is not allowed here (not root, or no CAP_SYS_ADMIN).
    """
    folder.mkdir(exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"a full filesystem needs a tmpfs mount, refused here: {done.stderr.strip()}")
    try:
        if content is not None:
            shutil.copytree(content, folder, dirs_exist_ok=True)
        if not fill:
            yield folder
            return
        with open(folder / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
        assert os.statvfs(folder).f_bavail == 0
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@contextlib.contextmanager
def read_only_filesystem(folder: Path) -> Iterator[Path]:
    """Mounts an empty tmpfs read-only on `folder` (writes fail with EROFS, root's too).

    Raises:
        pytest.skip.Exception: Mounting is not allowed here (not root, or no CAP_SYS_ADMIN).
    """
    folder.mkdir(exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"a read-only filesystem needs a tmpfs mount, refused here: {done.stderr}")
    try:
        try:
            (folder / ".write-attempt").write_bytes(b"x")
        except OSError as e:
            assert e.errno == errno.EROFS, e
        else:
            raise AssertionError(f"{folder} took a file though mounted read-only")
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)
