"""`capture compact` where it cannot write: one ``Error:`` line, exit 1, the store as it was.

A full disk and a read-only store are real filesystems: a 1 MiB tmpfs filled up, then remounted
read-only, in a private mount namespace (``unshare -m``, which needs root or a user namespace;
skipped, saying so, where the machine allows neither). A file-size limit (``RLIMIT_FSIZE``, as a
container's quota would set) needs nothing and always runs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from capture.record.recorder import Recorder

ROOT = Path(__file__).resolve().parents[1]
CALLS = 40


class Add(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of `CALLS` calls, one calls file each (about 150 KB in all)."""
    root = tmp_path_factory.mktemp("disk") / "store"
    rec = Recorder(Add(), root, name="add", flush_seconds=3600)
    with rec, torch.no_grad():
        for n in range(CALLS):
            rec.model(torch.ones(1 + n % 9, 3), torch.ones(1 + n % 9, 3))
            rec.flush()
    return root


def _digest(store: Path) -> dict[str, str]:
    """Every file under `store` (names and contents), lock and temporary files included."""
    return {
        str(p.relative_to(store)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(store.rglob("*"))
        if p.is_file()
    }


def _one_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: cannot compact the store"), lines
    return lines[0]


_SHELL = r"""
set -e
mount -t tmpfs -o size=1m tmpfs "$MNT"
cp -r "$TEMPLATE" "$MNT/store"
# fill the disk but a few KB: the lock's note fits, a merged file does not
dd if=/dev/zero of="$MNT/fill" bs=1k count=$(( $(df -k --output=avail "$MNT" | tail -1) - 8 )) \
    2>/dev/null || true
before=$(cd "$MNT/store" && find . -type f | sort | xargs sha256sum)
set +e
"$PYTHON" -m cli --store "$MNT/store" compact >"$OUT/full.out" 2>"$OUT/full.err"
echo $? >"$OUT/full.code"
after=$(cd "$MNT/store" && find . -type f | sort | xargs sha256sum)
[ "$before" = "$after" ] && echo same >"$OUT/full.same"
rm "$MNT/fill"
mount -o remount,ro "$MNT"
"$PYTHON" -m cli --store "$MNT/store" compact >"$OUT/ro.out" 2>"$OUT/ro.err"
echo $? >"$OUT/ro.code"
after=$(cd "$MNT/store" && find . -type f | sort | xargs sha256sum)
[ "$before" = "$after" ] && echo same >"$OUT/ro.same"
umount "$MNT"
"""


def test_full_disk_and_read_only_store(template: Path, tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-m", "true"]).returncode != 0:
        pytest.skip("needs a private mount namespace (unshare -m: root or a user namespace)")
    mnt, out = tmp_path / "mnt", tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MNT": str(mnt),
        "OUT": str(out),
        "TEMPLATE": str(template),
        "PYTHON": sys.executable,
    }
    done = subprocess.run(
        [unshare, "-m", "--propagation", "private", "sh", "-c", _SHELL],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for case in ("full", "ro"):
        proc = subprocess.CompletedProcess(
            [],
            int((out / f"{case}.code").read_text()),
            (out / f"{case}.out").read_text(),
            (out / f"{case}.err").read_text(),
        )
        said = _one_error(proc)
        assert ("No space left" if case == "full" else "Read-only file system") in said
        assert (out / f"{case}.same").exists()  # the store as it was, file for file


def test_file_size_limit(template: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(template, store)
    before = _digest(store)
    script = (
        "import resource, runpy, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, as a quota'd server sees\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (2_000, resource.RLIM_INFINITY))\n"
        "sys.argv = ['capture', '--store', sys.argv[1], 'compact']\n"
        "runpy.run_module('cli', run_name='__main__')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(store)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert "File too large" in _one_error(proc)
    assert _digest(store) == before
